"""What the scheduler's API answers.

Jobs, events, nodes and /stats as the answer models of contract.py, filled from the rows
the store reads, and the items of batch answers from the store's outcomes (outcomes.py).
Pure: no database, no Flask."""
import datetime
import functools
import zoneinfo
from typing import Any

from corral.shared import wire
from corral.shared.contract import built
from corral.shared.states import ACTIVE, ALL
from corral.shared.timeutil import iso

from . import contract, gangs, samples, waiting
from .models import Job, JobArray, JobEvent, Node, Schedule, ScheduleRun, StatsSample
from .outcomes import ItemOutcome, JobState, LogPosition
from .placement import NodeInfo
from .settings import SchedulerSettings


# What the read-only token sees of an env var's value: variables often carry secrets.
HIDDEN = "(hidden)"


def hidden(env: dict | None) -> dict:
    """Env vars with their values hidden, their names kept."""
    return {name: HIDDEN for name in env or {}}


def job(row: Job, settings: SchedulerSettings, now: float, service_grant: str | None = None,
        hide_env: bool = False, members: list[dict] | None = None) -> contract.Job:
    """A job as the API shows it at `now`; a node's agent gets the job's `service_grant`
    too; with `hide_env` (the read-only token) its env var values are hidden; a job of
    many nodes lists its `members` when given (store.gangs.members)."""
    # The row's values read from its data dict, as each field's descriptor would
    # (absent: None): a batch answers 500 of these, and the 36 descriptor calls
    # each were a fifth of a batch's CPU.
    d = row.__data__.get
    job_type, limits, constraints = d("job_type"), d("limits"), d("constraints")
    node_id, status = d("node_id"), d("status")
    timeout = (settings.job_timeout_secs if d("timeout_secs") is None else d("timeout_secs")) \
        if job_type == "run" else None
    running_at = d("running_at") if status == "running" else None
    fields = {
        # A job of many nodes holds none itself: its members do.
        "job_id": row.job_id, "name": d("name"), "node_id": None if node_id == gangs.GANG_NODE else node_id,
        "instance_id": d("instance_id"),
        "command": d("command"), "deploy_url": d("deploy_url"), "deploy_sha256": d("deploy_sha256"),
        "job_type": job_type, "port": d("port"), "health_path": d("health_path"),
        "env_vars": hidden(d("env_vars")) if hide_env else d("env_vars") or {},
        "memory_mb": d("memory_mb"), "cpu_percent": d("cpu_percent"),
        "max_processes": d("max_processes"), "disk_mb": _disk_mb(d("disk_mb"), settings),
        "gpus": d("gpus") or 0, "gpu_model": d("gpu_model"), "gpu_memory_mb": d("gpu_memory_mb"),
        "resources": d("resources") or {}, "nodes": d("nodes") or 1,
        "gpus_assigned": (d("gpus_assigned") or None) if node_id is not None and status in ACTIVE else None,
        "gpu_seconds": _gpu_seconds(d("gpus"), d("running_at"), d("finished_at"), status, now),
        "peak_gpu_memory_mb": d("peak_gpu_memory_mb"), "gpu_utilization_percent": d("gpu_utilization_percent"),
        "status": status, "attempt": d("attempt"), "retry_count": d("retry_count"),
        "max_retries": d("max_retries"), "next_attempt_at": iso(d("next_attempt_at")),
        "on_node_lost": d("on_node_lost"), "node_losses": d("node_losses"),
        "exit_code": d("exit_code"),
        "stdout": d("stdout"), "stderr": d("stderr"), "oom_killed": d("oom_killed"),
        "peak_memory_bytes": d("peak_memory_bytes"), "cpu_seconds": d("cpu_seconds"), "ended_by": d("ended_by"),
        "limits_enforced": d("limits_enforced"), "limits": limits and built(contract.Limits, limits),
        "private_tmp": d("private_tmp"),
        "timeout_secs": timeout, "deadline": iso(running_at + timeout) if timeout and running_at else None,
        "signal_before_end": None if d("warn_signal") is None else built(contract.SignalBeforeEndAnswer, {
            "signal": d("warn_signal"), "secs": d("warn_secs")}),
        "kill_signal": d("kill_signal") or wire.DEFAULT_KILL_SIGNAL,
        "kill_grace_secs": settings.job_kill_grace_secs if d("kill_grace_secs") is None else d("kill_grace_secs"),
        "preemptible": d("preemptible") is not False, "preemptions": d("preemptions") or 0,
        "stop_reason": d("stop_reason") if status == "running" else None,
        "stop_at": iso(d("stop_at")) if status == "running" else None,
        "created_at": iso(d("created_at")), "placed_at": iso(d("placed_at")),
        "running_at": iso(d("running_at")), "finished_at": iso(d("finished_at")),
        "priority": d("priority"), "constraints": constraints and [_constraint(c) for c in constraints],
        "pool": d("pool"), "run_at": iso(d("run_at")),
        "depends_on": _depends_on(d("depends_on")),
        "on_dependency_failure": d("on_dependency_failure") or "cancel",
        "array_id": None if d("array_id") is None else f"array-{d('array_id')}", "array_index": d("array_index"),
        "concurrency_key": d("concurrency_key"), "team": d("team"), "submitted_by": d("submitted_by"),
        "schedule": d("schedule"), "slot": iso(d("slot")),
        "traceparent": d("traceparent"), "tracestate": d("tracestate"),
        "reserved": None if node_id is None or d("reserved_memory_mb") is None else built(contract.Resources, {
            "memory_mb": d("reserved_memory_mb"), "cpu_percent": d("reserved_cpu_percent")}),
        "pending_reason": None if status != "pending" else _pending_reason(waiting.current(
            node_id=node_id, next_attempt_at=d("next_attempt_at"), attempt=d("attempt"),
            retry_count=d("retry_count"), stored=d("pending_reason"), now=now,
            waits_on_dependency=bool(d("dependencies_left")))),
    }
    if service_grant is not None:
        fields["service_grant"] = service_grant
    if d("gang") is not None:
        fields["gang"] = built(contract.GangPlace, d("gang"))
    if members is not None:
        fields["members"] = [built(contract.GangMember, m) for m in members]
    return built(contract.Job, fields)


