"""Concurrency limits.

At most N jobs with a `concurrency_key` placed or running at once, across the cluster;
listing, setting and removing a key's limit."""
from flask import current_app

from corral.server import auth
from corral.server.http import read_json_object
from corral.server.openapi import body as _body
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.routes import Routes
from corral.shared.contract import respond

from .. import contract, validation, views
from .context import SchedulerApi

routes = Routes("jobs")


@routes.get("/concurrency", access=auth.READ,
            operation_id="listConcurrencyLimits", summary="The concurrency limits set.",
            responses={"200": _json(list[contract.ConcurrencyLimitAnswer], "Every limit, by key.")})
def list_concurrency(api: SchedulerApi):
    return respond([views.concurrency(*row) for row in api.store.limits.concurrency_limits()],
                   of=list[contract.ConcurrencyLimitAnswer])


@routes.put("/concurrency/<key>", access=auth.OPERATOR,
            operation_id="setConcurrencyLimit", summary="Set a key's limit.",
            description="At most `limit` jobs with this `concurrency_key` are placed or running at once, "
                        "across the cluster. Lowering it ends nothing: jobs over the limit finish.",
            request_body=_body(contract.ConcurrencyLimitRequest),
            responses={"200": _json(contract.ConcurrencyLimitAnswer, "The limit."),
                       "404": _error("NotFound")})
def set_concurrency(api: SchedulerApi, key):
    key = validation.concurrency_key(key)
    limit = contract.ConcurrencyLimitRequest.check(read_json_object()).limit
    api.store.limits.set_concurrency_limit(key, limit)
    api.scheduler.limits_changed(api.clock())
    return respond(views.concurrency(*api.store.limits.concurrency_limits(key)[0]))


@routes.delete("/concurrency/<key>", access=auth.OPERATOR,
               operation_id="removeConcurrencyLimit", summary="Remove a key's limit.",
               description="The key is unlimited from then on.",
               responses={"204": {"description": "Removed."}, "400": _error("BadRequest"),
                          "404": _error("NotFound")})
def remove_concurrency(api: SchedulerApi, key):
    key = validation.concurrency_key(key)
    api.store.limits.remove_concurrency_limit(key)
    api.scheduler.limits_changed(api.clock())
    return current_app.response_class(status=204)
