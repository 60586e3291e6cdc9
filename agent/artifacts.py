"""Fetch a job's `deploy_url` zip, check it and unpack it into the job's work dir.

Each stage is bounded (size, time, entries, ratio) and fails with one ArtifactError
naming it; nothing is left behind on failure and nothing is written outside the work
dir. docs/agent.md ("Artifacts") and docs/security.md say what is refused.
"""
from __future__ import annotations

import errno
import hashlib
import os
import posixpath
import shutil
import stat
import struct
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import requests

STAGES = ("download", "checksum", "unpack")

MiB = 1024 * 1024
CHUNK_BYTES = 1 * MiB
# A symlink entry's data is its target; no real target is longer than PATH_MAX.
MAX_LINK_TARGET_BYTES = 4096
SHA256_HEX_CHARS = 64
# Room for one entry in a zip's central directory: 46 bytes plus its name, extra
# field and comment. Bounds the memory zipfile spends on reading the directory.
CENTRAL_BYTES_PER_ENTRY = 1024


class ArtifactError(Exception):
    """A deploy artifact could not be used. `stage` is "download", "checksum" or
    "unpack"; str() reads like "download failed: https://h/a.zip answered 404 Not
    Found" or "unpack refused: entry '../x' leaves the work dir"."""

    def __init__(self, stage: str, message: str, *, refused: bool = False):
        if stage not in STAGES:
            raise ValueError(f"unknown artifact stage {stage!r}")
        super().__init__(stage, message)
        self.stage = stage
        self.message = message
        # "refused": the artifact broke a rule; "failed": something went wrong.
        self.refused = refused

    def __str__(self) -> str:
        return f"{self.stage} {'refused' if self.refused else 'failed'}: {self.message}"


@dataclass(frozen=True)
class Limits:
    max_download_bytes: int = 512 * MiB
    max_unpacked_bytes: int = 2048 * MiB
    max_entries: int = 10_000
    # An entry larger than ratio_min_bytes may expand at most max_ratio times.
    max_ratio: float = 100
    ratio_min_bytes: int = 1 * MiB
    connect_timeout: float = 10.0
    # Longest wait for the next bytes of an answer (not for the whole download).
    read_timeout: float = 60.0
    # Bound on the whole download, so a server trickling bytes cannot hold a slot
    # forever; None for no bound.
    download_timeout: float | None = 1800.0

    def __post_init__(self):
        for name in ("max_download_bytes", "max_unpacked_bytes", "max_entries", "max_ratio",
                     "ratio_min_bytes", "connect_timeout", "read_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Limits.{name} must be greater than 0, got {getattr(self, name)}")
        if self.download_timeout is not None and not self.download_timeout > 0:
            raise ValueError(f"Limits.download_timeout must be greater than 0 or None, "
                             f"got {self.download_timeout}")


@dataclass(frozen=True)
class Unpacked:
    files: int  # regular files written
    bytes: int  # bytes written to them
    dirs: int  # directories created (named in the zip or implied by a path)
    symlinks: int
    downloaded_bytes: int
    sha256: str  # hex digest of the downloaded zip


