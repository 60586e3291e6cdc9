"""A submit's W3C trace context (shared/tracecontext.py) through the API and SQS: kept
with its jobs as the span of the submit, a new trace for none or an invalid one
(counted), one span for all the jobs of one request, and no part of what makes a
request a repeat."""
from prometheus_client.parser import text_string_to_metric_families

from corral.scheduler.sqs_intake import Accepted, parse_message

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{CALLER_SPAN}-01"
STATE = "congo=t61rcWkgMzE"


def parts(traceparent: str) -> tuple[str, str, str, str]:
    version, trace_id, span_id, flags = traceparent.split("-")
    return version, trace_id, span_id, flags


def invalid_count(client, source: str) -> float:
    text = client.get("/metrics").get_data(as_text=True)
    return next((s.value for family in text_string_to_metric_families(text) for s in family.samples
                 if s.name == "corral_trace_context_invalid_total" and s.labels == {"source": source}), 0.0)


def test_a_submit_in_a_trace_makes_a_job_whose_span_is_the_submits(client):
    job = client.post("/jobs", json={"command": "true"}, headers={"traceparent": TRACEPARENT,
                                                                  "tracestate": STATE}).json
    version, trace_id, span_id, flags = parts(job["traceparent"])
    assert (version, trace_id, flags, job["tracestate"]) == ("00", TRACE, "01", STATE)
    assert span_id != CALLER_SPAN and int(span_id, 16)
    assert client.get(f"/jobs/{job['job_id']}").json["traceparent"] == job["traceparent"]


def test_without_a_traceparent_or_with_an_invalid_one_a_new_trace_starts_and_the_invalid_one_is_counted(client):
    plain = client.post("/jobs", json={"command": "true"}).json
    before = invalid_count(client, "api")
    bad = client.post("/jobs", json={"command": "true"}, headers={"traceparent": f"00-{TRACE.upper()}-x-01"})
    assert bad.status_code == 201  # the job is made all the same
    assert invalid_count(client, "api") == before + 1
    traces = {parts(j["traceparent"])[1] for j in (plain, bad.json)}
    assert len(traces) == 2 and TRACE not in traces
    assert plain["tracestate"] is None


def test_the_jobs_of_one_batch_share_the_submits_span_and_a_repeat_in_another_trace_is_the_same_request(client):
    batch = client.post("/jobs/batch", json={"jobs": [{"command": "a"}, {"command": "b"}]},
                        headers={"traceparent": TRACEPARENT, "Idempotency-Key": "k1"})
    assert batch.status_code == 201
    assert len({j["traceparent"] for j in batch.json}) == 1 and parts(batch.json[0]["traceparent"])[1] == TRACE
    again = client.post("/jobs/batch", json={"jobs": [{"command": "a"}, {"command": "b"}]},
                        headers={"traceparent": f"00-{'1' * 32}-{CALLER_SPAN}-01", "Idempotency-Key": "k1"})
    assert again.status_code == 200 and again.json == batch.json  # the jobs it made first


def test_an_sqs_message_carries_its_trace_in_message_attributes():
    def message(**attributes):
        return {"MessageId": "m-1", "Body": '{"command": "true"}',
                "MessageAttributes": {name: {"DataType": "String", "StringValue": value}
                                      for name, value in attributes.items()}}
    traced = parse_message(message(traceparent=TRACEPARENT, tracestate=STATE))
    assert isinstance(traced, Accepted) and not traced.trace_invalid
    assert parts(traced.fields["traceparent"])[1] == TRACE and traced.fields["tracestate"] == STATE
    invalid = parse_message(message(traceparent="nonsense"))
    assert isinstance(invalid, Accepted) and invalid.trace_invalid
    assert parts(invalid.fields["traceparent"])[1] != TRACE
    binary = parse_message({"MessageId": "m-2", "Body": '{"command": "true"}', "MessageAttributes": {
        "traceparent": {"DataType": "Binary", "BinaryValue": b"x"}}})
    assert isinstance(binary, Accepted) and not binary.trace_invalid  # not a String: as if absent
