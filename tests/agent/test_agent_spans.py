"""The agent's spans (agent/spans.py), against the real scheduler app: an attempt is the
span its process's TRACEPARENT names, a child of the job's submit span (so retries are
siblings), and its report a child of it."""
import pytest
import responses
from opentelemetry.trace import StatusCode

from helpers import wait_for
from scheduler_double import NODE, REGISTRY
from span_support import hex_ids, traceparent_ids


@pytest.fixture
def agent(api, make_agent):
    api.add(responses.POST, REGISTRY + "/nodes", json={"node_id": NODE}, status=201)  # its registration
    return make_agent()


def run_attempt(agent):
    assert agent.intake.poll_once()
    wait_for(agent.reap_once, timeout=10, message="the attempt to end")


def test_an_attempt_is_the_span_its_traceparent_names_under_the_submit_span(agent, scheduler, recorded):
    job = scheduler.add(command='echo "$TRACEPARENT"')
    run_attempt(agent)
    seen_trace, seen_span = traceparent_ids(scheduler.final(job["job_id"])["stdout"].strip())
    stored_trace, submit_span = traceparent_ids(job["traceparent"])
    attempt = recorded.one("corral.attempt", stored_trace)
    assert hex_ids(attempt) == (stored_trace, seen_span, submit_span) and seen_trace == stored_trace
    assert hex_ids(recorded.one("corral.submit", stored_trace))[1] == submit_span  # the scheduler's, in-process
    assert {k: attempt.attributes[k] for k in ("corral.job_id", "corral.attempt", "corral.node_id",
                                               "process.exit.code")} == {
        "corral.job_id": job["job_id"], "corral.attempt": 1, "corral.node_id": scheduler.node_id,
        "process.exit.code": 0}
    assert attempt.status.status_code == StatusCode.UNSET
    report = wait_for(lambda: recorded.all("corral.report", stored_trace), timeout=5, message="the report span")[0]
    assert hex_ids(report)[2] == seen_span and report.attributes["corral.status"] == "done"


def test_a_retry_is_a_second_attempt_span_beside_the_first_under_the_submit_span(agent, scheduler, recorded,
                                                                               tmp_path):
    marker = tmp_path / "failed-once"
    job = scheduler.add(command=f"test -e {marker} || {{ touch {marker}; exit 3; }}", max_retries=1)
    run_attempt(agent)
    wait_for(lambda: scheduler.job(job["job_id"])["attempt"] == 2, timeout=10, message="the retry")
    run_attempt(agent)
    trace_id, submit_span = traceparent_ids(job["traceparent"])
    first, second = sorted(recorded.all("corral.attempt", trace_id), key=lambda s: s.attributes["corral.attempt"])
    assert hex_ids(first)[2] == hex_ids(second)[2] == submit_span and hex_ids(first)[1] != hex_ids(second)[1]
    assert (first.status.status_code, first.attributes["process.exit.code"]) == (StatusCode.ERROR, 3)
    assert (second.status.status_code, second.attributes["process.exit.code"]) == (StatusCode.UNSET, 0)
    reports = wait_for(lambda: len(recorded.all("corral.report", trace_id)) == 2 and recorded.all("corral.report",
                                                                                               trace_id),
                       timeout=5, message="both report spans")
    assert {hex_ids(r)[2] for r in reports} == {hex_ids(first)[1], hex_ids(second)[1]}


@pytest.mark.slow
def test_an_attempt_that_cannot_run_here_is_a_failed_attempt_span_at_once(agent, scheduler, recorded):
    job = scheduler.add(command="true", memory_mb=1_000_000)
    agent.intake.poll_once()
    attempt = wait_for(lambda: recorded.all("corral.attempt"), timeout=5, message="the attempt span")[0]
    assert attempt.status.status_code == StatusCode.ERROR
    assert hex_ids(attempt)[2] == traceparent_ids(job["traceparent"])[1]


def test_without_a_provider_the_attempt_still_runs_in_the_jobs_trace(agent, scheduler):
    job = scheduler.add(command='echo "$TRACEPARENT"')
    run_attempt(agent)
    assert traceparent_ids(scheduler.final(job["job_id"])["stdout"].strip())[0] == traceparent_ids(
        job["traceparent"])[0]
