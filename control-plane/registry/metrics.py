"""The registry's Prometheus metrics (GET /metrics; docs/operations.md, "Metrics").

Counters are updated by the routes after their transaction committed; nodes
and services are counted from the database at scrape time.
"""
from peewee import fn

from corral.server.metrics import DATABASE_GAUGES, Family, database_gauges, gauge, sample_names

from .models import Node, Service

REGISTRATIONS = Family("counter", "corral_registry_registrations", "Node registrations (POST /nodes): a new node "
                       "(outcome=created) or one registering again, as an agent does on every start "
                       "(outcome=updated).", ("outcome",), initial=[("created",), ("updated",)])
HEARTBEATS = Family("counter", "corral_registry_heartbeats", "Heartbeats accepted from known nodes.")

FAMILIES = (REGISTRATIONS, HEARTBEATS)
SCRAPE_GAUGES = ("corral_registry_nodes", "corral_registry_services", *DATABASE_GAUGES)


def exported_names() -> set[str]:
    """Every sample name GET /metrics can carry (for dashboards and their tests)."""
    return sample_names(FAMILIES, SCRAPE_GAUGES)


def registered(is_new: bool) -> None:
    REGISTRATIONS.labels("created" if is_new else "updated").inc()


def heartbeat() -> None:
    HEARTBEATS.inc()


def scrape(healthy_cutoff: float, db=None) -> list:
    """The gauges GET /metrics computes from the database now; a node is healthy when
    its last heartbeat is at or after `healthy_cutoff` (app.Liveness)."""
    total = dict(Node.select(Node.kind, fn.COUNT(Node.node_id)).group_by(Node.kind).tuples())
    healthy = dict(Node.select(Node.kind, fn.COUNT(Node.node_id)).where(Node.last_heartbeat >= healthy_cutoff)
                   .group_by(Node.kind).tuples())
    nodes = {("healthy", "compute"): 0, ("unhealthy", "compute"): 0}
    for kind, count in total.items():
        nodes[("healthy", kind)] = healthy.get(kind, 0)
        nodes[("unhealthy", kind)] = count - healthy.get(kind, 0)
    services = {("true",): 0, ("false",): 0, ("unknown",): 0}
    for state, count in Service.select(Service.healthy, fn.COUNT(Service.job_id)).group_by(Service.healthy).tuples():
        services[({True: "true", False: "false"}.get(state, "unknown"),)] += count
    return [
        gauge("corral_registry_nodes", "Registered nodes by health (a heartbeat within HEARTBEAT_TIMEOUT_SECS) "
              "and kind.", ("status", "kind"), nodes),
        gauge("corral_registry_services", "Recorded services by their last health check (unknown: not checked "
              "yet).", ("healthy",), services),
        *database_gauges(db),
    ]
