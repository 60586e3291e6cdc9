"""Which devices a job may open and how that is enforced (devices.py), without root: the
mode a node takes, the rules and nodes a job gets, and the launch chain that carries them.
The jobs themselves are tried as root in test_isolation.py."""
import os

import pytest

from corral.agent import devices, launch
from corral.agent.gpus import Gpu

A = Gpu("0", "GPU-a", "NVIDIA A100-SXM4-80GB", 81920, minor=0)
B = Gpu("1", "GPU-b", "NVIDIA A100-SXM4-80GB", 81920, minor=1)
MIG = Gpu("1:0", "MIG-c", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 10240, minor=None, parent_uuid="GPU-b")


@pytest.mark.parametrize("wanted, gpus, cgroup, problem, expected", [
    ("auto", True, True, None, "cgroup"),
    ("auto", True, False, None, "mount"),
    ("mount", True, True, None, "mount"),
    ("cgroup", True, True, "no root", "cgroup"),
    ("auto", False, False, "no root", "none"),   # nothing to hold jobs to
    ("none", True, False, "no root", "none"),    # an explicit choice
])
def test_the_mode_a_node_takes(wanted, gpus, cgroup, problem, expected):
    assert devices.choose_mode(wanted, gpus, cgroup, problem)[0] == expected


@pytest.mark.parametrize("wanted, cgroup, problem, says", [
    ("auto", False, "the agent is not root", "set AGENT_DEVICE_ISOLATION=none to run them anyway"),
    ("cgroup", False, None, "no devices controller"),
    ("mount", True, "mknod is missing", "mknod is missing"),
])
def test_an_agent_that_cannot_isolate_gpus_as_asked_does_not_start(wanted, cgroup, problem, says):
    with pytest.raises(ValueError, match=says):
        devices.choose_mode(wanted, True, cgroup, problem)


def test_a_node_without_gpus_leaves_jobs_as_they_are_and_refuses_a_gpu_it_lacks(tmp_path):
    plain = devices.Isolation(devices.NONE, (), str(tmp_path))
    assert plain.for_job(()) is None
    with pytest.raises(devices.DeviceError, match="GPU GPU-a, reserved for the job, is not one of this node's"):
        plain.for_job(["GPU-a"])
    with pytest.raises(devices.DeviceError, match=r"\(GPU-a, GPU-b; AGENT_GPUS\)"):
        devices.Isolation(devices.MOUNT, (A, B), str(tmp_path)).for_job(["GPU-x"])


def test_only_character_devices_that_exist_are_given(tmp_path):
    (tmp_path / "null").write_text("a regular file is no device")
    access = devices.Isolation(devices.MOUNT, (A,), str(tmp_path)).for_job(["GPU-a"])
    assert access is not None and access.nodes == ()
    assert access.cgroup_rules() == list(devices.ORDINARY_RULES)


def test_a_job_is_given_its_gpus_nodes_the_controls_and_the_ordinary_ones():
    """The nodes are read from the device dir as they are (here: this machine's /dev)."""
    isolation = devices.Isolation(devices.CGROUP, (A, B, MIG), "/dev")
    null = os.stat("/dev/null")
    without = isolation.for_job([])
    assert [n.path for n in without.nodes if n.path == "null"] == ["null"]
    assert not any(n.path.startswith("nvidia") for n in without.nodes)
    assert "c 1:3 rwm" in without.cgroup_rules() and "c 136:* rwm" in without.cgroup_rules()
    assert f"null:{os.major(null.st_rdev)}:{os.minor(null.st_rdev)}:666" in without.specs()
    assert without.env() == {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void",
                             "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    # A MIG instance declared without a minor number is its parent GPU's /dev/nvidia1.
    both = isolation.for_job(["MIG-c", "GPU-a"])
    assert both.env()["CUDA_VISIBLE_DEVICES"] == "MIG-c,GPU-a"
    assert [g.uuid for g in both.gpus] == ["MIG-c", "GPU-a"]


def test_the_chain_carries_the_jobs_dev_between_its_own_separators():
    tools = launch.Tools("/usr/bin/setpriv", "/usr/bin/unshare", "/bin/mount", "/bin/mknod", "/bin/mkdir", "/bin/ln")
    chain = launch.setup_argv(tools, ["/cg/a/tasks"], private_dev=launch.PrivateDev(("null:1:3:666",)))
    assert chain[:6] == ["/usr/bin/unshare", "--mount", "--ipc", "--propagation", "slave", "--"]
    after_name = chain[chain.index(launch.SETUP_NAME) + 1:]
    assert after_name == ["/bin/mount", "", "", "/bin/mknod", "/bin/mkdir", "/bin/ln", "/cg/a/tasks", "--",
                          "null:1:3:666", "--"]
    # Without a /dev of its own, no device programs and no second separator.
    plain = launch.setup_argv(tools, ["/cg/a/tasks"])
    assert plain[plain.index(launch.SETUP_NAME) + 1:] == ["/bin/mount", "", "", "", "", "", "/cg/a/tasks", "--"]
    with pytest.raises(ValueError, match="mknod, mkdir and ln"):
        launch.setup_argv(launch.Tools(None, "/u", "/m"), private_dev=launch.PrivateDev(()))
