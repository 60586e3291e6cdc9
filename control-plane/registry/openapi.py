"""The registry's OpenAPI 3.0.3 document, served at GET /openapi.json.

Keep it true of app.py: tests/test_openapi.py checks every route is listed and
runs schemathesis against a live server to check every answer against it.
"""

from corral.shared.openapi import SECURITY, SECURITY_SCHEMES, json_content_type_everywhere
from corral.shared.openapi import COMMON_SCHEMAS, NAME_PATTERN, TIMESTAMP, error_responses, meta_paths
from corral.shared.openapi import error as _error
from corral.shared.openapi import json_response as _json
from corral.shared.openapi import nullable_timestamp
from corral.shared.openapi import path_param as _path_param
from corral.shared.openapi import query as _query
from corral.shared.openapi import ref as _ref

KIND_PATTERN = r"^[a-z][a-z0-9-]{0,31}$"  # app.KIND_RE
NO_NUL_PATTERN = r"^[^\u0000]*$"


NODE_ID_PARAM = _path_param("node_id", "The node's id.", {"type": "string", "pattern": NAME_PATTERN})
SERVICE_JOB_ID_PARAM = _path_param(
    "job_id", "The id of the service job the record belongs to.",
    {"type": "string", "maxLength": 64, "pattern": NAME_PATTERN})

NULLABLE_TIMESTAMP = nullable_timestamp()

STRING_MAP = {
    "type": "object",
    "maxProperties": 256,
    "additionalProperties": {"type": "string", "maxLength": 32768},
}

SCHEMAS = {
    **COMMON_SCHEMAS,
    "NodeRegistration": {
        "type": "object",
        "description": "What an agent says of its node. Re-registering replaces every field "
                       "(an omitted optional field goes back to its default) and counts as a heartbeat.",
        "additionalProperties": False,
        "required": ["node_id", "address"],
        "properties": {
            "node_id": {"type": "string", "pattern": NAME_PATTERN,
                        "description": "Letters, digits, '.', '_' or '-', at most 128 characters."},
            "address": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": NO_NUL_PATTERN,
                        "description": "Where the node can be reached (host name or IP)."},
            "kind": {"type": "string", "nullable": True, "pattern": KIND_PATTERN, "default": "compute",
                     "description": "A lower-case word; the scheduler places jobs on `compute` nodes only."},
            "slots": {"type": "integer", "nullable": True, "minimum": 1, "maximum": 10000, "default": 1,
                      "description": "Jobs the node can run at once."},
            "cpus": {"type": "integer", "nullable": True, "minimum": 1, "maximum": 100000},
            "memory_mb": {"type": "integer", "nullable": True, "minimum": 0, "maximum": 1099511627776},
            "max_memory_mb": {"type": "integer", "nullable": True, "minimum": 1, "maximum": 1099511627776,
                              "description": "The largest memory limit a job may ask for on this node."},
            "max_cpu_percent": {"type": "integer", "nullable": True, "minimum": 1, "maximum": 10000000,
                                "description": "The largest CPU limit (percent of one CPU) a job may ask for."},
            "labels": dict(STRING_MAP, nullable=True,
                           description="Free-form string labels. Keys are letters, digits, '.', '_' or '-' "
                                       "(at most 128, starting with a letter or digit); values must not "
                                       "contain NUL characters."),
        },
    },
    "Heartbeat": {
        "type": "object",
        "description": "An optional heartbeat body. An empty body is a heartbeat too.",
        "additionalProperties": False,
        "properties": {
            "running": {"type": "integer", "nullable": True, "minimum": 0, "maximum": 1000000,
                        "description": "Jobs the node runs now; omitted or null clears it."},
        },
    },
    "Node": {
        "type": "object",
        "required": ["node_id", "address", "kind", "slots", "cpus", "memory_mb", "max_memory_mb",
                     "max_cpu_percent", "labels", "running", "drained",
                     "status", "registered_at", "last_heartbeat"],
        "properties": {
            "node_id": {"type": "string"},
            "address": {"type": "string"},
            "kind": {"type": "string", "example": "compute"},
            "slots": {"type": "integer", "minimum": 1},
            "cpus": {"type": "integer", "nullable": True},
            "memory_mb": {"type": "integer", "nullable": True},
            "max_memory_mb": {"type": "integer", "nullable": True},
            "max_cpu_percent": {"type": "integer", "nullable": True},
            "drained": {"type": "boolean", "description": "A drained node gets no new work; it finishes what it runs."},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "running": {"type": "integer", "nullable": True, "minimum": 0,
                        "description": "Jobs running, as last reported by the node's heartbeat."},
            "status": {"type": "string", "enum": ["healthy", "unhealthy"],
                       "description": "`unhealthy` once the last heartbeat is older than HEARTBEAT_TIMEOUT_SECS."},
            "registered_at": TIMESTAMP,
            "last_heartbeat": TIMESTAMP,
        },
    },
    "ServiceRegistration": {
        "type": "object",
        "description": "A running service job, recorded by the agent that started it. "
                       "Registering the same job_id again replaces the record.",
        "additionalProperties": False,
        "required": ["job_id", "name", "node_id", "address", "port"],
        "properties": {
            "job_id": {"type": "string", "maxLength": 64, "pattern": NAME_PATTERN, "example": "job-42"},
            "name": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": NO_NUL_PATTERN},
            "node_id": {"type": "string", "pattern": NAME_PATTERN},
            "address": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": NO_NUL_PATTERN},
            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
            "healthy": {"type": "boolean", "nullable": True,
                        "description": "Result of the last health check; null or omitted when unknown."},
            "attempt": {"type": "integer", "nullable": True, "minimum": 0, "maximum": 1000000000,
                        "description": "The job's attempt the service belongs to; an older attempt never "
                                       "replaces a newer one's record."},
            "grant": {"type": "string", "nullable": True, "maxLength": 128,
                      "description": "With tokens, required of a node: the job's `service_grant` from the "
                                     "scheduler, which proves this attempt was handed to this node."},
        },
    },
    "Service": {
        "type": "object",
        "required": ["job_id", "name", "node_id", "address", "port", "attempt", "healthy", "node_healthy",
                     "checked_at", "registered_at"],
        "properties": {
            "job_id": {"type": "string"},
            "name": {"type": "string"},
            "node_id": {"type": "string"},
            "address": {"type": "string"},
            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
            "attempt": {"type": "integer", "nullable": True},
            "healthy": {"type": "boolean", "nullable": True,
                        "description": "The last check passed and the node is healthy; false while the node "
                                       "is unhealthy or unknown, whatever the last check said."},
            "node_healthy": {"type": "boolean", "description": "Whether the service's node is healthy."},
            "checked_at": dict(NULLABLE_TIMESTAMP, description="When `healthy` was last reported."),
            "registered_at": TIMESTAMP,
        },
    },
}

