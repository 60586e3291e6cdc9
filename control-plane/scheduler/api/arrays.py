"""Job arrays (POST /jobs with `array` makes one).

An array and its jobs by status, and cancelling what has not finished of it."""
from corral.server import auth
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.routes import Routes
from corral.shared.contract import respond

from .. import contract, views
from .context import SchedulerApi

routes = Routes("jobs")


@routes.get("/arrays/<array_id>", access=auth.MEMBER_READ,
            operation_id="getArray", summary="An array and its jobs by status.",
            responses={"200": _json(contract.ArraySummary, "The array."), "404": _error("NotFound")})
def read_array(api: SchedulerApi, array_id):
    api.require_array(array_id)
    return respond(views.array_summary(*api.store.jobs.array(array_id)))


@routes.post("/arrays/<array_id>/cancel", access=auth.MEMBER,
             operation_id="cancelArray", summary="Cancel what has not finished of an array.",
             description="Every pending or running job of the array is cancelled, in one transaction (running "
                         "ones are ended by their nodes); done and failed ones stay.",
             responses={"200": _json(contract.ArraySummary, "The array after the cancel."),
                        "404": _error("NotFound")})
def cancel_array(api: SchedulerApi, array_id):
    api.require_array(array_id, change=True)
    api.scheduler.cancel_array(array_id, api.clock())
    return respond(views.array_summary(*api.store.jobs.array(array_id)))
