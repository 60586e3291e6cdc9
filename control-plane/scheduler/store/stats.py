"""Counters and counts for /stats and the pending-jobs bound.

Named counters bumped in the caller's transaction, jobs by status, the pending count
(admission.py)."""
from peewee import fn

from ..models import Counter, Job
from .context import StoreContext
from .rows import tuples


class Stats:
    def __init__(self, ctx: StoreContext):
        self.ctx = ctx

    def bump(self, **increments: int) -> None:
        """Add to named counters (one transaction; nested in the caller's when there is one)."""
        increments = {name: n for name, n in increments.items() if n}
        if not increments:
            return
        with self.ctx.db.atomic():
            for name, n in increments.items():
                Counter.insert(name=name, value=0).on_conflict_ignore().execute()
                Counter.update(value=Counter.value + n).where(Counter.name == name).execute()

    @staticmethod
    def counters() -> dict[str, int]:
        return dict(tuples(Counter.select(Counter.name, Counter.value)))

    def count_pending(self) -> int:
        """How many jobs are pending (placed or not): an index-only count (admission.py)."""
        count: int = self.ctx.sql.rows(self.ctx.db, "pending count", lambda: Job.select(fn.COUNT(Job.id)).where(
            Job.status == "pending"))[0][0]
        return count

    def count_pending_apart(self) -> int:
        """count_pending on a connection of its own, closed after (admission's count in
        a thread of its own)."""
        with self.ctx.db.connection_context():
            return self.count_pending()

    @staticmethod
    def job_counts() -> dict[str, int]:
        """How many jobs there are in each status."""
        return dict(tuples(Job.select(Job.status, fn.COUNT(Job.id)).group_by(Job.status)))
