"""deploy_url artifacts: download (a real HTTP server and moto's S3 in server mode,
both on 127.0.0.1), checksum, and the safe unpacking of hostile zips."""
import hashlib
import os
import socket
import stat
import subprocess
import time
from http.server import ThreadingHTTPServer

import boto3
import pytest

from aws import CLIENT_KWARGS
from helpers import start_serving
from corral.agent.artifacts import ArtifactError, Limits, Unpacked, display_url, fetch_and_unpack
from zips import ZipHandler, dir_entry, file_entry, link_entry, make_zip

BUCKET = "builds"
FAST = Limits(connect_timeout=2.0, read_timeout=2.0)

# --- a good zip --------------------------------------------------------------------


RUN_SH = b"#!/bin/sh\necho \"hello from $(basename \"$PWD\")\"\ncat bin/data\n"
GOOD_ZIP = make_zip(
    file_entry("run.sh", RUN_SH, 0o755),
    dir_entry("lib/"),
    file_entry("lib/sub/data.txt", b"payload\n", 0o644, deflate=True),
    link_entry("bin/data", "../lib/sub/data.txt"),  # a relative link inside the tree: allowed
)
GOOD_SHA = hashlib.sha256(GOOD_ZIP).hexdigest()


def check_good_tree(dest, result):
    assert isinstance(result, Unpacked)
    assert (result.files, result.symlinks, result.dirs) == (2, 1, 3)
    assert result.bytes == len(RUN_SH) + len(b"payload\n")
    assert result.downloaded_bytes == len(GOOD_ZIP) and result.sha256 == GOOD_SHA
    assert stat.S_IMODE(os.stat(dest / "run.sh").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(dest / "lib/sub/data.txt").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(dest / "lib/sub").st_mode) == 0o755
    assert os.readlink(dest / "bin/data") == "../lib/sub/data.txt"
    out = subprocess.run(["./run.sh"], cwd=dest, capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"hello from {dest.name}\npayload\n"
    # The temporary download file and unpack dir are gone.
    assert sorted(os.listdir(dest.parent)) == [dest.name]


def assert_nothing_written(dest):
    """A refused artifact leaves the work dir's parent as it was: empty."""
    assert os.listdir(dest.parent) == []


# --- servers -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def web():
    server = ThreadingHTTPServer(("127.0.0.1", 0), ZipHandler)
    server.daemon_threads = True
    server.files = {}
    thread = start_serving(server)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def serve(web, path, body) -> str:
    web.files[path] = body
    return f"http://127.0.0.1:{web.server_address[1]}{path}"


@pytest.fixture(scope="module")
def bucket(moto_endpoint):
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, **CLIENT_KWARGS)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="etl/good.zip", Body=GOOD_ZIP)
    s3.put_object(Bucket=BUCKET, Key="big.zip", Body=b"\0" * 300_000)
    return s3


@pytest.fixture
def dest(tmp_path):
    """The job's work dir (not created yet) inside an empty parent."""
    (tmp_path / "work").mkdir()
    return tmp_path / "work" / "job-1-0"


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def refused(url, dest, stage, **kwargs) -> ArtifactError:
    kwargs.setdefault("sha256", None)
    kwargs.setdefault("limits", FAST)
    with pytest.raises(ArtifactError) as info:
        fetch_and_unpack(url, str(dest), **kwargs)
    assert info.value.stage == stage, str(info.value)
    assert str(info.value).startswith(f"{stage} "), str(info.value)
    return info.value


# --- the happy paths -----------------------------------------------------------------


def test_http_zip_unpacks_with_modes_dirs_and_links(web, dest):
    url = serve(web, "/good.zip", GOOD_ZIP)
    check_good_tree(dest, fetch_and_unpack(url, str(dest), sha256=None, limits=FAST))


def test_streamed_body_without_content_length(web, dest):
    url = serve(web, "/nolength/good.zip", GOOD_ZIP)
    check_good_tree(dest, fetch_and_unpack(url, str(dest), sha256=GOOD_SHA, limits=FAST))


@pytest.mark.slow
def test_s3_zip_through_moto_server(bucket, aws_env, dest):
    result = fetch_and_unpack(f"s3://{BUCKET}/etl/good.zip", str(dest), sha256=GOOD_SHA,
                              limits=FAST)
    check_good_tree(dest, result)


@pytest.mark.slow
def test_s3_client_factory_is_used(bucket, moto_endpoint, dest):
    made = []

    def factory():
        made.append(1)
        return boto3.client("s3", endpoint_url=moto_endpoint, **CLIENT_KWARGS)

    fetch_and_unpack(f"s3://{BUCKET}/etl/good.zip", str(dest), sha256=None, limits=FAST,
                     s3_client_factory=factory)
    assert made == [1]
    assert (dest / "run.sh").is_file()


def test_existing_work_dir_keeps_its_files(web, dest):
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    fetch_and_unpack(serve(web, "/good.zip", GOOD_ZIP), str(dest), sha256=None, limits=FAST)
    assert (dest / "keep.txt").read_text() == "mine" and (dest / "run.sh").is_file()