def _gpu_seconds(gpus: int | None, running_at: float | None, finished_at: float | None, status: str,
                 now: float) -> float | None:
    """A job's GPUs times the wall time of its attempt: so far while it runs, whole once it
    ended; None without GPUs or a start."""
    if not gpus or running_at is None:
        return None
    end = now if status == "running" else finished_at
    return None if end is None else round(gpus * max(0.0, end - running_at), 3)


def _disk_mb(requested: int | None, settings: SchedulerSettings) -> int | None:
    """A job's disk limit: its own, else the cluster's default (0 there: none). Resolved
    when shown, so the agent that claims it gets the value in force then."""
    if requested is not None:
        return requested
    return settings.job_default_disk_mb or None


def _depends_on(column: list | None) -> list[contract.JobDependsOn] | None:
    if not column:
        return None
    return [built(contract.JobDependsOn, {"job_id": f"job-{other}", "condition": condition})
            for other, condition in column]


def _constraint(column: list) -> contract.JobConstraint:
    label, op, value = column
    return built(contract.JobConstraint, {"label": label, "op": op} if value is None else
                 {"label": label, "op": op, "value": value})


def _pending_reason(reason: waiting.Reason) -> contract.PendingReason:
    """The answer of a pending job's reason. The two that most answers show (not looked
    at yet; placed on a node) are built once each and shared: answers are only read."""
    if reason is waiting.WAITING_FOR_CAPACITY:
        return _waiting_for_capacity()
    if reason.code == "placed" and "node_id" in reason.details:  # a gang's has none: its members hold nodes
        return _placed(reason.details["node_id"])
    return _reason(reason)


@functools.cache
def _waiting_for_capacity() -> contract.PendingReason:
    return _reason(waiting.WAITING_FOR_CAPACITY)


@functools.lru_cache(maxsize=4096)
def _placed(node_id: str) -> contract.PendingReason:
    return _reason(waiting.placed(node_id))


def _reason(reason: waiting.Reason) -> contract.PendingReason:
    fields = reason.as_dict()
    for name in ("constraint", "constraints"):
        if name in fields:
            value = fields[name]
            fields[name] = (_constraint([value["label"], value["op"], value.get("value")]) if name == "constraint"
                            else [_constraint([c["label"], c["op"], c.get("value")]) for c in value])
    return built(contract.PendingReason, fields)


def array_created(array: JobArray, first: int, last: int) -> contract.ArrayCreated:
    return contract.ArrayCreated.model_validate({
        "array_id": f"array-{array.id}", "count": array.count, "parallel": array.parallel,
        "first_job_id": f"job-{first}", "last_job_id": f"job-{last}"})


