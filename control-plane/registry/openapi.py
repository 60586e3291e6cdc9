"""The registry's OpenAPI 3.1.0 document, served at GET /openapi.json: its routes,
parameters and answers, with every body schema generated from the models of
contract.py (control-plane/server/openapi.py builds it).

tests/test_openapi.py checks every route is listed and runs schemathesis
against a live server to check every answer against it.
"""

from corral.shared.validate import NAME_PATTERN
from corral.server.openapi import NAME_PATTERN_PARAM, build, error_responses, meta_paths
from corral.server.openapi import body as _body
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.openapi import path_param as _path_param
from corral.server.openapi import query as _query

from corral.server import revocations

from . import contract

NODE_ID_PARAM = _path_param("node_id", "The node's id.", NAME_PATTERN_PARAM)
SERVICE_JOB_ID_PARAM = _path_param(
    "job_id", "The id of the service job the record belongs to.",
    {"type": "string", "maxLength": 64, "pattern": NAME_PATTERN})

RESPONSES = error_responses(not_found="No such node or service.",
                            conflict="A service record of a newer attempt, or of another node, is in the way.")


PATHS = {
    **meta_paths("registry"),
    "/nodes": {
        "post": {
            "operationId": "registerNode", "tags": ["nodes"], "summary": "Register (or re-register) a node.",
            "requestBody": _body(contract.NodeRegistration),
            "responses": {
                "201": _json(contract.Node, "A new node was registered."),
                "200": _json(contract.Node, "The node was known; its record was replaced."),
                "400": _error("BadRequest"),
                "413": _error("PayloadTooLarge"),
                "415": _error("UnsupportedMediaType"),
            },
        },
        "get": {
            "operationId": "listNodes", "tags": ["nodes"], "summary": "List nodes, ordered by node_id.",
            "description": "An empty parameter counts as not given.",
            "parameters": [
                _query("type", "Only nodes of this kind (e.g. `compute`).", {"type": "string"}),
                _query("status", "Only healthy or only unhealthy nodes.",
                       {"type": "string", "enum": ["healthy", "unhealthy"]}),
                _query("drained", "Only drained (`true`) or only undrained (`false`) nodes.",
                       {"type": "string", "enum": ["true", "false"]}),
            ],
            "responses": {
                "200": _json(list[contract.Node], "The matching nodes."),
                "400": _error("BadRequest"),
            },
        },
    },
    "/nodes/{node_id}": {
        "parameters": [NODE_ID_PARAM],
        "get": {
            "operationId": "getNode", "tags": ["nodes"], "summary": "Read one node.",
            "responses": {"200": _json(contract.Node, "The node."), "404": _error("NotFound")},
        },
        "delete": {
            "operationId": "deregisterNode", "tags": ["nodes"], "summary": "Forget a node.",
            "responses": {"200": _json(contract.Node, "The node as it was before removal."),
                          "404": _error("NotFound")},
        },
    },
    "/nodes/{node_id}/heartbeat": {
        "parameters": [NODE_ID_PARAM],
        "post": {
            "operationId": "heartbeat", "tags": ["nodes"], "summary": "Record that a node is alive.",
            "requestBody": _body(contract.Heartbeat, required=False, description="Optional; may be empty."),
            "responses": {
                "200": _json(contract.Node, "The node, now healthy."),
                "400": _error("BadRequest"),
                "404": _error("NotFound"),
                "413": _error("PayloadTooLarge"),
                "415": _error("UnsupportedMediaType"),
            },
        },
    },
    "/nodes/{node_id}/drain": {
        "parameters": [NODE_ID_PARAM],
        "post": {
            "operationId": "drainNode", "tags": ["nodes"], "summary": "Drain a node.",
            "description": "The scheduler places no new work on a drained node (its pending jobs move to other "
                           "nodes); the jobs it runs finish. Draining survives the agent's re-registration.",
            "responses": {"200": _json(contract.Node, "The node, drained."), "404": _error("NotFound")},
        },
    },
    "/nodes/{node_id}/undrain": {
        "parameters": [NODE_ID_PARAM],
        "post": {
            "operationId": "undrainNode", "tags": ["nodes"], "summary": "Take a node back into service.",
            "responses": {"200": _json(contract.Node, "The node, no longer drained."), "404": _error("NotFound")},
        },
    },
    "/nodes/{node_id}/credential/revoke": {
        "parameters": [NODE_ID_PARAM],
        "post": {
            "operationId": "revokeNodeCredential", "tags": ["nodes"],
            "summary": "Refuse a node's credentials below a generation.",
            "description": "Raises the lowest generation of the node's credential the registry accepts: by one, or "
                           "to `min_generation` (never lowers it). Older credentials of the node are answered 401 "
                           "from then on; other nodes are not affected. The scheduler's route of the same name "
                           "does this here and there at once.",
            "requestBody": _body(revocations.Revocation, required=False),
            "responses": {"200": _json(revocations.CredentialFloor, "The node's floor now."),
                          "400": _error("BadRequest"), "404": _error("NotFound"),
                          "409": _error("Conflict"), "415": _error("UnsupportedMediaType")},
        },
    },
    "/sd/prometheus/services": {
        "get": {
            "operationId": "discoverServices", "tags": ["discovery"],
            "summary": "Prometheus HTTP service discovery: the healthy service jobs.",
            "description": "For `http_sd_configs`. The services whose last check passed, on healthy nodes, each as a "
                           "target group (`address:port`) with `__meta_corral_*` labels: service, job_id, attempt, "
                           "node_id, node_kind, node_drained and the node's labels (`__meta_corral_label_<name>`). "
                           "The read-only token (`CORRAL_READ_TOKEN`) may read it.",
            "responses": {"200": _json(list[contract.TargetGroup], "The target groups.")},
        },
    },
    "/sd/prometheus/nodes": {
        "get": {
            "operationId": "discoverNodes", "tags": ["discovery"],
            "summary": "Prometheus HTTP service discovery: the healthy nodes.",
            "description": "For `http_sd_configs`. Every healthy node (drained ones too) as a target group at "
                           "`address:SD_NODE_PORT` (9100, node_exporter's, by default), with `__meta_corral_*` "
                           "labels: node_id, node_kind, node_drained and the node's labels.",
            "responses": {"200": _json(list[contract.TargetGroup], "The target groups.")},
        },
    },
    "/services": {
        "post": {
            "operationId": "registerService", "tags": ["services"], "summary": "Record a running service job.",
            "description": "With tokens, a node records services of its own jobs only: it sends the job's attempt "
                           "and the `service_grant` the scheduler gave it with the job. A record of another node "
                           "is replaced only for a newer attempt (the job moved); an older attempt never replaces "
                           "a newer one's record (409).",
            "requestBody": _body(contract.ServiceRegistration),
            "responses": {
                "201": _json(contract.Service, "A new service record."),
                "200": _json(contract.Service, "The job's record existed and was replaced."),
                "409": _error("Conflict"),
                "400": _error("BadRequest"),
                "413": _error("PayloadTooLarge"),
                "415": _error("UnsupportedMediaType"),
            },
        },
        "get": {
            "operationId": "listServices", "tags": ["services"],
            "summary": "List services, ordered by name then job_id (what a load balancer reads).",
            "description": "An empty parameter counts as not given.",
            "parameters": [
                _query("healthy", "`true`: only services whose last check passed at most "
                                  "SERVICE_CHECK_MAX_AGE_SECS ago, on a healthy node; `false`: the others (failed, "
                                  "never checked, checked too long ago, or their node is unhealthy or unknown).",
                       {"type": "string", "enum": ["true", "false"]}),
                _query("name", "Only services with this name.", {"type": "string"}),
                _query("node_id", "Only services on this node.", {"type": "string"}),
            ],
            "responses": {
                "200": _json(list[contract.Service], "The matching services."),
                "400": _error("BadRequest"),
            },
        },
    },
    "/services/{job_id}": {
        "parameters": [SERVICE_JOB_ID_PARAM],
        "delete": {
            "operationId": "deregisterService", "tags": ["services"], "summary": "Remove a service record.",
            "parameters": [_query("attempt", "Remove the record only while it is this attempt's (an agent removing "
                                             "the record of an attempt that ended never removes a newer one's); "
                                             "`409` otherwise.",
                                  {"type": "integer", "minimum": 0, "maximum": 1_000_000_000})],
            "responses": {"200": _json(contract.Service, "The record as it was before removal."),
                          "400": _error("BadRequest"), "404": _error("NotFound"), "409": _error("Conflict")},
        },
    },
}

DOCUMENT = build(
    info={
        "title": "Corral registry",
        "version": "0.1.0",
        "description": "Which nodes and services exist and whether they are healthy. "
                       "Every error is JSON `{\"error\": \"...\"}`.",
    },
    tags=[
        {"name": "nodes", "description": "Compute (and other) nodes, kept alive by heartbeats."},
        {"name": "services", "description": "Running service jobs, for load balancers."},
        {"name": "discovery", "description": "Prometheus HTTP service discovery of services and nodes."},
        {"name": "meta", "description": "Health and this document."},
    ],
    paths=PATHS,
    responses=RESPONSES,
)
