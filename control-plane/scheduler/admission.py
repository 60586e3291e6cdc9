"""The cluster-wide bound on pending jobs (MAX_PENDING_JOBS).

Whether a request that creates n new jobs may store them, decided on each process's own
estimate so that no submit pays for a count that grows with the queue. Beyond the
bound: TooManyRequests (429, Retry-After), and nothing is written.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from corral.shared.errors import TooManyRequests

log = logging.getLogger(__name__)

SETTING = "MAX_PENDING_JOBS"
# A count is used this long, then made again (the overshoot window across processes).
RECOUNT_SECS = 1.0
# While refusing, a count is made again at most this often.
REFUSED_RECOUNT_SECS = 0.1
# What a refused client is told to wait: jobs ahead have to start first.
RETRY_AFTER_SECS = 5


@dataclass(frozen=True)
class Estimate:
    """Pending jobs as this process knows them: `counted` at `at` (a monotonic time),
    and `added` since by its own admissions."""

    counted: int
    at: float
    added: int = 0

    @property
    def pending(self) -> int:
        return self.counted + self.added


def needs_count(estimate: Estimate | None, new: int, limit: int, now: float) -> bool:
    """Whether to count the pending jobs again before deciding on `new` more: no
    count yet, or the estimate would refuse and is REFUSED_RECOUNT_SECS old."""
    if estimate is None:
        return True
    age = now - estimate.at
    return age < 0 or (estimate.pending + new > limit and age >= REFUSED_RECOUNT_SECS)


def stale(estimate: Estimate | None, now: float) -> bool:
    """Whether the estimate is old enough to be counted again (in the background)."""
    return estimate is not None and now - estimate.at >= RECOUNT_SECS


def admits(pending: int, new: int, limit: int) -> bool:
    return pending + new <= limit


def refusal(pending: int, new: int, limit: int) -> TooManyRequests:
    jobs = "job" if new == 1 else "jobs"
    return TooManyRequests(
        f"the cluster has {pending} pending jobs and {SETTING} is {limit}: this request's {new} new {jobs} "
        f"would go beyond it, so nothing was stored; try again once jobs have started (Retry-After)",
        retry_after=RETRY_AFTER_SECS, pending_jobs=pending, max_pending_jobs=limit, setting=SETTING, requested=new)


class PendingGate:
    """One process's admissions against the bound. `count()` counts the pending jobs
    (a database read on the caller's connection); `count_apart()` does on a thread of
    its own (its own connection, closed after). `clock` is monotonic (tests pass theirs).

    Every path that creates jobs asks (POST /jobs, batches, arrays, SQS messages,
    schedule runs), after its idempotency key was looked up (a repeat creates nothing
    and is never refused) and before it writes; a retry or requeue never asks.

    Counting walks the (status, node_id, queue_at, id) index, an index-only count that
    grows with the queue (4-10 ms for 100,000 jobs on SQLite, 20-30 ms on PostgreSQL),
    so the gate keeps its last count plus what it admitted since. Once RECOUNT_SECS
    old, a thread counts again while submits go on deciding on the old one; only a
    submit the estimate would refuse waits for a fresh count (at most one every
    REFUSED_RECOUNT_SECS). Within a process this is exact (jobs that started since
    only err on the safe side); across processes the bound is exceeded by at most what
    the others admit within about RECOUNT_SECS (an array counts whole). Exactness would
    need a row every submit and claim writes, queueing placements behind one another."""

    def __init__(self, limit: int, count: Callable[[], int], count_apart: Callable[[], int] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.limit = limit
        self._count = count
        self._count_apart = count_apart or count
        self._clock = clock
        self._lock = threading.Lock()
        self._estimate: Estimate | None = None
        self._counting = False  # a background count is under way

    def refresh(self, new: int = 1) -> None:
        """Count now when the next admission of `new` jobs would (the caller does this
        before taking a write lock, so the count is not made holding it)."""
        with self._lock:
            needed = needs_count(self._estimate, new, self.limit, self._clock())
        if needed:
            self._recount()

    def admit(self, new: int) -> None:
        """Admit `new` jobs, or raise TooManyRequests (nothing admitted)."""
        if new <= 0:
            return
        with self._lock:
            now = self._clock()
            if not needs_count(self._estimate, new, self.limit, now):
                if stale(self._estimate, now) and not self._counting:
                    self._counting = True
                    threading.Thread(target=self._recount_apart, name="pending-count", daemon=True).start()
                self._decide(new)
                return
        self._recount()
        with self._lock:
            self._decide(new)

    def forget(self) -> None:
        """Count again at the next admission (a test changed the table behind its back)."""
        with self._lock:
            self._estimate = None

    def _recount(self, count: Callable[[], int] | None = None) -> None:
        at = self._clock()
        counted = (count or self._count)()  # outside the lock: the other threads decide on the old count meanwhile
        with self._lock:
            if self._estimate is None or self._estimate.at <= at:
                self._estimate = Estimate(counted, at)

    def _recount_apart(self) -> None:
        try:
            self._recount(self._count_apart)
        except Exception:  # the next admission tries again; the old estimate stands meanwhile
            log.warning("counting the pending jobs failed", exc_info=True)
        finally:
            with self._lock:
                self._counting = False

    def _decide(self, new: int) -> None:
        estimate = self._estimate
        assert estimate is not None
        if not admits(estimate.pending, new, self.limit):
            raise refusal(estimate.pending, new, self.limit)
        self._estimate = Estimate(estimate.counted, estimate.at, estimate.added + new)
