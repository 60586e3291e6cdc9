"""Per-job cgroups: memory, CPU and process limits, usage, OOM and whole-tree kills.

cgroup v2 and v1 are detected from /proc/self/cgroup and /proc/self/mountinfo
(`detect`); where neither can be used, jobs run without limits (NoCgroups, with the
reason). docs/agent.md ("Limits") says what a job gets.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import signal
import time
from collections.abc import Iterable, Sequence

log = logging.getLogger(__name__)

CFS_PERIOD_US = 100_000
AGENT_LEAF = "agent"  # v2: the leaf the agent moves itself into
V1_CONTROLLERS = ("memory", "cpu", "cpuacct", "freezer", "pids")
# On a node with GPUs, jobs' cgroups join v1's devices controller too (devices.py).
V1_DEVICES = "devices"
_NAME_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}$")  # one path component
_MIB = 1024 * 1024
_UNLIMITED_V1 = 1 << 62  # memory.limit_in_bytes values above this mean "no limit"


class CgroupError(OSError):
    """A job cgroup could not be created or configured (an OSError, so callers that
    already treat OSError as "the job could not start" handle it)."""


def ended_by_oom(exit_code: int | None, job: "JobCgroup") -> bool:
    """The proof of an out-of-memory end: the job died of SIGKILL (-9 from
    Popen, or 137 when a shell reports a child killed by it: on v1 the OOM killer
    ends only the largest process) AND the cgroup's oom_kill counter went up."""
    return exit_code in (-signal.SIGKILL, 128 + signal.SIGKILL) and job.oom_killed()


# --- small file helpers ------------------------------------------------------------

def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _write(path: str, value: str) -> None:
    # One write() call: cgroup files take a value per write.
    with open(path, "w") as f:
        f.write(value)


def _keyed(text: str | None, key: str) -> int | None:
    """The integer after `key` in a "key value" per line file (memory.events, cpu.stat)."""
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            try:
                return int(parts[1])
            except ValueError:
                return None
    return None


