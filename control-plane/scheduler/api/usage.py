"""Usage over the API (docs/scheduling.md, "Usage"): what the ended attempts used, per
day, week, user or team, and each team's and user's standing in fair share. Cluster
admins and readers see every team's; a member their teams'."""
import datetime

from flask import request

from corral.server import auth
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.openapi import query as _query
from corral.server.principals import TEAM_PATTERN, USER_PATTERN
from corral.server.routes import Routes
from corral.shared.contract import respond
from corral.shared.errors import BadRequest

from .. import contract, fairshare, validation
from ..store.usage import DAY_SECS, GROUPS, day_of
from .context import SchedulerApi

routes = Routes("users")
DEFAULT_DAYS = 7
MAX_DAYS = 3660


@routes.get("/usage", access=auth.MEMBER_READ, operation_id="getUsage",
            summary="What the jobs' ended attempts used, per day, week, user or team.",
            description="CPU seconds, wall seconds, memory (peak × wall time, MB-seconds) and GPU seconds of every "
                        "attempt that ended in [from, to) (UTC days), summed by `group_by`. A member sees their "
                        "teams' only.",
            parameters=[
                _query("team", "Only this team's.", {"type": "string", "pattern": TEAM_PATTERN}),
                _query("user", "Only this user's.", {"type": "string", "pattern": USER_PATTERN}),
                _query("from", "The first day (YYYY-MM-DD, UTC; default: 7 days ago).",
                       {"type": "string", "format": "date"}),
                _query("to", "The day after the last (YYYY-MM-DD; default: tomorrow).",
                       {"type": "string", "format": "date"}),
                _query("group_by", "How to sum.", {"type": "string", "enum": list(GROUPS), "default": "day"}),
            ],
            responses={"200": _json(contract.UsageAnswer, "The sums, in the order of their group."),
                       "400": _error("BadRequest")})
def get_usage(api: SchedulerApi):
    today = day_of(api.clock())
    first = _day("from", today - DEFAULT_DAYS + 1)
    end = _day("to", today + 1)
    if not first < end or end - first > MAX_DAYS:
        raise BadRequest(f"'from' must come before 'to', at most {MAX_DAYS} days apart")
    group_by = request.args.get("group_by") or "day"
    if group_by not in GROUPS:
        raise BadRequest(f"query parameter 'group_by' must be one of {', '.join(GROUPS)}")
    rows = api.store.usage.totals(group_by, first, end - 1, team=validation.query_team(request.args, "team"),
                                  user=validation.query_user(request.args, "user"),
                                  teams=auth.principal().visible_teams())
    return respond(contract.UsageAnswer(
        group_by=group_by, from_day=_date(first), to_day=_date(end),
        rows=[contract.UsageRow(group=_label(group_by, row["key"]), **{k: v for k, v in row.items() if k != "key"})
              for row in rows]))


@routes.get("/usage/fair-share", access=auth.MEMBER_READ, operation_id="getFairShare",
            summary="Each team's share, decayed usage and fair-share factor, and its users'.",
            description="The order in which teams, and users within a team, take their turns at placement: the "
                        "highest factor first. A member sees their teams only.",
            responses={"200": _json(contract.FairShareAnswer, "The standings.")})
def get_fair_share(api: SchedulerApi):
    fair = api.store.fair_share
    now = api.clock()
    teams, users = fair.standings(now)
    visible = auth.principal().visible_teams()
    shown = [fair_share_team(name, teams, users, api.store.context.teams.shares())
             for name in teams if visible is None or name in visible]
    shown.sort(key=lambda team: (-team.factor, team.team))
    return respond(contract.FairShareAnswer(enabled=fair.enabled(), half_life_secs=fair.half_life, teams=shown))


def fair_share_team(team: str, teams: dict, users: dict, weights: dict, user: str | None = None
                    ) -> contract.FairShareTeam:
    """A team's standing with its users' (only `user`'s, when given), the highest factor first."""
    standing = teams.get(team) or fairshare.standings({team: 1.0}, {})[team]
    members = sorted(((name, s) for (owner, name), s in users.items() if owner == team and user in (None, name)),
                     key=lambda item: (-item[1].factor, item[0]))
    return contract.FairShareTeam(team=team, weight=weights.get(team, fairshare.DEFAULT_SHARE), **standing.as_dict(),
                                  users=[contract.FairShareUser(user=name, **s.as_dict()) for name, s in members])


def _day(name: str, default: int) -> int:
    raw = request.args.get(name) or ""
    if not raw:
        return default
    try:
        return day_of(datetime.datetime.strptime(raw, "%Y-%m-%d").replace(tzinfo=datetime.timezone.utc).timestamp())
    except ValueError:
        raise BadRequest(f"query parameter {name!r} must be a day such as 2026-12-01") from None


def _date(day: int) -> str:
    return datetime.datetime.fromtimestamp(day * DAY_SECS, datetime.timezone.utc).strftime("%Y-%m-%d")


def _label(group_by: str, key) -> str:
    """A group's name: the day, the Monday a week starts on, or the user's or team's name."""
    if group_by == "day":
        return _date(int(key))
    if group_by == "week":
        return _date(int(key) * 7 - 3)
    return str(key)
