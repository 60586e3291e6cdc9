"""Draining a node through the scheduler, in force from its answer on.

The registry keeps the operator's drain flag, and the scheduler copies it with the
node list every NODE_REFRESH_SECS; a drain said to the registry alone is seen by
placement at the next refresh. Through the scheduler the flag is written to the
registry first (nothing changes when that fails) and then to the scheduler's own
node row under the node's placement lock (Nodes.set_drained), so no placement that
starts after the answer, on any worker or replica, puts work on the node.

A drain with a deadline asks the scheduler's own rows to stop the node's running jobs
at that time (their `stop_reason` and `stop_at`): the lease answer tells the agent,
which stops each with its kill signal and grace and reports it requeued
(`ended_by: drain`); a job still running past the deadline, its grace and
lifecycle.WATCHER_SLACK_SECS is requeued by the scheduler itself
(store/actions.py). An undrain takes the stops back."""
from corral.shared.clients import ClientError, Rejected, RegistryClient
from corral.shared.errors import BadRequest, NotFound, Unavailable
from corral.shared.timeutil import iso

from .store import Store
from .validation import NODE_ID_RE


def set_drained(store: Store, registry: RegistryClient, node_id: str, drained: bool, now: float,
                deadline_secs: float | None = None) -> dict:
    """Drain (or undrain) `node_id`; with `deadline_secs`, the jobs it runs are stopped
    that long from `now` (and requeued). The answer `{"node_id", "drained", "deadline",
    "stopping"}`."""
    if not NODE_ID_RE.match(node_id):
        raise BadRequest("the node id must be letters, digits, '.', '_' or '-' (at most 128)")
    action = "drain" if drained else "undrain"
    try:
        if drained:
            registry.drain(node_id)
        else:
            registry.undrain(node_id)
    except Rejected as exc:
        if exc.status == 404:
            raise NotFound(exc.message) from None  # the registry's own words
        raise Unavailable(f"the registry refused the {action} ({exc.status}: {exc.message}); "
                          "nothing was changed") from None
    except ClientError as exc:
        raise Unavailable(f"the registry did not answer the {action} ({exc}); nothing was changed") from None
    stop_at = None if deadline_secs is None else now + deadline_secs
    stopping = store.nodes.set_drained(node_id, drained, now, stop_at)
    return {"node_id": node_id, "drained": drained, "deadline": iso(stop_at) if drained else None,
            "stopping": stopping or 0}
