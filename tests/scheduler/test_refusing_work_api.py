"""A node whose agent takes no new work (short of disk space: its heartbeats' `refusing_work`,
copied from the registry's node list): placement treats it like a drained node, its placed and
unclaimed jobs go elsewhere, and the pending reason, GET /jobs/{id}/why and GET /nodes say why."""
import pytest

from scheduler_app import Clock, make_app, submit
from corral.scheduler.service import Scheduler

LOW = "only 812 MB free on the filesystem of /var/lib/corral/work, under AGENT_MIN_FREE_DISK_MB (1024 MB)"


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def app(database_url, clock):
    return make_app(database_url, clock, max_jobs_per_node=64)


def sync(store, clock, refusing=None):
    """The registry's list as the background pass reads it, then a placement pass, and the
    reasons kept."""
    store.nodes.sync_nodes([{"node_id": n, "address": "a", "kind": "compute", "slots": 64, "status": "healthy",
                             "drained": False, "refusing_work": refusing if n == "n1" else None}
                            for n in ("n1", "n2")], clock())
    Scheduler(store).place(clock())
    store.placing.explain(clock())


def test_a_node_refusing_work_gets_none_its_placed_jobs_go_elsewhere_and_the_reason_says_why(app, clock):
    client, store = app.test_client(), app.extensions["corral.store"]
    sync(store, clock)
    placed = submit(client, command="x", instance_id="n1")      # placed on n1, not yet claimed
    free = [submit(client, command="x") for _ in range(2)]
    assert {j["node_id"] for j in free} == {"n1", "n2"}
    on_n1 = next(j for j in free if j["node_id"] == "n1")

    sync(store, clock, refusing=LOW)
    nodes = {n["node_id"]: n for n in client.get("/nodes").json}
    assert nodes["n1"]["refusing_work"] == LOW and nodes["n2"]["refusing_work"] is None
    assert nodes["n1"]["status"] == "healthy" and nodes["n1"]["drained"] is False
    # What was placed there and not claimed went back to the queue, and then elsewhere.
    assert client.get(f"/jobs/{on_n1['job_id']}").json["node_id"] == "n2"
    events = client.get(f"/jobs/{on_n1['job_id']}/events").json
    assert any(f"n1 takes no new work: {LOW}" in (e["reason"] or "") for e in events)
    assert {submit(client)["node_id"] for _ in range(6)} == {"n2"}
    # The job pinned there waits, and says why.
    waiting = client.get(f"/jobs/{placed['job_id']}").json
    assert waiting["node_id"] is None
    assert waiting["pending_reason"]["code"] == "node_refusing_work"
    assert "n1" in waiting["pending_reason"]["message"] and LOW in waiting["pending_reason"]["message"]
    assert waiting["pending_reason"]["node_ids"] == ["n1"]
    listed = client.get("/jobs?pending_reason=node_refusing_work").json
    assert [j["job_id"] for j in listed] == [placed["job_id"]]
    why = client.get(f"/jobs/{placed['job_id']}/why").json
    n1 = next(n for n in why["closest_nodes"] if n["node_id"] == "n1")
    assert f"the node takes no new work: {LOW}" in n1["lacks"]

    # Space is back: the next list (its heartbeat says nothing) lets it take work again.
    sync(store, clock)
    assert client.get(f"/jobs/{placed['job_id']}").json["node_id"] == "n1"
    assert {n["node_id"]: n["refusing_work"] for n in client.get("/nodes").json} == {"n1": None, "n2": None}


def test_a_registry_of_the_previous_release_lists_no_refusing_work_and_its_nodes_take_work(app, clock):
    client, store = app.test_client(), app.extensions["corral.store"]
    store.nodes.sync_nodes([{"node_id": "n1", "address": "a", "kind": "compute", "slots": 4, "status": "healthy"}],
                           clock())
    assert submit(client)["node_id"] == "n1"
    assert client.get("/nodes").json[0]["refusing_work"] is None