def array_summary(array: JobArray, first: int, last: int, counts: dict[str, int]) -> contract.ArraySummary:
    return contract.ArraySummary.model_validate({
        "array_id": f"array-{array.id}", "count": array.count, "parallel": array.parallel,
        "first_job_id": f"job-{first}", "last_job_id": f"job-{last}", "created_at": iso(array.created_at),
        "jobs": {status: counts.get(status, 0) for status in ALL}})


def schedule(row: Schedule, last_run: tuple[ScheduleRun, str | None] | None,
             hide_env: bool = False) -> contract.ScheduleAnswer:
    template = dict(row.job, env_vars=hidden(row.job.get("env_vars"))) if hide_env and row.job.get("env_vars") \
        else row.job
    return contract.ScheduleAnswer.model_validate({
        "name": row.name, "cron": row.cron, "interval_secs": row.interval_secs, "start_at": iso(row.start_at),
        "time_zone": row.time_zone, "job": template, "overlap": row.overlap, "catch_up": row.catch_up,
        "enabled": row.enabled, "next_run_at": iso(row.next_run_at),
        "next_run_local": local_time(row.next_run_at, row.time_zone),
        "last_job_id": None if row.last_job_id is None else f"job-{row.last_job_id}",
        "last_run": None if last_run is None else schedule_run(*last_run),
        "team": row.team, "created_by": row.created_by,
        "created_at": iso(row.created_at), "updated_at": iso(row.updated_at)})


def local_time(ts: float | None, zone: str) -> str | None:
    """`ts` in `zone` with its offset: to the second for a whole second (a cron slot),
    else to the millisecond as UTC times are shown."""
    if ts is None:
        return None
    at = datetime.datetime.fromtimestamp(ts, zoneinfo.ZoneInfo(zone))
    return at.isoformat(timespec="seconds" if ts == int(ts) else "milliseconds")


def schedule_run(row: ScheduleRun, status: str | None) -> contract.ScheduleRunAnswer:
    return contract.ScheduleRunAnswer.model_validate({
        "slot": iso(row.slot), "job_id": None if row.job_id is None else f"job-{row.job_id}", "status": status,
        "skipped": row.skipped})


def concurrency(key: str, limit: int, active: int, team: str) -> contract.ConcurrencyLimitAnswer:
    return contract.ConcurrencyLimitAnswer(key=key, limit=limit, active=active, team=team)


def event(row: JobEvent) -> contract.JobEvent:
    return contract.JobEvent.model_validate({
        "at": iso(row.at), "from": row.from_status, "to": row.to_status,
        "attempt": row.attempt, "node_id": row.node_id, "reason": row.reason})


def node(row: Node, capacity: int, info: NodeInfo,
         used: tuple[int | None, int | None, int | None, float | None] | None) -> contract.SchedulerNode:
    """A node of the scheduler's cached list (GET /nodes), with the slots and resources
    its jobs hold (`info`, as placement sees it) and use (`used`, from its lease)."""
    return contract.SchedulerNode.model_validate({
        "node_id": row.node_id, "address": row.address, "kind": row.kind,
        # Placement counts a healthy drained node as `drained`; here health and drain are apart.
        "status": "healthy" if row.status in ("healthy", "drained") else "unhealthy", "drained": bool(row.drained),
        "refusing_work": row.refusing_work,
        "slots": row.slots, "capacity": capacity, "slots_used": capacity - info.free_slots,
        "max_memory_mb": row.max_memory_mb, "max_cpu_percent": row.max_cpu_percent,
        "labels": info.labels, "pool": info.pool,
        "allocatable": {"memory_mb": info.allocatable_memory_mb, "cpu_percent": info.allocatable_cpu_percent},
        "reserved": {"memory_mb": info.reserved_memory_mb, "cpu_percent": info.reserved_cpu_percent},
        "used": None if used is None or used[0] is None else {"memory_mb": used[0], "cpu_percent": used[1]},
        "gpus": [{"index": str(d.get("index", "")), "uuid": d["uuid"], "model": str(d.get("model") or ""),
                  "memory_mb": int(d.get("memory_mb") or 0),
                  "job_id": None if d["uuid"] not in info.gpus_held else f"job-{info.gpus_held[d['uuid']]}"}
                 for d in row.gpus or () if isinstance(d, dict) and d.get("uuid")],
        "resources": dict(row.resources or {}), "resources_reserved": dict(info.resources_held),
        "gpus_used": None if used is None or used[2] is None else {
            "memory_mb": used[2], "utilization_percent": used[3]},
        "last_heartbeat": iso(row.last_heartbeat), "synced_at": iso(row.synced_at),
    })


