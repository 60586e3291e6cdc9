"""The scheduler's OpenAPI 3.1.0 document, served at GET /openapi.json.

The operations its routes declare (api/, control-plane/server/routes.py) with the shared
parts (path parameters, error answers, meta and dashboard paths), every body schema
generated from the models of contract.py (control-plane/server/openapi.py builds it).

tests/test_openapi.py checks every route is listed and runs schemathesis
against a live server to check every answer against it.
"""

from corral.shared import wire
from corral.server.openapi import NAME_PATTERN_PARAM, build, error_responses, meta_paths
from corral.server.openapi import path_param as _path_param
from corral.server.routes import openapi_paths
from corral.server import principals

from . import routes, ui
from .api import logs

NODE_ID_PARAM = _path_param("node_id", "The agent's node id.", NAME_PATTERN_PARAM)
SCHEDULE_NAME_PARAM = _path_param("name", "A schedule's name.", NAME_PATTERN_PARAM)
JOB_ID_PARAM = _path_param("job_id", "A job id such as `job-42`.", {"type": "string", "pattern": wire.JOB_ID_PATTERN})

RESPONSES = error_responses(
    not_found="No such job.",
    conflict="The report is from another node, for a stale attempt, or asks for an illegal transition; "
             "nothing changed.")

# The path variables' descriptions, by name (each path lists its own once).
PATH_PARAMETERS = {
    "job_id": JOB_ID_PARAM,
    "node_id": NODE_ID_PARAM,
    "name": SCHEDULE_NAME_PARAM,
    "array_id": _path_param("array_id", "An array id.", {"type": "string", "pattern": r"^array-[1-9][0-9]{0,17}$"}),
    "key": _path_param("key", "A concurrency key.", {"type": "string", "pattern": r"^[A-Za-z0-9._-]{1,128}$"}),
    "attempt": _path_param("attempt", "The attempt whose output this is (1, 2, …).",
                           {"type": "integer", "minimum": 1, "maximum": 2 ** 31 - 1}),
    "stream": _path_param("stream", "Which output.", logs.LOG_STREAM_SCHEMA),
    "seq": _path_param("seq", "The chunk's number in its stream: 0, 1, 2 …",
                       {"type": "integer", "minimum": 0, "maximum": 2 ** 31 - 1}),
    "team": _path_param("team", "A team's name.", {"type": "string", "pattern": principals.TEAM_PATTERN}),
    "user": _path_param("user", "A user's name.", {"type": "string", "pattern": principals.USER_PATTERN}),
    "token_id": _path_param("token_id", "A personal token's id.", {"type": "string", "pattern": r"^tok-[0-9a-f]{16}$"}),
}

# The dashboard's files (ui.py declares them).
DASHBOARD_PATHS = {path: {"get": {
    "operationId": operation, "tags": ["dashboard"], "summary": summary,
    "description": "The dashboard is one static page; its script reads this API.",
    "responses": {"200": {"description": summary, "content": {media_type: {"schema": {"type": "string"}}}}},
}} for path, (_, media_type, operation, summary) in ui.ASSETS.items()}

PATHS = {**meta_paths("scheduler"), **DASHBOARD_PATHS, **openapi_paths(routes.GROUPS, PATH_PARAMETERS)}

DOCUMENT = build(
    info={
        "title": "Corral scheduler",
        "version": "0.1.0",
        "description": "Submit shell jobs and follow them; agents claim work (long-poll) and report on it. "
                       "Every error is JSON `{\"error\": \"...\"}`.",
    },
    tags=[
        {"name": "jobs", "description": "Submitting and reading jobs."},
        {"name": "schedules", "description": "Jobs run at the slots of a cron expression or an interval."},
        {"name": "users", "description": "Who a credential stands for; personal tokens."},
        {"name": "agents", "description": "What node agents call."},
        {"name": "meta", "description": "Health, counts and this document."},
        {"name": "dashboard", "description": "The web dashboard at /ui."},
    ],
    paths=PATHS,
    responses=RESPONSES,
)
