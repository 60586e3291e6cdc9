"""The scheduler's Prometheus metrics (GET /metrics; docs/operations.md, "Metrics").

The store, the app and the SQS intake call the one-line helpers below. Each
counts only what was committed: inside a transaction the update is deferred to
its commit (`on_commit`) and dropped on a rollback. Helpers do no I/O beyond
prometheus_client's memory-mapped files, so they stay cheap on the hot paths.

What the database already knows (jobs by status, the cached node list, the SNS
backlog) is read at scrape time by `scrape`, never kept in gauges.
"""
import time

from peewee import fn

from corral.server.metrics import DATABASE_GAUGES, Family, counter, database_gauges, gauge, on_commit, sample_names
from corral.shared.states import ALL, FINAL_STATUSES

from . import liveness
from .models import Job, Node, NodeLease, Schedule

SOURCES = ("api", "batch", "sqs")

# Seconds from submission to start: sub-second on an idle cluster, hours when
# jobs wait for capacity.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                   1800.0, 3600.0, 4 * 3600.0)
# Seconds a job ran: from a shell one-liner to a day-long service.
DURATION_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 2 * 3600.0, 6 * 3600.0,
                    24 * 3600.0)
# Seconds from a schedule's slot to the pass that made its job: under a second on an idle
# scheduler; a slot caught up after downtime waited as long as the downtime.
LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)
RUN_OUTCOMES = ("created", "skipped", "failed")

JOBS_SUBMITTED = Family("counter", "corral_jobs_submitted", "Jobs created, by where the request came from "
                        "(api: POST /jobs, batch: POST /jobs/batch, sqs: the SQS intake); an idempotent repeat "
                        "is not counted.", ("source",), initial=[(s,) for s in SOURCES])
JOBS_FINISHED = Family("counter", "corral_jobs_finished", "Jobs that reached a final status (done, failed: "
                       "retries exhausted, timed out or node lost; cancelled).", ("status",),
                       initial=[(s,) for s in sorted(FINAL_STATUSES)])
DISPATCH_LATENCY = Family("histogram", "corral_job_dispatch_latency_seconds", "Seconds from a job's submission "
                          "to the start of its first attempt (created_at to running_at).",
                          buckets=LATENCY_BUCKETS)
RUN_DURATION = Family("histogram", "corral_job_run_duration_seconds", "Seconds the last attempt of a job ran "
                      "(running_at to finished_at), by the job's final status; jobs cancelled before they ran "
                      "are not observed.", ("status",), initial=[(s,) for s in sorted(FINAL_STATUSES)],
                      buckets=DURATION_BUCKETS)
RETRIES = Family("counter", "corral_job_retries", "Jobs put back to pending for another attempt: after a failed "
                 "attempt with retries left (trigger=failure), or by POST /jobs/{id}/retry (trigger=operator).",
                 ("trigger",), initial=[("failure",), ("operator",)])
TIMEOUTS = Family("counter", "corral_job_timeouts",
                  "Run jobs failed for running past their timeout_secs (default JOB_TIMEOUT_SECS).")
NODE_LOSS_REQUEUES = Family("counter", "corral_job_node_loss_requeues", "Running jobs put back to pending "
                            "because their node was lost or gave the attempt up (not counted as a retry).")
SQS_RECEIVED = Family("counter", "corral_sqs_messages_received", "Messages received from SQS_URL.")
SQS_REJECTED = Family("counter", "corral_sqs_messages_rejected", "Received messages that are not job requests "
                      "(sent to SQS_DLQ_URL, or deleted without one).")
SNS_PUBLISHED = Family("counter", "corral_sns_published", "Job notifications SNS accepted (published from the "
                       "outbox).")
SNS_PUBLISH_FAILURES = Family("counter", "corral_sns_publish_failures", "Failed publishes of a notification "
                              "(it stays in the outbox and is tried again).")
TRACE_CONTEXT_INVALID = Family("counter", "corral_trace_context_invalid", "Submits whose traceparent (header "
                               "or SQS message attribute) was not valid: ignored, and a new trace started.",
                               ("source",), initial=[(s,) for s in SOURCES])
SCHEDULE_RUNS = Family("counter", "corral_schedule_runs", "Slots of schedules recorded as runs, by outcome: "
                       "created (a job), skipped (the overlap or catch-up policy), failed (the job template "
                       "was refused).", ("outcome",), initial=[(o,) for o in RUN_OUTCOMES])
SCHEDULE_LAG = Family("histogram", "corral_schedule_firing_lag_seconds", "Seconds from a schedule's slot to the "
                      "firing pass that made its job (a slot caught up after downtime waited that long).",
                      buckets=LAG_BUCKETS)
