"""Placement: which waiting job goes to which node, and why the others wait.

Pure: no database, no HTTP, no clock. The store (store/placing.py) reads the nodes and
the jobs that may be placed, in queue order, offers them to a `Planner`, and writes back
its placements and the reasons it gives for the rest (waiting.py words them).
docs/scheduling.md says which node a job may go to and how each policy chooses.
"""
from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.shared.wire import JOB_TYPES

from . import liveness, quotas, waiting
from .waiting import Reason

POLICIES = ("round-robin", "binpack", "spread")
DEFAULT_POOL = "default"
DEFAULT_TEAM = "default"
DEFAULT_PRIORITY = 50
# A node whose allocatable capacity is unknown has this much of it free (sorts as the roomiest).
UNCOUNTED = 1 << 62
# The least a job can reserve (the API's lower bounds of memory_mb and cpu_percent, and
# of an agent's defaults): a node with less free than this takes no job, whatever it asks.
LEAST_MEMORY_MB = 4
LEAST_CPU_PERCENT = 1

Constraint = tuple[str, str, "str | tuple[str, ...] | None"]  # (label, op, value)
Limits = tuple[int, int]  # (memory_mb, cpu_percent)
Counts = tuple[tuple[str, int], ...]  # a job's other resources, (name, count) by name
Shape = tuple[str, "str | None", "int | None", "int | None", "tuple[Constraint, ...]", "str | None", int,
              "str | None", "int | None", Counts, int]


def queue_at(eligible_at: float, priority: int, aging_secs: float) -> float:
    """Where a job stands in the queue (lower goes first): the time it became eligible,
    moved earlier by `aging_secs` for each point of priority above the default (later,
    below it). So a job's effective priority is its priority plus one point per
    `aging_secs` it has waited, and ordering by that at any moment is ordering by this
    fixed value: no job waits forever behind a stream of higher-priority ones (a job of
    priority p is overtaken only by jobs of priority p' that became eligible less than
    (p' - p) * aging_secs after it)."""
    return eligible_at - (priority - DEFAULT_PRIORITY) * aging_secs


def satisfies(labels: Mapping[str, str], constraint: Constraint) -> bool:
    """Whether a node's labels satisfy one constraint. A label the node lacks satisfies
    `!=`, `not_in` and `not_exists` only."""
    label, op, value = constraint
    have = labels.get(label)
    if op == "=":
        return have == value
    if op == "!=":
        return have != value
    if op == "in":
        return have is not None and have in value  # type: ignore[operator]
    if op == "not_in":
        return have is None or have not in value  # type: ignore[operator]
    if op == "exists":
        return have is not None
    if op == "not_exists":
        return have is None
    raise ValueError(f"unknown constraint operator {op!r}")


def pool_of(labels: Mapping[str, str]) -> str:
    return labels.get("pool") or DEFAULT_POOL


@dataclass(frozen=True, slots=True)
class Gpu:
    """One of a node's GPU devices (a MIG instance is one), as its agent advertised it."""

    uuid: str
    model: str
    memory_mb: int


def gpu_fits(ask: Ask, gpu: Gpu) -> bool:
    """Whether a device is one the job may have: its model contains the job's `gpu_model`
    (lower-cased when the Ask is made), and it has at least the job's `gpu_memory_mb`."""
    return ((ask.gpu_model is None or ask.gpu_model in gpu.model.lower())
            and (ask.gpu_memory_mb is None or gpu.memory_mb >= ask.gpu_memory_mb))


def fitting_gpus(ask: Ask, gpus: Iterable[Gpu]) -> list[Gpu]:
    """Of `gpus` (free devices, in their node's order), those the job may have, in the order
    it takes them: the smallest first (a job that fits on a small MIG instance leaves the
    large ones), then in the node's order."""
    return sorted((gpu for gpu in gpus if gpu_fits(ask, gpu)), key=lambda gpu: gpu.memory_mb)


def has_devices(ask: Ask, node: NodeInfo) -> bool:
    """Whether the node has, free or not, the GPUs and declared resources the job asks for."""
    if ask.gpus and sum(1 for gpu in node.gpus if gpu_fits(ask, gpu)) < ask.gpus:
        return False
    return all(node.resources.get(name, 0) >= count for name, count in ask.resources)