def fetch_and_unpack(url: str, dest_dir: str, *, sha256: str | None, limits: Limits,
                     http: requests.Session | None = None,
                     s3_client_factory: Callable[[], object] | None = None) -> Unpacked:
    """Download `url` (http://, https://, s3://bucket/key), check its SHA-256 when
    `sha256` is given, and unpack it into `dest_dir`. Raises ArtifactError, naming the
    stage:

    download  http(s):// through `requests` (streamed, timeouts always set, redirects
              followed, proxies and REQUESTS_CA_BUNDLE from the environment);
              s3://bucket/key through a boto3 `s3` client (endpoint, region and
              credentials from the environment, as boto3 always does). The body goes
              to a temporary file beside the work dir and stops as soon as it passes
              `max_download_bytes` (at once when the announced size is already over)
              or runs past `download_timeout` in all; the SHA-256 is computed on the way.
    checksum  with `sha256` given, the digest must match before anything is unpacked.
    unpack    the whole archive is checked before anything is written (_plan), then
              written entry by entry into a temporary directory (_extract) and moved
              into `dest_dir` only when complete (_move_into).

    The temporary file and directory are removed whatever happens. Messages show URLs
    without user info or query strings (display_url), so a presigned URL's signature
    does not end up in a job's stderr."""
    expected = _expected_digest(sha256)
    scheme = _scheme(url)
    dest_dir = os.path.abspath(dest_dir)
    parent = os.path.dirname(dest_dir)
    try:
        os.makedirs(parent, exist_ok=True)
        fd, archive = tempfile.mkstemp(prefix=".artifact-", suffix=".zip.part", dir=parent)
    except OSError as exc:
        raise ArtifactError("download", f"cannot create a temporary file in {parent}: "
                                        f"{_os_reason(exc)}") from None
    try:
        try:
            with os.fdopen(fd, "wb") as out:
                size, digest = _download(scheme, url, out, limits, http, s3_client_factory)
        except OSError as exc:  # closing (flushing) the file on a full disk, say
            raise ArtifactError("download", f"cannot write {display_url(url)} to disk: "
                                            f"{_os_reason(exc)}") from None
        if expected is not None and digest != expected:
            raise ArtifactError("checksum", f"expected sha256 {expected}, got {digest} "
                                            f"for {display_url(url)}")
        counts = _unpack(archive, dest_dir, limits)
    finally:
        _unlink_quietly(archive)
    return Unpacked(files=counts.files, bytes=counts.bytes, dirs=counts.dirs,
                    symlinks=counts.symlinks, downloaded_bytes=size, sha256=digest)


