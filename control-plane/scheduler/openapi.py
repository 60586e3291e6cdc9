"""The scheduler's OpenAPI 3.0.3 document, served at GET /openapi.json.

Keep it true of app.py, validation.py and views.py:
tests/test_openapi.py checks every route is listed and runs schemathesis
against a live server to check every answer against it.
"""

from corral.shared import states, wire
from corral.shared.openapi import SECURITY, SECURITY_SCHEMES, json_content_type_everywhere
from corral.shared.openapi import COMMON_SCHEMAS, NAME_PATTERN, TIMESTAMP, error_responses, meta_paths
from corral.shared.openapi import error as _error
from corral.shared.openapi import json_response as _json
from corral.shared.openapi import nullable_timestamp as _nullable_timestamp
from corral.shared.openapi import path_param as _path_param
from corral.shared.openapi import query as _query
from corral.shared.openapi import ref as _ref

STATUSES = list(states.ALL)
JOB_TYPES = list(wire.JOB_TYPES)
JOB_ID_PATTERN = wire.JOB_ID_PATTERN


NODE_ID_PARAM = _path_param("node_id", "The agent's node id.", {"type": "string", "pattern": NAME_PATTERN})
JOB_ID_PARAM = {"name": "job_id", "in": "path", "required": True, "description": "A job id such as `job-42`.",
                "schema": {"type": "string", "pattern": JOB_ID_PATTERN}}

def _batch_results(what: str, code_description: str, claimed_jobs: None | bool = False, **with_200) -> dict:
    """The answer of a batch of agents' items: one result per item, in order (and, for
    reports, the jobs a `claim` riding on them took: pass claimed_jobs=None)."""
    claimed = {} if claimed_jobs is False else {"claimed": {
        "type": "array", "items": _ref("Job"),
        "description": "Only when the request had a `claim`: the jobs it took, now `running` on the node."}}
    return {
        "type": "object",
        "required": ["results"],
        "properties": {
            **claimed,
            "results": {"type": "array", "description": f"One result per {what}, in the order sent.", "items": {
                "type": "object", "required": ["index", "job_id", "code"],
                "properties": {
                    "index": {"type": "integer", "minimum": 0},
                    "job_id": {"type": "string", "description": "As sent (empty when it was missing)."},
                    "code": {"type": "integer", "enum": [200, 400, 404, 409], "description": code_description},
                    **with_200,
                    "error": {"type": "string", "description": "With any other code: why it was refused."},
                }}},
        },
    }


STATUS_REPORT_PROPERTIES = {
    "node_id": {"type": "string", "pattern": NAME_PATTERN, "description": "The reporting node."},
    "attempt": {"type": "integer", "minimum": 0, "maximum": 1000000000,
                "description": "The attempt the report is about (the job's `attempt` when it was claimed)."},
    "status": {"type": "string", "enum": ["running", "done", "failed"]},
    "exit_code": {"type": "integer", "nullable": True, "minimum": -255, "maximum": 255},
    "stdout": {"type": "string", "nullable": True, "maxLength": 524288,
               "description": "Output tail; the scheduler keeps the last CORRAL_OUTPUT_TAIL_BYTES."},
    "stderr": {"type": "string", "nullable": True, "maxLength": 524288},
    "limits_enforced": {"type": "boolean", "nullable": True,
                        "description": "With `running`: whether the node applies cgroup limits."},
    "limits": {"allOf": [_ref("Limits")], "nullable": True,
               "description": "With `running`: the limits the node applies."},
    "private_tmp": {"type": "boolean", "nullable": True,
                    "description": "With `running`: whether the job gets its own /tmp, /var/tmp and /dev/shm "
                                   "(a private mount namespace)."},
    "oom_killed": {"type": "boolean", "nullable": True,
                   "description": "With `failed`: the kernel killed the job at its memory limit."},
    "peak_memory_bytes": {"type": "integer", "nullable": True, "minimum": 0,
                          "maximum": 4611686018427387904},
    "cpu_seconds": {"type": "number", "nullable": True, "minimum": 0, "exclusiveMaximum": True,
                    "maximum": 1e12},
    "requeue": {"type": "boolean", "nullable": True,
                "description": "With `failed`: the node gave the attempt up (its agent stopped, or its lease "
                               "lapsed); the job is requeued without spending a retry."},
}

