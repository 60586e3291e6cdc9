"""Reading and changing jobs.

The job list a page at a time (and the agents' original poll), one job, why it waits,
its history; cancel and retry."""
from collections.abc import Iterable
from urllib.parse import urlencode

from flask import current_app, request

from corral.server import auth, principals
from corral.server.http import query_choice, query_int
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.openapi import query as _query
from corral.server.routes import Routes
from corral.shared import states, wire
from corral.shared.contract import encode, respond
from corral.shared.errors import BadRequest

from .. import contract, pages, validation, views, waiting
from ..models import Job
from .context import MAX_PAGE, SchedulerApi
from .quotas import quota_answer
from .usage import fair_share_team

routes = Routes("jobs")

LINK_HEADER = {
    "Link": {
        "description": "Present when the page is full: the URL of the next page (the same query with "
                       "`after` set to the last job_id).",
        "required": False,
        "schema": {"type": "string", "pattern": r'^<[^>]*>; rel="next"$',
                   "example": '</jobs?limit=100&after=job-100>; rel="next"'},
    },
}


@routes.get("/jobs", access=auth.readable(auth.either(auth.NODE_IN_QUERY, users=True)),
            operation_id="listJobs", summary="List jobs, a page at a time.",
            description="Ordered by job id. An empty parameter counts as not given. "
                        "With `node_id` and `status=pending` (and no `after`, `order=desc`), this is the "
                        "agents' poll: at most as many jobs as the node has free slots, `[]` when it is full.",
            parameters=[
                _query("node_id", "Only jobs placed on this node.", {"type": "string"}),
                _query("status", "Only jobs in this status.", {"type": "string", "enum": list(states.ALL)}),
                _query("job_type", "Only jobs of this type.", {"type": "string", "enum": list(wire.JOB_TYPES)}),
                _query("pending_reason", "Only pending jobs waiting for this reason now (its `code`).",
                       {"type": "string", "enum": list(waiting.CODES)}),
                _query("name", "Only jobs with this name.", {"type": "string", "maxLength": 128}),
                _query("schedule", "Only the runs of this schedule.", {"type": "string", "maxLength": 128}),
                _query("array", "Only the jobs of this array (such as array-3).",
                       {"type": "string", "pattern": r"^array-[0-9]{1,18}$"}),
                _query("team", "Only the jobs of this team (a member sees their teams' jobs only).",
                       {"type": "string", "pattern": principals.TEAM_PATTERN}),
                _query("submitted_by", "Only the jobs this user submitted.",
                       {"type": "string", "pattern": principals.USER_PATTERN}),
                _query("created_after", "Only jobs created at or after this time (ISO-8601 with Z or an offset).",
                       {"type": "string", "format": "date-time"}),
                _query("created_before", "Only jobs created before this time (ISO-8601 with Z or an offset).",
                       {"type": "string", "format": "date-time"}),
                _query("limit", "Page size.", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}),
                _query("order", "`asc` (oldest first) or `desc` (newest first).",
                       {"type": "string", "enum": ["asc", "desc"], "default": "asc"}),
                _query("after", "Cursor: only jobs after this one in the chosen order (from the `Link` header).",
                       {"type": "string", "pattern": wire.JOB_ID_PATTERN}),
            ],
            responses={
                "200": _json(list[contract.Job], "A page of jobs.", headers=LINK_HEADER),
                "400": _error("BadRequest"),
            })
