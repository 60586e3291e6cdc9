"""Cgroups kept from one run job to the next.

Making a job's cgroup and removing it afterwards (a directory in each v1 hierarchy,
its limits written) costs the agent about 1 ms of CPU per job, a third of what the
rest of a job's start through the fork server costs it (docs/benchmarks.md, "A job's
start"); taking a kept one and giving it back, about 0.4 ms. So an ended run job's cgroup,
once empty, is kept (`slot-N`) and the next run job gets it with its own limits and
every counter it is measured by reset (cgroups.Manager.reuse): its peak memory, CPU
time and OOM kills are its own. Kept only where that is so (cgroup v1), for run jobs
(a service's cgroup is named after it: a restarted agent adopts it by that name), and
not on a node whose jobs are held to their GPUs by the cgroup's device rules. At most
one per slot is kept; a cgroup still holding a process is removed, never reused.
"""
from __future__ import annotations

import itertools
import logging
import threading

from . import cgroups

log = logging.getLogger(__name__)

SLOT_CGROUP = "slot-{n}"


class SlotCgroups:
    def __init__(self, manager: cgroups.Manager, keep: int):
        self._manager = manager
        self._keep = keep
        self._idle: list[cgroups.JobCgroup] = []
        self._names = itertools.count(1)
        self._lock = threading.Lock()
        self._ours: set[str] = set()

    def take(self, memory_mb: int | None, cpu_percent: int | None, max_processes: int | None) -> cgroups.JobCgroup:
        """A kept cgroup set up for a job with these limits, else a new one. Raises
        CgroupError as Manager.create does."""
        with self._lock:
            kept = self._idle.pop() if self._idle else None
        if kept is not None:
            try:
                return self._manager.reuse(kept, memory_mb, cpu_percent, max_processes)
            except cgroups.CgroupError as exc:
                log.warning("cgroup %s is not reused: %s", kept.name, exc)
                self._drop(kept)
        with self._lock:
            name = SLOT_CGROUP.format(n=next(self._names))
            self._ours.add(name)
        try:
            return self._manager.create(name, memory_mb, cpu_percent, max_processes)
        except BaseException:
            with self._lock:
                self._ours.discard(name)
            raise

    def give_back(self, cg: cgroups.JobCgroup) -> None:
        """The job of `cg` ended (its processes were killed): kept for the next one if it
        is one of these and empty, else removed."""
        with self._lock:
            ours = cg.name in self._ours
        if not ours or not cg.kill(timeout=1.0):
            self._drop(cg)
            return
        with self._lock:
            if len(self._idle) < self._keep:
                self._idle.append(cg)
                return
        self._drop(cg)

    def close(self) -> None:
        """Remove every kept cgroup (the agent stops)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for cg in idle:
            self._drop(cg)

    def _drop(self, cg: cgroups.JobCgroup) -> None:
        cg.kill()
        cg.remove()
        with self._lock:
            self._ours.discard(cg.name)


def release(slots: SlotCgroups | None, cg: cgroups.JobCgroup) -> None:
    """A job's cgroup once its job has ended or never started: kept for the next run job
    (`slots`), else killed and removed."""
    if slots is not None:
        slots.give_back(cg)
    else:
        cg.kill()
        cg.remove()
