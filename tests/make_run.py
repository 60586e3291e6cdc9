"""`make run` as a process: scripts/run_local.py with a state dir of the test's own
and short intervals; its output goes to a log file. `stop_local` ends it and every
process it started, also when the test failed."""
import os
import signal
import subprocess
import sys
import time

from cluster import base_env, kill_leftover_jobs
from paths import REPO

RUN_LOCAL = os.path.join(REPO, "scripts", "run_local.py")
NODES = ("node-1", "node-2")  # the agents run_local starts


class LocalRun(subprocess.Popen):
    """run_local's process, and the state dir it was given."""
    state_dir: str


def run_local(tmp_path, state_dir=None, **env) -> tuple[LocalRun, str]:
    """Start `make run` with its state in `state_dir` (default: tmp_path/state); pair it
    with stop_local in a `finally`."""
    log = str(tmp_path / "run_local.log")
    full = base_env(str(state_dir or tmp_path / "state"), POLL_INTERVAL_SECS=0.2, HEARTBEAT_INTERVAL_SECS=0.5,
                    AGENT_STOP_GRACE_SECS=2, AGENT_KILL_GRACE_SECS=1, **env)
    with open(log, "wb") as out:
        proc = LocalRun([sys.executable, RUN_LOCAL], env=full, stdin=subprocess.DEVNULL,
                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    proc.state_dir = full["CORRAL_STATE_DIR"]
    return proc, log


def stop_local(proc: LocalRun, grace: float = 60.0) -> None:
    """End a run_local process and everything below it. It is asked first (SIGTERM: it
    stops its agents, scheduler and registry in order); after `grace` seconds it and
    every process it started are killed by PID: each of its children runs in a session
    of its own, which a signal to its process group would miss, and once it is gone
    they are no longer its descendants, so they are listed before. Then what the
    agents left (job cgroups, services) goes too."""
    started = _descendants(proc.pid)
    if proc.poll() is None:
        _signal(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        started.add((proc.pid, _start_time(proc.pid) or 0))
    _kill_tree(started)
    proc.wait(10)
    for node in NODES:
        kill_leftover_jobs(node, proc.state_dir)


def _kill_tree(processes: set[tuple[int, int]], timeout: float = 10.0) -> None:
    """SIGKILL `processes` (pid, start time) and whatever they started. All are stopped
    (SIGSTOP) first, and their children found again, until no new one appears: a
    gunicorn master whose worker was killed first would start another, which nothing
    would then find."""
    stopped: set[tuple[int, int]] = set()
    todo = {p for p in processes if _start_time(p[0]) == p[1]}
    deadline = time.monotonic() + timeout
    while todo and time.monotonic() < deadline:
        for pid, _ in todo:
            _signal(pid, signal.SIGSTOP)
        stopped |= todo
        while time.monotonic() < deadline and any(_state(pid) not in ("T", None, "Z", "X") for pid, _ in todo):
            time.sleep(0.01)
        todo = {child for pid, _ in todo for child in _descendants(pid)} - stopped
    for pid, start in stopped:
        if _start_time(pid) == start:
            _signal(pid, signal.SIGKILL)
    while time.monotonic() < deadline and any(_state(pid) not in (None, "Z", "X") for pid, _ in stopped):
        time.sleep(0.01)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _state(pid: int) -> str | None:
    """A process's state letter (R, S, T, Z ...), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def _start_time(pid: int) -> int | None:
    """A process's start time (so that a reused pid is never mistaken for it), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _descendants(pid: int) -> set[tuple[int, int]]:
    """(pid, start time) of every live process below `pid`."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parent = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            start = _start_time(child)
            if start is not None:
                found.add((child, start))
            todo.append(child)
    return found
