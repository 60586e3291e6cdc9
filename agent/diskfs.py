"""A filesystem of its own `disk_mb` for each job's work dir, where the node allows it.

Where the agent is root with loop devices and mkfs.ext4, a write past the limit fails
there and then (ENOSPC), where the watch (disk.py) ends a job seconds late. `decide`
(the mode in force) is pure; the rest runs mount, umount and mkfs, each with a timeout.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass

from corral.shared.errors import SettingError

log = logging.getLogger(__name__)

MODES = ("auto", "fs", "watch")
MiB = 1024 * 1024
# No journal: a work dir does not outlive a crash of its node, and a journal would take
# a slice of the job's own limit. Inode tables are not zeroed (the image is sparse, so
# they read as zeros): the cost of a start is then a few ms whatever the size.
MKFS_OPTIONS = ("-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "lazy_itable_init=1")
MOUNT_OPTIONS = "loop,nosuid,nodev,noinit_itable"
COMMAND_SECS = 30.0  # one mkfs, mount or umount; a stuck one must not hold a job for ever
PROBE_MB = 4
# A filesystem with less than this free is full: a write of the job's failed for it.
FULL_BYTES = 256 * 1024
IMAGE_SUFFIX = ".img"


@dataclass(frozen=True)
class Probe:
    """What a start-up probe found: None where all is well, else the problem."""
    root: bool
    loop_control: bool
    mkfs: str | None       # mkfs.ext4's path
    trial: str | None      # why making, mounting and removing a tiny one failed; None: it worked


def decide(mode: str, probe: Probe | None) -> tuple[bool, str]:
    """(filesystems per job, why); `probe` None when none was run (mode `watch`).
    Raises SettingError for `fs` where the node cannot."""
    if mode == "watch":
        return False, "AGENT_DISK_LIMIT_MODE is watch"
    assert probe is not None
    problem: str | None
    if not probe.root:
        problem = "the agent is not root"
    elif not probe.loop_control:
        problem = "/dev/loop-control is missing or not usable"
    elif probe.mkfs is None:
        problem = "mkfs.ext4 is not installed"
    else:
        problem = f"a trial filesystem failed: {probe.trial}" if probe.trial else None
    if not problem:
        return True, "root, loop devices and mkfs.ext4 work here"
    if mode == "fs":
        raise SettingError(f"AGENT_DISK_LIMIT_MODE is fs but this node cannot give jobs a filesystem: {problem}")
    return False, problem


def is_full(free_bytes: int) -> bool:
    return free_bytes < FULL_BYTES


def _run(argv: list[str]) -> None:
    """Run a mount tool; raises OSError with what it said when it fails or hangs."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_SECS)
    except subprocess.TimeoutExpired:
        raise OSError(f"{argv[0]} did not finish in {COMMAND_SECS:.0f}s") from None
    if done.returncode != 0:
        raise OSError(f"{os.path.basename(argv[0])} failed: {(done.stderr or done.stdout).strip()[:300]}")


def mounted(path: str) -> bool:
    """Whether `path` is a mount point (in this agent's namespace)."""
    target = os.path.abspath(path)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            return any(_unescape(line.split()[4]) == target for line in f if len(line.split()) > 4)
    except OSError:
        return os.path.ismount(target)


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


