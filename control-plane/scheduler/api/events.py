"""The event stream (GET /events).

What happens in the cluster as Server-Sent Events, within each process's budget of open
streams (stream_hub.py; event_stream.py writes the stream)."""
from flask import current_app, g, request

from corral.server import auth, principals
from corral.server.http import error_response
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.openapi import query as _query
from corral.server.routes import Routes
from corral.shared import contract as shared_contract
from corral.shared.errors import BadRequest, Forbidden

from .. import event_stream, events, metrics, stream_hub, validation
from .context import SchedulerApi

routes = Routes("jobs")

# One event of GET /events as a client's parser reads it (before OpenAPI 3.2 the schema
# of an event stream describes each event).
SSE_EVENT = {
    "type": "object", "required": ["event", "data", "id"],
    "properties": {
        "event": {"type": "string", "enum": [*events.TYPES, *events.STREAM_TYPES]},
        "data": {"type": "string", "contentMediaType": "application/json",
                 "description": "A JSON object: `at`, and the fields of its type."},
        "id": {"type": "string", "minLength": 1, "description": "Send it back as `Last-Event-ID` to resume after it."},
        "retry": {"type": "integer", "minimum": 0},
    },
}


@routes.get("/events", access=auth.MEMBER_READ,
            operation_id="streamEvents", summary="What happens in the cluster, as Server-Sent Events.",
            description=(
                "A `text/event-stream` of `job` events (every transition: `from`, `to`, `attempt`, `node_id`, "
                "`reason`), `node` events (`change`: registered, healthy, unhealthy, drained, undrained, "
                "deregistered) and `log` events (new output of an attempt: `attempt`, `stream`, `offset`, `size`); "
                "each has `at` and an `id`. The stream starts with an `open` event whose id is where it starts "
                "(send it back as `Last-Event-ID` to resume after it), or a `missed` event first when events after "
                "the client's position were deleted (EVENTS_RETENTION_SECS). Idle streams get keep-alive comments; "
                "a stream ends with an `end` event after EVENTS_STREAM_MAX_SECS, and the client resumes. "
                "Open streams have a budget of their own in each server process, apart from the long-poll "
                "claims: EVENTS_STREAMS_MAX (503 beyond it) and EVENTS_STREAMS_PER_CREDENTIAL for one token, or "
                "one client address without tokens (429 beyond it). A team member streams one job of their "
                "teams at a time (`job_id`; another team's job is 404); the whole cluster's stream is for "
                "cluster admins and readers. See docs/api.md, \"The event stream\"."),
            parameters=[
                _query("job_id", "Only this job's events.", {"type": "string"}),
                _query("node_id", "Only events of this node (its changes, and its jobs' transitions).",
                       {"type": "string"}),
                _query("type", "Only these types: `job`, `node`, `log`, comma-separated or repeated.",
                       {"type": "string"}),
                {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"},
                 "description": "Resume after this event (its `id`)."},
            ],
            responses={
                "200": {"description": "The stream; the schema describes one event.",
                        "content": {"text/event-stream": {"schema": SSE_EVENT}}},
                "400": _error("BadRequest"),
                "429": _json(shared_contract.Error, "This credential already holds "
                                                    "EVENTS_STREAMS_PER_CREDENTIAL streams in this process; "
                                                    "`Retry-After` says when to try again."),
                "503": _json(shared_contract.Error, "This process already holds EVENTS_STREAMS_MAX event "
                                                    "streams; `Retry-After` says when to try again."),
            })
def events_stream(api: SchedulerApi):
    wanted = event_filter()
    if not auth.principal().sees_every_team:
        if wanted.job_row is None:
            raise Forbidden("a team member streams the events of one job of their teams (job_id=...); the whole "
                            "cluster's stream is for cluster admins and readers")
        api.require_visible(f"job-{wanted.job_row}")
    try:
        cursor, first = event_stream.start(api.event_log, request.headers.get("Last-Event-ID"))
    except events.BadCursor as exc:
        raise BadRequest(str(exc)) from None
    who = stream_credential()
    refusal = api.stream_budget.take(who)
    if refusal is not None:
        return stream_refused(api.stream_budget, refusal)
    metrics.event_stream("opened")
    db, room, hub, budget = api.store.db, api.room, api.hub, api.stream_budget
    db.close()  # the stream holds no connection between its reads
    body = event_stream.stream(api.event_log, db, hub, cursor, wanted, first, api.stream_timing,
                               lambda: room.closed or hub.stopped, lambda: budget.give_back(who))
    return current_app.response_class(body, mimetype="text/event-stream",
                                      headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def stream_credential() -> str:
    """Whose streams count together: a personal token's, a user's of single sign-on, a
    cluster token's role, or the client's address where no token is configured
    (loopback only)."""
    who = auth.calling_principal()
    if who is not None and who.token_id is not None:
        return f"token:{who.token_id}"
    if who is not None and who.user not in principals.RESERVED_USERS:
        return f"user:{who.user}"
    role = g.get("corral_role")
    return f"token:{role}" if role else f"address:{request.remote_addr}"


def stream_refused(budget: stream_hub.StreamBudget, refusal: str):
    if refusal == stream_hub.PROCESS_FULL:
        metrics.event_stream("refused")
        response = error_response(503, "this server process already holds as many event streams as it "
                                       f"allows (EVENTS_STREAMS_MAX={budget.max_streams}); try again "
                                       "shortly or another replica")
    else:
        metrics.event_stream("refused_credential")
        response = error_response(429, "this credential already holds as many event streams in this server "
                                       "process as it may (EVENTS_STREAMS_PER_CREDENTIAL="
                                       f"{budget.per_credential}); close one or try again shortly")
    response.headers["Retry-After"] = "2"
    return response


def event_filter() -> events.Filter:
    job_row = None
    if request.args.get("job_id"):
        job_row = validation.parse_job_id(request.args["job_id"])
        if job_row is None:
            raise BadRequest("query parameter 'job_id' must be a job id such as job-42")
    try:
        types = events.parse_types(request.args.getlist("type"))
    except ValueError as exc:
        raise BadRequest(f"query parameter 'type': {exc}") from None
    return events.Filter(job_row, request.args.get("node_id") or None, types)
