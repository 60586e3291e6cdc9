"""Complete logs through the API: an agent ships each stream of an attempt in numbered
chunks (PUT /jobs/{id}/attempts/{n}/logs/{stream}/{seq}) and operators read the bytes
back by range (GET /jobs/{id}/logs), on each backend."""
import base64
import json
import os

import pytest

from scheduler_app import end_attempt, make_app, read_log, read_log_whole, set_nodes, ship_log, submit
from scheduler_app import put_log_chunk as put

from corral.scheduler.models import LogChunk
from corral.shared import sse
from corral.shared.wire import LOG_CHUNK_MAX_BYTES, LOG_MARK_ROOM


@pytest.fixture
def running(client, store, clock):
    """A job running on n1 (claimed)."""
    set_nodes(store, clock, "n1")
    job = submit(client, command="echo hi")
    claimed = client.post("/nodes/n1/claim", json={"max": 1, "wait_secs": 0})
    assert [j["job_id"] for j in claimed.json] == [job["job_id"]]
    return job["job_id"]


def test_the_chunks_of_a_stream_read_back_byte_for_byte(client, running):
    output = bytes(range(256)) * 3000 + b"\x00\xff the end\n"  # every byte value, not UTF-8
    answers = ship_log(client, running, output, 100_000)
    assert [a["stored"] for a in answers] == [True] * len(answers)
    assert answers[-1] == {"stored": True, "size": len(output), "complete": True, "next_seq": len(answers)}
    data, last = read_log_whole(client, running)
    assert data == output
    assert last.headers["X-Corral-Log-Size"] == str(len(output))
    assert last.headers["X-Corral-Log-Complete"] == "true"
    assert last.headers["X-Corral-Log-Attempt"] == "1"
    assert last.headers["X-Content-Type-Options"] == "nosniff"
    # Any range, across chunk boundaries, is those bytes.
    for offset, limit in ((0, 1), (99_999, 2), (150_000, 250_000), (len(output) - 3, 100)):
        assert read_log(client, running, offset=offset, limit=limit).data == output[offset:offset + limit]
    # stderr is a stream of its own: nothing shipped, nothing read.
    empty = read_log(client, running, stream="stderr")
    assert empty.data == b"" and empty.headers["X-Corral-Log-Size"] == "0"
    assert empty.headers["X-Corral-Log-Complete"] == "false"


def test_a_read_is_cut_at_one_chunk_and_an_offset_past_the_end_answers_nothing(client, running):
    output = os.urandom(LOG_CHUNK_MAX_BYTES) + os.urandom(1000)
    ship_log(client, running, output, LOG_CHUNK_MAX_BYTES)
    assert read_log(client, running, limit=10 * LOG_CHUNK_MAX_BYTES).data == output[:LOG_CHUNK_MAX_BYTES]
    past = read_log(client, running, offset=len(output) + 5)
    assert past.data == b"" and past.headers["X-Corral-Log-Size"] == str(len(output))


def test_a_chunk_sent_again_is_stored_once(client, store, running):
    first = put(client, running, b"one\n", 0, 0)
    again = put(client, running, b"one\n", 0, 0)
    assert first.json == {"stored": True, "size": 4, "complete": False, "next_seq": 1}
    assert again.status_code == 200 and again.json == {"stored": False, "size": 4, "complete": False, "next_seq": 1}
    assert put(client, running, b"two\n", 1, 4, final=True).json["complete"] is True
    assert put(client, running, b"two\n", 1, 4, final=True).json == {"stored": False, "size": 8, "complete": True,
                                                                      "next_seq": 2}
    # An old one again (an agent that restarted): where the stream is, to go on from.
    assert put(client, running, b"one\n", 0, 0).json == {"stored": False, "size": 8, "complete": True, "next_seq": 2}
    assert LogChunk.select().where(LogChunk.job_id == int(running[4:])).count() == 2
    assert read_log_whole(client, running)[0] == b"one\ntwo\n"


@pytest.mark.parametrize("seq, offset, data, why", [
    (2, 4, b"x", "a gap: chunk 1 never came"),
    (1, 3, b"x", "an overlap: chunk 1 starts inside chunk 0"),
    (1, 5, b"x", "a hole between chunk 0 and 1"),
    (0, 0, b"other", "chunk 0 again, with other bytes"),
])
@pytest.mark.slow
def test_a_chunk_that_is_not_the_next_one_is_refused_with_where_to_go_on(client, running, seq, offset, data, why):
    assert put(client, running, b"one\n", 0, 0).status_code == 200
    refused = put(client, running, data, seq, offset)
    assert refused.status_code == 409, why
    assert refused.json["expected_seq"] == 1 and refused.json["expected_offset"] == 4, why
    assert refused.json["complete"] is False
    assert read_log_whole(client, running)[0] == b"one\n"  # nothing changed


