"""Whether a node is alive: the one place that decides it, for each of the two
questions the scheduler asks (docs/guarantees.md, "Which signal says a node is alive").

- May it get new work? The registry's health as copied into the scheduler's node
  list: healthy (a heartbeat within HEARTBEAT_TIMEOUT_SECS), a compute node, not
  drained, its agent not refusing work. Every agent heartbeats the registry every
  few seconds, busy or idle, so this is what tells an idle node is gone.
- Is its running work lost? The node's lease with the scheduler: lapsed for
  HEARTBEAT_TIMEOUT_SECS + NODE_LOST_GRACE_SECS. The agent stops its jobs on that
  same lease, so only the lease makes a requeue safe.

Pure: the statuses come in, the decision goes out. The node list keeps a healthy
drained node as status `drained` (one column that placement filters on); `listed`
and `as_registry` convert, and `taking_new_work` is `takes_new_work` as SQL over
that list, for the queries that must agree with it.
"""
from __future__ import annotations

from typing import Any

HEALTHY = "healthy"
UNHEALTHY = "unhealthy"
DRAINED = "drained"  # the node list's status of a healthy drained node
COMPUTE = "compute"


def takes_new_work(status: str, drained: bool, refusing_work: str | None, kind: str = COMPUTE) -> bool:
    """Whether placement may give the node a job: the registry's `status` and
    `drained`, the agent's `refusing_work` (None: it takes work), the node's kind."""
    return status == HEALTHY and not drained and refusing_work is None and kind == COMPUTE


def why_no_new_work(status: str, drained: bool, refusing_work: str | None, kind: str = COMPUTE) -> str:
    """Why a node takes no new work, as a phrase after its name (for the event of a
    job moved off it); '' when it does."""
    if kind != COMPUTE:
        return f"is a {kind} node"
    if status != HEALTHY:
        return f"is {status}"
    if drained:
        return "is drained"
    if refusing_work is not None:
        return f"takes no new work: {refusing_work}"
    return ""


def listed(status: str, drained: bool) -> str:
    """The node list's status for the registry's `status` and `drained`."""
    return DRAINED if status == HEALTHY and drained else status


def as_registry(listed_status: str) -> tuple[str, bool]:
    """The registry's (status, drained) for a node list status."""
    return (HEALTHY, True) if listed_status == DRAINED else (listed_status, False)


def redrained(listed_status: str, drained: bool) -> str:
    """A node list status once the node is drained (or undrained) through the scheduler."""
    return listed(as_registry(listed_status)[0], drained)


def taking_new_work(node: Any) -> Any:
    """`takes_new_work` over the node list (`node`: its peewee model), as a condition
    for a query: a drained node's status there is not `healthy`."""
    return (node.status == HEALTHY) & (node.kind == COMPUTE) & node.refusing_work.is_null()


def lease_deadline(now: float, heartbeat_timeout_secs: float, node_lost_grace_secs: float) -> float:
    """A node whose lease was last renewed before this is lost: its running jobs are
    requeued (or failed). The agent stops them after heartbeat_timeout_secs without a
    renewal, so the grace is what keeps two copies from running at once."""
    return now - heartbeat_timeout_secs - node_lost_grace_secs