def test_special_mode_bits_are_never_applied(web, dest):
    body = make_zip(file_entry("suid", b"x", 0o4755), file_entry("sticky", b"x", 0o1777),
                    file_entry("private", b"x", 0o600), file_entry("gx", b"x", 0o2610))
    fetch_and_unpack(serve(web, "/modes.zip", body), str(dest), sha256=None, limits=FAST)
    modes = {n: stat.S_IMODE(os.stat(dest / n).st_mode) for n in os.listdir(dest)}
    assert modes == {"suid": 0o755, "sticky": 0o755, "private": 0o644, "gx": 0o755}


# --- checksum ----------------------------------------------------------------------------


def test_right_sha256_passes_in_any_case(web, dest):
    url = serve(web, "/good.zip", GOOD_ZIP)
    assert fetch_and_unpack(url, str(dest), sha256=GOOD_SHA.upper(), limits=FAST).files == 2


def test_wrong_sha256_is_refused_before_unpacking(web, dest):
    wrong = "0" * 64
    err = refused(serve(web, "/good.zip", GOOD_ZIP), dest, "checksum", sha256=wrong)
    assert wrong in str(err) and GOOD_SHA in str(err)
    assert str(err).startswith("checksum failed: expected sha256 ")
    assert_nothing_written(dest)


def test_malformed_sha256_is_refused_without_downloading(dest):
    err = refused("http://127.0.0.1:9/never.zip", dest, "checksum", sha256="abc123")
    assert "64 hexadecimal" in str(err)


# --- hostile names and links --------------------------------------------------------------


@pytest.mark.parametrize("entries, named, why", [
    ([file_entry("ok.txt", b"ok"), file_entry("../evil", b"x")], "../evil", "leaves the work dir"),
    ([file_entry("a/../../evil", b"x")], "a/../../evil", "leaves the work dir"),
    ([file_entry("..\\evil", b"x")], "..\\\\evil", "backslash"),
    ([link_entry("passwd", "/etc/passwd")], "passwd", "outside the work dir"),
    ([link_entry("sub/up", "../../x")], "sub/up", "outside the work dir"),
    # Each link stays inside on paper; together they resolve to the parent.
    ([link_entry("l", "."), link_entry("p", "l/..")], "p", "resolves outside the work dir"),
    ([link_entry("l", "sub"), file_entry("l/x", b"x")], "l/x", "inside the symlink entry 'l'"),
    ([file_entry("a", b"1"), file_entry("./a", b"2")], "./a", "more than once"),
])
def test_hostile_entries_are_refused(web, dest, entries, named, why):
    err = refused(serve(web, "/hostile.zip", make_zip(*entries)), dest, "unpack")
    assert str(err).startswith("unpack refused: "), str(err)
    assert f"'{named}'" in str(err) and why in str(err), str(err)
    assert_nothing_written(dest)
    assert not (dest.parent.parent / "evil").exists()


def test_absolute_path_entry_is_refused(web, dest, tmp_path):
    target = tmp_path / "abs-evil"
    err = refused(serve(web, "/abs.zip", make_zip(file_entry(str(target), b"x"))), dest, "unpack")
    assert f"entry '{target}' has an absolute path" in str(err)
    assert not target.exists()
    assert_nothing_written(dest)


def test_escape_message_reads_well(web, dest):
    body = make_zip(file_entry("../../etc/passwd", b"root::0:0"))
    err = refused(serve(web, "/slip.zip", body), dest, "unpack")
    assert str(err) == "unpack refused: entry '../../etc/passwd' leaves the work dir"


# --- sizes ------------------------------------------------------------------------------------


def test_download_over_the_limit_is_refused_from_content_length(web, dest):
    url = serve(web, "/big.zip", b"\0" * 300_000)
    err = refused(url, dest, "download", limits=Limits(max_download_bytes=100_000))
    assert "300000 bytes, over the limit of 100000 bytes" in str(err)
    assert_nothing_written(dest)


def test_endless_download_is_cut_at_the_limit(web, dest):
    start = time.monotonic()
    err = refused(f"http://127.0.0.1:{web.server_address[1]}/endless", dest, "download",
                  limits=Limits(max_download_bytes=3_000_000, read_timeout=2.0))
    assert "over the limit of 3000000 bytes" in str(err)
    assert time.monotonic() - start < 5
    assert_nothing_written(dest)


@pytest.mark.slow
def test_s3_object_over_the_limit_is_refused(bucket, aws_env, dest):
    err = refused(f"s3://{BUCKET}/big.zip", dest, "download",
                  limits=Limits(max_download_bytes=100_000))
    assert "over the limit of 100000 bytes" in str(err)
    assert_nothing_written(dest)


BOMB = make_zip(file_entry("zeros.bin", b"\0" * 5_000_000, deflate=True))


def test_zip_bomb_ratio_is_refused(web, dest):
    err = refused(serve(web, "/bomb.zip", BOMB), dest, "unpack")
    assert "entry 'zeros.bin' expands" in str(err) and "over the limit of 100" in str(err)
    assert_nothing_written(dest)


