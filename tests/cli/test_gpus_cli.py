"""GPUs and other countable resources on the command line: the GPUS and RESOURCES columns of
`node list`, `node show` with each device and the job it is reserved for, and what a job
asks for and holds in `job status`; each with and without GPUs."""
import json

import pytest
import requests

from cli_support import REG, SCHED, a_job, corral, iso, one_line_error
from corral.cli.nodes import short_model

A100 = "NVIDIA A100-SXM4-80GB"


def device(index: str, model: str = A100, memory_mb: int = 81920, job_id: str | None = None) -> dict:
    """A device as the scheduler lists it (the registry's has no job_id)."""
    return {"index": index, "uuid": f"GPU-{index.replace(':', '-')}-5fd4c4a2", "model": model,
            "memory_mb": memory_mb, "job_id": job_id}


GPUS = [device(str(i), job_id="job-7" if i < 2 else None) for i in range(8)]


def registry_node(node_id: str, gpus: list[dict], resources: dict, **fields) -> dict:
    node = {"node_id": node_id, "address": "10.0.0.8", "kind": "compute", "slots": 8, "running": 1,
            "labels": {}, "status": "healthy", "last_heartbeat": iso(2), "drained": False,
            "gpus": [{k: v for k, v in g.items() if k != "job_id"} for g in gpus], "resources": resources}
    node.update(fields)
    return node


def scheduler_node(node_id: str, gpus: list[dict], resources: dict, reserved: dict, **fields) -> dict:
    node = {"node_id": node_id, "address": "10.0.0.8", "kind": "compute", "status": "healthy", "drained": False,
            "refusing_work": None, "slots": 8, "capacity": 8, "slots_used": 1, "max_memory_mb": None,
            "max_cpu_percent": None, "labels": {}, "pool": "default",
            "allocatable": {"memory_mb": 3584, "cpu_percent": 400}, "reserved": {"memory_mb": 1024, "cpu_percent": 100},
            "used": {"memory_mb": 300, "cpu_percent": 42}, "gpus": gpus, "resources": resources,
            "resources_reserved": reserved, "last_heartbeat": iso(2), "synced_at": iso(1)}
    node.update(fields)
    return node


REG_NODES = [registry_node("gpu-1", GPUS, {"fpga": 2, "licence.matlab": 4}),
             registry_node("cpu-1", [], {})]
SCHED_NODES = [scheduler_node("gpu-1", GPUS, {"fpga": 2, "licence.matlab": 4}, {"fpga": 1}),
               scheduler_node("cpu-1", [], {}, {})]


def rows(result) -> list[list[str]]:
    assert result.exit_code == 0, result.output
    return [line.split() for line in result.stdout.splitlines()]


# ---- a model, shortened ----------------------------------------------------------------------