@dataclass(frozen=True)
class NodeInfo:
    """A compute node as placement sees it (the scheduler's copy of the registry's
    list, the slots and reservations of the jobs it holds)."""

    node_id: str
    free_slots: int  # its capacity (min of MAX_JOBS_PER_NODE and its slots) less the jobs it holds
    status: str = liveness.HEALTHY  # or unhealthy: the registry's; drained is apart
    drained: bool = False
    kind: str = liveness.COMPUTE
    refusing_work: str | None = None     # why its agent takes no new work (short of disk space); None: it does
    labels: Mapping[str, str] = field(default_factory=dict)
    max_memory_mb: int | None = None     # the largest limits a job may ask for; None: unknown
    max_cpu_percent: int | None = None
    reserve_memory_mb: int = 0           # the agent's system reserve
    reserve_cpu_percent: int = 0
    reserved_memory_mb: int = 0          # what its jobs (placed or running) reserve
    reserved_cpu_percent: int = 0
    default_limits: Mapping[str, Limits] = field(default_factory=dict)  # job type -> (memory, cpu)
    held: int = 0                        # the jobs placed or running there
    gpus: tuple[Gpu, ...] = ()           # its devices, in its agent's order
    gpus_held: Mapping[str, int] = field(default_factory=dict)       # device uuid -> the job holding it
    resources: Mapping[str, int] = field(default_factory=dict)       # declared by its agent
    resources_held: Mapping[str, int] = field(default_factory=dict)  # what its jobs reserve of them

    @property
    def pool(self) -> str:
        return pool_of(self.labels)

    @property
    def takes_work(self) -> bool:
        return liveness.takes_new_work(self.status, self.drained, self.refusing_work, self.kind)

    @property
    def allocatable_memory_mb(self) -> int | None:
        return None if self.max_memory_mb is None else max(0, self.max_memory_mb - self.reserve_memory_mb)

    @property
    def allocatable_cpu_percent(self) -> int | None:
        return None if self.max_cpu_percent is None else max(0, self.max_cpu_percent - self.reserve_cpu_percent)


@dataclass(slots=True)
class Ask:
    """A job that may be placed, as placement reads it. Not frozen: a pass makes one per
    queued job it looks at, and a frozen dataclass takes twice as long to make."""

    job_id: int
    job_type: str = "run"
    pin: str | None = None               # instance_id: only this node
    memory_mb: int | None = None         # requested; None: the node's default
    cpu_percent: int | None = None
    constraints: tuple[Constraint, ...] = ()
    pool: str | None = None              # None: any pool
    array_id: int | None = None
    concurrency_key: str | None = None
    team: str = DEFAULT_TEAM
    preemptible: bool = True             # False: only within its team's guarantee (quotas.py)
    priority: int = DEFAULT_PRIORITY
    gpus: int = 0                        # devices on its node
    gpu_model: str | None = None         # lower case: gpu_fits
    gpu_memory_mb: int | None = None
    resources: Counts = ()
    members: int = 1                     # nodes it needs at once, each asked all the above (a gang)
    may_hold: bool = False               # a gang that may hold the nodes it finds while it waits for more

    @property
    def shape(self) -> Shape:
        return (self.job_type, self.pin, self.memory_mb, self.cpu_percent, self.constraints, self.pool,
                self.gpus, self.gpu_model, self.gpu_memory_mb, self.resources, self.members)


@dataclass(frozen=True)
class Throttle:
    """A limit on how many jobs of a group (an array, a concurrency key) are placed or
    running at once, and how many are."""

    limit: int
    active: int


@dataclass(frozen=True)
class Placed:
    job_id: int
    node_id: str
    memory_mb: int  # what the job reserves there
    cpu_percent: int
    gpus: tuple[str, ...] = ()  # the uuids of the devices it reserves there
    rank: int = 0               # a gang's member on this node (0: the first, or a job of one node)


@dataclass
class Plan:
    placed: list[Placed]
    waiting: dict[int, Reason]  # the jobs offered and not placed, with why
    cursor: str | None          # the round-robin cursor after this pass
    exhausted: bool             # no room is left: the jobs not offered wait for capacity too
    held: dict[str, int] = field(default_factory=dict)  # node -> the gang holding it while it waits


def fits_maximum(ask: Ask, node: NodeInfo) -> bool:
    """Whether the node allows the limits the job asks for (an unknown maximum allows all)."""
    return (_within(ask.memory_mb, node.max_memory_mb)
            and _within(ask.cpu_percent, node.max_cpu_percent))


