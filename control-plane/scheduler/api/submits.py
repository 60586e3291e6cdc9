"""Submitting work.

One job or an array (POST /jobs), or up to 1,000 jobs in one transaction (POST
/jobs/batch), each submit traced as a corral.submit span (spans.py) from the request's
trace context."""
from flask import after_this_request, g, request

from corral.server import audit_trail, auth
from corral.server.http import read_json_object
from corral.server.openapi import body as _body
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.routes import Routes
from corral.shared import contract as shared_contract
from corral.shared import tracecontext
from corral.shared.contract import respond
from corral.shared.errors import BadRequest, Forbidden
from corral.shared.wire import IDEMPOTENCY_HEADER

from .. import contract, metrics, spans, validation, views
from .context import SchedulerApi

routes = Routes("jobs")

PENDING_LIMIT = _json(shared_contract.Error, "The cluster holds MAX_PENDING_JOBS pending jobs: nothing was stored. "
                      "The body also has `pending_jobs`, `max_pending_jobs`, `setting` and `requested` (the "
                      "new jobs the request would add).",
                      headers={"Retry-After": {"description": "Seconds to wait before trying again.",
                                               "schema": {"type": "integer"}}})


def traced(source: str) -> dict:
    """The trace columns of this request's jobs, from its traceparent and tracestate
    headers (shared/tracecontext.py)."""
    got = tracecontext.received(request.headers.get("traceparent"), request.headers.get("tracestate"))
    if got.invalid:
        metrics.trace_context_invalid(source)
    fields = tracecontext.job_fields(got)
    # The corral.submit span the jobs store (spans.py), ended with the answer.
    span = g.submit_span = spans.submit(got, fields, source,
                                        attributes=spans.http_attributes(request.method, request.path))
    if span.is_recording():
        @after_this_request
        def end_span(response):
            spans.answered(span, response.status_code)
            return response
    return fields


def attributed(api: SchedulerApi, fields: dict) -> dict:
    """A new job's columns with its team (the one asked for, else the user's default;
    corral.server.principals) and its submitter, this request's user."""
    who = auth.principal()
    asked = fields.get("team")
    team = who.team_to_act_in(asked)
    if asked is not None and who.is_admin:  # a member's teams exist; an admin may name any that does
        # Once per team in a request: a batch's items mostly name the same few.
        checked = g.setdefault("teams_checked", set())
        if asked not in checked:
            api.store.accounts.require_teams({asked})
            checked.add(asked)
    audit_trail.note(team=team)
    key = fields.get("concurrency_key")
    if key is not None and not who.is_admin:
        owner = api.store.limits.owner(key)
        if owner is not None and owner != team:
            raise Forbidden(f"the concurrency key {key!r} is limited by another team: jobs of team {team!r} "
                            f"may not use it")
    return dict(fields, team=team, submitted_by=who.user)


def submitted(created: bool, **attributes) -> None:
    spans.submitted(g.submit_span, created, {f"corral.{name}": value for name, value in attributes.items()})


@routes.post("/jobs", access=auth.MEMBER,
             operation_id="submitJob", summary="Submit a job.",
             description="The job is stored as `pending` and placed on a healthy compute node when one has room. "
                         "A 201 answer means the job is durably recorded. With an `Idempotency-Key`, the "
                         "same key and request again answer 200 with the job first created; the same key "
                         "with a different request is 409.",
             parameters=[{"name": "Idempotency-Key", "in": "header", "required": False,
                          "description": "A client-chosen key (1-255 printable ASCII characters, no spaces) "
                                         "that makes retrying a submission safe.",
                          "schema": {"type": "string", "pattern": r"^[\x21-\x7e]{1,255}$"}}],
             request_body=_body(contract.JobRequest),
             responses={
                 "201": _json(contract.Job | contract.ArrayCreated,
                              "The new job; for a request with `array`, the new array."),
                 "200": _json(contract.Job | contract.ArrayCreated,
                              "A repeat of an earlier request with the same Idempotency-Key: that job (or array)."),
                 "409": _error("Conflict"),
                 "429": PENDING_LIMIT,
             })
def submit(api: SchedulerApi):
    fields = attributed(api, dict(validation.job_request(read_json_object()), **traced("api")))
    key = validation.idempotency_key(request.headers.get(IDEMPOTENCY_HEADER))
    if fields["array"] is not None:
        if key is not None and len(key) > 245:
            raise BadRequest("the Idempotency-Key header of an array must be at most 245 characters")
        array, first, last, created = api.scheduler.submit_array(fields, api.clock(), key)
        submitted(created, array_id=f"array-{array.id}", job_count=array.count)
        return respond(views.array_created(array, first, last), 201 if created else 200)
    job, created = api.scheduler.submit(fields, api.clock(), key)
    submitted(created, job_id=job.job_id, job_count=1)
    metrics.submitted(api.store.db, "api", int(created))  # committed: store.submits.submit has returned
    return respond(api.job_view(job), 201 if created else 200)


@routes.post("/jobs/batch", access=auth.MEMBER,
             operation_id="submitJobs", summary="Submit up to 1,000 jobs at once.",
             description="Every item is checked as POST /jobs checks one, and all are stored in ONE "
                         "transaction: when any item is invalid the answer is 400 with an `errors` entry "
                         "(its index and what is wrong) per bad item, and nothing is stored. On success "
                         "the answer is 201 with the jobs in request order, placed as far as nodes have "
                         "room. With an `Idempotency-Key`, item i is stored under `KEY:i`: sending the "
                         "same batch again answers 200 with the same jobs.",
             parameters=[{"name": "Idempotency-Key", "in": "header", "required": False,
                          "description": "A client-chosen key for the whole batch (1-250 printable ASCII "
                                         "characters, no spaces).",
                          "schema": {"type": "string", "pattern": r"^[\x21-\x7e]{1,250}$"}}],
             request_body=_body(contract.JobBatch),
             responses={
                 "201": _json(list[contract.Job], "The new jobs, in request order."),
                 "200": _json(list[contract.Job],
                              "A repeat of an earlier batch with the same Idempotency-Key: those jobs."),
                 "400": _json(shared_contract.BatchError, "The body or an item is invalid; nothing was stored."),
                 "409": _error("Conflict"),
                 "429": PENDING_LIMIT,
             })
def submit_batch(api: SchedulerApi):
    items = validation.job_batch(read_json_object())
    trace = traced("batch")
    items = [attributed(api, dict(item, **trace)) for item in items]
    key = validation.idempotency_key(request.headers.get(IDEMPOTENCY_HEADER))
    if key is not None and len(key) > 250:
        raise BadRequest("the Idempotency-Key header of a batch must be at most 250 characters")
    jobs, created = api.scheduler.submit_batch(items, api.clock(), key)
    submitted(created, job_count=len(jobs))
    return respond([api.job_view(j) for j in jobs], 201 if created else 200, of=list[contract.Job])
