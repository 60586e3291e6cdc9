"""What node agents call: claiming the jobs placed on their node (a long poll,
longpoll.py), renewing the node's lease, reporting on attempts (one or many), and
sending running jobs' output so far. Each only for the node of the agent's credential."""
from flask import request

from corral.server import auth
from corral.server.http import read_json_object, request_body
from corral.server.openapi import body as _body
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.routes import Routes
from corral.shared.contract import respond
from corral.shared.errors import BadRequest
from corral.shared.wire import LONG_POLL_HEADER

from .. import contract, longpoll, validation, views
from .context import SchedulerApi, require_items_node

routes = Routes("agents")


@routes.post("/nodes/<node_id>/claim", access=auth.agent(auth.NODE_IN_PATH),
             operation_id="claimJobs", summary="Take jobs placed on a node (agents).",
             description="Atomically takes up to `max` pending jobs placed on the node (never more than its "
                         "free slots): each becomes `running` for its current attempt, exactly as a "
                         "`running` status report would make it, and goes to this claim only. When "
                         "nothing is claimable the request waits up to `wait_secs` and answers as soon as "
                         "work for the node exists, or `[]` at the deadline. A claim that takes jobs "
                         "also renews the node's lease (one that takes nothing writes nothing). A claim "
                         "that could not wait (the server's long-poll capacity, "
                         "LONG_POLL_MAX_WAITERS, is in use, or it is stopping) answers at once with the "
                         "`X-Corral-Long-Poll` header; ask again after a pause. Work that comes after the "
                         "claim has waited 1 s is not handed to it (the request is no proof the agent is "
                         "still alive): it answers `[]` with `X-Corral-Long-Poll: again`; ask again at once.",
             request_body=_body(contract.ClaimRequest),
             responses={
                 "200": _json(list[contract.Job],
                              "The claimed jobs (status `running`, with their attempt), possibly none.",
                              headers={"X-Corral-Long-Poll": {
                                  "description": "Present when an empty answer came before the deadline: "
                                                 "`busy` (too many claims wait in this server process) or "
                                                 "`stopping` (ask again after a pause), or `again` (work "
                                                 "came after the claim had waited a while: ask again at once "
                                                 "to take it).",
                                  "required": False,
                                  "schema": {"type": "string", "enum": ["busy", "stopping", "again"]}}}),
                 "404": _error("NotFound"),
             })
def claim(api: SchedulerApi, node_id):
    if not validation.NODE_ID_RE.match(node_id):
        raise BadRequest("the node id must be letters, digits, '.', '_' or '-' (at most 128)")
    body = validation.claim_request(read_json_object())
    answer = longpoll.claim(api.scheduler, api.room, node_id, body, api.clock, request.environ.get("gunicorn.socket"))
    response = respond([api.agent_view(j) for j in answer.jobs], of=list[contract.Job])
    # An empty answer before the deadline: "busy" (the process's waiting room is full)
    # or "stopping" (the worker is shutting down): ask again after a pause; "again"
    # (work came for the node after the claim had waited a while): ask again at once.
    if answer.outcome in (longpoll.BUSY, longpoll.STOPPING, longpoll.AGAIN):
        response.headers[LONG_POLL_HEADER] = answer.outcome
    return response


@routes.post("/nodes/<node_id>/lease", access=auth.agent(auth.NODE_IN_PATH),
             operation_id="renewLease", summary="Renew a node's lease (agents).",
             description="Agents call this every heartbeat while they hold jobs (a claim that takes jobs "
                         "renews the lease too; idle agents renew once a minute for the list below). An agent "
                         "that cannot renew for `lease_secs` stops its run jobs; the scheduler requeues them "
                         "NODE_LOST_GRACE_SECS later. The answer "
                         "lists the attempts the scheduler has running on the node: an attempt the agent runs "
                         "that is not listed is stale and the agent ends it.",
             request_body=_body(contract.LeaseRenewal, required=False),
             responses={
                 "200": _json(contract.Lease, "The lease is renewed."),
                 "404": _error("NotFound"),
             })
