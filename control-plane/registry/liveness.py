"""Which heartbeats (and service health checks) count as recent enough.

With a grace after a registry restart so that nodes are not declared lost because the
registry itself was away."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Liveness:
    """Which heartbeats count as recent enough for a node to be healthy.

    A node is healthy while its last heartbeat is at most `timeout` seconds old.
    After a registry restart, nodes that were healthy when it stopped (judged by
    `last_up`, the newest heartbeat it had recorded) stay healthy for one more
    timeout from the start, so they can heartbeat again before any is declared
    unhealthy because the registry itself was away.
    """

    timeout: float
    started_at: float = 0.0
    last_up: float | None = None

    def cutoff(self, now: float) -> float:
        cutoff = now - self.timeout
        if self.last_up is not None and now <= self.started_at + self.timeout:
            cutoff = min(cutoff, self.last_up - self.timeout)
        return cutoff

    def status(self, last_heartbeat: float, now: float) -> str:
        return "healthy" if last_heartbeat >= self.cutoff(now) else "unhealthy"
