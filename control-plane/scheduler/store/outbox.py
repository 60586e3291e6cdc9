"""The SNS outbox's rows.

The notifications of final statuses, written with the status change (transitions.py),
read and marked by the publisher (sns_outbox.py)."""
from peewee import fn

from .. import metrics
from ..models import OutboxEvent
from .context import StoreContext
from .rows import tuples
from .stats import Stats


class Outbox:
    def __init__(self, ctx: StoreContext, stats: Stats):
        self.ctx = ctx
        self.stats = stats

    @staticmethod
    def pending(limit: int) -> list[OutboxEvent]:
        """The oldest notifications not yet published."""
        return list(OutboxEvent.select().where(OutboxEvent.published_at.is_null())
                    .order_by(OutboxEvent.id).limit(limit))

    def published(self, ids: list[int], now: float) -> int:
        """Mark notifications published (after SNS accepted them)."""
        if not ids:
            return 0
        with self.ctx.db.atomic():
            self.ctx.check_fence()
            marked: int = OutboxEvent.update(
                published_at=now, publish_attempts=OutboxEvent.publish_attempts + 1, last_error=None).where(
                OutboxEvent.id.in_(ids) & OutboxEvent.published_at.is_null()).execute()
            self.stats.bump(sns_published=marked)
            metrics.sns_published(self.ctx.db, marked)
        return marked

    def failed(self, errors: dict[int, str]) -> None:
        """Record a failed publish of each notification (it stays pending)."""
        if not errors:
            return
        with self.ctx.db.atomic():
            self.ctx.check_fence()
            for row_id, error in errors.items():
                OutboxEvent.update(publish_attempts=OutboxEvent.publish_attempts + 1, last_error=error[:1000]).where(
                    (OutboxEvent.id == row_id) & OutboxEvent.published_at.is_null()).execute()
            self.stats.bump(sns_publish_failures=len(errors))
            metrics.sns_failed(self.ctx.db, len(errors))

    def purge(self, published_before: float) -> int:
        """Delete published notifications older than the retention."""
        with self.ctx.db.atomic():
            self.ctx.check_fence()
            deleted: int = OutboxEvent.delete().where(OutboxEvent.published_at.is_null(False)
                                                      & (OutboxEvent.published_at < published_before)).execute()
            return deleted

    @staticmethod
    def backlog(now: float) -> tuple[int, float | None]:
        """How many notifications wait, and the age in seconds of the oldest (None when none)."""
        waiting = tuples(OutboxEvent.select(fn.COUNT(OutboxEvent.id), fn.MIN(OutboxEvent.created_at)).where(
            OutboxEvent.published_at.is_null())).get()
        count, oldest = waiting
        return count, (max(0.0, now - oldest) if oldest is not None else None)
