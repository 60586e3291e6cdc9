"""The slow retry pace after the control plane refuses this node's credential.

When the registry or the scheduler refuses it (401, or 403 for a credential that may not
act for this node), retrying at the usual pace only fills the servers' logs and this
one, since nothing changes until someone gives the agent a credential that works. So
each loop that talks to them (registration, heartbeat, lease renewal, claims, polling)
logs an ERROR that says what to do, and waits 1 s, doubling up to REFUSED_CAP_SECS,
between tries; the first call that is accepted again brings its usual pace back (and a
line that says so).
"""
from __future__ import annotations

import logging

from corral.shared.backoff import Backoff
from corral.shared.clients import Rejected

log = logging.getLogger(__name__)

REFUSED_INITIAL_SECS = 1.0
REFUSED_CAP_SECS = 60.0


def credential_refused(exc: BaseException) -> bool:
    """A 401 or 403: this node's credential is missing, not valid, revoked or another node's."""
    return isinstance(exc, Rejected) and exc.status in (401, 403)


def advice(node_id: str, has_token: bool, server: str, exc: Rejected) -> str:
    """The cause and the fix, in one line (never the credential itself)."""
    if not has_token:
        return (f"the {server} refused node {node_id}'s request ({exc.status}: {exc.message}): this agent has no "
                f"node credential; issue one on a server host with `corral-scheduler node-token {node_id}` and "
                f"set it as CORRAL_NODE_TOKEN in the agent's environment (e.g. /etc/corral/agent.env), then "
                f"restart the agent")
    return (f"the {server} refused node {node_id}'s credential ({exc.status}: {exc.message}): issue the node's "
            f"current credential on a server host with `corral-scheduler node-token {node_id}` (with "
            f"`--generation N` after `corral node revoke-credential {node_id}`, which prints N) and the "
            f"cluster's CORRAL_AGENT_TOKEN, set it as CORRAL_NODE_TOKEN in the agent's environment (e.g. "
            f"/etc/corral/agent.env), then restart the agent")


class RefusedBackoff:
    """One loop's pace while its calls are refused: `after(exc)` logs the ERROR and
    gives the wait before the next try; `accepted()` after a call that went through."""

    def __init__(self, node_id: str, has_token: bool, server: str, what: str,
                 initial: float = REFUSED_INITIAL_SECS, cap: float = REFUSED_CAP_SECS):
        self.node_id, self.has_token, self.server, self.what = node_id, has_token, server, what
        self.backoff = Backoff(initial, cap)
        self.refusals = 0

    def after(self, exc: Rejected) -> float:
        self.refusals += 1
        delay = self.backoff.next()
        log.error("%s refused: %s; retrying in %.1fs", self.what,
                  advice(self.node_id, self.has_token, self.server, exc), delay)
        return delay

    def accepted(self) -> None:
        if self.refusals:
            log.warning("%s: the %s accepts node %s's credential again (after %d refusal(s))", self.what,
                        self.server, self.node_id, self.refusals)
            self.refusals = 0
            self.backoff.reset()
