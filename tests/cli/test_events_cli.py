"""`corral events`: its lines, its JSON, its filters, and reopening the stream after the
last event it saw when the stream ends or the scheduler cannot be reached."""
import json

from cli_support import SCHED, corral, iso

OPENED = "retry: 2000\n\nid: 10\nevent: open\ndata: {\"resumed\":false}\n\n"
JOB = {"job_id": "job-7", "from": "pending", "to": "running", "attempt": 1, "node_id": "n1", "reason": "started",
       "at": iso(0)}
NODE = {"node_id": "n1", "change": "unhealthy", "status": "unhealthy", "at": iso(0)}


def event(event_id, kind, body):
    return f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(body)}\n\n"


def test_events_are_printed_and_the_stream_reopened_after_the_last_one(mock):
    seen_ids = []

    def answer(request):
        seen_ids.append(request.headers.get("Last-Event-ID"))
        if len(seen_ids) == 1:
            return 200, {"Content-Type": "text/event-stream"}, (
                OPENED + event(11, "job", JOB) + ": keep-alive\n\n" + event(12, "node", NODE)
                + "id: 15\n: keep-alive\n\n")
        if len(seen_ids) == 2:
            return 503, {"Content-Type": "application/json"}, json.dumps({"error": "busy"})
        raise KeyboardInterrupt  # the person at the terminal is done

    mock.add_callback("GET", f"{SCHED}/events", callback=answer)
    result = corral("events")
    assert result.exit_code == 130, result.output
    lines = result.stdout.splitlines()
    assert lines[0].endswith("job   job-7  pending → running  attempt 1 on n1 (started)")
    assert lines[1].endswith("node  n1  unhealthy")
    assert len(lines) == 2
    # Reopened after the keep-alive's position, again after the 503.
    assert seen_ids == [None, "15", "15"]
    assert "cannot reach the scheduler" in result.stderr


def test_json_lines_and_filters(mock):
    calls = []

    def answer(request):
        calls.append(request.url)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return 200, {}, OPENED + event(11, "job", JOB)

    mock.add_callback("GET", f"{SCHED}/events", callback=answer)
    result = corral("events", "--json", "--job", "job-7", "--type", "job", "--type", "log", "--since", "9")
    assert [json.loads(line) for line in result.stdout.splitlines()] == [{"id": "11", "type": "job", **JOB}]
    assert "job_id=job-7" in calls[0] and "type=job%2Clog" in calls[0]
