"""Service jobs: what a long-running `service` needs beyond a `run` job.

Its log files, a monitor thread that records it in the registry and checks its health,
and the state file by which the next agent re-adopts it. docs/agent.md ("Services")
says how they behave; the details are with ServiceMonitor, ServiceState and `adoptable`.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import requests

from corral.shared.backoff import Backoff
from corral.shared.clients import ClientError, Rejected
from corral.shared.files import write_private

from . import cgroups, runner
from .settings import safe_path_part

log = logging.getLogger(__name__)

STATE_VERSION = 1
# The registry record is sent again this often even when nothing changed.
RESEND_SECS = 30.0
# Removing a record is retried for about this long (the registry may be restarting).
REMOVE_TRY_SECS = 30.0
ADOPTED_MESSAGE = ("exit code unknown: this service was re-adopted by a restarted agent, "
                   "which cannot learn the exit status of a process it did not start")
ENDED_UNWATCHED_MESSAGE = ("exit code unknown: this service ended while no agent watched it (its agent "
                           "had stopped); the next agent found it gone")


# --- processes ---------------------------------------------------------------------------

def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of `pid`, or None if there
    is no such process. The start time is field 22 of /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # Fields after the parenthesised command name (which may hold spaces): field 3 on.
    fields = data[data.rfind(b")") + 2:].split()
    try:
        return fields[0].decode(), int(fields[19])
    except (IndexError, ValueError):
        return None


def proc_start_time(pid: int) -> int | None:
    stat = proc_stat(pid)
    return None if stat is None else stat[1]


def is_alive(pid: int, start_time: int | None) -> bool:
    """Whether `pid` runs and is the very process that started at `start_time`
    (a zombie does not count: it has exited and only waits to be reaped)."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X") and stat[1] == start_time


# --- files --------------------------------------------------------------------------------

def file_stem(job_id: str, attempt: int) -> str:
    return f"{safe_path_part(job_id)}-{attempt}"


def log_paths(log_root: str, job_id: str, attempt: int) -> tuple[str, str]:
    """A service's stdout and stderr files, `<log_root>/<job>-<attempt>.out` and `.err`.
    Files (opened O_APPEND by the agent, mode 0600 in a 0700 directory; the service
    only inherits the descriptors), not pipes: a pipe would break (SIGPIPE) when the
    agent reading it exits, a file does not."""
    stem = os.path.join(log_root, file_stem(job_id, attempt))
    return stem + ".out", stem + ".err"


def state_path(state_root: str, job_id: str, attempt: int) -> str:
    return os.path.join(state_root, file_stem(job_id, attempt) + ".json")


@dataclass(frozen=True)
class ServiceState:
    """What the next agent needs to re-adopt a running service: one JSON file (mode
    0600) per running service, `<agent_dir>/services/<job>-<attempt>.json`, removed
    when the service ends. `start_time` (proc_stat) keeps a reused pid from being
    mistaken for it; `uid` stays held by the next agent, so no new job gets it."""
    job_id: str
    attempt: int
    pid: int
    start_time: int
    cgroup: str
    port: int | None
    name: str
    health_path: str | None
    workdir: str
    stdout: str
    stderr: str
    uid: int | None = None  # its own uid (identity.PerJobUsers); None: a shared job user
    # The scheduler's service grant for this attempt on this node (with tokens): the
    # registry records the service only with it (shared/credentials.py).
    grant: str | None = None
    # Its disk limit (disk.py), held by the next agent too; None: none.
    disk_mb: int | None = None
    # The UUIDs of its GPUs (gpus_assigned): the next agent reads their usage as its own.
    gpus: list[str] = field(default_factory=list)

    def write(self, path: str) -> None:
        """Atomically: a crash leaves the old file or the new one, never half of one."""
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_private(path, json.dumps({"version": STATE_VERSION, **asdict(self)}), sync=True)

    @classmethod
    def read(cls, path: str) -> "ServiceState":
        """Raises ValueError (or OSError) for a file that is not a usable state file."""
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict) or data.pop("version", None) != STATE_VERSION:
            raise ValueError(f"not a version {STATE_VERSION} service state file")
        try:
            state = cls(**data)
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        for name in ("pid", "attempt", "start_time"):
            if isinstance(getattr(state, name), bool) or not isinstance(getattr(state, name), int):
                raise ValueError(f"{name} is not a whole number")
        if state.uid is not None and (isinstance(state.uid, bool) or not isinstance(state.uid, int)):
            raise ValueError("uid is not a whole number")
        if state.grant is not None and not isinstance(state.grant, str):
            raise ValueError("grant is not a string")
        if state.disk_mb is not None and (isinstance(state.disk_mb, bool) or not isinstance(state.disk_mb, int)):
            raise ValueError("disk_mb is not a whole number")
        if not isinstance(state.gpus, list) or not all(isinstance(uuid, str) for uuid in state.gpus):
            raise ValueError("gpus is not a list of UUIDs")
        return state