def stats(by_status: dict[str, int], counters: dict[str, int], settings: SchedulerSettings,
          outbox_pending: int, outbox_oldest_age: float | None) -> contract.Stats:
    """Job counts by status, SQS intake counters and the SNS outbox backlog (GET /stats)."""
    return contract.Stats.model_validate({
        "jobs": {status: by_status.get(status, 0) for status in ALL},
        "sqs": {"enabled": bool(settings.sqs_url), "dead_letter_queue": bool(settings.sqs_dlq_url),
                **{name: counters.get(f"sqs_{name}", 0) for name in
                   ("received", "jobs_created", "duplicates", "rejected", "dead_lettered", "dropped",
                    "requeued")}},
        "sns": {"enabled": bool(settings.sns_topic_arn), "pending": outbox_pending,
                "oldest_pending_age_secs": None if outbox_oldest_age is None else round(outbox_oldest_age, 3),
                "published": counters.get("sns_published", 0),
                "publish_failures": counters.get("sns_publish_failures", 0)},
    })


def stats_history(rows: list[StatsSample], settings: SchedulerSettings, node_id: str | None = None,
                  nodes: bool = True) -> contract.StatsHistory:
    """The samples kept (GET /stats/history), oldest first; with `node_id`, only that
    node's usage; without `nodes`, no node's."""
    return contract.StatsHistory.model_validate({
        "interval_secs": settings.stats_interval_secs, "retention_secs": settings.stats_retention_secs,
        "samples": [dict(samples.answer(row.data, node_id, nodes), at=iso(row.at), since=iso(row.since))
                    for row in rows],
    })


def lease(node_id: str, lease_secs: float, running: list[Job], now: float) -> contract.Lease:
    """A renewed lease (POST /nodes/{node_id}/lease) and the attempts running on the node,
    with the stop asked of each whose stop has begun."""
    attempts = []
    for job in running:
        stop = stop_now(job, now)
        attempts.append(contract.RunningAttempt(job_id=job.job_id, attempt=job.attempt, **(
            {} if stop is None else {"stop": stop})))
    return contract.Lease(node_id=node_id, lease_secs=lease_secs, running=attempts)


def stop_now(job: Job, now: float) -> str | None:
    """The stop the scheduler asks of a running attempt at `now` (its reason), or None."""
    d = job.__data__.get
    return d("stop_reason") if d("stop_reason") is not None and (d("stop_at") or 0.0) <= now else None


def item_result(outcome: ItemOutcome[Any], applied: dict[str, Any] | None = None,
                refusal_fields: tuple[str, ...] = ()) -> dict[str, Any]:
    """One item of a batch's answer: its index and job, and the code the request alone
    would have had; `applied` (code 200) what it did, else its error and the fields
    of the error named in `refusal_fields`."""
    error = outcome.error
    if error is None:
        return {"index": outcome.index, "job_id": outcome.job_id, "code": 200, **(applied or {})}
    return {"index": outcome.index, "job_id": outcome.job_id, "code": error.status, "error": error.message,
            **{name: value for name, value in error.fields.items() if name in refusal_fields}}


def report_result(outcome: ItemOutcome[JobState]) -> dict[str, Any]:
    """A report of POST /jobs/reports: the job's status and attempt after it (200)."""
    state = outcome.value
    return item_result(outcome, None if state is None else {"job_status": state.status, "attempt": state.attempt})


def log_position(position: LogPosition) -> dict[str, Any]:
    """Where a log stream is after a chunk (PUT of a chunk, and each chunk of POST /jobs/logs)."""
    return {"stored": position.stored, "size": position.size, "complete": position.complete,
            "next_seq": position.next_seq}


# What a refused chunk says of its stream (job_logs.judge's Conflict), for the agent to go on from.
LOG_REFUSAL_FIELDS = ("expected_seq", "expected_offset", "complete")


def log_chunk_result(outcome: ItemOutcome[LogPosition]) -> dict[str, Any]:
    """A chunk of POST /jobs/logs: where its stream is (200), or why it was refused and,
    for a chunk out of order, where the stream goes on."""
    position = outcome.value
    return item_result(outcome, None if position is None else log_position(position), LOG_REFUSAL_FIELDS)