CLAIM_PROPERTIES = {
    "max": {"type": "integer", "minimum": 1, "maximum": 1000,
            "description": "The most jobs to take (the agent's free slots); the scheduler never gives "
                           "more than the node's free slots either."},
    "wait_secs": {"type": "number", "nullable": True, "minimum": 0, "maximum": 25, "default": 20,
                  "description": "How long to wait when nothing is claimable; 0 answers at once."},
    "limits_enforced": {"type": "boolean", "nullable": True,
                        "description": "Whether the node applies cgroup limits (recorded on each job)."},
    "private_tmp": {"type": "boolean", "nullable": True,
                    "description": "Whether the node gives each job its own /tmp (recorded on each job)."},
    "default_limits": {
        "type": "object", "nullable": True, "additionalProperties": False,
        "description": "The node's limits for jobs that ask for none, per job type.",
        "properties": {"run": {"allOf": [_ref("Limits")], "nullable": True},
                       "service": {"allOf": [_ref("Limits")], "nullable": True}}},
}


SCHEMAS = {
    **COMMON_SCHEMAS,
    "JobRequest": {
        "type": "object",
        "description": "A job to run. `command` or `deploy_url` (non-null) is required; "
                       "null counts as not given for every optional field.",
        "additionalProperties": False,
        "anyOf": [{"required": ["command"], "properties": {"command": {"type": "string"}}},
                  {"required": ["deploy_url"], "properties": {"deploy_url": {"type": "string"}}}],
        "properties": {
            "command": {"type": "string", "nullable": True, "minLength": 1, "maxLength": 65536,
                        "description": "Shell command, run in the job's work dir. Must not be blank "
                                       "or contain NUL characters.",
                        "example": "python etl.py --day 2026-11-29"},
            "deploy_url": {"type": "string", "nullable": True, "maxLength": 2048,
                           "pattern": r"^(https?|s3)://[^/?#]",
                           "description": "A zip fetched and unpacked into the work dir before the command "
                                          "runs: http(s)://host/... or s3://bucket/key.",
                           "example": "s3://builds/etl-42.zip"},
            "job_type": {"type": "string", "nullable": True, "enum": JOB_TYPES + [None], "default": "run",
                         "description": "`run` waits for exit; `service` is kept running until cancelled."},
            "port": {"type": "integer", "nullable": True, "minimum": 1, "maximum": 65535,
                     "description": "The port a service listens on."},
            "env_vars": {"type": "object", "nullable": True, "maxProperties": 256,
                         "additionalProperties": {"type": "string", "maxLength": 32768},
                         "description": "Added to the command's environment. Keys are environment variable "
                                        "names: a letter or '_', then letters, digits or '_' (at most 256). "
                                        "Values must not contain NUL characters.",
                         "example": {"STAGE": "prod"}},
            "instance_id": {"type": "string", "nullable": True, "pattern": NAME_PATTERN,
                            "description": "Pin the job to this node."},
            "name": {"type": "string", "nullable": True, "pattern": NAME_PATTERN,
                     "description": "A name for the job; a service is registered under it (default: the job id)."},
            "deploy_sha256": {"type": "string", "nullable": True, "pattern": r"^[0-9a-fA-F]{64}$",
                              "description": "SHA-256 of the deploy_url zip, checked before unpacking."},
            "memory_mb": {"type": "integer", "nullable": True, "minimum": 4, "maximum": 1048576,
                          "description": "Memory limit; default 512 for `run`, 1024 for `service` (the node's "
                                         "settings). Refused when no known node allows it."},
            "cpu_percent": {"type": "integer", "nullable": True, "minimum": 1, "maximum": 100000,
                            "description": "CPU limit in percent of one CPU; default 100 for `run`, 200 for "
                                           "`service`."},
            "max_processes": {"type": "integer", "nullable": True, "minimum": 1, "maximum": 4194304,
                              "description": "The most processes (and threads) the job may have at once; "
                                             "default the node's AGENT_JOB_MAX_PROCESSES (1,024)."},
            "on_node_lost": {"type": "string", "nullable": True, "enum": ["requeue", "fail", None],
                             "default": "requeue",
                             "description": "When the job's node is lost while it runs: run it again elsewhere "
                                            "(not counted as a retry), or fail it (for jobs that must not run twice)."},
            "max_retries": {"type": "integer", "nullable": True, "minimum": 0, "maximum": 20,
                            "description": "How many times a failed attempt is retried (default MAX_JOB_RETRIES)."},
            "health_path": {"type": "string", "nullable": True, "pattern": r"^/[\x21-\x7e]{0,1023}$",
                            "description": "For services with a port: checked with HTTP GET (2xx/3xx is "
                                           "healthy) instead of a TCP connect."},
        },
    },
    "Limits": {
        "type": "object",
        "additionalProperties": False,
        "required": ["memory_mb", "cpu_percent"],
        "properties": {"memory_mb": {"type": "integer", "minimum": 1, "maximum": 1048576},
                       "cpu_percent": {"type": "integer", "minimum": 1, "maximum": 100000},
                       "max_processes": {"type": "integer", "minimum": 1, "maximum": 4194304}},
    },
    "StatusReport": {
        "type": "object",
        "description": "An agent's report on one attempt of a job placed on its node. "
                       "`done` and `failed` need `exit_code`; `done` needs exit_code 0.",
        "additionalProperties": False,
        "required": ["node_id", "attempt", "status"],
        "anyOf": [
            {"properties": {"status": {"type": "string", "enum": ["running"]}}},
            {"required": ["exit_code"],
             "properties": {"status": {"type": "string", "enum": ["done"]},
                            "exit_code": {"type": "integer", "enum": [0]}}},
            {"required": ["exit_code"],
             "properties": {"status": {"type": "string", "enum": ["failed"]}, "exit_code": {"type": "integer"}}},
        ],
        "properties": STATUS_REPORT_PROPERTIES,
    },
    "JobBatch": {
        "type": "object",
        "description": "Up to 1,000 job requests, stored in ONE transaction: all of them or, when any item "
                       "is invalid, none.",
        "additionalProperties": False,
        "required": ["jobs"],
        "properties": {
            "jobs": {"type": "array", "minItems": 1, "maxItems": 1000, "items": _ref("JobRequest"),
                     "description": "Each item is a POST /jobs body."},
        },
    },
    "BatchError": {
        "type": "object",
        "description": "A batch with invalid items: `errors` names each one by its index; nothing was stored.",
        "required": ["error"],
        "properties": {
            "error": {"type": "string", "description": "A summary, for a human."},
            "errors": {"type": "array", "items": {
                "type": "object", "required": ["index", "error"],
                "properties": {"index": {"type": "integer", "minimum": 0},
                               "error": {"type": "string"}}}},
        },
    },
    "BatchReport": {
        "type": "object",
        "description": "One item of a report batch: a POST /jobs/{job_id}/status body plus the job's id.",
        "additionalProperties": False,
        "required": ["job_id", "node_id", "attempt", "status"],
        "properties": {
            "job_id": {"type": "string", "pattern": JOB_ID_PATTERN},
            **{name: schema for name, schema in STATUS_REPORT_PROPERTIES.items()},
        },
    },
    "ReportBatch": {
        "type": "object",
        "description": "Up to 1,000 status reports (agents). Each is applied on its own: a refused one "
                       "changes nothing and does not stop the others.",
        "additionalProperties": False,
        "required": ["reports"],
        "properties": {
            "reports": {"type": "array", "minItems": 1, "maxItems": 1000, "items": _ref("BatchReport")},
            "claim": {
                "type": "object", "nullable": True, "additionalProperties": False, "required": ["node_id", "max"],
                "description": "Also claim the node's next jobs, after the reports freed their slots, in the "
                               "same transaction (as POST /nodes/{node_id}/claim with wait_secs 0; a wait_secs "
                               "given is ignored). The jobs come back in `claimed`.",
                "properties": {"node_id": STATUS_REPORT_PROPERTIES["node_id"],
                                              **CLAIM_PROPERTIES}},
        },
    },
    "ReportResults": _batch_results(
        "report", "What POST /jobs/{job_id}/status would have answered.",
        job_status={"type": "string", "enum": STATUSES,
                    "description": "With code 200: the job's status after the report."},
        attempt={"type": "integer", "minimum": 0, "description": "With code 200."},
        claimed_jobs=None),
    "OutputBatch": {
        "type": "object",
        "description": "Live output (agents): the current tails of running jobs' output, up to 1,000 items. "
                       "Each is applied on its own: a refused one changes nothing and does not stop the others.",
        "additionalProperties": False,
        "required": ["outputs"],
        "properties": {
            "outputs": {"type": "array", "minItems": 1, "maxItems": 1000, "items": {
                "type": "object",
                "description": "The tail of one attempt's output so far. A stream left out (or null) stays as "
                               "stored.",
                "additionalProperties": False,
                "required": ["job_id", "node_id", "attempt"],
                "properties": {
                    "job_id": {"type": "string", "pattern": JOB_ID_PATTERN},
                    "node_id": STATUS_REPORT_PROPERTIES["node_id"],
                    "attempt": STATUS_REPORT_PROPERTIES["attempt"],
                    "stdout": STATUS_REPORT_PROPERTIES["stdout"],
                    "stderr": STATUS_REPORT_PROPERTIES["stderr"],
                }}},
        },
    },
    "OutputResults": _batch_results(
        "item", "200: stored; 400: the item is invalid; 404: no such job; 409: the job is not running on that "
                "node for that attempt (another node, a stale attempt, or it already ended)."),
    "ClaimRequest": {
        "type": "object",
        "description": "What an agent asks for: up to `max` jobs, waiting up to `wait_secs` for work.",
        "additionalProperties": False,
        "required": ["max"],
        "properties": CLAIM_PROPERTIES,
    },
    "Job": {
        "type": "object",
        "required": ["job_id", "name", "node_id", "instance_id", "command", "deploy_url", "deploy_sha256",
                     "job_type", "port", "health_path", "env_vars", "memory_mb", "cpu_percent", "max_processes",
                     "oom_killed", "peak_memory_bytes", "cpu_seconds", "limits_enforced", "limits", "private_tmp",
                     "next_attempt_at", "on_node_lost", "node_losses",
                     "status", "attempt", "retry_count", "max_retries", "exit_code", "stdout", "stderr",
                     "timeout_secs", "created_at", "placed_at", "running_at", "finished_at"],
        "properties": {
            "job_id": {"type": "string", "pattern": r"^job-[1-9][0-9]*$", "example": "job-42"},
            "node_id": {"type": "string", "nullable": True, "description": "The node it is placed on, if any."},
            "instance_id": {"type": "string", "nullable": True, "description": "The node it is pinned to, if any."},
            "name": {"type": "string", "nullable": True},
            "deploy_sha256": {"type": "string", "nullable": True},
            "health_path": {"type": "string", "nullable": True},
            "memory_mb": {"type": "integer", "nullable": True, "description": "Requested; null: the node's default."},
            "cpu_percent": {"type": "integer", "nullable": True, "description": "Requested; null: the node's default."},
            "limits_enforced": {"type": "boolean", "nullable": True,
                                "description": "False when the node could not apply cgroup limits."},
            "max_processes": {"type": "integer", "nullable": True,
                              "description": "Requested; null: the node's default."},
            "limits": {"allOf": [_ref("Limits")], "nullable": True, "description": "The limits the node applied."},
            "private_tmp": {"type": "boolean", "nullable": True,
                            "description": "Whether the node gave the job its own /tmp, /var/tmp and /dev/shm; "
                                           "false: TMPDIR points into its work dir."},
            "service_grant": {"type": "string", "pattern": "^[0-9a-f]{64}$",
                              "description": "Only in what a node's agent gets for a service job placed on it "
                                             "(with tokens): the proof the registry asks for to record the "
                                             "job's service (POST /services `grant`)."},
            "oom_killed": {"type": "boolean", "nullable": True},
            "peak_memory_bytes": {"type": "integer", "nullable": True},
            "cpu_seconds": {"type": "number", "nullable": True},
            "command": {"type": "string", "nullable": True},
            "deploy_url": {"type": "string", "nullable": True},
            "job_type": {"type": "string", "enum": JOB_TYPES},
            "port": {"type": "integer", "nullable": True, "minimum": 1, "maximum": 65535},
            "env_vars": {"type": "object", "additionalProperties": {"type": "string"}},
            "status": {"type": "string", "enum": STATUSES,
                       "description": "`failed` is final: retries are exhausted."},
            "attempt": {"type": "integer", "minimum": 0,
                        "description": "Incremented each time the job is placed; reports must carry it."},
            "retry_count": {"type": "integer", "minimum": 0},
            "max_retries": {"type": "integer", "minimum": 0,
                            "description": "The job's retry budget (MAX_JOB_RETRIES unless the request set it)."},
            "next_attempt_at": _nullable_timestamp("A retry waiting out its backoff is not placed before this."),
            "on_node_lost": {"type": "string", "enum": ["requeue", "fail"]},
            "node_losses": {"type": "integer", "minimum": 0,
                            "description": "How often the job was requeued because its node was lost."},
            "exit_code": {"type": "integer", "nullable": True, "minimum": -255, "maximum": 255,
                          "description": "Null until finished; -1 when the job timed out."},
            "stdout": {"type": "string", "nullable": True},
            "stderr": {"type": "string", "nullable": True},
            "timeout_secs": {"type": "number", "nullable": True,
                             "description": "JOB_TIMEOUT_SECS for `run` jobs; null for `service` jobs."},
            "created_at": TIMESTAMP,
            "placed_at": _nullable_timestamp("When the current attempt was placed on a node."),
            "running_at": _nullable_timestamp("When the current attempt started."),
            "finished_at": _nullable_timestamp("When the job reached done or failed."),
        },
    },
    "JobEvent": {
        "type": "object",
        "description": "One status change or placement in a job's history.",
        "required": ["at", "from", "to", "attempt", "node_id", "reason"],
        "properties": {
            "at": TIMESTAMP,
            "from": {"type": "string", "nullable": True, "enum": STATUSES + [None],
                     "description": "Null for the submission."},
            "to": {"type": "string", "enum": STATUSES},
            "attempt": {"type": "integer", "minimum": 0},
            "node_id": {"type": "string", "nullable": True},
            "reason": {"type": "string", "example": "placed on node-7"},
        },
    },
    "SchedulerNode": {
        "type": "object",
        "description": "A node as the scheduler sees it: its copy of the registry's node list (refreshed every "
                       "NODE_REFRESH_SECS) and the slots the node's jobs hold.",
        "required": ["node_id", "address", "kind", "status", "drained", "slots", "capacity", "slots_used",
                     "max_memory_mb", "max_cpu_percent", "last_heartbeat", "synced_at"],
        "properties": {
            "node_id": {"type": "string"},
            "address": {"type": "string"},
            "kind": {"type": "string", "example": "compute"},
            "status": {"type": "string", "enum": ["healthy", "unhealthy"],
                       "description": "Health as of the last refresh of the node list."},
            "drained": {"type": "boolean", "description": "A drained node gets no new work."},
            "slots": {"type": "integer", "minimum": 0, "description": "The slots the agent advertises."},
            "capacity": {"type": "integer", "minimum": 0,
                         "description": "Jobs the node may hold at once: min(MAX_JOBS_PER_NODE, slots)."},
            "slots_used": {"type": "integer", "minimum": 0,
                           "description": "Its jobs that hold a slot: placed and pending, or running."},
            "max_memory_mb": {"type": "integer", "nullable": True},
            "max_cpu_percent": {"type": "integer", "nullable": True},
            "last_heartbeat": _nullable_timestamp("The node's last heartbeat, as the registry last reported it."),
            "synced_at": TIMESTAMP,
        },
    },
    "Stats": {
        "type": "object",
        "description": "Counts for dashboards and alerts. Counters are totals since the database was created.",
        "required": ["jobs", "sqs", "sns"],
        "properties": {
            "jobs": {"type": "object", "description": "How many jobs are in each status.",
                     "required": STATUSES,
                     "properties": {status: {"type": "integer", "minimum": 0} for status in STATUSES}},
            "sqs": {
                "type": "object",
                "description": "The SQS intake (SQS_URL). Messages are counted each time they are received.",
                "required": ["enabled", "dead_letter_queue", "received", "jobs_created", "duplicates", "rejected",
                             "dead_lettered", "dropped", "requeued"],
                "properties": {
                    "enabled": {"type": "boolean", "description": "SQS_URL is set."},
                    "dead_letter_queue": {"type": "boolean", "description": "SQS_DLQ_URL is set."},
                    "received": {"type": "integer", "minimum": 0, "description": "Messages received."},
                    "jobs_created": {"type": "integer", "minimum": 0, "description": "Jobs created from messages."},
                    "duplicates": {"type": "integer", "minimum": 0,
                                   "description": "Messages whose job already existed (a redelivery, or a re-send "
                                                  "with the same idempotency key)."},
                    "rejected": {"type": "integer", "minimum": 0,
                                 "description": "Messages that are not a valid job request."},
                    "dead_lettered": {"type": "integer", "minimum": 0,
                                      "description": "Rejected messages moved to SQS_DLQ_URL."},
                    "dropped": {"type": "integer", "minimum": 0,
                                "description": "Rejected messages deleted because no SQS_DLQ_URL is set."},
                    "requeued": {"type": "integer", "minimum": 0,
                                 "description": "Messages made visible again after a database error."},
                },
            },
            "sns": {
                "type": "object",
                "description": "The SNS notification outbox (SNS_TOPIC_ARN).",
                "required": ["enabled", "pending", "oldest_pending_age_secs", "published", "publish_failures"],
                "properties": {
                    "enabled": {"type": "boolean", "description": "SNS_TOPIC_ARN is set."},
                    "pending": {"type": "integer", "minimum": 0,
                                "description": "Notifications committed but not yet published."},
                    "oldest_pending_age_secs": {"type": "number", "nullable": True, "minimum": 0,
                                                "description": "Age of the oldest pending notification; "
                                                               "null when none is pending."},
                    "published": {"type": "integer", "minimum": 0, "description": "Notifications published."},
                    "publish_failures": {"type": "integer", "minimum": 0,
                                         "description": "Failed publishes of a notification (each is retried)."},
                },
            },
        },
    },
}

