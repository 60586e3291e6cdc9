"""Agents' claims of the jobs placed on their nodes.

How many a claim may take, whether it could take anything (for waiting claims), and the
taking itself: each job becomes `running` exactly as a `running` report would make it,
renewing the node's lease."""
from typing import Any

import peewee
from peewee import fn

from corral.server.statements import param

from .. import lifecycle, liveness
from ..models import Job, Node
from .columns import CLAIMED
from .context import StoreContext
from .leases import Leases
from .rows import DESIGN_LIMITS, tuples
from .transitions import Transitions


class Claims:
    def __init__(self, ctx: StoreContext, transitions: Transitions, leases: Leases):
        self.ctx = ctx
        self.transitions = transitions
        self.leases = leases

    def claim_room(self, node_id: str, request: dict, now: float) -> tuple[int, bool]:
        """How many jobs a claim of `node_id` may take now (its free slots, at most
        request['max']), and whether placement should fill a slot of it first: one is
        free (the node takes new work, liveness.takes_new_work, and has room beyond
        what is placed) and due work waits unplaced (unplaced_due)."""
        db, sql = self.ctx.db, self.ctx.sql

        def counted(status: str) -> peewee.Select:
            return Job.select(fn.COUNT(Job.id)).where((Job.node_id == param("node_id")) & (Job.status == status))

        # The node, its running and placed jobs (the (node_id, status) index) and whether
        # work waits unplaced, in one read.
        rows = sql.rows(db, "claiming node", lambda: Node.select(
            Node.slots, Node.status, Node.kind, Node.refusing_work, counted("running"), counted("pending"),
            _unplaced_due_query()).where(Node.node_id == param("node_id")), node_id=node_id, now=now)
        if rows:
            slots, status, kind, refusing, running, placed, waiting = rows[0]
            taking = liveness.takes_new_work(*liveness.as_registry(status), refusing, kind)
        else:  # not (or no longer) a known node: its jobs alone
            slots, waiting, taking = None, None, False
            running, placed = sql.rows(db, "node job counts", lambda: peewee.Select(
                columns=[counted("running"), counted("pending")]).bind(db), node_id=node_id)[0]
        capacity = self.ctx.capacity(slots)
        free = min(request["max"], capacity - running)
        slot_open = free > 0 and taking and running + placed < capacity
        return free, slot_open and waiting is not None

    def may_claim(self, node_id: str, now: float) -> bool:
        """Whether a claim could take anything (read without a write transaction): jobs
        are placed on it, or work waits unplaced (the claim may place it here). Two
        reads, no lock; a job placed just after wakes the waiting claim, which looks again."""
        placed = self.ctx.sql.rows(self.ctx.db, "placed on node", lambda: Job.select(Job.id).where(
            (Job.status == "pending") & (Job.node_id == param("node_id"))).limit(1), node_id=node_id)
        return bool(placed) or self.unplaced_due(now)

    def unplaced_due(self, now: float) -> bool:
        """Whether a pending job placed nowhere is due at `now`."""
        # Ordered as the (status, node_id, queue_at, id) index is, as in dispatch: without an order,
        # PostgreSQL's generic plan of this prepared statement may scan the whole table
        # for a LIMIT 1 that finds nothing (much slower under load; see docs/benchmarks.md).
        return bool(self.ctx.sql.rows(self.ctx.db, "unplaced due", _unplaced_due_query, now=now))

    def nodes_with_work(self, node_ids: set[str]) -> set[str]:
        """Which of these nodes have something to claim: pending jobs placed on them and
        a free slot (for the waiting claims of a process: one grouped count, and the
        node rows of those that have pending jobs)."""
        if not node_ids:
            return set()
        pending: dict[str, int] = {}
        running: dict[str, int] = {}
        for node_id, status, count in tuples(Job.select(Job.node_id, Job.status, fn.COUNT(Job.id))
                                             .where(Job.node_id.in_(sorted(node_ids))
                                                    & Job.status.in_(["pending", "running"]))
                                             .group_by(Job.node_id, Job.status)):
            (pending if status == "pending" else running)[node_id] = count
        if not pending:
            return set()
        capacity = self.ctx.capacity
        slots_of = {node_id: capacity(slots) for node_id, slots in tuples(Node.select(
            Node.node_id, Node.slots).where(Node.node_id.in_(sorted(pending))))}
        return {node_id for node_id in pending
                if running.get(node_id, 0) < slots_of.get(node_id, capacity(None))}

    def take_placed(self, node_id: str, request: dict, free: int, now: float) -> list[Job]:
        """Take up to `free` pending jobs placed on `node_id`: each becomes
        `running` for its current attempt, exactly as a `running` report would make
        it (running_at, an event, limits_enforced, limits, private_tmp). Never more than the
        node's free slots.

        A claim that takes jobs renews the node's lease in the same transaction (the
        agent counts that renewal from when it sent the claim). One that takes
        nothing writes nothing: an idle agent holds no lease, and nothing is written
        for the claims 500 idle agents keep waiting. Were jobs running there all the
        same (a claim whose answer was lost on the way), they are requeued as for a
        lost node once the lease is older than the lease period plus the grace.

        A job goes to exactly one claim: the update is conditional on status,
        node and attempt, and its row count is checked. On SQLite the whole claim
        runs under the write lock; on PostgreSQL the select skips rows another
        claim has locked (FOR UPDATE SKIP LOCKED).
        """
        with self.ctx.tx():
            def placed_here() -> Any:
                query = (Job.select(*CLAIMED).where((Job.status == "pending") & (Job.node_id == param("node_id")))
                         .order_by(Job.status, Job.node_id, Job.queue_at, Job.id).limit(param("limit")))
                return self.ctx.backend.skip_locked(query)

            decided = [(job, lifecycle.started(job, now, bool(request["limits_enforced"]), _claim_limits(job, request),
                                               request.get("private_tmp"), "claimed by the node"))
                       for job in self.ctx.sql.select(Job, "placed here", placed_here, node_id=node_id, limit=free)]
            # A job another claim took meanwhile is left out (not on SQLite: skip-locked elsewhere).
            stale = self.transitions.apply_all(decided, now, on_node=node_id)
            claimed = [job for job, _ in decided if job not in stale]
            if not claimed:
                return []
            self.leases.touch(node_id, now)
            return claimed  # the rows as just updated (no read back)


def _unplaced_due_query() -> peewee.Select:
    """The id of one pending job placed nowhere that is due at `now` (a parameter)."""
    query: peewee.Select = Job.select(Job.id).where(
        (Job.status == "pending") & Job.node_id.is_null()
        & (Job.next_attempt_at.is_null() | (Job.next_attempt_at <= param("now")))
    ).order_by(Job.status, Job.node_id, Job.queue_at, Job.id).limit(1)
    return query


def _claim_limits(job: Job, request: dict) -> dict | None:
    """The limits a claimed job gets: its own request, else the node's default for its
    type (the design's defaults when the agent sent none); None when not enforced."""
    if not request.get("limits_enforced"):
        return None
    defaults = (request.get("default_limits") or {}).get(job.job_type) or DESIGN_LIMITS.get(
        job.job_type, DESIGN_LIMITS["run"])
    limits = {"memory_mb": job.memory_mb if job.memory_mb is not None else defaults["memory_mb"],
              "cpu_percent": job.cpu_percent if job.cpu_percent is not None else defaults["cpu_percent"]}
    processes = job.max_processes if job.max_processes is not None else defaults.get("max_processes")
    if processes is not None:  # an agent that sets no pids limit sends no default
        limits["max_processes"] = processes
    return limits
