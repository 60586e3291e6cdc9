"""The registry's node routes.

Agents register and heartbeat their node; operators read, drain, forget nodes and revoke
their credentials."""
from flask import request

from corral.server import auth, revocations
from corral.server.http import query_choice, read_json_object
from corral.server.openapi import body as _body
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.openapi import query as _query
from corral.server.routes import Routes
from corral.shared.contract import respond
from corral.shared.errors import NotFound

from .. import contract, metrics
from ..models import Node, NodeCredential
from .context import RegistryApi

routes = Routes("nodes")


@routes.post("/nodes", access=auth.agent(auth.NODE_IN_BODY),
             operation_id="registerNode", summary="Register (or re-register) a node.",
             request_body=_body(contract.NodeRegistration),
             responses={
                 "201": _json(contract.Node, "A new node was registered."),
                 "200": _json(contract.Node, "The node was known; its record was replaced."),
             })
def register_node(api: RegistryApi):
    registration = contract.NodeRegistration.check(read_json_object())
    node_id, fields = registration.node_id, registration.columns()
    auth.require_node(node_id)
    now = api.clock()
    with api.db.atomic():
        is_new = Node.get_or_none(Node.node_id == node_id) is None
        # One upsert: two registrations at once (an agent retrying, a replica each)
        # both succeed; a re-registration updates what the node says of itself and
        # keeps registered_at and the operator's drain.
        Node.insert(node_id=node_id, registered_at=now, last_heartbeat=now, **fields).on_conflict(
            conflict_target=[Node.node_id], update={"last_heartbeat": now, **fields}).execute()
        node = Node.get_by_id(node_id)
    metrics.registered(is_new)  # after the commit
    return respond(api.node_view(node, now), 201 if is_new else 200)


@routes.get("/nodes", access=auth.EITHER,
            operation_id="listNodes", summary="List nodes, ordered by node_id.",
            description="An empty parameter counts as not given.",
            parameters=[
                _query("type", "Only nodes of this kind (e.g. `compute`).", {"type": "string"}),
                _query("status", "Only healthy or only unhealthy nodes.",
                       {"type": "string", "enum": ["healthy", "unhealthy"]}),
                _query("drained", "Only drained (`true`) or only undrained (`false`) nodes.",
                       {"type": "string", "enum": ["true", "false"]}),
            ],
            responses={
                "200": _json(list[contract.Node], "The matching nodes."),
                "400": _error("BadRequest"),
            })
def list_nodes(api: RegistryApi):
    kind = request.args.get("type") or None
    status = query_choice("status", ("healthy", "unhealthy"))
    drained = query_choice("drained", ("true", "false"))
    now = api.clock()
    query = Node.select().order_by(Node.node_id)
    if kind:
        query = query.where(Node.kind == kind)
    if status == "healthy":
        query = query.where(Node.last_heartbeat >= api.liveness.cutoff(now))
    elif status == "unhealthy":
        query = query.where(Node.last_heartbeat < api.liveness.cutoff(now))
    if drained is not None:
        query = query.where(Node.drained == (drained == "true"))
    return respond([api.node_view(n, now) for n in query], of=list[contract.Node])


@routes.get("/nodes/<node_id>", access=auth.EITHER,
            operation_id="getNode", summary="Read one node.",
            responses={"200": _json(contract.Node, "The node."), "404": _error("NotFound")})
def read_node(api: RegistryApi, node_id):
    return respond(api.node_view(api.get_node(node_id), api.clock()))


@routes.post("/nodes/<node_id>/heartbeat", access=auth.agent(auth.NODE_IN_PATH),
             operation_id="heartbeat", summary="Record that a node is alive.",
             request_body=_body(contract.Heartbeat, required=False, description="Optional; may be empty."),
             responses={
                 "200": _json(contract.Node, "The node, now healthy."),
                 "404": _error("NotFound"),
             })
def heartbeat(api: RegistryApi, node_id):
    beat = contract.Heartbeat.check(read_json_object() if request.get_data(cache=True).strip() else {})
    now = api.clock()
    with api.db.atomic():
        # Every heartbeat says the node's whole state: one without `refusing_work` clears it.
        changed = Node.update(last_heartbeat=now, running=beat.running, refusing_work=beat.refusing_work).where(
            Node.node_id == node_id).execute()
    if not changed:
        raise NotFound(f"no node {node_id!r}; register it first (POST /nodes)")
    metrics.heartbeat()
    return respond(api.node_view(api.get_node(node_id), now))


def set_drained(api: RegistryApi, node_id: str, drained: bool):
    with api.db.atomic():
        if not Node.update(drained=drained).where(Node.node_id == node_id).execute():
            raise NotFound(f"no node {node_id!r}")
    return respond(api.node_view(api.get_node(node_id), api.clock()))


@routes.post("/nodes/<node_id>/drain", access=auth.OPERATOR,
             operation_id="drainNode", summary="Drain a node.",
             description="The scheduler places no new work on a drained node (its pending jobs move to other "
                         "nodes); the jobs it runs finish. Draining survives the agent's re-registration.",
             responses={"200": _json(contract.Node, "The node, drained."), "404": _error("NotFound")})
def drain(api: RegistryApi, node_id):
    """No new work goes to the node; what it runs finishes."""
    return set_drained(api, node_id, True)


@routes.post("/nodes/<node_id>/undrain", access=auth.OPERATOR,
             operation_id="undrainNode", summary="Take a node back into service.",
             responses={"200": _json(contract.Node, "The node, no longer drained."), "404": _error("NotFound")})
def undrain(api: RegistryApi, node_id):
    return set_drained(api, node_id, False)


@routes.delete("/nodes/<node_id>", access=auth.OPERATOR,
               operation_id="deregisterNode", summary="Forget a node.",
               responses={"200": _json(contract.Node, "The node as it was before removal."),
                          "404": _error("NotFound")})
def deregister_node(api: RegistryApi, node_id):
    node = api.get_node(node_id)
    with api.db.atomic():
        node.delete_instance()
    return respond(api.node_view(node, api.clock()))


@routes.post("/nodes/<node_id>/credential/revoke", access=auth.OPERATOR,
             operation_id="revokeNodeCredential", summary="Refuse a node's credentials below a generation.",
             description="Raises the lowest generation of the node's credential the registry accepts: by one, or "
                         "to `min_generation` (never lowers it). Older credentials of the node are answered 401 "
                         "from then on; other nodes are not affected. The scheduler's route of the same name "
                         "does this here and there at once.",
             request_body=_body(revocations.Revocation, required=False),
             responses={"200": _json(revocations.CredentialFloor, "The node's floor now."),
                        "404": _error("NotFound"),
                        "409": _error("Conflict")})
def revoke_credential(api: RegistryApi, node_id):
    """Refuse the node's credentials below a generation, here (control-plane/server/revocations.py)."""
    wanted = revocations.revocation_request(node_id, request.get_data(cache=True), read_json_object)
    return respond(revocations.revoke(api.db, NodeCredential, api.floors, node_id, wanted, api.clock()))
