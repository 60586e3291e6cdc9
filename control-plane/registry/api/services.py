"""The registry's service routes.

Agents record and remove the services of their own jobs (with the scheduler's grant);
load balancers list them."""
from flask import request

from corral.server import auth
from corral.server.http import query_choice, query_int, read_json_object
from corral.server.openapi import body as _body
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.openapi import query as _query
from corral.server.routes import Routes
from corral.shared.contract import respond
from corral.shared.errors import Conflict, Forbidden, NotFound

from .. import contract
from ..models import Service
from .context import RegistryApi

routes = Routes("services")


@routes.post("/services", access=auth.agent(auth.NODE_IN_BODY),
             operation_id="registerService", summary="Record a running service job.",
             description="With tokens, a node records services of its own jobs only: it sends the job's attempt "
                         "and the `service_grant` the scheduler gave it with the job. A record of another node "
                         "is replaced only for a newer attempt (the job moved); an older attempt never replaces "
                         "a newer one's record (409).",
             request_body=_body(contract.ServiceRegistration),
             responses={
                 "201": _json(contract.Service, "A new service record."),
                 "200": _json(contract.Service, "The job's record existed and was replaced."),
                 "409": _error("Conflict"),
             })
def register_service(api: RegistryApi):
    registration = contract.ServiceRegistration.check(read_json_object())
    job_id, fields, grant = registration.job_id, registration.columns(), registration.grant
    auth.require_node(fields["node_id"])
    by_node = auth.calling_node() is not None
    if by_node and (fields["attempt"] is None or grant is None or not api.settings.credentials.grant_valid(
            grant, job_id, fields["attempt"], fields["node_id"])):
        raise Forbidden(f"a node may record services of its own jobs only; {job_id} attempt "
                        f"{fields['attempt']} is not one the scheduler handed to node {fields['node_id']!r} "
                        f"(send the job's attempt and the service_grant that came with it)")
    now = api.clock()
    if fields["healthy"] is not None:
        fields["checked_at"] = now
    with api.db.atomic():
        existing = Service.get_or_none(Service.job_id == job_id)
        if existing is not None:
            _check_replace(existing, fields, by_node)
        # An upsert, so that two recordings at once never collide on the key.
        Service.insert(job_id=job_id, registered_at=now, **fields).on_conflict(
            conflict_target=[Service.job_id], update=fields).execute()
        svc = Service.get_by_id(job_id)
    return respond(api.one_service_view(svc), 200 if existing is not None else 201)


def _check_replace(existing: Service, fields: dict, by_node: bool) -> None:
    """An older attempt never replaces a newer one's record; a node replaces another
    node's record only for a newer attempt (the job moved)."""
    old, new = existing.attempt, fields["attempt"]
    if old is not None and new is not None and new < old:
        raise Conflict(f"the service of {existing.job_id} is recorded for attempt {old}; "
                       f"attempt {new} is stale")
    if by_node and existing.node_id != fields["node_id"] and (old is None or new <= old):
        raise Conflict(f"the service of {existing.job_id} belongs to node {existing.node_id!r} "
                       f"(attempt {old}); only a newer attempt replaces it")


@routes.get("/services", access=auth.EITHER,
            operation_id="listServices",
            summary="List services, ordered by name then job_id (what a load balancer reads).",
            description="An empty parameter counts as not given.",
            parameters=[
                _query("healthy", "`true`: only services whose last check passed at most "
                                  "SERVICE_CHECK_MAX_AGE_SECS ago, on a healthy node; `false`: the others (failed, "
                                  "never checked, checked too long ago, or their node is unhealthy or unknown).",
                       {"type": "string", "enum": ["true", "false"]}),
                _query("name", "Only services with this name.", {"type": "string"}),
                _query("node_id", "Only services on this node.", {"type": "string"}),
            ],
            responses={
                "200": _json(list[contract.Service], "The matching services."),
                "400": _error("BadRequest"),
            })
def list_services(api: RegistryApi):
    now = api.clock()
    healthy_nodes = {row.node_id for row in api.healthy_node_ids(now)}
    query = Service.select().order_by(Service.name, Service.job_id)
    healthy = query_choice("healthy", ("true", "false"))
    if healthy == "true":
        query = query.where(api.checked_healthy(now))
    elif healthy == "false":
        query = query.where(~api.checked_healthy(now) | Service.healthy.is_null() | Service.checked_at.is_null())
    for name in ("name", "node_id"):
        if request.args.get(name):
            query = query.where(getattr(Service, name) == request.args[name])
    return respond([api.service_view(s, s.node_id in healthy_nodes, now) for s in query], of=list[contract.Service])


@routes.delete("/services/<job_id>", access=auth.either(auth.NODE_IN_RECORD),
               operation_id="deregisterService", summary="Remove a service record.",
               parameters=[_query("attempt", "Remove the record only while it is this attempt's (an agent removing "
                                             "the record of an attempt that ended never removes a newer one's); "
                                             "`409` otherwise.",
                                  {"type": "integer", "minimum": 0, "maximum": 1_000_000_000})],
               responses={"200": _json(contract.Service, "The record as it was before removal."),
                          "400": _error("BadRequest"), "404": _error("NotFound"), "409": _error("Conflict")})
def remove_service(api: RegistryApi, job_id):
    """With ?attempt=N, only while the record is that attempt's: an agent removing the
    record of an attempt that ended never removes a newer attempt's, on another node."""
    attempt = query_int("attempt", -1, 0, 1_000_000_000)
    svc = Service.get_or_none(Service.job_id == job_id)
    if svc is None:
        raise NotFound(f"no service for job {job_id!r}")
    auth.require_node(svc.node_id)
    with api.db.atomic():
        query = Service.delete().where(Service.job_id == job_id)
        if attempt >= 0:
            query = query.where(Service.attempt.is_null() | (Service.attempt == attempt))
        if not query.execute():
            current = Service.get_or_none(Service.job_id == job_id)
            if current is None:
                raise NotFound(f"no service for job {job_id!r}")
            raise Conflict(f"the service of {job_id} is recorded for attempt {current.attempt}, "
                           f"not attempt {attempt}; nothing was removed")
    return respond(api.one_service_view(svc))
