"""Several hosts for real: the registry and scheduler in one network namespace,
each agent in its own with its own address, talking over a bridge."""
import os

import pytest
import requests

from cluster import BIN, wait_scheduler_sees_healthy
from helpers import wait_for
from lab_cluster import OPERATOR_TOKEN, REGISTRY, SCHEDULER, api, lab_of, start, start_servers

pytestmark = [pytest.mark.e2e, pytest.mark.root]


@pytest.fixture
def lab(tmp_path):
    yield from lab_of(tmp_path, agents=2)


def test_jobs_run_on_two_hosts_and_their_services_answer_on_each_hosts_address(lab):
    lab, procs, dirs = lab
    registry, scheduler = REGISTRY, SCHEDULER
    start_servers(lab, procs, dirs, {"HEARTBEAT_TIMEOUT_SECS": 5}, NODE_REFRESH_SECS=0.3,
                  DISPATCH_INTERVAL_SECS=0.2, MAX_JOBS_PER_NODE=2)
    for i, ns in enumerate(lab.agent_ns):
        # No AGENT_ADDRESS: the agent finds its address on the route to the registry.
        start(lab, procs, dirs, f"host-{i + 1}", ns, [os.path.join(BIN, "corral-agent")],
              NODE_ID=f"host-{i + 1}", REGISTRY_URL=registry, SCHEDULER_URL=scheduler,
              AGENT_SLOTS=2, POLL_INTERVAL_SECS=0.2, HEARTBEAT_INTERVAL_SECS=0.5, AGENT_HEALTH_INTERVAL_SECS=0.5)

    def healthy():
        nodes = api.get(registry + "/nodes", params={"status": "healthy"}, timeout=5).json()
        return {n["node_id"]: n["address"] for n in nodes}
    addresses = wait_for(lambda: (lambda h: h if len(h) == 2 else None)(healthy()), timeout=30,
                         message="both hosts to register")
    assert addresses == {"host-1": lab.agent_addr[0], "host-2": lab.agent_addr[1]}
    wait_scheduler_sees_healthy(scheduler, ("host-1", "host-2"), timeout=30, token=OPERATOR_TOKEN)

    # One-shot jobs land on both hosts and each sees its own network.
    jobs = [api.post(scheduler + "/jobs", json={"command": "ip -4 -o addr show dev eth0"}, timeout=10).json()
            for _ in range(4)]
    finished = [wait_for(lambda j=j: (lambda r: r if r["status"] in ("done", "failed") else None)(
        api.get(f"{scheduler}/jobs/{j['job_id']}", timeout=5).json()), timeout=30, message=j["job_id"])
        for j in jobs]
    assert all(j["status"] == "done" for j in finished), finished
    assert {j["node_id"] for j in finished} == {"host-1", "host-2"}
    for job in finished:
        assert addresses[job["node_id"]] + "/24" in job["stdout"]

    # A service on each host answers on that host's address, as the registry lists it.
    for node in ("host-1", "host-2"):
        api.post(scheduler + "/jobs", timeout=10, json={
            "command": "exec python3 -m http.server --bind 0.0.0.0 $PORT", "job_type": "service",
            "port": 8080, "name": "web", "instance_id": node, "health_path": "/"})

    def healthy_services():
        services = api.get(registry + "/services", params={"healthy": "true", "name": "web"}, timeout=5).json()
        return services if len(services) == 2 else None
    services = wait_for(healthy_services, timeout=30, message="both services to be healthy")
    assert {(s["node_id"], s["address"]) for s in services} == {
        ("host-1", lab.agent_addr[0]), ("host-2", lab.agent_addr[1])}
    for service in services:
        answer = requests.get(f"http://{service['address']}:{service['port']}/", timeout=5)
        assert answer.status_code == 200


def test_a_partitioned_node_stops_its_job_before_the_job_runs_elsewhere(lab, shared_dir):
    lab, procs, dirs = lab
    registry, scheduler = REGISTRY, SCHEDULER
    loss = dict(HEARTBEAT_TIMEOUT_SECS=3, NODE_LOST_GRACE_SECS=3)
    start_servers(lab, procs, dirs, loss, NODE_REFRESH_SECS=0.3, DISPATCH_INTERVAL_SECS=0.2, **loss)

    def agent(i):
        start(lab, procs, dirs, f"host-{i + 1}", lab.agent_ns[i], [os.path.join(BIN, "corral-agent")],
              NODE_ID=f"host-{i + 1}", AGENT_ADDRESS=lab.agent_addr[i], REGISTRY_URL=registry,
              SCHEDULER_URL=scheduler, POLL_INTERVAL_SECS=0.2, HEARTBEAT_INTERVAL_SECS=0.5,
              AGENT_KILL_GRACE_SECS=1)

    def job():
        return api.get(f"{scheduler}/jobs/job-1", timeout=5).json()

    stamps = os.path.join(shared_dir, "stamps")
    open(stamps, "w").close()
    os.chmod(stamps, 0o666)  # each copy runs under a uid of its own
    # Each copy stamps its start, and its end when it finishes or is stopped.
    command = (f"stamp() {{ echo $1 $CORRAL_NODE_ID $CORRAL_ATTEMPT $(date +%s.%N) >> {stamps}; }}; "
               f"trap 'stamp end; exit 143' TERM; stamp start; sleep 8 & wait; stamp end")
    agent(0)
    api.post(scheduler + "/jobs", json={"command": command}, timeout=10)
    wait_for(lambda: job()["status"] == "running", timeout=30, message="the job to run on host-1")
    agent(1)
    wait_for(lambda: len(api.get(registry + "/nodes", params={"status": "healthy"}, timeout=5).json()) == 2,
             timeout=30, message="host-2 to be healthy")
    lab.cut(lab.agent_ns[0])
    try:
        moved = wait_for(lambda: (lambda j: j if j["node_id"] == "host-2" and j["status"] == "running" else None)(
            job()), timeout=30, message="the job to be requeued on host-2")
        assert moved["attempt"] == 2 and moved["node_losses"] == 1
    finally:
        lab.heal(lab.agent_ns[0])
    done = wait_for(lambda: (lambda j: j if j["status"] == "done" else None)(job()), timeout=30,
                    message="the job to finish on host-2")
    assert done["node_id"] == "host-2" and done["attempt"] == 2
    spans = {}
    for line in open(stamps):
        what, node, attempt, stamp = line.split()
        spans.setdefault((node, attempt), {})[what] = float(stamp)
    first, second = spans[("host-1", "1")], spans[("host-2", "2")]
    assert set(first) == set(second) == {"start", "end"}, spans
    assert first["end"] < second["start"], f"two copies ran at once: {spans}"
    # The healed node's late report for attempt 1 changed nothing.
    wait_for(lambda: job() == done, timeout=5, message="the result to stay")
