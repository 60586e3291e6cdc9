"""Checking what clients send, with the models of contract.py.

Job requests (POST /jobs and SQS messages alike), batches, agents' reports, claims and
live output. Each function returns what the store takes (plain columns) or raises
BadRequest. Pure."""
import base64
import binascii
import hashlib
import json
import re

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from corral.server import principals
from corral.shared import validate as v
from corral.shared.contract import Request, refusal
from corral.shared.errors import BadRequest, BatchError, CorralError
from corral.shared.wire import (JOB_ID_RE, LOG_CHUNK_MAX_BYTES, LOG_FINAL_HEADER, LOG_NODE_HEADER,
                               LOG_OFFSET_HEADER, LOG_STREAMS)

from .contract import (BatchReport, ClaimRequest, JobBatch, JobRef, JobRequest, LogChunkBatch, LogChunkItem,
                       OutputBatch, OutputItem, ReportBatch, RidingClaim, StatusReport, parse_instant)



def job_request(body: dict) -> dict:
    """The columns of a new job, from a POST /jobs body (or an SQS message)."""
    columns = JobRequest.check(body).columns()
    if any(kind == "index" for kind, _, _ in columns["depends_on"] or ()):
        raise BadRequest("a dependency's 'index' names an item of the same POST /jobs/batch; here give 'job_id'")
    return columns


def check_stop(fields: dict, settings, team_max: float | None = None, team: str | None = None) -> None:
    """A job's own `timeout_secs` within the cluster's JOB_TIMEOUT_MAX_SECS and its team's
    `max_timeout_secs` (`team_max`), its `kill_grace_secs` within JOB_KILL_GRACE_MAX_SECS,
    and its warning (`signal_before_end`) before the timeout it will have (settings, so
    not in the request model). `fields`: a job's columns (JobRequest.columns)."""
    timeout = fields.get("timeout_secs")
    if timeout is not None and timeout > settings.job_timeout_max_secs:
        raise BadRequest(f"'timeout_secs' is at most {settings.job_timeout_max_secs:g} seconds on this cluster "
                         f"(JOB_TIMEOUT_MAX_SECS)")
    if timeout is not None and team_max is not None and timeout > team_max:
        raise BadRequest(f"'timeout_secs' is at most {team_max:g} seconds for team {team!r} (its max_timeout_secs)")
    grace = fields.get("kill_grace_secs")
    if grace is not None and grace > settings.job_kill_grace_max_secs:
        raise BadRequest(f"'kill_grace_secs' is at most {settings.job_kill_grace_max_secs:g} seconds on this "
                         f"cluster (JOB_KILL_GRACE_MAX_SECS)")
    warn = fields.get("warn_secs")
    if warn is not None:
        limit = effective_timeout(timeout, settings.job_timeout_secs, team_max)
        if warn >= limit:
            raise BadRequest(f"'signal_before_end' must come before the end: its 'secs' ({warn:g}) must be less "
                             f"than the job's timeout ({limit:g} seconds)")


def effective_timeout(own: float | None, default: float, team_max: float | None) -> float:
    """A run job's timeout: its own, else JOB_TIMEOUT_SECS bounded by its team's maximum."""
    if own is not None:
        return own
    return default if team_max is None else min(default, team_max)


def timeout_column(own: float | None, default: float, team_max: float | None) -> float | None:
    """What a new run job stores as its `timeout_secs`: its own; the team's maximum when
    that is below JOB_TIMEOUT_SECS (so the bound holds even if the setting changes);
    else None (JOB_TIMEOUT_SECS, as the setting is when it runs)."""
    if own is not None or team_max is None or team_max >= default:
        return own
    return team_max


def job_batch(body: dict) -> list[dict]:
    """The job requests of a POST /jobs/batch body `{"jobs": [...]}`, each checked as
    POST /jobs checks one. Any bad item: BatchError listing every bad item."""
    try:
        return [job.columns() for job in JobBatch.model_validate(body).jobs]
    except ValidationError as exc:
        items = _items_or_refusal(JobBatch, "jobs", body, exc)
    errors = []
    for index, item in enumerate(items):
        try:
            if not isinstance(item, dict):
                raise BadRequest("a job request must be a JSON object")
            JobRequest.check(item)
        except BadRequest as exc:
            errors.append({"index": index, "error": exc.message})
    raise BatchError(errors)


