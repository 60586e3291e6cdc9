"""Faults done for real: SIGKILL, SIGSTOP, restarts and broken database files,
with every assertion made from the API (and so the database), not from counters.
The kill -9 tests and the scheduler stopped past the lease run on both storage
backends (SQLite files; one PostgreSQL database for both services); two replicas
on PostgreSQL and the database's own faults: tests/e2e/test_ha.py."""
import concurrent.futures
import os
import signal
import sqlite3
import subprocess
import threading
import time

import pytest
import requests

from cluster import BIN, Cluster, all_jobs, base_env, final_transitions
from helpers import process_gone, wait_for

pytestmark = pytest.mark.e2e


def submit_many(url, count, stop_early=None):
    """Submit `count` jobs from 8 threads; returns the ids answered with 201."""
    accepted, lock = [], threading.Lock()

    def one(i):
        try:
            response = requests.post(url + "/jobs", json={"command": "true"}, timeout=10)
        except requests.RequestException:
            return
        if response.status_code == 201:
            with lock:
                accepted.append(response.json()["job_id"])
            if stop_early is not None:
                stop_early(len(accepted))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))
    return accepted


# Its own deadlines (the submissions, then 240 s for every job to be done) within the
# test's: the default 120 s cut it short on a loaded host, mid-wait.
@pytest.mark.timeout(420)
def test_kill_9_of_the_scheduler_loses_no_acknowledged_job(tmp_path, database_url):
    cluster = Cluster(tmp_path, database_url=database_url, MAX_JOBS_PER_NODE=4)
    try:
        cluster.start()
        cluster.start_agent("node-1", slots=4)
        cluster.start_agent("node-2", slots=4)
        cluster.wait_nodes_healthy("node-1", "node-2")
        killed = threading.Event()

        def kill_midway(n):
            if n == 1000 and not killed.is_set():
                killed.set()
                cluster.procs["scheduler"].kill()

        accepted = submit_many(cluster.scheduler_url, 2000, kill_midway)
        assert killed.is_set()
        cluster.start_scheduler()
        accepted += submit_many(cluster.scheduler_url, 2000 - len(accepted))
        assert len(accepted) >= 1500

        def all_done():
            jobs = all_jobs(cluster.scheduler_url)
            return all(jobs[j]["status"] == "done" for j in accepted) and jobs
        jobs = wait_for(all_done, timeout=240, interval=1.0, message="every acknowledged job to be done")
        assert set(accepted) <= set(jobs)
        for job_id in accepted[::50]:  # one result each: exactly one final transition
            assert len(final_transitions(cluster.scheduler_url, job_id)) == 1, cluster.events(job_id)
    finally:
        cluster.stop()


def test_restarting_registry_and_scheduler_under_load_loses_nothing(tmp_path):
    cluster = Cluster(tmp_path, MAX_JOBS_PER_NODE=2, HEARTBEAT_TIMEOUT_SECS=5)
    try:
        cluster.start()
        cluster.start_agent("node-1", slots=2)
        cluster.start_agent("node-2", slots=2)
        cluster.wait_nodes_healthy("node-1", "node-2")
        accepted = []
        stop = threading.Event()

        def load():
            while not stop.is_set():
                try:
                    r = requests.post(cluster.scheduler_url + "/jobs", json={"command": "sleep 0.2"}, timeout=5)
                    if r.status_code == 201:
                        accepted.append(r.json()["job_id"])
                except requests.RequestException:
                    pass
                stop.wait(0.05)

        feeder = threading.Thread(target=load)
        feeder.start()
        try:
            wait_for(lambda: len(accepted) >= 20, timeout=30, message="load")
            # -9: it did not stop within the grace; its log says what it was doing.
            assert cluster.procs["registry"].stop() == 0, cluster.procs["registry"].output()[-4000:]
            cluster.start_registry()
            wait_for(lambda: len(accepted) >= 60, timeout=30, message="more load")
            assert cluster.procs["scheduler"].stop() == 0, cluster.procs["scheduler"].output()[-4000:]
            cluster.start_scheduler()
            count = len(accepted)
            wait_for(lambda: len(accepted) >= count + 40, timeout=30, message="load after the restarts")
        finally:
            stop.set()
            feeder.join()
        jobs = wait_for(lambda: (lambda j: j if all(j[i]["status"] == "done" for i in accepted) else None)(
            all_jobs(cluster.scheduler_url)), timeout=120, interval=0.5, message="every job to be done")
        assert set(accepted) <= set(jobs)
        for job_id in accepted:
            reasons = [e["reason"] for e in cluster.events(job_id)]
            assert not any("lost" in r or "not healthy" in r for r in reasons), (job_id, reasons)
    finally:
        cluster.stop()