RESPONSES = error_responses(not_found="No such node or service.",
                            conflict="A service record of a newer attempt, or of another node, is in the way.")


def _body(schema_name: str, required: bool = True, description: str | None = None) -> dict:
    body = {"required": required, "content": {"application/json": {"schema": _ref(schema_name)}}}
    if description:
        body["description"] = description
    return body


PATHS = {
    **meta_paths("registry"),
    "/nodes": {
        "post": {
            "operationId": "registerNode", "tags": ["nodes"], "summary": "Register (or re-register) a node.",
            "requestBody": _body("NodeRegistration"),
            "responses": {
                "201": _json(_ref("Node"), "A new node was registered."),
                "200": _json(_ref("Node"), "The node was known; its record was replaced."),
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
                "200": _json({"type": "array", "items": _ref("Node")}, "The matching nodes."),
                "400": _error("BadRequest"),
            },
        },
    },
    "/nodes/{node_id}": {
        "parameters": [NODE_ID_PARAM],
        "get": {
            "operationId": "getNode", "tags": ["nodes"], "summary": "Read one node.",
            "responses": {"200": _json(_ref("Node"), "The node."), "404": _error("NotFound")},
        },
        "delete": {
            "operationId": "deregisterNode", "tags": ["nodes"], "summary": "Forget a node.",
            "responses": {"200": _json(_ref("Node"), "The node as it was before removal."),
                          "404": _error("NotFound")},
        },
    },
    "/nodes/{node_id}/heartbeat": {
        "parameters": [NODE_ID_PARAM],
        "post": {
            "operationId": "heartbeat", "tags": ["nodes"], "summary": "Record that a node is alive.",
            "requestBody": _body("Heartbeat", required=False, description="Optional; may be empty."),
            "responses": {
                "200": _json(_ref("Node"), "The node, now healthy."),
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
            "responses": {"200": _json(_ref("Node"), "The node, drained."), "404": _error("NotFound")},
        },
    },
    "/nodes/{node_id}/undrain": {
        "parameters": [NODE_ID_PARAM],
        "post": {
            "operationId": "undrainNode", "tags": ["nodes"], "summary": "Take a node back into service.",
            "responses": {"200": _json(_ref("Node"), "The node, no longer drained."), "404": _error("NotFound")},
        },
    },
    "/services": {
        "post": {
            "operationId": "registerService", "tags": ["services"], "summary": "Record a running service job.",
            "description": "With tokens, a node records services of its own jobs only: it sends the job's attempt "
                           "and the `service_grant` the scheduler gave it with the job. A record of another node "
                           "is replaced only for a newer attempt (the job moved); an older attempt never replaces "
                           "a newer one's record (409).",
            "requestBody": _body("ServiceRegistration"),
            "responses": {
                "201": _json(_ref("Service"), "A new service record."),
                "200": _json(_ref("Service"), "The job's record existed and was replaced."),
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
                _query("healthy", "`true`: only services whose last check passed, on a healthy node; "
                                  "`false`: the others (failed, never checked, or their node is unhealthy "
                                  "or unknown).",
                       {"type": "string", "enum": ["true", "false"]}),
                _query("name", "Only services with this name.", {"type": "string"}),
                _query("node_id", "Only services on this node.", {"type": "string"}),
            ],
            "responses": {
                "200": _json({"type": "array", "items": _ref("Service")}, "The matching services."),
                "400": _error("BadRequest"),
            },
        },
    },
    "/services/{job_id}": {
        "parameters": [SERVICE_JOB_ID_PARAM],
        "delete": {
            "operationId": "deregisterService", "tags": ["services"], "summary": "Remove a service record.",
            "responses": {"200": _json(_ref("Service"), "The record as it was before removal."),
                          "404": _error("NotFound")},
        },
    },
}

DOCUMENT = {
    "openapi": "3.0.3",
    "info": {
        "title": "Corral registry",
        "version": "0.1.0",
        "description": "Which nodes and services exist and whether they are healthy. "
                       "Every error is JSON `{\"error\": \"...\"}`.",
    },
    "tags": [
        {"name": "nodes", "description": "Compute (and other) nodes, kept alive by heartbeats."},
        {"name": "services", "description": "Running service jobs, for load balancers."},
        {"name": "meta", "description": "Health and this document."},
    ],
    "paths": json_content_type_everywhere(PATHS),
    "components": {"schemas": SCHEMAS, "responses": RESPONSES, "securitySchemes": SECURITY_SCHEMES},
    "security": SECURITY,
}