def state_files(state_root: str) -> list[str]:
    try:
        names = sorted(os.listdir(state_root))
    except FileNotFoundError:
        return []
    return [os.path.join(state_root, n) for n in names if n.endswith(".json")]


def remove_file(path: str | None) -> None:
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove %s: %s", path, exc)


# --- health --------------------------------------------------------------------------------

def check_health(port: int, health_path: str | None, timeout: float) -> bool:
    """One health check of a service listening on 127.0.0.1:`port`: an HTTP GET of
    `health_path` (healthy on 2xx/3xx) when it has one, else a TCP connect. Only the
    HTTP check notices a hung (e.g. SIGSTOPped) server: the kernel still accepts its
    TCP connections."""
    if health_path:
        try:
            with requests.Session() as http:
                http.trust_env = False  # never through an HTTP_PROXY: the service is local
                # stream: only the status line and headers are read, never a large body.
                with http.get(f"http://127.0.0.1:{port}{health_path}", timeout=(timeout, timeout),
                              allow_redirects=False, stream=True,
                              headers={"Connection": "close"}) as response:
                    return 200 <= response.status_code < 400
        except requests.RequestException:
            return False
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


class ServiceMonitor:
    """The thread that records, health-checks and trims the logs of one service. It
    records the service right after start (healthy unknown), checks it every
    `interval`, sends the record again when the health changes and every RESEND_SECS
    (a registry that lost its data learns it again), empties a log file past
    `log_max_bytes` (with a marker line), and removes the record when the service ends
    or is cancelled, not when the agent stops. A service without a port is neither
    recorded nor checked."""

    def __init__(self, registry, record: dict | None, health_path: str | None, interval: float,
                 timeout: float, log_files: tuple[str, str] | None, log_max_bytes: int,
                 check_first: bool = False):
        """`registry`: a RegistryClient of this thread's own (RegistryClient.clone: no
    HTTP session is shared between threads). `record`: the registry
        record (job_id, name, node_id, address, port), None for a service without a
        port. `check_first`: check before the first record (a re-adopted service
        that is probably healthy already), instead of recording it as unknown."""
        self.registry = registry
        self.record = record
        self.health_path = health_path
        self.interval = interval
        self.timeout = timeout
        self.log_files = log_files
        self.log_max_bytes = log_max_bytes
        self.check_first = check_first
        self.healthy: bool | None = None
        self.checks = 0
        self._stop = threading.Event()
        self._remove = False
        job_id = record["job_id"] if record else "?"
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"service-{job_id}")

    @property
    def job_id(self) -> str | None:
        return self.record["job_id"] if self.record else None

    def start(self) -> "ServiceMonitor":
        self._thread.start()
        return self

    def stop(self, remove: bool) -> None:
        """Stop checking; with `remove`, delete the registry record on the way out.
        The first call decides. Never blocks."""
        if not self._stop.is_set():
            self._remove = remove
            self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        sent: object = _UNSENT  # the `healthy` value the registry last accepted
        next_resend = 0.0
        try:
            if self.record is not None and self.check_first:
                self._check()
            if self.record is not None:
                sent, next_resend = self._send(sent, next_resend, force=True)
            while not self._stop.wait(self.interval):
                self._trim_logs()
                if self.record is None:
                    continue
                self._check()
                if self._stop.is_set():
                    break
                sent, next_resend = self._send(sent, next_resend)
        except Exception:  # a bug here must not go unnoticed, nor kill the agent
            log.exception("the monitor of service job %s failed", self.job_id)
        finally:
            try:
                if self._remove and self.record is not None:
                    self._remove_record()
            finally:
                self.registry.close()

    def _check(self) -> None:
        healthy = check_health(self.record["port"], self.health_path, self.timeout)
        self.checks += 1
        if healthy != self.healthy:
            log.info("service %s (job %s, port %s) is %s", self.record["name"], self.job_id,
                     self.record["port"], "healthy" if healthy else "unhealthy")
        self.healthy = healthy

    def _send(self, sent, next_resend, force=False):
        now = time.monotonic()
        if not force and self.healthy == sent and now < next_resend:
            return sent, next_resend
        healthy = self.healthy
        try:
            self.registry.register_service({**self.record, "healthy": healthy})
        except ClientError as exc:
            log.warning("could not record service job %s in the registry: %s; trying again "
                        "in %.1fs", self.job_id, exc, self.interval)
            return sent, next_resend
        return healthy, now + RESEND_SECS

    def _remove_record(self) -> None:
        remove_record(self.registry, self.record["job_id"], self.record.get("attempt"))

    def _trim_logs(self) -> None:
        for path in self.log_files or ():
            if runner.truncate_if_over(path, self.log_max_bytes):
                log.info("service job %s: %s passed %d bytes and was emptied", self.job_id, path,
                         self.log_max_bytes)


