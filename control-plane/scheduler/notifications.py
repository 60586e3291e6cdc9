"""The SNS message of a job that reached a final state.

Pure: the store writes it to the outbox in the same transaction as the status change;
sns_outbox.py publishes it."""
from corral.shared.timeutil import iso


def event_id(job_id: str, attempt: int, status: str) -> str:
    """Stable and unique per final state: an attempt ends in at most one of each status."""
    return f"{job_id}:{attempt}:{status}"


def notification(job, reason: str | None = None) -> dict:
    """The message published for a job that just reached a final status (`job` as committed)."""
    return {
        "event_id": event_id(job.job_id, job.attempt, job.status),
        "job_id": job.job_id,
        "name": job.name,
        "status": job.status,
        "exit_code": job.exit_code,
        "node_id": job.node_id,
        "retry_count": job.retry_count,
        "attempt": job.attempt,
        "finished_at": iso(job.finished_at),
        "reason": reason,
        # The schedule that made the job and the slot it ran for (null: not a schedule's).
        "schedule": job.schedule,
        "slot": iso(job.slot),
    }