def test_nothing_is_taken_after_the_final_chunk(client, running):
    ship_log(client, running, b"all of it\n", 100)
    refused = put(client, running, b"more", 1, 10)
    assert refused.status_code == 409 and refused.json["complete"] is True
    assert read_log_whole(client, running)[0] == b"all of it\n"


def test_only_the_node_that_ran_the_attempt_ships_its_logs_even_after_the_job_moved_on(client, store, clock,
                                                                                       running):
    assert put(client, running, b"not mine", 0, 0, node="n2").status_code == 409
    assert put(client, running, b"not yet", 0, 0, attempt=2).status_code == 409
    # Attempt 1 fails on n1; attempt 2 runs on n2.
    set_nodes(store, clock, ("n1", "unhealthy"), "n2")
    end_attempt(client, running, status="failed", exit_code=3)
    assert [j["job_id"] for j in client.post("/nodes/n2/claim", json={"max": 1, "wait_secs": 0}).json] == [running]
    assert client.get(f"/jobs/{running}").json["attempt"] == 2
    assert put(client, running, b"two\n", 0, 0, node="n2", attempt=2).status_code == 200
    # n1 still ships attempt 1 after the job moved on; nobody else does.
    assert put(client, running, b"late\n", 0, 0, node="n1", attempt=1, final=True).status_code == 200
    assert put(client, running, b"late\n", 0, 0, node="n2", attempt=1, stream="stderr").status_code == 409
    assert read_log_whole(client, running, attempt=1)[0] == b"late\n"
    # The latest attempt is the default.
    latest = read_log(client, running)
    assert latest.data == b"two\n" and latest.headers["X-Corral-Log-Attempt"] == "2"


def test_a_stream_past_its_bound_is_refused(database_url, clock):
    cap = 64 * 1024
    app = make_app(database_url, clock, max_jobs_per_node=4, log_max_bytes=cap)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1")
    job_id = submit(client, command="true")["job_id"]
    client.post("/nodes/n1/claim", json={"max": 1, "wait_secs": 0})
    assert put(client, job_id, b"h" * cap, 0, 0).status_code == 200
    assert put(client, job_id, b"m" * (LOG_MARK_ROOM + 1), 1, cap).status_code == 413
    assert put(client, job_id, b"m" * LOG_MARK_ROOM, 1, cap, final=True).status_code == 200  # the mark's room
    assert read_log(client, job_id, offset=cap - 1).headers["X-Corral-Log-Size"] == str(cap + LOG_MARK_ROOM)


@pytest.mark.parametrize("path, headers, data, content_type, status", [
    ("stdout/0", {"X-Corral-Log-Offset": "0"}, b"x", "application/octet-stream", 400),        # no node
    ("stdout/0", {"X-Corral-Node": "../n1", "X-Corral-Log-Offset": "0"}, b"x", "application/octet-stream", 400),
    ("stdout/0", {"X-Corral-Node": "n1"}, b"x", "application/octet-stream", 400),            # no offset
    ("stdout/0", {"X-Corral-Node": "n1", "X-Corral-Log-Offset": "-1"}, b"x", "application/octet-stream", 400),
    ("stdout/0", {"X-Corral-Node": "n1", "X-Corral-Log-Offset": "1e3"}, b"x", "application/octet-stream", 400),
    ("stdout/0", {"X-Corral-Node": "n1", "X-Corral-Log-Offset": "\u0663"}, b"x", "application/octet-stream", 400),
    ("stdout/0", {"X-Corral-Node": "n1", "X-Corral-Log-Offset": "0", "X-Corral-Log-Final": "yes"}, b"x",
     "application/octet-stream", 400),
    ("stdout/0", {"X-Corral-Node": "n1", "X-Corral-Log-Offset": "0"}, b"", "application/octet-stream", 400),
    ("stdin/0", {"X-Corral-Node": "n1", "X-Corral-Log-Offset": "0"}, b"x", "application/octet-stream", 400),
    ("stdout/x", {"X-Corral-Node": "n1", "X-Corral-Log-Offset": "0"}, b"x", "application/octet-stream", 400),
    ("stdout/99999999999999999999", {"X-Corral-Node": "n1", "X-Corral-Log-Offset": "0"}, b"x",
     "application/octet-stream", 400),
    ("stdout/0", {"X-Corral-Node": "n1", "X-Corral-Log-Offset": "0"}, b"x", "application/json", 415),
    ("stdout/0", {"X-Corral-Node": "n1", "X-Corral-Log-Offset": "0"}, b"x", "text/plain", 415),
    ("stdout/0", {"X-Corral-Node": "n1", "X-Corral-Log-Offset": "0"}, b"x" * (LOG_CHUNK_MAX_BYTES + 1),
     "application/octet-stream", 413),
])
def test_bad_chunks_get_a_clear_error_and_change_nothing(client, running, path, headers, data, content_type,
                                                         status):
    answer = client.put(f"/jobs/{running}/attempts/1/logs/{path}", data=data, headers=headers,
                        content_type=content_type)
    assert answer.status_code == status, answer.json
    assert answer.json["error"]
    assert LogChunk.select().count() == 0


