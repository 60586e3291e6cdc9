"""The scheduler's OpenAPI 3.1.0 document, served at GET /openapi.json: its routes,
parameters and answers, with every body schema generated from the models of
contract.py (control-plane/server/openapi.py builds it).

tests/test_openapi.py checks every route is listed and runs schemathesis
against a live server to check every answer against it.
"""

from corral.shared import contract as shared_contract
from corral.shared import states, wire
from corral.server import revocations
from corral.server.openapi import NAME_PATTERN_PARAM, build, error_responses, meta_paths
from corral.server.openapi import body as _body
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.openapi import path_param as _path_param
from corral.server.openapi import query as _query

from . import contract, events, waiting

STATUSES = list(states.ALL)
JOB_TYPES = list(wire.JOB_TYPES)
JOB_ID_PATTERN = wire.JOB_ID_PATTERN


NODE_ID_PARAM = _path_param("node_id", "The agent's node id.", NAME_PATTERN_PARAM)
SCHEDULE_NAME_PARAM = _path_param("name", "A schedule's name.", NAME_PATTERN_PARAM)
JOB_ID_PARAM = _path_param("job_id", "A job id such as `job-42`.", {"type": "string", "pattern": JOB_ID_PATTERN})

PENDING_LIMIT = _json(shared_contract.Error, "The cluster holds MAX_PENDING_JOBS pending jobs: nothing was stored. "
                      "The body also has `pending_jobs`, `max_pending_jobs`, `setting` and `requested` (the "
                      "new jobs the request would add).",
                      headers={"Retry-After": {"description": "Seconds to wait before trying again.",
                                               "schema": {"type": "integer"}}})

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

# One event of GET /events as a client's parser reads it (before OpenAPI 3.2 the schema
# of an event stream describes each event).
SSE_EVENT = {
    "type": "object", "required": ["event", "data", "id"],
    "properties": {
        "event": {"type": "string", "enum": [*events.TYPES, *events.STREAM_TYPES]},
        "data": {"type": "string", "contentMediaType": "application/json",
                 "description": "A JSON object: `at`, and the fields of its type."},
        "id": {"type": "string", "minLength": 1, "description": "Send it back as `Last-Event-ID` to resume after it."},
        "retry": {"type": "integer", "minimum": 0},
    },
}
LOG_STREAM_SCHEMA = {"type": "string", "enum": list(wire.LOG_STREAMS)}
LOG_HEADERS = {
    wire.LOG_SIZE_HEADER: {"description": "The stream's bytes stored so far.", "required": True,
                           "schema": {"type": "string", "pattern": "^[0-9]+$"}},
    wire.LOG_COMPLETE_HEADER: {"description": "`true` once the stream's last chunk is stored.", "required": True,
                               "schema": {"type": "string", "enum": ["true", "false"]}},
    wire.LOG_ATTEMPT_HEADER: {"description": "The attempt answered (0: the job has not run).", "required": True,
                              "schema": {"type": "string", "pattern": "^[0-9]+$"}},
}
ARRAY_ID_PARAM = {"name": "array_id", "in": "path", "required": True, "description": "An array id.",
                  "schema": {"type": "string", "pattern": r"^array-[1-9][0-9]{0,17}$"}}

