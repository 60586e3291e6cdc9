"""GPUs end to end, with real processes on each database: an agent declares its GPUs
(AGENT_GPUS, a JSON file: this machine has none to discover) and its resources; the
registry and the scheduler list them; a job that asks for one is given one, sees its
UUID in CUDA_VISIBLE_DEVICES and is shown on its node's GPU; two one-GPU jobs on a
one-GPU node run one after the other; a job without GPUs sees none; a job asking for
more than any node has waits and says why."""
import json

import pytest
import requests

from helpers import wait_for
from corral.shared.timeutil import epoch

pytestmark = pytest.mark.e2e

UUID = "GPU-0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"


def declare(tmp_path, *uuids):
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps([{"index": str(i), "uuid": uuid, "model": "NVIDIA A100-SXM4-80GB",
                                 "memory_mb": 81920} for i, uuid in enumerate(uuids)]))
    return str(path)


def test_gpu_jobs_get_their_device_and_queue_for_it(backend_cluster, tmp_path):
    c = backend_cluster
    c.start_agent("gpu-node", slots=2, AGENT_GPUS=declare(tmp_path, UUID), AGENT_RESOURCES="fpga=1")
    c.wait_nodes_healthy("gpu-node")
    registered = requests.get(f"{c.registry_url}/nodes/gpu-node", timeout=5).json()
    assert [g["uuid"] for g in registered["gpus"]] == [UUID] and registered["resources"] == {"fpga": 1}
    assert registered["labels"]["gpu.model"] == "NVIDIA A100-SXM4-80GB" and registered["labels"]["gpu.count"] == "1"
    wait_for(lambda: any(n["gpus"] for n in requests.get(f"{c.scheduler_url}/nodes", timeout=5).json()),
             message="the scheduler's node list to show the GPU")

    show = 'echo "$CUDA_VISIBLE_DEVICES|$NVIDIA_VISIBLE_DEVICES|$CUDA_DEVICE_ORDER"'
    first = c.submit(command=f"{show}; sleep 1", gpus=1, gpu_model="a100")
    second = c.submit(command=f"{show}; sleep 1", gpus=1)
    plain = c.submit(command=show)
    too_many = c.submit(command="true", gpus=2)
    running = c.wait_status(first["job_id"], "running")
    assert running["gpus_assigned"] == [UUID]
    node = next(n for n in requests.get(f"{c.scheduler_url}/nodes", timeout=5).json() if n["node_id"] == "gpu-node")
    assert [(g["uuid"], g["job_id"]) for g in node["gpus"]] == [(UUID, first["job_id"])]

    done = [c.wait_status(job["job_id"], "done", timeout=30) for job in (first, second, plain)]
    assert done[0]["stdout"] == done[1]["stdout"] == f"{UUID}|{UUID}|PCI_BUS_ID\n"
    assert done[2]["stdout"] == "|void|PCI_BUS_ID\n"
    # One GPU: the second started once the first had ended.
    assert epoch(done[1]["running_at"]) >= epoch(done[0]["finished_at"]), done
    waiting = c.job(too_many["job_id"])
    assert waiting["status"] == "pending" and waiting["node_id"] is None
    wait_for(lambda: (c.job(too_many["job_id"])["pending_reason"] or {}).get("lacking") == ["gpus"],
             message="the reason of a job asking for more GPUs than any node has")
    usage = requests.get(f"{c.scheduler_url}/usage", params={"group_by": "team"}, timeout=5).json()["rows"]
    assert usage[0]["gpu_seconds"] >= 2.0, usage  # two jobs of a second or more, one GPU each