def display_url(url: str) -> str:
    """The URL for messages: without user:password@ and with the query replaced by
    "?…" (presigned URLs carry their signature there)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<an unparsable URL>"
    if parts.scheme == "s3":
        return url  # no secrets in an s3 URL, and "?" may be part of the key
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, "…" if parts.query else "", ""))


def _expected_digest(sha256: str | None) -> str | None:
    if sha256 is None:
        return None
    value = sha256.strip().lower() if isinstance(sha256, str) else ""
    if len(value) != SHA256_HEX_CHARS or any(c not in "0123456789abcdef" for c in value):
        raise ArtifactError("checksum", f"deploy_sha256 must be {SHA256_HEX_CHARS} hexadecimal "
                                        f"characters, got {sha256!r}")
    return value


# --- download -----------------------------------------------------------------


class _Sink:
    """Writes chunks to the temporary file, hashing and counting them, and stops
    the download past the size limit or the overall deadline."""

    def __init__(self, out, shown_url: str, limits: Limits):
        self.out = out
        self.url = shown_url
        self.limits = limits
        self.size = 0
        self.hash = hashlib.sha256()
        self.deadline = (None if limits.download_timeout is None
                         else time.monotonic() + limits.download_timeout)

    def check_announced(self, length) -> None:
        try:
            announced = int(length)
        except (TypeError, ValueError):
            return  # no usable length: the streamed count decides
        if announced > self.limits.max_download_bytes:
            raise ArtifactError("download", f"{self.url} is {announced} bytes, over the limit of "
                                            f"{self.limits.max_download_bytes} bytes", refused=True)

    def write(self, chunk: bytes) -> None:
        if not chunk:
            return
        self.size += len(chunk)
        if self.size > self.limits.max_download_bytes:
            raise ArtifactError("download", f"{self.url} is over the limit of "
                                            f"{self.limits.max_download_bytes} bytes", refused=True)
        self.hash.update(chunk)
        try:
            self.out.write(chunk)
        except OSError as exc:
            raise ArtifactError("download", f"cannot write {self.url} to disk: "
                                            f"{_os_reason(exc)}") from None
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise ArtifactError("download", f"{self.url} took longer than "
                                            f"{self.limits.download_timeout:g} s")


def _scheme(url: str) -> str:
    """"http", "https" or "s3"; anything else is refused before any work is done."""
    scheme = url.split(":", 1)[0].lower() if isinstance(url, str) and ":" in url else ""
    if scheme not in ("http", "https", "s3"):
        raise ArtifactError("download", f"{display_url(url)}: only http://, https:// and "
                                        f"s3://bucket/key URLs are supported", refused=True)
    if scheme == "s3":
        _parse_s3_url(url)
    return scheme


def _download(scheme: str, url: str, out, limits: Limits, http, s3_client_factory
              ) -> tuple[int, str]:
    """Stream `url` into `out`; its size and SHA-256. No client lives at module level:
    the requests session and the boto3 client (from a fresh boto3 Session) are passed
    in or made and closed per call, so concurrent calls are safe."""
    sink = _Sink(out, display_url(url), limits)
    if scheme == "s3":
        _download_s3(url, sink, limits, s3_client_factory)
    else:
        _download_http(url, sink, limits, http)
    return sink.size, sink.hash.hexdigest()


def _download_http(url: str, sink: _Sink, limits: Limits, http: requests.Session | None) -> None:
    session = http if http is not None else requests.Session()
    response = None
    try:
        # identity: the bytes counted and hashed are the bytes of the zip.
        response = session.get(url, stream=True, allow_redirects=True,
                               timeout=(limits.connect_timeout, limits.read_timeout),
                               headers={"Accept-Encoding": "identity"})
        if not 200 <= response.status_code < 300:
            reason = f" {response.reason}" if response.reason else ""
            raise ArtifactError("download", f"{sink.url} answered {response.status_code}{reason}")
        sink.check_announced(response.headers.get("Content-Length"))
        for chunk in response.iter_content(chunk_size=CHUNK_BYTES):
            sink.write(chunk)
    except requests.RequestException as exc:
        raise ArtifactError("download", f"{sink.url}: {_http_reason(exc, limits)}") from None
    finally:
        if response is not None:
            response.close()
        if http is None:
            session.close()


def _http_reason(exc: BaseException, limits: Limits) -> str:
    chain = _chain(exc)
    if isinstance(exc, requests.ConnectTimeout):
        return f"no connection within {limits.connect_timeout:g} s"
    if isinstance(exc, requests.ReadTimeout) or any(
            type(e).__name__ == "ReadTimeoutError" for e in chain):
        return f"no data for {limits.read_timeout:g} s"
    if isinstance(exc, requests.exceptions.ChunkedEncodingError):
        return "the connection broke off during the download"
    for e in chain:
        if isinstance(e, OSError) and e.strerror:
            return f"network error: {e.strerror}"
    if isinstance(exc, requests.TooManyRedirects):
        return "too many redirects"
    if isinstance(exc, (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema,
                        requests.exceptions.InvalidSchema)):
        return "not a valid URL"
    # Other messages may quote the full URL; keep the query out of them.
    return type(exc).__name__


def _chain(exc: BaseException) -> list[BaseException]:
    """exc and the exceptions it wraps (requests -> urllib3 -> socket)."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is s for s in seen) or len(seen) > 20:
            continue
        seen.append(e)
        reason = getattr(e, "reason", None)
        if isinstance(reason, BaseException):
            todo.append(reason)
        todo.extend(a for a in e.args if isinstance(a, BaseException))
        todo.extend([e.__cause__, e.__context__])
    return seen


def _parse_s3_url(url: str) -> tuple[str, str]:
    # Keys are taken literally (as the AWS CLI does): no unquoting, "?" and "#" allowed.
    rest = url[len("s3://"):] if url[:5].lower() == "s3://" else ""
    bucket, _, key = rest.partition("/")
    if not bucket or not key:
        raise ArtifactError("download", f"{display_url(url)} is not an s3://bucket/key URL",
                            refused=True)
    return bucket, key


def _download_s3(url: str, sink: _Sink, limits: Limits, s3_client_factory) -> None:
    import botocore.exceptions
    bucket, key = _parse_s3_url(url)
    shown = f"s3://{bucket}/{key}"
    body = client = None
    try:
        client = (s3_client_factory() if s3_client_factory is not None
                  else _default_s3_client(limits))
        answer = client.get_object(Bucket=bucket, Key=key)
        body = answer["Body"]
        sink.check_announced(answer.get("ContentLength"))
        while True:
            chunk = body.read(CHUNK_BYTES)
            if not chunk:
                break
            sink.write(chunk)
    except botocore.exceptions.ClientError as exc:
        error = exc.response.get("Error", {})
        code = error.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        detail = f" ({error['Message']})" if error.get("Message") else ""
        raise ArtifactError("download", f"{shown}: {code}{detail}") from None
    except (botocore.exceptions.BotoCoreError, OSError) as exc:
        raise ArtifactError("download", f"{shown}: {exc}") from None
    finally:
        if body is not None:
            body.close()
        if s3_client_factory is None and client is not None:
            client.close()


