"""The event stream with real processes: `corral events` follows a gunicorn scheduler
of two workers through a kill -9 and a restart, and a replica's stream on
PostgreSQL shows what the other replica and the agents did, failing over when its
replica dies; every job's transitions arrive once each, in order, none missed. And
under gunicorn's thread pool, streams beyond their own budget are refused without
taking the threads of the waiting claims and the submits."""
import json
import os
import socket
import subprocess
import threading
from urllib.parse import urlsplit

import pytest
import requests

from cluster import BIN, Cluster, base_env, started
from helpers import wait_for

from corral.shared import sse

pytestmark = pytest.mark.e2e

JOBS = 6


def position_now(url: str) -> str:
    """Where a stream that starts now starts (its `open` event's id): a follower started
    with `--since` it misses nothing submitted after this call, however long it takes
    to start."""
    with requests.get(url + "/events", headers={"Accept": "text/event-stream"}, stream=True,
                      timeout=(5, 10)) as answer:
        first = next(sse.messages(answer.iter_content(chunk_size=None)))
    assert first.event == "open" and first.id, first
    return first.id


class Follower:
    """`corral events --json` in a process of its own, from `since` on; its lines
    collected by a thread."""

    def __init__(self, addr: str, state_dir: str, since: str, *args: str):
        env = base_env(state_dir, CORRAL_ADDR=addr)
        self.proc = subprocess.Popen([os.path.join(BIN, "corral"), "events", "--json", "--since", since, *args],
                                     env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.events: list[dict] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for text in self.proc.stdout:
            self.events.append(json.loads(text))

    def of_job(self, job_id: str) -> list[tuple]:
        return [(e["from"], e["to"], e["attempt"], e["reason"]) for e in self.events
                if e["type"] == "job" and e["job_id"] == job_id]

    def stop(self) -> str:
        self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # it ignored SIGTERM: it goes all the same
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
        return err


def history(c: Cluster, job_id: str) -> list[tuple]:
    return [(e["from"], e["to"], e["attempt"], e["reason"]) for e in c.events(job_id)]


def everything_seen(c: Cluster, follower: Follower, jobs: list[str]) -> None:
    """Every job done, and the stream has told each job's whole history exactly."""
    wait_for(lambda: all(c.job(j)["status"] == "done" for j in jobs), timeout=60, message="the jobs to finish")
    wait_for(lambda: all(follower.of_job(j) == history(c, j) for j in jobs), timeout=20,
             message="the stream to tell every transition")
    ids = [e["id"] for e in follower.events]
    assert len(ids) == len(set(ids)), "an event came twice"


def test_corral_events_resumes_across_a_kill_9_of_the_scheduler(tmp_path, request):
    with started(Cluster(tmp_path), request) as c:
        follower = Follower(c.scheduler_url, c.state_dir, position_now(c.scheduler_url))
        try:
            c.start_agent("ev1", slots=2)
            c.wait_nodes_healthy("ev1")
            jobs = [c.submit(command="sleep 0.3")["job_id"] for _ in range(JOBS // 2)]
            wait_for(lambda: follower.of_job(jobs[0]), timeout=20, message="the first events")
            c.procs["scheduler"].kill()
            c.start_scheduler()
            jobs += [c.submit(command="sleep 0.3")["job_id"] for _ in range(JOBS // 2)]
            everything_seen(c, follower, jobs)
            registered = [e for e in follower.events if e["type"] == "node" and e["node_id"] == "ev1"]
            assert [e["change"] for e in registered][:1] == ["registered"]
        finally:
            err = follower.stop()
        assert "Traceback" not in err


def test_a_replicas_stream_shows_the_others_work_and_fails_over(tmp_path, request, pg_url):
    c = Cluster(tmp_path, database_url=pg_url)
    with started(c, request):
        c.start_scheduler(name="replica-b")
        follower = Follower(f"{c.url_of('replica-b')},{c.scheduler_url}", c.state_dir,
                            position_now(c.url_of("replica-b")), "--type", "job")
        try:
            c.start_agent("ev2", slots=2)
            c.wait_nodes_healthy("ev2")
            jobs = [c.submit(command="sleep 0.3")["job_id"] for _ in range(JOBS // 2)]  # to the first replica
            wait_for(lambda: follower.of_job(jobs[0]), timeout=20, message="the first events")
            c.procs["replica-b"].kill()  # the stream's replica: it goes on from the other
            jobs += [c.submit(command="sleep 0.3")["job_id"] for _ in range(JOBS // 2)]
            everything_seen(c, follower, jobs)
            assert {e["type"] for e in follower.events} == {"job"}
        finally:
            err = follower.stop()
        assert "Traceback" not in err


class FewThreads(Cluster):
    """A scheduler of one worker with 8 threads: by default 1 for an event stream, 3 for
    waiting claims and 4 kept free for submits, reads and reports."""

    def server_flags(self, name: str) -> list[str]:
        return ["--threads", "8"] if name == "scheduler" else []

    def start(self) -> "FewThreads":
        self.start_registry()
        self.start_scheduler(workers=1)
        return self


def open_stream(url: str) -> tuple[int, socket.socket]:
    """A GET /events whose answer's head was read, its connection left open; the status."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    sock.sendall(f"GET /events HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return int(head.split(b" ", 2)[1]), sock


def test_streams_never_take_the_threads_of_claims_and_submits(tmp_path, request):
    """Under gunicorn's thread pool: more streams than the server allows are refused
    with 503 at once, and the claims and submits still have their threads: a claim
    waits (it is not answered "busy") and an agent runs submitted jobs to the end."""
    streams = []
    with started(FewThreads(tmp_path), request) as c:
        try:
            statuses = []
            for _ in range(12):
                status, sock = open_stream(c.scheduler_url)
                statuses.append(status)
                streams.append(sock)
            assert statuses.count(200) == 1 and statuses.count(503) == 11, statuses
            claim = requests.post(f"{c.scheduler_url}/nodes/probe/claim", json={"max": 1, "wait_secs": 1},
                                  timeout=30)
            assert claim.status_code == 200 and claim.json() == [], claim.text
            assert "X-Corral-Long-Poll" not in claim.headers, claim.headers  # it waited: not "busy"
            c.start_agent("ev1")
            c.wait_nodes_healthy("ev1")
            jobs = [c.submit(command="true")["job_id"] for _ in range(3)]
            wait_for(lambda: all(c.job(j)["status"] == "done" for j in jobs), timeout=60,
                     message="the jobs to finish")
        finally:
            for sock in streams:
                sock.close()
