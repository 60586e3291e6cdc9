"""Status changes asked for by an operator or decided by the clock.

Cancel a job or a whole array, retry a failed job, fail the `run` jobs past their
timeout."""
from peewee import fn

from corral.shared.errors import Conflict
from corral.shared.states import ACTIVE

from .. import gangs, lifecycle
from ..models import Job
from .columns import DECIDING
from .context import StoreContext
from .jobs import Jobs
from .transitions import Transitions


class Actions:
    def __init__(self, ctx: StoreContext, jobs: Jobs, transitions: Transitions):
        self.ctx = ctx
        self.jobs = jobs
        self.transitions = transitions

    def cancel(self, job_id: str, now: float) -> Job:
        """Cancel a pending or running job; the agent ends a running one at its next poll."""
        with self.ctx.tx():
            job = self.jobs.get(job_id)
            _not_a_member(job, "cancelled")
            transition = lifecycle.cancelled(job, now)
            if transition is None:
                return job  # cancelled already
            self.transitions.apply(job, transition, now)
        return job

    def cancel_array(self, array_id: str, now: float) -> list[str]:
        """Cancel every job of the array that has not finished, in one transaction (their
        dependents are decided as for any cancel); returns the nodes whose slots freed."""
        array = self.jobs.array(array_id)[0]
        with self.ctx.tx():
            jobs = list(Job.select(*DECIDING).where((Job.array_id == array.id) & Job.status.in_(ACTIVE)))
            decided = [(job, transition) for job in jobs if (transition := lifecycle.cancelled(job, now)) is not None]
            held = {job.node_id for job, _ in decided if job.node_id is not None}
            self.transitions.apply_all(decided, now)
        return sorted(held)

    def retry(self, job_id: str, now: float) -> Job:
        """Put a failed job back to pending with a fresh retry budget (an operator's decision)."""
        with self.ctx.tx():
            job = self.jobs.get(job_id)
            _not_a_member(job, "retried")
            self.transitions.apply(job, lifecycle.retried(job, now), now)
        return job

    def fail_timed_out(self, now: float) -> list[str]:
        """Fail `run` jobs running longer than their timeout_secs (else JOB_TIMEOUT_SECS)
        and kill grace (else JOB_KILL_GRACE_SECS), and lifecycle.WATCHER_SLACK_SECS: their
        agents stop them at the timeout and report; these are the ones whose agents did
        not (the agent then kills them when it finds them ended here)."""
        settings = self.ctx.settings
        limit = (fn.COALESCE(Job.timeout_secs, settings.job_timeout_secs)
                 + fn.COALESCE(Job.kill_grace_secs, settings.job_kill_grace_secs) + lifecycle.WATCHER_SLACK_SECS)
        ended = []
        with self.ctx.db.atomic():
            self.ctx.check_fence()
            overdue = Job.select().where((Job.status == "running") & (Job.job_type == "run")
                                         & (Job.running_at < now - limit))
            for job in overdue:
                self.transitions.apply(job, lifecycle.timed_out(job, now), now)
                ended.append(job.job_id)
        return ended

    def requeue_unstopped(self, now: float) -> list[str]:
        """Requeue the jobs a stop was asked of (a drain's deadline, a preemption) whose
        agents have not reported them stopped a lease period (HEARTBEAT_TIMEOUT_SECS:
        the agent learns of the stop at its next renewal) after the stop and its kill
        grace: an agent of an earlier release, or one that cannot report. The agent
        kills the attempt once it no longer finds it running there."""
        settings = self.ctx.settings
        limit = fn.COALESCE(Job.kill_grace_secs, settings.job_kill_grace_secs) + settings.heartbeat_timeout_secs
        ended = []
        with self.ctx.db.atomic():
            self.ctx.check_fence()
            overdue = Job.select(*DECIDING, Job.stop_reason).where(
                (Job.status == "running") & Job.stop_reason.is_null(False) & (Job.stop_at < now - limit))
            for job in overdue:
                self.transitions.apply(job, lifecycle.stopped(job, now, str(job.stop_reason), forced=True), now)
                ended.append(job.job_id)
        return ended


def _not_a_member(job: Job, what: str) -> None:
    """A member of a multi-node job moves with its job, never on its own."""
    if gangs.is_member(job):
        raise Conflict(f"{job.job_id} is a member of job-{job.gang_id}, which is {what} as a whole: "
                       f"ask that of job-{job.gang_id}")
