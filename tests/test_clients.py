"""The HTTP clients, against the `responses` mock of requests."""
import json

import pytest
import requests
import responses

from corral.shared.clients import RegistryClient, Rejected, SchedulerClient, Unreachable, split_batches

REG = "http://registry.test"
SCHED = "http://scheduler.test"


@responses.activate
def test_registry_calls_and_token():
    responses.post(f"{REG}/nodes", json={"node_id": "n1"}, status=201)
    responses.post(f"{REG}/nodes/n1/heartbeat", json={"status": "healthy"})
    responses.get(f"{REG}/nodes", json=[{"node_id": "n1"}])
    client = RegistryClient(REG + "/", token="s3cret")
    assert client.register_node({"node_id": "n1"}) == {"node_id": "n1"}
    assert client.heartbeat("n1", running=2) == {"status": "healthy"}
    assert client.list_nodes(kind="compute", status="healthy") == [{"node_id": "n1"}]
    calls = responses.calls
    assert calls[1].request.body == b'{"running": 2}'
    assert calls[2].request.url == f"{REG}/nodes?type=compute&status=healthy"
    assert all(c.request.headers["Authorization"] == "Bearer s3cret" for c in calls)


@responses.activate
def test_scheduler_poll_and_report():
    responses.get(f"{SCHED}/jobs", json=[{"job_id": "job-1"}])
    responses.post(f"{SCHED}/jobs/job-1/status", json={"status": "done"})
    client = SchedulerClient(SCHED)
    assert client.pending_for("n1") == [{"job_id": "job-1"}]
    assert responses.calls[0].request.url == f"{SCHED}/jobs?node_id=n1&status=pending"
    client.report("job-1", "n1", 3, "done", exit_code=0, stdout="hi")
    import json
    assert json.loads(responses.calls[1].request.body) == {
        "node_id": "n1", "attempt": 3, "status": "done", "exit_code": 0, "stdout": "hi"}


@responses.activate
def test_4xx_is_rejected_with_the_servers_message():
    responses.post(f"{SCHED}/jobs/job-1/status", json={"error": "attempt 1 is stale"}, status=409)
    with pytest.raises(Rejected) as err:
        SchedulerClient(SCHED).report("job-1", "n1", 1, "running")
    assert err.value.status == 409 and err.value.message == "attempt 1 is stale"


@responses.activate
@pytest.mark.parametrize("failure", [
    dict(status=503, json={"error": "busy"}),
    dict(body=requests.ConnectionError("refused")),
    dict(body=requests.Timeout("slow")),
    dict(status=200, body="<html>proxy</html>"),
])
def test_network_errors_5xx_and_garbage_are_unreachable(failure):
    responses.get(f"{REG}/nodes", **failure)
    with pytest.raises(Unreachable):
        RegistryClient(REG).list_nodes()


def test_every_call_has_a_timeout(monkeypatch):
    seen = {}

    def fake_request(self, method, url, **kwargs):
        seen["timeout"] = kwargs.get("timeout")
        raise requests.ConnectionError("no")

    monkeypatch.setattr(requests.Session, "request", fake_request)
    with pytest.raises(Unreachable):
        SchedulerClient(SCHED).get_job("job-1")
    assert seen["timeout"] is not None


def test_batches_are_cut_by_count_and_by_size():
    items = [{"n": n, "pad": "x" * 40} for n in range(7)]
    assert split_batches([], lambda e: e, 3, 10_000) == []
    assert [[e["n"] for e in b] for b in split_batches(items, lambda e: e, 3, 10_000)] == [[0, 1, 2], [3, 4, 5], [6]]
    one = len(json.dumps(items[0]))
    assert [[e["n"] for e in b] for b in split_batches(items, lambda e: e, 100, 2 * one)] == [
        [0, 1], [2, 3], [4, 5], [6]]
    assert [len(b) for b in split_batches(items[:2], lambda e: e, 100, 1)] == [1, 1]  # too large: alone
