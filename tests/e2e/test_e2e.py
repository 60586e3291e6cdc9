"""End to end: the real registry and scheduler under gunicorn (two workers each)
and real agent processes, talking HTTP on loopback. Every wait is on a condition.
The core of the lifecycle (a run, a retry, a timeout, a cancel) runs on both storage
backends: SQLite files, and one PostgreSQL database for both services.
"""
import os
import pathlib
import signal

import pytest
import requests

from cluster import Cluster
from helpers import free_port, wait_for

pytestmark = pytest.mark.e2e


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False
    return True


def intervals(path: str) -> dict[str, list[tuple[float, float]]]:
    """Per node, the (start, end) of each job that wrote `start`/`end` stamps to `path`."""
    open_at, spans = {}, {}
    with open(path) as f:
        for line in f:
            what, job, node, stamp = line.split()
            if what == "start":
                open_at[job] = float(stamp)
            else:
                spans.setdefault(node, []).append((open_at.pop(job), float(stamp)))
    assert not open_at, f"jobs that never ended: {open_at}"
    return spans


def stamped(path: str, seconds: float) -> str:
    return (f'echo start $CORRAL_JOB_ID $CORRAL_NODE_ID $(date +%s.%N) >> {path}; sleep {seconds}; '
            f'echo end $CORRAL_JOB_ID $CORRAL_NODE_ID $(date +%s.%N) >> {path}')


def test_a_job_runs_and_reports_its_output(backend_cluster):
    cluster = backend_cluster
    cluster.start_agent("node-1")
    job = cluster.submit(command='echo hi; echo "to stderr $STAGE" >&2', env_vars={"STAGE": "prod"})
    done = cluster.wait_status(job["job_id"], "done", "failed")
    assert done["status"] == "done", done
    assert done["exit_code"] == 0 and done["stdout"] == "hi\n" and done["stderr"] == "to stderr prod\n"
    assert done["node_id"] == "node-1" and done["running_at"] and done["finished_at"]
    transitions = [(e["from"], e["to"]) for e in cluster.events(job["job_id"])]
    assert transitions[-2:] == [("pending", "running"), ("running", "done")]


def test_jobs_alternate_between_the_two_nodes(cluster):
    cluster.start_agent("node-1")
    cluster.start_agent("node-2")
    cluster.wait_nodes_healthy("node-1", "node-2")
    ran_on = []
    for _ in range(4):
        job = cluster.submit(command="true")
        ran_on.append(cluster.wait_status(job["job_id"], "done")["node_id"])
    assert ran_on in (["node-1", "node-2"] * 2, ["node-2", "node-1"] * 2)


def test_a_node_never_runs_more_jobs_than_its_limit(tmp_path, shared_dir):
    stamps = os.path.join(shared_dir, "stamps")
    open(stamps, "w").close()
    os.chmod(stamps, 0o666)
    cluster = Cluster(tmp_path, MAX_JOBS_PER_NODE=2)
    try:
        cluster.start()
        # node-1 offers 4 slots but the scheduler allows 2; node-2 advertises 1.
        cluster.start_agent("node-1", slots=4)
        cluster.start_agent("node-2", slots=1)
        cluster.wait_nodes_healthy("node-1", "node-2")
        jobs = [cluster.submit(command=stamped(stamps, 0.4)) for _ in range(12)]
        for job in jobs:
            assert cluster.wait_status(job["job_id"], "done", timeout=60)["status"] == "done"
        spans = intervals(stamps)
        assert set(spans) == {"node-1", "node-2"}
        for node, limit in (("node-1", 2), ("node-2", 1)):
            edges = sorted([(s, 1) for s, _ in spans[node]] + [(e, -1) for _, e in spans[node]],
                           key=lambda x: (x[0], x[1]))
            running = peak = 0
            for _, step in edges:
                running += step
                peak = max(peak, running)
            assert peak <= limit, f"{node} ran {peak} jobs at once (limit {limit})"
        assert max(len(s) for s in spans.values()) < 12
    finally:
        cluster.stop()


def test_a_failing_job_is_retried_once_then_failed(backend_cluster):
    cluster = backend_cluster
    cluster.start_agent("node-1")
    job = cluster.submit(command="echo attempt $CORRAL_ATTEMPT; exit 3")
    failed = cluster.wait_status(job["job_id"], "failed")
    assert failed["exit_code"] == 3 and failed["retry_count"] == 1 and failed["attempt"] == 2
    assert failed["stdout"] == "attempt 2\n"
    transitions = [(e["from"], e["to"]) for e in cluster.events(job["job_id"])]
    assert transitions.count(("pending", "running")) == 2
    assert ("running", "pending") in transitions and transitions[-1] == ("running", "failed")