def _within(requested: int | None, maximum: int | None) -> bool:
    return requested is None or maximum is None or requested <= maximum


def matches(ask: Ask, node: NodeInfo) -> bool:
    """Whether the node is one the job may go to, room aside: its pin, pool,
    constraints and maximum limits."""
    return ((ask.pin is None or ask.pin == node.node_id)
            and (ask.pool is None or ask.pool == node.pool)
            and all(satisfies(node.labels, c) for c in ask.constraints)
            and fits_maximum(ask, node)
            and (not (ask.gpus or ask.resources) or has_devices(ask, node)))


class _Room:
    """A node's room during a pass: free slots, free allocatable memory and CPU
    (UNCOUNTED when unknown), its free GPUs and what is free of its other resources."""

    __slots__ = ("node", "working", "slots", "memory", "cpu", "shapes", "least", "gpus", "resources")

    def __init__(self, node: NodeInfo, fallback: Mapping[str, Limits] | None = None):
        self.node = node
        self.working = node.takes_work  # asked on every placement: it does not change in a pass
        self.slots = max(0, node.free_slots)
        memory, cpu = node.allocatable_memory_mb, node.allocatable_cpu_percent
        self.memory = UNCOUNTED if memory is None else memory - node.reserved_memory_mb
        self.cpu = UNCOUNTED if cpu is None else cpu - node.reserved_cpu_percent
        self.shapes: list[_Shape] = []  # the shapes whose candidates include this node
        held = node.gpus_held
        self.gpus = [gpu for gpu in node.gpus if gpu.uuid not in held]
        self.resources = {name: total - node.resources_held.get(name, 0) for name, total in node.resources.items()}
        # The least a job reserves here: what a job may ask at the least, or a type's
        # default when it is smaller (a job that asks nothing reserves its default).
        least_memory, least_cpu = LEAST_MEMORY_MB, LEAST_CPU_PERCENT
        for job_type in JOB_TYPES:
            memory, cpu = node.default_limits.get(job_type) or (fallback or {}).get(job_type) or (0, 0)
            least_memory, least_cpu = min(least_memory, memory), min(least_cpu, cpu)
        self.least = (least_memory, least_cpu)

    def need(self, ask: Ask, fallback: Mapping[str, Limits]) -> Limits:
        """What the job reserves here: what it asks, else this node's default for its type."""
        default = self.node.default_limits.get(ask.job_type) or fallback.get(ask.job_type) or (0, 0)
        return (default[0] if ask.memory_mb is None else ask.memory_mb,
                default[1] if ask.cpu_percent is None else ask.cpu_percent)

    @property
    def open(self) -> bool:
        """Whether some job could still go here: a free slot, and the least a job reserves."""
        return (self.working and self.slots > 0 and self.memory >= self.least[0]
                and self.cpu >= self.least[1])

    def lacks(self, need: Limits, ask: Ask | None = None) -> str | None:
        """What the node is short of for a job that reserves `need` (and asks `ask`'s GPUs
        and resources): slot, memory, cpu, gpus or resources; None: nothing."""
        if self.slots <= 0:
            return "slot"
        if self.memory < need[0]:
            return "memory"
        if self.cpu < need[1]:
            return "cpu"
        if ask is not None and ask.gpus and len(self.free_gpus(ask)) < ask.gpus:
            return "gpus"
        if ask is not None and not self.has_resources(ask):
            return "resources"
        return None

    def free_gpus(self, ask: Ask) -> list[Gpu]:
        """The free devices the job may have, in the order it takes them (fitting_gpus)."""
        return fitting_gpus(ask, self.gpus)

    def has_resources(self, ask: Ask) -> bool:
        return all(self.resources.get(name, 0) >= count for name, count in ask.resources)

    def take_devices(self, ask: Ask) -> tuple[str, ...]:
        """Reserve the job's GPUs and resources; the uuids of its GPUs."""
        for name, count in ask.resources:
            self.resources[name] -= count
        if not ask.gpus:
            return ()
        taken = tuple(gpu.uuid for gpu in self.free_gpus(ask)[:ask.gpus])
        self.gpus = [gpu for gpu in self.gpus if gpu.uuid not in taken]
        return taken


