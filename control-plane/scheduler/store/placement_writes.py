"""What a placement pass writes.

The placements (one conditional update per node and reservation, an event each), the
reasons of the jobs it could not place, the scheduler_state values it keeps (cursor,
placement mark), and the wake-up of the claims of the nodes it placed on, after the
commit. Writes only: the stage (placing.py) decides what."""
import functools
import json
import logging
from typing import Any

from corral.server.statements import ValueList, param
from corral.shared import tracing

from .. import placement, spans, waiting
from ..models import Job, SchedulerState
from .columns import INSERT_CHUNK
from .context import StoreContext
from .rows import json_value
from .status_writer import StatusWriter

log = logging.getLogger(__name__)


class PlacementWrites:
    def __init__(self, ctx: StoreContext, writer: StatusWriter):
        self.ctx = ctx
        self.writer = writer

    def place(self, chosen: list[placement.Placed], attempts: dict[int, int], now: float
              ) -> list[tuple[int, str]]:
        """Place the chosen jobs: one conditional update per node and reservation, and
        an event each. Returns (job row id, node) of those placed (not taken meanwhile)."""
        db, sql = self.ctx.db, self.ctx.sql
        # A job with GPUs is a group of its own: its devices are its own.
        groups: dict[tuple[str, int, int, tuple[str, ...]], list[int]] = {}
        for p in chosen:
            groups.setdefault((p.node_id, p.memory_mb, p.cpu_percent, p.gpus), []).append(p.job_id)
        placed = []
        started, traced = spans.now_ns(), []
        for (node_id, memory, cpu, gpus), ids in groups.items():
            ids_list = ValueList(db, "ids", ids)
            done = {row[0]: row for row in sql.rows(db, ("place", ids_list.size), lambda: Job.update(
                    node_id=param("node_id"), attempt=Job.attempt + 1, placed_at=param("now"),
                    next_attempt_at=None, reserved_memory_mb=param("memory"), reserved_cpu_percent=param("cpu"),
                    gpus_assigned=param("gpus"), pending_reason=None, pending_code=None).where(
                    ids_list.matches(Job.id) & (Job.status == "pending") & Job.node_id.is_null()).returning(
                        Job.id, Job.traceparent, Job.tracestate),
                    node_id=node_id, now=now, memory=memory, cpu=cpu, gpus=json.dumps(list(gpus)) if gpus else None,
                    **ids_list.values)}
            placed += [(job_id, node_id) for job_id in ids if job_id in done]
            traced += [(f"job-{job_id}", *done[job_id][1:], attempts[job_id] + 1, node_id)
                       for job_id in ids if job_id in done]
        if placed:
            self.writer.events([{"job": job_id, "at": now, "old": "pending", "new": "pending",
                                 "attempt": attempts[job_id] + 1, "node_id": node_id,
                                 "reason": f"placed on {node_id}"} for job_id, node_id in placed])
            if tracing.enabled():  # a corral.place span per placement, once committed
                db.after_commit(functools.partial(spans.placed, traced, started))
        return placed

    def keep_reasons(self, reasons: dict[int, waiting.Reason], stored: dict[int, Any]) -> int:
        """Keep the reason of each job placement could not place, where it changed: one
        update per distinct reason (in the caller's transaction, else one of its own).
        Returns how many changed."""
        changed: dict[str, tuple[waiting.Reason, list[int]]] = {}
        for job_id, reason in reasons.items():
            value = reason.as_dict()
            if json_value(stored.get(job_id)) != value:
                changed.setdefault(json.dumps(value, sort_keys=True), (reason, []))[1].append(job_id)
        if not changed:
            return 0
        with self.ctx.tx():
            self.ctx.check_fence()
            for reason, ids in changed.values():
                for start in range(0, len(ids), INSERT_CHUNK):
                    Job.update(pending_reason=reason.as_dict(), pending_code=reason.code).where(
                        Job.id.in_(ids[start:start + INSERT_CHUNK]) & (Job.status == "pending")
                        & Job.node_id.is_null()).execute()
        return sum(len(ids) for _, ids in changed.values())

    def set_state(self, values: dict[str, str | None]) -> None:
        """Store scheduler_state values (key → value), all in one statement."""
        if not values:
            return
        named: dict[str, str | None] = {}
        for i, key in enumerate(sorted(values)):
            named[f"key{i}"], named[f"value{i}"] = key, values[key]
        self.ctx.sql.execute(self.ctx.db, ("set state", len(values)), lambda: SchedulerState.insert_many(
            [{"key": param(f"key{i}"), "value": param(f"value{i}")} for i in range(len(values))]).on_conflict(
            conflict_target=[SchedulerState.key], preserve=[SchedulerState.value]), **named)

    def wake_after_commit(self, node_ids: set[str]) -> None:
        """Once this transaction commits, wake the waiting claims of these nodes (on_placed)."""
        hook = self.ctx.on_placed
        if hook is None:
            return

        def notify() -> None:
            try:
                hook(node_ids)
            except Exception:  # after the commit: the request must not fail for it
                log.exception("waking the claims of %s failed", sorted(node_ids))

        self.ctx.db.after_commit(notify)
