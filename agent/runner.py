"""The subprocess seam: start a job's shell command, keep its output's tail, kill its tree.

Nothing here talks to the network or knows about reports. How the process is set up
(cgroup, private /tmp, user, environment) is launch.py's: `start` runs its chain and
hands the job's environment over in a memfd.
"""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import forkserver, launch, spawner

_READ_CHUNK = 64 * 1024
# How long result() waits for the pipes to drain after the job's processes are gone.
_DRAIN_SECS = 2.0


class StartError(Exception):
    """The job could not be started; `exit_code` is what to report (127: no shell)."""

    def __init__(self, message: str, exit_code: int = -1):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class RunResult:
    exit_code: int  # negative: killed by that signal (Python's convention)
    stdout: str
    stderr: str


class TailBuffer:
    """Keeps only the last `limit` bytes written to it, however much that is."""

    def __init__(self, limit: int):
        self.limit = max(0, limit)
        self._buf = bytearray()
        self.truncated = False
        # Bytes ever written: live output compares it to tell new output from none.
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)
        if self.limit == 0:
            self.truncated = self.truncated or bool(data)
            return
        self._buf += data[-self.limit:]
        excess = len(self._buf) - self.limit
        if excess > 0 or len(data) > self.limit:
            self.truncated = True
        if excess > 0:
            del self._buf[:excess]

    def text(self) -> str:
        # Live output reads this while the reader thread writes: bytes() is one
        # snapshot, which may hold one chunk more than the limit until write() trims.
        data = bytes(self._buf)
        cut = self.truncated or len(data) > self.limit
        if len(data) > self.limit:
            data = data[-self.limit:] if self.limit else b""
        if cut:
            # The cut may have split a UTF-8 sequence; drop its continuation bytes
            # rather than start the tail with a replacement character.
            skip = 0
            while skip < min(3, len(data)) and 0x80 <= data[skip] <= 0xBF:
                skip += 1
            data = data[skip:]
        return data.decode("utf-8", errors="replace")


_TOOLS: launch.Tools | None = None


def tools() -> launch.Tools:
    """The launch programs, looked up once per process (the agent's start-up calls this)."""
    global _TOOLS
    if _TOOLS is None:
        _TOOLS = launch.find_tools()
    return _TOOLS


def start(job: Mapping, workdir: str, env: Mapping[str, str], tail_bytes: int, *,
          cgroup=None, user: launch.User | None = None, private_tmp: launch.PrivateTmp | None = None,
          output_files: tuple[str, str] | None = None, captures: tuple | None = None,
          private_dev: launch.PrivateDev | None = None) -> "RunningJob":
    """Start `job["command"]` under /bin/sh in `workdir`, in a session of its own.

    `env` is the job's complete environment (jobenv.build); it is applied only by the
    launch stage that already runs as `user` (None: no switch), never by a root
    process. `cgroup` (a cgroups.JobCgroup) is joined before the first instruction and
    makes kill() and result() also end every process in it, including ones that left
    the process group with setsid. `private_tmp`: the job gets a mount namespace with
    private /tmp, /var/tmp and /dev/shm (launch.py); `private_dev`, a /dev of its own
    holding only the devices it may open (devices.py). Its standard input is empty. With
    `output_files` (stdout path, stderr path) the job writes to those files (created
    0600, appended to) instead of pipes. `captures` (stdout, stderr: the agent's own
    copies for the complete logs, log_capture.CapturedStream) get everything read
    from the pipes. Raises StartError when the process cannot be started.
    """
    command = _runnable(job.get("command"))
    try:
        if _FORK_SERVER is not None:  # the environment is the exec's argument: checked, no script
            launch.check_env(env)
            spec = forkserver.spec_for(command, workdir, env, cgroup, user, private_tmp, private_dev)
            return _start_forked(_FORK_SERVER, spec, tail_bytes, cgroup, output_files, captures)
        script = launch.env_script(env)
    except ValueError as exc:
        raise StartError(f"cannot start the job: {exc}") from exc
    try:
        argv = launch.argv(command, tools(), cgroup.join_files() if cgroup is not None else (), user,
                           private_tmp, private_dev)
        env_fd = launch.memfd("corral-env", script)
    except (OSError, ValueError) as exc:
        raise StartError(f"cannot start the job: {exc}") from exc
    stdout = stderr = subprocess.PIPE
    try:
        if output_files is not None:
            stdout = _open_append(output_files[0])
            stderr = _open_append(output_files[1])
        proc = subprocess.Popen(
            argv, cwd=workdir, env=launch.LAUNCH_ENV,
            stdin=env_fd, stdout=stdout, stderr=stderr,
            # A new session makes the job a process group of its own, so kill() can
            # reach every process it forks, and a Ctrl-C aimed at the agent's
            # terminal does not hit the jobs.
            start_new_session=True, close_fds=True,
        )
    except OSError as exc:
        if exc.filename == argv[0]:
            raise StartError(f"cannot run {argv[0]}: {exc.strerror or exc}", 127) from exc
        if exc.filename == workdir:
            raise StartError(f"cannot use work dir {workdir}: {exc.strerror or exc}") from exc
        raise StartError(f"cannot start the job: {exc}") from exc
    finally:
        for fd in (env_fd, stdout, stderr):  # the child has its own copies
            if isinstance(fd, int) and fd >= 0:
                os.close(fd)
    return RunningJob(proc, tail_bytes, cgroup, output_files, captures)