class _Refusals:
    """The teams the quotas refused during a pass, and why: a refusal holds for the rest
    of it (a team's usage only grows in a pass). A refusal of a job that may borrow holds
    for its team's jobs that may not, not the other way round."""

    __slots__ = ("borrowing", "firm")

    def __init__(self) -> None:
        self.borrowing: dict[str, Reason] = {}  # refused although the job may borrow
        self.firm: dict[str, Reason] = {}       # refused a job that may not borrow

    def get(self, team: str, preemptible: bool) -> Reason | None:
        found = self.borrowing.get(team)
        if found is None and not preemptible:
            found = self.firm.get(team)
        return found

    def add(self, team: str, preemptible: bool, reason: Reason) -> None:
        (self.borrowing if preemptible else self.firm)[team] = reason


class _Shape:
    """The candidates of one shape, ordered as the policy reads them."""

    def __init__(self, ask: Ask, rooms: list[_Room], policy: str, fallback: Mapping[str, Limits]):
        self.ask = ask
        self.policy = policy
        self.fallback = fallback
        self.rooms = [r for r in rooms if r.working and matches(ask, r.node)]  # node id order
        self.full: Reason | None = None  # set once it fits nowhere this pass
        self.over_quota = _Refusals()  # the teams whose jobs of this shape wait for their quota
        for room in self.rooms:
            room.shapes.append(self)
        # binpack, spread: (free GPUs after, free memory after, free CPU after, node id) ascending,
        # for nodes with a slot (free GPUs: 0 for a job that asks for none).
        self.keys: list[tuple[int, int, int, str]] = []
        self.key_of: dict[str, tuple[int, int, int, str]] = {}
        self.by_id = {r.node.node_id: r for r in self.rooms}
        if policy != "round-robin":
            for room in self.rooms:
                self._add(room)
        else:
            self.ids = [r.node.node_id for r in self.rooms]

    def _key(self, room: _Room) -> tuple[int, int, int, str]:
        memory, cpu = room.need(self.ask, self.fallback)
        if self.ask.gpus:
            return (len(room.free_gpus(self.ask)) - self.ask.gpus, room.memory - memory, room.cpu - cpu,
                    room.node.node_id)
        return (0, room.memory - memory, room.cpu - cpu, room.node.node_id)

    def _add(self, room: _Room) -> None:
        if room.slots <= 0:
            return
        key = self._key(room)
        bisect.insort(self.keys, key)
        self.key_of[room.node.node_id] = key

    def changed(self, room: _Room) -> None:
        """A job was placed on `room`: its place in this shape's order moves."""
        if self.policy == "round-robin":
            return
        old = self.key_of.pop(room.node.node_id, None)
        if old is not None:
            del self.keys[bisect.bisect_left(self.keys, old)]
        self._add(room)

    def choose_many(self, count: int, cursor: str | None) -> list[_Room]:
        """Up to `count` distinct nodes that each have room for one of the shape's jobs, in
        the order the policy prefers them (a gang's members)."""
        if self.policy == "round-robin":
            ids = self.ids
            start = 0 if cursor is None or not ids else bisect.bisect_right(ids, cursor) % len(ids)
            order = [self.by_id[ids[(start + i) % len(ids)]] for i in range(len(ids))]
        else:
            order = [self.by_id[key[3]] for key in (self.keys if self.policy == "binpack" else reversed(self.keys))]
        found = []
        for room in order:
            if room.lacks(room.need(self.ask, self.fallback), self.ask) is None:
                found.append(room)
                if len(found) == count:
                    break
        return found

    def choose(self, cursor: str | None) -> _Room | None:
        if self.policy == "round-robin":
            return self._next_after(cursor)
        keys, counted = self.keys, bool(self.ask.resources)
        if self.policy == "binpack":
            for i in range(bisect.bisect_left(keys, (0, 0, -UNCOUNTED, "")), len(keys)):
                _, memory_after, cpu_after, node_id = keys[i]
                if memory_after >= 0 and cpu_after >= 0 and (
                        not counted or self.by_id[node_id].has_resources(self.ask)):
                    return self.by_id[node_id]
            return None
        for i in range(len(keys) - 1, -1, -1):  # spread
            gpus_after, memory_after, cpu_after, node_id = keys[i]
            if gpus_after < 0 or (memory_after < 0 and gpus_after == 0):
                return None  # every key below is short of GPUs, or of memory
            if memory_after >= 0 and cpu_after >= 0 and (
                    not counted or self.by_id[node_id].has_resources(self.ask)):
                return self.by_id[node_id]
        return None

    def _next_after(self, cursor: str | None) -> _Room | None:
        ids = self.ids
        if not ids:
            return None
        # Resume after the cursor even if that node has since gone away.
        start = 0 if cursor is None else bisect.bisect_right(ids, cursor) % len(ids)
        for offset in range(len(ids)):
            room = self.by_id[ids[(start + offset) % len(ids)]]
            if room.lacks(room.need(self.ask, self.fallback), self.ask) is None:
                return room
        return None