def test_total_unpacked_size_is_refused(web, dest):
    err = refused(serve(web, "/bomb.zip", BOMB), dest, "unpack",
                  limits=Limits(max_ratio=10_000, max_unpacked_bytes=4_000_000))
    assert "5000000 bytes, over the limit of 4000000 bytes" in str(err)
    assert_nothing_written(dest)


def test_ratio_applies_only_to_large_entries(web, dest):
    small = make_zip(file_entry("zeros.bin", b"\0" * 500_000, deflate=True))
    fetch_and_unpack(serve(web, "/small.zip", small), str(dest), sha256=None, limits=FAST)
    assert os.path.getsize(dest / "zeros.bin") == 500_000


def test_too_many_entries_are_refused(web, dest):
    body = make_zip(*(file_entry(f"f{i}", b"") for i in range(6)))
    err = refused(serve(web, "/many.zip", body), dest, "unpack", limits=Limits(max_entries=5))
    assert "6 entries, over the limit of 5" in str(err)
    assert_nothing_written(dest)


@pytest.mark.parametrize("name_len, message", [
    (5, "6 entries, over the limit of 5"),  # zipfile reads them all: its count decides
    (1000, "central directory is 6"),  # bounded before zipfile reads it
])
def test_a_lying_entry_count_is_caught(web, dest, name_len, message):
    body = bytearray(make_zip(*(file_entry(f"{i}".rjust(name_len, "f"), b"") for i in range(6))))
    end = body.rfind(b"PK\x05\x06")
    body[end + 8:end + 12] = (1).to_bytes(2, "little") * 2  # "1 entry"
    err = refused(serve(web, "/count.zip", bytes(body)), dest, "unpack",
                  limits=Limits(max_entries=5))
    assert message in str(err), str(err)
    assert_nothing_written(dest)


def test_a_lying_declared_size_is_caught(web, dest):
    body = bytearray(make_zip(file_entry("data.bin", b"A" * 1000)))
    central = body.find(b"PK\x01\x02")
    body[central + 24:central + 28] = (10).to_bytes(4, "little")  # claims 10 bytes
    err = refused(serve(web, "/liar.zip", bytes(body)), dest, "unpack")
    assert "CRC" in str(err)
    assert_nothing_written(dest)


def test_not_a_zip(web, dest):
    err = refused(serve(web, "/notes.zip", b"this is not a zip"), dest, "unpack")
    assert "not a valid zip file" in str(err)
    assert_nothing_written(dest)


# --- download failures --------------------------------------------------------------------


def test_http_404_names_the_status(web, dest):
    url = f"http://127.0.0.1:{web.server_address[1]}/missing.zip"
    err = refused(url, dest, "download")
    assert str(err) == f"download failed: {url} answered 404 Not Found"
    assert_nothing_written(dest)


def test_messages_hide_credentials_and_query(web, dest):
    port = web.server_address[1]
    err = refused(f"http://user:hunter2@127.0.0.1:{port}/missing.zip?X-Amz-Signature=s3cr3t",
                  dest, "download")
    assert "hunter2" not in str(err) and "s3cr3t" not in str(err)
    assert f"http://127.0.0.1:{port}/missing.zip?…" in str(err)
    assert display_url("s3://b/k?x") == "s3://b/k?x"


@pytest.mark.slow
def test_missing_s3_key_and_bucket(bucket, aws_env, dest):
    err = refused(f"s3://{BUCKET}/nope.zip", dest, "download")
    assert f"s3://{BUCKET}/nope.zip: NoSuchKey" in str(err)
    err = refused("s3://no-such-bucket/a.zip", dest, "download")
    assert "NoSuchBucket" in str(err)
    assert_nothing_written(dest)


def test_unreachable_http_host_fails_fast(dest):
    start = time.monotonic()
    err = refused(f"http://127.0.0.1:{closed_port()}/a.zip", dest, "download")
    assert "Connection refused" in str(err)
    assert time.monotonic() - start < 3
    assert_nothing_written(dest)


@pytest.mark.slow
def test_silent_server_hits_the_read_timeout(dest):
    # The kernel accepts the connection into the backlog; nobody ever answers.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        start = time.monotonic()
        err = refused(f"http://127.0.0.1:{listener.getsockname()[1]}/a.zip", dest, "download",
                      limits=Limits(connect_timeout=1.0, read_timeout=0.5))
    assert "no data for 0.5 s" in str(err)
    assert time.monotonic() - start < 3
    assert_nothing_written(dest)


@pytest.mark.slow
def test_unreachable_s3_endpoint_fails_fast(aws_env, monkeypatch, dest):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port()}")
    start = time.monotonic()
    err = refused(f"s3://{BUCKET}/etl/good.zip", dest, "download",
                  limits=Limits(connect_timeout=1.0, read_timeout=1.0))
    assert "Could not connect" in str(err)
    assert time.monotonic() - start < 8  # 3 attempts with jittered backoff
    assert_nothing_written(dest)


@pytest.mark.parametrize("url", ["ftp://host/a.zip", "file:///etc/passwd", "s3://bucket-only",
                                 "s3:///key", "not a url"])
@pytest.mark.slow
def test_unsupported_urls(dest, url):
    refused(url, dest, "download")
    assert_nothing_written(dest)
