"""What placement reads: the snapshot a placement pass plans on. The compute nodes with
their free slots and what their jobs reserve, the due queue page by page, the limits
of the arrays and concurrency keys the queued jobs belong to (throttles), and the
round-robin cursor; what the jobs holding slots reserve, by team and user (quotas, fair
share) and the cluster's capacity. Reads only; placement_writes.py writes what the stage
decides."""
import threading
import time
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

import peewee
from peewee import fn

from corral.server.statements import ValueList, param
from corral.shared.states import ACTIVE

from .. import gangs, liveness, placement, quotas
from ..models import ConcurrencyLimit, Job, JobArray, Node, SchedulerState
from .columns import QUEUED
from .context import StoreContext
from .rows import gpus_of, json_value, limits_by_type, tuples

RR_CURSOR = "rr_cursor"
# The cluster's capacity (for quotas) is read again after this long when a placement
# reads only some nodes: it moves only as nodes come, go or change.
CAPACITY_SECS = 2.0
# What the jobs of a node without GPUs or declared resources hold of them.
NONE_HELD: tuple[dict[str, int], dict[str, int]] = ({}, {})


class Held(NamedTuple):
    """What one user's jobs in one team that hold a slot (placed or running) reserve, and
    of that what the running ones reserve of CPU with the sum of CPU × running_at (what
    fair share needs for the core-seconds they used so far)."""

    team: str
    user: str
    jobs: int
    memory_mb: int
    cpu_percent: int
    running_cpu: int
    running_cpu_since: float
    gpus: int = 0


