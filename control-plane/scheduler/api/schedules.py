"""Schedules.

Jobs run at the slots of a cron expression or an interval (schedules.py keeps them,
schedule_loop.py fires them); creating, reading, changing, deleting one and listing its
runs. A schedule belongs to a team: its members see it, its admins (and cluster
admins) make, change and delete it, and its runs are the team's jobs, submitted by
whoever made it."""
from flask import current_app

from corral.server import audit_trail, auth
from corral.server.http import query_int, read_json_object
from corral.server.openapi import body as _body
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.routes import Routes
from corral.shared.contract import respond
from corral.shared.errors import Forbidden, NotFound

from .. import contract, views
from .context import MAX_PAGE, SchedulerApi, require_team_admin

routes = Routes("schedules")


def schedule_answers(api: SchedulerApi, rows: list) -> list[contract.ScheduleAnswer]:
    last = api.schedules.last_runs(rows)
    who = auth.principal()
    return [views.schedule(row, last.get(row.id), not who.sees_env(row.team, row.created_by)) for row in rows]


def visible(api: SchedulerApi, name: str, change: bool = False):
    """The schedule `name` if this request's user may see it (another team's is NotFound,
    as one that does not exist); with `change`, Forbidden unless they administer its team."""
    schedule = api.schedules.get(name)
    who = auth.principal()
    if not who.can_see(schedule.team):
        raise NotFound(f"no schedule {name!r}")
    audit_trail.note(team=schedule.team)
    if change:
        require_team_admin(schedule.team, "change its schedules")
    return schedule


@routes.get("/schedules", access=auth.MEMBER_READ,
            operation_id="listSchedules", summary="Every schedule, by name (a member: their teams').",
            responses={"200": _json(list[contract.ScheduleAnswer], "The schedules.")})
def list_schedules(api: SchedulerApi):
    teams = auth.principal().visible_teams()
    return respond(schedule_answers(api, api.schedules.list_schedules(teams)), of=list[contract.ScheduleAnswer])


@routes.post("/schedules", access=auth.MEMBER,
             operation_id="createSchedule", summary="Create a schedule.",
             description="A job run at every slot of `cron` (in `time_zone`) or every `interval_secs`: each "
                         "slot creates exactly one job (its Idempotency-Key is schedule:<id>:<slot>), in the "
                         "schedule's `team`, submitted by its creator. Takes an admin of that team (or a "
                         "cluster admin). 409 when the name is taken.",
             request_body=_body(contract.ScheduleRequest),
             responses={"201": _json(contract.ScheduleAnswer, "The schedule."), "409": _error("Conflict")})
def create_schedule(api: SchedulerApi):
    body = read_json_object()
    who = auth.principal()
    asked = body.get("team") if isinstance(body.get("team"), str) else None
    team = who.team_to_act_in(asked)
    audit_trail.note(team=team)
    if not who.administers(team):
        raise Forbidden(f"only the admins of team {team!r} and cluster admins make its schedules")
    if asked is not None and who.is_admin:
        api.store.accounts.require_teams({team})
    created = api.schedules.create(dict(body, team=team), api.clock(), created_by=who.user)
    return respond(schedule_answers(api, [created])[0], status=201)


@routes.get("/schedules/<name>", access=auth.MEMBER_READ,
            operation_id="getSchedule", summary="Read a schedule.",
            responses={"200": _json(contract.ScheduleAnswer, "The schedule."), "404": _error("NotFound")})
def read_schedule(api: SchedulerApi, name):
    return respond(schedule_answers(api, [visible(api, name)])[0])


@routes.patch("/schedules/<name>", access=auth.MEMBER,
              operation_id="changeSchedule", summary="Change, enable or disable it.",
              description="The fields given replace the schedule's own (not its name or team), checked as a "
                          "whole as POST /schedules checks one. A change of its timing, or enabling it, "
                          "computes its next slot from now.",
              request_body=_body(contract.ScheduleChange),
              responses={"200": _json(contract.ScheduleAnswer, "The schedule."), "404": _error("NotFound")})
def change_schedule(api: SchedulerApi, name):
    visible(api, name, change=True)
    return respond(schedule_answers(api, [api.schedules.update(name, read_json_object(), api.clock())])[0])


@routes.delete("/schedules/<name>", access=auth.MEMBER,
               operation_id="deleteSchedule", summary="Delete a schedule.",
               description="The jobs it created stay.",
               responses={"204": {"description": "Deleted."}, "404": _error("NotFound")})
def delete_schedule(api: SchedulerApi, name):
    visible(api, name, change=True)
    api.schedules.delete(name)
    return current_app.response_class(status=204)


@routes.get("/schedules/<name>/runs", access=auth.MEMBER_READ,
            operation_id="listScheduleRuns", summary="A schedule's runs, newest first.",
            description="Each slot that fired (its job and the job's status) or was skipped (why).",
            parameters=[{"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                                    "maximum": 1000, "default": 100}}],
            responses={"200": _json(list[contract.ScheduleRunAnswer], "The runs."),
                       "400": _error("BadRequest"), "404": _error("NotFound")})
def schedule_runs(api: SchedulerApi, name):
    limit = query_int("limit", 100, 1, MAX_PAGE)
    visible(api, name)
    return respond([views.schedule_run(*row) for row in api.schedules.runs(name, limit)],
                   of=list[contract.ScheduleRunAnswer])
