"""Team quotas (docs/scheduling.md, "Quotas"): cluster admins set and remove them; a
member reads their teams' (another team's is 404, as its jobs are), admins and readers
every team's."""
from flask import current_app

from corral.server import auth, principals
from corral.server.http import read_json_object
from corral.server.openapi import body as _body
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.routes import Routes
from corral.shared.contract import respond
from corral.shared.errors import NotFound

from .. import contract, quotas
from .context import SchedulerApi

routes = Routes("users")


def quota_answer(team: str, quota: quotas.Quota | None, used: dict[str, int]) -> contract.QuotaAnswer:
    quota = quota or quotas.NO_QUOTA
    return contract.QuotaAnswer(team=team, **quota.as_dict(), used=used, borrowed=quotas.borrowed(quota, used))


def _visible_team(team: str) -> str:
    name = principals.check_team_name(team)
    visible = auth.principal().visible_teams()
    if visible is not None and name not in visible:
        raise NotFound(f"no team {name!r}")
    return name


@routes.get("/teams/<team>/quota", access=auth.MEMBER_READ, operation_id="getTeamQuota",
            summary="A team's quota and what its jobs use now.",
            description="Empty parts when the team has no quota. A member reads their own teams' only.",
            responses={"200": _json(contract.QuotaAnswer, "The quota and usage."), "400": _error("BadRequest"),
                       "404": _error("NotFound")})
def get_quota(api: SchedulerApi, team):
    name = _visible_team(team)
    return respond(quota_answer(name, *api.store.quotas.get(name)))


@routes.put("/teams/<team>/quota", access=auth.OPERATOR, operation_id="setTeamQuota",
            summary="Set a team's quota: its guarantee, borrowing limit and lending limit (cluster admins).",
            description="Replaces the whole quota. Placement applies it within 2 s on every scheduler process.",
            request_body=_body(contract.QuotaRequest),
            responses={"200": _json(contract.QuotaAnswer, "The quota and usage."), "400": _error("BadRequest"),
                       "404": _error("NotFound")})
def set_quota(api: SchedulerApi, team):
    name = principals.check_team_name(team)
    asked = contract.QuotaRequest.check(read_json_object())
    quota = quotas.Quota(*({resource: amount for resource, amount in (part.model_dump() if part else {}).items()
                            if amount is not None}
                           for part in (asked.guaranteed, asked.borrowing_limit, asked.lending_limit)))
    api.store.quotas.set(name, quota)
    return respond(quota_answer(name, *api.store.quotas.get(name)))


@routes.delete("/teams/<team>/quota", access=auth.OPERATOR, operation_id="deleteTeamQuota",
               summary="Remove a team's quota (cluster admins): it runs on what others leave idle, as "
                       "teams without one do.",
               responses={"204": {"description": "Removed."}, "400": _error("BadRequest"),
                          "404": _error("NotFound")})
def delete_quota(api: SchedulerApi, team):
    api.store.quotas.remove(principals.check_team_name(team))
    return current_app.response_class(status=204)
