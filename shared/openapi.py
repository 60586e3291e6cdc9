"""Building blocks of the services' OpenAPI 3.0.3 documents (served at /openapi.json).

Each service's openapi.py describes its own routes with these; the parts every
service shares (errors, /healthz, /openapi.json, timestamps) are defined here once.
"""

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"  # shared.validate.NAME_RE

TIMESTAMP = {"type": "string", "format": "date-time",
             "description": "ISO-8601 UTC, milliseconds (e.g. 2026-11-29T08:00:00.000Z)."}


# With tokens (README: Security) every route but /healthz, /readyz, /metrics, /openapi.json
# and the dashboard's files takes a bearer token: the operator token, or a node's
# credential (`<node_id>.<hex HMAC>`) for the agents' routes. Without tokens (a server
# on loopback only) none is checked: hence the empty alternative.
SECURITY_SCHEMES = {"bearer": {"type": "http", "scheme": "bearer",
                               "description": "CORRAL_API_TOKEN (operators) or a node's CORRAL_NODE_TOKEN "
                                              "(agents, for their own node only)."}}
SECURITY = [{"bearer": []}, {}]


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def json_response(schema: dict, description: str, headers: dict | None = None) -> dict:
    response = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        response["headers"] = headers
    return response


def error(name: str) -> dict:
    """A reference to one of the shared error responses (see error_responses)."""
    return {"$ref": f"#/components/responses/{name}"}


def query(name: str, description: str, schema: dict) -> dict:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


def path_param(name: str, description: str, schema: dict) -> dict:
    return {"name": name, "in": "path", "required": True, "description": description, "schema": schema}


def nullable_timestamp(description: str | None = None) -> dict:
    stamp = dict(TIMESTAMP, nullable=True)
    if description:
        stamp["description"] = description
    return stamp


COMMON_SCHEMAS = {
    "Error": {
        "type": "object",
        "description": "Every error answer.",
        "required": ["error"],
        "properties": {"error": {"type": "string", "description": "What was wrong, for a human."}},
    },
    "Readiness": {
        "type": "object",
        "required": ["status", "checks"],
        "properties": {
            "status": {"type": "string", "enum": ["ready", "not ready"]},
            "error": {"type": "string", "description": "Why it is not ready."},
            "checks": {"type": "object", "description": "What was checked, and what it found."},
        },
    },
    "Health": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string", "enum": ["ok"]}},
    },
}


def error_responses(not_found: str, conflict: str | None = None) -> dict:
    responses = {
        "BadRequest": json_response(ref("Error"), "The request is malformed (bad field, parameter or JSON)."),
        "NotFound": json_response(ref("Error"), not_found),
        "PayloadTooLarge": json_response(ref("Error"), "The body is larger than CORRAL_MAX_BODY_BYTES "
                                                       "(default 2 MiB)."),
        "UnsupportedMediaType": json_response(ref("Error"), "Content-Type is not application/json (which every "
                                                            "POST, PUT, PATCH and DELETE must say, with or "
                                                            "without a body)."),
    }
    if conflict:
        responses["Conflict"] = json_response(ref("Error"), conflict)
    return responses


def json_content_type_everywhere(paths: dict) -> dict:
    """Every state-changing operation takes `Content-Type: application/json` only, a
    body-less one too (shared/guards.py): give those an optional empty JSON body and
    document the 415 on all of them. Returns `paths`."""
    for operations in paths.values():
        for method, operation in operations.items():
            if method not in ("post", "put", "patch", "delete"):
                continue
            operation.setdefault("requestBody", {
                "required": False,
                "description": "None needed; the request must still say Content-Type: application/json.",
                "content": {"application/json": {"schema": {"type": "object"}}}})
            operation["responses"].setdefault("415", error("UnsupportedMediaType"))
    return paths


def meta_paths(service: str) -> dict:
    return {
        "/healthz": {
            "get": {
                "operationId": "healthz", "tags": ["meta"], "summary": "Liveness check.",
                "responses": {"200": json_response(ref("Health"), f"The {service} is serving.")},
            },
        },
        "/readyz": {
            "get": {
                "operationId": "readyz", "tags": ["meta"], "summary": "Readiness check.",
                "description": "200 when the database answers (the scheduler also needs a node list refreshed "
                               "within three NODE_REFRESH_SECS, or a registry that answers); 503 otherwise.",
                "responses": {
                    "200": json_response(ref("Readiness"), f"The {service} can serve."),
                    "503": json_response(ref("Readiness"), f"The {service} cannot serve; `error` says why."),
                },
            },
        },
        "/metrics": {
            "get": {
                "operationId": "metrics", "tags": ["meta"], "summary": "Prometheus metrics.",
                "description": "Counters and histograms summed over all gunicorn workers, and gauges read from "
                               "the database at scrape time, in the Prometheus text format (README: Metrics). "
                               "Open without a token, like /healthz.",
                "responses": {"200": {"description": f"The {service}'s metrics.",
                                      "content": {"text/plain": {"schema": {"type": "string"}}}}},
            },
        },
        "/openapi.json": {
            "get": {
                "operationId": "getOpenAPI", "tags": ["meta"], "summary": "This document.",
                "responses": {"200": json_response({"type": "object"}, "The OpenAPI 3.0.3 document.")},
            },
        },
    }
