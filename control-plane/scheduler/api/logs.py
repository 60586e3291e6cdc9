"""Jobs' complete output.

Agents ship each stream of each attempt in numbered chunks (raw bytes one at a time, or
small ones many at once in base64); anyone who may read reads it back by byte range
(job_logs.py stores it, in the database or S3)."""
from flask import current_app, request

from corral.server import auth
from corral.server.http import query_int, read_json_object, request_body
from corral.server.openapi import NAME_PATTERN_PARAM
from corral.server.openapi import body as _body
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.openapi import query as _query
from corral.server.routes import Routes
from corral.shared import contract as shared_contract
from corral.shared import wire
from corral.shared.contract import respond
from corral.shared.errors import TooLarge
from corral.shared.wire import LOG_ATTEMPT_HEADER, LOG_CHUNK_MAX_BYTES, LOG_COMPLETE_HEADER, LOG_SIZE_HEADER

from .. import contract, validation, views
from .context import SchedulerApi, require_items_node

routes = Routes("agents")

LOG_STREAM_SCHEMA = {"type": "string", "enum": list(wire.LOG_STREAMS)}
LOG_HEADERS = {
    wire.LOG_SIZE_HEADER: {"description": "The stream's bytes stored so far.", "required": True,
                           "schema": {"type": "string", "pattern": "^[0-9]+$"}},
    wire.LOG_COMPLETE_HEADER: {"description": "`true` once the stream's last chunk is stored.", "required": True,
                               "schema": {"type": "string", "enum": ["true", "false"]}},
    wire.LOG_ATTEMPT_HEADER: {"description": "The attempt answered (0: the job has not run).", "required": True,
                              "schema": {"type": "string", "pattern": "^[0-9]+$"}},
}


@routes.put("/jobs/<job_id>/attempts/<attempt>/logs/<stream>/<seq>", access=auth.agent(auth.NODE_IN_RECORD),
            raw=True,  # the node is in a header; the body is the chunk's bytes
            operation_id="putLogChunk", summary="Store a chunk of an attempt's output (agents).",
            description=(
                "The agent ships each stream of each attempt whole, in chunks numbered from 0 that follow each "
                "other without gap or overlap, the last one marked final. Only the node the attempt ran on may "
                "send them, for the job's earlier attempts too. A chunk stored before (same seq, offset and "
                "bytes) answers 200 with `stored` false and changes nothing; a chunk that is not the next one "
                "answers 409 with the seq and offset expected. A stream is refused (413) past "
                "CORRAL_LOG_MAX_BYTES and 4 KiB for the agent's mark of what it dropped. Every stored chunk "
                "makes a `log` event on GET /events. See docs/api.md, \"Complete logs\"."),
            parameters=[
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
            request_body={"required": True, "description": f"The chunk's bytes (at most {wire.LOG_CHUNK_MAX_BYTES}).",
                          "content": {"application/octet-stream": {
                              "schema": {"type": "string", "format": "binary"}}}},
            responses={
                "200": _json(contract.LogChunkStored, "Stored, or stored before."),
                "404": _error("NotFound"),
                "409": _json(contract.LogChunkRefused | shared_contract.Error,
                             "Not the next chunk (where to go on from), or not an attempt this node ran."),
                "503": _json(shared_contract.Error, "The log store (S3) did not answer; nothing was stored."),
            })
def put_log_chunk(api: SchedulerApi, job_id, attempt, stream, seq):
    chunk = validation.log_chunk(attempt, stream, seq, request.headers)
    auth.require_node(chunk["node_id"])
    data = request_body()
    if len(data) > LOG_CHUNK_MAX_BYTES:
        raise TooLarge(f"a log chunk is at most {LOG_CHUNK_MAX_BYTES} bytes; this one has {len(data)}")
    stored = api.job_logs.put(job_id, data=data, now=api.clock(), **chunk)
    return respond(contract.LogChunkStored.model_validate(views.log_position(stored)))


@routes.post("/jobs/logs", access=auth.agent(auth.NODE_IN_BODY),
             operation_id="putLogChunks", summary="Store many small chunks of attempts' output (agents).",
             description=(
                 "What PUT /jobs/{job_id}/attempts/{attempt}/logs/{stream}/{seq} does, for up to 1,000 chunks "
                 "at once, their bytes in base64: the agents send their small chunks (the last ones of short "
                 "jobs) this way, in one request per pass. Each chunk is stored or refused on its own and gets "
                 "the answer the PUT would have given. A 400 answer is about the body as a whole."),
             request_body=_body(contract.LogChunkBatch),
             responses={
                 "200": _json(contract.LogChunkResults, "What happened to each chunk."),
             })
def put_log_chunks(api: SchedulerApi):
    items = validation.log_chunk_batch(read_json_object())
    require_items_node(items)
    return respond(contract.LogChunkResults.model_validate(
        {"results": [views.log_chunk_result(r) for r in api.job_logs.put_many(items, api.clock())]}))


@routes.get("/jobs/<job_id>/logs", access=auth.MEMBER_READ, tag="jobs",
            operation_id="readJobLogs", summary="A job's complete output, by byte range.",
            description=(
                "The bytes of one stream of one attempt from `offset`, at most `limit` (and at most 1 MiB: "
                "read on from offset + what came). The headers say how much of the stream is stored and whether "
                "it is complete; an offset at or past the end answers no bytes. See docs/api.md, "
                "\"Complete logs\"."),
            parameters=[
                _query("attempt", "Which attempt; default the job's latest.",
                       {"type": "integer", "minimum": 1, "maximum": 2 ** 31 - 1}),
                _query("stream", "Which output; default stdout.", LOG_STREAM_SCHEMA),
                _query("offset", "The first byte wanted; default 0.", {"type": "integer", "minimum": 0}),
                _query("limit", "The most bytes wanted; default and most 1 MiB.", {"type": "integer", "minimum": 1}),
            ],
            responses={
                "200": {"description": "The bytes.", "headers": LOG_HEADERS,
                        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
                "400": _error("BadRequest"),
                "404": _error("NotFound"),
                "503": _json(shared_contract.Error, "The log store (S3) did not answer."),
            })
def read_logs(api: SchedulerApi, job_id):
    asked = request.args.get("attempt") or None
    attempt = None
    if asked is not None:
        attempt = validation.whole_number(asked, "query parameter 'attempt'", 1, validation.MAX_ATTEMPT)
    stream = validation.log_stream(request.args.get("stream") or "stdout")
    offset = query_int("offset", 0, 0, validation.MAX_LOG_OFFSET)
    # A larger limit is cut to one chunk's worth: the client goes on from offset + what came.
    limit = min(query_int("limit", LOG_CHUNK_MAX_BYTES, 1, validation.MAX_LOG_OFFSET), LOG_CHUNK_MAX_BYTES)
    api.require_visible(job_id)
    piece = api.job_logs.read(job_id, attempt, stream, offset, limit)
    return current_app.response_class(piece.data, mimetype="application/octet-stream", headers={
        LOG_SIZE_HEADER: str(piece.size), LOG_COMPLETE_HEADER: "true" if piece.complete else "false",
        LOG_ATTEMPT_HEADER: str(piece.attempt), "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff"})  # a job's bytes are never rendered as a page
