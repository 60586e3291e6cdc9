"""Schedules.

Jobs run at the slots of a cron expression or an interval (schedules.py keeps them,
schedule_loop.py fires them); creating, reading, changing, deleting one and listing its
runs."""
from flask import current_app

from corral.server import auth
from corral.server.http import query_int, read_json_object
from corral.server.openapi import body as _body
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.routes import Routes
from corral.shared.contract import respond

from .. import contract, views
from .context import MAX_PAGE, SchedulerApi

routes = Routes("schedules")


def schedule_answers(api: SchedulerApi, rows: list) -> list[contract.ScheduleAnswer]:
    last = api.schedules.last_runs(rows)
    return [views.schedule(row, last.get(row.id), auth.read_only()) for row in rows]


@routes.get("/schedules", access=auth.READ,
            operation_id="listSchedules", summary="Every schedule, by name.",
            responses={"200": _json(list[contract.ScheduleAnswer], "The schedules.")})
def list_schedules(api: SchedulerApi):
    return respond(schedule_answers(api, api.schedules.list_schedules()), of=list[contract.ScheduleAnswer])


@routes.post("/schedules", access=auth.OPERATOR,
             operation_id="createSchedule", summary="Create a schedule.",
             description="A job run at every slot of `cron` (in `time_zone`) or every `interval_secs`: each "
                         "slot creates exactly one job (its Idempotency-Key is schedule:<id>:<slot>). 409 "
                         "when the name is taken.",
             request_body=_body(contract.ScheduleRequest),
             responses={"201": _json(contract.ScheduleAnswer, "The schedule."), "409": _error("Conflict")})
def create_schedule(api: SchedulerApi):
    return respond(schedule_answers(api, [api.schedules.create(read_json_object(), api.clock())])[0], status=201)


@routes.get("/schedules/<name>", access=auth.READ,
            operation_id="getSchedule", summary="Read a schedule.",
            responses={"200": _json(contract.ScheduleAnswer, "The schedule."), "404": _error("NotFound")})
def read_schedule(api: SchedulerApi, name):
    return respond(schedule_answers(api, [api.schedules.get(name)])[0])


@routes.patch("/schedules/<name>", access=auth.OPERATOR,
              operation_id="changeSchedule", summary="Change, enable or disable it.",
              description="The fields given replace the schedule's own (not its name), checked as a whole as "
                          "POST /schedules checks one. A change of its timing, or enabling it, computes its "
                          "next slot from now.",
              request_body=_body(contract.ScheduleChange),
              responses={"200": _json(contract.ScheduleAnswer, "The schedule."), "404": _error("NotFound")})
def change_schedule(api: SchedulerApi, name):
    return respond(schedule_answers(api, [api.schedules.update(name, read_json_object(), api.clock())])[0])


@routes.delete("/schedules/<name>", access=auth.OPERATOR,
               operation_id="deleteSchedule", summary="Delete a schedule.",
               description="The jobs it created stay.",
               responses={"204": {"description": "Deleted."}, "404": _error("NotFound")})
def delete_schedule(api: SchedulerApi, name):
    api.schedules.delete(name)
    return current_app.response_class(status=204)


@routes.get("/schedules/<name>/runs", access=auth.READ,
            operation_id="listScheduleRuns", summary="A schedule's runs, newest first.",
            description="Each slot that fired (its job and the job's status) or was skipped (why).",
            parameters=[{"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                                    "maximum": 1000, "default": 100}}],
            responses={"200": _json(list[contract.ScheduleRunAnswer], "The runs."),
                       "400": _error("BadRequest"), "404": _error("NotFound")})
def schedule_runs(api: SchedulerApi, name):
    limit = query_int("limit", 100, 1, MAX_PAGE)
    return respond([views.schedule_run(*row) for row in api.schedules.runs(name, limit)],
                   of=list[contract.ScheduleRunAnswer])
