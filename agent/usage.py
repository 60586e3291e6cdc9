"""What a node's jobs use, sent with each lease renewal.

Their memory now, summed, and the CPU they used since the previous renewal, in percent
of one CPU. The arithmetic (`usage`) is pure; `Meter` reads the cgroups, and sends no
usage without them or on any error (reading never stops a renewal).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass

from corral.shared import limits

from .gpu_usage import GpuMeter
from .jobs import LocalJob

log = logging.getLogger(__name__)

MiB = 1024 * 1024
# The most a renewal's usage may say (the scheduler's LeaseRenewal); a figure past
# them is sent as the bound, not refused with the renewal.
MAX_MEMORY_MB = limits.MAX_USED_MEMORY_MB
MAX_CPU_PERCENT = limits.MAX_CPU_PERCENT


@dataclass(frozen=True)
class Sample:
    """One reading: when (the agent's monotonic clock) and, per job, its memory in
    bytes and its CPU seconds since it started (None where unknown)."""
    at: float
    jobs: Mapping[Hashable, tuple[int | None, float | None]]


def usage(previous: Sample | None, current: Sample) -> dict:
    """{"memory_mb", "cpu_percent"}: the jobs' memory in `current`, and their CPU
    between `previous` and `current`. CPU is counted per job from its own CPU time in
    both readings: a job that ended between them is not in the second, and one that
    started between them (or was unreadable before) counts from its first reading, so
    neither makes the figure negative, nor huge with CPU time used before the interval
    (a service an earlier agent started). The first reading has no interval: CPU 0."""
    memory = sum(m for m, _ in current.jobs.values() if m is not None and m > 0)
    elapsed = 0.0 if previous is None else current.at - previous.at
    used = 0.0
    if previous is not None and elapsed > 0:
        for key, (_, now) in current.jobs.items():
            before = previous.jobs.get(key, (None, None))[1]
            if now is not None and before is not None and now > before:
                used += now - before
    percent = round(used / elapsed * 100) if elapsed > 0 else 0
    return {"memory_mb": min(memory // MiB, MAX_MEMORY_MB), "cpu_percent": min(percent, MAX_CPU_PERCENT)}


class Meter:
    """Reads the held jobs' cgroups for each lease renewal (`read`)."""

    def __init__(self, jobs: Callable[[], Iterable[LocalJob]], enforced: Callable[[], bool],
                 clock: Callable[[], float], gpus: GpuMeter | None = None):
        """`jobs`: the jobs held now; `enforced`: whether jobs run in cgroups here;
        `gpus`: the node's GPUs' meter (gpu_usage.py), None on a node without."""
        self._jobs = jobs
        self._enforced = enforced
        self._clock = clock
        self.gpus = gpus
        self._lock = threading.Lock()  # the lease thread and a test's own renewal may both read
        self._previous: Sample | None = None

    def read(self) -> dict | None:
        """The usage to send now, or None: no cgroups here, or reading them failed. The
        GPUs are read too, where there are some (their figures only when read)."""
        try:
            if not self._enforced():
                return None
            held = list(self._jobs())
            gpus = {} if self.gpus is None else self.gpus.sample({local.key: local.gpus for local in held
                                                                  if local.gpus})
            with self._lock:
                current = Sample(self._clock(), {local.key: _of(local) for local in held
                                                 if local.cgroup is not None})
                previous, self._previous = self._previous, current
            return {**usage(previous, current), **gpus}
        except Exception:
            log.debug("reading the jobs' usage failed; this renewal carries none", exc_info=True)
            return None


def _of(local: LocalJob) -> tuple[int | None, float | None]:
    assert local.cgroup is not None
    read = local.cgroup.usage()
    return read["memory_bytes"], read["cpu_seconds"]