def renew_lease(api: SchedulerApi, node_id):
    if not validation.NODE_ID_RE.match(node_id):
        raise BadRequest("the node id must be letters, digits, '.', '_' or '-' (at most 128)")
    renewal = contract.LeaseRenewal.check(read_json_object() if request_body().strip() else {})
    usage = renewal.usage
    now = api.clock()
    running = api.store.leases.renew_lease(node_id, now, None if usage is None else (
        usage.memory_mb, usage.cpu_percent, usage.gpu_memory_mb, usage.gpu_utilization_percent))
    return respond(views.lease(node_id, api.settings.heartbeat_timeout_secs, running, now))


@routes.post("/jobs/<job_id>/status", access=auth.agent(auth.NODE_IN_BODY),
             operation_id="reportStatus", summary="Report on an attempt (agents).",
             description="`running` when the attempt starts (repeating it is harmless), then `done` or `failed`. "
                         "A failure with retries left puts the job back to `pending`.",
             request_body=_body(contract.StatusReport),
             responses={
                 "200": _json(contract.Job, "The job after the report."),
                 "404": _error("NotFound"),
                 "409": _error("Conflict"),
             })
def report(api: SchedulerApi, job_id):
    body = validation.status_report(read_json_object())
    auth.require_node(body["node_id"])
    return respond(api.job_view(api.scheduler.report(job_id, body, api.clock())))


@routes.post("/jobs/reports", access=auth.agent(auth.NODE_IN_BODY),
             operation_id="reportStatuses", summary="Report on many attempts at once (agents).",
             description="Each item is applied as POST /jobs/{job_id}/status would apply it, on its own: a "
                         "refused report (stale attempt, other node, illegal move, invalid item) changes "
                         "nothing and does not stop the others. The answer has one result per item. A 400 "
                         "answer is about the body as a whole (not an object, no `reports` array, more "
                         "than 1,000 items).",
             request_body=_body(contract.ReportBatch),
             responses={
                 "200": _json(contract.ReportResults, "What happened to each report."),
             })
def report_batch(api: SchedulerApi):
    items, riding = validation.report_batch(read_json_object())  # riding: a claim sent with the reports
    require_items_node(items)
    if riding is not None:
        auth.require_node(riding[0])
    results, claimed = api.scheduler.report_batch(items, api.clock(), riding)
    answer: dict = {"results": [views.report_result(r) for r in results]}
    if riding is not None:
        answer["claimed"] = [api.agent_view(j) for j in claimed]
    return respond(contract.ReportResults.model_validate(answer))


@routes.post("/jobs/output", access=auth.agent(auth.NODE_IN_BODY),
             operation_id="sendLiveOutput", summary="Store the output of running jobs so far (agents).",
             description="Agents send the tails of running jobs' stdout and stderr (every "
                         "AGENT_OUTPUT_INTERVAL_SECS, only what changed), so that GET /jobs/{job_id} shows "
                         "the output of a job while it runs. Each item is fenced as a status report is: it "
                         "must come from the node the job is placed on, for its current attempt, and the job "
                         "must still be `running`; anything else is refused for that item (409) and changes "
                         "nothing, so a late update never overwrites a final report's output. The stored "
                         "text is cut to the last CORRAL_OUTPUT_TAIL_BYTES. No job event is recorded. A 400 "
                         "answer is about the body as a whole.",
             request_body=_body(contract.OutputBatch),
             responses={
                 "200": _json(contract.OutputResults, "What happened to each item."),
             })
def live_output(api: SchedulerApi):
    items = validation.output_batch(read_json_object())
    require_items_node(items)
    return respond(contract.OutputResults.model_validate(
        {"results": [views.item_result(r) for r in api.store.output.store(items)]}))