def _start_forked(server: forkserver.ForkServer, spec: forkserver.Spec, tail_bytes: int, cgroup,
                  output_files: tuple[str, str] | None, captures: tuple | None) -> "RunningJob":
    """start() through the fork server: one clone and one exec, the same job."""
    readers: tuple[int, int] | None = None
    ends: list[int] = []  # the job's ends of its output, closed here once it has its copies
    try:
        if output_files is not None:
            ends += [_open_append(output_files[0]), _open_append(output_files[1])]
        else:
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            readers, ends = (out_r, err_r), [out_w, err_w]
        pid = server.spawn(spec, ends[0], ends[1])
    except (forkserver.SpawnError, OSError) as exc:
        for fd in readers or ():
            os.close(fd)
        if isinstance(exc, forkserver.SpawnError) and exc.stage == spawner.STAGE_WORKDIR:
            raise StartError(f"cannot use work dir {spec.workdir}: {os.strerror(exc.errno)}") from exc
        if isinstance(exc, forkserver.SpawnError) and exc.stage == spawner.STAGE_EXEC:
            raise StartError(f"cannot run {spec.shell}: {os.strerror(exc.errno)}", 127) from exc
        raise StartError(f"cannot start the job: {exc}") from exc
    finally:
        for fd in ends:
            os.close(fd)
    pipes = (open(readers[0], "rb", buffering=0), open(readers[1], "rb", buffering=0)) if readers else (None, None)
    return RunningJob(forkserver.ForkedProcess(pid, *pipes), tail_bytes, cgroup, output_files, captures)


# Jobs start through this fork server when the agent made one (use_fork_server).
_FORK_SERVER: forkserver.ForkServer | None = None


def use_fork_server(server: forkserver.ForkServer | None) -> None:
    """Start jobs through `server` from now on (None: through launch.py's chain)."""
    global _FORK_SERVER
    _FORK_SERVER = server


def fork_server_in_use() -> bool:
    return _FORK_SERVER is not None


def _runnable(command: object) -> str:
    """The job's command; StartError when there is none to run."""
    if not isinstance(command, str) or not command.strip():
        raise StartError("the job has no command to run")
    return command


class WarmGone(Exception):
    """The warm chain cannot take the job (it ended, or its pipe failed); it has been
    discarded, and the job is to be started cold."""