def test_a_stopping_scheduler_gives_its_loops_lease_up_and_none_of_its_workers_takes_it(tmp_path):
    """Every worker gets SIGTERM. The one running the background loops gives the lease up
    at once; the other, stopping too, must not take it over (it would run the loops on
    its way out and hold the lease and its own exit)."""
    cluster = Cluster(tmp_path, DISPATCH_INTERVAL_SECS=0.05)  # the other worker looks 20 times a second
    try:
        cluster.start()
        cluster.start_agent("node-1")
        cluster.wait_nodes_healthy("node-1")
        job = cluster.submit(command="true")
        cluster.wait_status(job["job_id"], "done")
        scheduler = cluster.procs["scheduler"]
        wait_for(lambda: "lease token 1" in scheduler.output(), message="the loops to run")
        assert scheduler.stop() == 0, scheduler.output()[-4000:]
        assert "lease token 2" not in scheduler.output(), scheduler.output()[-4000:]
        with sqlite3.connect(os.path.join(cluster.state_dir, "scheduler.db")) as db:
            expires_at, token = db.execute(
                "SELECT expires_at, token FROM lease WHERE name = 'scheduler-loops'").fetchone()
        assert (expires_at, token) == (0.0, 1)  # given up by the worker that held it; never taken over
    finally:
        cluster.stop()


@pytest.mark.parametrize("damage", ["corrupt", "directory", "locked"])
def test_a_broken_database_file_stops_the_server_with_a_clear_error(tmp_path, damage):
    state = tmp_path / "state"
    state.mkdir()
    db_path = state / "scheduler.db"
    holder = None
    if damage == "corrupt":
        db_path.write_bytes(b"this is not a database" * 100)
    elif damage == "directory":
        db_path.mkdir()
    else:
        conn = sqlite3.connect(db_path, timeout=0)
        conn.execute("CREATE TABLE x (y)")
        conn.commit()
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        conn.execute("BEGIN EXCLUSIVE")
        holder = conn
    before = sorted(os.listdir(state))
    try:
        result = subprocess.run([os.path.join(BIN, "corral-scheduler"), "--port", "1"],
                                env=base_env(str(state)), capture_output=True, text=True, timeout=60)
    finally:
        if holder is not None:
            holder.close()
    assert result.returncode == 2, result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("corral-scheduler: error:") and "scheduler.db" in message, result.stderr
    assert sorted(os.listdir(state)) == before  # nothing new was created in its place


LOSS = dict(HEARTBEAT_TIMEOUT_SECS=3, NODE_LOST_GRACE_SECS=3)  # T and the grace, small for tests


def running_on(cluster, job_id, node_id):
    job = cluster.job(job_id)
    return job if job["status"] == "running" and job["node_id"] == node_id else None


def test_kill_9_of_an_agent_mid_job_reruns_it_on_the_other_node(tmp_path, database_url):
    cluster = Cluster(tmp_path, database_url=database_url, **LOSS)
    try:
        cluster.start()
        first = cluster.start_agent("node-1")
        cluster.wait_nodes_healthy("node-1")
        job = cluster.submit(command='[ "$CORRAL_NODE_ID" = node-1 ] && sleep 60; echo ran on $CORRAL_NODE_ID')
        wait_for(lambda: running_on(cluster, job["job_id"], "node-1"), timeout=20, message="the job on node-1")
        cluster.start_agent("node-2")
        cluster.wait_nodes_healthy("node-2")
        first.kill()  # SIGKILL of the agent (its job runs on in its own session)
        killed_at = time.monotonic()
        done = cluster.wait_status(job["job_id"], "done", timeout=3 + 3 + 15)
        assert time.monotonic() - killed_at <= 3 + 3 + 10
        assert done["node_id"] == "node-2" and done["stdout"] == "ran on node-2\n"
        assert done["retry_count"] == 0 and done["node_losses"] == 1 and done["attempt"] == 2
        assert any("node node-1 lost" in e["reason"] for e in cluster.events(job["job_id"]))
    finally:
        cluster.stop()


