"""Building the services' OpenAPI 3.1.0 documents (served at /openapi.json).

Each route declares its operation (parameters, answers, the pydantic models of its
bodies: control-plane/server/routes.py); each service's openapi.py adds its shared
parts, and `build` generates every schema from those models (3.1's schemas are the
JSON Schema pydantic writes). The parts every service shares (errors, /healthz,
/readyz, /metrics, /openapi.json) are here once.
"""
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, models_json_schema

from corral.shared import contract
from corral.shared.validate import NAME_PATTERN

OPENAPI_VERSION = "3.1.0"
NAME_PATTERN_PARAM = {"type": "string", "pattern": NAME_PATTERN}
REF_TEMPLATE = "#/components/schemas/{model}"

# With tokens (README: Security) every route but /healthz, /readyz, /metrics, /openapi.json
# and the dashboard's files takes a bearer token: the operator token, or a node's
# credential (`<node_id>.<hex HMAC>`) for the agents' routes. Without tokens (a server
# on loopback only) none is checked: hence the empty alternative.
SECURITY_SCHEMES = {"bearer": {"type": "http", "scheme": "bearer",
                               "description": "CORRAL_API_TOKEN (operators), a node's CORRAL_NODE_TOKEN "
                                              "(agents, for their own node only) or CORRAL_READ_TOKEN "
                                              "(reads only)."}}
SECURITY = [{"bearer": []}, {}]


class _Schemas(GenerateJsonSchema):
    """Pydantic's JSON Schema without a title on every property (the name says it)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def json_response(schema: Any, description: str, headers: dict | None = None) -> dict:
    """An answer whose body is `schema`: a model, `list[Model]`, or a schema of its own."""
    response = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        response["headers"] = headers
    return response


def body(model: type[contract.Request], required: bool = True, description: str | None = None) -> dict:
    """A request body of `model`."""
    request_body: dict = {"required": required, "content": {"application/json": {"schema": model}}}
    if description:
        request_body["description"] = description
    return request_body


def error(name: str) -> dict:
    """A reference to one of the shared error responses (see error_responses)."""
    return {"$ref": f"#/components/responses/{name}"}


def query(name: str, description: str, schema: dict) -> dict:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


def path_param(name: str, description: str, schema: dict) -> dict:
    return {"name": name, "in": "path", "required": True, "description": description, "schema": schema}


def error_responses(not_found: str, conflict: str | None = None) -> dict:
    responses = {
        "BadRequest": json_response(contract.Error, "The request is malformed (bad field, parameter or JSON)."),
        "NotFound": json_response(contract.Error, not_found),
        "PayloadTooLarge": json_response(contract.Error, "The body is larger than CORRAL_MAX_BODY_BYTES "
                                                         "(default 2 MiB)."),
        "UnsupportedMediaType": json_response(contract.Error, "Content-Type is not application/json (which every "
                                                              "POST, PUT, PATCH and DELETE must say, with or "
                                                              "without a body)."),
    }
    if conflict:
        responses["Conflict"] = json_response(contract.Error, conflict)
    return responses


def request_refusals(paths: dict) -> dict:
    """Document the refusals of a request as the servers make them, not route by route:
    an operation that declares a body answers 400 (malformed JSON or fields) and 413
    (over CORRAL_MAX_BODY_BYTES) unless it says otherwise; every state-changing
    operation takes `Content-Type: application/json` only, a body-less one too
    (control-plane/server/guards.py): those get an optional empty JSON body and the 415.
    Returns `paths`."""
    for operations in paths.values():
        for method, operation in operations.items():
            if "requestBody" in operation:
                operation["responses"].setdefault("400", error("BadRequest"))
                operation["responses"].setdefault("413", error("PayloadTooLarge"))
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
                "responses": {"200": json_response(contract.Health, f"The {service} is serving.")},
            },
        },
        "/readyz": {
            "get": {
                "operationId": "readyz", "tags": ["meta"], "summary": "Readiness check.",
                "description": "200 when the database answers (the scheduler also needs a node list refreshed "
                               "within three NODE_REFRESH_SECS, or a registry that answers); 503 otherwise.",
                "responses": {
                    "200": json_response(contract.Readiness, f"The {service} can serve."),
                    "503": json_response(contract.Readiness, f"The {service} cannot serve; `error` says why."),
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
                "responses": {"200": json_response({"type": "object"}, f"The OpenAPI {OPENAPI_VERSION} document.")},
            },
        },
    }


def build(info: dict, tags: list[dict], paths: dict, responses: dict) -> dict:
    """The OpenAPI document of `paths` and shared `responses`: each model named in them
    becomes a schema in components (a request's as pydantic validates it, an answer's as
    it serializes it) and a `$ref` where it was named; `list[Model]`, an array of them;
    `A | B`, one of them."""
    models: dict[type[BaseModel], None] = {}
    _models_in([paths, responses], models)
    refs, schemas = models_json_schema(
        [(model, "validation" if issubclass(model, contract.Request) else "serialization") for model in models],
        ref_template=REF_TEMPLATE, schema_generator=_Schemas)
    ref_of = {model: ref for (model, _), ref in refs.items()}
    return {
        "openapi": OPENAPI_VERSION,
        "info": info,
        "tags": tags,
        "paths": _with_refs(request_refusals(paths), ref_of),
        "components": {"schemas": schemas.get("$defs", {}), "responses": _with_refs(responses, ref_of),
                       "securitySchemes": SECURITY_SCHEMES},
        "security": SECURITY,
    }


def _model(value: Any) -> type[BaseModel] | None:
    return value if isinstance(value, type) and issubclass(value, BaseModel) else None


def _listed_model(value: Any) -> type[BaseModel] | None:
    if typing.get_origin(value) is list:
        return _model(typing.get_args(value)[0])
    return None


def _united_models(value: Any) -> list[type[BaseModel]] | None:
    """The models of `A | B` (an answer that is one or the other)."""
    if typing.get_origin(value) in (types.UnionType, typing.Union):
        models = [_model(arg) for arg in typing.get_args(value)]
        if all(models):
            return models  # type: ignore[return-value]
    return None


def _models_in(node: Any, found: dict) -> None:
    model = _model(node) or _listed_model(node)
    if model is not None:
        found[model] = None
    elif _united_models(node):
        found.update(dict.fromkeys(_united_models(node) or ()))
    elif isinstance(node, dict):
        for value in node.values():
            _models_in(value, found)
    elif isinstance(node, list):
        for value in node:
            _models_in(value, found)


def _with_refs(node: Any, ref_of: dict) -> Any:
    """`node` with each model replaced by its schema reference."""
    if _model(node) is not None:
        return ref_of[node]
    listed = _listed_model(node)
    if listed is not None:
        return {"type": "array", "items": ref_of[listed]}
    united = _united_models(node)
    if united:
        return {"oneOf": [ref_of[model] for model in united]}
    if isinstance(node, dict):
        return {key: _with_refs(value, ref_of) for key, value in node.items()}
    if isinstance(node, list):
        return [_with_refs(value, ref_of) for value in node]
    return node
