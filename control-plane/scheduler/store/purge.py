"""The deletion of finished jobs past their retention, with their events and log chunks.

Run by the background pass (loops.py)."""
from peewee import fn

from corral.shared.states import FINAL_STATUSES

from ..models import Job, JobEvent, LogChunk
from .context import StoreContext
from .rows import tuples


class Purge:
    def __init__(self, ctx: StoreContext):
        self.ctx = ctx

    def finished(self, finished_before: float, limit: int, gone_objects: list[str] | None = None) -> int:
        """Delete up to `limit` finished jobs (done, failed, cancelled) that finished
        before `finished_before`, with their events and log chunks; one short
        transaction. The S3 keys of chunks stored there go into `gone_objects`, for the
        caller to delete once this committed (job_logs.py). Where the database would
        hand a deleted newest id out again (SQLite), the newest job row is always kept,
        so that job ids are never reused."""
        db = self.ctx.db
        with db.atomic():
            self.ctx.check_fence()
            old = (Job.finished_at.is_null(False) & (Job.finished_at < finished_before)
                   & Job.status.in_(sorted(FINAL_STATUSES)))
            if db.reuses_ids:  # type: ignore[attr-defined]  # a backend attribute (server/backends)
                newest = Job.select(fn.MAX(Job.id)).scalar()
                if newest is None:
                    return 0
                old &= Job.id < newest
            ids = [job_id for (job_id,) in tuples(Job.select(Job.id).where(old)
                                                  .order_by(Job.finished_at).limit(limit))]
            if not ids:
                return 0
            JobEvent.delete().where(JobEvent.job.in_(ids)).execute()
            chunks = LogChunk.delete().where(LogChunk.job_id.in_(ids))
            if gone_objects is None:
                chunks.execute()
            else:
                gone_objects.extend(key for (key,) in chunks.returning(LogChunk.object_key).tuples().execute()
                                    if key is not None)
            deleted: int = Job.delete().where(Job.id.in_(ids)).execute()
            return deleted
