"""`corral job logs --full` and `-f`: the complete output, read by range until its end
and printed byte for byte; -f follows the job's `log` and `job` events, reads on from
the last byte printed, switches to a new attempt, and waits for the node's last chunk."""
import json
from urllib.parse import parse_qs, urlsplit

from cli_support import NOW, SCHED, corral, iso
from corral.cli import common

OPENED = "retry: 2000\n\nid: 10\nevent: open\ndata: {\"resumed\":false}\n\n"


def event(event_id, kind, body):
    return f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(dict(body, job_id='job-7', at=iso(0)))}\n\n"


class Logs:
    """The scheduler's GET /jobs/job-7/logs over a dict of (attempt, stream) -> bytes,
    at most `page` bytes an answer; `complete` holds the streams whose last chunk came."""

    def __init__(self, mock, streams, page=1000, latest=1):
        self.streams, self.page, self.latest, self.complete = streams, page, latest, set()
        self.asked = []
        mock.add_callback("GET", f"{SCHED}/jobs/job-7/logs", callback=self.answer)

    def answer(self, request):
        query = {name: values[0] for name, values in parse_qs(urlsplit(request.url).query).items()}
        self.asked.append(query)
        attempt = int(query.get("attempt", self.latest))
        key = (attempt, query.get("stream", "stdout"))
        data = self.streams.get(key, b"")
        offset = int(query.get("offset", 0))
        return 200, {"Content-Type": "application/octet-stream", "X-Corral-Log-Size": str(len(data)),
                     "X-Corral-Log-Complete": "true" if key in self.complete else "false",
                     "X-Corral-Log-Attempt": str(attempt)}, data[offset:offset + self.page]


def job(status="running", attempt=1):
    return {"job_id": "job-7", "status": status, "attempt": attempt, "node_id": "n1"}


def test_full_prints_every_byte_of_the_stream_a_range_at_a_time(mock):
    output = bytes(range(256)) * 40 + b"\xff\x00end"
    logs = Logs(mock, {(1, "stdout"): output, (1, "stderr"): b"warn\n"}, page=999)
    logs.complete = {(1, "stdout"), (1, "stderr")}
    result = corral("job", "logs", "--full", "job-7")
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == output
    assert [int(q["offset"]) for q in logs.asked] == [*range(0, len(output), 999), len(output)]
    assert corral("job", "logs", "--full", "--stderr", "job-7").stdout_bytes == b"warn\n"


def test_full_reads_the_attempt_asked_for(mock):
    logs = Logs(mock, {(1, "stdout"): b"first\n", (2, "stdout"): b"second\n"}, latest=2)
    assert corral("job", "logs", "--full", "job-7").stdout == "second\n"
    assert corral("job", "logs", "--full", "--attempt", "1", "job-7").stdout == "first\n"
    assert logs.asked[0].get("attempt") is None  # the latest, as the scheduler answers
    assert any(q.get("attempt") == "1" for q in logs.asked)


def test_attempt_goes_with_full_only(mock):
    result = corral("job", "logs", "--attempt", "1", "job-7")
    assert result.exit_code == 2 and "--attempt goes with --full" in result.output


def test_follow_prints_each_byte_once_across_events_and_attempts(mock):
    streams = {(1, "stdout"): b"a\n"}
    logs = Logs(mock, streams)
    mock.get(f"{SCHED}/jobs/job-7", json=job())
    opened = []

    def stream(request):
        opened.append(request.headers.get("Last-Event-ID"))
        # What the node shipped meanwhile, and what comes while the stream is open.
        streams[(1, "stdout")] = b"a\nb\n"
        body = OPENED + event(11, "log", {"attempt": 1, "stream": "stdout", "offset": 2, "size": 2})
        streams[(1, "stdout")] = b"a\nb\nc\n"
        streams[(2, "stdout")] = b"again\n"
        logs.complete = {(1, "stdout"), (2, "stdout")}
        body += event(12, "log", {"attempt": 1, "stream": "stdout", "offset": 4, "size": 2})
        body += event(13, "log", {"attempt": 1, "stream": "stderr", "offset": 0, "size": 9})  # not shown
        body += event(14, "job", {"from": "running", "to": "pending", "attempt": 1, "reason": "retrying"})
        body += event(15, "job", {"from": "pending", "to": "running", "attempt": 2, "reason": "claimed"})
        body += event(16, "log", {"attempt": 2, "stream": "stdout", "offset": 0, "size": 6})
        body += event(17, "job", {"from": "running", "to": "done", "attempt": 2, "reason": "exit code 0"})
        return 200, {"Content-Type": "text/event-stream"}, body

    mock.add_callback("GET", f"{SCHED}/events", callback=stream)
    result = corral("job", "logs", "-f", "job-7")
    assert result.exit_code == 0, result.output
    assert result.stdout == "a\nb\nc\nagain\n"
    assert "attempt 2" in result.stderr
    assert opened == [None]
    events_query = parse_qs(urlsplit(next(c.request.url for c in mock.calls if "/events" in c.request.url)).query)
    assert events_query == {"job_id": ["job-7"], "type": ["job", "log"]}


def test_follow_starts_near_the_end_at_a_line_start(mock):
    lines = b"".join(b"line %06d\n" for i in range(20000))  # 240 KB
    logs = Logs(mock, {(1, "stdout"): lines}, page=1024 * 1024)
    logs.complete = {(1, "stdout")}
    mock.get(f"{SCHED}/jobs/job-7", json=job("done"))
    result = corral("job", "logs", "-f", "job-7")
    assert result.exit_code == 0, result.output
    printed = result.stdout_bytes
    assert lines.endswith(printed) and printed.startswith(b"line ") and 60_000 < len(printed) <= 64 * 1024
    assert corral("job", "logs", "-f", "--full", "job-7").stdout_bytes == lines


def test_follow_waits_for_the_last_chunk_of_an_ended_job_then_says_what_is_missing(mock, monkeypatch):
    now = [NOW]
    monkeypatch.setattr(common, "clock", lambda: now[0])
    monkeypatch.setattr(common, "sleep", lambda seconds: now.__setitem__(0, now[0] + seconds))
    logs = Logs(mock, {(1, "stdout"): b"partial\n"})
    mock.get(f"{SCHED}/jobs/job-7", json=job("failed"))
    result = corral("job", "logs", "-f", "job-7")
    assert result.exit_code == 0, result.output
    assert result.stdout == "partial\n"
    assert "has not sent the end" in result.stderr
    assert len(logs.asked) > 2  # it asked again until SETTLE_SECS passed


def test_follow_without_an_event_stream_polls(mock):
    streams = {(1, "stdout"): b"one\n"}
    logs = Logs(mock, streams)
    mock.get(f"{SCHED}/events", status=404, json={"error": "no such resource"})
    polls = iter([job(), job("done")])

    def job_answer(request):
        answer = next(polls, job("done"))
        if answer["status"] == "done":
            streams[(1, "stdout")] = b"one\ntwo\n"
            logs.complete = {(1, "stdout")}
        return 200, {"Content-Type": "application/json"}, json.dumps(answer)

    mock.add_callback("GET", f"{SCHED}/jobs/job-7", callback=job_answer)
    result = corral("job", "logs", "-f", "job-7")
    assert result.exit_code == 0, result.output
    assert result.stdout == "one\ntwo\n"
