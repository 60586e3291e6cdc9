"""New job rows.

A validated request's columns (its retry budget, when it may start, where it queues),
their insert with each job's `submitted` event, and the lookup of an idempotency key a
repeated request was stored under."""
from corral.server import audit_trail
from corral.server.statements import Child
from corral.shared.errors import Conflict

from .. import placement
from ..models import Job, JobEvent
from .context import StoreContext


class NewJobs:
    def __init__(self, ctx: StoreContext):
        self.ctx = ctx

    def columns(self, fields: dict, now: float) -> dict:
        """A validated request's columns as a new job's: its retry budget, and when it
        may start and where it queues (a delay counted from `now`; placement.queue_at)."""
        settings = self.ctx.settings
        columns = dict(fields, created_at=now)
        columns.pop("depends_on", None)  # not a column: the job_dependency rows (links.py)
        columns.pop("array", None)       # not a column: the job_array row (submits.submit_array)
        delay = columns.pop("delay_secs", None)
        for owner in ("team", "submitted_by"):  # not given (SQS, schedules): the columns' defaults
            if columns.get(owner) is None:
                columns.pop(owner, None)
        if columns.get("max_retries") is None:
            columns["max_retries"] = settings.max_job_retries
        if delay is not None:
            columns["run_at"] = now + delay
        eligible = now
        if columns.get("run_at") is not None:
            columns["next_attempt_at"] = columns["run_at"]
            eligible = max(now, columns["run_at"])
        priority = columns.get("priority")
        columns["queue_at"] = placement.queue_at(
            eligible, placement.DEFAULT_PRIORITY if priority is None else priority, settings.priority_aging_secs)
        return columns

    def insert(self, rows: list[dict], now: float, skip_duplicate_key: bool = False) -> list[Job]:
        """Insert jobs (dicts of Job fields; defaults fill the rest) in the order given,
        each with its "submitted" event at `now` (together: Statements.insert_rows);
        returns them as Job instances with their new ids, without reading them back.
        `skip_duplicate_key` (one row): a row whose idempotency key exists is not
        inserted, and [] is returned."""
        if skip_duplicate_key:
            assert len(rows) == 1, "only a single row can tell which one was skipped"
        # Built from the defaults and the row directly, and only the values that are
        # set converted and sent (insert_rows makes the others NULL): Job(**row) set
        # every field through its descriptor, which with the conversions of every
        # column was most of a 500-job batch's Python time.
        fields = Job._meta.fields
        jobs, values = [], []
        for row in rows:
            job = Job(__no_default__=1)
            job.__data__ = data = Job._meta.get_default_dict()
            data.update(row)
            jobs.append(job)
            values.append({name: fields[name].db_value(value) for name, value in data.items() if value is not None})
        submitted = Child(JobEvent, "job", {"at": now, "from_status": None, "to_status": "pending",
                                            "attempt": Job.attempt.default, "node_id": None, "reason": "submitted"})
        inserted = self.ctx.sql.insert_rows(self.ctx.db, ("jobs", skip_duplicate_key), Job, values,
                                            returning=Job.id, skip_duplicates=skip_duplicate_key, child=submitted)
        if skip_duplicate_key and not inserted:
            return []
        # Ids are assigned in the order of the rows; sorting undoes any order RETURNING used.
        ids = sorted(row[0] for row in inserted)
        for job, job_id in zip(jobs, ids):
            job.id = job_id
        if jobs:  # what a request's audit entry says it made (no-op outside a request)
            audit_trail.note(target=jobs[0].job_id if len(jobs) == 1 else f"{jobs[0].job_id}..{jobs[-1].job_id}")
        return jobs

    @staticmethod
    def by_key(key: str | None, digest: str | None) -> Job | None:
        """The job stored under an idempotency key (None: none); a Conflict when the key
        was used for another request."""
        if key is None:
            return None
        existing = Job.get_or_none(Job.idempotency_key == key)
        if existing is not None and existing.request_hash != digest:
            raise Conflict(key_reused(key, existing))
        return existing


def key_reused(key: str, job: Job) -> str:
    return f"the Idempotency-Key {key!r} was used for {job.job_id} with a different request"
