"""Checking what clients send: job requests and agents' status reports. Pure."""
import hashlib
import json
import re
from urllib.parse import urlsplit

from corral.shared import validate as v
from corral.shared.errors import BadRequest, BatchError, CorralError
from corral.shared.wire import JOB_ID_RE, JOB_TYPES

JOB_FIELDS = ("command", "deploy_url", "deploy_sha256", "job_type", "port", "env_vars", "instance_id",
              "name", "memory_mb", "cpu_percent", "max_processes", "health_path", "max_retries",
              "on_node_lost")
ON_NODE_LOST = ("requeue", "fail")
MAX_RETRIES = 20
DEPLOY_SCHEMES = ("http", "https", "s3")
MAX_COMMAND_CHARS = 64 * 1024
REPORT_FIELDS = ("node_id", "attempt", "status", "exit_code", "stdout", "stderr", "limits_enforced",
                 "limits", "private_tmp", "oom_killed", "peak_memory_bytes", "cpu_seconds", "requeue")
SHA256_RE = re.compile(r"^[0-9a-fA-F]{64}\Z")
HEALTH_PATH_RE = re.compile(r"^/[\x21-\x7e]{0,1023}\Z")  # printable ASCII, no spaces
MAX_MEMORY_MB = 1024 * 1024      # 1 TiB
MAX_CPU_PERCENT = 100_000        # 1,000 CPUs
MAX_PROCESSES = 4_194_304        # Linux's largest pid_max
REPORTABLE = ("running", "done", "failed")
MAX_OUTPUT_CHARS = 512 * 1024
# Batches (POST /jobs/batch, POST /jobs/reports) and claims (POST /nodes/{id}/claim).
MAX_BATCH = 1000
MAX_CLAIM = 1000
MAX_WAIT_SECS = 25.0
DEFAULT_WAIT_SECS = 20.0
CLAIM_FIELDS = ("max", "wait_secs", "limits_enforced", "private_tmp", "default_limits")
OUTPUT_FIELDS = ("job_id", "node_id", "attempt", "stdout", "stderr")


def job_request(body: dict) -> dict:
    """The columns of a new job, from a POST /jobs body (or an SQS message)."""
    v.reject_unknown(body, JOB_FIELDS)
    command = v.opt_str(body, "command", max_len=MAX_COMMAND_CHARS)
    if command is not None and not command.strip():
        raise BadRequest("'command' must not be blank")
    deploy_url = v.opt_str(body, "deploy_url", max_len=2048)
    if command is None and deploy_url is None:
        raise BadRequest("a job needs 'command' or 'deploy_url'")
    if deploy_url is not None:
        check_deploy_url(deploy_url)
    job_type = v.opt_str(body, "job_type", max_len=16) or "run"
    if job_type not in JOB_TYPES:
        raise BadRequest(f"'job_type' must be one of {', '.join(JOB_TYPES)}")
    fields = {
        "command": command,
        "deploy_url": deploy_url,
        "deploy_sha256": v.opt_str(body, "deploy_sha256", pattern=SHA256_RE, what="64 hexadecimal digits"),
        "job_type": job_type,
        "port": v.opt_int(body, "port", 1, 65535),
        "env_vars": v.str_map(body, "env_vars", key_re=v.ENV_NAME_RE, key_what="an environment variable name"),
        "instance_id": v.opt_str(body, "instance_id", pattern=v.NAME_RE, what="a node id"),
        "name": v.opt_str(body, "name", pattern=v.NAME_RE, what="letters, digits, '.', '_' or '-' (at most 128)"),
        "memory_mb": v.opt_int(body, "memory_mb", 4, MAX_MEMORY_MB),
        "cpu_percent": v.opt_int(body, "cpu_percent", 1, MAX_CPU_PERCENT),
        "max_processes": v.opt_int(body, "max_processes", 1, MAX_PROCESSES),
        "health_path": v.opt_str(body, "health_path", pattern=HEALTH_PATH_RE,
                                 what="a URL path starting with '/' (printable ASCII, no spaces)"),
        "max_retries": v.opt_int(body, "max_retries", 0, MAX_RETRIES),
        "on_node_lost": v.opt_str(body, "on_node_lost", max_len=16) or "requeue",
    }
    refused = v.forbidden_env_var(fields["env_vars"])
    if refused is not None:
        raise BadRequest(f"'env_vars' may not set {refused}: it would make the dynamic loader run "
                         f"code of the job's choosing in every program the job starts")
    if fields["on_node_lost"] not in ON_NODE_LOST:
        raise BadRequest(f"'on_node_lost' must be one of {', '.join(ON_NODE_LOST)}")
    if fields["deploy_sha256"] is not None:
        if deploy_url is None:
            raise BadRequest("'deploy_sha256' needs 'deploy_url'")
        fields["deploy_sha256"] = fields["deploy_sha256"].lower()
    if fields["health_path"] is not None and (job_type != "service" or fields["port"] is None):
        raise BadRequest("'health_path' is for service jobs with a 'port'")
    return fields


