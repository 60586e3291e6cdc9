"""A job's disk limit and the node's free-space floor with `corral-agent` processes
against the real registry and scheduler (root, real cgroups, jobs under uids of
their own): a job writing past its `disk_mb` is ended as failed `ended_by: disk`
while one within it runs to its end; under AGENT_MIN_FREE_DISK_MB the agent takes
no work and says why."""
import os
import uuid

import pytest
import requests

from corral.agent import disk
from helpers import wait_for

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("real_node")]
MiB = 1024 * 1024


@pytest.fixture
def node():
    return f"disk-{uuid.uuid4().hex[:8]}"


def _final(cluster, job_id):
    return wait_for(lambda: (lambda j: j if j["status"] in ("done", "failed") else None)(cluster.job(job_id)),
                    timeout=60, message=f"{job_id} to end")


def _log(state_dir, n=0):
    with open(os.path.join(state_dir, f"agent-{n}.log")) as f:
        return f.read()


def test_a_real_agent_ends_a_job_that_writes_past_its_disk_mb_and_runs_one_within_it(
        cluster, node, start_agent):
    start_agent(AGENT_DISK_CHECK_SECS="0.5", AGENT_DISK_LIMIT_MODE="watch")  # the watch alone, as without loop devices
    big = cluster.submit(command="head -c 104857600 /dev/zero > big; sleep 120", disk_mb=20, instance_id=node,
                         max_retries=0)["job_id"]
    small = cluster.submit(command="head -c 5242880 /dev/zero > small && sleep 1 && echo ok", disk_mb=20,
                           instance_id=node, max_retries=0)["job_id"]
    ended = _final(cluster, big)
    assert (ended["status"], ended["exit_code"], ended["ended_by"]) == ("failed", -1, "disk"), ended
    assert ended["stderr"].splitlines()[-1] == "job exceeded its disk limit of 20 MB"
    fine = _final(cluster, small)
    assert (fine["status"], fine["ended_by"], fine["stdout"]) == ("done", "exit", "ok\n"), fine


def test_a_real_agent_under_its_floor_takes_no_work_and_says_why(cluster, node, state_dir, start_agent):
    free_mb = disk.free_bytes(state_dir) // MiB
    job_id = cluster.submit(command="echo hi", instance_id=node)["job_id"]
    start_agent(AGENT_MIN_FREE_DISK_MB=str(free_mb + 1024 * 1024))
    wait_for(lambda: "taking no new work: only" in _log(state_dir), timeout=60, message="the agent to say why")
    assert "under AGENT_MIN_FREE_DISK_MB" in _log(state_dir)
    registered = wait_for(lambda: any(n["node_id"] == node for n in requests.get(
        cluster.registry_url + "/nodes", timeout=10).json()), timeout=30, message="the node registered")
    assert registered and cluster.job(job_id)["status"] == "pending"


def test_the_scheduler_learns_a_real_agent_is_under_its_floor_and_says_why_its_jobs_wait(
        cluster, node, state_dir, start_agent):
    free_mb = disk.free_bytes(state_dir) // MiB
    start_agent(AGENT_MIN_FREE_DISK_MB=str(free_mb + 1024 * 1024))

    def refusing():
        listed = requests.get(cluster.scheduler_url + "/nodes", timeout=10).json()
        return next((n["refusing_work"] for n in listed if n["node_id"] == node and n["refusing_work"]), None)

    why = wait_for(refusing, timeout=60, message="the scheduler's node list to say why the node takes no work")
    assert why.startswith("only ") and "under AGENT_MIN_FREE_DISK_MB" in why
    shown = requests.get(f"{cluster.registry_url}/nodes/{node}", timeout=10).json()
    assert shown["status"] == "healthy" and shown["refusing_work"] == why
    job_id = cluster.submit(command="echo hi")["job_id"]

    def reason():
        job = cluster.job(job_id)
        assert job["status"] == "pending" and job["node_id"] is None, job  # never placed there
        code = (job["pending_reason"] or {}).get("code")
        return job["pending_reason"] if code == "node_refusing_work" else None

    waiting = wait_for(reason, timeout=60, message="the job's pending reason to say why")
    assert node in waiting["message"] and why in waiting["message"]
    closest = requests.get(f"{cluster.scheduler_url}/jobs/{job_id}/why", timeout=10).json()["closest_nodes"]
    assert f"the node takes no new work: {why}" in next(n for n in closest if n["node_id"] == node)["lacks"]