class DiskFs:
    """The work dirs' filesystems of one agent: a sparse ext4 image of `disk_mb` per job,
    `<image_root>/<work dir name>.img`, loop-mounted on the work dir before the job gets
    it. What is mounted, and what to remove, follows from a work dir's path alone, so a
    restarted agent re-adopting a service or sweeping leftovers needs no record. The
    work root is made a shared mount at start-up and jobs' mount namespaces are its
    slaves (launch.py), so a job's filesystem reaches a warm launch made before it and
    its unmount reaches namespaces made while it was mounted."""

    def __init__(self, image_root: str, work_root: str):
        self.image_root = image_root
        self.work_root = work_root
        self._mkfs = shutil.which("mkfs.ext4") or ""
        self._bound = False  # this agent made the work root's bind mount (share_work_root)

    def image_path(self, workdir: str) -> str:
        return os.path.join(self.image_root, os.path.basename(os.path.normpath(workdir)) + IMAGE_SUFFIX)

    def probe(self) -> Probe:
        """Look, then make, mount, write and remove a tiny filesystem."""
        root = os.geteuid() == 0
        loop = os.access("/dev/loop-control", os.R_OK | os.W_OK)
        mkfs = shutil.which("mkfs.ext4")
        trial = None
        if root and loop and mkfs:
            os.makedirs(self.image_root, mode=0o700, exist_ok=True)
            for entry in os.scandir(self.image_root):  # a trial an agent killed meanwhile left mounted
                if entry.name.startswith(".probe-") and entry.is_dir(follow_symlinks=False):
                    self.release(os.path.join(entry.path, "mnt"))
                    shutil.rmtree(entry.path, ignore_errors=True)
            where = tempfile.mkdtemp(prefix=".probe-", dir=self.image_root)
            target = os.path.join(where, "mnt")
            os.mkdir(target)
            try:
                self.create(target, PROBE_MB, quiet=False)
                with open(os.path.join(target, "probe"), "wb") as f:
                    f.write(b"x" * 4096)
            except OSError as exc:
                trial = str(exc)
            finally:
                self.release(target)
                shutil.rmtree(where, ignore_errors=True)
        return Probe(root, loop, mkfs, trial)

    def share_work_root(self) -> None:
        """Make the work root a shared mount (a bind mount on itself, once), so that
        jobs' mount namespaces, its slaves, follow each job filesystem's mount and unmount."""
        if not mounted(self.work_root):  # else a mount of the operator's, or an earlier agent's bind
            _run(["mount", "--bind", self.work_root, self.work_root])
            self._bound = True
        _run(["mount", "--make-shared", self.work_root])

    def unshare_work_root(self) -> None:
        """Undo share_work_root's bind mount, when it made one and no job filesystem is
        left under it (the agent stops without services); a filesystem the operator
        mounted there is never unmounted."""
        if not self._bound or not mounted(self.work_root):
            return
        prefix = os.path.join(os.path.abspath(self.work_root), "")
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
                if any(_unescape(line.split()[4]).startswith(prefix) for line in f if len(line.split()) > 4):
                    return
            _run(["umount", self.work_root])
            self._bound = False
        except OSError as exc:
            log.warning("could not unmount the work root %s: %s", self.work_root, exc)

    def create(self, workdir: str, size_mb: int, quiet: bool = True) -> bool:
        """Mount a new filesystem of `size_mb` on the (empty) `workdir`, its root 0700 root
        (prepare_workdir gives it to the job). False, with a warning, when that fails:
        the job runs under the watch alone (a node's problem must not fail it)."""
        image = self.image_path(workdir)
        try:
            os.makedirs(self.image_root, mode=0o700, exist_ok=True)
            fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                os.ftruncate(fd, size_mb * MiB)  # sparse: it takes what the job writes
            finally:
                os.close(fd)
            _run([self._mkfs or "mkfs.ext4", *MKFS_OPTIONS, image])
            _run(["mount", "-t", "ext4", "-o", MOUNT_OPTIONS, image, workdir])
            os.chmod(workdir, 0o700)
            shutil.rmtree(os.path.join(workdir, "lost+found"), ignore_errors=True)  # the job's dir starts empty
            return True
        except OSError as exc:
            self.release(workdir)
            if not quiet:
                raise
            log.warning("no filesystem of its own for the work dir %s (%s); its disk limit is watched instead",
                        workdir, exc)
            return False

    def release(self, workdir: str) -> None:
        """Unmount the filesystem on `workdir` (its loop device goes with it) and delete
        its image; nothing when it has none. An unmount that fails (a process still in
        it) is done lazily: the filesystem goes once the last user leaves."""
        if mounted(workdir):
            try:
                _run(["umount", workdir])
            except OSError as exc:
                log.warning("unmounting %s failed (%s); detaching it lazily", workdir, exc)
                try:
                    _run(["umount", "--lazy", workdir])
                except OSError as again:
                    log.warning("could not unmount %s: %s", workdir, again)
        try:
            os.unlink(self.image_path(workdir))
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not delete the disk image of %s: %s", workdir, exc)

    def full(self, workdir: str) -> bool:
        """Whether `workdir` has a filesystem of its own and it is full."""
        if not mounted(workdir):
            return False
        try:
            st = os.statvfs(workdir)
        except OSError:
            return False
        return is_full(st.f_bavail * st.f_frsize)

    def sweep(self, keep: Iterable[str]) -> int:
        """Remove the filesystems an earlier agent left (of work dirs not in `keep`: the
        adopted services'); how many."""
        kept = {os.path.basename(os.path.normpath(path)) for path in keep}
        removed = 0
        names = set()
        if os.path.isdir(self.work_root):
            names |= {entry.name for entry in os.scandir(self.work_root) if mounted(entry.path)}
        if os.path.isdir(self.image_root):
            names |= {entry.name[:-len(IMAGE_SUFFIX)] for entry in os.scandir(self.image_root)
                      if entry.name.endswith(IMAGE_SUFFIX)}
        for name in sorted(names - kept):
            self.release(os.path.join(self.work_root, name))
            removed += 1
        return removed
