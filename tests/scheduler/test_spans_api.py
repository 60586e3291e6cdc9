"""The scheduler's spans (scheduler/spans.py) through its API and SQS intake: the submit's
span is the one its jobs store, under the caller's; each placement is a child of it."""
from opentelemetry.trace import SpanKind, StatusCode

from corral.scheduler import sqs_intake
from scheduler_app import set_nodes, submit
from span_support import hex_ids, traceparent_ids

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{CALLER_SPAN}-01"


def test_a_submit_in_a_trace_is_a_server_span_whose_id_its_job_stores(client, recorded):
    job = client.post("/jobs", json={"command": "true"}, headers={"traceparent": TRACEPARENT}).json
    span = recorded.one("corral.submit", TRACE)
    assert hex_ids(span) == (TRACE, traceparent_ids(job["traceparent"])[1], CALLER_SPAN)
    assert span.kind == SpanKind.SERVER and span.parent.is_remote
    assert {k: span.attributes[k] for k in ("corral.job_id", "corral.created", "http.request.method",
                                            "http.response.status_code", "corral.source")} == {
        "corral.job_id": job["job_id"], "corral.created": True, "http.request.method": "POST",
        "http.response.status_code": 201, "corral.source": "api"}
    assert span.status.status_code == StatusCode.UNSET


def test_a_submit_without_a_trace_is_the_root_of_the_trace_its_job_stores(client, recorded):
    job = submit(client)
    trace_id, span_id = traceparent_ids(job["traceparent"])
    assert hex_ids(recorded.one("corral.submit")) == (trace_id, span_id, None)


def test_a_batch_is_one_submit_span_that_every_job_of_it_stores(client, recorded):
    jobs = client.post("/jobs/batch", json={"jobs": [{"command": "a"}, {"command": "b"}]},
                       headers={"traceparent": TRACEPARENT}).json
    span = recorded.one("corral.submit", TRACE)
    assert {traceparent_ids(j["traceparent"])[1] for j in jobs} == {hex_ids(span)[1]}
    assert span.attributes["corral.job_count"] == 2 and span.attributes["corral.source"] == "batch"


def test_a_refused_submit_ends_its_span_with_the_refusal(client, recorded):
    answer = client.post("/jobs/batch", json={"jobs": [{"command": "a", "depends_on": [{"job_id": "job-999"}]}]},
                         headers={"traceparent": TRACEPARENT})
    assert 400 <= answer.status_code < 500
    span = recorded.one("corral.submit", TRACE)
    assert span.attributes["http.response.status_code"] == answer.status_code
    assert span.status.status_code == StatusCode.UNSET  # the client's error, not the server's


def test_each_placement_is_a_child_of_the_submit_span_with_the_job_node_and_attempt(app, client, store, clock,
                                                                                  recorded):
    job = client.post("/jobs", json={"command": "true", "max_retries": 1},
                      headers={"traceparent": TRACEPARENT}).json
    assert recorded.all("corral.place") == []  # no node yet
    set_nodes(store, clock, "n1")
    submit_span = recorded.one("corral.submit", TRACE)
    place = recorded.one("corral.place", TRACE)
    assert hex_ids(place)[2] == hex_ids(submit_span)[1] == traceparent_ids(job["traceparent"])[1]
    assert dict(place.attributes) == {"corral.job_id": job["job_id"], "corral.node_id": "n1", "corral.attempt": 1}
    # The attempt fails; the retry's placement is a sibling of the first.
    body = {"node_id": "n1", "attempt": 1}
    for status in ("running", "failed"):
        assert client.post(f"/jobs/{job['job_id']}/status", json=dict(body, status=status, exit_code=1)).status_code \
            == 200
    first, second = recorded.all("corral.place", TRACE)
    assert hex_ids(second)[2] == hex_ids(first)[2] and second.attributes["corral.attempt"] == 2


def test_an_sqs_message_is_a_consumer_submit_span_under_its_trace(app, store, clock, recorded):
    set_nodes(store, clock, "n1")
    intake = sqs_intake.Intake(store, holder="me", clock=clock)
    intake.fence.acquire(store.db, intake.lease_ttl, clock())
    message = {"MessageId": "m-1", "Body": '{"command": "true"}', "MessageAttributes": {
        "traceparent": {"DataType": "String", "StringValue": TRACEPARENT}}}
    with store.db.connection_context():
        assert intake.handle([message], clock()).created == 1
        job = store.jobs.list_jobs()[0]
    span = recorded.one("corral.submit", TRACE)
    assert span.kind == SpanKind.CONSUMER and hex_ids(span) == (TRACE, traceparent_ids(job.traceparent)[1],
                                                                 CALLER_SPAN)
    assert span.attributes["messaging.message.id"] == "m-1" and span.attributes["corral.job_id"] == job.job_id
    assert hex_ids(recorded.one("corral.place", TRACE))[2] == hex_ids(span)[1]


def test_without_a_provider_nothing_is_recorded_and_jobs_still_store_their_trace(client):
    job = client.post("/jobs", json={"command": "true"}, headers={"traceparent": TRACEPARENT}).json
    assert traceparent_ids(job["traceparent"])[0] == TRACE
