"""The agent with everything real on this host: cgroup limits and OOM detection, the
jobs' own uids, killing a whole tree on cancel, deploy artifacts; and `corral-agent`
processes (their CLI, SIGTERM, re-adoption of a service by the next process)
against the real registry and scheduler served by gunicorn on 127.0.0.1.

The Agent class itself meets the real scheduler app through `responses`
(scheduler_double.py) and a mocked registry.

Needs root and a writable cgroup v1 or v2 hierarchy; CI runs as root.
"""
import io
import json
import os
import signal
import subprocess
import uuid
import zipfile

import pytest
import requests
import responses

from corral.agent import cgroups, services
from corral.agent.agent import STOPPED_MESSAGE, Agent
from corral.agent.settings import AgentSettings
from corral.shared.clients import RegistryClient, SchedulerClient
from agent_support import BIN, PYTHON3, agent_env, http_server, only_empty_slots, remove_node_cgroups
from helpers import free_port, process_gone, wait_for
from scheduler_double import REGISTRY, SCHEDULER

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("real_node")]


@pytest.fixture
def node():
    return f"int-{uuid.uuid4().hex[:8]}"


# --- the Agent class, real cgroups, mocked API ---------------------------------------------------


@pytest.fixture
def agent(state_dir, node, scheduler, registry):
    settings = AgentSettings(node_id=node, registry_url=REGISTRY, scheduler_url=SCHEDULER,
                             state_dir=state_dir, slots=2, output_tail_bytes=4096, stop_grace=0.2,
                             kill_grace=0.3)
    a = Agent(settings, RegistryClient(REGISTRY), SchedulerClient(SCHEDULER))
    a.startup()
    try:
        yield a
    finally:
        for key in a.jobs.keys():
            local = a.jobs.get(key)
            local.prepared.wait(10)
            if local.process is not None:
                local.process.kill(0)
        remove_node_cgroups(node, state_dir)


def reap_until(agent, timeout=15):
    return wait_for(agent.reap_once, timeout=timeout, message="a job to end")


def test_out_of_memory_is_detected_and_reported(agent, scheduler):
    assert agent.cgroups.enforced
    scheduler.add(command=f"{PYTHON3} -c 'x = b\"x\" * (200 << 20)'", memory_mb=32, cpu_percent=50)
    agent.intake.poll_once()
    assert reap_until(agent) == [("job-1", 1, "failed")]
    running = scheduler.reports[0][1]
    assert (running["limits_enforced"], running["limits"]) == (
        True, {"memory_mb": 32, "cpu_percent": 50, "max_processes": 1024})
    final = scheduler.final("job-1")
    assert final["oom_killed"] is True, final
    assert final["exit_code"] in (-signal.SIGKILL, 128 + signal.SIGKILL)
    assert final["stderr"].splitlines()[-1] == "job killed: out of memory (limit 32 MB)"
    assert 0 < final["peak_memory_bytes"] <= 33 * 1024 * 1024
    assert final["cpu_seconds"] is not None and final["cpu_seconds"] > 0


def test_job_runs_as_its_own_uid_in_its_cgroup_and_both_go(agent, scheduler):
    scheduler.add(command='id -u; grep -cE "/(job-1-1|slot-[0-9]+)$" /proc/self/cgroup; echo "$HOME $USER"; '
                          'echo hi > mine.txt && echo wrote')
    agent.intake.poll_once()
    assert reap_until(agent) == [("job-1", 1, "done")]
    final = scheduler.final("job-1")
    uid, in_cgroup, home, wrote = final["stdout"].splitlines()
    assert 70000 <= int(uid) <= 79999 and int(in_cgroup) >= 2 and wrote == "wrote"  # memory, cpu, ...
    assert home == f"{agent.settings.work_dir('job-1', 1)} corral-{uid}"  # no passwd entry: HOME is the work dir
    assert final["oom_killed"] is False and final["peak_memory_bytes"] > 0
    assert only_empty_slots(agent.cgroups)  # gone, or kept empty for the next run job
    assert agent.users.pool.held() == {}  # the uid was given back


