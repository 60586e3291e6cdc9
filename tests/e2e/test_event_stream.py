"""The event stream with real processes: `corral events` follows a gunicorn scheduler
of two workers through a kill -9 and a restart, and a replica's stream on
PostgreSQL shows what the other replica and the agents did, failing over when its
replica dies; every job's transitions arrive once each, in order, none missed."""
import json
import os
import subprocess
import threading

import pytest

from cluster import BIN, Cluster, base_env, started
from helpers import wait_for

pytestmark = pytest.mark.e2e

JOBS = 6


class Follower:
    """`corral events --json` in a process of its own; its lines collected by a thread."""

    def __init__(self, addr: str, state_dir: str, *args: str):
        env = base_env(state_dir, CORRAL_ADDR=addr)
        self.proc = subprocess.Popen([os.path.join(BIN, "corral"), "events", "--json", *args], env=env,
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
        follower = Follower(c.scheduler_url, c.state_dir)
        try:
            wait_for(lambda: c.procs["scheduler"].alive() and follower.proc.poll() is None, timeout=5)
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
        follower = Follower(f"{c.url_of('replica-b')},{c.scheduler_url}", c.state_dir, "--type", "job")
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
