"""Node leases: an agent's renewal (with what its jobs use), and the requeue of the
running jobs of a node whose lease lapsed (or their failure, per `on_node_lost`)."""
from corral.server.statements import param

from .. import gangs, lifecycle, liveness
from ..models import Job, NodeLease
from .context import StoreContext
from .transitions import Transitions


class Leases:
    def __init__(self, ctx: StoreContext, transitions: Transitions):
        self.ctx = ctx
        self.transitions = transitions

    def renew_lease(self, node_id: str, now: float,
                    usage: tuple[int, int, int | None, float | None] | None = None) -> list[Job]:
        """Record that `node_id`'s agent is alive, and what its jobs use (memory MB, CPU
        percent, GPU memory MB and utilisation, None where not read) when it says;
        returns the jobs the scheduler has running there.

        The agent compares that list with what it runs: an attempt it runs that is
        not listed is stale (moved, cancelled, timed out) and gets killed.
        """
        db, sql = self.ctx.db, self.ctx.sql
        with db.atomic():
            self.touch(node_id, now)
            if usage is not None:
                sql.execute(db, "lease usage", lambda: NodeLease.update(
                    used_memory_mb=param("memory"), used_cpu_percent=param("cpu"),
                    used_gpu_memory_mb=param("gpu_memory"), used_gpu_percent=param("gpu")).where(
                    NodeLease.node_id == param("node_id")), memory=usage[0], cpu=usage[1], gpu_memory=usage[2],
                    gpu=usage[3], node_id=node_id)
        return sql.select(Job, "running on node", lambda: Job.select(Job.id, Job.attempt, Job.stop_reason,
                                                                     Job.stop_at).where(
            (Job.node_id == param("node_id")) & (Job.status == "running")), node_id=node_id)

    def touch(self, node_id: str, now: float) -> None:
        """Renew the node's lease from `now` (its row made when it has none)."""
        if self.ctx.sql.execute(self.ctx.db, "touch lease", lambda: NodeLease.update(
                renewed_at=param("now")).where(NodeLease.node_id == param("node_id")),
                now=now, node_id=node_id).rowcount == 0:
            NodeLease.insert(node_id=node_id, renewed_at=now).on_conflict(
                conflict_target=[NodeLease.node_id], preserve=[NodeLease.renewed_at]).execute()

    def requeue_lost(self, now: float, watching_since: float) -> list[str]:
        """Requeue (or fail, per `on_node_lost`) running jobs of nodes whose lease lapsed.

        A node is lost when its agent has not renewed for HEARTBEAT_TIMEOUT_SECS
        plus NODE_LOST_GRACE_SECS, counted from `watching_since` at the earliest
        (when this process started watching) so that a scheduler restart gives
        every node a full period to renew first. The agent stops its run jobs
        itself after HEARTBEAT_TIMEOUT_SECS without a renewal, so the grace is
        what guarantees two copies never run at once.
        """
        settings = self.ctx.settings
        deadline = liveness.lease_deadline(now, settings.heartbeat_timeout_secs, settings.node_lost_grace_secs)
        if watching_since > deadline:
            return []
        fresh = NodeLease.select(NodeLease.node_id).where(NodeLease.renewed_at >= deadline)
        lost = list(Job.select().where((Job.status == "running") & Job.node_id.not_in(fresh)
                                       & (Job.node_id != gangs.GANG_NODE)
                                       & (Job.running_at < deadline)))
        ended = []
        with self.ctx.db.atomic():
            self.ctx.check_fence()
            for job in lost:
                renewed = NodeLease.get_or_none(NodeLease.node_id == job.node_id)
                silent = f"{now - renewed.renewed_at:.0f}s" if renewed else "ever"
                self.transitions.apply(job, lifecycle.node_lost(
                    job, now, f"node {job.node_id} lost (no lease renewal for {silent})", self.ctx.policy), now)
                ended.append(job.job_id)
        return ended