RESPONSES = error_responses(
    not_found="No such job.",
    conflict="The report is from another node, for a stale attempt, or asks for an illegal transition; "
             "nothing changed.")


LINK_HEADER = {
    "Link": {
        "description": "Present when the page is full: the URL of the next page (the same query with "
                       "`after` set to the last job_id).",
        "required": False,
        "schema": {"type": "string", "pattern": r'^<[^>]*>; rel="next"$',
                   "example": '</jobs?limit=100&after=job-100>; rel="next"'},
    },
}

PATHS = {
    **meta_paths("scheduler"),
    "/stats": {
        "get": {
            "operationId": "getStats", "tags": ["meta"], "summary": "Job counts, SQS intake and SNS outbox.",
            "description": "Job counts by status, the SQS intake's counters and the SNS outbox backlog: "
                           "`sns.pending` growing, or `sns.oldest_pending_age_secs` large, means notifications "
                           "cannot be published (see docs/sqs-sns.md).",
            "responses": {"200": _json(_ref("Stats"), "The counts.")},
        },
    },
    "/nodes": {
        "get": {
            "operationId": "listNodes", "tags": ["meta"], "summary": "The nodes the scheduler places on.",
            "description": "The scheduler's copy of the registry's node list with the slots each node's jobs "
                           "hold, by node id. The registry's GET /nodes has the full records.",
            "responses": {"200": _json({"type": "array", "items": _ref("SchedulerNode")}, "The nodes.")},
        },
    },
    **{path: {"get": {
        "operationId": operation, "tags": ["dashboard"], "summary": summary,
        "description": "The dashboard is one static page; its script reads this API.",
        "responses": {"200": {"description": summary, "content": {media_type: {"schema": {"type": "string"}}}}},
    }} for path, operation, summary, media_type in [
        ("/ui", "getDashboard", "The dashboard (HTML).", "text/html"),
        ("/ui/dashboard.js", "getDashboardScript", "The dashboard's script.", "text/javascript"),
        ("/ui/dashboard.css", "getDashboardStyle", "The dashboard's style sheet.", "text/css"),
    ]},
    "/jobs": {
        "post": {
            "operationId": "submitJob", "tags": ["jobs"], "summary": "Submit a job.",
            "description": "The job is stored as `pending` and placed on a healthy compute node when one has room. "
                           "A 201 answer means the job is durably recorded. With an `Idempotency-Key`, the "
                           "same key and request again answer 200 with the job first created; the same key "
                           "with a different request is 409.",
            "parameters": [{"name": "Idempotency-Key", "in": "header", "required": False,
                            "description": "A client-chosen key (1-255 printable ASCII characters, no spaces) "
                                           "that makes retrying a submission safe.",
                            "schema": {"type": "string", "pattern": r"^[\x21-\x7e]{1,255}$"}}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("JobRequest")}}},
            "responses": {
                "201": _json(_ref("Job"), "The new job."),
                "200": _json(_ref("Job"), "A repeat of an earlier request with the same Idempotency-Key: that job."),
                "400": _error("BadRequest"),
                "409": _error("Conflict"),
                "413": _error("PayloadTooLarge"),
                "415": _error("UnsupportedMediaType"),
            },
        },
        "get": {
            "operationId": "listJobs", "tags": ["jobs"], "summary": "List jobs, a page at a time.",
            "description": "Ordered by job id. An empty parameter counts as not given. "
                           "With `node_id` and `status=pending` (and no `after`, `order=desc`), this is the "
                           "agents' poll: at most as many jobs as the node has free slots, `[]` when it is full.",
            "parameters": [
                _query("node_id", "Only jobs placed on this node.", {"type": "string"}),
                _query("status", "Only jobs in this status.", {"type": "string", "enum": STATUSES}),
                _query("job_type", "Only jobs of this type.", {"type": "string", "enum": JOB_TYPES}),
                _query("limit", "Page size.", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}),
                _query("order", "`asc` (oldest first) or `desc` (newest first).",
                       {"type": "string", "enum": ["asc", "desc"], "default": "asc"}),
                _query("after", "Cursor: only jobs after this one in the chosen order (from the `Link` header).",
                       {"type": "string", "pattern": JOB_ID_PATTERN}),
            ],
            "responses": {
                "200": _json({"type": "array", "items": _ref("Job")}, "A page of jobs.", headers=LINK_HEADER),
                "400": _error("BadRequest"),
            },
        },
    },
    "/jobs/{job_id}": {
        "parameters": [JOB_ID_PARAM],
        "get": {
            "operationId": "getJob", "tags": ["jobs"], "summary": "Read one job.",
            "responses": {"200": _json(_ref("Job"), "The job."), "404": _error("NotFound")},
        },
    },
    "/jobs/{job_id}/cancel": {
        "parameters": [JOB_ID_PARAM],
        "post": {
            "operationId": "cancelJob", "tags": ["jobs"], "summary": "Cancel a pending or running job.",
            "description": "A pending job is cancelled at once. A running job is cancelled at once too; its node "
                           "ends the whole process tree (SIGTERM, then SIGKILL after a grace) at its next poll. "
                           "Cancelling a cancelled job does nothing; a done or failed job is 409.",
            "responses": {"200": _json(_ref("Job"), "The cancelled job."), "404": _error("NotFound"),
                          "409": _error("Conflict")},
        },
    },
    "/jobs/batch": {
        "post": {
            "operationId": "submitJobs", "tags": ["jobs"], "summary": "Submit up to 1,000 jobs at once.",
            "description": "Every item is checked as POST /jobs checks one, and all are stored in ONE "
                           "transaction: when any item is invalid the answer is 400 with an `errors` entry "
                           "(its index and what is wrong) per bad item, and nothing is stored. On success "
                           "the answer is 201 with the jobs in request order, placed as far as nodes have "
                           "room. With an `Idempotency-Key`, item i is stored under `KEY:i`: sending the "
                           "same batch again answers 200 with the same jobs.",
            "parameters": [{"name": "Idempotency-Key", "in": "header", "required": False,
                            "description": "A client-chosen key for the whole batch (1-250 printable ASCII "
                                           "characters, no spaces).",
                            "schema": {"type": "string", "pattern": r"^[\x21-\x7e]{1,250}$"}}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("JobBatch")}}},
            "responses": {
                "201": _json({"type": "array", "items": _ref("Job")}, "The new jobs, in request order."),
                "200": _json({"type": "array", "items": _ref("Job")},
                             "A repeat of an earlier batch with the same Idempotency-Key: those jobs."),
                "400": _json(_ref("BatchError"), "The body or an item is invalid; nothing was stored."),
                "409": _error("Conflict"),
                "413": _error("PayloadTooLarge"),
                "415": _error("UnsupportedMediaType"),
            },
        },
    },
    "/jobs/reports": {
        "post": {
            "operationId": "reportStatuses", "tags": ["agents"], "summary": "Report on many attempts at once (agents).",
            "description": "Each item is applied as POST /jobs/{job_id}/status would apply it, on its own: a "
                           "refused report (stale attempt, other node, illegal move, invalid item) changes "
                           "nothing and does not stop the others. The answer has one result per item. A 400 "
                           "answer is about the body as a whole (not an object, no `reports` array, more "
                           "than 1,000 items).",
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("ReportBatch")}}},
            "responses": {
                "200": _json(_ref("ReportResults"), "What happened to each report."),
                "400": _error("BadRequest"),
                "413": _error("PayloadTooLarge"),
                "415": _error("UnsupportedMediaType"),
            },
        },
    },
    "/jobs/output": {
        "post": {
            "operationId": "sendLiveOutput", "tags": ["agents"],
            "summary": "Store the output of running jobs so far (agents).",
            "description": "Agents send the tails of running jobs' stdout and stderr (every "
                           "AGENT_OUTPUT_INTERVAL_SECS, only what changed), so that GET /jobs/{job_id} shows "
                           "the output of a job while it runs. Each item is fenced as a status report is: it "
                           "must come from the node the job is placed on, for its current attempt, and the job "
                           "must still be `running`; anything else is refused for that item (409) and changes "
                           "nothing, so a late update never overwrites a final report's output. The stored "
                           "text is cut to the last CORRAL_OUTPUT_TAIL_BYTES. No job event is recorded. A 400 "
                           "answer is about the body as a whole.",
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("OutputBatch")}}},
            "responses": {
                "200": _json(_ref("OutputResults"), "What happened to each item."),
                "400": _error("BadRequest"),
                "413": _error("PayloadTooLarge"),
                "415": _error("UnsupportedMediaType"),
            },
        },
    },
    "/nodes/{node_id}/claim": {
        "parameters": [NODE_ID_PARAM],
        "post": {
            "operationId": "claimJobs", "tags": ["agents"], "summary": "Take jobs placed on a node (agents).",
            "description": "Atomically takes up to `max` pending jobs placed on the node (never more than its "
                           "free slots): each becomes `running` for its current attempt, exactly as a "
                           "`running` status report would make it, and goes to this claim only. When "
                           "nothing is claimable the request waits up to `wait_secs` and answers as soon as "
                           "work for the node exists, or `[]` at the deadline. A claim that takes jobs "
                           "also renews the node's lease (one that takes nothing writes nothing). A claim "
                           "that could not wait (the server's long-poll capacity, "
                           "LONG_POLL_MAX_WAITERS, is in use, or it is stopping) answers at once with the "
                           "`X-Corral-Long-Poll` header; ask again after a pause. Work that comes after the "
                           "claim has waited 1 s is not handed to it (the request is no proof the agent is "
                           "still alive): it answers `[]` with `X-Corral-Long-Poll: again`; ask again at once.",
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("ClaimRequest")}}},
            "responses": {
                "200": _json({"type": "array", "items": _ref("Job")},
                             "The claimed jobs (status `running`, with their attempt), possibly none.",
                             headers={"X-Corral-Long-Poll": {
                                 "description": "Present when an empty answer came before the deadline: "
                                                "`busy` (too many claims wait in this server process) or "
                                                "`stopping` (ask again after a pause), or `again` (work "
                                                "came after the claim had waited a while: ask again at once "
                                                "to take it).",
                                 "required": False,
                                 "schema": {"type": "string", "enum": ["busy", "stopping", "again"]}}}),
                "400": _error("BadRequest"),
                "404": _error("NotFound"),
                "413": _error("PayloadTooLarge"),
                "415": _error("UnsupportedMediaType"),
            },
        },
    },
    "/nodes/{node_id}/lease": {
        "parameters": [NODE_ID_PARAM],
        "post": {
            "operationId": "renewLease", "tags": ["agents"], "summary": "Renew a node's lease (agents).",
            "description": "Agents call this every heartbeat while they hold jobs (a claim that takes jobs "
                           "renews the lease too; idle agents renew once a minute for the list below). An agent "
                           "that cannot renew for `lease_secs` stops its run jobs; the scheduler requeues them "
                           "NODE_LOST_GRACE_SECS later. The answer "
                           "lists the attempts the scheduler has running on the node: an attempt the agent runs "
                           "that is not listed is stale and the agent ends it.",
            "responses": {
                "200": _json({"type": "object", "required": ["node_id", "lease_secs", "running"],
                              "properties": {
                                  "node_id": {"type": "string"},
                                  "lease_secs": {"type": "number"},
                                  "running": {"type": "array", "items": {
                                      "type": "object", "required": ["job_id", "attempt"],
                                      "properties": {"job_id": {"type": "string"}, "attempt": {"type": "integer"}}}},
                              }}, "The lease is renewed."),
                "400": _error("BadRequest"),
                "404": _error("NotFound"),
            },
        },
    },
    "/jobs/{job_id}/retry": {
        "parameters": [JOB_ID_PARAM],
        "post": {
            "operationId": "retryJob", "tags": ["jobs"], "summary": "Run a failed job again.",
            "description": "Puts a `failed` job back to `pending` with a fresh retry budget. Any other status is 409.",
            "responses": {"200": _json(_ref("Job"), "The job, pending again."), "404": _error("NotFound"),
                          "409": _error("Conflict")},
        },
    },
    "/jobs/{job_id}/events": {
        "parameters": [JOB_ID_PARAM],
        "get": {
            "operationId": "listJobEvents", "tags": ["jobs"], "summary": "A job's history, oldest first.",
            "responses": {"200": _json({"type": "array", "items": _ref("JobEvent")}, "The job's events."),
                          "404": _error("NotFound")},
        },
    },
    "/jobs/{job_id}/status": {
        "parameters": [JOB_ID_PARAM],
        "post": {
            "operationId": "reportStatus", "tags": ["agents"], "summary": "Report on an attempt (agents).",
            "description": "`running` when the attempt starts (repeating it is harmless), then `done` or `failed`. "
                           "A failure with retries left puts the job back to `pending`.",
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("StatusReport")}}},
            "responses": {
                "200": _json(_ref("Job"), "The job after the report."),
                "400": _error("BadRequest"),
                "404": _error("NotFound"),
                "409": _error("Conflict"),
                "413": _error("PayloadTooLarge"),
                "415": _error("UnsupportedMediaType"),
            },
        },
    },
}

DOCUMENT = {
    "openapi": "3.0.3",
    "info": {
        "title": "Corral scheduler",
        "version": "0.1.0",
        "description": "Submit shell jobs and follow them; agents claim work (long-poll) and report on it. "
                       "Every error is JSON `{\"error\": \"...\"}`.",
    },
    "tags": [
        {"name": "jobs", "description": "Submitting and reading jobs."},
        {"name": "agents", "description": "What node agents call."},
        {"name": "meta", "description": "Health, counts and this document."},
        {"name": "dashboard", "description": "The web dashboard at /ui."},
    ],
    "paths": json_content_type_everywhere(PATHS),
    "components": {"schemas": SCHEMAS, "responses": RESPONSES, "securitySchemes": SECURITY_SCHEMES},
    "security": SECURITY,
}
