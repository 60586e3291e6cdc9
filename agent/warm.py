"""One launch kept started ahead of the next job (AGENT_WARM_START).

The launch chain (launch.py) depends on nothing of a job but its limits and its uid, so
the agent keeps one waiting, and the next `run` job with those limits starts in about
the time of its own shell. docs/agent.md ("Warm launch") says how it behaves.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from corral.shared import wire
from corral.shared.backoff import Backoff

from . import cgroups, identity, launch, runner

log = logging.getLogger(__name__)

# Never a job's: a job's uid key is services.file_stem(job, attempt), which has no ':',
# and its cgroup's name (agent.cgroup_name) ends in the attempt's digits.
WARM_KEY = "warm:{n}"
WARM_CGROUP = "warm-{n}-next"
# After a chain was taken, this long before the next is started.
SETTLE_SECS = 0.01
# How often the keeper looks without being woken (a slot freed, a chain ended).
LOOK_SECS = 1.0


@dataclass(frozen=True)
class Limits:
    """What a warm chain was made for: a run job's memory_mb (also its /tmp's size),
    cpu_percent and max_processes (agent.Plan)."""
    memory_mb: int
    cpu_percent: int
    max_processes: int


@dataclass
class Warm:
    """A warm chain, the key its uid is held under, and its cgroup."""
    start: runner.WarmStart
    key: str
    cgroup: cgroups.JobCgroup
    limits: Limits


class WarmKeeper:
    """The only owner of the warm chain (runner.WarmStart) until a job takes it. It
    starts one, in a cgroup with the last run job's limits and under a uid of its own,
    when the agent has a free slot and none is ready, on a thread of its own, a moment
    after the last was taken (so the next does not compete for the CPUs with the job
    the last one is starting). Its cgroup keeps the name WARM_CGROUP (a cgroup cannot
    be renamed on v2); its uid is held under WARM_KEY until the job's key replaces it
    (identity.JobUsers.transfer). A chain that does not fit the next job is discarded.
    What an earlier agent left goes at start-up with the other leftovers."""

    def __init__(self, users: identity.JobUsers, manager: cgroups.Manager, tail_bytes: int,
                 private_tmp: Callable[[int], launch.PrivateTmp | None], limits: Limits,
                 wanted: Callable[[], bool],
                 start: Callable[..., runner.WarmStart] = runner.start_warm,
                 clock: Callable[[], float] = time.monotonic):
        """`private_tmp(memory_mb)`: the private /tmp a job of that size gets (None: jobs
        get none); `limits`: what the first chain is made for; `wanted()`: whether the
        agent could take a job now (a free slot, not stopping)."""
        self._users = users
        self._manager = manager
        self._tail_bytes = tail_bytes
        self._private_tmp = private_tmp
        self._limits = limits
        self._wanted = wanted
        self._start = start
        self._clock = clock
        self._lock = threading.Lock()
        self._warm: Warm | None = None
        self._unwanted: list[Warm] = []  # taken out, to be discarded by the keeper's thread
        self._closed = False
        self._numbers = itertools.count(1)
        self._not_before = 0.0
        self._backoff = Backoff(1.0, 300.0)
        self._wake = threading.Event()

    def take(self, job_type: str, limits: Limits) -> Warm | None:
        """The warm chain for a job of `job_type` with `limits`, or None (it starts cold).
        A chain that does not fit is put aside to be discarded; the next one is made
        for `limits`. (Its user fits: one for every job, or a uid per job, which the
        chain's becomes.)"""
        with self._lock:
            warm, self._warm = self._warm, None
            if job_type == wire.JOB_RUN:
                self._limits = limits
            self._not_before = max(self._not_before, self._clock() + SETTLE_SECS)
            if warm is not None and not (job_type == wire.JOB_RUN and warm.limits == limits
                                         and warm.start.alive()):
                self._unwanted.append(warm)
                warm = None
        self._wake.set()
        return warm

    def ready(self) -> Warm | None:
        """The chain waiting now, if any."""
        with self._lock:
            return self._warm

    def wake(self) -> None:
        """Look now (a slot freed)."""
        self._wake.set()

    def fill_once(self) -> Warm | None:
        """Discard what was put aside, and what ended on its own; start a chain when none
        is ready and the agent could take a job. Never raises: failures are logged and
        back off. The chain started, if any."""
        self._discard_unwanted()
        with self._lock:
            ended = self._warm if self._warm is not None and not self._warm.start.alive() else None
            if ended is not None:
                self._warm = None
            elif self._warm is not None or self._closed or self._clock() < self._not_before \
                    or not self._wanted():
                return None
            limits = self._limits
        if ended is not None:
            self._failed(f"the warm job launch ended before a job took it ({ended.start.failure()})")
            self._release(ended)
            return None
        n = next(self._numbers)
        key = WARM_KEY.format(n=n)
        cg = None
        try:
            who = self._users.acquire(key, "/")
            try:
                cg = self._manager.create(WARM_CGROUP.format(n=n), limits.memory_mb, limits.cpu_percent,
                                          limits.max_processes)
                start = self._start(self._tail_bytes, cgroup=cg, user=who.launch_user(),
                                    private_tmp=self._private_tmp(limits.memory_mb))
            except BaseException:
                if cg is not None:
                    cg.remove()
                self._users.release(key)
                raise
        except Exception as exc:
            self._failed(f"could not start a warm job launch ({exc})")
            return None
        warm = Warm(start, key, cg, limits)
        with self._lock:
            if self._closed:
                self._unwanted.append(warm)
            else:
                self._warm = warm
                self._backoff.reset()
        self._discard_unwanted()
        return self.ready()

    def close(self) -> None:
        """Discard the chain (the agent stops) and start no other. Idempotent."""
        with self._lock:
            self._closed = True
            if self._warm is not None:
                self._unwanted.append(self._warm)
                self._warm = None
        self._discard_unwanted()
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        """The keeper's thread: fill_once when woken, and every LOOK_SECS."""
        while not stop.is_set() and not self._closed:
            self._wake.wait(LOOK_SECS)
            self._wake.clear()
            wait = self._not_before - self._clock()
            if wait > 0 and stop.wait(min(wait, LOOK_SECS)):
                break
            try:
                self.fill_once()
            except Exception:  # fill_once logs its own failures: this is a bug
                log.exception("keeping a warm job launch failed")
                stop.wait(LOOK_SECS)

    def _failed(self, message: str) -> None:
        delay = self._backoff.next()
        log.warning("%s; next try in %.0fs", message, delay)
        with self._lock:
            self._not_before = self._clock() + delay

    def _discard_unwanted(self) -> None:
        with self._lock:
            unwanted, self._unwanted = self._unwanted, []
        for warm in unwanted:
            self._release(warm)

    def _release(self, warm: Warm) -> None:
        try:
            warm.start.discard()  # kills what is left in its cgroup too
            warm.cgroup.remove()
        finally:
            self._users.release(warm.key)