class PlacementReads:
    def __init__(self, ctx: StoreContext, clock: Callable[[], float] = time.monotonic):
        self.ctx = ctx
        self._clock = clock
        self._lock = threading.Lock()
        self._capacity: tuple[dict[str, int | None], float] | None = None

    def nodes(self, only: Collection[str] | None = None, include_others: bool = False
              ) -> list[placement.NodeInfo]:
        """The compute nodes (`only` these, when given; `include_others`: nodes of every
        kind) as placement sees them: status, labels, limits, free slots and what their
        jobs reserve."""
        if only is not None and not only:
            return []
        chosen = ValueList(self.ctx.db, "only", sorted(only)) if only is not None else None

        def compute_nodes() -> Any:
            # Each node with the count of its jobs that hold a slot and what they reserve,
            # in one walk of the (node_id, status) index per node (a join, grouped).
            where = None if include_others else Node.kind == liveness.COMPUTE
            if chosen is not None:
                where = chosen.matches(Node.node_id) if where is None else where & chosen.matches(Node.node_id)
            return (Node.select(Node.node_id, Node.slots, Node.status, Node.kind, Node.refusing_work,
                                Node.max_memory_mb, Node.max_cpu_percent, Node.labels, Node.default_limits,
                                Node.reserve_memory_mb, Node.reserve_cpu_percent, Node.gpus, Node.resources,
                                fn.COUNT(Job.id), fn.COALESCE(fn.SUM(Job.reserved_memory_mb), 0),
                                fn.COALESCE(fn.SUM(Job.reserved_cpu_percent), 0))
                    .join(Job, peewee.JOIN.LEFT_OUTER, on=(Job.node_id == Node.node_id) & Job.status.in_(ACTIVE))
                    .where(where if where is not None else peewee.SQL("1 = 1"))
                    .group_by(Node.node_id))

        rows = self.ctx.sql.rows(self.ctx.db, ("placement nodes", chosen and chosen.size, include_others),
                                 compute_nodes, **(chosen.values if chosen else {}))
        capacity = self.ctx.capacity
        # Only nodes that have GPUs or declared resources cost the read of what their jobs hold of them.
        devices = self.devices_held([row[0] for row in rows if row[11] is not None or row[12] is not None])
        return [placement.NodeInfo(
            node_id, capacity(slots) - held, *liveness.as_registry(status), kind=kind,
            refusing_work=refusing, labels=json_value(labels) or {},
            max_memory_mb=max_memory,
            max_cpu_percent=max_cpu, reserve_memory_mb=reserve_memory or 0, reserve_cpu_percent=reserve_cpu or 0,
            reserved_memory_mb=int(reserved_memory or 0), reserved_cpu_percent=int(reserved_cpu or 0),
            default_limits=limits_by_type(json_value(defaults)), held=held,
            gpus=gpus_of(gpus), resources=json_value(resources) or {},
            gpus_held=devices.get(node_id, NONE_HELD)[0], resources_held=devices.get(node_id, NONE_HELD)[1])
            for (node_id, slots, status, kind, refusing, max_memory, max_cpu, labels, defaults, reserve_memory,
                 reserve_cpu, gpus, resources, held, reserved_memory, reserved_cpu) in rows]

    def devices_held(self, node_ids: list[str]) -> dict[str, tuple[dict[str, int], dict[str, int]]]:
        """Of each of these nodes, the GPUs its jobs hold (uuid -> job row id) and what they
        reserve of its other resources (name -> count): the jobs placed or running there
        that hold any, read through the (node_id, status) index."""
        found: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
        if not node_ids:
            return found
        chosen = ValueList(self.ctx.db, "nodes", sorted(node_ids))
        rows = self.ctx.sql.rows(self.ctx.db, ("devices held", chosen.size), lambda: Job.select(
            Job.node_id, Job.id, Job.gpus_assigned, Job.resources).where(
            chosen.matches(Job.node_id) & Job.status.in_(ACTIVE)
            & (Job.gpus_assigned.is_null(False) | Job.resources.is_null(False))), **chosen.values)
        for node_id, job_id, assigned, resources in rows:
            gpus, counts = found.setdefault(node_id, ({}, {}))
            for uuid in json_value(assigned) or ():
                gpus[uuid] = job_id
            for name, count in (json_value(resources) or {}).items():
                counts[name] = counts.get(name, 0) + count
        return found

    def open_nodes(self) -> list[str]:
        """The nodes that take new work with a free slot (one read, no lock)."""
        return [n.node_id for n in self.nodes() if n.takes_work and n.free_slots > 0]

    def queue_page(self, open_nodes: ValueList, now: float, limit: int,
                   after: tuple[float, int] | None) -> list[tuple]:
        """Up to `limit` due jobs (rows of columns.QUEUED) an open node may take (unpinned,
        or pinned to one of `open_nodes`), in queue order, after (queue_at, id) `after`."""
        def unplaced() -> Any:
            # Ordered as the (status, node_id, queue_at, id) index is: status and node_id are the
            # same in every row, so this is queue order, read from the index up to the
            # limit. Ordered by id alone, PostgreSQL walks the primary key past every
            # finished job, and SQLite sorts every queued one. On PostgreSQL,
            # placements on other nodes run meanwhile: each skips the jobs another
            # is placing, rather than waiting for its commit to find them placed.
            where = ((Job.status == "pending") & Job.node_id.is_null() & (Job.dependencies_left == 0)
                     & (Job.next_attempt_at.is_null() | (Job.next_attempt_at <= param("now")))
                     & (Job.instance_id.is_null() | open_nodes.matches(Job.instance_id)))
            if after is not None:
                where &= peewee.Tuple(Job.queue_at, Job.id) > peewee.Tuple(param("after_at"), param("after_id"))
            query = Job.select(*QUEUED).where(where).order_by(
                Job.status, Job.node_id, Job.queue_at, Job.id).limit(param("limit"))
            return self.ctx.backend.skip_locked(query)

        extra = {} if after is None else {"after_at": after[0], "after_id": after[1]}
        return self.ctx.sql.rows(self.ctx.db, ("unplaced", open_nodes.size, after is not None), unplaced,
                                 now=now, limit=limit, **open_nodes.values, **extra)

    def queue_head(self, now: float, limit: int) -> list[tuple]:
        """The first `limit` due jobs of the queue (rows of columns.QUEUED), read without a lock."""
        return self.ctx.sql.rows(self.ctx.db, "explain queue", lambda: Job.select(*QUEUED).where(
            (Job.status == "pending") & Job.node_id.is_null() & (Job.dependencies_left == 0)
            & (Job.next_attempt_at.is_null() | (Job.next_attempt_at <= param("now")))
        ).order_by(Job.status, Job.node_id, Job.queue_at, Job.id).limit(param("limit")), now=now, limit=limit)

    def next_due(self, now: float) -> float | None:
        """The earliest time after `now` an unplaced job comes due (a run_at, a retry's
        backoff), for the background pass to wake then; None when none waits for a time."""
        due: float | None = self.ctx.sql.rows(
            self.ctx.db, "next due", lambda: Job.select(fn.MIN(Job.next_attempt_at)).where(
                (Job.next_attempt_at > param("now")) & (Job.status == "pending") & Job.node_id.is_null()),
            now=now)[0][0]
        return due

    @staticmethod
    def throttles(known: Collection[tuple[str, object]], array_ids: Collection[int | None],
                  concurrency_keys: Collection[str | None]) -> dict[tuple[str, object], placement.Throttle]:
        """The limits of these arrays and concurrency keys (None among them: a job of
        neither) not `known` yet, and how many of their jobs are placed or running."""
        arrays = {a for a in array_ids if a is not None and ("array", a) not in known}
        keys = {k for k in concurrency_keys if k is not None and ("key", k) not in known}
        found: dict[tuple[str, object], placement.Throttle] = {}
        if not arrays and not keys:
            return found
        holding = _holding_slots()
        if arrays:
            # `+ 0` (and `|| ''` below): read through the index of the jobs holding slots, not
            # the array's (or key's) own, which walks every queued job of a 100,000-job array.
            active = dict(tuples(Job.select(Job.array_id, fn.COUNT(Job.id)).where(
                (Job.array_id + 0).in_(sorted(arrays)) & holding).group_by(Job.array_id)))
            for array_id, parallel in tuples(JobArray.select(JobArray.id, JobArray.parallel).where(
                    JobArray.id.in_(sorted(arrays)))):
                found[("array", array_id)] = placement.Throttle(parallel, active.get(array_id, 0))
        if keys:
            limits = dict(tuples(ConcurrencyLimit.select(ConcurrencyLimit.key, ConcurrencyLimit.limit).where(
                ConcurrencyLimit.key.in_(sorted(keys)))))
            if limits:
                active = dict(tuples(Job.select(Job.concurrency_key, fn.COUNT(Job.id)).where(
                    Job.concurrency_key.concat("").in_(sorted(limits)) & holding).group_by(
                    Job.concurrency_key)))
                for key, limit in limits.items():
                    found[("key", key)] = placement.Throttle(limit, active.get(key, 0))
            for key in keys - set(limits):  # no limit set: unlimited (and not asked again this pass)
                found[("key", key)] = placement.Throttle(placement.UNCOUNTED, 0)
        return found

    def holding(self, team: str | None = None) -> list[Held]:
        """What the jobs holding slots reserve, by team and user (`team`'s only, when given):
        one grouped walk of those jobs, which quotas and fair share share in a pass."""
        def held() -> Any:
            # A job of many nodes holds no node itself: its members do.
            holding = _holding_slots() & (Job.node_id != gangs.GANG_NODE)
            where = holding if team is None else holding & (Job.team == param("team"))
            running = (Job.status == "running") & Job.running_at.is_null(False)
            cpu = fn.COALESCE(Job.reserved_cpu_percent, 0)
            return Job.select(
                Job.team, Job.submitted_by, fn.COUNT(Job.id), fn.COALESCE(fn.SUM(Job.reserved_memory_mb), 0),
                fn.SUM(cpu), fn.SUM(peewee.Case(None, [(running, cpu)], 0)),
                fn.SUM(peewee.Case(None, [(running, cpu * Job.running_at)], 0.0)),
                fn.COALESCE(fn.SUM(Job.gpus), 0),
            ).where(where).group_by(Job.team, Job.submitted_by)

        rows = self.ctx.sql.rows(self.ctx.db, ("held", team is None), held,
                                 **({} if team is None else {"team": team}))
        return [Held(name, user, int(jobs), int(memory or 0), int(cpu or 0), int(running or 0),
                     float(since or 0.0), int(gpus or 0))
                for name, user, jobs, memory, cpu, running, since, gpus in rows]

    def team_usage(self, team: str | None = None, held: list[Held] | None = None) -> dict[str, dict[str, int]]:
        """What each team's placed and running jobs reserve (quotas.RESOURCES; `team`'s only,
        when given), from `held` when the caller read it already."""
        found: dict[str, dict[str, int]] = {}
        for one in self.holding(team) if held is None else held:
            used = found.get(one.team)
            if used is None:
                used = found[one.team] = dict.fromkeys(quotas.RESOURCES, 0)
            used["cpu_percent"] += one.cpu_percent
            used["memory_mb"] += one.memory_mb
            used["gpus"] += one.gpus
            used["jobs"] += one.jobs
        return found

    def capacity(self, nodes: list[placement.NodeInfo] | None = None) -> dict[str, int | None]:
        """The cluster's capacity for quotas (placement.cluster_capacity) of `nodes`, every
        node as just read; else as read within CAPACITY_SECS, or read now."""
        if nodes is None:
            with self._lock:
                kept = self._capacity
            if kept is not None and 0 <= self._clock() - kept[1] < CAPACITY_SECS:
                return kept[0]
            nodes = self.nodes()
        found = placement.cluster_capacity(nodes)
        with self._lock:
            self._capacity = (found, self._clock())
        return found

    def forget_capacity(self) -> None:
        """The node list changed (in this process): read the capacity again at the next question."""
        with self._lock:
            self._capacity = None

    def cursor(self) -> tuple[str | None, bool]:
        """The round-robin cursor (read under the placement lock), and whether its row exists."""
        rows = self.ctx.sql.rows(self.ctx.db, "cursor value", lambda: SchedulerState.select(
            SchedulerState.value).where(SchedulerState.key == RR_CURSOR))
        return (rows[0][0], True) if rows else (None, False)


def _holding_slots() -> Any:
    """The jobs placed or running, as a range of the (status, node_id, ...) index: a running
    job is always on a node. Its rows are bounded by the cluster's slots, not by the queue."""
    return Job.status.in_(["pending", "running"]) & Job.node_id.is_null(False)