def start_warm(tail_bytes: int, *, cgroup=None, user: launch.User | None = None,
               private_tmp: launch.PrivateTmp | None = None, cwd: str = "/") -> "WarmStart":
    """Start a warm chain (launch.warm_argv) for a `run` job not yet known: in `cgroup`,
    as `user`, with `private_tmp`, in a session of its own, its output on pipes, waiting
    in `cwd` (the work dirs' directory: see WarmStart.launch). Raises StartError when
    the chain cannot be started."""
    try:
        argv = launch.warm_argv(tools(), cgroup.join_files() if cgroup is not None else (), user,
                                private_tmp)
    except ValueError as exc:
        raise StartError(f"cannot start a warm chain: {exc}") from exc
    reader, writer = os.pipe()  # neither end is inherited by anything else the agent starts
    try:
        if user is not None:
            # The waiting stage reopens its standard input (/proc/self/fd/0) as `user`;
            # a pipe is its creator's, mode 0600.
            os.fchown(reader, user.uid, user.gid)
        # Root enters `cwd` (start() enters the work dir the same way): the job's user
        # need not be able to search the directories above it.
        proc = subprocess.Popen(argv, cwd=cwd, env=launch.LAUNCH_ENV, stdin=reader,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, close_fds=True)
    except OSError as exc:
        os.close(writer)
        raise StartError(f"cannot start a warm chain: {exc}") from exc
    finally:
        os.close(reader)
    return WarmStart(proc, writer, tail_bytes, cgroup, cwd)


class WarmStart:
    """A job's process started before the job: what start() would start, waiting for
    its job (launch.warm_script). Either launch() it, once, or discard() it."""

    def __init__(self, proc: subprocess.Popen, writer: int, tail_bytes: int, cgroup=None, cwd: str = "/"):
        self.pid = proc.pid
        self.cwd = cwd  # where it waits
        self._writer: int | None = writer
        # Its output is read from the start: a set-up failure says why on stderr.
        self._job = RunningJob(proc, tail_bytes, cgroup)

    def alive(self) -> bool:
        return self._writer is not None and self._job.poll() is None

    def launch(self, command: str, workdir: str, env: Mapping[str, str], captures: tuple | None = None
               ) -> RunningJob:
        """Run `command` in it as start() would in `workdir` with `env` (the job's cgroup
        is the chain's; `captures` as start() takes them). Raises StartError for a job
        that cannot start (the chain stays usable), WarmGone when the chain cannot take it."""
        try:
            script = launch.warm_script(_runnable(command), _path_from(self.cwd, workdir), env)
        except ValueError as exc:
            raise StartError(f"cannot start the job: {exc}") from exc
        if not self.alive():
            self.discard()
            raise WarmGone(f"the warm chain ended: {self.failure()}")
        self._job.captures = captures  # before the job can write anything
        try:
            view = memoryview(script)
            while view:
                view = view[os.write(self._writer, view):]
        except OSError as exc:  # it ended meanwhile (EPIPE)
            self.discard()
            raise WarmGone(f"the warm chain could not take the job: {exc}") from exc
        os.close(self._writer)
        self._writer = None
        return self._job

    def discard(self) -> None:
        """End it unused: it sees its pipe close and exits (it and its cgroup are killed
        should they not), and is reaped. Idempotent; its cgroup is the caller's."""
        if self._writer is not None:
            os.close(self._writer)
            self._writer = None
        self._job.kill(0.5)

    def failure(self) -> str:
        """Why a chain that ended did (its stderr), for the log."""
        result = self._job.result()
        return f"exit {result.exit_code}: {result.stderr.strip() or 'no message'}"


def _path_from(cwd: str, workdir: str) -> str:
    """`workdir` as the warm chain waiting in `cwd` reaches it: relative when it lies
    below `cwd`, so that only the directories from there on need to be searchable by
    the job's user (a state dir may lie below one only root may enter)."""
    rel = os.path.relpath(os.path.abspath(workdir), os.path.abspath(cwd))
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        return workdir
    return os.path.join(os.curdir, rel)


