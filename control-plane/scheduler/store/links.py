"""A new job's conditions on other jobs (depends_on).

The statuses they are decided on, the columns they give the job (how many it waits for),
the job_dependency rows, and the cancellation of a job one of whose conditions can never
hold."""
from typing import Any

from corral.shared.errors import BadRequest, BatchError

from .. import dependencies, lifecycle, waiting
from ..models import Job, JobDependency
from .columns import INSERT_CHUNK
from .rows import tuples
from .transitions import Transitions


class Links:
    def __init__(self, transitions: Transitions):
        self.transitions = transitions

    def targets(self, depends_on: list[tuple[int, str]]) -> dict[int, str]:
        """The status of each job a new job depends on; a BadRequest naming one that
        does not exist."""
        known = statuses_of([other for other, _ in depends_on]) if depends_on else {}
        missing = [other for other, _ in depends_on if other not in known]
        if missing:
            raise BadRequest(f"'depends_on' names job-{missing[0]}, which does not exist")
        return known

    @staticmethod
    def columns(depends_on: list, known: dict, on_failure: str) -> tuple[dict, str | None]:
        """A new job's columns for its conditions on jobs of `known` statuses (id ->
        status; an earlier item of its batch is pending): how many wait, and the reason
        it is cancelled at once when one can never hold (None: it is not)."""
        left = [(other, condition) for other, condition in depends_on
                if dependencies.outcome(condition, known[other]) is None]
        for other, condition in depends_on:
            outcome = dependencies.outcome(condition, known[other])
            if outcome is not None and dependencies.cancels(outcome, on_failure):
                return {}, dependencies.reason(f"job-{other}", condition, known[other])
        return ({"dependencies_left": len(left)} if left else {}), None

    def batch(self, items: list[dict], new: list[int], existing: dict[int, Job]) -> dict:
        """For each new item of a batch: its conditions (an earlier item as ("index", i)),
        its columns for them, the statuses they were decided on, and the reason it is
        cancelled at once (None: it is not). A job named that does not exist: BatchError."""
        named = [other for i in new for kind, other, _ in items[i].get("depends_on") or () if kind == "job"]
        known_jobs = statuses_of(named) if named else {}
        errors, waits = [], {}
        for i in new:
            depends_on: list[tuple[Any, str]] = []
            known: dict[Any, str] = {}
            for kind, other, condition in items[i].get("depends_on") or ():
                if kind == "index":
                    # An earlier item: new, so pending (or created by an earlier copy of this batch).
                    earlier = existing.get(other)
                    key = ("index", other)
                    known[key] = earlier.status if earlier is not None and earlier.status else "pending"
                    depends_on.append((key, condition))
                elif other not in known_jobs:
                    errors.append({"index": i, "error": f"'depends_on' names job-{other}, which does not exist"})
                    break
                else:
                    known[other] = known_jobs[other]
                    depends_on.append((other, condition))
            extra, cancel = self.columns(depends_on, known, items[i].get("on_dependency_failure") or "cancel")
            waits[i] = (depends_on, extra, known, cancel)
        if errors:
            raise BatchError(errors)
        return waits

    def link(self, job: Job, depends_on: list[tuple[int, str]], known: dict[int, str], now: float,
             cancel_reason: str | None) -> None:
        """Record a new job's conditions (each decided already, or waiting), name the
        first it waits for, and cancel it when one can never hold."""
        rows = [{"job_id": job.id, "depends_on": other, "condition": condition,
                 "state": dependencies.outcome(condition, known[other]) or "waiting"}
                for other, condition in depends_on]
        if not rows:
            return
        JobDependency.insert_many(rows).execute()
        waited_on = sorted({row["depends_on"] for row in rows if row["state"] == "waiting"})
        if waited_on:
            Job.update(has_dependents=True).where(Job.id.in_(waited_on)).execute()
        # What the job's answer shows (an earlier item of a batch has its id only now).
        changes: dict = {"depends_on": [[other, condition] for other, condition in depends_on]}
        first = next((row for row in rows if row["state"] == "waiting"), None)
        if first is not None and cancel_reason is None:
            reason = waiting.dependency(f"job-{first['depends_on']}", str(first["condition"]))
            changes.update(pending_reason=reason.as_dict(), pending_code=reason.code)
        Job.update(**changes).where(Job.id == job.id).execute()
        for name, value in changes.items():
            setattr(job, name, value)
        if cancel_reason is not None:
            self.transitions.apply(job, lifecycle.dependency_failed(job, now, cancel_reason), now)


def statuses_of(ids: list[int]) -> dict[int, str]:
    """The status of each of these jobs that exists."""
    found: dict[int, str] = {}
    wanted = sorted(set(ids))
    for start in range(0, len(wanted), INSERT_CHUNK):
        found.update(tuples(Job.select(Job.id, Job.status).where(Job.id.in_(wanted[start:start + INSERT_CHUNK]))))
    return found