class Planner:
    """One placement pass. `offer` the jobs in queue order (in pages, if need be) while
    not `exhausted`; then `plan()`.

    `throttles`: ("array", array_id) or ("key", concurrency_key) -> Throttle, for the
    groups the offered jobs belong to (a key with no limit set has none). `fallback`:
    the limits per job type of a node that advertises no defaults. `explain`: every job
    offered is looked at, none turned away unseen because no slot is left (a pass that
    only finds the reasons, placing nothing).

    A job goes only to a node that is healthy, not drained and not refusing work (short
    of disk), meets its constraints, pool and pin, allows the limits it asks for, has a
    free slot and room for its reservation: the memory and CPU it asks for, or the
    node's default for its type, within the node's maximum less its system reserve
    less what the jobs placed or running there reserve (a node that advertises no
    capacity is not counted on that resource). Among those, the policy chooses:

        round-robin  the first after the cursor, in node id order (the cursor moves on)
        binpack      the least free memory after placement, then the least free CPU
        spread       the most free memory after placement, then the most free CPU

    (binpack breaks a full tie by the lower node id, spread by the higher.)

    Speed: jobs that ask the same (type, pin, resources, constraints, pool) share a
    `_Shape`, whose candidate nodes are found once per pass and kept ordered as the
    policy reads them; a shape that fits nowhere turns its later jobs away at once
    (room only shrinks during a pass); the pass stops when no slot is left.

    `ledger`: the teams' quotas and usage (quotas.py), when some team has a quota. A job
    goes only where its team may take what it reserves there; a team and shape refused
    once are refused for the rest of the pass (a team's usage only grows in it)."""

    def __init__(self, nodes: Iterable[NodeInfo], policy: str = "round-robin", cursor: str | None = None,
                 throttles: Mapping[tuple[str, object], Throttle] | None = None,
                 fallback: Mapping[str, Limits] | None = None, explain: bool = False,
                 ledger: quotas.Ledger | None = None):
        if policy not in POLICIES:
            raise ValueError(f"unknown placement policy {policy!r}")
        self.policy = policy
        self.cursor = cursor
        self.explain = explain
        self.nodes = sorted(nodes, key=lambda n: n.node_id)
        self.fallback = dict(fallback or {})
        self.rooms = [_Room(n, self.fallback) for n in self.nodes]
        # The nodes some job could still go to: none left, and the pass stops offering
        # (a node full by its reservations counts as full as one without a free slot).
        self.open_rooms = sum(1 for r in self.rooms if r.open)
        # With no node taking work at all, the jobs are still offered: each gets its reason
        # (no healthy node, drained, its pin) at the cost of one look per shape.
        self.any_open = any(r.working for r in self.rooms)
        self.room_left = dict((group, t.limit - t.active) for group, t in (throttles or {}).items())
        self.throttles = dict(throttles or {})
        self.shapes: dict[Shape, _Shape] = {}
        self.placed: list[Placed] = []
        self.waiting: dict[int, Reason] = {}
        self.ledger = ledger
        self.held: dict[str, int] = {}  # node -> the gang that holds it (one gang a pass)

    def add_throttles(self, throttles: Mapping[tuple[str, object], Throttle]) -> None:
        """More groups' limits (of jobs about to be offered); a group already known keeps its count."""
        for group, throttle in throttles.items():
            if group not in self.throttles:
                self.throttles[group] = throttle
                self.room_left[group] = throttle.limit - throttle.active

    @property
    def exhausted(self) -> bool:
        """No node that takes work has room left for any job: every slot is taken, or what
        is left of its memory or CPU is less than any job reserves (there are such nodes)."""
        return self.any_open and self.open_rooms <= 0

    def offer(self, asks: Iterable[Ask]) -> None:
        for ask in asks:
            if self.exhausted and not self.explain:
                return
            reason = self._throttled(ask)
            if reason is None:
                reason = self._place(ask)
            if reason is not None:
                self.waiting[ask.job_id] = reason

    def plan(self) -> Plan:
        return Plan(self.placed, self.waiting, self.cursor, self.exhausted, dict(self.held))

    def _throttled(self, ask: Ask) -> Reason | None:
        if ask.array_id is not None and self.room_left.get(("array", ask.array_id), 1) <= 0:
            limit = self.throttles[("array", ask.array_id)].limit
            return waiting.array_throttle(ask.array_id, limit, limit - self.room_left[("array", ask.array_id)])
        key = ask.concurrency_key
        if key is not None and self.room_left.get(("key", key), 1) <= 0:
            limit = self.throttles[("key", key)].limit
            return waiting.concurrency_limit(key, limit, limit - self.room_left[("key", key)])
        return None

    def _place(self, ask: Ask) -> Reason | None:
        ledger = self.ledger
        shape = self.shapes.get(ask.shape)
        if shape is None:
            shape = self.shapes[ask.shape] = _Shape(ask, self.rooms, self.policy, self.fallback)
        if shape.full is not None:
            return shape.full
        if ledger is not None:
            refused = shape.over_quota.get(ask.team, ask.preemptible)
            if refused is not None:
                return refused
        if ask.members > 1:
            return self._place_gang(ask, shape)
        room = shape.choose(self.cursor)
        if room is None:
            shape.full = self._why_not(shape)
            return shape.full
        memory, cpu = room.need(ask, self.fallback)
        if ledger is not None:
            need = quotas.need_of(memory, cpu, ask.gpus)
            refusal = ledger.refuses(ask.team, need, may_borrow=ask.preemptible)
            if refusal is not None:
                reason = waiting.quota(refusal)
                shape.over_quota.add(ask.team, ask.preemptible, reason)
                return reason
            ledger.take(ask.team, need)
        self._take(ask, room, memory, cpu)
        self._count_throttles(ask)
        return None

    def _count_throttles(self, ask: Ask) -> None:
        for group, value in (("array", ask.array_id), ("key", ask.concurrency_key)):
            if value is not None and (group, value) in self.room_left:
                self.room_left[(group, value)] -= 1

    def _take(self, ask: Ask, room: _Room, memory: int, cpu: int, rank: int = 0) -> None:
        """Place the job (or a gang's member `rank`) on `room`, reserving `memory` and `cpu`."""
        was_open = room.open
        room.slots -= 1
        room.memory -= memory
        room.cpu -= cpu
        gpus = room.take_devices(ask) if ask.gpus or ask.resources else ()
        if was_open and not room.open:
            self.open_rooms -= 1
        for other in room.shapes:
            other.changed(room)
        if self.policy == "round-robin" and ask.pin is None:
            # A pinned job does not take the node's turn.
            self.cursor = room.node.node_id
        self.placed.append(Placed(ask.job_id, room.node.node_id, memory, cpu, gpus, rank))

    def _place_gang(self, ask: Ask, shape: _Shape) -> Reason | None:
        """All of a gang's members, each on a node of its own, or none. A gang short of
        nodes that `may_hold` (the first such in the pass) holds those it found: no other
        job takes them while it waits for the rest to free up."""
        if not shape.rooms:
            shape.full = self._why_not(shape)
            return shape.full
        rooms = shape.choose_many(ask.members, self.cursor)
        if len(rooms) < ask.members:
            if ask.may_hold and not self.held:
                for room in rooms:
                    self._hold(room, ask.job_id)
            # Room only shrinks in a pass: the shape's later gangs find no more nodes.
            shape.full = waiting.gang(ask.members, len(rooms), len(shape.rooms))
            return shape.full
        needs = [room.need(ask, self.fallback) for room in rooms]
        if self.ledger is not None:
            need = quotas.need_of(sum(n[0] for n in needs), sum(n[1] for n in needs), ask.gpus * ask.members,
                                  ask.members)
            refusal = self.ledger.refuses(ask.team, need, may_borrow=ask.preemptible)
            if refusal is not None:
                reason = waiting.quota(refusal)
                shape.over_quota.add(ask.team, ask.preemptible, reason)
                return reason
            self.ledger.take(ask.team, need)
        for rank, (room, (memory, cpu)) in enumerate(zip(rooms, needs)):
            self._take(ask, room, memory, cpu, rank)
        self._count_throttles(ask)
        return None

    def _hold(self, room: _Room, job_id: int) -> None:
        """Keep `room` for a waiting gang: no slot of it is offered to any other job this pass."""
        was_open = room.open
        room.slots = 0
        if was_open:
            self.open_rooms -= 1
        for other in room.shapes:
            other.changed(room)
        self.held[room.node.node_id] = job_id

    def _why_not(self, shape: _Shape) -> Reason:
        """Why a shape fits no node now: no room on those it may go to, or none it may go to."""
        if shape.rooms:
            lacks = [(r, r.lacks(r.need(shape.ask, self.fallback), shape.ask)) for r in shape.rooms]
            lacking = {lack for _, lack in lacks}
            filled = next((note for r, lack in lacks if lack == "cpu"
                           for note in [service_fill(r.node, self.fallback, "there")] if note), None)
            return waiting.no_capacity(len(shape.rooms), [x for x in waiting.LACKING if x in lacking],
                                       cpu_note=filled)
        return unmatched(shape.ask, self.nodes)


