"""Job dependencies (`depends_on`), decided without I/O.

Slurm's afterok, afternotok and afterany as the conditions `done`, `failed` and
`finished`. docs/scheduling.md ("Dependencies") says how a job waits and when it is
cancelled instead.
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
