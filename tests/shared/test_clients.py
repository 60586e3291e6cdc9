"""The HTTP clients, against the `responses` mock of requests."""
import json

import pytest
import requests
import responses
import urllib3

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


# ---- several URLs of one service: failover ---------------------------------------------------

A, B, C = "http://a.test:9001", "http://b.test:9001", "http://c.test:9001"


def refused(url: str) -> requests.ConnectionError:
    """What requests raises for a refused connection (the request never left)."""
    return requests.ConnectionError(urllib3.exceptions.MaxRetryError(
        None, url, urllib3.exceptions.NewConnectionError(None, "Failed to establish a new connection: "
                                                               "[Errno 111] Connection refused")))


def hosts() -> list[str]:
    """The servers the calls went to, in order."""
    return [c.request.url.split("/")[2] for c in responses.calls]


def test_a_comma_separated_string_is_the_url_list_and_one_url_works_as_before():
    assert SchedulerClient(f" {A}/, {B} ,").base_urls == [A, B]
    assert SchedulerClient([A + "/", B]).base_urls == [A, B]
    one = SchedulerClient(A + "/")
    assert (one.base_urls, one.base_url) == ([A], A)
    with pytest.raises(ValueError):
        SchedulerClient(" , ")


@responses.activate
@pytest.mark.parametrize("failure", [
    dict(body=refused(f"{A}/jobs/job-1")),
    dict(body=requests.ConnectTimeout("connect timed out")),
    dict(body=requests.ReadTimeout("read timed out")),
    dict(status=500, json={"error": "internal error"}),
    dict(status=503, json={"error": "unavailable"}),
    dict(status=502, body="bad gateway"),
], ids=["refused", "connect-timeout", "read-timeout", "500", "503", "502"])
def test_a_failed_url_passes_the_call_to_the_next_which_stays_current(failure):
    responses.get(f"{A}/jobs/job-1", **failure)
    responses.get(f"{B}/jobs/job-1", json={"job_id": "job-1"})
    responses.get(f"{B}/jobs/job-2", json={"job_id": "job-2"})
    client = SchedulerClient(f"{A},{B}")
    assert client.get_job("job-1") == {"job_id": "job-1"}
    assert client.base_url == B
    assert client.get_job("job-2") == {"job_id": "job-2"}  # sticky: B first, A is not asked again
    assert hosts() == ["a.test:9001", "b.test:9001", "b.test:9001"]


@responses.activate
@pytest.mark.parametrize("status", [400, 404, 409])
def test_a_4xx_is_an_answer_and_no_other_url_is_asked(status):
    responses.post(f"{A}/jobs/job-1/status", json={"error": "attempt 1 is stale"}, status=status)
    client = SchedulerClient([A, B])
    with pytest.raises(Rejected) as err:
        client.report("job-1", "n1", 1, "done")
    assert err.value.status == status and hosts() == ["a.test:9001"] and client.base_url == A


@responses.activate
def test_each_url_once_per_call_in_order_from_the_current_one_wrapping_around():
    client = RegistryClient([A, B, C])
    responses.get(f"{A}/nodes", body=refused(A))
    responses.get(f"{B}/nodes", json=[])
    assert client.list_nodes() == [] and client.base_url == B
    responses.get(f"{B}/nodes", status=503)  # from now on B fails too
    responses.get(f"{C}/nodes", body=refused(C))
    responses.get(f"{A}/nodes", json=[{"node_id": "n1"}])  # A is back
    responses.calls.reset()
    assert client.list_nodes() == [{"node_id": "n1"}]
    assert hosts() == ["b.test:9001", "c.test:9001", "a.test:9001"] and client.base_url == A


@responses.activate
def test_every_url_down_is_unreachable_naming_each_with_its_reason():
    responses.get(f"{A}/jobs/job-1", body=refused(A))
    responses.get(f"{B}/jobs/job-1", status=503)
    client = SchedulerClient([A, B])
    with pytest.raises(Unreachable) as err:
        client.get_job("job-1")
    assert err.value.tried == [(A, "connection refused"), (B, "HTTP 503")]
    assert str(err.value) == f"GET /jobs/job-1: {A}: connection refused; {B}: HTTP 503"
    assert hosts() == ["a.test:9001", "b.test:9001"]  # each once
    assert client.base_url == A  # the next call starts where this one did


@responses.activate
def test_one_url_down_keeps_the_single_url_message():
    responses.get(f"{A}/jobs/job-1", body=refused(A))
    with pytest.raises(Unreachable) as err:
        SchedulerClient(A).get_job("job-1")
    assert (err.value.base_url, err.value.reason, err.value.tried) == (A, "connection refused",
                                                                       [(A, "connection refused")])
    assert str(err.value) == f"GET {A}/jobs/job-1: connection refused"


@responses.activate
def test_a_submit_resent_after_a_lost_answer_carries_the_same_idempotency_key():
    responses.post(f"{A}/jobs", body=requests.ReadTimeout("read timed out"))
    responses.post(f"{B}/jobs", json={"job_id": "job-1"}, status=200)  # the job A created
    client = SchedulerClient([A, B])
    assert client.submit({"command": "true"}) == {"job_id": "job-1"}
    first, resent = (c.request.headers["Idempotency-Key"] for c in responses.calls)
    assert first == resent and len(first) == 36
    client.submit({"command": "true"})
    assert responses.calls[-1].request.headers["Idempotency-Key"] != first  # a new submit, a new key
    client.submit({"command": "true"}, idempotency_key="etl-1")
    assert responses.calls[-1].request.headers["Idempotency-Key"] == "etl-1"