def report_batch(body: dict) -> tuple[list[tuple[str, dict | CorralError]], tuple[str, dict] | None]:
    """The reports of a POST /jobs/reports body `{"reports": [...], "claim": {...}}`:
    each item is a POST /jobs/{id}/status body plus its `job_id`. A bad item does not
    spoil the others: it comes back as (job_id or "", the BadRequest) and is answered
    on its own. The optional `claim` (a claim body plus `node_id`, never waiting) asks
    for the node's next jobs in the same call; it comes back as (node_id, claim)."""
    try:
        batch = ReportBatch.model_validate(body)
    except ValidationError as exc:
        items = _items_or_refusal(ReportBatch, "reports", body, exc)
        claim = None if body.get("claim") is None else RidingClaim.check(body["claim"])
        checked = _one_by_one(items, "a report", lambda item: BatchReport.check(item).columns())
    else:
        claim = batch.claim
        checked = [(report.job_id, report.columns()) for report in batch.reports]
    return checked, None if claim is None else (claim.node_id, claim.columns())


def output_batch(body: dict) -> list[tuple[str, dict | CorralError]]:
    """The items of a POST /jobs/output body `{"outputs": [...]}` (live output): each
    `job_id`, `node_id`, `attempt` and `stdout` and/or `stderr` (absent or null: left
    as stored). As with reports, a bad item comes back as (job_id or "", the BadRequest)."""
    try:
        return [(item.job_id, item.columns()) for item in OutputBatch.model_validate(body).outputs]
    except ValidationError as exc:
        items = _items_or_refusal(OutputBatch, "outputs", body, exc)
    return _one_by_one(items, "a live output item", lambda item: OutputItem.check(item).columns())


def log_chunk_batch(body: dict) -> list[tuple[str, dict | CorralError]]:
    """The chunks of a POST /jobs/logs body `{"chunks": [...]}`, each as
    JobLogs.put takes it (`data` decoded from base64); a bad item comes back as
    (job_id or "", the BadRequest), as with reports."""
    try:
        items = [(item.job_id, item) for item in LogChunkBatch.model_validate(body).chunks]
    except ValidationError as exc:
        raw = _items_or_refusal(LogChunkBatch, "chunks", body, exc)
        items = _one_by_one(raw, "a log chunk", LogChunkItem.check)
    return [(job_id, item if isinstance(item, CorralError) else _chunk(item)) for job_id, item in items]


def _chunk(item: LogChunkItem) -> dict | CorralError:
    try:
        data = base64.b64decode(item.data, validate=True)
    except binascii.Error:
        return BadRequest("'data' must be base64 (standard alphabet, padded)")
    if len(data) > LOG_CHUNK_MAX_BYTES:
        return BadRequest(f"a log chunk is at most {LOG_CHUNK_MAX_BYTES} bytes")
    return {"attempt": item.attempt, "stream": item.stream, "seq": item.seq, "node_id": item.node_id,
            "start": item.offset, "final": item.final, "data": data}


def _items_or_refusal(model: type[Request], name: str, body: dict, exc: ValidationError) -> list:
    """The items of a batch whose body is right but for some items (they are then
    checked one by one), or the BadRequest about the body as a whole."""
    errors = exc.errors(include_url=False)
    whole = [e for e in errors if len(e["loc"]) < 2 or e["loc"][0] != name]
    if whole:
        raise BadRequest(refusal(model, whole))
    return body[name]


