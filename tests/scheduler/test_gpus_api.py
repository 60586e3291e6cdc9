"""GPUs and other countable resources through the scheduler's API, on each database: a
request's fields checked, the devices reserved at placement and shown on the job, its
claim and its node; the next job placed when they are freed; why a job waits; and the
GPU seconds its team is charged."""
import pytest

from scheduler_app import end_attempt, submit
from corral.scheduler.service import Scheduler

A100 = "NVIDIA A100-SXM4-80GB"
DEVICES = [{"index": "0", "uuid": "GPU-aaaa0000", "model": A100, "memory_mb": 81920},
           {"index": "1", "uuid": "GPU-aaaa1111", "model": A100, "memory_mb": 81920}]


def sync(store, clock, gpus=DEVICES, resources=None):
    """The registry's list as the background pass reads it (gpu-1 with GPUs, cpu-1 without), then a pass."""
    store.nodes.sync_nodes([
        {"node_id": "gpu-1", "address": "10.0.0.1", "kind": "compute", "slots": 8, "status": "healthy",
         "gpus": gpus, "resources": resources},
        {"node_id": "cpu-1", "address": "10.0.0.2", "kind": "compute", "slots": 8, "status": "healthy"}], clock())
    background(store, clock)


def background(store, clock):
    """What the background pass does: place, then keep the reasons of the jobs that wait
    (a submit's own placement on PostgreSQL looks at some nodes only, and keeps none)."""
    Scheduler(store).place(clock())
    store.placing.explain(clock())


def test_gpu_jobs_get_their_own_devices_and_the_next_waits_until_one_is_freed(app, clock):
    client, store = app.test_client(), app.extensions["corral.store"]
    sync(store, clock)
    first = submit(client, command="train", gpus=1, gpu_model="a100")
    second = submit(client, command="train", gpus=1)
    third = submit(client, command="train", gpus=1)
    background(store, clock)
    assert (first["node_id"], second["node_id"]) == ("gpu-1", "gpu-1")
    assert first["gpus"] == 1 and first["gpu_model"] == "a100"
    assert {first["gpus_assigned"][0], second["gpus_assigned"][0]} == {"GPU-aaaa0000", "GPU-aaaa1111"}
    waiting = client.get(f"/jobs/{third['job_id']}").json
    assert waiting["node_id"] is None and waiting["gpus_assigned"] is None
    assert waiting["pending_reason"]["code"] == "no_capacity"
    assert waiting["pending_reason"]["lacking"] == ["gpus"], waiting["pending_reason"]
    why = {n["node_id"]: n["lacks"] for n in client.get(f"/jobs/{third['job_id']}/why").json["closest_nodes"]}
    assert why["gpu-1"] == ["needs 1 free GPU, 0 free"]
    assert why["cpu-1"] == ["1 GPU (the node has 0 GPUs)"]

    nodes = {n["node_id"]: n for n in client.get("/nodes").json}
    holders = {g["uuid"]: g["job_id"] for g in nodes["gpu-1"]["gpus"]}
    assert holders == {first["gpus_assigned"][0]: first["job_id"], second["gpus_assigned"][0]: second["job_id"]}
    assert nodes["cpu-1"]["gpus"] == []

    # The agent's claim carries the devices; the job's end frees its GPU for the next.
    claimed = client.post("/nodes/gpu-1/claim", json={"max": 8}).json
    by_id = {job["job_id"]: job for job in claimed}
    assert by_id[first["job_id"]]["gpus_assigned"] == first["gpus_assigned"]
    clock.now += 100
    end_attempt(client, first["job_id"])
    Scheduler(store).place(clock())
    moved = client.get(f"/jobs/{third['job_id']}").json
    assert moved["node_id"] == "gpu-1" and moved["gpus_assigned"] == first["gpus_assigned"]
    assert client.get(f"/jobs/{first['job_id']}").json["gpus_assigned"] is None  # ended: it holds none


