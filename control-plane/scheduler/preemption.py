"""Preemption: which running jobs to stop so that a waiting job gets what it is owed
(docs/scheduling.md, "Preemption").

Pure: the nodes, the running jobs, the quotas' ledger and the waiting jobs in; the
stops out. The store (store/preemptions.py) reads and writes; each victim is stopped
with its own kill signal and grace and requeued without spending a retry.

Two kinds:

- **Reclaim.** A waiting job whose team, with it running, stays within its guaranteed
  quota, while other teams run on capacity they borrowed: its victims are those
  teams' preemptible jobs, each of a team that borrows what the victim holds, all on
  one node where the job fits once they end.
- **Priority** (PRIORITY_PREEMPTION_GAP > 0): a waiting job may stop preemptible jobs
  of its own team whose priority is at least the gap below its own.

Victims go lowest priority first, then youngest (the least work lost). No loops: a
victim is chosen only when the job fits on that node once the victims end (and no
node has room for it already, counting what jobs being stopped will free); the job
made room for by a reclaim runs within its team's guarantee, so the victims' teams
cannot reclaim it back, and one made room for by priority outranks its victims by the
gap, so they cannot either.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import placement, quotas
from .placement import Ask, NodeInfo

RECLAIM = "reclaim"
PRIORITY = "priority"


@dataclass(frozen=True)
class Running:
    """A running job as preemption sees it."""

    job_id: int
    node_id: str
    team: str
    priority: int
    started_at: float
    memory_mb: int
    cpu_percent: int
    preemptible: bool = True
    stopping: bool = False   # a stop was asked of it already (it frees its room soon)
    gpus: tuple[str, ...] = ()  # the uuids of the GPUs reserved for it

    @property
    def amounts(self) -> quotas.Need:
        return quotas.need_of(self.memory_mb, self.cpu_percent, len(self.gpus))


@dataclass(frozen=True)
class Preemption:
    for_job: int
    for_team: str
    node_id: str
    victims: tuple[int, ...]
    kind: str                # RECLAIM or PRIORITY


def _fits(room: list[int], need: tuple[int, int]) -> bool:
    return room[0] >= 1 and room[1] >= need[0] and room[2] >= need[1]


class _Devices:
    """The GPUs of the nodes during a plan: each node's devices, and which are free (or
    will be once the stops asked end)."""

    def __init__(self, nodes: Sequence[NodeInfo], running: Sequence[Running]):
        self.of = {n.node_id: {gpu.uuid: gpu for gpu in n.gpus} for n in nodes if n.gpus}
        self.free = {n.node_id: {gpu.uuid for gpu in n.gpus if gpu.uuid not in n.gpus_held} for n in nodes if n.gpus}
        for job in running:
            if job.stopping and job.node_id in self.free:
                self.free[job.node_id] |= set(job.gpus)

    def fitting(self, ask: Ask, node_id: str, free: set[str]) -> list[str] | None:
        """Of `free` (uuids on the node), the devices the job would take, None when too few fit it."""
        if not ask.gpus:
            return []
        fit = placement.fitting_gpus(ask, (gpu for gpu in self.of.get(node_id, {}).values() if gpu.uuid in free))
        return [gpu.uuid for gpu in fit[:ask.gpus]] if len(fit) >= ask.gpus else None


def _resources_free(ask: Ask, node: NodeInfo) -> bool:
    """Whether the node has free the other resources the job asks for. Preemption frees
    slots, memory, CPU and GPUs; a node short of a declared resource is not one it serves."""
    return all(node.resources.get(name, 0) - node.resources_held.get(name, 0) >= count
               for name, count in ask.resources)


def plan(waiting: Sequence[Ask], nodes: Sequence[NodeInfo], running: Sequence[Running],
         ledger: quotas.Ledger | None, fallback: Mapping[str, placement.Limits], priority_gap: int = 0,
         limit: int = 100) -> list[Preemption]:
    """The stops to ask so that the `waiting` jobs (in the order to serve them) get room,
    at most `limit` victims in all. `ledger`: the quotas and usage (None: no quotas, so
    no reclaim)."""
    by_node: dict[str, list[Running]] = {}
    for job in running:
        by_node.setdefault(job.node_id, []).append(job)
    free: dict[str, list[int]] = {}
    for node in nodes:
        room = list(placement.free_room(node, fallback))
        for job in by_node.get(node.node_id, ()):
            if job.stopping:  # its room is as good as free: it is on its way out
                room = [room[0] + 1, room[1] + job.memory_mb, room[2] + job.cpu_percent]
        free[node.node_id] = room
    borrowed = {} if ledger is None else {
        team: [u - g for u, g in zip(ledger.usage.get(team, [0] * len(quotas.RESOURCES)),
                                     ledger.guarantees.get(team, (0,) * len(quotas.RESOURCES)))]
        for team in {job.team for job in running}}
    taken: set[int] = set()
    found: list[Preemption] = []
    devices = _Devices(nodes, running)
    candidates_nodes = [n for n in sorted(nodes, key=lambda n: n.node_id) if n.takes_work]
    for ask in waiting:
        if len(taken) >= limit:
            break
        best: tuple[tuple, NodeInfo, list[Running], list[int], tuple[int, int], str, set[str]] | None = None
        for node in candidates_nodes:
            if not placement.matches(ask, node) or not _resources_free(ask, node):
                continue
            need = placement.reservation(node, ask, fallback)
            kind = RECLAIM if _owed(ledger, ask, need) else PRIORITY if priority_gap > 0 else None
            if kind is None:
                continue  # not a job preemption serves: it neither stops others nor takes their room here
            room = free[node.node_id]
            gpus_free = devices.free.get(node.node_id, set())
            fitting = devices.fitting(ask, node.node_id, gpus_free)
            if _fits(room, need) and fitting is not None:
                best = None
                room[0] -= 1
                room[1] -= need[0]
                room[2] -= need[1]
                gpus_free.difference_update(fitting)
                if ledger is not None:  # its team will use that room: count it, as for one served
                    ledger.take(ask.team, quotas.need_of(need[0], need[1], ask.gpus))
                break  # it fits already (or will, once the stops asked end): nothing to stop
            victims, after, gpus_after = _victims(ask, by_node.get(node.node_id, ()), room, need, taken, borrowed,
                                                  kind, priority_gap, devices, node.node_id)
            if victims is None:
                continue
            rank = (len(victims), max(v.priority for v in victims), -min(v.started_at for v in victims),
                    node.node_id)
            if best is None or rank < best[0]:
                best = (rank, node, victims, after, need, kind, gpus_after)
        else:
            if best is None:
                continue
            _, node, victims, after, need, kind, gpus_after = best
            free[node.node_id] = [after[0] - 1, after[1] - need[0], after[2] - need[1]]
            if node.node_id in devices.free:
                devices.free[node.node_id] = gpus_after - set(devices.fitting(ask, node.node_id, gpus_after) or ())
            for victim in victims:
                taken.add(victim.job_id)
                for i, amount in enumerate(victim.amounts):
                    if victim.team in borrowed:
                        borrowed[victim.team][i] -= amount
            if ledger is not None and kind == RECLAIM:
                ledger.take(ask.team, quotas.need_of(need[0], need[1], ask.gpus))
            found.append(Preemption(ask.job_id, ask.team, node.node_id, tuple(v.job_id for v in victims), kind))
    return found


def _owed(ledger: quotas.Ledger | None, ask: Ask, need: tuple[int, int]) -> bool:
    """Whether the job's team has a quota and stays within its guarantee with the job."""
    return (ledger is not None and ask.team in ledger.quotas
            and ledger.refuses(ask.team, quotas.need_of(need[0], need[1], ask.gpus), may_borrow=False) is None)