def test_a_job_with_its_own_short_timeout_is_failed_while_the_default_is_long(cluster):
    cluster.start_agent("node-1")
    job = cluster.submit(command="sleep 30", timeout_secs=1)  # JOB_TIMEOUT_SECS is an hour
    assert job["timeout_secs"] == 1
    failed = cluster.wait_status(job["job_id"], "failed", timeout=60)
    assert failed["exit_code"] == -1 and "job timed out" in failed["stderr"]
    assert failed["retry_count"] == 0  # a timeout is final


def test_a_timed_out_job_is_failed_and_its_processes_are_gone(tmp_path, shared_dir):
    cluster = Cluster(tmp_path, JOB_TIMEOUT_SECS=2)
    pids = pathlib.Path(shared_dir) / "pids"
    try:
        cluster.start()
        cluster.start_agent("node-1")
        job = cluster.submit(command=f"sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; wait")
        failed = cluster.wait_status(job["job_id"], "failed", timeout=30)
        assert failed["exit_code"] == -1 and "job timed out" in failed["stderr"]
        recorded = [int(p) for p in pids.read_text().split()]
        assert len(recorded) == 2
        wait_for(lambda: not any(pid_alive(p) for p in recorded), timeout=10,
                 message="the job's shell and its child to be gone")
    finally:
        cluster.stop()


def test_a_job_waits_for_a_node_and_runs_once_one_starts(cluster):
    job = cluster.submit(command="echo late")
    assert job["status"] == "pending" and job["node_id"] is None
    cluster.start_agent("node-1")
    done = cluster.wait_status(job["job_id"], "done")
    assert done["stdout"] == "late\n" and done["node_id"] == "node-1"


def test_pending_jobs_of_a_silent_node_move_to_a_healthy_one(cluster):
    stuck = cluster.start_agent("node-1")
    cluster.start_agent("node-2")
    cluster.wait_nodes_healthy("node-1", "node-2")
    stuck.signal(signal.SIGSTOP)  # neither heartbeats nor polls any more
    try:
        jobs = [cluster.submit(command="true") for _ in range(2)]
        # One of the two was placed on node-1; after the heartbeat timeout it moves.
        for job in jobs:
            done = cluster.wait_status(job["job_id"], "done", timeout=30)
            assert done["node_id"] == "node-2"
    finally:
        stuck.signal(signal.SIGCONT)


def test_dispatch_goes_on_while_the_registry_is_down(cluster):
    cluster.start_agent("node-1")
    cluster.wait_nodes_healthy("node-1")
    first = cluster.submit(command="true")
    cluster.wait_status(first["job_id"], "done")
    cluster.procs["registry"].stop()
    job = cluster.submit(command="echo still")
    assert cluster.wait_status(job["job_id"], "done")["stdout"] == "still\n"


def test_bad_requests_get_json_errors_and_create_nothing(cluster):
    url = cluster.scheduler_url + "/jobs"
    cases = [
        (dict(data=b""), 415),
        (dict(data=b"echo hi", headers={"content-type": "text/plain"}), 415),
        (dict(data=b"{nope", headers={"content-type": "application/json"}), 400),
        (dict(json={"job_type": "run"}), 400),
        (dict(json={"command": "x", "job_type": "daemon"}), 400),
        (dict(json={"command": "x", "env_vars": {"A": 1}}), 400),
        (dict(json={"command": "x", "port": 0}), 400),
        (dict(json={"command": "x" * (10 * 1024 * 1024)}), 413),
    ]
    for kwargs, status in cases:
        response = requests.post(url, timeout=30, **kwargs)
        assert response.status_code == status, (kwargs.get("json", kwargs.get("data"))[:80], response.text)
        assert response.headers["content-type"].startswith("application/json")
        assert response.json()["error"]
    assert requests.get(url, timeout=10).json() == []
    assert requests.get(cluster.scheduler_url + "/jobs/job-1", timeout=10).status_code == 404


def test_an_agent_stops_cleanly_on_sigterm(cluster):
    agent = cluster.start_agent("node-1")
    cluster.wait_nodes_healthy("node-1")
    assert agent.stop(grace=15) == 0


def needs_root_cgroups():
    from corral.agent import cgroups
    manager = cgroups.detect(root_name="corral-probe", prepare=False)
    if os.geteuid() != 0 or not manager.enforced:
        pytest.skip(f"needs root and a writable cgroup hierarchy ({manager.reason})")


