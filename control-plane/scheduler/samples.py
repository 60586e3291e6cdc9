"""The charts' samples (GET /stats/history).

What the cluster did in one interval and how it stood at its end, from what the sampler
read (sampler.py). Pure: the counts and rows in, a sample out; the time is passed in.
"""
import math
from collections.abc import Iterable, Sequence

from corral.shared.states import FINAL_STATUSES

from . import contract

SETTLE_SECS = 1.0
FINALS = tuple(sorted(FINAL_STATUSES))


def window(previous_at: float | None, now: float, interval: float) -> tuple[float, float]:
    """The (start, end] of the finish and start times a sample at `now` counts: from the
    previous sample's end on (one interval, when there is none) to SETTLE_SECS ago. A
    report's transaction reads its time before it commits, so a job can commit with a
    `finished_at` a moment older than a sample taken meanwhile: the window lags that
    much, and such a job is counted by the next sample rather than by none."""
    end = now - SETTLE_SECS
    start = end - interval if previous_at is None else previous_at - SETTLE_SECS
    return min(start, end), end


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank `q`-quantile (0 < q <= 1): a value that was observed; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


# A node in a stored sample: one row of these values, a quarter of the size of the
# answer's object (a thousand nodes sampled every 10 s for 2 hours: 40 MB, not 160).
NODE_COLUMNS = ("node_id", "status", "drained", "capacity", "slots_used", "allocatable.memory_mb",
                "allocatable.cpu_percent", "reserved.memory_mb", "reserved.cpu_percent", "used.memory_mb",
                "used.cpu_percent")


def node_row(node: contract.SchedulerNode) -> list:
    """What a sample keeps of a node as GET /nodes shows it (NODE_COLUMNS): health,
    slots, and the memory and CPU its jobs reserve and use."""
    used = node.used or contract.Resources(memory_mb=None, cpu_percent=None)
    return [node.node_id, node.status, node.drained, node.capacity, node.slots_used, node.allocatable.memory_mb,
            node.allocatable.cpu_percent, node.reserved.memory_mb, node.reserved.cpu_percent, used.memory_mb,
            used.cpu_percent]


def node_usage(row: list) -> dict:
    """A stored node row as the answer shows it (contract.NodeSample)."""
    (node_id, status, drained, capacity, slots_used, allocatable_memory, allocatable_cpu, reserved_memory,
     reserved_cpu, used_memory, used_cpu) = row
    return {"node_id": node_id, "status": status, "drained": drained, "capacity": capacity, "slots_used": slots_used,
            "allocatable": {"memory_mb": allocatable_memory, "cpu_percent": allocatable_cpu},
            "reserved": {"memory_mb": reserved_memory, "cpu_percent": reserved_cpu},
            "used": None if used_memory is None else {"memory_mb": used_memory, "cpu_percent": used_cpu}}


def sample(finished: dict[str, int], counts: dict[str, int], waits: Iterable[float],
           nodes: Iterable[contract.SchedulerNode]) -> dict:
    """A sample's data (StatsSample.data): jobs that reached each final status in its
    window (`finished`, by status), pending and running now (`counts`, by status), the
    dispatch latency of the first attempts that started in its window (`waits`, in
    seconds) and every node's usage (node_row)."""
    waits = [max(0.0, wait) for wait in waits]
    return {
        "finished": {status: finished.get(status, 0) for status in FINALS},
        "pending": counts.get("pending", 0), "running": counts.get("running", 0),
        "started": len(waits),
        "dispatch_latency": {"p50_secs": _rounded(percentile(waits, 0.5)),
                             "p95_secs": _rounded(percentile(waits, 0.95))},
        "nodes": [node_row(node) for node in nodes],
    }


def answer(data: dict, node_id: str | None = None, nodes: bool = True) -> dict:
    """A stored sample's data as the answer shows it: every node's usage, only node
    `node_id`'s when one is given, none without `nodes`."""
    rows = [] if not nodes else data["nodes"] if node_id is None else [row for row in data["nodes"]
                                                                         if row[0] == node_id]
    return dict(data, nodes=[node_usage(row) for row in rows])


def _rounded(secs: float | None) -> float | None:
    return None if secs is None else round(secs, 4)
