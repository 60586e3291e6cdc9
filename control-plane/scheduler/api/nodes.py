"""The scheduler's node routes.

Its copy of the node list with the slots in use, draining and undraining a node (the
registry's flag and the scheduler's own at once), and revoking a node's credentials on
both services."""
from flask import request

from corral.server import auth, revocations
from corral.server.http import read_json_object, request_body
from corral.server.openapi import body as _body
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.routes import Routes
from corral.shared import contract as shared_contract
from corral.shared.contract import respond

from .. import contract, drains, revocation, views
from .context import SchedulerApi

routes = Routes("nodes")


@routes.get("/nodes", access=auth.READ, tag="meta",
            operation_id="listNodes", summary="The nodes the scheduler places on.",
            description="The scheduler's copy of the registry's node list with the slots each node's jobs "
                        "hold, by node id. The registry's GET /nodes has the full records.",
            responses={"200": _json(list[contract.SchedulerNode], "The nodes.")})
def list_nodes(api: SchedulerApi):
    return respond([views.node(*row) for row in api.store.nodes.nodes_and_slots()], of=list[contract.SchedulerNode])


@routes.post("/nodes/<node_id>/drain", access=auth.OPERATOR,
             operation_id="drainNode", summary="Drain a node: no new work goes to it.",
             description="Sets the registry's drain flag, then the scheduler's own copy under the node's "
                         "placement lock: from this answer on, no placement on any worker or replica puts "
                         "new work on the node, and its placed jobs not yet claimed go back to the queue. "
                         "What it runs finishes, or with `deadline_secs` is stopped then (its kill signal and "
                         "grace) and requeued without spending a retry (`ended_by: drain`). "
                         "The registry's own drain route is seen by placement at the "
                         "next refresh of the node list (NODE_REFRESH_SECS). 503 when the registry does not "
                         "answer (nothing is changed).",
             request_body=_body(contract.DrainRequest, required=False),
             responses={
                 "200": _json(contract.NodeDrain, "The node is drained."),
                 "400": _error("BadRequest"),
                 "404": _error("NotFound"),
                 "503": _json(shared_contract.Error, "The registry did not answer; nothing was changed."),
             })
def drain_node(api: SchedulerApi, node_id):
    asked = contract.DrainRequest.check(read_json_object() if request_body().strip() else {})
    return respond(contract.NodeDrain.model_validate(
        drains.set_drained(api.store, api.drain_registry, node_id, True, api.clock(), asked.deadline_secs)))


@routes.post("/nodes/<node_id>/undrain", access=auth.OPERATOR,
             operation_id="undrainNode", summary="Let a drained node take work again.",
             description="The registry's flag, then the scheduler's copy; the node takes work from the answer on.",
             responses={
                 "200": _json(contract.NodeDrain, "The node takes work again."),
                 "400": _error("BadRequest"),
                 "404": _error("NotFound"),
                 "503": _json(shared_contract.Error, "The registry did not answer; nothing was changed."),
             })
def undrain_node(api: SchedulerApi, node_id):
    return respond(contract.NodeDrain.model_validate(
        drains.set_drained(api.store, api.drain_registry, node_id, False, api.clock())))


@routes.post("/nodes/<node_id>/credential/revoke", access=auth.OPERATOR,
             operation_id="revokeNodeCredential",
             summary="Refuse a node's credentials below a generation, on the registry and the scheduler.",
             description="Raises the lowest generation of the node's credential both services accept: by one, "
                         "or to `min_generation` (never lowers it); the registry first, then the scheduler to "
                         "the registry's answer. Older credentials of the node are answered 401 from then on; "
                         "other nodes are not affected. 503 when the registry could not be told: nothing "
                         "changed here, send it again.",
             request_body=_body(revocations.Revocation, required=False),
             responses={"200": _json(revocations.CredentialFloor, "The node's floor now, on both services."),
                        "404": _error("NotFound"), "409": _error("Conflict"),
                        "503": _json(shared_contract.Error, "The registry could not be told; nothing changed here.")})
def revoke_credential(api: SchedulerApi, node_id):
    """Refuse the node's credentials below a generation, on the registry and here."""
    wanted = revocations.revocation_request(node_id, request.get_data(cache=True), read_json_object)
    return respond(revocation.revoke(api.store.db, api.revoke_registry, api.floors, node_id, wanted, api.clock()))
