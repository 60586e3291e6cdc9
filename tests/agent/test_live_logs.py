"""Live output: agents send running jobs' output while they run (POST /jobs/output).

A real cluster (gunicorn registry and scheduler, a real agent) with the agent's
scheduler calls going through a recording pass-through proxy, so the tests can
see exactly what the agent sends. The scheduler keeps 4 KiB of each stream, the
agent 8 KiB: both bounds show.
"""
import json
import os
import select
import subprocess
import threading
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace

import pytest
import requests

from cluster import BIN, Cluster
from corral.agent.live_output import LiveOutput
from corral.shared.clients import Rejected, Unreachable
from helpers import serve_in_thread, wait_for

NODE = "live-node-1"
SCHEDULER_TAIL = 4096
AGENT_TAIL = 8192
INTERVAL = 0.3
FORWARDED_HEADERS = ("content-type", "authorization", "x-corral-node", "idempotency-key", "x-corral-log-offset",
                     "x-corral-log-final")
RETURNED_HEADERS = ("content-type", "x-corral-long-poll", "link", "www-authenticate")


class RecordingProxy:
    """Forwards every request to `upstream` and keeps the bodies of POST /jobs/output."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.outputs: list[dict] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if self.command == "POST" and self.path == "/jobs/output":
                    proxy.outputs.append(json.loads(body))
                headers = {k: v for k, v in self.headers.items() if k.lower() in FORWARDED_HEADERS}
                try:  # long-poll claims wait up to 25 s
                    answer = requests.request(self.command, proxy.upstream + self.path, data=body,
                                              headers=headers, timeout=60)
                except requests.RequestException:
                    self.send_error(502)
                    return
                self.send_response(answer.status_code)
                for name, value in answer.headers.items():
                    if name.lower() in RETURNED_HEADERS:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                try:
                    self.wfile.write(answer.content)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the agent stopped (teardown) while a long poll was under way

            do_GET = do_POST = do_PUT = do_DELETE = forward

            def log_message(self, *args):
                pass

        self.server = serve_in_thread(Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def items_for(self, job_id: str) -> list[dict]:
        return [item for body in list(self.outputs) for item in body["outputs"] if item["job_id"] == job_id]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def live(tmp_path_factory, request):
    c = Cluster(tmp_path_factory.mktemp("live-logs"), MAX_JOBS_PER_NODE=4, CORRAL_OUTPUT_TAIL_BYTES=SCHEDULER_TAIL)
    proxy = None
    try:
        c.start()
        proxy = RecordingProxy(c.scheduler_url)
        c.start_agent(NODE, slots=4, SCHEDULER_URL=proxy.url, AGENT_OUTPUT_INTERVAL_SECS=INTERVAL,
                      CORRAL_OUTPUT_TAIL_BYTES=AGENT_TAIL)
        c.wait_nodes_healthy(NODE)
        c.proxy = proxy
        yield c
    finally:
        c.stop()
        if proxy is not None:
            proxy.stop()
        if request.session.testsfailed:
            print(c.logs())


def running_with(live, job_id: str, predicate) -> dict:
    """The job once it is `running` and its stored output satisfies `predicate`."""
    def check():
        job = live.job(job_id)
        return job if job["status"] == "running" and predicate(job) else None
    return wait_for(check, timeout=20, message=f"{job_id} to be running with the expected live output")


def send_output(live, *items) -> list[dict]:
    response = requests.post(live.scheduler_url + "/jobs/output", json={"outputs": list(items)}, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["results"]


def cancel(live, job_id: str) -> None:
    requests.post(f"{live.scheduler_url}/jobs/{job_id}/cancel", json={}, timeout=10).raise_for_status()


def lines(prefix: str, count: int) -> str:
    return "".join(f"{prefix}-{i}\n" for i in range(1, count + 1))


# ---- what users see -------------------------------------------------------------------------

@pytest.mark.e2e
def test_output_shows_while_the_job_runs_and_the_final_report_has_all_of_it(live):
    job = live.submit(command="for i in $(seq 1 12); do echo line-$i; sleep 0.3; done", instance_id=NODE)
    seen = running_with(live, job["job_id"], lambda j: "line-2\n" in (j["stdout"] or ""))
    assert seen["stdout"].startswith("line-1\nline-2\n")
    done = live.wait_status(job["job_id"], "done", "failed", timeout=30)
    assert done["status"] == "done"
    assert done["stdout"] == lines("line", 12)
    # Live updates are not status changes: the history has only the job's transitions.
    assert [e["to"] for e in live.events(job["job_id"])] == ["pending", "pending", "running", "done"]


@pytest.mark.e2e
def test_logs_follow_prints_lines_as_they_come_and_ends_with_the_job(live):
    job = live.submit(command="for i in $(seq 1 15); do echo step-$i; sleep 0.3; done", instance_id=NODE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    follow = subprocess.Popen([os.path.join(BIN, "corral"), "--addr", live.scheduler_url, "job", "logs", "-f",
                               job["job_id"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                              bufsize=0)  # unbuffered: readline() takes no more than the line from the pipe
    try:
        # poll, not select: a test process may hold descriptors numbered past select's 1024
        poller = select.poll()
        poller.register(follow.stdout, select.POLLIN)
        assert poller.poll(20_000), "corral job logs -f printed nothing while the job ran"
        first = follow.stdout.readline().decode()
        assert first == "step-1\n"
        # The first line came while the job was still running: output is followed, not
        # printed at the end.
        assert live.job(job["job_id"])["status"] == "running"
        rest, errors = follow.communicate(timeout=30)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == 0, errors.decode()
    assert first + rest.decode() == lines("step", 15)
    assert live.job(job["job_id"])["status"] == "done"


@pytest.mark.e2e
def test_a_service_shows_its_output_while_it_runs(live):
    job = live.submit(job_type="service", instance_id=NODE,
                      command="i=0; while true; do i=$((i+1)); echo tick-$i; echo warn-$i >&2; sleep 0.3; done")
    seen = running_with(live, job["job_id"], lambda j: "tick-2\n" in (j["stdout"] or "")
                        and "warn-2\n" in (j["stderr"] or ""))
    assert seen["stdout"].startswith("tick-1\n")
    cancel(live, job["job_id"])
    assert live.wait_status(job["job_id"], "cancelled")["stdout"].startswith("tick-1\ntick-2\n")


# ---- fencing --------------------------------------------------------------------------------

@pytest.mark.e2e
def test_updates_from_another_node_a_stale_attempt_or_after_the_end_are_refused(live):
    job = live.submit(command="echo hello; sleep 30", instance_id=NODE)
    job_id = job["job_id"]
    seen = running_with(live, job_id, lambda j: j["stdout"] == "hello\n")
    attempt = seen["attempt"]
    results = send_output(
        live,
        {"job_id": job_id, "node_id": "live-other-node", "attempt": attempt, "stdout": "forged\n"},
        {"job_id": job_id, "node_id": NODE, "attempt": attempt + 1, "stdout": "forged\n"},
        {"job_id": job_id, "node_id": NODE, "attempt": attempt - 1, "stderr": "forged\n"},
        {"job_id": "job-999999999", "node_id": NODE, "attempt": 1, "stdout": "forged\n"},
        {"job_id": job_id, "node_id": NODE, "attempt": attempt, "stdout": 42},
    )
    assert [r["code"] for r in results] == [409, 409, 409, 404, 400]
    assert "not placed on 'live-other-node'" in results[0]["error"]
    assert "stale" in results[1]["error"] and "stale" in results[2]["error"]
    after = live.job(job_id)
    assert (after["stdout"], after["stderr"], after["status"]) == ("hello\n", seen["stderr"], "running")

    # The same update from the job's own node, for its current attempt, is stored.
    assert send_output(live, {"job_id": job_id, "node_id": NODE, "attempt": attempt, "stdout": "hello\nmore\n"}
                       ) == [{"index": 0, "job_id": job_id, "code": 200}]
    assert live.job(job_id)["stdout"] == "hello\nmore\n"

    cancel(live, job_id)
    late = send_output(live, {"job_id": job_id, "node_id": NODE, "attempt": attempt, "stdout": "late\n"})
    assert late[0]["code"] == 409 and "cancelled, not running" in late[0]["error"]
    assert live.job(job_id)["stdout"] == "hello\nmore\n"


@pytest.mark.e2e
def test_a_late_update_never_overwrites_the_final_report(live):
    job = live.submit(command="echo finished", instance_id=NODE)
    done = live.wait_status(job["job_id"], "done", "failed")
    assert done["stdout"] == "finished\n"
    late = send_output(live, {"job_id": job["job_id"], "node_id": NODE, "attempt": done["attempt"],
                              "stdout": "late\n", "stderr": "late\n"})
    assert late[0]["code"] == 409
    after = live.job(job["job_id"])
    assert (after["stdout"], after["stderr"]) == ("finished\n", done["stderr"])
    assert len(live.events(job["job_id"])) == 4


# ---- bounds and cost ------------------------------------------------------------------------

@pytest.mark.e2e
def test_output_bigger_than_the_tail_is_bounded(live):
    job = live.submit(command="head -c 100000 /dev/zero | tr '\\0' x; echo; echo END; sleep 30", instance_id=NODE)
    job_id = job["job_id"]
    seen = running_with(live, job_id, lambda j: (j["stdout"] or "").endswith("\nEND\n"))
    assert len(seen["stdout"]) == SCHEDULER_TAIL  # the scheduler keeps its CORRAL_OUTPUT_TAIL_BYTES
    sent = [item["stdout"] for item in live.proxy.items_for(job_id) if "stdout" in item]
    assert sent and all(len(text) <= AGENT_TAIL for text in sent)  # the agent sends its tail, never the history
    assert any(len(text) > SCHEDULER_TAIL for text in sent)

    results = send_output(live, {"job_id": job_id, "node_id": NODE, "attempt": seen["attempt"],
                                 "stdout": "y" * 10000 + "Z"})
    assert results[0]["code"] == 200
    assert live.job(job_id)["stdout"] == "y" * (SCHEDULER_TAIL - 1) + "Z"
    cancel(live, job_id)


@pytest.mark.e2e
def test_jobs_without_new_output_send_nothing_and_changes_go_in_one_batch(live):
    quiet = [live.submit(command="true", instance_id=NODE)["job_id"],
             live.submit(command="sleep 2", instance_id=NODE)["job_id"]]
    talkers = [live.submit(command="for i in $(seq 1 10); do echo chat-$i; sleep 0.2; done",
                           instance_id=NODE)["job_id"] for _ in range(2)]
    for job_id in quiet + talkers:
        assert live.wait_status(job_id, "done", "failed", timeout=30)["status"] == "done"

    def one_request_with_both():
        return any({item["job_id"] for item in body["outputs"]} >= set(talkers) for body in list(live.proxy.outputs))
    wait_for(one_request_with_both, timeout=5, message="one live output request for both talking jobs")
    # Every request carries at most one item per job: one request per pass for all of them.
    for body in live.proxy.outputs:
        ids = [item["job_id"] for item in body["outputs"]]
        assert len(ids) == len(set(ids))
    for job_id in quiet:
        assert live.proxy.items_for(job_id) == [], f"{job_id} wrote nothing, yet live output was sent for it"


# ---- the agent's sender on its own (no servers) ---------------------------------------------

class FakeProcess:
    def __init__(self):
        self.stdout = ""

    def output_versions(self):
        return (len(self.stdout) or None, None)

    def output_tails(self):
        return (self.stdout, "")

    def poll(self):
        return None


class FakeClient:
    """Answers 200 for every item, or raises the next of `failures` (None: answer)."""
    base_url = "http://sched.test"

    def __init__(self, *failures):
        self.failures = list(failures)
        self.sent: list[list[dict]] = []
        self.closed = False

    def send_output(self, items):
        self.sent.append(items)
        failure = self.failures.pop(0) if self.failures else None
        if failure is not None:
            raise failure
        return [{"index": i, "job_id": item["job_id"], "code": 200} for i, item in enumerate(items)]

    def close(self):
        self.closed = True


def held(job_id: str, process) -> SimpleNamespace:
    prepared = threading.Event()
    prepared.set()
    return SimpleNamespace(job_id=job_id, attempt=1, key=(job_id, 1), process=process, prepared=prepared,
                           end_reason=None)


def test_the_sender_sends_only_streams_that_changed():
    process = FakeProcess()
    client = FakeClient()
    sender = LiveOutput(NODE, lambda: [held("job-1", process)], client, INTERVAL)
    assert sender.send_once() == 0 and client.sent == []  # no output yet: no request at all
    process.stdout = "a\n"
    assert sender.send_once() == 1
    assert client.sent == [[{"job_id": "job-1", "node_id": NODE, "attempt": 1, "stdout": "a\n"}]]
    assert sender.send_once() == 0 and len(client.sent) == 1  # nothing new: nothing sent
    process.stdout = "a\nb\n"
    sender.send_once()
    assert client.sent[-1][0]["stdout"] == "a\nb\n"


def test_the_sender_survives_an_unreachable_scheduler_and_sends_the_newest_tail_later():
    process = FakeProcess()
    process.stdout = "first\n"
    client = FakeClient(Unreachable("connection refused"))
    sender = LiveOutput(NODE, lambda: [held("job-1", process)], client, 0.01)
    stop = threading.Event()
    thread = threading.Thread(target=sender.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: client.sent, timeout=5, message="a first try")
        process.stdout = "first\nsecond\n"
        wait_for(lambda: any(items[0]["stdout"] == "first\nsecond\n" for items in client.sent[1:]), timeout=5,
                 message="the newest tail to be sent after the failure")
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive() and client.closed


def test_a_refused_update_is_skipped_and_the_sender_goes_on():
    """A refusal (here 404) drops those tails, never the thread: newer output is sent."""
    process = FakeProcess()
    process.stdout = "x\n"
    client = FakeClient(Rejected(404, "no such resource"))
    sender = LiveOutput(NODE, lambda: [held("job-1", process)], client, 0.01)
    stop = threading.Event()
    thread = threading.Thread(target=sender.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: client.sent, timeout=5, message="the first update")
        process.stdout = "x\ny\n"
        wait_for(lambda: any(items[0]["stdout"] == "x\ny\n" for items in client.sent), timeout=5,
                 message="the newer tail to be sent after the refusal")
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(5)
