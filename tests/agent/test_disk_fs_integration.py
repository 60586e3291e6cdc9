"""A job's work dir as a filesystem of its `disk_mb` (AGENT_DISK_LIMIT_MODE=fs) with
`corral-agent` processes against the real registry and scheduler (root, loop devices,
mkfs.ext4): a job writing past its limit is stopped there by ENOSPC and reported
`ended_by: disk`; the mount, loop device and image go with the job; a service's
filesystem outlives an agent restart and goes when it is cancelled."""
import os
import shutil
import signal
import subprocess
import uuid

import pytest
import requests

from agent_support import BIN, agent_env
from corral.agent import diskfs
from helpers import wait_for

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("real_node", "loop_devices")]
MiB = 1024 * 1024


@pytest.fixture
def loop_devices():
    if os.geteuid() != 0 or not os.access("/dev/loop-control", os.R_OK | os.W_OK) \
            or shutil.which("mkfs.ext4") is None:
        pytest.skip("work dir filesystems need root, /dev/loop-control and mkfs.ext4")


@pytest.fixture
def node():
    return f"diskfs-{uuid.uuid4().hex[:8]}"


def _final(cluster, job_id):
    return wait_for(lambda: (lambda j: j if j["status"] in ("done", "failed", "cancelled") else None)(
        cluster.job(job_id)), timeout=60, message=f"{job_id} to end")


def _log(state_dir, n=0):
    with open(os.path.join(state_dir, f"agent-{n}.log")) as f:
        return f.read()


def _mounts_under(work_root):
    """The mount points below the work root (the root's own shared mount aside)."""
    prefix = os.path.join(os.path.realpath(work_root), "")
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(prefix)]


def _loops_of(state_dir):
    listed = subprocess.run(["losetup", "-a"], capture_output=True, text=True, timeout=30).stdout
    return [line for line in listed.splitlines() if os.path.realpath(state_dir) in line]


def _images(state_dir, node):
    where = os.path.join(state_dir, f"agent-{node}", "disk")
    return [name for name in os.listdir(where) if name.endswith(".img")] if os.path.isdir(where) else []


def test_a_job_past_its_disk_mb_gets_enospc_at_the_limit_and_its_filesystem_goes_with_it(
        cluster, node, state_dir, start_agent):
    # The watch waits long here: the job ends on its own, failing on the full filesystem.
    start_agent(AGENT_DISK_LIMIT_MODE="fs", AGENT_DISK_CHECK_SECS="60")
    job = cluster.submit(command="head -c 104857600 /dev/zero > big; rc=$?; stat -c %s big; exit $rc",
                         disk_mb=20, instance_id=node, max_retries=0)["job_id"]
    ended = _final(cluster, job)
    assert (ended["status"], ended["ended_by"]) == ("failed", "disk"), ended
    assert ended["exit_code"] not in (0, -1), ended  # head's own failure, not a kill
    assert 0 < int(ended["stdout"]) <= 20 * MiB + 64 * 1024, ended["stdout"]
    assert "No space left on device" in ended["stderr"]
    assert ended["stderr"].splitlines()[-1].startswith("job reached its disk limit of 20 MB"), ended["stderr"]
    assert "jobs' disk limits are filesystems of their size" in _log(state_dir)
    work_root = os.path.join(state_dir, f"agent-{node}", "work")
    wait_for(lambda: _mounts_under(work_root) == [] and _loops_of(state_dir) == [] and _images(state_dir, node) == [],
             timeout=30, message="the job's mount, loop device and image to go")


def test_a_services_filesystem_outlives_an_agent_restart_and_goes_when_it_is_cancelled(
        cluster, node, state_dir, start_agent):
    first = start_agent(AGENT_DISK_LIMIT_MODE="fs")
    service = cluster.submit(job_type="service", command="head -c 1048576 /dev/zero > kept; exec sleep 600",
                             disk_mb=30, name="disk", instance_id=node)["job_id"]
    cluster.wait_status(service, "running", timeout=60)
    work_root = os.path.join(state_dir, f"agent-{node}", "work")
    workdir = os.path.join(work_root, f"{service}-1")
    wait_for(lambda: os.path.exists(os.path.join(workdir, "kept")), timeout=30, message="the service to write")
    assert diskfs.mounted(workdir) and _images(state_dir, node) == [f"{service}-1.img"]
    size = os.statvfs(workdir)
    assert size.f_blocks * size.f_frsize <= 30 * MiB

    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 0, _log(state_dir, 0)
    assert diskfs.mounted(workdir) and os.path.exists(os.path.join(workdir, "kept"))

    second = start_agent(AGENT_DISK_LIMIT_MODE="fs")
    wait_for(lambda: f"re-adopted service job {service} attempt 1" in _log(state_dir, 1), timeout=60,
             message="the second agent to adopt the service")
    assert diskfs.mounted(workdir) and os.path.exists(os.path.join(workdir, "kept"))  # not swept

    requests.post(f"{cluster.scheduler_url}/jobs/{service}/cancel", json={}, timeout=10).raise_for_status()
    wait_for(lambda: not diskfs.mounted(workdir) and _loops_of(state_dir) == [] and _images(state_dir, node) == [],
             timeout=60, message="the service's mount, loop device and image to go")
    second.send_signal(signal.SIGTERM)
    assert second.wait(30) == 0, _log(state_dir, 1)
    assert _mounts_under(work_root) == []  # no job filesystem left under the work root


def test_fs_mode_refuses_to_start_where_the_node_cannot_make_filesystems(node, state_dir, tmp_path):
    """No mkfs.ext4 on its PATH: `fs` cannot be had, and the agent says so in one line."""
    env = dict(agent_env(node, state_dir, registry_url="http://127.0.0.1:9", scheduler_url="http://127.0.0.1:9"),
               AGENT_DISK_LIMIT_MODE="fs", PATH=str(tmp_path))
    done = subprocess.run([os.path.join(BIN, "corral-agent"), "--once"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "corral-agent: error: AGENT_DISK_LIMIT_MODE is fs but this node cannot give jobs a filesystem: "
        "mkfs.ext4 is not installed"), done.stderr