def job_batch(body: dict) -> list[dict]:
    """The job requests of a POST /jobs/batch body `{"jobs": [...]}`, each checked as
    POST /jobs checks one. Any bad item: BatchError listing every bad item."""
    items = _batch_items(body, "jobs")
    fields, errors = [], []
    for index, item in enumerate(items):
        try:
            if not isinstance(item, dict):
                raise BadRequest("a job request must be a JSON object")
            fields.append(job_request(item))
        except BadRequest as exc:
            errors.append({"index": index, "error": exc.message})
    if errors:
        raise BatchError(errors)
    return fields


def report_batch(body: dict) -> tuple[list[tuple[str, dict | CorralError]], tuple[str, dict] | None]:
    """The reports of a POST /jobs/reports body `{"reports": [...], "claim": {...}}`:
    each item is a POST /jobs/{id}/status body plus its `job_id`. A bad item does not
    spoil the others: it comes back as (job_id or "", the BadRequest) and is answered
    on its own. The optional `claim` (a claim body plus `node_id`, never waiting) asks
    for the node's next jobs in the same call; it comes back as (node_id, claim)."""
    claim = body.get("claim")
    items = _job_items({k: val for k, val in body.items() if k != "claim"}, "reports", "a report",
                       lambda item: status_report({k: val for k, val in item.items() if k != "job_id"}))
    if claim is None:
        return items, None
    if not isinstance(claim, dict):
        raise BadRequest("'claim' must be an object: node_id, max, limits_enforced, private_tmp, default_limits")
    node_id = v.req_str(claim, "node_id", pattern=v.NAME_RE, what="a node id")
    request = claim_request({k: val for k, val in claim.items() if k not in ("node_id", "wait_secs")})
    request["wait_secs"] = 0.0  # a claim riding on reports answers at once
    return items, (node_id, request)


def output_batch(body: dict) -> list[tuple[str, dict | CorralError]]:
    """The items of a POST /jobs/output body `{"outputs": [...]}` (live output): each
    `job_id`, `node_id`, `attempt` and `stdout` and/or `stderr` (absent or null: left
    as stored). As with reports, a bad item comes back as (job_id or "", the BadRequest)."""
    return _job_items(body, "outputs", "a live output item", _output_item)


def _output_item(item: dict) -> dict:
    v.reject_unknown(item, OUTPUT_FIELDS)
    return {"node_id": v.req_str(item, "node_id", pattern=v.NAME_RE, what="a node id"),
            "attempt": v.req_int(item, "attempt", 0, 1_000_000_000),
            "stdout": _output(item, "stdout"), "stderr": _output(item, "stderr")}


def _job_items(body: dict, name: str, what: str, check) -> list[tuple[str, dict | CorralError]]:
    """The items of a batch about jobs, each with its `job_id`, checked one by one with
    `check`: a bad item is (job_id or "", its BadRequest) and does not spoil the others."""
    checked: list[tuple[str, dict | CorralError]] = []
    for item in _batch_items(body, name):
        job_id = ""
        try:
            if not isinstance(item, dict):
                raise BadRequest(f"{what} must be a JSON object")
            job_id = v.req_str(item, "job_id", pattern=JOB_ID_RE, what="a job id such as job-42")
            checked.append((job_id, check(item)))
        except BadRequest as exc:
            checked.append((job_id, exc))
    return checked


def _batch_items(body: dict, name: str) -> list:
    v.reject_unknown(body, (name,))
    items = body.get(name)
    if not isinstance(items, list):
        raise BadRequest(f"{name!r} must be a JSON array")
    if not 1 <= len(items) <= MAX_BATCH:
        raise BadRequest(f"{name!r} must hold 1 to {MAX_BATCH} items, not {len(items)}")
    return items


