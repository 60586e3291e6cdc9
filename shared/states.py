"""The job state machine, in one place.

    pending ──claim──▶ running ──▶ done
       ▲                  │
       └──retry (budget)──┤
                          ▼
                        failed  (final: the dead-letter state)

pending and running jobs may also be cancelled. Everything that changes a
job's status goes through `check_transition`, and the store refuses any status
outside `JobStatus` (a CHECK constraint on the column).
"""
from enum import Enum

from corral.shared.errors import Conflict


class JobStatus(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


# The statuses as plain strings: what the agent and the CLI send, compare and print.
PENDING = JobStatus.PENDING.value
RUNNING = JobStatus.RUNNING.value
DONE = JobStatus.DONE.value
FAILED = JobStatus.FAILED.value
CANCELLED = JobStatus.CANCELLED.value

ALL = tuple(s.value for s in JobStatus)
FINAL = frozenset({JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED})
ACTIVE = (JobStatus.PENDING.value, JobStatus.RUNNING.value)  # hold (or will hold) a node slot
FINAL_STATUSES = frozenset(s.value for s in FINAL)

ALLOWED = frozenset({
    (JobStatus.PENDING, JobStatus.RUNNING),    # an agent started the attempt
    (JobStatus.RUNNING, JobStatus.DONE),
    (JobStatus.RUNNING, JobStatus.FAILED),     # retries exhausted, or timed out
    (JobStatus.RUNNING, JobStatus.PENDING),    # failed with retries left
    (JobStatus.PENDING, JobStatus.CANCELLED),
    (JobStatus.RUNNING, JobStatus.CANCELLED),
    (JobStatus.FAILED, JobStatus.PENDING),     # an operator's retry
    # An attempt the scheduler gave up on (its node seemed lost) that did finish:
    # its result is kept instead of running the job again.
    (JobStatus.PENDING, JobStatus.DONE),
    # A multi-node job whose attempt ended before every member ran (one failed, or
    # lost its node): retried, requeued or failed while still pending.
    (JobStatus.PENDING, JobStatus.PENDING),
    (JobStatus.PENDING, JobStatus.FAILED),
})


class InvalidTransition(Conflict):
    pass


def check_transition(old: str, new: str) -> None:
    if (JobStatus(old), JobStatus(new)) not in ALLOWED:
        raise InvalidTransition(f"a {old} job cannot become {new}")


def after_failure(retry_count: int, max_retries: int) -> JobStatus:
    """Where a failed attempt goes: back to pending while the retry budget lasts."""
    return JobStatus.PENDING if retry_count < max_retries else JobStatus.FAILED