def _int(text: str | None) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def _procs(directory: str) -> list[int]:
    text = _read(os.path.join(directory, "cgroup.procs"))
    return [int(p) for p in (text or "").split() if p.isdigit()]


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _parse_mountinfo(text: str) -> list[tuple[str, str, str, set[str]]]:
    """(mount root, mount point, fstype, super options) for every cgroup mount."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        try:
            sep = fields.index("-", 6)
            root, point, fstype = _unescape(fields[3]), _unescape(fields[4]), fields[sep + 1]
            opts = set(fields[sep + 3].split(",")) if len(fields) > sep + 3 else set()
        except (ValueError, IndexError):
            continue
        if fstype in ("cgroup", "cgroup2"):
            mounts.append((root, point, fstype, opts))
    return mounts


def _parse_proc_cgroup(text: str) -> tuple[str | None, dict[str, str]]:
    """(the v2 path or None, {v1 controller: path})."""
    unified, v1 = None, {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            unified = path
        for ctrl in controllers.split(","):
            if ctrl:
                v1[ctrl] = path
    return unified, v1


def _own_dir(mount_root: str, mount_point: str, own_path: str) -> str | None:
    """The agent's cgroup directory inside this mount, or None when this mount does
    not show it (a cgroup namespace boundary, a mount of another subtree)."""
    if ".." in own_path.split("/"):
        return None
    root = mount_root.rstrip("/")
    if own_path == root or own_path.startswith(root + "/") or root == "":
        rel = own_path[len(root):].lstrip("/")
    else:
        return None
    return os.path.join(mount_point, rel) if rel else mount_point


def _validate_limits(memory_mb, cpu_percent, max_processes=None) -> None:
    for label, value in (("memory_mb", memory_mb), ("cpu_percent", cpu_percent),
                         ("max_processes", max_processes)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValueError(f"{label} must be a positive whole number or None, got {value!r}")


def _unique(dirs: Iterable[str]) -> list[str]:
    seen: list[str] = []
    for d in dirs:
        if d not in seen:
            seen.append(d)
    return seen


# --- job cgroups ---------------------------------------------------------------------

class JobCgroup:
    """One job's cgroup (one directory per hierarchy on v1, one on v2), nested under the
    agent's own cgroup of each hierarchy, so whatever contains the agent (a systemd unit
    with Delegate=yes, a container) still bounds it: `<mount>/<own path>/<root>/<job>`.

    A job joins it before its first instruction: the first stage of its launch
    (launch.py) writes `0` (itself) into each of `join_files()`, then execs the next.
    On v1 those are the `tasks` files, which move the writing thread alone: the kernel
    then skips its global lock of every process's threads, whose writer waits for an
    RCU grace period (milliseconds per job start, against a tenth of one for `tasks`);
    the stage is a single-threaded shell, so its thread is the whole process. A v2
    domain cgroup takes whole processes only (`cgroup.procs`). With the pids
    controller, `pids.max` bounds the job's processes and threads (a fork bomb stays
    inside its job)."""

    mode = "none"

    def __init__(self, name: str, dirs: dict[str, str], memory_mb: int | None,
                 cpu_percent: int | None, max_processes: int | None = None):
        self.name = name
        self.dirs = dirs  # controller ("unified" on v2) -> directory
        self._limits = {"memory_mb": memory_mb, "cpu_percent": cpu_percent,
                        "max_processes": max_processes}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.paths()}>"

    @property
    def limits(self) -> dict:
        """{"memory_mb", "cpu_percent", "max_processes"}: ints, None where not limited."""
        return dict(self._limits)

    # The file of each directory that the launch's first stage writes 0 into to join.
    join_file = "cgroup.procs"

    def paths(self) -> list[str]:
        return _unique(self.dirs.values())

    def join_files(self) -> list[str]:
        return [os.path.join(d, self.join_file) for d in self.paths()]

    def pids(self) -> list[int]:
        return sorted({pid for d in self.paths() for pid in _procs(d)})

    def oom_kills(self) -> int | None:
        """How many processes the kernel OOM killer ended in this cgroup (None: unknown)."""
        return None

    def oom_killed(self) -> bool:
        """Whether the OOM killer acted here. Proof of an OOM end of the job is this
        AND the job's exit by SIGKILL: the caller combines the two."""
        return (self.oom_kills() or 0) > 0

    def stats(self) -> dict:
        return {"peak_memory_bytes": None, "cpu_seconds": self.cpu_seconds()}

    def restrict_devices(self, allowed: Sequence[str]) -> None:
        """Deny every device but the `allowed` rules (devices.allow lines, "c 1:3 rwm"),
        before the job joins: cgroup v1's devices controller. Raises CgroupError where
        there is none."""
        directory = self.dirs.get(V1_DEVICES)
        if directory is None:
            raise CgroupError(f"cgroup {self.name} has no devices controller")
        _write(os.path.join(directory, "devices.deny"), "a")
        for rule in allowed:
            _write(os.path.join(directory, "devices.allow"), rule)

    def usage(self) -> dict:
        """What the job uses now: {"memory_bytes", "cpu_seconds"} (its CPU since it
        started); None where unknown (not limited here, or its cgroup is gone)."""
        return {"memory_bytes": self.memory_bytes(), "cpu_seconds": self.cpu_seconds()}

    def memory_bytes(self) -> int | None:
        """The memory the job's processes hold now (page cache included, as the limit counts it)."""
        return None

    def cpu_seconds(self) -> float | None:
        """The CPU time the job's processes used since the cgroup was made."""
        return None

    def kill(self, timeout: float = 5.0) -> bool:
        """SIGKILL every process in the cgroup, forks and setsid included, until it is
        empty or `timeout` passes. True when it is empty. Never raises."""
        raise NotImplementedError

    def remove(self, timeout: float = 2.0) -> bool:
        """rmdir every directory once empty, retrying briefly. True when all are gone.
        Never raises: a failure is logged."""
        deadline = time.monotonic() + timeout
        ok = True
        # Reverse: on v1 the memory dir is the one adopt() looks for; remove it last.
        for d in reversed(self.paths()):
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno == errno.EBUSY and time.monotonic() < deadline:
                        time.sleep(0.02)  # dying processes still leave the group
                        continue
                    log.warning("could not remove cgroup %s: %s", d, exc)
                    ok = False
                    break
        return ok

    def _wait_empty(self, deadline: float, step: float) -> bool:
        end = min(deadline, time.monotonic() + step)
        while True:
            if not self.pids():
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.01)

    def _signal_all(self, sig: int) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


