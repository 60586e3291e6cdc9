"""The registry's Prometheus HTTP service discovery routes (`http_sd_configs`).

The healthy service jobs and the healthy nodes as target groups (labels: discovery.py)."""
from corral.server import auth
from corral.server.openapi import json_response as _json
from corral.server.routes import Routes
from corral.shared.contract import respond

from .. import contract, discovery
from ..models import Node, Service
from .context import RegistryApi

routes = Routes("discovery")


def node_meta(node: Node) -> dict[str, str]:
    return discovery.node_labels(node.node_id, node.kind, node.drained, node.labels or {})


@routes.get("/sd/prometheus/services", access=auth.READ,
            operation_id="discoverServices", summary="Prometheus HTTP service discovery: the healthy service jobs.",
            description="For `http_sd_configs`. The services whose last check passed, on healthy nodes, each as a "
                        "target group (`address:port`) with `__meta_corral_*` labels: service, job_id, attempt, "
                        "node_id, node_kind, node_drained and the node's labels (`__meta_corral_label_<name>`). "
                        "The read-only token (`CORRAL_READ_TOKEN`) may read it.",
            responses={"200": _json(list[contract.TargetGroup], "The target groups.")})
def sd_services(api: RegistryApi):
    """The service jobs whose last check, recent enough, passed, on healthy nodes."""
    now = api.clock()
    nodes = {n.node_id: n for n in Node.select().where(Node.last_heartbeat >= api.liveness.cutoff(now))}
    query = Service.select().where(api.checked_healthy(now) & Service.node_id.in_(list(nodes))).order_by(
        Service.name, Service.job_id)
    groups = [discovery.service_group(s.job_id, s.name, s.address, s.port, s.attempt, node_meta(nodes[s.node_id]))
              for s in query]
    return respond([contract.TargetGroup.model_validate(g) for g in groups], of=list[contract.TargetGroup])


@routes.get("/sd/prometheus/nodes", access=auth.READ,
            operation_id="discoverNodes", summary="Prometheus HTTP service discovery: the healthy nodes.",
            description="For `http_sd_configs`. Every healthy node (drained ones too) as a target group at "
                        "`address:SD_NODE_PORT` (9100, node_exporter's, by default), with `__meta_corral_*` "
                        "labels: node_id, node_kind, node_drained and the node's labels.",
            responses={"200": _json(list[contract.TargetGroup], "The target groups.")})
def sd_nodes(api: RegistryApi):
    """The healthy nodes (drained ones too: they still run, and export), at SD_NODE_PORT."""
    query = Node.select().where(Node.last_heartbeat >= api.liveness.cutoff(api.clock())).order_by(Node.node_id)
    groups = [discovery.node_group(n.address, api.settings.sd_node_port, node_meta(n)) for n in query]
    return respond([contract.TargetGroup.model_validate(g) for g in groups], of=list[contract.TargetGroup])