def _victims(ask: Ask, on_node: Sequence[Running], room: list[int], need: tuple[int, int], taken: set[int],
             borrowed: Mapping[str, list[int]], kind: str, priority_gap: int, devices: _Devices, node_id: str
             ) -> tuple[list[Running] | None, list[int], set[str]]:
    """The fewest victims on one node, lowest priority then youngest first, after which the
    job fits (its GPUs too); (None, room, free GPUs) when no such set exists."""
    def eligible(job: Running) -> bool:
        if not job.preemptible or job.stopping or job.job_id in taken:
            return False
        if kind == RECLAIM:
            left = borrowed.get(job.team)
            return (job.team != ask.team and left is not None
                    and any(amount > 0 and left[i] > 0 for i, amount in enumerate(job.amounts)))
        return job.team == ask.team and job.priority <= ask.priority - priority_gap

    chosen: list[Running] = []
    after = list(room)
    gpus_after = set(devices.free.get(node_id, ()))
    for job in sorted((j for j in on_node if eligible(j)), key=lambda j: (j.priority, -j.started_at, j.job_id)):
        chosen.append(job)
        after = [after[0] + 1, after[1] + job.memory_mb, after[2] + job.cpu_percent]
        gpus_after |= set(job.gpus)
        if _fits(after, need) and devices.fitting(ask, node_id, gpus_after) is not None:
            return chosen, after, gpus_after
    return None, room, set(devices.free.get(node_id, ()))
