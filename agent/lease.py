"""The agent's side of its lease with the scheduler.

When it was last renewed, for how long, and when the lease thread renews it next.

A renewal counts from when it was *sent*, not answered: the scheduler records it on
arrival, which is later, so the agent's deadline always comes before the one the
scheduler requeues by. A claim that handed out jobs renewed it too (the scheduler
touches the lease in the claim's transaction). While the lease is lapsed the agent
stops its run jobs (Membership.fence_once) and claims nothing while it holds any.

Pure state and arithmetic, time passed in; the lock is there because the lease, the
claim and the work loop threads all bring evidence.
"""
from __future__ import annotations

import threading

# An agent that holds no job needs no lease: a claim that hands it jobs renews the
# lease on the scheduler, and the agent counts it from when it sent the claim. It
# renews this seldom only to learn from the answer of attempts the scheduler
# believes run here (a claim whose answer was lost), which it then reconciles.
# (A fleet of idle agents renewing every heartbeat was much of an idle scheduler's
# CPU: docs/benchmarks.md.)
IDLE_RENEW_SECS = 60.0


class Lease:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent_at: float | None = None  # the latest request that renewed it was sent then
        self.secs: float | None = None     # the period the scheduler gave
        self._tried_at: float | None = None  # the lease thread's last try

    def evidence(self, sent_at: float) -> None:
        """A request sent at `sent_at` renewed the lease (a renewal, or a claim that
        handed out jobs); the latest such time counts, whichever thread got its answer
        first."""
        with self._lock:
            if self.sent_at is None or sent_at > self.sent_at:
                self.sent_at = sent_at

    def renewed(self, sent_at: float, answer: object) -> object:
        """A renewal sent at `sent_at` was answered `answer`: its period and evidence
        taken; what it lists as running here returned (agent._end_stale reads it).
        Raises ValueError for an answer without a usable `lease_secs` (nothing taken)."""
        if not isinstance(answer, dict):
            raise ValueError(f"the scheduler answered a lease that is not an object: {answer!r}")
        lease_secs = answer.get("lease_secs")
        if isinstance(lease_secs, bool) or not isinstance(lease_secs, (int, float)) or lease_secs <= 0:
            raise ValueError(f"the scheduler answered a lease without a usable lease_secs: {answer!r}")
        self.secs = float(lease_secs)
        self.evidence(sent_at)
        return answer.get("running")

    def lapsed(self, now: float) -> bool:
        """No renewal for a whole period: the scheduler may hand this node's run jobs to
        another node soon. Never renewed yet: not lapsed (nothing was handed out under
        a lease)."""
        if self.sent_at is None or self.secs is None:
            return False
        return now - self.sent_at > self.secs

    def due(self, now: float, every_beat: bool) -> bool:
        """Whether the lease thread renews at this beat: at every beat when
        `every_beat` (the agent holds work, or polls: no claim renews the lease
        then), else once every IDLE_RENEW_SECS."""
        if every_beat or self._tried_at is None:
            return True
        return now - self._tried_at >= IDLE_RENEW_SECS

    def tried(self, now: float) -> None:
        self._tried_at = now

    def renew_soon(self) -> None:
        """Renew at the lease thread's next beat (a claim's answer was lost: the
        renewal's answer lists what it may have handed out)."""
        self._tried_at = None
