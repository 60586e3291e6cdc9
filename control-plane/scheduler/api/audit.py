"""The audit log over the API (docs/security.md, "Audit log"): cluster admins and the
cluster-wide reader see every entry, a team's admins their team's; nobody else."""
from flask import request

from corral.server import auth
from corral.server.http import query_int
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.openapi import query as _query
from corral.server.principals import TEAM_ADMIN, TEAM_PATTERN, USER_PATTERN
from corral.server.routes import Routes
from corral.shared.contract import respond
from corral.shared.errors import BadRequest, Forbidden
from corral.shared.timeutil import iso

from .. import contract, validation
from ..store.audit import AuditFilter
from .context import MAX_PAGE, SchedulerApi

routes = Routes("users")
ACTION_PATTERN = r"^[A-Za-z]{1,64}$"


@routes.get("/audit", access=auth.MEMBER_READ, operation_id="listAudit",
            summary="Who changed what: the audit log, newest first (admins).",
            description="Every state-changing request of a user, refusals included. A team's admins see "
                        "their teams' entries; cluster admins and the cluster-wide reader see all.",
            parameters=[
                _query("user", "Only this user's requests.", {"type": "string", "pattern": USER_PATTERN}),
                _query("team", "Only requests in this team.", {"type": "string", "pattern": TEAM_PATTERN}),
                _query("action", "Only this action (an operationId, such as cancelJob).",
                       {"type": "string", "pattern": ACTION_PATTERN}),
                _query("since", "Only entries at or after this time (ISO-8601 with Z or an offset, or epoch "
                                "seconds).", {"type": "string"}),
                _query("until", "Only entries before this time (ISO-8601 with Z or an offset, or epoch seconds).",
                       {"type": "string"}),
                _query("limit", "Page size.", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 100}),
                _query("before", "Cursor: only entries older than this id (`next_before`).",
                       {"type": "integer", "minimum": 1}),
            ],
            responses={"200": _json(contract.AuditPage, "A page of entries, newest first."),
                       "400": _error("BadRequest")})
def list_audit(api: SchedulerApi):
    who = auth.principal()
    teams = None
    if not who.sees_every_team:
        teams = frozenset(team for team, role in who.teams.items() if role == TEAM_ADMIN)
        if not teams:
            raise Forbidden("the audit log is for cluster admins, the cluster-wide reader and team admins")
    action = request.args.get("action") or None
    if action is not None and not (action.isascii() and action.isalpha() and len(action) <= 64):
        raise BadRequest("query parameter 'action' must be an operationId such as cancelJob")
    where = AuditFilter(user=validation.query_user(request.args, "user"),
                        team=validation.query_team(request.args, "team"), action=action,
                        since=_instant("since"), until=_instant("until"),
                        before=query_int("before", 0, 1, 2**63 - 1) or None, teams=teams)
    limit = query_int("limit", 100, 1, MAX_PAGE)
    rows = api.store.audit.page(where, limit + 1)
    return respond(contract.AuditPage(
        events=[contract.AuditEntry(id=row.id, at=iso(row.at) or "", user=row.user, team=row.team, action=row.action,
                                    target=row.target, method=row.method, path=row.path, address=row.address,
                                    status=row.status, token_id=row.token_id) for row in rows[:limit]],
        next_before=rows[limit - 1].id if len(rows) > limit else None))


def _instant(key: str) -> float | None:
    """A time in the query: epoch seconds, or ISO-8601 as GET /jobs takes it."""
    raw = request.args.get(key) or ""
    if raw.isascii() and raw.replace(".", "", 1).isdigit():
        return float(raw)
    return validation.query_instant(request.args, key)