def free_room(node: NodeInfo, fallback: Mapping[str, Limits] | None = None) -> tuple[int, int, int]:
    """A node's free slots, and its unreserved allocatable memory and CPU (UNCOUNTED when unknown)."""
    room = _Room(node, fallback)
    return room.slots, room.memory, room.cpu


def reservation(node: NodeInfo, ask: Ask, fallback: Mapping[str, Limits]) -> Limits:
    """What the job would reserve on the node: what it asks, else the node's default for its type."""
    return _Room(node, fallback).need(ask, fallback)


def cluster_capacity(nodes: Iterable[NodeInfo]) -> dict[str, int | None]:
    """What the cluster has for the teams' quotas: the allocatable memory, CPU and slots
    of the nodes that take work, and what the jobs on the others still hold."""
    return quotas.capacity_of(
        (n.allocatable_memory_mb, n.allocatable_cpu_percent, max(0, n.free_slots) + n.held, len(n.gpus))
        if n.takes_work else (n.reserved_memory_mb, n.reserved_cpu_percent, n.held, len(n.gpus_held))
        for n in nodes)


def _requirements(ask: Ask) -> list[tuple[Constraint, Callable[[NodeInfo], bool]]]:
    """The job's pool and constraints, each with its test of a node."""
    checks: list[tuple[Constraint, Callable[[NodeInfo], bool]]] = []
    pool = ask.pool
    if pool is not None:
        checks.append((("pool", "=", pool), lambda node: node.pool == pool))
    for constraint in ask.constraints:
        checks.append((constraint, functools.partial(_meets, constraint)))
    return checks