PATHS = {
    **meta_paths("scheduler"),
    "/stats": {
        "get": {
            "operationId": "getStats", "tags": ["meta"], "summary": "Job counts, SQS intake and SNS outbox.",
            "description": "Job counts by status, the SQS intake's counters and the SNS outbox backlog: "
                           "`sns.pending` growing, or `sns.oldest_pending_age_secs` large, means notifications "
                           "cannot be published (see docs/sqs-sns.md).",
            "responses": {"200": _json(contract.Stats, "The counts.")},
        },
    },
    "/stats/history": {
        "get": {
            "operationId": "getStatsHistory", "tags": ["meta"],
            "summary": "Samples of the cluster's activity and usage, for charts.",
            "description": "Every STATS_INTERVAL_SECS one sample, kept STATS_RETENTION_SECS: the jobs that reached "
                           "each final status and the first attempts that started (with their dispatch latency, "
                           "p50 and p95) since the previous sample, pending and running jobs, and each node's "
                           "slots, memory and CPU reserved and used. Oldest first; the dashboard's charts draw them.",
            "parameters": [
                _query("since", "Only samples taken after this time (unix seconds); default: every sample kept.",
                       {"type": "number", "minimum": 0, "maximum": 253402300799}),
                _query("node_id", "Only this node's usage in each sample (a node page's chart); default: every "
                       "node's.", {"type": "string"}),
                _query("nodes", "`none`: no node's usage (`nodes` empty in each sample; the answer stays small "
                       "on a large fleet).", {"type": "string", "enum": ["all", "none"], "default": "all"}),
            ],
            "responses": {
                "200": _json(contract.StatsHistory, "The samples."),
                "400": _error("BadRequest"),
            },
        },
    },
    "/nodes": {
        "get": {
            "operationId": "listNodes", "tags": ["meta"], "summary": "The nodes the scheduler places on.",
            "description": "The scheduler's copy of the registry's node list with the slots each node's jobs "
                           "hold, by node id. The registry's GET /nodes has the full records.",
            "responses": {"200": _json(list[contract.SchedulerNode], "The nodes.")},
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
            "requestBody": _body(contract.JobRequest),
            "responses": {
                "201": _json(contract.Job | contract.ArrayCreated,
                             "The new job; for a request with `array`, the new array."),
                "200": _json(contract.Job | contract.ArrayCreated,
                             "A repeat of an earlier request with the same Idempotency-Key: that job (or array)."),
                "400": _error("BadRequest"),
                "409": _error("Conflict"),
                "413": _error("PayloadTooLarge"),
                "415": _error("UnsupportedMediaType"),
                "429": PENDING_LIMIT,
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
                _query("pending_reason", "Only pending jobs waiting for this reason now (its `code`).",
                       {"type": "string", "enum": list(waiting.CODES)}),
                _query("name", "Only jobs with this name.", {"type": "string", "maxLength": 128}),
                _query("schedule", "Only the runs of this schedule.", {"type": "string", "maxLength": 128}),
                _query("array", "Only the jobs of this array (such as array-3).",
                       {"type": "string", "pattern": r"^array-[0-9]{1,18}$"}),
                _query("created_after", "Only jobs created at or after this time (ISO-8601 with Z or an offset).",
                       {"type": "string", "format": "date-time"}),
                _query("created_before", "Only jobs created before this time (ISO-8601 with Z or an offset).",
                       {"type": "string", "format": "date-time"}),
                _query("limit", "Page size.", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}),
                _query("order", "`asc` (oldest first) or `desc` (newest first).",
                       {"type": "string", "enum": ["asc", "desc"], "default": "asc"}),
                _query("after", "Cursor: only jobs after this one in the chosen order (from the `Link` header).",
                       {"type": "string", "pattern": JOB_ID_PATTERN}),
            ],
            "responses": {
                "200": _json(list[contract.Job], "A page of jobs.", headers=LINK_HEADER),
                "400": _error("BadRequest"),
            },
        },
    },
    "/jobs/{job_id}": {
        "parameters": [JOB_ID_PARAM],
        "get": {
            "operationId": "getJob", "tags": ["jobs"], "summary": "Read one job.",
            "responses": {"200": _json(contract.Job, "The job."), "404": _error("NotFound")},
        },
    },
    "/jobs/{job_id}/why": {
        "parameters": [JOB_ID_PARAM],
        "get": {
            "operationId": "whyJobWaits", "tags": ["jobs"], "summary": "Why a pending job waits.",
            "description": "The job's `pending_reason` and, computed now, the nodes that came closest to "
                           "taking it, each with what it lacks (its pin, health, drain, constraints and pool, "
                           "maximum limits, free slots, unreserved memory and CPU). 409 for a job that is not "
                           "pending.",
            "responses": {"200": _json(contract.WhyItWaits, "Why it waits."), "404": _error("NotFound"),
                          "409": _error("Conflict")},
        },
    },
    "/arrays/{array_id}": {
        "parameters": [ARRAY_ID_PARAM],
        "get": {
            "operationId": "getArray", "tags": ["jobs"], "summary": "An array and its jobs by status.",
            "responses": {"200": _json(contract.ArraySummary, "The array."), "404": _error("NotFound")},
        },
    },
    "/arrays/{array_id}/cancel": {
        "parameters": [ARRAY_ID_PARAM],
        "post": {
            "operationId": "cancelArray", "tags": ["jobs"], "summary": "Cancel what has not finished of an array.",
            "description": "Every pending or running job of the array is cancelled, in one transaction (running "
                           "ones are ended by their nodes); done and failed ones stay.",
            "responses": {"200": _json(contract.ArraySummary, "The array after the cancel."),
                          "404": _error("NotFound")},
        },
    },
    "/concurrency": {
        "get": {
            "operationId": "listConcurrencyLimits", "tags": ["jobs"], "summary": "The concurrency limits set.",
            "responses": {"200": _json(list[contract.ConcurrencyLimitAnswer], "Every limit, by key.")},
        },
    },
    "/concurrency/{key}": {
        "parameters": [{"name": "key", "in": "path", "required": True, "description": "A concurrency key.",
                        "schema": {"type": "string", "pattern": r"^[A-Za-z0-9._-]{1,128}$"}}],
        "put": {
            "operationId": "setConcurrencyLimit", "tags": ["jobs"], "summary": "Set a key's limit.",
            "description": "At most `limit` jobs with this `concurrency_key` are placed or running at once, "
                           "across the cluster. Lowering it ends nothing: jobs over the limit finish.",
            "requestBody": _body(contract.ConcurrencyLimitRequest),
            "responses": {"200": _json(contract.ConcurrencyLimitAnswer, "The limit."),
                          "400": _error("BadRequest"), "404": _error("NotFound"),
                          "413": _error("PayloadTooLarge")},
        },
        "delete": {
            "operationId": "removeConcurrencyLimit", "tags": ["jobs"], "summary": "Remove a key's limit.",
            "description": "The key is unlimited from then on.",
            "responses": {"204": {"description": "Removed."}, "400": _error("BadRequest"),
                          "404": _error("NotFound")},
        },
    },
    "/schedules": {
        "get": {
            "operationId": "listSchedules", "tags": ["schedules"], "summary": "Every schedule, by name.",
            "responses": {"200": _json(list[contract.ScheduleAnswer], "The schedules.")},
        },
        "post": {
            "operationId": "createSchedule", "tags": ["schedules"], "summary": "Create a schedule.",
            "description": "A job run at every slot of `cron` (in `time_zone`) or every `interval_secs`: each "
                           "slot creates exactly one job (its Idempotency-Key is schedule:<id>:<slot>). 409 "
                           "when the name is taken.",
            "requestBody": _body(contract.ScheduleRequest),
            "responses": {"201": _json(contract.ScheduleAnswer, "The schedule."), "400": _error("BadRequest"),
                          "409": _error("Conflict"), "413": _error("PayloadTooLarge")},
        },
    },
    "/schedules/{name}": {
        "parameters": [SCHEDULE_NAME_PARAM],
        "get": {
            "operationId": "getSchedule", "tags": ["schedules"], "summary": "Read a schedule.",
            "responses": {"200": _json(contract.ScheduleAnswer, "The schedule."), "404": _error("NotFound")},
        },
        "patch": {
            "operationId": "changeSchedule", "tags": ["schedules"], "summary": "Change, enable or disable it.",
            "description": "The fields given replace the schedule's own (not its name), checked as a whole as "
                           "POST /schedules checks one. A change of its timing, or enabling it, computes its "
                           "next slot from now.",
            "requestBody": _body(contract.ScheduleChange),
            "responses": {"200": _json(contract.ScheduleAnswer, "The schedule."), "400": _error("BadRequest"),
                          "404": _error("NotFound"), "413": _error("PayloadTooLarge")},
        },
        "delete": {
            "operationId": "deleteSchedule", "tags": ["schedules"], "summary": "Delete a schedule.",
            "description": "The jobs it created stay.",
            "responses": {"204": {"description": "Deleted."}, "404": _error("NotFound")},
        },
    },
    "/schedules/{name}/runs": {
        "parameters": [SCHEDULE_NAME_PARAM],
        "get": {
            "operationId": "listScheduleRuns", "tags": ["schedules"], "summary": "A schedule's runs, newest first.",
            "description": "Each slot that fired (its job and the job's status) or was skipped (why).",
            "parameters": [{"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                                       "maximum": 1000, "default": 100}}],
            "responses": {"200": _json(list[contract.ScheduleRunAnswer], "The runs."),
                          "400": _error("BadRequest"), "404": _error("NotFound")},
        },
    },
    "/jobs/{job_id}/cancel": {
        "parameters": [JOB_ID_PARAM],
        "post": {
            "operationId": "cancelJob", "tags": ["jobs"], "summary": "Cancel a pending or running job.",
            "description": "A pending job is cancelled at once. A running job is cancelled at once too; its node "
                           "ends the whole process tree (SIGTERM, then SIGKILL after a grace) at its next poll. "
                           "Cancelling a cancelled job does nothing; a done or failed job is 409.",
            "responses": {"200": _json(contract.Job, "The cancelled job."), "404": _error("NotFound"),
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
            "requestBody": _body(contract.JobBatch),
            "responses": {
                "201": _json(list[contract.Job], "The new jobs, in request order."),
                "200": _json(list[contract.Job],
                             "A repeat of an earlier batch with the same Idempotency-Key: those jobs."),
                "400": _json(shared_contract.BatchError, "The body or an item is invalid; nothing was stored."),
                "409": _error("Conflict"),
                "413": _error("PayloadTooLarge"),
                "429": PENDING_LIMIT,
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
            "requestBody": _body(contract.ReportBatch),
            "responses": {
                "200": _json(contract.ReportResults, "What happened to each report."),
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
            "requestBody": _body(contract.OutputBatch),
            "responses": {
                "200": _json(contract.OutputResults, "What happened to each item."),
                "400": _error("BadRequest"),
                "413": _error("PayloadTooLarge"),
                "415": _error("UnsupportedMediaType"),
            },
        },
    },
    "/jobs/{job_id}/attempts/{attempt}/logs/{stream}/{seq}": {
        "parameters": [
            JOB_ID_PARAM,
            _path_param("attempt", "The attempt whose output this is (1, 2, …).",
                        {"type": "integer", "minimum": 1, "maximum": 2 ** 31 - 1}),
            _path_param("stream", "Which output.", LOG_STREAM_SCHEMA),
            _path_param("seq", "The chunk's number in its stream: 0, 1, 2 …",
                        {"type": "integer", "minimum": 0, "maximum": 2 ** 31 - 1}),
        ],
        "put": {
            "operationId": "putLogChunk", "tags": ["agents"],
            "summary": "Store a chunk of an attempt's output (agents).",
            "description": (
                "The agent ships each stream of each attempt whole, in chunks numbered from 0 that follow each "
                "other without gap or overlap, the last one marked final. Only the node the attempt ran on may "
                "send them, for the job's earlier attempts too. A chunk stored before (same seq, offset and "
                "bytes) answers 200 with `stored` false and changes nothing; a chunk that is not the next one "
                "answers 409 with the seq and offset expected. A stream is refused (413) past "
                "CORRAL_LOG_MAX_BYTES and 4 KiB for the agent's mark of what it dropped. Every stored chunk "
                "makes a `log` event on GET /events. See docs/api.md, \"Complete logs\"."),
            "parameters": [
                {"name": wire.LOG_NODE_HEADER, "in": "header", "required": True,
                 "description": "The node that ran the attempt (the node credential's own).",
                 "schema": NAME_PATTERN_PARAM},
                {"name": wire.LOG_OFFSET_HEADER, "in": "header", "required": True,
                 "description": "Where in the stream the chunk starts (bytes).",
                 "schema": {"type": "string", "pattern": "^[0-9]{1,16}$"}},
                {"name": wire.LOG_FINAL_HEADER, "in": "header", "required": False,
                 "description": "`1` on the stream's last chunk (which may be empty).",
                 "schema": {"type": "string", "enum": ["0", "1"]}},
            ],
            "requestBody": {"required": True, "description": f"The chunk's bytes (at most {wire.LOG_CHUNK_MAX_BYTES}).",
                            "content": {"application/octet-stream": {
                                "schema": {"type": "string", "format": "binary"}}}},
            "responses": {
                "200": _json(contract.LogChunkStored, "Stored, or stored before."),
                "400": _error("BadRequest"),
                "404": _error("NotFound"),
                "409": _json(contract.LogChunkRefused | shared_contract.Error,
                             "Not the next chunk (where to go on from), or not an attempt this node ran."),
                "413": _error("PayloadTooLarge"),
                "415": _error("UnsupportedMediaType"),
                "503": _json(shared_contract.Error, "The log store (S3) did not answer; nothing was stored."),
            },
        },
    },
    "/jobs/logs": {
        "post": {
            "operationId": "putLogChunks", "tags": ["agents"],
            "summary": "Store many small chunks of attempts' output (agents).",
            "description": (
                "What PUT /jobs/{job_id}/attempts/{attempt}/logs/{stream}/{seq} does, for up to 1,000 chunks "
                "at once, their bytes in base64: the agents send their small chunks (the last ones of short "
                "jobs) this way, in one request per pass. Each chunk is stored or refused on its own and gets "
                "the answer the PUT would have given. A 400 answer is about the body as a whole."),
            "requestBody": _body(contract.LogChunkBatch),
            "responses": {
                "200": _json(contract.LogChunkResults, "What happened to each chunk."),
                "400": _error("BadRequest"),
                "413": _error("PayloadTooLarge"),
                "415": _error("UnsupportedMediaType"),
            },
        },
    },
    "/jobs/{job_id}/logs": {
        "parameters": [JOB_ID_PARAM],
        "get": {
            "operationId": "readJobLogs", "tags": ["jobs"], "summary": "A job's complete output, by byte range.",
            "description": (
                "The bytes of one stream of one attempt from `offset`, at most `limit` (and at most 1 MiB: "
                "read on from offset + what came). The headers say how much of the stream is stored and whether "
                "it is complete; an offset at or past the end answers no bytes. See docs/api.md, "
                "\"Complete logs\"."),
            "parameters": [
                _query("attempt", "Which attempt; default the job's latest.",
                       {"type": "integer", "minimum": 1, "maximum": 2 ** 31 - 1}),
                _query("stream", "Which output; default stdout.", LOG_STREAM_SCHEMA),
                _query("offset", "The first byte wanted; default 0.", {"type": "integer", "minimum": 0}),
                _query("limit", "The most bytes wanted; default and most 1 MiB.", {"type": "integer", "minimum": 1}),
            ],
            "responses": {
                "200": {"description": "The bytes.", "headers": LOG_HEADERS,
                        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
                "400": _error("BadRequest"),
                "404": _error("NotFound"),
                "503": _json(shared_contract.Error, "The log store (S3) did not answer."),
            },
        },
    },
    "/nodes/{node_id}/credential/revoke": {
        "parameters": [NODE_ID_PARAM],
        "post": {
            "operationId": "revokeNodeCredential", "tags": ["nodes"],
            "summary": "Refuse a node's credentials below a generation, on the registry and the scheduler.",
            "description": "Raises the lowest generation of the node's credential both services accept: by one, "
                           "or to `min_generation` (never lowers it); the registry first, then the scheduler to "
                           "the registry's answer. Older credentials of the node are answered 401 from then on; "
                           "other nodes are not affected. 503 when the registry could not be told: nothing "
                           "changed here, send it again.",
            "requestBody": _body(revocations.Revocation, required=False),
            "responses": {"200": _json(revocations.CredentialFloor, "The node's floor now, on both services."),
                          "400": _error("BadRequest"), "404": _error("NotFound"),
                          "409": _error("Conflict"), "415": _error("UnsupportedMediaType"),
                          "503": _json(shared_contract.Error, "The registry could not be told; nothing changed here.")},
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
            "requestBody": _body(contract.ClaimRequest),
            "responses": {
                "200": _json(list[contract.Job],
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
    "/nodes/{node_id}/drain": {
        "parameters": [NODE_ID_PARAM],
        "post": {
            "operationId": "drainNode", "tags": ["nodes"], "summary": "Drain a node: no new work goes to it.",
            "description": "Sets the registry's drain flag, then the scheduler's own copy under the node's "
                           "placement lock: from this answer on, no placement on any worker or replica puts "
                           "new work on the node, and its placed jobs not yet claimed go back to the queue. "
                           "What it runs finishes. The registry's own drain route is seen by placement at the "
                           "next refresh of the node list (NODE_REFRESH_SECS). 503 when the registry does not "
                           "answer (nothing is changed).",
            "responses": {
                "200": _json(contract.NodeDrain, "The node is drained."),
                "400": _error("BadRequest"),
                "404": _error("NotFound"),
                "415": _error("UnsupportedMediaType"),
                "503": _json(shared_contract.Error, "The registry did not answer; nothing was changed."),
            },
        },
    },
    "/nodes/{node_id}/undrain": {
        "parameters": [NODE_ID_PARAM],
        "post": {
            "operationId": "undrainNode", "tags": ["nodes"], "summary": "Let a drained node take work again.",
            "description": "The registry's flag, then the scheduler's copy; the node takes work from the answer on.",
            "responses": {
                "200": _json(contract.NodeDrain, "The node takes work again."),
                "400": _error("BadRequest"),
                "404": _error("NotFound"),
                "415": _error("UnsupportedMediaType"),
                "503": _json(shared_contract.Error, "The registry did not answer; nothing was changed."),
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
            "requestBody": _body(contract.LeaseRenewal, required=False),
            "responses": {
                "200": _json(contract.Lease, "The lease is renewed."),
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
            "responses": {"200": _json(contract.Job, "The job, pending again."), "404": _error("NotFound"),
                          "409": _error("Conflict")},
        },
    },
    "/jobs/{job_id}/events": {
        "parameters": [JOB_ID_PARAM],
        "get": {
            "operationId": "listJobEvents", "tags": ["jobs"], "summary": "A job's history, oldest first.",
            "responses": {"200": _json(list[contract.JobEvent], "The job's events."),
                          "404": _error("NotFound")},
        },
    },
    "/events": {
        "get": {
            "operationId": "streamEvents", "tags": ["jobs"],
            "summary": "What happens in the cluster, as Server-Sent Events.",
            "description": (
                "A `text/event-stream` of `job` events (every transition: `from`, `to`, `attempt`, `node_id`, "
                "`reason`), `node` events (`change`: registered, healthy, unhealthy, drained, undrained, "
                "deregistered) and `log` events (new output of an attempt: `attempt`, `stream`, `offset`, `size`); "
                "each has `at` and an `id`. The stream starts with an `open` event whose id is where it starts "
                "(send it back as `Last-Event-ID` to resume after it), or a `missed` event first when events after "
                "the client's position were deleted (EVENTS_RETENTION_SECS). Idle streams get keep-alive comments; "
                "a stream ends with an `end` event after EVENTS_STREAM_MAX_SECS, and the client resumes. "
                "Open streams have a budget of their own in each server process, apart from the long-poll "
                "claims: EVENTS_STREAMS_MAX (503 beyond it) and EVENTS_STREAMS_PER_CREDENTIAL for one token, or "
                "one client address without tokens (429 beyond it). See docs/api.md, \"The event stream\"."),
            "parameters": [
                _query("job_id", "Only this job's events.", {"type": "string"}),
                _query("node_id", "Only events of this node (its changes, and its jobs' transitions).",
                      {"type": "string"}),
                _query("type", "Only these types: `job`, `node`, `log`, comma-separated or repeated.",
                      {"type": "string"}),
                {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"},
                 "description": "Resume after this event (its `id`)."},
            ],
            "responses": {
                "200": {"description": "The stream; the schema describes one event.",
                        "content": {"text/event-stream": {"schema": SSE_EVENT}}},
                "400": _error("BadRequest"),
                "429": _json(shared_contract.Error, "This credential already holds "
                                                            "EVENTS_STREAMS_PER_CREDENTIAL streams in this process; "
                                                            "`Retry-After` says when to try again."),
                "503": _json(shared_contract.Error, "This process already holds EVENTS_STREAMS_MAX event "
                                                            "streams; `Retry-After` says when to try again."),
            },
        },
    },
    "/jobs/{job_id}/status": {
        "parameters": [JOB_ID_PARAM],
        "post": {
            "operationId": "reportStatus", "tags": ["agents"], "summary": "Report on an attempt (agents).",
            "description": "`running` when the attempt starts (repeating it is harmless), then `done` or `failed`. "
                           "A failure with retries left puts the job back to `pending`.",
            "requestBody": _body(contract.StatusReport),
            "responses": {
                "200": _json(contract.Job, "The job after the report."),
                "400": _error("BadRequest"),
                "404": _error("NotFound"),
                "409": _error("Conflict"),
                "413": _error("PayloadTooLarge"),
                "415": _error("UnsupportedMediaType"),
            },
        },
    },
}

DOCUMENT = build(
    info={
        "title": "Corral scheduler",
        "version": "0.1.0",
        "description": "Submit shell jobs and follow them; agents claim work (long-poll) and report on it. "
                       "Every error is JSON `{\"error\": \"...\"}`.",
    },
    tags=[
        {"name": "jobs", "description": "Submitting and reading jobs."},
        {"name": "schedules", "description": "Jobs run at the slots of a cron expression or an interval."},
        {"name": "agents", "description": "What node agents call."},
        {"name": "meta", "description": "Health, counts and this document."},
        {"name": "dashboard", "description": "The web dashboard at /ui."},
    ],
    paths=PATHS,
    responses=RESPONSES,
)
