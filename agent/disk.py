"""Disk: a job's work dir held to its `disk_mb`, and the node's free-space floor.

One thread watches both. It works on every node and filesystem, at the cost of letting
a fast writer go a few seconds past its limit (diskfs.py stops writes at it where it
can). The decisions (over_limit, under_floor) are pure. docs/agent.md ("Disk").
"""
from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .jobs import END_DISK, RUNNING, JobTable, LocalJob

log = logging.getLogger(__name__)

MiB = 1024 * 1024
DISK_MESSAGE = "job exceeded its disk limit of {} MB"
# The longest one measurement of one work dir may take; what it counted by then is a
# lower bound, enough to end a job already past its limit, and it goes on next pass.
MEASURE_SECS = 1.0
# A failing pass (an unreadable work root) is retried after at most this long.
MAX_BACKOFF_SECS = 60.0


def over_limit(used_bytes: int, limit_mb: int | None) -> bool:
    """Whether a work dir holding `used_bytes` is past a limit of `limit_mb` (None: no limit)."""
    return limit_mb is not None and used_bytes > limit_mb * MiB


def under_floor(free_bytes: int, floor_mb: int) -> bool:
    """Whether the node has less free space than its floor (0: no floor)."""
    return floor_mb > 0 and free_bytes < floor_mb * MiB


def floor_reason(free_bytes: int, floor_mb: int, path: str) -> str:
    return (f"only {free_bytes // MiB} MB free on the filesystem of {path}, under AGENT_MIN_FREE_DISK_MB "
            f"({floor_mb} MB)")


@dataclass(frozen=True)
class Usage:
    bytes: int
    complete: bool  # False: the walk ran out of time and `bytes` is a lower bound


def usage(path: str, budget_secs: float = MEASURE_SECS, clock: Callable[[], float] = time.monotonic) -> Usage:
    """The space the tree at `path` takes (allocated blocks, a hard-linked inode once),
    without following links. Files that vanish or cannot be read are skipped: the job
    changes its tree while it is walked."""
    deadline = clock() + budget_secs
    total, seen, stack = 0, set(), [path]
    while stack:
        if clock() > deadline:
            return Usage(total, False)
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                    if (info.st_dev, info.st_ino) in seen:
                        continue
                    seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
    return Usage(total, True)


def free_bytes(path: str) -> int:
    """The space an unprivileged writer can still use on the filesystem of `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def describe(work_root: str, floor_mb: int) -> dict:
    """What `corral-agent --check` says of the floor: the free space of the filesystem
    the work dirs are (or will be) on, and whether it is under the floor."""
    path = work_root
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)  # --check creates nothing: the nearest existing parent
    free = free_bytes(path)
    return {"path": work_root, "free_mb": free // MiB, "min_free_mb": floor_mb,
            "under_floor": under_floor(free, floor_mb)}


class DiskWatch:
    """The work dirs' limits and the node's floor, checked by one thread (`run`) every
    AGENT_DISK_CHECK_SECS: it measures each running job's work dir (its blocks, each
    inode once, bounded in time so a tree of millions of files cannot stall the pass)
    and ends a job past its limit (jobs.END_DISK: reported failed, `ended_by: disk`), or
    whose own filesystem is full. Below AGENT_MIN_FREE_DISK_MB free on the work dirs'
    filesystem the agent takes no new work (claims pause, with a warning) until space
    is back; what runs goes on."""

    def __init__(self, work_root: str, floor_mb: int, interval: float, jobs: JobTable,
                 end: Callable[[LocalJob, str], bool], free: Callable[[str], int] = free_bytes,
                 measure: Callable[[str], Usage] = usage, full: Callable[[str], bool] = lambda path: False):
        self.work_root = work_root
        self.floor_mb = floor_mb
        self.interval = interval
        self._jobs = jobs
        self._end = end
        self._free = free
        self._measure = measure
        self._full = full  # a work dir's own filesystem is full (diskfs.py): it is at its limit
        # Why the agent takes no new work now (under the floor); None: it does.
        self.low: str | None = None

    def check_floor(self) -> str | None:
        """Read the free space; says (and logs, on a change) why no new work is taken."""
        free = self._free(self.work_root)
        was = self.low
        self.low = floor_reason(free, self.floor_mb, self.work_root) if under_floor(free, self.floor_mb) else None
        if self.low is not None and was is None:
            log.warning("taking no new work: %s", self.low)
        elif self.low is None and was is not None:
            log.warning("taking work again: %d MB free on the filesystem of %s (AGENT_MIN_FREE_DISK_MB %d MB)",
                        free // MiB, self.work_root, self.floor_mb)
        return self.low

    def check_jobs(self) -> list[tuple[str, int]]:
        """End the running jobs whose work dir is past their disk_mb; their keys."""
        ended = []
        for local in self._jobs.snapshot():
            if local.disk_mb is None or local.state != RUNNING:
                continue
            used = self._measure(local.workdir)
            at_limit = over_limit(used.bytes, local.disk_mb) or self._full(local.workdir)
            if at_limit and self._end(local, END_DISK):
                log.warning("job %s attempt %s holds %d MB in its work dir, at or over its disk limit of %d MB; "
                            "ending it", local.job_id, local.attempt, used.bytes // MiB, local.disk_mb)
                ended.append(local.key)
        return ended

    def check_once(self) -> list[tuple[str, int]]:
        self.check_floor()
        return self.check_jobs()

    def run(self, stop_event: threading.Event) -> None:
        """The disk thread: check_once every interval; a failing pass is logged and
        retried with backoff, never ends the thread."""
        delay = self.interval
        while not stop_event.wait(delay):
            try:
                self.check_once()
                delay = self.interval
            except Exception:
                delay = min(MAX_BACKOFF_SECS, delay * 2)
                log.exception("checking disk space failed; retrying in %.1fs", delay)