def test_cancel_kills_the_whole_tree_through_the_cgroup(agent, scheduler):
    scheduler.add(command="setsid sh -c 'trap \"\" TERM; echo $$ > grandchild.pid; sleep 300' & "
                          "echo $$ > main.pid; sleep 300")
    agent.intake.poll_once()
    workdir = agent.settings.work_dir("job-1", 1)
    pids = wait_for(lambda: [int(open(os.path.join(workdir, n)).read()) for n in
                             ("main.pid", "grandchild.pid")], message="both pids")
    scheduler.cancel("job-1")
    assert agent.reconciler.reconcile_once() == [("job-1", 1)]
    assert reap_until(agent) == [("job-1", 1, "killed")]
    assert all(process_gone(pid) for pid in pids)
    assert only_empty_slots(agent.cgroups)
    assert scheduler.statuses("job-1") == ["running"]


def test_deploy_artifact_is_owned_by_the_job_user(agent, scheduler, api):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        info = zipfile.ZipInfo("run.sh")
        info.external_attr = 0o100755 << 16
        zf.writestr(info, "#!/bin/sh\nid -u > out.txt && cat out.txt\n")
    api.add(responses.GET, "https://builds.test/app.zip", body=buf.getvalue())
    scheduler.add(command=None, deploy_url="https://builds.test/app.zip")
    agent.intake.poll_once()
    assert reap_until(agent) == [("job-1", 1, "done")], scheduler.final("job-1")
    assert 70000 <= int(scheduler.final("job-1")["stdout"]) <= 79999


def test_lease_renewals_carry_what_the_jobs_use(agent, scheduler, leases):
    """Read from the job's cgroup, reaching the scheduler's lease row: its 40 MB, and its
    busy loop's CPU (at most its 100% limit, give or take a CFS period)."""
    scheduler.add(command=f"{PYTHON3} -c \"b = bytearray(40 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
                          f"while True: pass\"", memory_mb=128)
    agent.intake.poll_once()

    def renewed_with_usage():
        agent.membership.renew_with(agent.scheduler)
        memory, cpu = leases()
        return (memory, cpu) if memory >= 40 and cpu >= 30 else None

    memory, cpu = wait_for(renewed_with_usage, timeout=20, interval=0.3, message="the job's usage in its lease")
    assert memory < 128 and cpu <= 150, (memory, cpu)


# --- corral-agent processes against the real registry and scheduler -------------------------------


def agent_log(state_dir, n):
    with open(os.path.join(state_dir, f"agent-{n}.log")) as f:
        return f.read()


def moves(cluster, job_id):
    """The statuses the job moved to after it was submitted (placements left out)."""
    return [e["to"] for e in cluster.events(job_id) if e["from"] not in (None, e["to"])]


def service_record(cluster, job_id):
    """The registry's record of the job's service, or None."""
    records = requests.get(cluster.registry_url + "/services", timeout=10).json()
    return next((r for r in records if r["job_id"] == job_id), None)


