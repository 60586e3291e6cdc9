"""Reads of jobs and arrays for the API and the agents.

One job, its events, a page of a list, the jobs placed on a node, an array with its
counts. No writes."""
from collections.abc import Iterator
from typing import Any

from peewee import fn

from corral.server.statements import ValueList, param
from corral.shared.errors import NotFound

from ..models import Job, JobArray, JobEvent, Node
from ..validation import parse_job_id
from .columns import INSERT_CHUNK
from .context import StoreContext
from .rows import tuples


class Jobs:
    def __init__(self, ctx: StoreContext):
        self.ctx = ctx

    def get(self, job_id: str) -> Job:
        number = parse_job_id(job_id)
        found = self.ctx.sql.select(Job, "job by id", lambda: Job.select().where(Job.id == param("id")),
                                    id=number) if number else None
        job = found[0] if found else None
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        return job

    def events(self, job_id: str) -> list[JobEvent]:
        job = self.get(job_id)
        return list(JobEvent.select().where(JobEvent.job == job.id).order_by(JobEvent.id))

    def list_jobs(self, *, node_id: str | None = None, status: str | None = None, job_type: str | None = None,
                  after: int | None = None, limit: int = 100, newest_first: bool = False) -> list[Job]:
        return list(self.iter_jobs(node_id=node_id, status=status, job_type=job_type, after=after,
                                   limit=limit, newest_first=newest_first))

    def iter_jobs(self, *, node_id: str | None = None, status: str | None = None, job_type: str | None = None,
                  after: int | None = None, limit: int = 100, newest_first: bool = False,
                  pending_reason: str | None = None, now: float | None = None, name: str | None = None,
                  schedule: str | None = None, array_id: int | None = None, created_after: float | None = None,
                  created_before: float | None = None, team: str | None = None,
                  submitted_by: str | None = None, teams: frozenset[str] | None = None) -> Iterator[Job]:
        """The jobs of a list, read one row at a time (a page of large jobs is never all in
        memory at once; pages.cut decides where it ends). `pending_reason`: only pending
        jobs that wait for that reason at `now` (waiting.current). `created_after` and
        `created_before` bound created_at (after: at or after; before: strictly before).
        `teams`: only jobs of these teams (a member's view; None: every team)."""
        query = Job.select()
        if teams is not None:
            query = query.where(Job.team.in_(sorted(teams)))
        for column, value in ((Job.name, name), (Job.schedule, schedule), (Job.array_id, array_id),
                              (Job.team, team), (Job.submitted_by, submitted_by)):
            if value is not None:
                query = query.where(column == value)
        if created_after is not None:
            query = query.where(Job.created_at >= created_after)
        if created_before is not None:
            query = query.where(Job.created_at < created_before)
        if pending_reason is not None:
            query = query.where(_waiting_for(pending_reason, now if now is not None else 0.0))
        if node_id is not None:
            query = query.where(Job.node_id == node_id)
        if status is not None:
            query = query.where(Job.status == status)
        if job_type is not None:
            query = query.where(Job.job_type == job_type)
        if after is not None:
            query = query.where(Job.id < after if newest_first else Job.id > after)
        jobs: Iterator[Job] = query.order_by(Job.id.desc() if newest_first else Job.id).limit(limit).iterator()
        return jobs

    def pending_for_agent(self, node_id: str, limit: int) -> list[Job]:
        """The pending jobs placed on `node_id`, at most its free slots (what agents poll)."""
        node = Node.get_or_none(Node.node_id == node_id)
        capacity = self.ctx.capacity(node.slots if node else None)
        running = Job.select().where((Job.node_id == node_id) & (Job.status == "running")).count()
        free = min(limit, capacity - running)
        if free <= 0:
            return []
        return self.list_jobs(node_id=node_id, status="pending", limit=free)

    @staticmethod
    def reload(jobs: list[Job]) -> list[Job]:
        """The jobs as the database has them now (after placement changed them), in order."""
        wanted = [job.id for job in jobs]
        by_id = {}
        for start in range(0, len(wanted), INSERT_CHUNK):
            chunk = wanted[start:start + INSERT_CHUNK]
            by_id.update({job.id: job for job in Job.select().where(Job.id.in_(chunk))})
        return [by_id[job_id] for job_id in wanted]

    def with_placements(self, jobs: list[Job]) -> list[Job]:
        """New jobs, those placed since they were read (placement is the only change
        they undergo as a rule) read again: the rest as they are. One statement, which
        returns only the placed rows (a batch of 500 usually has a few)."""
        chosen = ValueList(self.ctx.db, "ids", [job.id for job in jobs])
        placed = {job.id: job for job in self.ctx.sql.select(
            Job, ("placed of", chosen.size), lambda: Job.select().where(chosen.matches(Job.id)
                                                                         & Job.node_id.is_null(False)),
            **chosen.values)}
        return [placed.get(job.id, job) for job in jobs]

    def array(self, array_id: str) -> tuple[JobArray, int, int, dict[str, int]]:
        """An array, its first and last job row ids, and its jobs by status."""
        number = _array_number(array_id)
        array = JobArray.get_or_none(JobArray.id == number) if number else None
        if array is None:
            raise NotFound(f"no array {array_id!r}")
        counts = dict(tuples(Job.select(Job.status, fn.COUNT(Job.id)).where(Job.array_id == array.id)
                             .group_by(Job.status)))
        return array, *array_ends(array.id), counts

    @staticmethod
    def array_owner(array_id: str) -> tuple[str, str] | None:
        """The team and submitter of an array's jobs (None: no such array)."""
        number = _array_number(array_id)
        job = Job.select(Job.team, Job.submitted_by).where(Job.array_id == number).first() if number else None
        return None if job is None else (job.team, job.submitted_by)


def array_ends(array_id: int) -> tuple[int, int]:
    """An array's first and last job row ids."""
    ends: tuple[int, int] = tuples(Job.select(fn.MIN(Job.id), fn.MAX(Job.id)).where(Job.array_id == array_id)).get()
    return ends


def _waiting_for(code: str, now: float) -> Any:
    """The pending jobs whose reason at `now` has this code, as waiting.current decides it."""
    pending = Job.status == "pending"
    if code == "placed":
        return pending & Job.node_id.is_null(False)
    unplaced = pending & Job.node_id.is_null()
    if code == "dependency":
        return unplaced & (Job.dependencies_left > 0)
    free = unplaced & (Job.dependencies_left == 0)
    later = Job.next_attempt_at > now
    first_attempt = (Job.attempt == 0) & (Job.retry_count == 0)
    if code == "scheduled":
        return free & later & first_attempt
    if code == "backoff":
        return free & later & ~first_attempt
    due = free & (Job.next_attempt_at.is_null() | (Job.next_attempt_at <= now))
    if code == "no_capacity":  # also the jobs placement has not looked at: the queue ahead took every slot
        return due & ((Job.pending_code == code) | Job.pending_code.is_null())
    return due & (Job.pending_code == code)


def _array_number(array_id: str) -> int | None:
    prefix, _, number = array_id.partition("-")
    return int(number) if prefix == "array" and number.isdigit() and 0 < len(number) <= 18 else None