def list_jobs(api: SchedulerApi):
    node_id = request.args.get("node_id") or None
    status = query_choice("status", states.ALL)
    job_type = query_choice("job_type", wire.JOB_TYPES)
    pending_reason = query_choice("pending_reason", waiting.CODES)
    filters = validation.job_filters(request.args)
    limit = query_int("limit", 100, 1, MAX_PAGE)
    newest_first = query_choice("order", ("asc", "desc")) == "desc"
    after = None
    if request.args.get("after"):
        after = validation.parse_job_id(request.args["after"])
        if after is None:
            raise BadRequest("query parameter 'after' must be a job id such as job-42")
    teams = auth.principal().visible_teams() if auth.calling_node() is None else None
    jobs: Iterable[Job]
    if (teams is None and node_id and status == "pending" and job_type is None and pending_reason is None
            and after is None and not newest_first and not any(value is not None for value in filters.values())):
        jobs = api.store.jobs.pending_for_agent(node_id, limit)  # the agents' poll: at most its free slots
    else:
        jobs = api.store.jobs.iter_jobs(node_id=node_id, status=status, job_type=job_type, after=after,
                                        limit=limit, newest_first=newest_first, pending_reason=pending_reason,
                                        now=api.clock(), teams=teams, **filters)
    view = api.agent_view if auth.calling_node() is not None else api.job_view
    page = pages.cut(((j.job_id, encode(view(j))) for j in jobs), limit, api.settings.page_max_bytes)
    response = current_app.response_class(page.body(), mimetype="application/json")
    if page.next_after is not None:
        args = request.args.to_dict()
        args["after"] = page.next_after
        response.headers["Link"] = f'<{request.path}?{urlencode(args)}>; rel="next"'
    return response


@routes.get("/jobs/<job_id>", access=auth.MEMBER_READ,
            operation_id="getJob", summary="Read one job.",
            responses={"200": _json(contract.Job, "The job."), "404": _error("NotFound")})
def read_job(api: SchedulerApi, job_id):
    return respond(api.job_view(api.job(job_id), members=True))


@routes.get("/jobs/<job_id>/why", access=auth.MEMBER_READ,
            operation_id="whyJobWaits", summary="Why a pending job waits.",
            description="The job's `pending_reason` and, computed now, the nodes that came closest to "
                        "taking it, each with what it lacks (its pin, health, drain, constraints and pool, "
                        "maximum limits, free slots, unreserved memory and CPU). 409 for a job that is not "
                        "pending.",
            responses={"200": _json(contract.WhyItWaits, "Why it waits."), "404": _error("NotFound"),
                       "409": _error("Conflict")})
def why_it_waits(api: SchedulerApi, job_id):
    api.require_visible(job_id)
    job, closest = api.store.placing.why(job_id)
    view = api.job_view(job)
    quota = fair_share = None
    if api.store.context.teams.quotas():
        quota = quota_answer(job.team, *api.store.quotas.get(job.team))
    if api.store.fair_share.enabled():
        teams, users = api.store.fair_share.standings(api.clock(), [(job.team, job.submitted_by)])
        fair_share = fair_share_team(job.team, teams, users, api.store.context.teams.shares(), job.submitted_by)
    return respond(contract.WhyItWaits.model_validate({
        "job_id": job.job_id, "pending_reason": view.pending_reason, "closest_nodes": closest, "quota": quota,
        "fair_share": fair_share}))


@routes.post("/jobs/<job_id>/cancel", access=auth.MEMBER,
             operation_id="cancelJob", summary="Cancel a pending or running job.",
             description="A pending job is cancelled at once. A running job is cancelled at once too; its node "
                         "ends the whole process tree (SIGTERM, then SIGKILL after a grace) at its next poll. "
                         "Cancelling a cancelled job does nothing; a done or failed job is 409.",
             responses={"200": _json(contract.Job, "The cancelled job."), "404": _error("NotFound"),
                        "409": _error("Conflict")})
def cancel(api: SchedulerApi, job_id):
    api.require_changeable(job_id)
    return respond(api.job_view(api.scheduler.cancel(job_id, api.clock())))


@routes.post("/jobs/<job_id>/retry", access=auth.MEMBER,
             operation_id="retryJob", summary="Run a failed job again.",
             description="Puts a `failed` job back to `pending` with a fresh retry budget. Any other status is 409.",
             responses={"200": _json(contract.Job, "The job, pending again."), "404": _error("NotFound"),
                        "409": _error("Conflict")})
def retry(api: SchedulerApi, job_id):
    api.require_changeable(job_id)
    return respond(api.job_view(api.scheduler.retry(job_id, api.clock())))


@routes.get("/jobs/<job_id>/events", access=auth.MEMBER_READ,
            operation_id="listJobEvents", summary="A job's history, oldest first.",
            responses={"200": _json(list[contract.JobEvent], "The job's events."),
                       "404": _error("NotFound")})
def job_events(api: SchedulerApi, job_id):
    api.require_visible(job_id)
    return respond([views.event(e) for e in api.store.jobs.events(job_id)], of=list[contract.JobEvent])