def test_bad_attempts_and_unknown_jobs(client, running):
    assert put(client, running, b"x", 0, 0, attempt=0).status_code == 400
    assert put(client, "job-999", b"x", 0, 0).status_code == 404
    assert put(client, "job-0", b"x", 0, 0).status_code == 404
    assert client.get("/jobs/job-999/logs").status_code == 404
    assert client.get(f"/jobs/{running}/logs?attempt=2").status_code == 404
    for query in ("attempt=0", "attempt=x", "stream=stdin", "offset=-1", "limit=0", "offset=x"):
        answer = client.get(f"/jobs/{running}/logs?{query}")
        assert answer.status_code == 400 and answer.json["error"], query


def test_a_job_that_never_ran_has_empty_logs(client, store, clock):
    job_id = submit(client, command="true")["job_id"]  # no node: it waits
    answer = read_log(client, job_id)
    assert answer.data == b"" and answer.headers["X-Corral-Log-Attempt"] == "0"


def test_every_stored_chunk_is_a_log_event_on_the_stream(database_url, clock):
    app = make_app(database_url, clock, max_jobs_per_node=4, events_stream_max_secs=0.0)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1")
    job_id = submit(client, command="true")["job_id"]
    client.post("/nodes/n1/claim", json={"max": 1, "wait_secs": 0})
    opened = next(sse.messages([client.get("/events").get_data()]))  # where a stream that starts now starts
    ship_log(client, job_id, b"abcdef", 4)
    put(client, job_id, b"abcd", 0, 0)  # a repeat: no event
    answer = client.get(f"/events?job_id={job_id}&type=log", headers={"Last-Event-ID": opened.id})
    logs = [json.loads(m.data) for m in sse.messages([answer.get_data()]) if m.event == "log"]
    assert [(e["attempt"], e["stream"], e["offset"], e["size"], e["final"]) for e in logs] == [
        (1, "stdout", 0, 4, False), (1, "stdout", 4, 2, True)]
    assert {e["job_id"] for e in logs} == {job_id} and {e["node_id"] for e in logs} == {"n1"}


def test_the_purge_deletes_a_jobs_chunks_with_it(client, store, clock, running):
    ship_log(client, running, b"bye\n", 10)
    end_attempt(client, running, status="done")
    submit(client, command="true")  # SQLite keeps the newest job row: it is not that one
    assert LogChunk.select().count() == 1
    assert store.purge.finished(clock() + 1, 100) == 1
    assert LogChunk.select().count() == 0


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_small_chunks_go_many_in_one_request_each_judged_on_its_own(client, store, running):
    chunk = {"job_id": running, "node_id": "n1", "attempt": 1, "stream": "stdout"}
    answer = client.post("/jobs/logs", json={"chunks": [
        dict(chunk, seq=0, offset=0, data=b64(b"one\n")),
        dict(chunk, seq=1, offset=4, data=b64(b"\x00two\xff\n"), final=True),
        dict(chunk, seq=0, offset=0, data=b64(b"one\n")),                       # a repeat
        dict(chunk, stream="stderr", seq=1, offset=0, data=b64(b"x")),         # a gap
        dict(chunk, node_id="n2", stream="stderr", seq=0, offset=0, data=b64(b"x")),  # not n2's attempt
        dict(chunk, job_id="job-999", seq=0, offset=0, data=b64(b"x")),        # no such job
        dict(chunk, stream="stderr", seq=0, offset=0, data="not base64!"),     # bad bytes
        dict(chunk, stream="stderr", seq=0, offset=0, data=b64(b""), final=True),  # an empty stream
    ]})
    assert answer.status_code == 200, answer.json
    results = answer.json["results"]
    assert [r["code"] for r in results] == [200, 200, 200, 409, 409, 404, 400, 200]
    assert results[1] == {"index": 1, "job_id": running, "code": 200, "stored": True, "size": 10,
                          "complete": True, "next_seq": 2}
    assert results[2]["stored"] is False
    assert (results[3]["expected_seq"], results[3]["expected_offset"]) == (0, 0)
    assert "expected_seq" not in results[4] and "did not run" in results[4]["error"]
    assert read_log_whole(client, running)[0] == b"one\n\x00two\xff\n"
    empty = read_log(client, running, stream="stderr")
    assert empty.data == b"" and empty.headers["X-Corral-Log-Complete"] == "true"


@pytest.mark.parametrize("body", [{}, {"chunks": []}, {"chunks": "x"}, {"chunks": [1] * 1001}])
def test_a_batch_that_is_not_one_is_refused_whole(client, running, body):
    answer = client.post("/jobs/logs", json=body)
    assert answer.status_code == 400 and answer.json["error"]
    assert LogChunk.select().count() == 0
