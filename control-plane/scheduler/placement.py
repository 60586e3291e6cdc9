"""Placement policy: round-robin over healthy nodes with free slots.

Pure: no database, no HTTP, no clock. The store hands in what it read inside
its transaction and writes back what `plan` decides, so other policies (spread,
bin-pack by memory, labels) can sit beside this one with the same signature.
"""
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeSlots:
    node_id: str
    free: int  # capacity (min of MAX_JOBS_PER_NODE and the node's slots) minus jobs it holds
    max_memory_mb: int | None = None    # the largest limits a job may ask for; None: unknown
    max_cpu_percent: int | None = None


@dataclass(frozen=True)
class Unplaced:
    job_id: int
    instance_id: str | None = None  # pins the job to this node
    memory_mb: int | None = None    # requested limits; None: the node's default
    cpu_percent: int | None = None


def fits(job: Unplaced, node: NodeSlots) -> bool:
    """Whether the node allows the limits the job asks for (an unknown maximum allows all)."""
    return (_within(job.memory_mb, node.max_memory_mb)
            and _within(job.cpu_percent, node.max_cpu_percent))


def _within(requested: int | None, maximum: int | None) -> bool:
    return requested is None or maximum is None or requested <= maximum


def next_node(order: list[str], free: dict[str, int], cursor: str | None,
              allowed: Callable[[str], bool] = lambda node_id: True) -> str | None:
    """The first allowed node after `cursor` (wrapping around) that has a free slot."""
    if not order:
        return None
    start = 0
    if cursor is not None:
        # Resume after the cursor even if that node has since gone away.
        start = next((i for i, node_id in enumerate(order) if node_id > cursor), 0)
    for offset in range(len(order)):
        node_id = order[(start + offset) % len(order)]
        if free[node_id] > 0 and allowed(node_id):
            return node_id
    return None


def plan(jobs: list[Unplaced], nodes: list[NodeSlots], cursor: str | None
         ) -> tuple[list[tuple[int, str]], str | None]:
    """Assign `jobs` in order; returns [(job_id, node_id)] and the new round-robin cursor.

    A job that does not fit stays out of the result and waits for the next
    pass. A pinned job goes only to its node and does not move the cursor. A
    node whose maximum limits are below what a job asks for is skipped for it.
    """
    by_id = {n.node_id: n for n in nodes}
    order = sorted(by_id)
    free = {n.node_id: max(0, n.free) for n in nodes}
    assignments: list[tuple[int, str]] = []
    for job in jobs:
        if job.instance_id is not None:
            node = by_id.get(job.instance_id)
            target = job.instance_id if node and free[node.node_id] > 0 and fits(job, node) else None
        else:
            target = next_node(order, free, cursor, lambda node_id: fits(job, by_id[node_id]))
            if target is not None:
                cursor = target
        if target is not None:
            free[target] -= 1
            assignments.append((job.job_id, target))
    return assignments, cursor