def test_a_job_asking_for_more_gpus_than_any_node_has_waits_and_says_so(app, clock):
    client, store = app.test_client(), app.extensions["corral.store"]
    sync(store, clock)
    job = submit(client, command="x", gpus=4, gpu_memory_mb=40000)
    background(store, clock)
    assert job["node_id"] is None
    reason = client.get(f"/jobs/{job['job_id']}").json["pending_reason"]
    assert reason["code"] == "no_capacity" and reason["lacking"] == ["gpus"]
    assert "has 4 GPUs (40000 MB each)" in reason["message"]


def test_declared_resources_are_reserved_until_the_job_ends(app, clock):
    client, store = app.test_client(), app.extensions["corral.store"]
    sync(store, clock, gpus=None, resources={"fpga": 1})
    first = submit(client, command="x", resources={"fpga": 1})
    second = submit(client, command="x", resources={"fpga": 1})
    assert first["node_id"] == "gpu-1" and first["resources"] == {"fpga": 1}
    assert second["node_id"] is None
    node = next(n for n in client.get("/nodes").json if n["node_id"] == "gpu-1")
    assert node["resources"] == {"fpga": 1} and node["resources_reserved"] == {"fpga": 1}
    client.post("/nodes/gpu-1/claim", json={"max": 8})
    end_attempt(client, first["job_id"])
    Scheduler(store).place(clock())
    assert client.get(f"/jobs/{second['job_id']}").json["node_id"] == "gpu-1"


def test_an_ended_gpu_job_charges_its_team_gpu_seconds(app, clock):
    client, store = app.test_client(), app.extensions["corral.store"]
    sync(store, clock)
    job = submit(client, command="x", gpus=2)
    client.post("/nodes/gpu-1/claim", json={"max": 8})
    running_at = clock.now
    clock.now += 30
    end_attempt(client, job["job_id"])
    ended = client.get(f"/jobs/{job['job_id']}").json
    wall = clock.now - running_at
    rows = client.get("/usage", query_string={"group_by": "team"}).json["rows"]
    assert rows[0]["gpu_seconds"] == pytest.approx(2 * wall), (rows, ended)


@pytest.mark.parametrize("body, says", [
    ({"gpus": -1}, "'gpus'"),
    ({"gpus": True}, "'gpus'"),
    ({"gpus": 257}, "'gpus'"),
    ({"gpu_model": "a100"}, "give 'gpus' too"),
    ({"gpus": 0, "gpu_memory_mb": 100}, "give 'gpus' too"),
    ({"gpus": 1, "gpu_memory_mb": 0}, "'gpu_memory_mb'"),
    ({"gpus": 1, "gpu_model": ""}, "'gpu_model'"),
    ({"resources": {"gpus": 1}}, "may not name 'gpus'"),
    ({"resources": {"memory_mb": 1}}, "may not name 'memory_mb'"),
    ({"resources": {"FPGA": 1}}, "resource name"),
    ({"resources": {"fpga": 0}}, "'resources'"),
    ({"resources": {"fpga": 1.5}}, "'resources'"),
    ({"resources": {"fpga": "1"}}, "'resources'"),
    ({"resources": ["fpga"]}, "'resources'"),
    ({"resources": {f"r{i}": 1 for i in range(33)}}, "'resources'"),
])
def test_bad_gpu_and_resource_requests_are_refused_and_change_nothing(app, clock, body, says):
    client = app.test_client()
    answer = client.post("/jobs", json={"command": "x", **body})
    assert answer.status_code == 400, answer.json
    assert says in answer.json["error"], answer.json
    assert client.get("/jobs").json == []


