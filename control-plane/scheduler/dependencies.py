"""Job dependencies (`depends_on`), decided without I/O.

A job may wait for others to end a certain way (Slurm's afterok, afternotok,
afterany):

    done      the other job ended `done`                       (the default)
    failed    the other job ended `failed`
    finished  the other job ended at all (`cancelled` included)

A job waits until every condition holds. A condition that can no longer hold
(a `done` dependency that failed or was cancelled, a `failed` one that was done
or cancelled) cancels the waiting job, unless it asked `on_dependency_failure:
"run"`, which counts that condition as met; a cancelled job's own dependents
are decided in turn, down the chain. A job that has already ended when another
names it decides the condition at once. An operator's retry of a failed job
does not revive the jobs its failure cancelled.
"""
from __future__ import annotations

from typing import Literal

from corral.shared.states import FINAL_STATUSES

CONDITIONS = ("done", "failed", "finished")

Outcome = Literal["met", "unmeetable"]


def outcome(condition: str, status: str) -> Outcome | None:
    """What the other job's `status` makes of a condition: met, never to be met, or
    nothing yet (it has not ended)."""
    if status not in FINAL_STATUSES:
        return None
    if condition == "finished" or condition == status:
        return "met"
    return "unmeetable"


def cancels(outcome_: Outcome, on_failure: str) -> bool:
    """Whether a decided condition cancels the waiting job."""
    return outcome_ == "unmeetable" and on_failure != "run"


def reason(other_job_id: str, condition: str, status: str) -> str:
    """The reason recorded with a job cancelled because a condition can no longer hold."""
    return f"dependency {other_job_id} ended {status}, so it can never be {condition}; cancelled"