def test_check_against_a_live_control_plane(cluster, node, state_dir):
    result = subprocess.run([os.path.join(BIN, "corral-agent"), "--check", "--json"],
                            env=agent_env(node, state_dir, cluster.registry_url, cluster.scheduler_url),
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["limits_enforced"] and report["cgroups"]["mode"] in ("v1", "v2")
    assert report["job_user"]["mode"] == "per-job" and report["job_user"]["uid_range"] == "70000-79999"
    assert report["private_tmp"] == {"enabled": True, "reason": None}
    assert report["registry"]["ok"] and report["scheduler"]["ok"]
    # --check only looks: it created no cgroup directory for this node.
    assert not any(os.path.exists(d) for d in report["cgroups"]["dirs"].values())


def test_the_registry_lists_the_nodes_default_limits_and_reserve(cluster, node, start_agent):
    start_agent(AGENT_RESERVED_MEMORY_MB="256", AGENT_RESERVED_CPU_PERCENT="50", AGENT_RUN_MEMORY_MB="300")
    listed = wait_for(lambda: next((n for n in requests.get(cluster.registry_url + "/nodes", timeout=10).json()
                                    if n["node_id"] == node), None), timeout=30, message="the node registered")
    assert (listed["reserved_memory_mb"], listed["reserved_cpu_percent"]) == (256, 50)
    assert listed["default_limits"]["run"]["memory_mb"] == 300
    assert listed["default_limits"]["service"]["memory_mb"] == min(1024, listed["max_memory_mb"])


def test_agent_restart_leaves_services_running_and_the_next_agent_adopts_them(
        cluster, node, state_dir, start_agent):
    port = free_port()
    service = cluster.submit(job_type="service", command=http_server(port), port=port, name="web",
                             health_path="/", instance_id=node)["job_id"]
    # Failed, not requeued, when its node gives it up: it stays with the first agent.
    run = cluster.submit(command="sleep 300", instance_id=node, on_node_lost="fail")["job_id"]
    first = start_agent()
    wait_for(lambda: (service_record(cluster, service) or {}).get("healthy") is True, timeout=15,
             message="the service to be healthy")
    wait_for(lambda: moves(cluster, run) == ["running"], message="the run job to start")
    state_file = services.state_path(os.path.join(state_dir, f"agent-{node}", "services"), service, 1)
    with open(state_file) as f:
        pid = json.load(f)["pid"]

    first.send_signal(signal.SIGTERM)
    assert first.wait(20) == 0, agent_log(state_dir, 0)
    ended = cluster.job(run)  # given up by the node (requeue), which on_node_lost=fail ends
    assert (ended["status"], moves(cluster, run)) == ("failed", ["running", "failed"])
    assert "gave the attempt up" in cluster.events(run)[-1]["reason"]
    assert ended["stderr"].splitlines()[-2].endswith(STOPPED_MESSAGE)
    assert not process_gone(pid)
    recorded = service_record(cluster, service)
    assert recorded is not None and moves(cluster, service) == ["running"]

    second = start_agent()
    wait_for(lambda: f"re-adopted service job {service} attempt 1" in agent_log(state_dir, 1),
             message="the second agent to adopt the service")
    wait_for(lambda: (lambda r: r["healthy"] is True and r["checked_at"] > recorded["checked_at"])(
        service_record(cluster, service)), message="the second agent to record the service")
    assert moves(cluster, service) == ["running"]  # not started again, not reported
    assert requests.get(f"http://127.0.0.1:{port}/", timeout=5).ok

    assert cluster.job(service)["status"] == "running"
    requests.post(f"{cluster.scheduler_url}/jobs/{service}/cancel", json={}, timeout=10).raise_for_status()
    wait_for(lambda: process_gone(pid), message="the service to be killed")
    wait_for(lambda: service_record(cluster, service) is None, message="the record to be removed")
    wait_for(lambda: not os.path.exists(state_file), message="the state file to be removed")
    assert moves(cluster, service) == ["running", "cancelled"]  # nothing reported

    second.send_signal(signal.SIGTERM)
    assert second.wait(20) == 0, agent_log(state_dir, 1)
    # Nothing left: the node's cgroup directories went with the last job.
    root_name = AgentSettings(node_id=node, state_dir=state_dir).cgroup_root_name
    assert cgroups.detect(root_name=root_name, prepare=False).list_job_cgroups() == []


def test_a_service_that_died_while_no_agent_watched_is_failed_and_unlisted_at_the_next_start(
        cluster, node, state_dir, start_agent):
    """The agent is killed, then its service dies: the next agent tells the scheduler at
    once (not when the node's lease runs out) and takes the record out of the registry,
    so no load balancer is sent to the dead port meanwhile."""
    port = free_port()
    service = cluster.submit(job_type="service", command=http_server(port), port=port, name="web",
                             health_path="/", instance_id=node, max_retries=0)["job_id"]
    first = start_agent()
    wait_for(lambda: (service_record(cluster, service) or {}).get("healthy") is True, timeout=30,
             message="the service to be healthy")
    state_file = services.state_path(os.path.join(state_dir, f"agent-{node}", "services"), service, 1)
    with open(state_file) as f:
        pid = json.load(f)["pid"]

    os.killpg(first.pid, signal.SIGKILL)  # a crash: nothing detached, nothing reported
    first.wait(10)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: process_gone(pid), message="the service to die")
    assert (service_record(cluster, service) or {}).get("healthy") is True  # what a load balancer still reads

    start_agent()
    ended = wait_for(lambda: (lambda job: job if job["status"] == "failed" else None)(cluster.job(service)),
                     timeout=30, message="the service job to be failed")
    healthy = requests.get(cluster.registry_url + "/services", params={"healthy": "true"}, timeout=10).json()
    assert service not in {r["job_id"] for r in healthy}
    wait_for(lambda: service_record(cluster, service) is None, timeout=30, message="the record to be removed")
    assert ended["exit_code"] == -1 and "ended while no agent watched it" in ended["stderr"]
    assert moves(cluster, service) == ["running", "failed"]  # not requeued: the retry rule applies
    assert "ended while no agent watched it" in agent_log(state_dir, 1)
