"""The charts' sampler: a sample every STATS_INTERVAL_SECS, and their retention.

A leased loop: one process across workers and replicas takes each sample (samples.py)
and deletes those older than STATS_RETENTION_SECS, in one short transaction whose write
is fenced by the lease.
"""
import itertools
import logging
import time
import typing
from collections.abc import Callable

from peewee import fn

from corral.server.leased import PacedLoop

from . import samples, views
from .models import Job, StatsSample
from .store import Store

log = logging.getLogger(__name__)

LEASE_NAME = "scheduler-stats"
# A pass this little before the next sample is due (a timer that woke early) takes it.
EARLY_FRACTION = 0.05


class Sampler(PacedLoop[Store]):
    """One pass takes a sample when one is due; it answers how long to sleep.

    When the next sample is due is read from the newest sample in the database, not kept
    in this process: whoever takes the lease over goes on one interval after the last
    sample, so there is one sample per interval however often the lease changes hands.
    The reads are cheap at any size of the job table: the jobs finished in the window
    walk the `finished_at` index, pending and running the status index, the first
    attempts started in the window are among those two sets, and the nodes are read as
    GET /nodes reads them."""

    doing = "taking samples of the cluster"

    def __init__(self, store: Store, holder: str | None = None):
        self.interval = store.settings.stats_interval_secs
        self.retention = store.settings.stats_retention_secs
        self.idle = self.interval  # another process samples; look again in an interval
        # Renewed every interval: it outlives a slow pass or two before another process takes over.
        super().__init__(store, LEASE_NAME, max(5.0, 3 * self.interval), holder,
                         max_backoff=max(30.0, self.interval))

    def one_pass(self, now: float) -> float:
        return self.take(now)

    def take(self, now: float) -> float:
        """Take a sample at `now` unless the newest one is younger than an interval (then
        take nothing); the seconds until the next is due."""
        with self.store.db.atomic():
            self.store.check_fence()
            previous = StatsSample.select(fn.MAX(StatsSample.at)).scalar()
            if previous is not None and now < previous + self.interval * (1 - EARLY_FRACTION):
                return max(0.0, previous + self.interval - now)
            start, end = samples.window(previous, now, self.interval)
            data = samples.sample(finished(start, end), pending_and_running(), dispatch_waits(start, end),
                                  [views.node(*row) for row in self.store.nodes.nodes_and_slots()])
            # To the millisecond, as the answer's ISO times are: `since=` that time excludes it.
            at = round(now, 3)
            StatsSample.insert(at=at, since=previous if previous is not None else at - self.interval,
                               data=data).execute()
            StatsSample.delete().where(StatsSample.at < now - self.retention).execute()
        return self.interval


def finished(start: float, end: float) -> dict[str, int]:
    """Jobs whose final status came in (start, end], by status (the finished_at index; a
    job retried since has no finished_at)."""
    return _counts(Job.select(Job.status, fn.COUNT(Job.id))
                   .where((Job.finished_at > start) & (Job.finished_at <= end)).group_by(Job.status))


def pending_and_running() -> dict[str, int]:
    return _counts(Job.select(Job.status, fn.COUNT(Job.id)).where(Job.status.in_(("pending", "running")))
                   .group_by(Job.status))


def dispatch_waits(start: float, end: float) -> list[float]:
    """Seconds from submission to the start of the first attempt (metrics.started) of the
    jobs that started in (start, end]: they run now, or have finished since `start`."""
    first = ((Job.running_at > start) & (Job.running_at <= end) & (Job.retry_count == 0)
             & (Job.node_losses == 0))
    running = Job.select(Job.created_at, Job.running_at).where((Job.status == "running") & first)
    ended = Job.select(Job.created_at, Job.running_at).where((Job.finished_at > start) & (Job.status != "running")
                                                             & first)
    rows = typing.cast(list[tuple[float, float]], list(itertools.chain(running.tuples(), ended.tuples())))
    return [ran - created for created, ran in rows]


def _counts(query) -> dict[str, int]:
    """(status, count) rows as a dict."""
    return dict(typing.cast(list[tuple[str, int]], list(query.tuples())))


def history(since: float | None) -> list[StatsSample]:
    """The samples kept, oldest first; only those taken after `since` when it is given."""
    query = StatsSample.select().order_by(StatsSample.at)
    return list(query if since is None else query.where(StatsSample.at > since))


def start(store: Store, clock: Callable[[], float] = time.time):
    """Run the sampler in this process (every gunicorn worker; the lease picks one)."""
    sampler = Sampler(store)
    return sampler.start("stats-sampler", sampler.interval, clock)