EVENT_STREAMS = Family("counter", "corral_event_streams", "Event streams (GET /events) opened, by outcome: "
                       "opened, refused (503: the process's EVENTS_STREAMS_MAX was reached) or refused_credential "
                       "(429: the credential's EVENTS_STREAMS_PER_CREDENTIAL was reached).",
                       ("outcome",), initial=[("opened",), ("refused",), ("refused_credential",)])
EVENT_STREAM_READS = Family("counter", "corral_event_stream_reads", "Reads of stored events by open event "
                            "streams: one per stream when events past its position were committed (an idle "
                            "stream reads nothing).")

FAMILIES = (JOBS_SUBMITTED, JOBS_FINISHED, DISPATCH_LATENCY, RUN_DURATION, RETRIES, TIMEOUTS, NODE_LOSS_REQUEUES,
            SQS_RECEIVED, SQS_REJECTED, SNS_PUBLISHED, SNS_PUBLISH_FAILURES, SCHEDULE_RUNS, SCHEDULE_LAG,
            TRACE_CONTEXT_INVALID, EVENT_STREAMS, EVENT_STREAM_READS)
# Usage per team (store/usage.py), from totals that only grow: (name, field, help).
USAGE_COUNTERS = (("corral_usage_attempts", "attempts", "Job attempts that ended, by team."),
                  ("corral_usage_cpu_seconds", "cpu_seconds", "CPU seconds the nodes measured of ended attempts, "
                                                              "by team."),
                  ("corral_usage_wall_seconds", "wall_seconds", "Wall seconds of ended attempts, by team."),
                  ("corral_usage_memory_mb_seconds", "memory_mb_seconds", "Peak memory (MB) times wall seconds of "
                                                                          "ended attempts, by team."))
USAGE_SAMPLES = tuple(f"{name}_total" for name, _, _ in USAGE_COUNTERS)
# Computed at scrape time (`scrape`); the SNS ones only when SNS_TOPIC_ARN is set.
SCRAPE_GAUGES = ("corral_jobs", "corral_scheduler_nodes", "corral_scheduler_node_list_age_seconds",
                 "corral_schedules", "corral_schedules_overdue_seconds",
                 "corral_sns_pending", "corral_sns_oldest_pending_age_seconds", *DATABASE_GAUGES,
                 *USAGE_SAMPLES)


def exported_names() -> set[str]:
    """Every sample name GET /metrics can carry (for dashboards and their tests)."""
    return sample_names(FAMILIES, SCRAPE_GAUGES)


# ---- one-line helpers for the code paths --------------------------------------------

def submitted(db, source: str, count: int = 1) -> None:
    """`count` jobs were created from `source` (api, batch, sqs), on commit."""
    if count:
        on_commit(db, JOBS_SUBMITTED.labels(source).inc, count)


def moved(db, job: Job, new: str, now: float, changes: dict) -> None:
    """`job` (as it was before) moves to `new` with `changes` (store/status_writer.py), on commit."""
    old = job.status
    if new == "running":
        started(db, [job], now)
    elif new in FINAL_STATUSES:
        ran = now - job.running_at if old == "running" and job.running_at is not None else None
        on_commit(db, _finished, new, ran)
    elif new == "pending" and old == "failed":
        on_commit(db, RETRIES.labels("operator").inc)
    elif new == "pending" and "retry_count" in changes:
        on_commit(db, RETRIES.labels("failure").inc)
    elif new == "pending" and "node_losses" in changes:
        on_commit(db, NODE_LOSS_REQUEUES.inc)


def started(db, jobs: list[Job], now: float) -> None:
    """`jobs` start running now, on commit. Only first attempts are observed (retry_count
    and node_losses 0): a later one's wait includes a failed run, a backoff or a lost node."""
    waits = [now - job.created_at for job in jobs if job.retry_count == 0 and job.node_losses == 0]
    if waits:
        on_commit(db, _observe_all, DISPATCH_LATENCY, waits)


def timed_out(db) -> None:
    on_commit(db, TIMEOUTS.inc)


def sqs_counted(counts: dict[str, int]) -> None:
    """The SQS intake's pass counts (sqs_intake.Intake.count): received, jobs created, rejected."""
    SQS_RECEIVED.inc(counts.get("sqs_received", 0))
    SQS_REJECTED.inc(counts.get("sqs_rejected", 0))
    JOBS_SUBMITTED.labels("sqs").inc(counts.get("sqs_jobs_created", 0))


def trace_context_invalid(source: str) -> None:
    """A submit from `source` came with a traceparent that is not valid."""
    TRACE_CONTEXT_INVALID.labels(source).inc()


def event_stream(outcome: str) -> None:
    """An event stream was opened, or refused for want of room."""
    EVENT_STREAMS.labels(outcome).inc()


def event_stream_read() -> None:
    """An open event stream read its next page of events."""
    EVENT_STREAM_READS.inc()