_UNSENT = object()


def remove_record(registry, job_id: str, attempt: int | None) -> None:
    """Remove the registry record of the service of `job_id` (only while it is the
    record of `attempt`: never that of a newer attempt elsewhere), retried for about
    REMOVE_TRY_SECS while the registry cannot be reached."""
    deadline = time.monotonic() + REMOVE_TRY_SECS
    backoff = Backoff(0.5, 8.0)
    while True:
        try:
            registry.remove_service(job_id, attempt)
            log.info("removed service job %s from the registry", job_id)
            return
        except Rejected as exc:
            if exc.status in (404, 409):
                return  # already gone, or a newer attempt's record: not ours to remove
            log.warning("the registry refused to remove service job %s: %s", job_id, exc)
            return
        except ClientError as exc:
            delay = backoff.next()
            if time.monotonic() + delay > deadline:
                log.warning("could not remove service job %s from the registry: %s; giving "
                            "up, the record stays until removed by hand", job_id, exc)
                return
            log.warning("could not remove service job %s from the registry: %s; retrying "
                        "in %.1fs", job_id, exc, delay)
            time.sleep(delay)


def forget_record_soon(registry, job_id: str, attempt: int) -> threading.Thread:
    """remove_record on a thread of its own (`registry`: a client of its own), so an
    agent starting while the registry is away does not wait for it."""
    thread = threading.Thread(target=lambda: _remove_and_close(registry, job_id, attempt), daemon=True,
                              name=f"forget-{job_id}")
    thread.start()
    return thread


def _remove_and_close(registry, job_id: str, attempt: int) -> None:
    try:
        remove_record(registry, job_id, attempt)
    except Exception:  # a bug here must not go unnoticed
        log.exception("removing the record of service job %s failed", job_id)
    finally:
        registry.close()


# --- re-adopted services ---------------------------------------------------------------------