def _open_append(path: str) -> int:
    """The agent opens a service's log files (0600, its own) and the job only gets the
    descriptors: no job can open them, its own or another's."""
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise StartError(f"cannot open the job's output file {path}: {exc.strerror or exc}") from exc
    try:
        os.fchmod(fd, 0o600)  # a file an older agent made 0640
    except OSError:
        pass
    return fd


def read_tail(path: str, tail_bytes: int) -> str:
    """The last `tail_bytes` of a file as text ("" when it is missing)."""
    tail = TailBuffer(tail_bytes)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - tail.limit))
            tail.write(f.read(tail.limit))
            tail.truncated = tail.truncated or size > tail.limit
    except OSError:
        pass
    return tail.text()


def file_versions(paths: Sequence[str]) -> tuple:
    """Per output file, something that changes when it is written to: (size, mtime),
    or None while it is empty or missing (a job that wrote nothing)."""
    versions = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            versions.append(None)
            continue
        versions.append((st.st_size, st.st_mtime_ns) if st.st_size else None)
    return tuple(versions)


TRUNCATED_MARK = "[corral: log truncated after {} bytes]\n"


def truncate_if_over(path: str, max_bytes: int) -> bool:
    """Empty an output file that grew past `max_bytes`, leaving a marker line. The
    writer keeps appending (O_APPEND) at the new end. True when it was truncated."""
    try:
        size = os.stat(path).st_size
        if size <= max_bytes:
            return False
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, TRUNCATED_MARK.format(size).encode())
        finally:
            os.close(fd)
        return True
    except OSError:
        return False


