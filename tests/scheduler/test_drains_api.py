"""Draining through the scheduler (POST /nodes/{id}/drain, /undrain): in force for
placement from the answer on, before any refresh of the node list, and not undone by a
node list fetched before it. The registry is mocked with `responses`."""
import pytest
import requests
import responses

from scheduler_app import Clock, make_app, set_nodes, submit
from corral.scheduler.service import Scheduler
from corral.shared.timeutil import epoch

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
    assert answer.status_code == 200
    assert answer.json == {"node_id": "n1", "drained": True, "deadline": None, "stopping": 0}
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
    assert client.post("/nodes/n1/undrain", json={}).json == {"node_id": "n1", "drained": False, "deadline": None,
                                                              "stopping": 0}
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


# ---- a drain with a deadline -----------------------------------------------------------------

def running(client, node_id="n1", **request):
    job = submit(client, command="sleep 1000", instance_id=node_id, **request)
    body = {"node_id": node_id, "attempt": job["attempt"], "status": "running"}
    assert client.post(f"/jobs/{job['job_id']}/status", json=body).status_code == 200
    return client.get(f"/jobs/{job['job_id']}").json


def lease(client, node_id="n1") -> dict:
    """What the node's agent is told at its next renewal: attempt -> the stop asked of it."""
    answer = client.post(f"/nodes/{node_id}/lease", json={})
    assert answer.status_code == 200, answer.json
    return {(r["job_id"], r["attempt"]): r.get("stop") for r in answer.json["running"]}


def test_a_drain_with_a_deadline_stops_what_the_node_runs_then_and_requeues_it(app, clock, registry):
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1", "n2", slots=64)
    job = running(client, max_retries=0)
    other = running(client, "n2")
    answer = client.post("/nodes/n1/drain", json={"deadline_secs": 600})
    assert answer.status_code == 200, answer.json
    assert answer.json["stopping"] == 1 and epoch(answer.json["deadline"]) == pytest.approx(clock() + 600)
    shown = client.get(f"/jobs/{job['job_id']}").json
    assert shown["stop_reason"] == "drain" and epoch(shown["stop_at"]) == pytest.approx(clock() + 600)
    assert client.get(f"/jobs/{other['job_id']}").json["stop_reason"] is None
    assert lease(client) == {(job["job_id"], 1): None}  # not yet
    clock.now += 600
    assert lease(client) == {(job["job_id"], 1): "drain"}
    # The agent stops it and reports it given up for the drain: back to the queue, no retry spent.
    body = {"node_id": "n1", "attempt": 1, "status": "failed", "exit_code": -1, "requeue": True, "ended_by": "drain"}
    ended = client.post(f"/jobs/{job['job_id']}/status", json=body).json
    assert (ended["status"], ended["ended_by"], ended["retry_count"], ended["node_losses"]) == (
        "pending", "drain", 0, 0), ended
    reasons = [event["reason"] for event in client.get(f"/jobs/{job['job_id']}/events").json]
    assert "the drain of its node reached its deadline; requeued" in reasons, reasons


def test_an_undrain_takes_the_stops_back(app, clock, registry):
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1", slots=64)
    job = running(client)
    client.post("/nodes/n1/drain", json={"deadline_secs": 60})
    assert client.post("/nodes/n1/undrain", json={}).json["stopping"] == 0
    clock.now += 3600
    assert lease(client) == {(job["job_id"], 1): None}
    assert client.get(f"/jobs/{job['job_id']}").json["stop_reason"] is None


def test_a_job_whose_agent_never_reports_the_stop_is_requeued_by_the_scheduler(app, clock, registry):
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1", slots=64)
    job = running(client, kill_grace_secs=30)
    client.post("/nodes/n1/drain", json={"deadline_secs": 0})
    late = 30 + store.settings.heartbeat_timeout_secs
    clock.now += late - 1
    with store.db.connection_context():
        assert store.actions.requeue_unstopped(clock()) == []
    clock.now += 2
    with store.db.connection_context():
        assert store.actions.requeue_unstopped(clock()) == [job["job_id"]]
    requeued = client.get(f"/jobs/{job['job_id']}").json
    assert (requeued["status"], requeued["ended_by"], requeued["retry_count"]) == ("pending", "drain", 0)
    assert lease(client) == {}  # the agent, told it runs nothing there, kills what it still runs


@pytest.mark.parametrize("body", [{"deadline_secs": -1}, {"deadline_secs": "10m"}, {"deadline_secs": 31 * 86400},
                                  {"deadline": 60}, [], {"deadline_secs": None, "x": 1}])
def test_a_bad_drain_body_is_refused_and_drains_nothing(app, clock, registry, body):
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1", slots=64)
    answer = client.post("/nodes/n1/drain", json=body)
    assert answer.status_code == 400, answer.json
    assert len(registry.calls) == 0 and client.get("/nodes").json[0]["drained"] is False

