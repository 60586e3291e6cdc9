"""The jobs that wait on others (job_dependency rows) when those end.

A condition met queues the job once none is left; one that can never hold cancels it,
and its own dependents are decided in turn, down the chain (the pure rules:
dependencies.py)."""
from corral.shared.states import FINAL_STATUSES

from .. import dependencies, lifecycle, placement, waiting
from ..models import Job, JobDependency
from .columns import DECIDING
from .context import StoreContext
from .rows import tuples
from .status_writer import StatusWriter


class Dependents:
    def __init__(self, ctx: StoreContext, writer: StatusWriter):
        self.ctx = ctx
        self.writer = writer

    def settle(self, ended: list[Job], now: float) -> None:
        """Decide the conditions that waited on these jobs, which just ended: a job whose
        last condition is met queues from now; one whose condition can never hold is
        cancelled, and its own dependents are decided in turn, down the chain. Each
        condition is decided once (a conditional update)."""
        while ended:
            statuses = {job.id: (job.job_id, job.status) for job in ended}
            waiting_rows = list(JobDependency.select().where(JobDependency.depends_on.in_(sorted(statuses))
                                                             & (JobDependency.state == "waiting")))
            if not waiting_rows:
                return
            dependents = {job.id: job for job in Job.select(*DECIDING, Job.priority, Job.on_dependency_failure)
                          .where(Job.id.in_(sorted({row.job_id for row in waiting_rows})))}
            cancelled: list[tuple[Job, lifecycle.Transition]] = []
            touched = set()
            for row in waiting_rows:
                other_id, status = statuses[row.depends_on]
                outcome = dependencies.outcome(row.condition, status)
                if outcome is None or JobDependency.update(state=outcome).where(
                        (JobDependency.id == row.id) & (JobDependency.state == "waiting")).execute() != 1:
                    continue
                job = dependents.get(row.job_id)
                if job is None or job.status != "pending" or any(j is job for j, _ in cancelled):
                    continue
                if dependencies.cancels(outcome, job.on_dependency_failure):
                    cancelled.append((job, lifecycle.dependency_failed(
                        job, now, dependencies.reason(other_id, row.condition, status))))
                else:
                    Job.update(dependencies_left=Job.dependencies_left - 1).where(Job.id == job.id).execute()
                    touched.add(job.id)
            self._queue_released(touched, now)
            stale = self.writer.write(cancelled, now)
            ended = [job for job, _ in cancelled if job not in stale]

    def settle_missed(self, now: float) -> int:
        """Decide the conditions still waiting on jobs that have ended (the background
        pass): a job's end decides its dependents' conditions in its own transaction,
        but on PostgreSQL a dependency recorded while that transaction ran is not
        seen by it. Returns how many ended jobs it settled."""
        final = Job.select(Job.id).where(Job.status.in_(sorted(FINAL_STATUSES)))
        ids = [row[0] for row in tuples(JobDependency.select(JobDependency.depends_on).where(
            (JobDependency.state == "waiting") & JobDependency.depends_on.in_(final)).distinct().limit(1000))]
        if not ids:
            return 0
        with self.ctx.tx():
            self.ctx.check_fence()
            self.settle(list(Job.select(*DECIDING).where(Job.id.in_(ids))), now)
        return len(ids)

    def _queue_released(self, job_ids: set[int], now: float) -> None:
        """Jobs one of whose conditions was just met: those with none left queue from
        now (placement.queue_at); the others name the next job they wait for."""
        if not job_ids:
            return
        for job in Job.select(Job.id, Job.dependencies_left, Job.priority).where(Job.id.in_(sorted(job_ids))):
            if job.dependencies_left <= 0:
                Job.update(dependencies_left=0, pending_reason=None, pending_code=None,
                           queue_at=placement.queue_at(now, job.priority, self.ctx.settings.priority_aging_secs)
                           ).where(Job.id == job.id).execute()
                continue
            row = (JobDependency.select().where((JobDependency.job_id == job.id) & (JobDependency.state == "waiting"))
                   .order_by(JobDependency.id).first())
            if row is not None:
                reason = waiting.dependency(f"job-{row.depends_on}", row.condition)
                Job.update(pending_reason=reason.as_dict(), pending_code=reason.code).where(
                    Job.id == job.id).execute()