def signal_pids(pids, sig: int, signalled_group: int | None = None) -> None:
    """`sig` to each of a job's processes (its cgroup's) that left `signalled_group`
    (setsid, or a double fork): the group's signal reached the others, and a handler
    (a checkpoint on USR1) must run once, not twice."""
    for pid in pids:
        try:
            if signalled_group is not None and os.getpgid(pid) == signalled_group:
                continue
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class RunningJob:
    """One started job. Thread-safe enough for one thread polling while another kills.
    Its output goes either to pipes read by a thread (run jobs: the tail is kept in
    memory) or, with `output_files`, to two files opened O_APPEND (services: the
    process keeps writing to them after the agent that started it has exited; the tail
    is read from the files at the end, and truncate_if_over() bounds them)."""

    def __init__(self, proc: subprocess.Popen, tail_bytes: int, cgroup=None,
                 output_files: tuple[str, str] | None = None, captures: tuple | None = None):
        self._proc = proc
        self.cgroup = cgroup
        self.pid = proc.pid
        self.pgid = proc.pid  # start_new_session: the job leads its own group
        self.output_files = output_files
        self._tail_bytes = tail_bytes
        self._stdout = TailBuffer(tail_bytes)
        self._stderr = TailBuffer(tail_bytes)
        # The agent's copies of all of it (complete logs): (stdout, stderr), or None.
        self.captures = captures
        self._stop_reading = threading.Event()
        self._result: RunResult | None = None
        self._result_lock = threading.Lock()
        # Called (from the reader thread) when the job's output pipes close, which
        # normally means it exited: lets the agent look at once instead of at its next tick.
        self.on_output_closed = None
        self._reader = None
        if output_files is None:
            self._reader = threading.Thread(target=self._read_pipes, daemon=True,
                                            name=f"job-output-{proc.pid}")
            self._reader.start()

    def poll(self) -> int | None:
        """The exit code of the job's main process, or None while it runs."""
        return self._proc.poll()

    def output_versions(self) -> tuple:
        """(stdout, stderr): each changes whenever the job writes to it, None while it
        wrote nothing. Cheap (no copy) for pipes: live output calls it every interval."""
        if self._reader is None:
            return file_versions(self.output_files)
        return (self._stdout.written or None, self._stderr.written or None)

    def output_tails(self) -> tuple[str, str]:
        """The tails of stdout and stderr so far, while the job runs (live output)."""
        if self._reader is None:
            return tuple(read_tail(path, self._tail_bytes) for path in self.output_files)
        return self._stdout.text(), self._stderr.text()

    def send(self, sig: int) -> None:
        """`sig` to every process of the job: its group and its cgroup (a warning)."""
        self._signal_group(sig)
        self._signal_cgroup(sig)

    def kill(self, grace: float, sig: int = signal.SIGTERM) -> None:
        """`sig` (the job's kill_signal) to the whole process group, SIGKILL whatever is
        left after `grace` seconds, and reap. Never raises because the job is already gone."""
        self.send(sig)
        deadline = time.monotonic() + max(0.0, grace)
        while time.monotonic() < deadline:
            if self._proc.poll() is not None and not self._group_alive() \
                    and not (self.cgroup is not None and self.cgroup.pids()):
                break
            time.sleep(0.02)
        self._signal_group(signal.SIGKILL)
        self._kill_cgroup()
        self._proc.wait()

    def result(self) -> RunResult:
        """Wait for the job to exit and return its exit code and output tails.

        Processes the job left behind in its group are killed first: a job ends
        when its shell ends, and its slot must really be free afterwards.
        """
        with self._result_lock:
            if self._result is None:
                code = self._proc.wait()
                self._signal_group(signal.SIGKILL)
                self._kill_cgroup()
                if self._reader is None:
                    out, err = (read_tail(path, self._tail_bytes) for path in self.output_files)
                    self._result = RunResult(code, out, err)
                    return self._result
                # A process that left the group (setsid) may still hold the pipes:
                # give the reader a bounded time, then stop waiting for EOF.
                self._reader.join(_DRAIN_SECS)
                self._stop_reading.set()
                self._reader.join()
                self._result = RunResult(code, self._stdout.text(), self._stderr.text())
            return self._result

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # a member exists but changed its uid
        return group_has_live_member(self.pgid)

    def _signal_cgroup(self, sig: int) -> None:
        if self.cgroup is not None:
            signal_pids(self.cgroup.pids(), sig, signalled_group=self.pgid)

    def _kill_cgroup(self) -> None:
        if self.cgroup is not None:
            self.cgroup.kill()  # never raises; ends setsid/double-forked leftovers too

    def _signal_group(self, sig: int) -> None:
        # The kernel keeps a group id reserved while any member lives, so after the
        # leader is reaped this id still names only the job's leftover processes.
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _read_pipes(self) -> None:
        sel = selectors.DefaultSelector()
        buffers = {}
        for index, (pipe, tail) in enumerate(((self._proc.stdout, self._stdout), (self._proc.stderr, self._stderr))):
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe, selectors.EVENT_READ)
            buffers[pipe.fileno()] = (tail, index)
        try:
            while sel.get_map() and not self._stop_reading.is_set():
                for key, _ in sel.select(timeout=0.1):
                    try:
                        data = os.read(key.fd, _READ_CHUNK)
                    except BlockingIOError:
                        continue
                    if data:
                        tail, index = buffers[key.fd]
                        tail.write(data)
                        captures = self.captures
                        if captures is not None:
                            captures[index].write(data)
                    else:
                        sel.unregister(key.fileobj)
        finally:
            sel.close()
            self._proc.stdout.close()
            self._proc.stderr.close()
            hook = self.on_output_closed
            if hook is not None:
                try:
                    hook()
                except Exception:  # a hint only; the agent also looks every tick
                    pass


def group_has_live_member(pgid: int) -> bool:
    """Whether a process group has a member that is not a zombie.

    killpg(pgid, 0) also succeeds for zombies, and orphaned job processes that
    died wait as zombies until PID 1 reaps them, which some container inits
    never do. Without /proc, assume the group is alive (kill() then uses its grace).
    """
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        # Fields after the parenthesised command name: state, ppid, pgrp, ...
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False