def _meets(constraint: Constraint, node: NodeInfo) -> bool:
    return satisfies(node.labels, constraint)


def unmatched(ask: Ask, nodes: Sequence[NodeInfo]) -> Reason:
    """Why no node may take the job, room aside: its pin, no healthy node, the first
    requirement no healthy node meets (or none meets them all), drained nodes, nodes
    whose agents take no new work, or limits beyond what the nodes it may go to allow."""
    if ask.pin is not None:
        node = next((n for n in nodes if n.node_id == ask.pin), None)
        if node is None or node.status != liveness.HEALTHY:
            return waiting.pinned_node_unavailable(ask.pin, "not a known compute node" if node is None
                                                   else node.status)
        nodes = [node]
    healthy = [n for n in nodes if n.status == liveness.HEALTHY]
    if not healthy:
        return waiting.no_healthy_node(len(nodes))
    checks = _requirements(ask)
    for constraint, test in checks:
        if not any(test(n) for n in healthy):
            return waiting.constraints_unmet([constraint])
    meeting = [n for n in healthy if all(test(n) for _, test in checks)]
    if not meeting:
        return waiting.constraints_unmet([c for c, _ in checks], every=True)
    undrained = [n for n in meeting if not n.drained]
    if not undrained:
        return waiting.draining([n.node_id for n in meeting])
    taking = [n for n in undrained if n.refusing_work is None]
    if not taking:
        return waiting.refusing_work({n.node_id: n.refusing_work or "" for n in undrained})
    if (ask.gpus or ask.resources) and not any(has_devices(ask, n) for n in taking):
        return waiting.no_devices(len(taking), ask.gpus, ask.gpu_model, ask.gpu_memory_mb, dict(ask.resources))
    return waiting.no_capacity(len(taking), ["limits"])


