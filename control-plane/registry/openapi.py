"""The registry's OpenAPI 3.1.0 document, served at GET /openapi.json.

The operations its routes declare (api/, control-plane/server/routes.py) with the shared
parts, every body schema generated from the models of contract.py
(control-plane/server/openapi.py builds it).

tests/test_openapi.py checks every route is listed and runs schemathesis
against a live server to check every answer against it.
"""

from corral.shared.validate import NAME_PATTERN
from corral.server.openapi import NAME_PATTERN_PARAM, build, error_responses, meta_paths
from corral.server.openapi import path_param as _path_param
from corral.server.routes import openapi_paths

from . import routes

NODE_ID_PARAM = _path_param("node_id", "The node's id.", NAME_PATTERN_PARAM)
SERVICE_JOB_ID_PARAM = _path_param(
    "job_id", "The id of the service job the record belongs to.",
    {"type": "string", "maxLength": 64, "pattern": NAME_PATTERN})

RESPONSES = error_responses(not_found="No such node or service.",
                            conflict="A service record of a newer attempt, or of another node, is in the way.")


# The path variables' descriptions, by name (each path lists its own once).
PATH_PARAMETERS = {"node_id": NODE_ID_PARAM, "job_id": SERVICE_JOB_ID_PARAM}

PATHS = {**meta_paths("registry"), **openapi_paths(routes.GROUPS, PATH_PARAMETERS)}

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
