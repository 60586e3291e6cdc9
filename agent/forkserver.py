"""The agent's side of the fork server (spawner.py): start it once, ask it for each
job's process, and hold that process as the child it is.

The agent starts jobs through it by default (AGENT_FORK_SERVER): one clone and one exec
per job, where launch.py's chain of programs costs four or five execs. The server is a
separate small interpreter, not a fork of the agent: the agent is threaded, and its
memory (every module it imports) would make each clone dearer.
"""
from __future__ import annotations

import array
import marshal
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import BinaryIO

from . import launch, spawner


class SpawnError(Exception):
    """The job's process could not be started: `stage` (spawner.STAGE_*) and errno."""

    def __init__(self, stage: str, errno: int, detail: str = ""):
        self.stage, self.errno, self.detail = stage, errno, detail
        super().__init__(f"{stage}: {os.strerror(errno) if errno else detail or 'failed'}")


@dataclass(frozen=True)
class Spec:
    """One job's start, as the server is asked it."""
    command: str
    workdir: str
    env: Mapping[str, str]
    uid: int | None = None                    # None: no switch (the agent is not root, or runs jobs as root)
    gid: int | None = None
    groups: tuple[int, ...] = ()
    join_files: tuple[str, ...] = ()          # cgroup files to write 0 into (cgroups.JobCgroup.join_files)
    cgroup_dir: str | None = None             # a v2 cgroup to be cloned into, where the kernel can
    private_dirs: tuple[str, ...] = ()        # launch.private_dirs() for a private /tmp, else ()
    tmp_size_mb: int = 0
    dev_nodes: tuple[str, ...] | None = None  # launch.PrivateDev.nodes: a /dev of its own
    shell: str = launch.SHELL

    def wire(self) -> bytes:
        return marshal.dumps({
            "command": self.command, "workdir": self.workdir, "env": dict(self.env), "uid": self.uid,
            "gid": self.gid, "groups": list(self.groups), "join_files": list(self.join_files),
            "cgroup_dir": self.cgroup_dir, "private_dirs": list(self.private_dirs),
            "tmp_size_mb": int(self.tmp_size_mb),
            "dev_nodes": None if self.dev_nodes is None else list(self.dev_nodes), "shell": self.shell})


def spec_for(command: str, workdir: str, env: Mapping[str, str], cgroup, user: launch.User | None,
             private_tmp: launch.PrivateTmp | None, private_dev: launch.PrivateDev | None) -> Spec:
    """The Spec of a job as runner.start is given it (the chain's arguments, launch.argv)."""
    v2 = cgroup is not None and getattr(cgroup, "mode", None) == "v2" and len(cgroup.paths()) == 1
    return Spec(command=command, workdir=workdir, env=env,
                uid=None if user is None else user.uid, gid=None if user is None else user.gid,
                groups=() if user is None else tuple(user.groups),
                join_files=tuple(cgroup.join_files()) if cgroup is not None else (),
                cgroup_dir=cgroup.paths()[0] if v2 else None,
                private_dirs=launch.private_dirs() if private_tmp is not None else (),
                tmp_size_mb=int(private_tmp.size_mb) if private_tmp is not None else 0,
                dev_nodes=None if private_dev is None else tuple(private_dev.nodes), shell=launch.SHELL)


class ForkServer:
    """start() it, then spawn() from any thread."""

    def __init__(self, sock: socket.socket, proc: subprocess.Popen):
        self._sock = sock
        self._proc = proc
        self.pid = proc.pid
        self._lock = threading.Lock()

    @classmethod
    def start(cls) -> "ForkServer":
        """The server, a child of this process (so that the jobs it clones are too). The
        interpreter itself runs it (not a virtualenv's link: the program needs nothing
        but the standard library), isolated from the environment and site-packages."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = subprocess.Popen([os.path.realpath(sys.executable), "-I", "-S", spawner.__file__,
                                     str(theirs.fileno())], pass_fds=(theirs.fileno(),), env=launch.LAUNCH_ENV,
                                    cwd="/", stdin=subprocess.DEVNULL, close_fds=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return cls(ours, proc)

    def spawn(self, spec: Spec, stdout: int, stderr: int) -> int:
        """Start the job's process and wait until it exec'd its shell; its pid (a child of
        this process). Raises SpawnError when it could not enter its work dir or exec its
        shell (the child is reaped), OSError when the server is gone."""
        body = spec.wire()
        report_r, report_w = os.pipe2(os.O_CLOEXEC)
        try:
            with self._lock:
                self._sock.sendmsg([spawner.HEADER.pack(len(body))], [
                    (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [stdout, stderr, report_w]))])
                self._sock.sendall(body)
                header = _read_exactly(self._sock, spawner.HEADER.size)
                answer = marshal.loads(_read_exactly(self._sock, spawner.HEADER.unpack(header)[0]))
            os.close(report_w)
            report_w = -1
            pid = int(answer["pid"])
            if pid <= 0:
                raise SpawnError(spawner.STAGE_INTERNAL, int(answer.get("errno") or 0), answer.get("detail") or "")
            # The server goes on with other jobs; this thread waits for this one's exec.
            told = _read_all(report_r)
        finally:
            os.close(report_r)
            if report_w >= 0:
                os.close(report_w)
        if told:
            _reap(pid)
            stage, _, rest = told.decode(errors="replace").partition(":")
            number, _, detail = rest.partition(":")
            raise SpawnError(stage, int(number) if number.isdigit() else 0, detail)
        return pid

    def close(self) -> None:
        """The server exits when it reads the end of its socket."""
        self._sock.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    try:
        return spawner.read_exactly(sock, size)
    except EOFError:
        raise OSError("the fork server is gone") from None


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks)


class ForkedProcess:
    """A job's process the fork server cloned as this process's child: the part of
    subprocess.Popen that RunningJob uses (pid, poll, wait, the read ends of its output
    pipes), safe from several threads."""

    def __init__(self, pid: int, stdout: BinaryIO | None = None, stderr: BinaryIO | None = None):
        self.pid = pid
        self.stdout, self.stderr = stdout, stderr
        self.returncode: int | None = None
        self._lock = threading.Lock()
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except OSError:
            self._pidfd = None  # a kernel before 5.3: wait() polls

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:
                    pid, status = self.pid, 255 << 8  # reaped elsewhere: its status is lost
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
                    if self._pidfd is not None:
                        os.close(self._pidfd)
                        self._pidfd = None
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code, once the process has exited (TimeoutError past `timeout`)."""
        waited = 0.0
        while (code := self.poll()) is None:
            if timeout is not None and waited >= timeout:
                raise TimeoutError(f"process {self.pid} still runs after {timeout}s")
            step = 0.05 if timeout is None else max(0.001, min(0.05, timeout - waited))
            pidfd = self._pidfd
            if pidfd is None:
                time.sleep(step)
            else:
                try:
                    select.select([pidfd], [], [], step)
                except (OSError, ValueError):  # closed by another thread's poll: it has exited
                    time.sleep(0.001)
            waited += step
        return code
