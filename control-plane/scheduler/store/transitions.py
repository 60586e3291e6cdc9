"""Lifecycle decisions written.

The status writer's compare-and-set, then the jobs that waited on those that ended
decided (dependents.py), and what the moves of multi-node jobs and their members move
in turn (gangs.py). What every part that changes a job's status calls."""
from corral.shared.errors import Conflict
from corral.shared.states import FINAL_STATUSES

from .. import gangs, lifecycle
from ..models import Job
from .dependents import Dependents
from .gangs import Gangs
from .status_writer import StatusWriter


class Transitions:
    def __init__(self, writer: StatusWriter, dependents: Dependents, gangs: Gangs):
        self.writer = writer
        self.dependents = dependents
        self.gangs = gangs

    def apply(self, job: Job, transition: lifecycle.Transition, now: float) -> None:
        """One lifecycle decision (apply_all); raises Conflict when the row changed meanwhile."""
        if self.apply_all([(job, transition)], now):
            raise changed_meanwhile(job)

    def apply_all(self, decided: list[tuple[Job, lifecycle.Transition]], now: float,
                  on_node: str | None = None) -> list[Job]:
        """Write the decisions (StatusWriter.write: returns the jobs whose row had changed
        meanwhile, for which nothing is written), then decide the jobs that waited on
        those that ended."""
        stale = self.writer.write(decided, now, on_node)
        # Only jobs others wait on (a job read without the flag counts as one).
        ended = [job for job, _ in decided if job.status in FINAL_STATUSES and job not in stale
                 and job.__data__.get("has_dependents", True)]
        if ended:
            self.dependents.settle(ended, now)
        moved = [job for job, _ in decided if job not in stale and (gangs.is_member(job) or gangs.spans_nodes(job))]
        if moved:
            # The job follows its members, the members their job: a few rounds at most
            # (a member fails, the job's attempt ends, its other members are cancelled).
            following = self.gangs.settle(moved, now)
            if following:
                self.apply_all(following, now)
        return stale


def changed_meanwhile(job: Job) -> Conflict:
    return Conflict(f"{job.job_id} changed while this request ran; try again")