@pytest.mark.parametrize("model, short", [
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "A100 MIG 1g.5gb"), ("Tesla V100-PCIE-32GB", "V100"),
    ("NVIDIA L4", "L4"), ("NVIDIA RTX A6000", "RTX A6000"), ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA", "NVIDIA"), ("", "?")])
def test_a_gpu_model_is_shortened_to_what_tells_it_apart(model, short):
    assert short_model(model) == short


# ---- node list ---------------------------------------------------------------------------------

def test_node_list_shows_gpus_reserved_of_all_with_their_model_and_resources_reserved_of_declared(mock):
    mock.get(f"{REG}/nodes", json=REG_NODES)
    mock.get(f"{SCHED}/nodes", json=SCHED_NODES)
    lines = rows(corral("node", "list"))
    assert lines[0][-9:] == ["POOL", "MEM_ALLOC", "MEM_RSVD", "MEM_USED", "CPU_ALLOC", "CPU_RSVD", "CPU_USED",
                             "GPUS", "RESOURCES"]
    assert lines[1][0] == "gpu-1" and lines[1][-3:] == ["2/8", "A100", "fpga=1/2,licence.matlab=0/4"]
    assert lines[2][0] == "cpu-1" and lines[2][-2:] == ["-", "-"]


def test_node_list_of_mixed_models_and_mig_instances_names_each_model_once(mock):
    gpus = [device("0", "NVIDIA H100 80GB HBM3", job_id="job-3"), device("1", "NVIDIA H100 80GB HBM3"),
            device("2:1", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 4864, job_id="job-4")]
    mock.get(f"{REG}/nodes", json=[registry_node("mix-1", gpus, {})])
    mock.get(f"{SCHED}/nodes", json=[scheduler_node("mix-1", gpus, {}, {})])
    result = corral("node", "list")
    lines = rows(result)
    assert lines[0][-1] == "GPUS" and "RESOURCES" not in lines[0]
    assert result.stdout.splitlines()[1].endswith("2/3 H100,A100 MIG 1g.5gb")


def test_node_list_without_gpus_or_resources_has_no_such_columns(mock):
    mock.get(f"{REG}/nodes", json=[registry_node("cpu-1", [], {}), registry_node("cpu-2", [], {})])
    mock.get(f"{SCHED}/nodes", json=[scheduler_node("cpu-1", [], {}, {}), scheduler_node("cpu-2", [], {}, {})])
    lines = rows(corral("node", "list"))
    assert lines[0][-1] == "CPU_USED"
    assert "GPUS" not in lines[0] and "RESOURCES" not in lines[0]


def test_node_list_without_the_scheduler_shows_the_registrys_gpus_and_resources_uncounted(mock):
    mock.get(f"{REG}/nodes", json=REG_NODES)
    mock.get(f"{SCHED}/nodes", body=requests.ConnectionError("Connection refused"))
    result = corral("node", "list")
    lines = rows(result)
    assert "POOL" not in lines[0] and lines[0][-2:] == ["GPUS", "RESOURCES"]
    assert lines[1][-3:] == ["8", "A100", "fpga=2,licence.matlab=4"]
    assert lines[2][-2:] == ["-", "-"]
    assert result.stderr.startswith("corral: no pools or resources: cannot reach the scheduler")


def test_node_list_a_gpu_node_the_scheduler_has_not_synced_shows_the_registrys(mock):
    mock.get(f"{REG}/nodes", json=REG_NODES)
    mock.get(f"{SCHED}/nodes", json=SCHED_NODES[1:])
    lines = rows(corral("node", "list"))
    assert lines[1][0] == "gpu-1" and lines[1][-10:] == ["-"] * 7 + ["8", "A100", "fpga=2,licence.matlab=4"]


def test_node_list_json_is_the_registrys_answer_with_its_gpus(mock):
    mock.get(f"{REG}/nodes", json=REG_NODES)
    assert json.loads(corral("node", "list", "--json").stdout) == REG_NODES


# ---- node show ---------------------------------------------------------------------------------

def test_node_show_lists_each_gpu_with_the_job_it_is_reserved_for(mock):
    gpus = [device("0", job_id="job-7"), device("1"), device("2:1", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 4864,
                                                                 job_id="job-9")]
    node = scheduler_node("gpu-1", gpus, {"fpga": 2}, {"fpga": 1}, capacity=4,
                          labels={"gpu.count": "3", "pool": "gpu"}, pool="gpu")
    mock.get(f"{SCHED}/nodes", json=[SCHED_NODES[1], node])
    result = corral("node", "show", "gpu-1")
    assert result.exit_code == 0, result.output
    fields, devices = result.stdout.split("\n\n")
    pairs = {line.split(None, 1)[0]: line.split(None, 1)[1] for line in fields.splitlines()}
    assert pairs["node_id"] == "gpu-1" and pairs["status"] == "healthy" and pairs["pool"] == "gpu"
    assert pairs["labels"] == "gpu.count=3,pool=gpu"
    assert pairs["slots"] == "1 used of 4 (advertises 8)"
    assert pairs["memory"] == "1024M reserved of 3584M, 300M used"
    assert pairs["cpu"] == "100% reserved of 400%, 42% used"
    assert pairs["gpus"] == "2 of 3 reserved"
    assert pairs["resources"] == "fpga 1 of 2 reserved"
    assert pairs["last_heartbeat"] == "2026-11-29 11:59:58Z (2s ago)"
    lines = [line.split() for line in devices.splitlines()]
    assert lines[0] == ["INDEX", "MODEL", "MEMORY", "UUID", "JOB"]
    assert lines[1] == ["0", "NVIDIA", "A100-SXM4-80GB", "81920", "MB", "GPU-0-5fd4c4a2", "job-7"]
    assert lines[2] == ["1", "NVIDIA", "A100-SXM4-80GB", "81920", "MB", "GPU-1-5fd4c4a2", "free"]
    assert lines[3] == ["2:1", "NVIDIA", "A100-SXM4-40GB", "MIG", "1g.5gb", "4864", "MB", "GPU-2-1-5fd4c4a2",
                        "job-9"]
    assert result.stderr == ""


def test_node_show_of_a_node_without_gpus_says_none(mock):
    mock.get(f"{SCHED}/nodes", json=SCHED_NODES)
    result = corral("node", "show", "cpu-1")
    assert result.exit_code == 0, result.output
    lines = [line.split(None, 1) for line in result.stdout.splitlines()]
    assert ["gpus", "none"] in lines and ["resources", "none"] in lines
    assert ["slots", "1 used of 8"] in lines
    assert "INDEX" not in result.stdout and "\n\n" not in result.stdout


def test_node_show_json_is_the_schedulers_node(mock):
    mock.get(f"{SCHED}/nodes", json=SCHED_NODES)
    assert json.loads(corral("node", "show", "gpu-1", "--json").stdout) == SCHED_NODES[0]


def test_node_show_of_a_node_the_scheduler_does_not_list_is_one_line(mock):
    mock.get(f"{SCHED}/nodes", json=SCHED_NODES)
    assert one_line_error(corral("node", "show", "nope")) == (
        "corral: nope: no node 'nope' in the scheduler's node list (`corral node list` shows the registry's)")


def test_node_show_when_the_scheduler_refuses_is_its_message(mock):
    mock.get(f"{SCHED}/nodes", json={"error": "the token is not valid"}, status=401)
    assert one_line_error(corral("node", "show", "gpu-1")) == (
        "corral: gpu-1: the token is not valid (check --token / CORRAL_TOKEN)")


# ---- job status ----------------------------------------------------------------------------------

def job_pairs(result) -> dict[str, str]:
    assert result.exit_code == 0, result.output
    fields = result.stdout.split("\n\n")[0]
    return {line.split(None, 1)[0]: line.split(None, 1)[1] for line in fields.splitlines()}


def test_job_status_shows_the_gpus_it_asks_for_and_the_devices_reserved_for_it(mock):
    job = a_job(status="running", gpus=2, gpu_model="a100", gpu_memory_mb=40960, resources={"fpga": 1, "licence": 2},
                gpus_assigned=["GPU-0-5fd4c4a2", "GPU-1-5fd4c4a2"])
    mock.get(f"{SCHED}/jobs/job-7", json=job)
    mock.get(f"{SCHED}/jobs/job-7/events", json=[])
    pairs = job_pairs(corral("job", "status", "job-7"))
    assert pairs["gpus"] == "2"
    assert pairs["gpu_model"] == "a100"
    assert pairs["gpu_memory_mb"] == "40960 MB or more each"
    assert pairs["resources"] == "fpga=1, licence=2"
    assert pairs["gpus_assigned"] == "GPU-0-5fd4c4a2, GPU-1-5fd4c4a2"


def test_job_status_of_a_pending_gpu_job_has_no_devices_yet(mock):
    job = a_job(gpus=1, gpu_model=None, gpu_memory_mb=None, resources={}, gpus_assigned=None)
    mock.get(f"{SCHED}/jobs/job-7", json=job)
    mock.get(f"{SCHED}/jobs/job-7/events", json=[])
    pairs = job_pairs(corral("job", "status", "job-7"))
    assert pairs["gpus"] == "1"
    assert not {"gpu_model", "gpu_memory_mb", "resources", "gpus_assigned"} & set(pairs)


def test_job_status_of_a_job_without_gpus_or_resources_leaves_those_fields_out(mock):
    job = a_job(gpus=0, gpu_model=None, gpu_memory_mb=None, resources={}, gpus_assigned=None)
    mock.get(f"{SCHED}/jobs/job-7", json=job)
    mock.get(f"{SCHED}/jobs/job-7/events", json=[])
    result = corral("job", "status", "job-7")
    pairs = job_pairs(result)
    assert pairs["job_id"] == "job-7"
    assert not {"gpus", "gpu_model", "gpu_memory_mb", "resources", "gpus_assigned"} & set(pairs)
    assert "gpu" not in result.stdout
    assert json.loads(corral("job", "status", "job-7", "--json").stdout) == job


def test_job_status_of_a_multi_node_job_lists_its_members_and_a_member_its_place(mock):
    members = [{"job_id": f"job-{8 + rank}", "attempt": 1, "rank": rank, "node_id": f"gpu-{rank + 1}",
                "status": status, "exit_code": code, "ended_by": ended, "stdout_tail": None, "stderr_tail": None}
               for rank, (status, code, ended) in enumerate([("cancelled", None, "cancel"), ("failed", 3, "exit")])]
    job = a_job(status="failed", nodes=2, gpus=8, members=members)
    mock.get(f"{SCHED}/jobs/job-7", json=job)
    mock.get(f"{SCHED}/jobs/job-7/events", json=[])
    result = corral("job", "status", "job-7")
    pairs = job_pairs(result)
    assert pairs["nodes"] == "2" and "members" not in pairs
    table = result.stdout.split("\n\n")[1].splitlines()
    assert table[0].split() == ["ATTEMPT", "RANK", "MEMBER", "NODE", "STATUS", "EXIT", "ENDED", "BY"]
    assert [row.split() for row in table[1:]] == [["1", "0", "job-8", "gpu-1", "cancelled", "-", "cancel"],
                                                  ["1", "1", "job-9", "gpu-2", "failed", "3", "exit"]]

    member = a_job(status="running", nodes=2, gang={"gang_id": "job-7", "size": 2, "rank": 1,
                                                    "hosts": ["10.0.0.1", "10.0.0.2"], "master_addr": "10.0.0.1",
                                                    "master_port": 29500})
    mock.get(f"{SCHED}/jobs/job-9", json=member)
    mock.get(f"{SCHED}/jobs/job-9/events", json=[])
    assert job_pairs(corral("job", "status", "job-9"))["gang"] == "rank 1 of 2 in job-7, master 10.0.0.1:29500"
    # A job of one node shows neither.
    mock.get(f"{SCHED}/jobs/job-5", json=a_job(nodes=1))
    mock.get(f"{SCHED}/jobs/job-5/events", json=[])
    assert not {"nodes", "gang", "members"} & set(job_pairs(corral("job", "status", "job-5")))
