"""The scheduler's counts.

Job counts, the SQS intake's counters and the SNS outbox backlog now, and the sampled
history the dashboard's charts draw."""
from flask import request

from corral.server import auth
from corral.server.http import query_choice, query_float
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.openapi import query as _query
from corral.server.routes import Routes
from corral.shared.contract import respond

from .. import contract, sampler, views
from .context import SchedulerApi

routes = Routes("meta")

MAX_UNIX_SECS = 253402300799.0  # 9999-12-31T23:59:59Z: GET /stats/history?since= at most


@routes.get("/stats", access=auth.READ,
            operation_id="getStats", summary="Job counts, SQS intake and SNS outbox.",
            description="Job counts by status, the SQS intake's counters and the SNS outbox backlog: "
                        "`sns.pending` growing, or `sns.oldest_pending_age_secs` large, means notifications "
                        "cannot be published (see docs/sqs-sns.md).",
            responses={"200": _json(contract.Stats, "The counts.")})
def stats(api: SchedulerApi):
    store = api.store
    return respond(views.stats(store.stats.job_counts(), store.stats.counters(), api.settings,
                               *store.outbox.backlog(api.clock())))


@routes.get("/stats/history", access=auth.READ,
            operation_id="getStatsHistory", summary="Samples of the cluster's activity and usage, for charts.",
            description="Every STATS_INTERVAL_SECS one sample, kept STATS_RETENTION_SECS: the jobs that reached "
                        "each final status and the first attempts that started (with their dispatch latency, "
                        "p50 and p95) since the previous sample, pending and running jobs, and each node's "
                        "slots, memory and CPU reserved and used. Oldest first; the dashboard's charts draw them.",
            parameters=[
                _query("since", "Only samples taken after this time (unix seconds); default: every sample kept.",
                       {"type": "number", "minimum": 0, "maximum": 253402300799}),
                _query("node_id", "Only this node's usage in each sample (a node page's chart); default: every "
                       "node's.", {"type": "string"}),
                _query("nodes", "`none`: no node's usage (`nodes` empty in each sample; the answer stays small "
                       "on a large fleet).", {"type": "string", "enum": ["all", "none"], "default": "all"}),
            ],
            responses={
                "200": _json(contract.StatsHistory, "The samples."),
                "400": _error("BadRequest"),
            })
def stats_history(api: SchedulerApi):
    since = query_float("since", 0.0, MAX_UNIX_SECS)
    node_id = request.args.get("node_id") or None
    nodes = query_choice("nodes", ("all", "none")) != "none"
    return respond(views.stats_history(sampler.history(since), api.settings, node_id, nodes))