def _one_by_one(items: list, what: str, check) -> list[tuple[str, dict | CorralError]]:
    """Each item of a batch about jobs checked on its own: a bad item is (its job_id
    when that is valid, else "", its BadRequest) and does not spoil the others."""
    checked: list[tuple[str, dict | CorralError]] = []
    for item in items:
        try:
            if not isinstance(item, dict):
                raise BadRequest(f"{what} must be a JSON object")
            JobRef.check(item)  # the job first: an item without one is refused for that
            columns = check(item)
            checked.append((item["job_id"], columns))
        except BadRequest as exc:
            job_id = item.get("job_id") if isinstance(item, dict) else None
            checked.append((job_id if isinstance(job_id, str) and JOB_ID_RE.match(job_id) else "", exc))
    return checked


def claim_request(body: dict) -> dict:
    """A POST /nodes/{node_id}/claim body: how many jobs, how long to wait, the node's limits."""
    return ClaimRequest.check(body).columns()


def status_report(body: dict) -> dict:
    """An agent's report on one attempt: who, which attempt, what happened."""
    return StatusReport.check(body).columns()


NODE_ID_RE = v.NAME_RE
IDEMPOTENCY_KEY_RE = re.compile(r"^[\x21-\x7e]{1,255}\Z")


# The keys of the jobs schedules create (schedule:<id>:<slot>): no client may take one,
# so that no request can stand in for a schedule's run, or stop one being created.
SCHEDULE_KEY_PREFIX = "schedule:"


def idempotency_key(value: str | None) -> str | None:
    """The Idempotency-Key header: 1-255 printable ASCII characters, or absent; not
    one starting with schedule: (in any case)."""
    if value is None:
        return None
    if not IDEMPOTENCY_KEY_RE.match(value):
        raise BadRequest("the Idempotency-Key header must be 1-255 printable ASCII characters without spaces")
    if value.lower().startswith(SCHEDULE_KEY_PREFIX):
        raise BadRequest(f"Idempotency-Key values starting with {SCHEDULE_KEY_PREFIX!r} are kept for the runs "
                         "of schedules")
    return value


# Fields job requests gained later, with the value a request that does not give them
# has: left out of the digest at that value, so that a request stored before they
# existed and sent again with the same Idempotency-Key still digests alike.
LATER_FIELDS = {"constraints": None, "pool": None, "priority": 50, "run_at": None, "delay_secs": None,
                "depends_on": None, "on_dependency_failure": "cancel", "concurrency_key": None, "array": None,
                "timeout_secs": None, "disk_mb": None, "warn_signal": None, "warn_secs": None, "kill_signal": None,
                "kill_grace_secs": None, "preemptible": True, "gpus": None, "gpu_model": None,
                "gpu_memory_mb": None, "resources": None, "nodes": None}
# The owner of a job, added with users and teams: left out at the values every older job has.
OWNER_FIELDS = {"team": (None, principals.DEFAULT_TEAM), "submitted_by": (None, principals.BOOTSTRAP_ADMIN)}


# Set from the request's headers, not its body: a repeat sent again within another
# trace (a client's retry) is still the same request.
TRACE_FIELDS = ("traceparent", "tracestate")