class NullJobCgroup(JobCgroup):
    """What NoCgroups hands out: no limits, nothing to join, kill or remove."""

    def __init__(self, name: str, memory_mb: int | None = None, cpu_percent: int | None = None,
                 max_processes: int | None = None):
        super().__init__(name, {}, memory_mb, cpu_percent, max_processes)

    def kill(self, timeout: float = 5.0) -> bool:
        return True

    def remove(self, timeout: float = 2.0) -> bool:
        return True


class V2JobCgroup(JobCgroup):
    mode = "v2"

    @property
    def dir(self) -> str:
        return self.dirs["unified"]

    def oom_kills(self) -> int | None:
        return _keyed(_read(os.path.join(self.dir, "memory.events")), "oom_kill")

    def stats(self) -> dict:
        return {"peak_memory_bytes": _int(_read(os.path.join(self.dir, "memory.peak"))),
                "cpu_seconds": self.cpu_seconds()}

    def memory_bytes(self) -> int | None:
        return _int(_read(os.path.join(self.dir, "memory.current")))

    def cpu_seconds(self) -> float | None:
        usec = _keyed(_read(os.path.join(self.dir, "cpu.stat")), "usage_usec")
        return None if usec is None else usec / 1e6

    def kill(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        kill_file = os.path.join(self.dir, "cgroup.kill")
        try:
            while True:
                if not self.pids():
                    return True
                if os.path.exists(kill_file):  # 5.14+: the kernel also catches forks in flight
                    try:
                        _write(kill_file, "1")
                    except OSError as exc:
                        log.warning("writing %s failed: %s; signalling instead", kill_file, exc)
                        self._signal_all(signal.SIGKILL)
                else:
                    self._signal_all(signal.SIGKILL)
                if self._wait_empty(deadline, 0.5):
                    return True
                if time.monotonic() >= deadline:
                    log.warning("cgroup %s still has processes %s after %.1fs", self.dir,
                                self.pids(), timeout)
                    return False
        except Exception:  # never raise from a kill
            log.exception("killing cgroup %s failed", self.dir)
            return not self.pids()


class V1JobCgroup(JobCgroup):
    mode = "v1"
    join_file = "tasks"  # the writing thread alone: no global lock, no RCU wait (JobCgroup)
    # The OOM kills of the jobs this cgroup held before (a slot's, slot_cgroups.py): the
    # kernel's count cannot be reset.
    _oom_kills_before = 0

    def oom_kills(self) -> int | None:
        count = self._oom_kills_total()
        return None if count is None else max(0, count - self._oom_kills_before)

    def _oom_kills_total(self) -> int | None:
        d = self.dirs.get("memory")
        return _keyed(_read(os.path.join(d, "memory.oom_control")), "oom_kill") if d else None

    def reset_counters(self) -> None:
        """What the next job of this (empty) cgroup is measured by starts from nothing:
        its peak memory, its fail count and its CPU time are reset; OOM kills are
        counted from now. Raises OSError."""
        if "memory" in self.dirs:
            for name in ("memory.max_usage_in_bytes", "memory.failcnt"):
                _write(os.path.join(self.dirs["memory"], name), "0")
        if "cpuacct" in self.dirs:
            _write(os.path.join(self.dirs["cpuacct"], "cpuacct.usage"), "0")
        self._oom_kills_before = self._oom_kills_total() or 0

    def stats(self) -> dict:
        return {"peak_memory_bytes": self._memory_file("memory.max_usage_in_bytes"),
                "cpu_seconds": self.cpu_seconds()}

    def memory_bytes(self) -> int | None:
        return self._memory_file("memory.usage_in_bytes")

    def cpu_seconds(self) -> float | None:
        if "cpuacct" not in self.dirs:
            return None
        ns = _int(_read(os.path.join(self.dirs["cpuacct"], "cpuacct.usage")))
        return None if ns is None else ns / 1e9

    def _memory_file(self, name: str) -> int | None:
        return _int(_read(os.path.join(self.dirs["memory"], name))) if "memory" in self.dirs else None

    def _freezer(self, state: str) -> bool:
        d = self.dirs.get("freezer")
        if not d:
            return False
        path = os.path.join(d, "freezer.state")
        try:
            _write(path, state)
        except OSError as exc:
            log.warning("could not set %s to %s: %s", path, state, exc)
            return False
        if state == "FROZEN":  # FREEZING until every task stopped; bounded
            end = time.monotonic() + 0.5
            while (_read(path) or "").strip() != "FROZEN" and time.monotonic() < end:
                time.sleep(0.005)
        return True

    def kill(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        try:
            while True:
                if not self.pids():
                    return True
                # Frozen tasks cannot fork, so the pid list is complete; they die on thaw.
                frozen = self._freezer("FROZEN")
                try:
                    self._signal_all(signal.SIGKILL)
                finally:
                    if frozen:
                        self._freezer("THAWED")
                if self._wait_empty(deadline, 0.5):
                    return True
                if time.monotonic() >= deadline:
                    log.warning("cgroup %s still has processes %s after %.1fs", self.name,
                                self.pids(), timeout)
                    return False
        except Exception:  # never raise from a kill
            log.exception("killing cgroup %s failed", self.name)
            return not self.pids()

    def remove(self, timeout: float = 2.0) -> bool:
        if os.path.isdir(self.dirs.get("freezer", "")):
            self._freezer("THAWED")  # a frozen leftover would never empty
        return super().remove(timeout)


# --- managers ------------------------------------------------------------------------

class Manager:
    mode = "none"
    enforced = False
    # Whether job cgroups get a pids.max (the pids controller is there).
    limits_processes = False

    def __init__(self, reason: str = "", root_name: str = "corral"):
        self.reason = reason
        self.root_name = root_name
        self.roots: dict[str, str] = {}  # controller -> the directory job cgroups go in
        self.controllers: list[str] = []

    def describe(self) -> dict:
        return {"mode": self.mode, "enforced": self.enforced, "reason": self.reason,
                "controllers": list(self.controllers), "dirs": dict(self.roots),
                "limits_processes": self.limits_processes}

    def _check_name(self, name: str) -> None:
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ValueError(f"bad cgroup name {name!r}: letters, digits, '.', '_', '-'")

    def _job(self, name: str, dirs: dict[str, str], memory_mb, cpu_percent, max_processes) -> JobCgroup:
        raise NotImplementedError

    def _job_dirs(self, name: str) -> dict[str, str]:
        return {ctrl: os.path.join(root, name) for ctrl, root in self.roots.items()}

    def create(self, name: str, memory_mb: int | None, cpu_percent: int | None,
               max_processes: int | None = None) -> JobCgroup:
        """A fresh cgroup `name` with these limits (None: unlimited; `max_processes` only
        where limits_processes). A leftover of the same name is killed and removed
        first. Raises CgroupError (an OSError)."""
        self._check_name(name)
        _validate_limits(memory_mb, cpu_percent, max_processes)
        if not self.limits_processes:
            max_processes = None
        dirs = self._job_dirs(name)
        if any(os.path.isdir(d) for d in dirs.values()):
            log.warning("cgroup %s is left over from an earlier run; killing and removing it", name)
            leftover = self._job(name, {c: d for c, d in dirs.items() if os.path.isdir(d)}, None, None, None)
            leftover.kill()
            if not leftover.remove():
                raise CgroupError(f"a leftover cgroup {name} could not be removed")
        job = self._job(name, dirs, memory_mb, cpu_percent, max_processes)
        try:
            self._ensure_roots()
            for d in job.paths():
                os.mkdir(d)
            self._configure(job, memory_mb, cpu_percent, max_processes)
        except OSError as exc:
            job.remove(0.5)
            raise CgroupError(f"cannot set up cgroup {name}: {exc}") from exc
        return job

    def _configure(self, job: JobCgroup, memory_mb, cpu_percent, max_processes) -> None:
        raise NotImplementedError

    # Whether an empty job cgroup can be given to another job (reuse): where every counter
    # a job is measured by can be reset. Not on v2, whose memory.peak a write resets only
    # for the file descriptor that wrote it.
    reusable = False

    def reuse(self, job: JobCgroup, memory_mb: int | None, cpu_percent: int | None,
              max_processes: int | None = None) -> JobCgroup:
        """The empty cgroup `job`, for another job with these limits and its counters
        reset (a slot's, slot_cgroups.py). Raises CgroupError (an OSError)."""
        raise CgroupError(f"cgroups cannot be reused here ({self.mode})")

    def _ensure_roots(self) -> None:
        """Recreate the root_name directories if something removed them since detect()."""
        for d in _unique(self.roots.values()):
            os.makedirs(d, exist_ok=True)

    def adopt(self, name: str) -> JobCgroup | None:
        """The existing cgroup `name` (after an agent restart), or None if there is none."""
        return None

    def list_job_cgroups(self) -> list[str]:
        """Names of the job cgroups present (v1: as seen in the memory hierarchy)."""
        root = self.roots.get("memory") or self.roots.get("unified")
        if root is None:  # no hierarchy (os.scandir(None) would list the working directory)
            return []
        try:
            return sorted(e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False))
        except OSError:
            return []

    def remove_job_cgroups(self, keep: frozenset[str] | set[str] = frozenset(), why: str | None = None) -> list[str]:
        """Kill the processes of every job cgroup here but those named in `keep`, and
        remove the cgroups; the names removed. With `why`, each is logged as a warning."""
        removed = []
        for name in self.list_job_cgroups():
            group = None if name in keep else self.adopt(name)
            if group is None:
                continue
            if why:
                log.warning("removing job cgroup %s %s (pids %s)", name, why, group.pids() or "none")
            group.kill()
            group.remove()
            removed.append(name)
        return removed

    def cleanup(self) -> bool:
        """Remove the (empty) `root_name` directories; False if job cgroups remain."""
        ok = True
        for d in reversed(_unique(self.roots.values())):
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.info("not removing %s: %s", d, exc)
                ok = False
        return ok


class NoCgroups(Manager):
    """Jobs run without limits: not root, no writable hierarchy, controllers missing."""

    def create(self, name: str, memory_mb: int | None, cpu_percent: int | None,
               max_processes: int | None = None) -> JobCgroup:
        self._check_name(name)
        _validate_limits(memory_mb, cpu_percent, max_processes)
        return NullJobCgroup(name, memory_mb, cpu_percent, None)


class V1Manager(Manager):
    mode = "v1"
    enforced = True

    def __init__(self, roots: dict[str, str], root_name: str):
        super().__init__("", root_name)
        self.roots = roots
        self.controllers = [c for c in (*V1_CONTROLLERS, V1_DEVICES) if c in roots]
        self.limits_processes = "pids" in roots
        own_memory = os.path.dirname(roots["memory"])
        self.swap_limited = os.path.exists(os.path.join(own_memory, "memory.memsw.limit_in_bytes"))
        self.reason = ("cgroup v1: " + ("memory, cpu and process-count" if "pids" in roots else "memory and cpu")
                       + " limits"
                       + (", swap included" if self.swap_limited else
                          " (no memory.memsw: swap accounting is off, jobs may swap)")
                       + ("" if "freezer" in roots else "; no freezer: kill without freezing")
                       + ("" if "cpuacct" in roots else "; no cpuacct: cpu usage unknown")
                       + ("" if "pids" in roots else "; no pids hierarchy: process counts unlimited"))

    def describe(self) -> dict:
        return {**super().describe(), "swap_limited": self.swap_limited,
                "kill": "freezer + SIGKILL" if "freezer" in self.roots else "SIGKILL loop"}

    def _job(self, name, dirs, memory_mb, cpu_percent, max_processes) -> JobCgroup:
        return V1JobCgroup(name, dirs, memory_mb, cpu_percent, max_processes)

    reusable = True

    def reuse(self, job: JobCgroup, memory_mb: int | None, cpu_percent: int | None,
              max_processes: int | None = None) -> JobCgroup:
        _validate_limits(memory_mb, cpu_percent, max_processes)
        if not self.limits_processes:
            max_processes = None
        if job.pids():
            raise CgroupError(f"cgroup {job.name} still holds processes")
        again = V1JobCgroup(job.name, job.dirs, memory_mb, cpu_percent, max_processes)
        try:
            if again.limits != job.limits:  # the same limits (most jobs: the defaults) are in place
                memsw = os.path.join(job.dirs["memory"], "memory.memsw.limit_in_bytes")
                if os.path.exists(memsw):  # unlimited first: the memory limit may not rise above it
                    _write(memsw, "-1")
                self._configure(again, memory_mb, cpu_percent, max_processes)
            again.reset_counters()
        except OSError as exc:
            raise CgroupError(f"cannot set up cgroup {job.name} again: {exc}") from exc
        return again

    def _configure(self, job: JobCgroup, memory_mb, cpu_percent, max_processes) -> None:
        mem = job.dirs["memory"]
        limit = str(memory_mb * _MIB) if memory_mb else "-1"
        # memory first: memory.limit_in_bytes may never exceed memsw.
        _write(os.path.join(mem, "memory.limit_in_bytes"), limit)
        memsw = os.path.join(mem, "memory.memsw.limit_in_bytes")
        if os.path.exists(memsw):
            _write(memsw, limit)
        cpu = job.dirs["cpu"]
        _write(os.path.join(cpu, "cpu.cfs_period_us"), str(CFS_PERIOD_US))
        _write(os.path.join(cpu, "cpu.cfs_quota_us"),
               str(cpu_percent * CFS_PERIOD_US // 100) if cpu_percent else "-1")
        if "pids" in job.dirs:
            _write(os.path.join(job.dirs["pids"], "pids.max"), str(max_processes) if max_processes else "max")

    def adopt(self, name: str) -> JobCgroup | None:
        self._check_name(name)
        dirs = {c: d for c, d in self._job_dirs(name).items() if os.path.isdir(d)}
        if "memory" not in dirs:
            return None
        limit = _int(_read(os.path.join(dirs["memory"], "memory.limit_in_bytes")))
        memory_mb = limit // _MIB if limit is not None and limit < _UNLIMITED_V1 else None
        quota = _int(_read(os.path.join(dirs["cpu"], "cpu.cfs_quota_us"))) if "cpu" in dirs else None
        period = _int(_read(os.path.join(dirs["cpu"], "cpu.cfs_period_us"))) if "cpu" in dirs else None
        cpu_percent = quota * 100 // period if quota and quota > 0 and period else None
        processes = _int(_read(os.path.join(dirs["pids"], "pids.max"))) if "pids" in dirs else None
        return V1JobCgroup(name, dirs, memory_mb, cpu_percent, processes)


class V2Manager(Manager):
    mode = "v2"
    enforced = True

    def __init__(self, base: str, root_name: str, pids: bool = True):
        super().__init__("cgroup v2: " + ("memory (no swap), cpu and process-count" if pids else
                                          "memory (no swap) and cpu") + " limits"
                         + ("" if pids else "; no pids controller: process counts unlimited"), root_name)
        self.base = base
        self.controllers = ["memory", "cpu", "pids"] if pids else ["memory", "cpu"]
        self.limits_processes = pids
        self.roots = {"unified": os.path.join(base, root_name)}

    def describe(self) -> dict:
        root = self.roots["unified"]
        return {**super().describe(), "base": self.base,
                "kill": "cgroup.kill" if os.path.exists(os.path.join(root, "cgroup.kill"))
                else "SIGKILL loop"}

    def _job(self, name, dirs, memory_mb, cpu_percent, max_processes) -> JobCgroup:
        return V2JobCgroup(name, dirs, memory_mb, cpu_percent, max_processes)

    def _ensure_roots(self) -> None:
        top = self.roots["unified"]
        os.makedirs(top, exist_ok=True)
        control = os.path.join(top, "cgroup.subtree_control")
        if not set(self.controllers) <= set((_read(control) or "").split()):
            _write(control, " ".join("+" + c for c in self.controllers))

    def _configure(self, job: JobCgroup, memory_mb, cpu_percent, max_processes) -> None:
        d = job.dirs["unified"]
        _write(os.path.join(d, "memory.max"), str(memory_mb * _MIB) if memory_mb else "max")
        if os.path.exists(os.path.join(d, "memory.swap.max")):  # absent without swap accounting
            _write(os.path.join(d, "memory.swap.max"), "0")
        # The whole job is one unit for the OOM killer: one process over, all go.
        _write(os.path.join(d, "memory.oom.group"), "1")
        quota = str(cpu_percent * CFS_PERIOD_US // 100) if cpu_percent else "max"
        _write(os.path.join(d, "cpu.max"), f"{quota} {CFS_PERIOD_US}")
        if self.limits_processes:
            _write(os.path.join(d, "pids.max"), str(max_processes) if max_processes else "max")

    def adopt(self, name: str) -> JobCgroup | None:
        self._check_name(name)
        d = os.path.join(self.roots["unified"], name)
        if not os.path.isdir(d):
            return None
        mem = (_read(os.path.join(d, "memory.max")) or "").strip()
        memory_mb = int(mem) // _MIB if mem.isdigit() else None
        cpu = (_read(os.path.join(d, "cpu.max")) or "").split()
        cpu_percent = (int(cpu[0]) * 100 // int(cpu[1])
                       if len(cpu) == 2 and cpu[0].isdigit() and cpu[1].isdigit() else None)
        processes = _int(_read(os.path.join(d, "pids.max")))
        return V2JobCgroup(name, {"unified": d}, memory_mb, cpu_percent, processes)


# --- detection -----------------------------------------------------------------------

def detect(proc_self_cgroup: str = "/proc/self/cgroup", mounts: str = "/proc/self/mountinfo",
           root_name: str = "corral", *, euid: int | None = None, prepare: bool = True,
           devices: bool = False) -> Manager:
    """The cgroup manager this agent can use: v2, else v1, else NoCgroups (with a reason).

    `prepare=True` creates the `root_name` directories (and on v2 moves the agent into
    a leaf and enables the controllers), which is the real test that the hierarchy is
    writable; `prepare=False` only looks (for a `--check` run by an operator).
    `devices`: on v1, jobs' cgroups join the devices controller too (a node with GPUs).
    `euid` overrides os.geteuid() (tests). Never raises for an environment problem.
    """
    try:
        if not _NAME_RE.match(root_name or ""):
            return NoCgroups(f"bad cgroup root name {root_name!r}", root_name)
        uid = os.geteuid() if euid is None else euid
        if uid != 0:
            return NoCgroups(f"the agent is not root (euid {uid}): jobs run without memory "
                             "and cpu limits", root_name)
        own_text, mount_text = _read(proc_self_cgroup), _read(mounts)
        if own_text is None or mount_text is None:
            return NoCgroups(f"cannot read {proc_self_cgroup} or {mounts}", root_name)
        unified, v1_paths = _parse_proc_cgroup(own_text)
        mount_list = _parse_mountinfo(mount_text)
        reasons = []
        if unified is not None:
            manager = _detect_v2(unified, mount_list, root_name, prepare, reasons)
            if manager is not None:
                return manager
        manager = _detect_v1(v1_paths, mount_list, root_name, prepare, reasons, devices)
        if manager is not None:
            return manager
        return NoCgroups("; ".join(reasons) or "no cgroup hierarchy found", root_name)
    except Exception as exc:  # an environment we did not foresee must not stop the agent
        log.exception("cgroup detection failed")
        return NoCgroups(f"cgroup detection failed: {exc}", root_name)


def _detect_v2(own_path, mount_list, root_name, prepare, reasons) -> Manager | None:
    own = None
    for root, point, fstype, _ in mount_list:
        if fstype == "cgroup2":
            candidate = _own_dir(root, point, own_path)
            if candidate and os.path.isdir(candidate):
                own, mount_point = candidate, point
                break
    if own is None:
        reasons.append("cgroup v2: no cgroup2 mount shows the agent's cgroup")
        return None
    # After a restart inside <own>/agent, keep using <own> so job cgroups are found again.
    parent = os.path.dirname(own)
    if (os.path.basename(own) == AGENT_LEAF and own != mount_point
            and os.path.isdir(os.path.join(parent, root_name))
            and {"memory", "cpu"} <= set((_read(os.path.join(parent, "cgroup.subtree_control")) or "").split())):
        own = parent
    available = set((_read(os.path.join(own, "cgroup.controllers")) or "").split())
    missing = {"memory", "cpu"} - available
    if missing:
        reasons.append(f"cgroup v2: controller(s) {', '.join(sorted(missing))} not available in "
                       f"{own} (under systemd, set Delegate=yes)")
        return None
    manager = V2Manager(own, root_name, pids="pids" in available)
    if not prepare:
        if not os.access(own, os.W_OK):
            reasons.append(f"cgroup v2: {own} is not writable")
            return None
        return manager
    try:
        _enable_v2(own, own == mount_point, manager.controllers)
        manager._ensure_roots()
    except OSError as exc:
        reasons.append(f"cgroup v2: cannot prepare {own}: {exc}")
        return None
    return manager


def _enable_v2(own: str, is_root: bool, controllers: list[str]) -> None:
    """Enable `controllers` (memory, cpu, pids when there) for the agent's subtree. A
    non-root cgroup with enabled controllers may hold no processes, so everything in
    <own> moves to <own>/agent first (else EBUSY). The hierarchy root is exempt."""
    control = os.path.join(own, "cgroup.subtree_control")
    if set(controllers) <= set((_read(control) or "").split()):
        return
    if not is_root:
        leaf = os.path.join(own, AGENT_LEAF)
        os.makedirs(leaf, exist_ok=True)
        for _ in range(5):  # processes may fork while we move them; bounded
            pids = _procs(own)
            if not pids:
                break
            for pid in pids:
                try:
                    _write(os.path.join(leaf, "cgroup.procs"), str(pid))
                except OSError as exc:
                    if exc.errno != errno.ESRCH:
                        raise
        log.info("moved the agent's processes into %s to enable controllers in %s", leaf, own)
    _write(control, " ".join("+" + c for c in controllers))


def _detect_v1(v1_paths, mount_list, root_name, prepare, reasons, devices=False) -> Manager | None:
    roots: dict[str, str] = {}
    for ctrl in (*V1_CONTROLLERS, *((V1_DEVICES,) if devices else ())):
        own_path = v1_paths.get(ctrl)
        if own_path is None:
            continue
        for root, point, fstype, opts in mount_list:
            if fstype == "cgroup" and ctrl in opts:
                own = _own_dir(root, point, own_path)
                if own and os.path.isdir(own):
                    roots[ctrl] = os.path.join(own, root_name)
                    break
    missing = [c for c in ("memory", "cpu") if c not in roots]
    if missing:
        reasons.append(f"cgroup v1: no usable {' and '.join(missing)} hierarchy")
        return None
    for ctrl in list(roots):
        parent = os.path.dirname(roots[ctrl])
        try:
            if prepare:
                os.makedirs(roots[ctrl], exist_ok=True)
            elif not os.access(parent, os.W_OK):
                raise PermissionError(errno.EACCES, "not writable", parent)
        except OSError as exc:
            if ctrl in ("memory", "cpu"):
                reasons.append(f"cgroup v1: cannot use the {ctrl} hierarchy at {parent}: {exc}")
                return None
            log.warning("cgroup v1: not using the %s hierarchy at %s: %s", ctrl, parent, exc)
            del roots[ctrl]
    return V1Manager(roots, root_name)
