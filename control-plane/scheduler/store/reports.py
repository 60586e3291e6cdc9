"""Agents' reports of their jobs (started, finished, failed), one or many at a time.

Each checked against the job's node and current attempt, decided by lifecycle.py and
written by the transitions part. A refused report changes nothing."""
from typing import Any

from corral.server.statements import ValueList
from corral.shared.errors import Conflict, CorralError, NotFound

from .. import lifecycle
from ..models import Job, JobEvent
from ..outcomes import ItemOutcome, JobState
from ..validation import parse_job_id
from .columns import DECIDING, INSERT_CHUNK
from .context import StoreContext
from .jobs import Jobs
from .transitions import Transitions, changed_meanwhile


class Reports:
    def __init__(self, ctx: StoreContext, jobs: Jobs, transitions: Transitions):
        self.ctx = ctx
        self.jobs = jobs
        self.transitions = transitions

    def report(self, job_id: str, report: dict, now: float) -> Job:
        """Apply an agent's report; refuses other nodes, stale attempts and illegal moves.
        Returns the job as the report left it (a job no longer `running` freed its slot:
        the caller places)."""
        with self.ctx.tx():
            job = self.jobs.get(job_id)
            transition = self._decide(job, report, now)
            if transition is not None:
                self.transitions.apply(job, transition, now)
        return job  # as apply left it: the row as committed

    def _decide(self, job: Job, report: dict, now: float) -> lifecycle.Transition | None:
        """What a report does to its job (None: nothing, a repeat); raises Conflict for a
        report of another node, a stale attempt or an illegal move."""
        policy = self.ctx.policy
        if _late_success(job, report):
            return lifecycle.late_success(job, report, now, policy)
        check_attempt(job, report)
        new = report["status"]
        if job.status == new and new == "running":
            return None  # the agent repeated a report whose answer it lost
        if new == "running":
            return lifecycle.started(job, now, report["limits_enforced"], report["limits"],
                                     report.get("private_tmp"), "started on the node")
        if job.status != "running":
            raise Conflict(f"{job.job_id} is {job.status}, not running; the {new!r} report is refused")
        return lifecycle.finished(job, report, now, policy)

    def apply_reports(self, items: list[tuple[str, dict | CorralError]], now: float
                      ) -> list[ItemOutcome[JobState]]:
        """Apply many reports, each on its own: a refused one changes nothing and does
        not stop the others. `items` are (job_id, validated report or the error that
        made it invalid). One transaction: the reported jobs are read in one query (the
        columns a decision reads), decided one by one, and written together. Returns
        one outcome per item: the job's status and attempt after it, or why it was refused."""
        results: list[ItemOutcome[JobState] | None] = [None] * len(items)
        with self.ctx.tx():
            jobs = self._deciding({number for job_id, body in items if not isinstance(body, CorralError)
                                   if (number := parse_job_id(job_id)) is not None})
            decided: list[tuple[int, Job, lifecycle.Transition | None]] = []
            for index, (job_id, body) in enumerate(items):
                try:
                    if isinstance(body, CorralError):
                        raise body
                    number = parse_job_id(job_id)
                    job = jobs.get(number) if number is not None else None
                    if job is None:
                        raise NotFound(f"no job {job_id!r}")
                    if any(seen is job for _, seen, _ in decided):
                        # The same job again: decided on what the reports before it did.
                        self._write(decided, now, results)
                        decided = []
                    decided.append((index, job, self._decide(job, body, now)))
                except CorralError as exc:
                    results[index] = ItemOutcome(index, job_id, error=exc)
            self._write(decided, now, results)
        return [r for r in results if r is not None]

    def _write(self, decided: list, now: float, results: list[ItemOutcome[JobState] | None]) -> None:
        stale = self.transitions.apply_all([(job, t) for _, job, t in decided if t is not None], now)
        for index, job, _ in decided:
            if job in stale:
                results[index] = ItemOutcome(index, job.job_id, error=changed_meanwhile(job))
            else:  # as the job is now: a later report of the batch may change it again
                results[index] = ItemOutcome(index, job.job_id, JobState(job.status, job.attempt))

    def _deciding(self, ids: set[int]) -> dict[int, Job]:
        """The jobs with these row ids, with the columns lifecycle decisions, their
        metrics and notifications read (not the output or the request)."""
        found: dict[int, Job] = {}
        wanted = sorted(ids)
        for start in range(0, len(wanted), INSERT_CHUNK):
            chunk = ValueList(self.ctx.db, "ids", wanted[start:start + INSERT_CHUNK])
            found.update({job.id: job for job in self.ctx.sql.select(
                Job, ("deciding", chunk.size), lambda: Job.select(*DECIDING).where(chunk.matches(Job.id)),
                **chunk.values)})
        return found


def _late_success(job: Job, report: dict) -> bool:
    """A `done` report of an attempt given up for lost (lifecycle.is_late_success);
    the job's history says which attempts started where."""
    if report["status"] != "done" or job.status != "pending":
        return False  # the common refusals answer without reading the history
    started: Any = JobEvent.select(JobEvent.attempt, JobEvent.node_id).where(
        (JobEvent.job == job.id) & (JobEvent.to_status == "running") & (JobEvent.attempt >= report["attempt"]))
    return lifecycle.is_late_success(job, report, [(e.attempt, e.node_id) for e in started])


def check_attempt(job: Job, sent: dict) -> None:
    """What an agent sends about a job (a report, live output) must come from the node
    the job is placed on and be about its current attempt."""
    if job.node_id != sent["node_id"]:
        raise Conflict(f"{job.job_id} is not placed on {sent['node_id']!r}")
    if job.attempt != sent["attempt"]:
        raise Conflict(f"attempt {sent['attempt']} of {job.job_id} is stale; "
                       f"the current attempt is {job.attempt}")
