"""Preemption in the store (preemption.py decides): read the nodes, the running jobs,
the quotas and each team's first waiting jobs under the placement locks; ask the
victims' stops (their agents see them in the next lease answer, stop each job with
its kill signal and grace, and report it requeued: lifecycle.stopped), and record on
each victim the job it made room for."""
from __future__ import annotations

from peewee import fn

from corral.server.statements import ValueList
from corral.shared import wire

from .. import gangs, placement, preemption, quotas
from ..models import Job
from .columns import QUEUED_TEAM
from .context import StoreContext
from .fair_share import FairShare
from .placement_reads import PlacementReads
from .placing import Placing
from .rows import FALLBACK_LIMITS, ask, json_value, tuples
from .status_writer import StatusWriter

# Each team's first waiting jobs looked at, and the most jobs stopped in one pass.
WAITING_PER_TEAM = 20
MAX_VICTIMS = 50
# The waiting jobs preemption may serve: those waiting for room (not for a throttle, a
# dependency or their own team's cap, which no preemption changes).
SERVED_REASONS = (None, "no_capacity")


class Preemptions:
    def __init__(self, ctx: StoreContext, reads: PlacementReads, placing: Placing, fair: FairShare,
                 writer: StatusWriter):
        self.ctx = ctx
        self.reads = reads
        self.placing = placing
        self.fair = fair
        self.writer = writer

    def run(self, now: float) -> list[tuple[str, str]]:
        """Ask the stops preemption.plan finds; (victim, the job it makes room for) of each."""
        settings = self.ctx.settings
        gap = settings.priority_preemption_gap
        reclaim = settings.preemption and bool(self.ctx.teams.quotas())
        if not reclaim and gap <= 0:
            return []
        with self.ctx.tx():
            self.ctx.backend.lock_placement(self.ctx.db)
            nodes = self.reads.nodes()
            open_ids = sorted(n.node_id for n in nodes if n.takes_work)
            if not open_ids:
                return []
            ledger = self.placing.ledger(nodes, lock=True) if reclaim else None
            teams = self._teams(ledger, gap)
            if not teams:
                return []
            rows = [row for row in self.fair.waiting(ValueList(self.ctx.db, "open", open_ids), now, teams,
                                                     WAITING_PER_TEAM)
                    if (json_value(row[-2]) or {}).get("code") in SERVED_REASONS]
            if not rows:
                return []
            if ledger is not None:
                ledger.want({row[QUEUED_TEAM] for row in rows})
            # A job of many nodes does not preempt (yet): it waits, holding what it finds.
            asks = sorted((a for row in rows if (a := ask(row)).members == 1), key=lambda a: -a.priority)
            found = preemption.plan(asks, nodes, self._running(), ledger, FALLBACK_LIMITS, gap, MAX_VICTIMS)
            return self._stop(found, now)

    def _teams(self, ledger: quotas.Ledger | None, gap: int) -> list[str]:
        """The teams whose waiting jobs may preempt: every team with priority preemption;
        else those below their guarantee in some resource their quota guarantees."""
        if gap > 0:
            return sorted(self.ctx.teams.shares())
        assert ledger is not None
        return sorted(team for team, quota in ledger.quotas.items()
                      if any(used < quota.guarantee(resource) for resource, used in ledger.used(team).items()))

    @staticmethod
    def _running() -> list[preemption.Running]:
        """The running jobs as preemption weighs them. A member of a multi-node job is never
        a victim (stopping one would stop its whole job: not weighed yet), and the job
        itself holds no node of its own."""
        return [preemption.Running(job_id, node_id, team, placement.DEFAULT_PRIORITY if priority is None else priority,
                                   running_at or 0.0, memory or 0, cpu or 0,
                                   (preemptible is None or bool(preemptible)) and gang_id is None,
                                   stop_reason is not None, tuple(json_value(gpus) or ()))
                for job_id, node_id, team, priority, running_at, memory, cpu, preemptible, stop_reason, gpus, gang_id
                in tuples(Job.select(Job.id, Job.node_id, Job.team, Job.priority, Job.running_at,
                                     fn.COALESCE(Job.reserved_memory_mb, 0), fn.COALESCE(Job.reserved_cpu_percent, 0),
                                     Job.preemptible, Job.stop_reason, Job.gpus_assigned, Job.gang_id).where(
                    (Job.status == "running") & (Job.node_id != gangs.GANG_NODE)))]

    def _stop(self, found: list[preemption.Preemption], now: float) -> list[tuple[str, str]]:
        stopped: list[tuple[str, str]] = []
        for chosen in found:
            for victim in chosen.victims:
                changed = Job.update(stop_reason=wire.ENDED_BY_PREEMPTION, stop_at=now).where(
                    (Job.id == victim) & (Job.status == "running") & Job.stop_reason.is_null()).execute()
                if not changed:
                    continue
                job = Job.select(Job.id, Job.attempt, Job.node_id).where(Job.id == victim).get()
                why = ("its team borrowed the capacity team {team} is guaranteed"
                       if chosen.kind == preemption.RECLAIM else "a job of its team of much higher priority")
                self.writer.event(job, "running", "running", now, f"preempted to make room for job-{chosen.for_job} "
                                  f"({why.format(team=chosen.for_team)}); stopping")
                stopped.append((f"job-{victim}", f"job-{chosen.for_job}"))
        return stopped