@responses.activate
def test_a_batch_resent_after_a_lost_answer_carries_the_same_idempotency_key():
    responses.post(f"{A}/jobs/batch", body=requests.ConnectionError("Connection aborted."))
    responses.post(f"{B}/jobs/batch", json=[{"job_id": "job-1"}, {"job_id": "job-2"}])
    assert len(SchedulerClient([A, B]).submit_batch([{"command": "a"}, {"command": "b"}])) == 2
    keys = {c.request.headers["Idempotency-Key"] for c in responses.calls}
    assert len(keys) == 1 and len(responses.calls) == 2


CLAIM = dict(node_id="n1", max_jobs=2, wait_secs=20)


@responses.activate
@pytest.mark.parametrize("lost", [
    dict(body=requests.ReadTimeout("read timed out")),
    dict(body=requests.ConnectionError("Connection aborted.")),
    dict(status=504, body="gateway timeout"),
    dict(status=502, body="bad gateway"),
], ids=["read-timeout", "dropped", "504", "502"])
def test_a_claim_whose_answer_was_lost_is_not_resent_and_the_next_claim_goes_elsewhere(lost):
    """It may have handed out jobs: the agent renews its lease at once to hear of them."""
    responses.post(f"{A}/nodes/n1/claim", **lost)
    responses.post(f"{B}/nodes/n1/claim", json=[{"job_id": "job-1", "attempt": 1}])
    client = SchedulerClient([A, B])
    with pytest.raises(Unreachable) as err:
        client.claim(**CLAIM)
    assert [url for url, _ in err.value.tried] == [A] and hosts() == ["a.test:9001"]
    assert client.claim(**CLAIM).jobs == [{"job_id": "job-1", "attempt": 1}]
    assert hosts() == ["a.test:9001", "b.test:9001"] and client.base_url == B


@responses.activate
@pytest.mark.parametrize("not_done", [
    dict(body=refused(A)), dict(body=requests.ConnectTimeout("connect timed out")), dict(status=503),
], ids=["refused", "connect-timeout", "503"])
def test_a_claim_that_surely_did_nothing_goes_on_to_the_next_url(not_done):
    responses.post(f"{A}/nodes/n1/claim", **not_done)
    responses.post(f"{B}/nodes/n1/claim", json=[])
    assert SchedulerClient([A, B]).claim(**CLAIM).jobs == []
    assert hosts() == ["a.test:9001", "b.test:9001"]


def test_a_long_poll_claim_waits_its_whole_wait_on_each_url(monkeypatch):
    seen = []

    def fake_request(self, method, url, **kwargs):
        seen.append((url, kwargs["timeout"]))
        raise refused(url)

    monkeypatch.setattr(requests.Session, "request", fake_request)
    with pytest.raises(Unreachable):
        SchedulerClient([A, B], timeout=(2.0, 5.0)).claim(**CLAIM)
    assert seen == [(f"{A}/nodes/n1/claim", (2.0, 30.0)), (f"{B}/nodes/n1/claim", (2.0, 30.0))]


@responses.activate
def test_reports_are_resent_after_a_lost_answer_but_not_with_a_claim_riding_on_them():
    report = {"job_id": "job-1", "node_id": "n1", "attempt": 1, "status": "done"}
    responses.post(f"{A}/jobs/reports", body=requests.ReadTimeout("read timed out"))
    responses.post(f"{B}/jobs/reports", json={"results": [{"code": 409, "error": "job-1 is done"}]})
    client = SchedulerClient([A, B])
    assert client.report_batch([report]) == [{"code": 409, "error": "job-1 is done"}]
    assert hosts() == ["a.test:9001", "b.test:9001"]
    responses.calls.reset()
    client = SchedulerClient([A, B])
    with pytest.raises(Unreachable):
        client.report_and_claim([report], {"node_id": "n1", "max": 1})
    assert hosts() == ["a.test:9001"] and client.base_url == B


@responses.activate
def test_a_retry_is_resent_only_when_the_first_server_surely_did_nothing():
    responses.post(f"{A}/jobs/job-1/retry", body=requests.ReadTimeout("read timed out"))
    responses.post(f"{A}/jobs/job-2/retry", body=refused(A))
    responses.post(f"{B}/jobs/job-2/retry", json={"job_id": "job-2", "status": "pending"})
    with pytest.raises(Unreachable):
        SchedulerClient([A, B]).retry("job-1")
    assert SchedulerClient([A, B]).retry("job-2")["status"] == "pending"
    assert hosts() == ["a.test:9001", "a.test:9001", "b.test:9001"]


@responses.activate
def test_a_clone_keeps_the_urls_the_position_the_token_and_the_ca_bundle(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    responses.post(f"{A}/nodes/n1/lease", body=refused(A))
    responses.post(f"{B}/nodes/n1/lease", json={"lease_secs": 20, "running": []})
    client = SchedulerClient([A, B], token="node-cred", verify=str(bundle))
    client.renew_lease("n1")
    copy = client.clone()
    assert (copy.base_urls, copy.base_url, copy.verify) == ([A, B], B, str(bundle))
    assert copy.session is not client.session
    responses.post(f"{B}/jobs/job-1/cancel", json={"job_id": "job-1", "status": "cancelled"})
    responses.calls.reset()
    copy.cancel("job-1")  # a body-less write
    assert hosts() == ["b.test:9001"]
    assert responses.calls[0].request.headers["Authorization"] == "Bearer node-cred"
    assert responses.calls[0].request.headers["Content-Type"] == "application/json"