def service_fill(node: NodeInfo, fallback: Mapping[str, Limits], where: str) -> str | None:
    """Why a node is out of CPU when one service job that asks for none fills it: its
    default (AGENT_SERVICE_CPU_PERCENT, 200%) is all the node allows (a 2-CPU node),
    and its jobs reserve at least that much. None otherwise."""
    service_cpu = (node.default_limits.get("service") or fallback.get("service") or (0, 0))[1]
    allocatable = node.allocatable_cpu_percent
    if allocatable is None or service_cpu <= 0 or service_cpu < allocatable or node.reserved_cpu_percent < service_cpu:
        return None
    return f"a service job that asks for no cpu_percent reserves {service_cpu}% {where}, all the node allows"


def shortfalls(ask: Ask, nodes: Iterable[NodeInfo], fallback: Mapping[str, Limits] | None = None,
               limit: int = 5) -> list[dict[str, Any]]:
    """The nodes that came closest to taking the job, each with what it lacks (fewest
    first, then by node id): for GET /jobs/{id}/why."""
    found = []
    for node in nodes:
        lacks = []
        if ask.pin is not None and ask.pin != node.node_id:
            lacks.append(f"the job is pinned to {ask.pin}")
        if node.status != liveness.HEALTHY:
            lacks.append(f"the node is {node.status}")
        if node.drained:
            lacks.append("the node is drained")
        if node.refusing_work is not None:
            lacks.append(f"the node takes no new work: {node.refusing_work}")
        for i, (constraint, test) in enumerate(_requirements(ask)):
            if not test(node):
                label = constraint[0]
                has = node.pool if i == 0 and ask.pool is not None else node.labels.get(label)
                lacks.append(f"{waiting.describe(constraint)} (the node has "
                             + (f"{label}={has})" if has is not None else f"no label {label})"))
        if not _within(ask.memory_mb, node.max_memory_mb):
            lacks.append(f"memory_mb {ask.memory_mb} is over the node's maximum {node.max_memory_mb}")
        if not _within(ask.cpu_percent, node.max_cpu_percent):
            lacks.append(f"cpu_percent {ask.cpu_percent} is over the node's maximum {node.max_cpu_percent}")
        if (ask.gpus or ask.resources) and not has_devices(ask, node):
            lacks.append(waiting.devices_wanted(ask.gpus, ask.gpu_model, ask.gpu_memory_mb, dict(ask.resources))
                         + f" (the node has {_devices(node)})")
        room = _Room(node, fallback)
        memory, cpu = room.need(ask, fallback or {})
        if room.slots <= 0:
            lacks.append("no free slot")
        if room.memory < memory:
            lacks.append(f"needs {memory} MB of memory, {max(0, room.memory)} MB unreserved")
        if room.cpu < cpu:
            filled = service_fill(node, fallback or {}, "here")
            lacks.append(f"needs {cpu}% CPU, {max(0, room.cpu)}% unreserved" + (
                f" (its jobs reserve {node.reserved_cpu_percent}% of {node.allocatable_cpu_percent}%; {filled})"
                if filled else ""))
        if ask.gpus and has_devices(ask, node) and len(room.free_gpus(ask)) < ask.gpus:
            lacks.append(f"needs {ask.gpus} free GPU{'s' if ask.gpus != 1 else ''}, {len(room.free_gpus(ask))} free")
        for name, count in ask.resources:
            if node.resources.get(name, 0) >= count > room.resources.get(name, 0):
                lacks.append(f"needs {count} {name}, {room.resources.get(name, 0)} free")
        found.append({"node_id": node.node_id, "lacks": lacks})
    found.sort(key=lambda item: (len(item["lacks"]), item["node_id"]))
    return found[:limit]


def _devices(node: NodeInfo) -> str:
    """What a node has of GPUs and declared resources, in words (for `shortfalls`)."""
    gpus = f"{len(node.gpus)} GPU{'s' if len(node.gpus) != 1 else ''}"
    if node.gpus:
        models = sorted({gpu.model for gpu in node.gpus})
        gpus += f" ({', '.join(models)})"
    declared = ", ".join(f"{count} {name}" for name, count in sorted(node.resources.items()))
    return gpus + (f" and {declared}" if declared else "")
