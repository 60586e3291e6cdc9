"""Placement policy: round-robin over healthy nodes with free slots.

Pure: no database, no HTTP, no clock. The store hands in what it read inside
its transaction and writes back what `plan` decides, so other policies (spread,
bin-pack by memory, labels) can sit beside this one with the same signature.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeSlots:
    node_id: str
    free: int  # capacity (min of MAX_JOBS_PER_NODE and the node's slots) minus jobs it holds


@dataclass(frozen=True)
class Unplaced:
    job_id: int
    instance_id: str | None = None  # pins the job to this node


def next_node(order: list[str], free: dict[str, int], cursor: str | None) -> str | None:
    """The first node after `cursor` (wrapping around) that has a free slot."""
    if not order:
        return None
    start = 0
    if cursor is not None:
        # Resume after the cursor even if that node has since gone away.
        start = next((i for i, node_id in enumerate(order) if node_id > cursor), 0)
    for offset in range(len(order)):
        node_id = order[(start + offset) % len(order)]
        if free[node_id] > 0:
            return node_id
    return None


def plan(jobs: list[Unplaced], nodes: list[NodeSlots], cursor: str | None
         ) -> tuple[list[tuple[int, str]], str | None]:
    """Assign `jobs` in order; returns [(job_id, node_id)] and the new round-robin cursor.

    A job that does not fit stays out of the result and waits for the next
    pass. A pinned job goes only to its node and does not move the cursor.
    """
    order = sorted(n.node_id for n in nodes)
    free = {n.node_id: max(0, n.free) for n in nodes}
    assignments: list[tuple[int, str]] = []
    for job in jobs:
        if job.instance_id is not None:
            target = job.instance_id if free.get(job.instance_id, 0) > 0 else None
        else:
            target = next_node(order, free, cursor)
            if target is not None:
                cursor = target
        if target is not None:
            free[target] -= 1
            assignments.append((job.job_id, target))
    return assignments, cursor