def request_hash(fields: dict) -> str:
    """A digest of a validated job request, to tell a repeated submission from a different one."""
    kept = {name: value for name, value in fields.items()
            if name not in TRACE_FIELDS and (name not in LATER_FIELDS or value != LATER_FIELDS[name])
            and (name not in OWNER_FIELDS or value not in OWNER_FIELDS[name])}
    canonical = json.dumps(kept, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def job_filters(args) -> dict:
    """GET /jobs's filters on what a job is (its query parameters `name`, `schedule`,
    `array`, `team`, `submitted_by`, `created_after`, `created_before`), as Jobs.iter_jobs takes them; those
    not given are None. A bad value: BadRequest naming the parameter."""
    name, schedule, array = (args.get(key) or None for key in ("name", "schedule", "array"))
    if name is not None and (len(name) > 128 or not v.NAME_RE.match(name)):
        raise BadRequest("query parameter 'name' must be a job name (letters, digits, '.', '_' or '-', at most 128)")
    if schedule is not None and (len(schedule) > 128 or not v.NAME_RE.match(schedule)):
        raise BadRequest("query parameter 'schedule' must be a schedule name (letters, digits, '.', '_' or '-', "
                         "at most 128)")
    array_id = None
    if array is not None:
        prefix, _, number = array.partition("-")
        if prefix != "array" or not (number.isascii() and number.isdigit()) or not 0 < len(number) <= 18:
            raise BadRequest("query parameter 'array' must be an array id such as array-3")
        array_id = int(number)
    times = {key: query_instant(args, key) for key in ("created_after", "created_before")}
    return {"name": name, "schedule": schedule, "array_id": array_id, "team": query_team(args, "team"),
            "submitted_by": query_user(args, "submitted_by"), **times}


def query_instant(args, key: str) -> float | None:
    """A time in query parameter `key` (ISO-8601 with Z or an offset); None when not given."""
    raw = args.get(key) or None
    try:
        return None if raw is None else parse_instant(key, raw)
    except PydanticCustomError as exc:
        raise BadRequest(f"query parameter {exc.context['message']}") from None


def query_team(args, key: str) -> str | None:
    team = args.get(key) or None
    if team is not None and not principals.TEAM_RE.match(team):
        raise BadRequest(f"query parameter {key!r} must be a team name (letters, digits, '.', '_' or '-', at most "
                         f"128)")
    return team


def query_user(args, key: str) -> str | None:
    user = args.get(key) or None
    if user is not None and not principals.USER_RE.match(user):
        raise BadRequest(f"query parameter {key!r} must be a user name (letters, digits, '.', '_', '@', '+' or '-', "
                         f"at most 128)")
    return user


def parse_job_id(job_id: str) -> int | None:
    match = JOB_ID_RE.match(job_id)
    return int(match.group(1)) if match else None


def concurrency_key(key: str) -> str:
    """A concurrency key named in a path, checked as the jobs' `concurrency_key` is."""
    if not v.NAME_RE.match(key) or len(key) > 128:
        raise BadRequest("the concurrency key must be letters, digits, '.', '_' or '-' (at most 128)")
    return key


# Complete logs (job_logs.py): the numbers a chunk's path and headers carry.
MAX_ATTEMPT = 2 ** 31 - 1
MAX_LOG_OFFSET = 2 ** 53  # far past any CORRAL_LOG_MAX_BYTES


def whole_number(text: str | None, what: str, minimum: int, maximum: int) -> int:
    """A decimal number from a path or a header: ASCII digits only, within bounds."""
    if text is None or not (text.isascii() and text.isdigit() and len(text) <= 19) \
            or not minimum <= int(text) <= maximum:
        raise BadRequest(f"{what} must be a whole number from {minimum} to {maximum}")
    return int(text)


def log_stream(stream: str | None) -> str:
    if stream not in LOG_STREAMS:
        raise BadRequest(f"the log stream must be one of {', '.join(LOG_STREAMS)}")
    return stream


def log_chunk(attempt: str, stream: str, seq: str, headers) -> dict:
    """What PUT /jobs/{id}/attempts/{attempt}/logs/{stream}/{seq} says about its chunk
    (its path and headers): attempt, stream, seq, node_id, start, final."""
    node_id = headers.get(LOG_NODE_HEADER)
    if node_id is None or not NODE_ID_RE.match(node_id):
        raise BadRequest(f"the {LOG_NODE_HEADER} header must name the node that ran the attempt "
                         f"(letters, digits, '.', '_' or '-', at most 128)")
    final = headers.get(LOG_FINAL_HEADER, "0")
    if final not in ("0", "1"):
        raise BadRequest(f"the {LOG_FINAL_HEADER} header must be 1 (the stream's last chunk) or 0")
    return {"attempt": whole_number(attempt, "the attempt", 1, MAX_ATTEMPT), "stream": log_stream(stream),
            "seq": whole_number(seq, "the chunk's seq", 0, MAX_ATTEMPT), "node_id": node_id,
            "start": whole_number(headers.get(LOG_OFFSET_HEADER), f"the {LOG_OFFSET_HEADER} header", 0,
                                  MAX_LOG_OFFSET),
            "final": final == "1"}