def claim_request(body: dict) -> dict:
    """A POST /nodes/{node_id}/claim body: how many jobs, how long to wait, the node's limits."""
    v.reject_unknown(body, CLAIM_FIELDS)
    wait = body.get("wait_secs")
    if wait is None:
        wait = DEFAULT_WAIT_SECS
    elif isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= MAX_WAIT_SECS:
        raise BadRequest(f"'wait_secs' must be a number of seconds from 0 to {MAX_WAIT_SECS:g}")
    defaults = body.get("default_limits")
    if defaults is not None:
        if not isinstance(defaults, dict):
            raise BadRequest("'default_limits' must be an object with 'run' and 'service' limits")
        v.reject_unknown(defaults, JOB_TYPES)
        defaults = {job_type: _limits(defaults, job_type) for job_type in JOB_TYPES if defaults.get(job_type)}
    return {
        "max": v.req_int(body, "max", 1, MAX_CLAIM),
        "wait_secs": float(wait),
        "limits_enforced": v.opt_bool(body, "limits_enforced"),
        "private_tmp": v.opt_bool(body, "private_tmp"),
        "default_limits": defaults or {},
    }


def check_deploy_url(url: str) -> None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- parses the port; raises ValueError when it is not a number
    except ValueError as exc:
        raise BadRequest(f"'deploy_url' is not a valid URL: {exc}") from None
    if parts.scheme not in DEPLOY_SCHEMES:
        raise BadRequest(f"'deploy_url' must start with {', '.join(s + '://' for s in DEPLOY_SCHEMES)}")
    if not parts.netloc:
        raise BadRequest("'deploy_url' has no host (or bucket)")
    if parts.scheme == "s3" and not parts.path.strip("/"):
        raise BadRequest("'deploy_url' must name an object: s3://bucket/key")


def status_report(body: dict) -> dict:
    """An agent's report on one attempt: who, which attempt, what happened."""
    v.reject_unknown(body, REPORT_FIELDS)
    status = v.req_str(body, "status", max_len=16)
    if status not in REPORTABLE:
        raise BadRequest(f"'status' must be one of {', '.join(REPORTABLE)}")
    report = {
        "node_id": v.req_str(body, "node_id", pattern=v.NAME_RE, what="a node id"),
        "attempt": v.req_int(body, "attempt", 0, 1_000_000_000),
        "status": status,
        "exit_code": v.opt_int(body, "exit_code", -255, 255),
        "stdout": _output(body, "stdout"),
        "stderr": _output(body, "stderr"),
        "limits_enforced": v.opt_bool(body, "limits_enforced"),
        "limits": _limits(body, "limits"),
        "private_tmp": v.opt_bool(body, "private_tmp"),
        "oom_killed": v.opt_bool(body, "oom_killed"),
        "peak_memory_bytes": v.opt_int(body, "peak_memory_bytes", 0, 1 << 62),
        "cpu_seconds": _seconds(body, "cpu_seconds"),
        "requeue": bool(v.opt_bool(body, "requeue")),
    }
    if report["requeue"] and status != "failed":
        raise BadRequest("'requeue' goes with a 'failed' report")
    if status in ("done", "failed") and report["exit_code"] is None:
        raise BadRequest(f"a {status!r} report needs 'exit_code'")
    if status == "done" and report["exit_code"] != 0:
        raise BadRequest("a 'done' report must have exit_code 0; report 'failed' otherwise")
    return report


def _limits(body: dict, name: str = "limits") -> dict | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest(f"{name!r} must be an object with memory_mb, cpu_percent and max_processes")
    v.reject_unknown(value, ("memory_mb", "cpu_percent", "max_processes"))
    limits = {"memory_mb": v.req_int(value, "memory_mb", 1, MAX_MEMORY_MB),
              "cpu_percent": v.req_int(value, "cpu_percent", 1, MAX_CPU_PERCENT)}
    processes = v.opt_int(value, "max_processes", 1, MAX_PROCESSES)
    if processes is not None:  # agents that set no pids limit send none
        limits["max_processes"] = processes
    return limits


def _seconds(body: dict, name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e12:
        raise BadRequest(f"{name!r} must be a number of seconds, 0 or more")
    return float(value)


def _output(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{name!r} must be a string")
    if len(value) > MAX_OUTPUT_CHARS:
        raise BadRequest(f"{name!r} is longer than {MAX_OUTPUT_CHARS} characters; send its tail")
    return value




NODE_ID_RE = v.NAME_RE
IDEMPOTENCY_KEY_RE = re.compile(r"^[\x21-\x7e]{1,255}\Z")


def idempotency_key(value: str | None) -> str | None:
    """The Idempotency-Key header: 1-255 printable ASCII characters, or absent."""
    if value is None:
        return None
    if not IDEMPOTENCY_KEY_RE.match(value):
        raise BadRequest("the Idempotency-Key header must be 1-255 printable ASCII characters without spaces")
    return value


def request_hash(fields: dict) -> str:
    """A digest of a validated job request, to tell a repeated submission from a different one."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def parse_job_id(job_id: str) -> int | None:
    match = JOB_ID_RE.match(job_id)
    return int(match.group(1)) if match else None
