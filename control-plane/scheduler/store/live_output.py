"""Live output (POST /jobs/output): the output tails agents send while attempts run.

Not a status change (no event); written only for the job's node and current attempt
while it runs, so a late update never overwrites a final report's output."""
from corral.shared.errors import Conflict, CorralError, NotFound

from .. import lifecycle
from ..models import Job
from ..outcomes import ItemOutcome
from ..validation import parse_job_id
from .context import StoreContext
from .reports import check_attempt


class LiveOutput:
    def __init__(self, ctx: StoreContext):
        self.ctx = ctx

    def store(self, items: list[tuple[str, dict | CorralError]]) -> list[ItemOutcome[None]]:
        """Each item on its own, in one transaction. Returns one outcome per item: stored,
        or why it was refused."""
        tail = self.ctx.settings.output_tail_bytes
        wanted = sorted({parse_job_id(job_id) for job_id, body in items  # type: ignore[type-var]
                         if not isinstance(body, CorralError)})
        results: list[ItemOutcome[None]] = []
        with self.ctx.db.atomic():
            jobs = {job.id: job for job in Job.select(Job.id, Job.node_id, Job.attempt, Job.status)
                    .where(Job.id.in_(wanted))} if wanted else {}
            for index, (job_id, body) in enumerate(items):
                try:
                    if isinstance(body, CorralError):
                        raise body
                    job = jobs.get(parse_job_id(job_id))  # type: ignore[arg-type]
                    if job is None:
                        raise NotFound(f"no job {job_id!r}")
                    check_attempt(job, body)
                    if job.status != "running":
                        raise Conflict(f"{job.job_id} is {job.status}, not running; its live output is refused")
                    changes = {name: lifecycle.tail(body[name], tail) for name in ("stdout", "stderr")
                               if body[name] is not None}
                    if changes and Job.update(**changes).where(
                            (Job.id == job.id) & (Job.status == "running") & (Job.attempt == job.attempt)
                            & (Job.node_id == job.node_id)).execute() != 1:
                        raise Conflict(f"{job.job_id} changed while this request ran; its live output is refused")
                except CorralError as exc:
                    results.append(ItemOutcome(index, job_id, error=exc))
                    continue
                results.append(ItemOutcome(index, job_id))
        return results
