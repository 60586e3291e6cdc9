"""What the registry's routes read, and the answers they share.

The database, settings, clock, liveness and credential floors; the answers they share: a
node's and a service's view, the healthy ones."""
from collections.abc import Callable
from dataclasses import dataclass

import peewee

from corral.server import revocations
from corral.shared.errors import NotFound
from corral.shared.timeutil import iso

from .. import contract
from ..liveness import Liveness
from ..models import Node, Service
from ..settings import RegistrySettings


@dataclass(frozen=True)
class RegistryApi:
    """The context every registry route handler gets first. `freshness`: which service
    health checks are recent enough (SERVICE_CHECK_MAX_AGE_SECS), as `liveness` is for
    heartbeats."""

    db: peewee.Database
    settings: RegistrySettings
    clock: Callable[[], float]
    liveness: Liveness
    freshness: Liveness
    floors: revocations.Floors

    def node_view(self, node: Node, now: float) -> contract.Node:
        return contract.Node.model_validate({
            "node_id": node.node_id, "address": node.address, "kind": node.kind,
            "slots": node.slots, "cpus": node.cpus, "memory_mb": node.memory_mb,
            "max_memory_mb": node.max_memory_mb, "max_cpu_percent": node.max_cpu_percent,
            "labels": node.labels or {}, "default_limits": node.default_limits,
            "reserved_memory_mb": node.reserved_memory_mb or 0, "reserved_cpu_percent": node.reserved_cpu_percent or 0,
            "running": node.running, "drained": node.drained, "refusing_work": node.refusing_work,
            "gpus": node.gpus or [], "resources": node.resources or {},
            "status": self.liveness.status(node.last_heartbeat, now),
            "registered_at": iso(node.registered_at), "last_heartbeat": iso(node.last_heartbeat),
        })

    def get_node(self, node_id: str) -> Node:
        node = Node.get_or_none(Node.node_id == node_id)
        if node is None:
            raise NotFound(f"no node {node_id!r}")
        return node

    def healthy_node_ids(self, now: float):
        return Node.select(Node.node_id).where(Node.last_heartbeat >= self.liveness.cutoff(now))

    def service_view(self, svc: Service, node_healthy: bool, now: float) -> contract.Service:
        """A service is healthy when its check passes, recently, and its node is healthy:
        a lost node's services are not served to load balancers, whatever they said
        last (false), nor one whose check is stale (null: unknown)."""
        healthy = svc.healthy
        if healthy is not None and not node_healthy:
            healthy = False
        elif healthy is not None and (svc.checked_at is None or svc.checked_at < self.freshness.cutoff(now)):
            healthy = None
        return contract.Service.model_validate({
            "job_id": svc.job_id, "name": svc.name, "node_id": svc.node_id, "address": svc.address,
            "port": svc.port, "attempt": svc.attempt, "healthy": healthy,
            "node_healthy": node_healthy, "checked_at": iso(svc.checked_at),
            "registered_at": iso(svc.registered_at),
        })

    def one_service_view(self, svc: Service) -> contract.Service:
        node = Node.get_or_none(Node.node_id == svc.node_id)
        now = self.clock()
        return self.service_view(svc, node is not None and self.liveness.status(node.last_heartbeat, now) == "healthy",
                                 now)

    def checked_healthy(self, now: float):
        """The services whose last check, recent enough, passed, on healthy nodes (a where clause)."""
        return ((Service.healthy == True) & (Service.checked_at >= self.freshness.cutoff(now))  # noqa: E712
                & Service.node_id.in_(self.healthy_node_ids(now)))