def sns_published(db, count: int) -> None:
    """`count` notifications were marked published (SNS took them), on commit."""
    if count:
        on_commit(db, SNS_PUBLISHED.inc, count)


def sns_failed(db, count: int) -> None:
    """`count` publishes failed (the notifications stay in the outbox), on commit."""
    if count:
        on_commit(db, SNS_PUBLISH_FAILURES.inc, count)


def schedule_fired(db, lags: list[float], skipped: int, failed: int) -> None:
    """A schedule's pass recorded runs, on commit: a job for each slot in `lags` (now −
    slot), `skipped` slots skipped and `failed` refused."""
    for outcome, count in (("created", len(lags)), ("skipped", skipped), ("failed", failed)):
        if count:
            on_commit(db, SCHEDULE_RUNS.labels(outcome).inc, count)
    if lags:
        on_commit(db, _observe_all, SCHEDULE_LAG, lags)


def _finished(status: str, ran: float | None) -> None:
    JOBS_FINISHED.labels(status).inc()
    if ran is not None:
        RUN_DURATION.labels(status).observe(max(0.0, ran))


def _observe_all(histogram: Family, values: list[float]) -> None:
    for value in values:
        histogram.observe(max(0.0, value))


# ---- scrape time --------------------------------------------------------------------

def scrape(store, clock=time.time) -> list:
    """The gauges GET /metrics computes from the database now."""
    now = clock()
    by_status = dict(Job.select(Job.status, fn.COUNT(Job.id)).group_by(Job.status).tuples())
    nodes: dict[tuple[str, str], int] = {}
    for status, kind, count in (Node.select(Node.status, Node.kind, fn.COUNT(Node.node_id))
                                .group_by(Node.status, Node.kind).tuples()):
        nodes[(status, kind)] = count
    newest = store.nodes.list_synced_at()
    nodes.setdefault((liveness.HEALTHY, liveness.COMPUTE), 0)
    families = [
        gauge("corral_jobs", "Jobs by status now (pending is the queue).", ("status",),
              {(status,): by_status.get(status, 0) for status in ALL}),
        gauge("corral_scheduler_nodes", "Nodes in the scheduler's cached node list, by placement status "
              "(healthy, unhealthy, drained) and kind; healthy compute nodes take work.", ("status", "kind"), nodes),
    ]
    if newest is not None:
        families.append(gauge("corral_scheduler_node_list_age_seconds", "Seconds since the node list was last "
                              "refreshed from the registry.", (), {(): max(0.0, now - newest)}))
    families += _schedule_gauges(now) + _usage_counters(store) + _gpu_gauges()
    if store.settings.sns_topic_arn:
        pending, oldest_age = store.outbox.backlog(now)
        families.append(gauge("corral_sns_pending", "Notifications in the outbox not yet published.", (),
                              {(): pending}))
        families.append(gauge("corral_sns_oldest_pending_age_seconds", "Age of the oldest unpublished "
                              "notification (0 when none waits).", (), {(): oldest_age or 0.0}))
    return families + database_gauges(store.db)


def _usage_counters(store) -> list:
    by_team = {row["key"]: row for row in store.usage.totals("team", 0, 2**31 - 1)}
    return [counter(name, text, ("team",), {(team,): row[field] for team, row in by_team.items()})
            for name, field, text in USAGE_COUNTERS]


def _gpu_gauges() -> list:
    """Each GPU node's devices as its agent last read them (with its lease renewal)."""
    read = list(NodeLease.select(NodeLease.node_id, NodeLease.used_gpu_memory_mb, NodeLease.used_gpu_percent)
                .where(NodeLease.used_gpu_memory_mb.is_null(False)).tuples())
    if not read:
        return []
    return [gauge("corral_node_gpu_memory_used_mb", "Memory in use on a node's GPUs (MB), as its agent last said.",
                  ("node",), {(node,): memory for node, memory, _ in read}),
            gauge("corral_node_gpu_utilization_percent", "Mean utilisation of a node's GPUs, as its agent last "
                  "said.", ("node",), {(node,): percent for node, _, percent in read if percent is not None})]


def _schedule_gauges(now: float) -> list:
    by_state = dict(Schedule.select(Schedule.enabled, fn.COUNT(Schedule.id)).group_by(Schedule.enabled).tuples())
    earliest = Schedule.select(fn.MIN(Schedule.next_run_at)).where(Schedule.enabled).scalar()
    return [
        gauge("corral_schedules", "Schedules by state (enabled: true or false).", ("enabled",),
              {(state,): by_state.get(value, 0) for state, value in (("true", True), ("false", False))}),
        # Past 0 for more than a second or two, slots are not being fired (no scheduler holds the lease).
        gauge("corral_schedules_overdue_seconds", "Seconds the earliest due slot of an enabled schedule is "
              "overdue (0 when none is).", (), {(): max(0.0, now - earliest) if earliest is not None else 0.0}),
    ]