class AdoptedProcess:
    """A service started by an earlier agent, in the shape of runner.RunningJob
    (pid, cgroup, output_files, poll, kill, result). Not our child: liveness comes
    from /proc and the cgroup, and the exit code cannot be known."""

    def __init__(self, state: ServiceState, cgroup, tail_bytes: int, enforced: bool):
        self.pid = self.pgid = state.pid  # the service leads its own session and group
        self.cgroup = cgroup
        self.output_files = (state.stdout, state.stderr)
        self._start_time = state.start_time
        self._enforced = enforced
        self._tail_bytes = tail_bytes
        self._code: int | None = None
        self._result: runner.RunResult | None = None
        self._lock = threading.Lock()

    def running(self) -> bool:
        if not is_alive(self.pid, self._start_time):
            return False
        return not self._enforced or bool(self.cgroup.pids())

    def poll(self) -> int | None:
        if self._code is None and not self.running():
            self._code = -1
        return self._code

    def output_versions(self) -> tuple:
        """As runner.RunningJob.output_versions (live output)."""
        return runner.file_versions(self.output_files)

    def output_tails(self) -> tuple[str, str]:
        return tuple(runner.read_tail(path, self._tail_bytes) for path in self.output_files)

    def send(self, sig: int) -> None:
        self._signal(sig)

    def kill(self, grace: float, sig: int = signal.SIGTERM) -> None:
        """`sig` (the job's kill_signal) to the service's group and cgroup, SIGKILL what is
        left after `grace`."""
        self._signal(sig)
        deadline = time.monotonic() + max(0.0, grace)
        while time.monotonic() < deadline:
            if not self.running() and not self.cgroup.pids() and not self._group_alive():
                break
            time.sleep(0.02)
        self._signal(signal.SIGKILL)
        self.cgroup.kill()
        self.poll()

    def result(self) -> runner.RunResult:
        with self._lock:
            if self._result is None:
                if self.poll() is None:
                    self.kill(0)
                self._signal(signal.SIGKILL)  # leftovers: a job ends when its main process ends
                self.cgroup.kill()
                out, err = (runner.read_tail(p, self._tail_bytes) for p in self.output_files)
                if err and not err.endswith("\n"):
                    err += "\n"
                self._result = runner.RunResult(-1, out, err + ADOPTED_MESSAGE)
            return self._result

    def _group_alive(self) -> bool:
        return runner.group_has_live_member(self.pgid)

    def _signal(self, sig: int) -> None:
        # The group id is safe to signal only while it still has a member that is
        # the service or one of its processes (else the id could have been reused).
        # Without cgroups, leftovers can be found only through the group.
        signalled = None
        if is_alive(self.pid, self._start_time) or (not self._enforced and self._group_alive()):
            try:
                os.killpg(self.pgid, sig)
                signalled = self.pgid
            except (ProcessLookupError, PermissionError):
                pass
        runner.signal_pids(self.cgroup.pids(), sig, signalled_group=signalled)


class Adoptable(NamedTuple):
    state: ServiceState
    path: str  # its state file
    process: AdoptedProcess


class Ended(NamedTuple):
    """A service that ended while no agent watched it: what its report needs."""
    state: ServiceState
    stdout: str  # the tails of its log files
    stderr: str


def adoptable(state_root: str, manager, tail_bytes: int, kill_grace: float
              ) -> tuple[list[Adoptable], list[Ended]]:
    """The services an earlier agent left running that this one can take over, and
    those that ended meanwhile (with their log tails, read before the leftovers go).
    State files of services that are gone (or unreadable) are deleted. A service
    that is alive but no longer in its cgroup is killed instead: limits and a
    cancellation could not reach all of it, and the retry starts a clean one."""
    found, ended = [], []
    for path in state_files(state_root):
        try:
            state = ServiceState.read(path)
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable service state file %s: %s", path, exc)
            remove_file(path)
            continue
        if not is_alive(state.pid, state.start_time):
            log.warning("service job %s attempt %s (pid %d) ended while no agent watched it; "
                        "the scheduler will be told it failed", state.job_id, state.attempt,
                        state.pid)
            out, err = (runner.read_tail(p, tail_bytes) for p in (state.stdout, state.stderr))
            if err and not err.endswith("\n"):
                err += "\n"
            ended.append(Ended(state, out, err + ENDED_UNWATCHED_MESSAGE))
            remove_file(path)
            continue
        cg = manager.adopt(state.cgroup) if manager.enforced else None
        if manager.enforced and (cg is None or state.pid not in cg.pids()):
            log.warning("service job %s attempt %s (pid %d) is no longer in its cgroup %s; "
                        "killing it instead of adopting it", state.job_id, state.attempt,
                        state.pid, state.cgroup)
            AdoptedProcess(state, cg or cgroups.NullJobCgroup(state.cgroup), 0,
                           False).kill(kill_grace)
            remove_file(path)
            continue
        process = AdoptedProcess(state, cg or cgroups.NullJobCgroup(state.cgroup), tail_bytes,
                                 enforced=cg is not None)
        found.append(Adoptable(state, path, process))
    return found, ended