def _default_s3_client(limits: Limits):
    import boto3
    from botocore.config import Config
    # A session per call: boto3's default session is not safe to share across threads.
    config = Config(connect_timeout=limits.connect_timeout, read_timeout=limits.read_timeout,
                    retries={"mode": "standard", "max_attempts": 3})
    return boto3.session.Session().client("s3", config=config)


# --- unpack -------------------------------------------------------------------


@dataclass
class _Counts:
    files: int = 0
    bytes: int = 0
    dirs: int = 0
    symlinks: int = 0


def _refuse(message: str) -> ArtifactError:
    return ArtifactError("unpack", message, refused=True)


def _unpack(archive: str, dest_dir: str, limits: Limits) -> _Counts:
    _check_central_directory(archive, limits)
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
        raise ArtifactError("unpack", f"the artifact is not a valid zip file ({exc})") from None
    with zf:
        try:
            staging = tempfile.mkdtemp(prefix=".unpack-", dir=os.path.dirname(dest_dir))
        except OSError as exc:
            raise ArtifactError("unpack", f"cannot create a temporary directory: "
                                          f"{_os_reason(exc)}") from None
        try:
            plan = _plan(zf, limits)
            counts = _extract(zf, plan, staging, limits)
            _move_into(staging, dest_dir)
            return counts
        except (zipfile.BadZipFile, EOFError, NotImplementedError, RuntimeError,
                zipfile.LargeZipFile) as exc:
            raise ArtifactError("unpack", f"the zip file is damaged or unsupported "
                                          f"({exc})") from None
        except OSError as exc:
            raise ArtifactError("unpack", f"cannot unpack: {_os_reason(exc)}") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _check_central_directory(archive: str, limits: Limits) -> None:
    """Refuse a zip of too many entries before zipfile builds them all in memory.

    zipfile reads every record of the central directory (its declared byte size
    decides, not the declared entry count), so both are bounded here: the count,
    and the size at CENTRAL_BYTES_PER_ENTRY per allowed entry. The end record is
    found the way zipfile finds it. Anything unreadable is left to zipfile."""
    try:
        with open(archive, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            tail_len = min(size, 22 + 65535)
            f.seek(size - tail_len)
            tail = f.read(tail_len)
            at = len(tail) - 22
            if at < 0 or tail[at:at + 4] != b"PK\x05\x06" or tail[-2:] != b"\0\0":
                at = tail.rfind(b"PK\x05\x06")  # a zip with a comment
            if at < 0 or len(tail) - at < 22:
                return
            total, cd_size = struct.unpack("<HL", tail[at + 10:at + 16])
            if at >= 20 and tail[at - 20:at - 16] == b"PK\x06\x07":  # zip64
                f.seek(struct.unpack("<Q", tail[at - 12:at - 4])[0])
                record = f.read(56)
                if len(record) == 56 and record[:4] == b"PK\x06\x06":
                    total, cd_size = struct.unpack("<QQ", record[32:48])
    except (OSError, struct.error, ValueError):
        return
    if total > limits.max_entries:
        raise _refuse(f"the zip has {total} entries, over the limit of {limits.max_entries}")
    if cd_size > limits.max_entries * CENTRAL_BYTES_PER_ENTRY:
        raise _refuse(f"the zip's central directory is {cd_size} bytes, too large for at most "
                      f"{limits.max_entries} entries")


@dataclass
class _Entry:
    info: zipfile.ZipInfo
    path: str  # normalised relative path
    kind: str  # "file", "dir", "link"
    link_target: str | None = None


def _plan(zf: zipfile.ZipFile, limits: Limits) -> list[_Entry]:
    """Check the whole archive and return what to create; nothing is written. Checked:
    the number of entries (and the central directory's size, before zipfile reads it
    into memory), the total declared size, the compression ratio of every entry over
    `ratio_min_bytes` (zip bombs), encryption (refused), and every name (no absolute
    paths, no `..` components, no backslashes, no duplicates, nothing that resolves
    outside the work dir). A symlink entry is allowed when its target is relative and
    stays inside the work dir (`bin/tool -> ../lib/tool.py`); any entry stored "inside"
    a symlink entry is refused."""
    infos = zf.infolist()
    if len(infos) > limits.max_entries:
        raise _refuse(f"the zip has {len(infos)} entries, over the limit of {limits.max_entries}")
    declared = sum(info.file_size for info in infos)
    if declared > limits.max_unpacked_bytes:
        raise _refuse(f"the zip would unpack to {declared} bytes, over the limit of "
                      f"{limits.max_unpacked_bytes} bytes")
    entries: list[_Entry] = []
    seen: dict[str, str] = {}
    for info in infos:
        name = info.filename
        path = _safe_relative_path(name)
        if info.flag_bits & 0x1:
            raise _refuse(f"entry {name!r} is encrypted")
        if info.file_size > limits.ratio_min_bytes and \
                info.file_size > limits.max_ratio * max(info.compress_size, 1):
            ratio = info.file_size / max(info.compress_size, 1)
            raise _refuse(f"entry {name!r} expands {ratio:.0f} times ({info.compress_size} to "
                          f"{info.file_size} bytes), over the limit of {limits.max_ratio:g}")
        if path is None:
            continue  # "./" and the like: the work dir itself
        if path in seen:
            raise _refuse(f"entry {name!r} appears more than once in the zip "
                          f"(as {seen[path]!r} too)")
        seen[path] = name
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            entries.append(_Entry(info, path, "link", _link_target(zf, info, path)))
        elif info.is_dir() or stat.S_ISDIR(mode):
            entries.append(_Entry(info, path, "dir"))
        else:
            entries.append(_Entry(info, path, "file"))
    links = {e.path for e in entries if e.kind == "link"}
    if links:
        for e in entries:
            parts = e.path.split("/")
            for i in range(1, len(parts)):
                inside = "/".join(parts[:i])
                if inside in links:
                    raise _refuse(f"entry {e.info.filename!r} is stored inside the symlink "
                                  f"entry {seen[inside]!r}")
    return entries


def _safe_relative_path(name: str) -> str | None:
    """The entry's normalised path relative to the work dir; refuses names that
    could land elsewhere. None for the work dir itself."""
    if "\\" in name:
        raise _refuse(f"entry {name!r} has a backslash in its name")
    if name.startswith("/"):
        raise _refuse(f"entry {name!r} has an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _refuse(f"entry {name!r} leaves the work dir")
    if not parts:
        return None
    return "/".join(parts)


def _link_target(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: str) -> str:
    name = info.filename
    if info.file_size > MAX_LINK_TARGET_BYTES:
        raise _refuse(f"symlink entry {name!r} has a {info.file_size}-byte target")
    with zf.open(info) as f:
        raw = f.read(MAX_LINK_TARGET_BYTES + 1)
    try:
        target = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(f"symlink entry {name!r} has a target that is not UTF-8") from None
    if not target or "\x00" in target or len(raw) > MAX_LINK_TARGET_BYTES:
        raise _refuse(f"symlink entry {name!r} has an invalid target")
    if target.startswith("/"):
        raise _refuse(f"symlink entry {name!r} points to {target!r}, outside the work dir")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if resolved == ".." or resolved.startswith("../"):
        raise _refuse(f"symlink entry {name!r} points to {target!r}, outside the work dir")
    return target


def _inside(root: str, path: str) -> bool:
    return os.path.commonpath([root, path]) == root


def _extract(zf: zipfile.ZipFile, plan: list[_Entry], root: str, limits: Limits) -> _Counts:
    """Write the checked plan under `root`, counting the bytes really written (a declared
    size that lies is caught by zipfile's CRC check; the count is a second bound).
    Symlinks come last, after every regular file, so no write goes through one, and
    each is checked once more with os.path.realpath against the real tree (catching
    chains such as `l -> .` plus `p -> l/..`). Modes: 0o755 for a file with any execute
    bit in the zip, else 0o644, directories 0o755; never setuid, setgid, sticky, nor
    the owner the zip records."""
    root = os.path.realpath(root)
    counts = _Counts()

    def make_dirs(path: str, entry: _Entry) -> None:
        missing = []
        while path != root and not os.path.isdir(path):
            missing.append(path)
            path = os.path.dirname(path)
        for d in reversed(missing):
            try:
                os.mkdir(d, 0o755)
            except OSError as exc:
                raise ArtifactError("unpack", f"entry {entry.info.filename!r}: cannot create "
                                              f"a directory: {_os_reason(exc)}") from None
            os.chmod(d, 0o755)  # whatever the umask
            counts.dirs += 1

    # Directories and files first, symlinks last: nothing is ever written through a link.
    for entry in sorted(plan, key=lambda e: e.kind == "link"):
        target = os.path.join(root, *entry.path.split("/"))
        # With no symlinks in the tree yet, realpath is lexical; a second guard
        # after _safe_relative_path.
        if not _inside(root, os.path.realpath(target)):
            raise _refuse(f"entry {entry.info.filename!r} leaves the work dir")
        if entry.kind == "dir":
            make_dirs(target, entry)
            continue
        make_dirs(os.path.dirname(target), entry)
        if entry.kind == "link":
            try:
                os.symlink(entry.link_target, target)
            except OSError as exc:
                raise ArtifactError("unpack", f"entry {entry.info.filename!r}: cannot create "
                                              f"the symlink: {_os_reason(exc)}") from None
            counts.symlinks += 1
            continue
        counts.bytes += _write_file(zf, entry, target, limits, counts.bytes)
        counts.files += 1
    # Every link now exists: resolve each through the real tree (chains included).
    for entry in plan:
        if entry.kind == "link":
            real = os.path.realpath(os.path.join(root, *entry.path.split("/")))
            if not _inside(root, real):
                raise _refuse(f"symlink entry {entry.info.filename!r} points to "
                              f"{entry.link_target!r}, which resolves outside the work dir")
    return counts


def _write_file(zf: zipfile.ZipFile, entry: _Entry, target: str, limits: Limits,
                written_before: int) -> int:
    name = entry.info.filename
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) \
        | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target, flags, 0o600)
    except OSError as exc:
        raise ArtifactError("unpack", f"entry {name!r}: cannot create the file: "
                                      f"{_os_reason(exc)}") from None
    written = 0
    with os.fdopen(fd, "wb") as out, zf.open(entry.info) as src:
        while True:
            chunk = src.read(CHUNK_BYTES)
            if not chunk:
                break
            written += len(chunk)
            if written_before + written > limits.max_unpacked_bytes:
                raise _refuse(f"the zip unpacks to more than {limits.max_unpacked_bytes} bytes "
                              f"(stopped at entry {name!r})")
            if written > entry.info.file_size:
                raise _refuse(f"entry {name!r} holds more than its declared "
                              f"{entry.info.file_size} bytes")
            try:
                out.write(chunk)
            except OSError as exc:
                raise ArtifactError("unpack", f"entry {name!r}: cannot write: "
                                              f"{_os_reason(exc)}") from None
        mode = entry.info.external_attr >> 16
        os.fchmod(out.fileno(), 0o755 if mode & 0o111 else 0o644)
    return written


def _move_into(staging: str, dest_dir: str) -> None:
    """Move the checked tree into dest_dir (created if missing; entries already in it
    are kept, and a name clash is refused); all or nothing."""
    try:
        os.makedirs(dest_dir, exist_ok=True)
        names = sorted(os.listdir(staging))
    except OSError as exc:
        raise ArtifactError("unpack", f"cannot create the work dir {dest_dir}: "
                                      f"{_os_reason(exc)}") from None
    for name in names:
        if os.path.lexists(os.path.join(dest_dir, name)):
            raise _refuse(f"{name!r} already exists in the work dir")
    moved: list[str] = []
    try:
        for name in names:
            target = os.path.join(dest_dir, name)
            shutil.move(os.path.join(staging, name), target)
            moved.append(target)
    except OSError as exc:
        for target in moved:
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target, ignore_errors=True)
            else:
                _unlink_quietly(target)
        raise ArtifactError("unpack", f"cannot move the unpacked files into the work dir: "
                                      f"{_os_reason(exc)}") from None


def _os_reason(exc: OSError) -> str:
    if exc.errno is not None:
        return exc.strerror or errno.errorcode.get(exc.errno, str(exc.errno))
    return str(exc)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