def test_batches_arrays_and_schedules_carry_gpus_and_resources(app, clock):
    from corral.scheduler.schedule_loop import Firing

    client, store = app.test_client(), app.extensions["corral.store"]
    sync(store, clock, resources={"fpga": 4})
    asks = {"gpus": 1, "gpu_model": "A100", "resources": {"fpga": 1}}
    batch = client.post("/jobs/batch", json={"jobs": [{"command": "x", **asks}]})
    assert batch.status_code == 201, batch.json
    array = client.post("/jobs", json={"command": "x", "array": {"count": 2}, **asks}).json
    created = client.post("/schedules", json={"name": "nightly", "interval_secs": 60,
                                              "job": {"command": "x", **asks}})
    assert created.status_code == 201 and created.json["job"]["gpus"] == 1, created.json
    Firing(store, holder="t").tick(clock() + 60.5)
    run = client.get("/schedules/nightly/runs").json[0]
    ids = [batch.json[0]["job_id"],
           *(f"job-{i}" for i in range(int(array["first_job_id"][4:]), int(array["last_job_id"][4:]) + 1)),
           run["job_id"]]
    for job_id in ids:
        job = client.get(f"/jobs/{job_id}").json
        assert (job["gpus"], job["gpu_model"], job["resources"]) == (1, "A100", {"fpga": 1}), job
    # Two GPUs on gpu-1: two of these four hold one each, the others wait for theirs.
    background(store, clock)
    held = [job for job in (client.get(f"/jobs/{i}").json for i in ids) if job["gpus_assigned"]]
    assert len(held) == 2 and len({job["gpus_assigned"][0] for job in held}) == 2


def test_what_gpus_use_comes_with_renewals_and_reports(app, clock):
    client, store = app.test_client(), app.extensions["corral.store"]
    sync(store, clock)
    job = submit(client, command="train", gpus=1)
    client.post("/nodes/gpu-1/claim", json={"max": 8})
    renewed = client.post("/nodes/gpu-1/lease", json={"usage": {
        "memory_mb": 900, "cpu_percent": 80, "gpu_memory_mb": 30000, "gpu_utilization_percent": 87.5}})
    assert renewed.status_code == 200, renewed.json
    node = next(n for n in client.get("/nodes").json if n["node_id"] == "gpu-1")
    assert node["gpus_used"] == {"memory_mb": 30000, "utilization_percent": 87.5}
    assert node["used"] == {"memory_mb": 900, "cpu_percent": 80}
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'corral_node_gpu_memory_used_mb{node="gpu-1"} 30000' in metrics
    assert 'corral_node_gpu_utilization_percent{node="gpu-1"} 87.5' in metrics
    clock.now += 10
    assert client.get(f"/jobs/{job['job_id']}").json["gpu_seconds"] == pytest.approx(10.0)  # so far
    ended = client.post(f"/jobs/{job['job_id']}/status", json={
        "node_id": "gpu-1", "attempt": 1, "status": "done", "exit_code": 0, "peak_gpu_memory_mb": 31000,
        "gpu_utilization_percent": 91.2})
    assert ended.status_code == 200, ended.json
    final = client.get(f"/jobs/{job['job_id']}").json
    assert (final["peak_gpu_memory_mb"], final["gpu_utilization_percent"]) == (31000, 91.2)
    clock.now += 100
    assert client.get(f"/jobs/{job['job_id']}").json["gpu_seconds"] == pytest.approx(10.0)  # ended: whole
    # An older agent's renewal says nothing of GPUs: not read, not zero.
    client.post("/nodes/gpu-1/lease", json={"usage": {"memory_mb": 0, "cpu_percent": 0}})
    assert next(n for n in client.get("/nodes").json if n["node_id"] == "gpu-1")["gpus_used"] is None


@pytest.mark.parametrize("usage", [{"memory_mb": 0, "cpu_percent": 0, "gpu_utilization_percent": 101},
                                   {"memory_mb": 0, "cpu_percent": 0, "gpu_memory_mb": -1},
                                   {"memory_mb": 0, "cpu_percent": 0, "gpu_memory_mb": True}])
def test_impossible_gpu_figures_are_refused(app, clock, usage):
    client, store = app.test_client(), app.extensions["corral.store"]
    sync(store, clock)
    answer = client.post("/nodes/gpu-1/lease", json={"usage": usage})
    assert answer.status_code == 400 and "gpu_" in answer.json["error"], answer.json