def test_a_stopped_agent_past_its_lease_cannot_overwrite_the_newer_result(tmp_path, shared_dir):
    cluster = Cluster(tmp_path, **LOSS)
    pid_file = os.path.join(shared_dir, "pid")
    try:
        cluster.start()
        frozen = cluster.start_agent("node-1")
        cluster.wait_nodes_healthy("node-1")
        job = cluster.submit(command=f'if [ "$CORRAL_NODE_ID" = node-1 ]; then echo $$ > {pid_file}; '
                                     f'exec sleep 120; fi; echo newer attempt')
        wait_for(lambda: running_on(cluster, job["job_id"], "node-1"), timeout=20, message="the job on node-1")
        stale_pid = int(wait_for(lambda: open(pid_file).read().strip(), timeout=10, message="the pid"))
        cluster.start_agent("node-2")
        cluster.wait_nodes_healthy("node-2")
        frozen.signal(signal.SIGSTOP)
        try:
            done = cluster.wait_status(job["job_id"], "done", timeout=30)
            assert done["node_id"] == "node-2" and done["stdout"] == "newer attempt\n"
        finally:
            frozen.signal(signal.SIGCONT)
        # Woken up, the old agent finds its lease lapsed: it stops the stale copy, and
        # its report for the old attempt is refused.
        wait_for(lambda: process_gone(stale_pid), timeout=20, message="the stale process to be gone")
        wait_for(lambda: "refused the failed report" in frozen.output(), timeout=20,
                 message="the stale report to be refused")
        final = cluster.job(job["job_id"])
        assert final == done
        transitions = [(e["from"], e["to"]) for e in cluster.events(job["job_id"])]
        assert transitions.count(("running", "done")) == 1 and ("running", "failed") not in transitions
    finally:
        cluster.stop()


def test_a_scheduler_stopped_past_the_lease_runs_nothing_twice_and_fails_nothing_that_never_ran(
        tmp_path, shared_dir, database_url):
    """The whole scheduler (master and workers) stopped with SIGSTOP for longer than the
    lease and its grace, while an agent runs a job that finishes meanwhile and keeps a
    claim waiting for another: when the scheduler runs again, the finished run's result
    is kept (not discarded and run again), and a job whose claim answer was lost goes
    back to pending without spending its retries (max_retries 0) and runs once."""
    cluster = Cluster(tmp_path, database_url=database_url, MAX_JOBS_PER_NODE=2, **LOSS)
    marks = os.path.join(shared_dir, "marks")
    os.mkdir(marks)
    os.chmod(marks, 0o1777)
    try:
        cluster.start()
        cluster.start_agent("node-1", slots=2, AGENT_LONG_POLL_SECS=1)
        cluster.wait_nodes_healthy("node-1")
        first = cluster.submit(command=f"touch {marks}/first-$CORRAL_ATTEMPT-$$; sleep 2; echo ran", max_retries=0)
        wait_for(lambda: running_on(cluster, first["job_id"], "node-1"), timeout=20, message="the first job to run")
        # Its process started (not only its claim committed: an answer lost in the stop
        # below would make this the other case, a claim given back).
        wait_for(lambda: any(name.startswith("first-1-") for name in os.listdir(marks)), timeout=20,
                 message="the first job's process to start")
        second = cluster.submit(command=f"touch {marks}/second-$CORRAL_ATTEMPT-$$; echo ran", max_retries=0)
        scheduler = cluster.procs["scheduler"]
        scheduler.signal(signal.SIGSTOP)
        try:
            time.sleep(15)  # the fault itself: longer than the claim's read timeout (1 + 10 s) and T + grace
        finally:
            scheduler.signal(signal.SIGCONT)
        for job in (first, second):
            done = cluster.wait_status(job["job_id"], "done", "failed", timeout=60)
            assert (done["status"], done["retry_count"], done["stdout"]) == ("done", 0, "ran\n"), done
            assert len(final_transitions(cluster.scheduler_url, job["job_id"])) == 1
        runs = sorted(os.listdir(marks))
        assert len([r for r in runs if r.startswith("first-")]) == 1, runs  # the finished run was kept
        assert len([r for r in runs if r.startswith("second-")]) == 1, runs
        assert cluster.job(first["job_id"])["attempt"] == 1
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()
