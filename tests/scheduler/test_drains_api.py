"""Draining through the scheduler (POST /nodes/{id}/drain, /undrain): in force for
placement from the answer on, before any refresh of the node list, and not undone by a
node list fetched before it. The registry is mocked with `responses`."""
import pytest
import requests
import responses

from scheduler_app import Clock, make_app, set_nodes, submit
from corral.scheduler.service import Scheduler

REGISTRY = "http://registry.test"


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def app(database_url, clock):
    return make_app(database_url, clock, max_jobs_per_node=64, registry_url=REGISTRY)


@pytest.fixture
def registry():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        for action in ("drain", "undrain"):
            mock.add(responses.POST, f"{REGISTRY}/nodes/n1/{action}",
                     json={"node_id": "n1", "drained": action == "drain"})
        mock.add(responses.POST, f"{REGISTRY}/nodes/nope/drain", json={"error": "no node 'nope'"}, status=404)
        yield mock


def listed(drained=False):
    """The registry's list as the background pass reads it."""
    return [{"node_id": n, "address": "a", "kind": "compute", "slots": 64, "status": "healthy",
             "drained": drained and n == "n1"} for n in ("n1", "n2")]


def test_a_drain_holds_for_placement_from_its_answer_before_any_refresh(app, clock, registry):
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1", "n2", slots=64)
    placed_before = submit(client, command="x", instance_id="n1")     # placed, not yet claimed
    assert placed_before["node_id"] == "n1"
    answer = client.post("/nodes/n1/drain", json={})
    assert answer.status_code == 200 and answer.json == {"node_id": "n1", "drained": True}
    assert registry.calls[-1].request.url == f"{REGISTRY}/nodes/n1/drain"   # the registry's flag too
    # No refresh of the node list has happened: every job from now on avoids n1.
    assert {submit(client)["node_id"] for _ in range(6)} == {"n2"}
    # Its placed, unclaimed job went back to the queue (pinned there: it waits).
    assert client.get(f"/jobs/{placed_before['job_id']}").json["node_id"] is None
    assert "n1 is drained" in client.get(f"/jobs/{placed_before['job_id']}/events").json[-1]["reason"]
    nodes = {n["node_id"]: n for n in client.get("/nodes").json}
    assert nodes["n1"]["drained"] is True and nodes["n2"]["drained"] is False


def test_a_node_list_fetched_before_the_drain_does_not_undo_it(app, clock, registry):
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1", "n2", slots=64)
    seen = store.nodes.drain_count()                      # the background pass reads this, then the list ...
    assert client.post("/nodes/n1/drain", json={}).status_code == 200
    store.nodes.sync_nodes(listed(drained=False), clock(), seen)   # ... which predates the registry's write
    Scheduler(store).place(clock())
    assert {submit(client)["node_id"] for _ in range(4)} == {"n2"}
    # A list fetched after it carries the registry's flag; the undrain holds likewise.
    store.nodes.sync_nodes(listed(drained=True), clock(), store.nodes.drain_count())
    seen = store.nodes.drain_count()
    assert client.post("/nodes/n1/undrain", json={}).json == {"node_id": "n1", "drained": False}
    store.nodes.sync_nodes(listed(drained=True), clock(), seen)
    assert "n1" in {submit(client)["node_id"] for _ in range(8)}
    # Once the registry's list is newer than every drain, it is the word on the node again.
    store.nodes.sync_nodes(listed(drained=True), clock(), store.nodes.drain_count())
    assert {submit(client)["node_id"] for _ in range(4)} == {"n2"}


def test_a_drain_the_registry_cannot_take_changes_nothing(app, clock, registry):
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1", "n2", slots=64)
    registry.replace(responses.POST, f"{REGISTRY}/nodes/n1/drain", body=requests.ConnectionError("refused"))
    refused = client.post("/nodes/n1/drain", json={})
    assert refused.status_code == 503 and "nothing was changed" in refused.json["error"]
    assert "n1" in {submit(client)["node_id"] for _ in range(4)}
    unknown = client.post("/nodes/nope/drain", json={})
    assert unknown.status_code == 404 and unknown.json["error"] == "no node 'nope'"
    bad = client.post("/nodes/bad%20id/drain", json={})
    assert bad.status_code == 400 and "node id" in bad.json["error"]