ESCAPING_TREE = ("setsid sh -c 'trap \"\" TERM; echo $$ >> {pids}; exec sleep 300' & "
                 "(trap '' TERM; sleep 300 & echo $! >> {pids}; wait) & "
                 "echo $$ >> {pids}; trap '' TERM; sleep 300 & wait")


@pytest.mark.root
@pytest.mark.parametrize("ending", ["timeout", "cancel"])
def test_timeout_and_cancel_leave_no_process_behind(tmp_path, shared_dir, database_url, ending):
    needs_root_cgroups()
    cluster = Cluster(tmp_path, database_url=database_url, JOB_TIMEOUT_SECS=3 if ending == "timeout" else 3600)
    pids = pathlib.Path(shared_dir) / "pids"
    try:
        cluster.start()
        cluster.start_agent("node-1")
        # A setsid grandchild and a double-forked one, all ignoring SIGTERM.
        job = cluster.submit(command=ESCAPING_TREE.format(pids=pids))
        recorded = wait_for(lambda: (lambda p: p if len(p) == 3 else None)(
            [int(x) for x in pids.read_text().split()] if pids.exists() else []), timeout=20,
            message="the three pids")
        # Named after the job, the warm launch's it took (the agent then makes another), or
        # a slot's kept from job to job (slot_cgroups.py).
        from corral.agent import cgroups
        from corral.agent.settings import AgentSettings
        root_name = AgentSettings(node_id="node-1", state_dir=cluster.state_dir).cgroup_root_name
        job_cgroup = next(line.rsplit("/", 1)[1]
                          for line in pathlib.Path(f"/proc/{recorded[0]}/cgroup").read_text().splitlines()
                          if f"/{root_name}/" in line)
        if ending == "cancel":
            response = requests.post(f"{cluster.scheduler_url}/jobs/{job['job_id']}/cancel", json={}, timeout=10)
            assert response.status_code == 200 and response.json()["status"] == "cancelled"
        else:
            failed = cluster.wait_status(job["job_id"], "failed", timeout=30)
            assert failed["exit_code"] == -1 and "job timed out" in failed["stderr"]
        wait_for(lambda: not any(pid_alive(p) for p in recorded), timeout=20,
                 message="every process of the job to be gone")
        manager = cgroups.detect(root_name=root_name, prepare=False)
        if job_cgroup.startswith("slot-"):  # kept for the next job: empty
            kept = manager.adopt(job_cgroup)
            wait_for(lambda: kept is None or not kept.pids(), timeout=10, message="the job's cgroup to be empty")
        else:
            assert job_cgroup in (f"{job['job_id']}-1", "warm-1-next")
            wait_for(lambda: job_cgroup not in manager.list_job_cgroups(), timeout=10,
                     message="the job's cgroup to be removed")
    finally:
        cluster.stop()


def test_a_service_is_listed_healthy_turns_unhealthy_and_is_gone_after_cancel(tmp_path, shared_dir):
    cluster = Cluster(tmp_path)
    pid_file = pathlib.Path(shared_dir) / "service.pid"
    try:
        cluster.start()
        cluster.start_agent("node-1", AGENT_HEALTH_INTERVAL_SECS=0.3, AGENT_HEALTH_TIMEOUT_SECS=0.5)
        port = free_port()
        job = cluster.submit(command=f"echo $$ > {pid_file}; exec python3 -m http.server --bind 127.0.0.1 $PORT",
                             job_type="service", port=port, name="web", health_path="/")
        services = cluster.registry_url + "/services"

        def listed(healthy):
            found = requests.get(services, params={"name": "web"}, timeout=5).json()
            return found if found and found[0]["healthy"] is healthy else None
        (record,) = wait_for(lambda: listed(True), timeout=30, message="the service to be healthy")
        assert (record["job_id"], record["node_id"], record["port"]) == (job["job_id"], "node-1", port)
        assert requests.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 200
        assert [s["job_id"] for s in requests.get(services, params={"healthy": "true"}, timeout=5).json()] \
            == [job["job_id"]]
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGSTOP)  # still accepts connections, answers nothing
        try:
            wait_for(lambda: listed(False), timeout=30, message="the service to turn unhealthy")
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: listed(True), timeout=30, message="the service to be healthy again")
        requests.post(f"{cluster.scheduler_url}/jobs/{job['job_id']}/cancel", json={}, timeout=10).raise_for_status()
        wait_for(lambda: requests.get(services, timeout=5).json() == [], timeout=30,
                 message="the service record to be removed")
        wait_for(lambda: not pid_alive(pid), timeout=20, message="the service process to be gone")
        assert cluster.job(job["job_id"])["status"] == "cancelled"
    finally:
        cluster.stop()
