"""Concurrency limits.

At most N jobs with a `concurrency_key` placed or running at once, across the cluster;
listing, setting and removing a key's limit. A limit belongs to a team: its members see
it, its admins (and cluster admins) change it, and only its jobs (and cluster admins')
may use the key (api/submits.py)."""
from flask import current_app

from corral.server import audit_trail, auth
from corral.server.http import read_json_object
from corral.server.openapi import body as _body
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.routes import Routes
from corral.shared.contract import respond
from corral.shared.errors import Conflict, NotFound

from .. import contract, validation, views
from .context import SchedulerApi, require_team_admin

routes = Routes("jobs")


@routes.get("/concurrency", access=auth.MEMBER_READ,
            operation_id="listConcurrencyLimits", summary="The concurrency limits set (a member: their teams').",
            responses={"200": _json(list[contract.ConcurrencyLimitAnswer], "Every limit, by key.")})
def list_concurrency(api: SchedulerApi):
    teams = auth.principal().visible_teams()
    return respond([views.concurrency(*row) for row in api.store.limits.concurrency_limits(teams=teams)],
                   of=list[contract.ConcurrencyLimitAnswer])


@routes.put("/concurrency/<key>", access=auth.MEMBER,
            operation_id="setConcurrencyLimit", summary="Set a key's limit.",
            description="At most `limit` jobs with this `concurrency_key` are placed or running at once, "
                        "across the cluster. Lowering it ends nothing: jobs over the limit finish. The limit "
                        "belongs to `team` (a limit set before keeps its team: another is 409); setting it "
                        "takes an admin of that team or a cluster admin.",
            request_body=_body(contract.ConcurrencyLimitRequest),
            responses={"200": _json(contract.ConcurrencyLimitAnswer, "The limit."),
                       "404": _error("NotFound"), "409": _error("Conflict")})
def set_concurrency(api: SchedulerApi, key):
    key = validation.concurrency_key(key)
    asked = contract.ConcurrencyLimitRequest.check(read_json_object())
    who, owner = auth.principal(), api.store.limits.owner(key)
    if owner is not None and not who.can_see(owner):
        raise Conflict(f"the concurrency key {key!r} is limited by another team")
    if owner is not None and asked.team is not None and asked.team != owner:
        raise Conflict(f"the concurrency key {key!r} is limited by team {owner!r}: remove that limit first")
    team = owner or who.team_to_act_in(asked.team)
    _administer(team, key)
    if owner is None and asked.team is not None and who.is_admin:
        api.store.accounts.require_teams({team})
    api.store.limits.set_concurrency_limit(key, asked.limit, team)
    api.scheduler.limits_changed(api.clock())
    return respond(views.concurrency(*api.store.limits.concurrency_limits(key)[0]))


@routes.delete("/concurrency/<key>", access=auth.MEMBER,
               operation_id="removeConcurrencyLimit", summary="Remove a key's limit.",
               description="The key is unlimited from then on.",
               responses={"204": {"description": "Removed."}, "400": _error("BadRequest"),
                          "404": _error("NotFound")})
def remove_concurrency(api: SchedulerApi, key):
    key = validation.concurrency_key(key)
    owner = api.store.limits.owner(key)
    if owner is None or not auth.principal().can_see(owner):
        raise NotFound(f"no concurrency limit is set for {key!r}")
    _administer(owner, key)
    api.store.limits.remove_concurrency_limit(key)
    api.scheduler.limits_changed(api.clock())
    return current_app.response_class(status=204)


def _administer(team: str, key: str) -> None:
    audit_trail.note(team=team)
    require_team_admin(team, f"change the limit of {key!r}")
