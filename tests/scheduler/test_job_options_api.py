"""A job's own time limit (`timeout_secs`), bounded by JOB_TIMEOUT_MAX_SECS, on every
way a job comes in (POST /jobs, its arrays, POST /jobs/batch, a schedule's template);
constraints typed `zone==a`; the limits refusal that named `cpu_percent=None`; and
GET /jobs's filters by name, schedule, array and creation time. On each backend."""
import pytest

from corral.scheduler import lifecycle
from corral.scheduler.schedule_loop import Firing
from corral.shared.timeutil import iso
from scheduler_app import make_app, set_nodes, submit

JSON = {"Content-Type": "application/json"}


@pytest.fixture
def app(database_url, clock):
    return make_app(database_url, clock, max_jobs_per_node=4, job_timeout_secs=3600, job_timeout_max_secs=7200)


def report(client, job, status, **extra):
    body = {"node_id": job["node_id"], "attempt": job["attempt"], "status": status, **extra}
    return client.post(f"/jobs/{job['job_id']}/status", json=body)


def job_ids(client, **query):
    answer = client.get("/jobs", query_string=query)
    assert answer.status_code == 200, answer.json
    return [job["job_id"] for job in answer.json]


# ---- timeout_secs -----------------------------------------------------------------

def test_a_job_asks_its_own_timeout_and_shows_it(client):
    own = submit(client, command="etl", timeout_secs=5400)
    default = submit(client, command="true")
    service = submit(client, command="serve", job_type="service")
    assert own["timeout_secs"] == 5400 and client.get(f"/jobs/{own['job_id']}").json["timeout_secs"] == 5400
    assert default["timeout_secs"] == 3600  # JOB_TIMEOUT_SECS
    assert service["timeout_secs"] is None
    array = client.post("/jobs", json={"command": "x", "timeout_secs": 60, "array": {"count": 2}})
    assert array.status_code == 201, array.json
    assert {j["timeout_secs"] for j in client.get("/jobs", query_string={"array": array.json["array_id"]}).json} \
        == {60}
    batch = client.post("/jobs/batch", json={"jobs": [{"command": "a", "timeout_secs": 30}, {"command": "b"}]})
    assert batch.status_code == 201 and [j["timeout_secs"] for j in batch.json] == [30, 3600]


@pytest.mark.parametrize("body, words", [
    ({"command": "x", "timeout_secs": 7201}, "JOB_TIMEOUT_MAX_SECS"),
    ({"command": "x", "timeout_secs": 0}, "timeout_secs"),
    ({"command": "x", "timeout_secs": -5}, "timeout_secs"),
    ({"command": "x", "timeout_secs": "1h"}, "timeout_secs"),
    ({"command": "x", "timeout_secs": True}, "timeout_secs"),
    ({"command": "x", "timeout_secs": 40_000_000}, "timeout_secs"),
    ({"command": "serve", "job_type": "service", "timeout_secs": 60}, "run jobs"),
    ({"command": "x", "timeout_secs": 9000, "array": {"count": 3}}, "JOB_TIMEOUT_MAX_SECS"),
])
def test_a_bad_timeout_is_refused_and_nothing_is_stored(client, body, words):
    answer = client.post("/jobs", json=body)
    assert answer.status_code == 400 and words in answer.json["error"], answer.json
    batch = client.post("/jobs/batch", json={"jobs": [{"command": "fine"}, {k: v for k, v in body.items()
                                                                             if k != "array"}]})
    assert batch.status_code == 400 and batch.json["errors"][0]["index"] == 1, batch.json
    assert client.get("/jobs").json == []


def test_a_schedule_template_takes_a_timeout_within_the_maximum(client, store, clock):
    base = {"name": "etl", "interval_secs": 60, "job": {"command": "etl"}}
    too_long = client.post("/schedules", json=dict(base, job={"command": "etl", "timeout_secs": 7201}))
    assert too_long.status_code == 400 and "JOB_TIMEOUT_MAX_SECS" in too_long.json["error"]
    service = client.post("/schedules", json=dict(base, job={"command": "s", "job_type": "service",
                                                             "timeout_secs": 5}))
    assert service.status_code == 400 and "run jobs" in service.json["error"]
    assert client.get("/schedules").json == []
    created = client.post("/schedules", json=dict(base, job={"command": "etl", "timeout_secs": 900}))
    assert created.status_code == 201 and created.json["job"]["timeout_secs"] == 900
    refused = client.patch("/schedules/etl", json={"job": {"command": "etl", "timeout_secs": 9000}})
    assert refused.status_code == 400 and "JOB_TIMEOUT_MAX_SECS" in refused.json["error"]
    assert client.get("/schedules/etl").json["job"]["timeout_secs"] == 900
    Firing(store, holder="t").tick(clock() + 60.5)
    run = client.get("/jobs", query_string={"schedule": "etl"}).json
    assert [j["timeout_secs"] for j in run] == [900]


def test_the_watcher_fails_a_job_past_its_own_timeout_not_the_default(client, store, clock):
    set_nodes(store, clock, "n1")
    short, default = submit(client, command="sleep 30", timeout_secs=5), submit(client, command="sleep 30")
    for job in (client.get(f"/jobs/{short['job_id']}").json, client.get(f"/jobs/{default['job_id']}").json):
        assert report(client, job, "running").status_code == 200
    # The watcher waits out the timeout, the kill grace (10 s) and its slack: the agent stops the job
    # at its timeout and reports it; the watcher is for agents that do not.
    clock.now += 5 + 10 + lifecycle.WATCHER_SLACK_SECS - 1
    with store.db.connection_context():
        assert store.actions.fail_timed_out(clock()) == []
    clock.now += 2
    with store.db.connection_context():
        assert store.actions.fail_timed_out(clock()) == [short["job_id"]]
    ended = client.get(f"/jobs/{short['job_id']}").json
    assert (ended["status"], ended["exit_code"], ended["stderr"]) == ("failed", -1, "job timed out")
    assert client.get(f"/jobs/{default['job_id']}").json["status"] == "running"
    clock.now += 3600
    with store.db.connection_context():
        assert store.actions.fail_timed_out(clock()) == [default["job_id"]]


@pytest.mark.slow
def test_a_failure_reported_past_the_jobs_own_timeout_is_final(client, store, clock):
    set_nodes(store, clock, "n1")
    job = submit(client, command="sleep 30", timeout_secs=5, max_retries=3)
    job = client.get(f"/jobs/{job['job_id']}").json
    report(client, job, "running")
    clock.now += 5
    ended = report(client, job, "failed", exit_code=-1, stderr="job timed out").json
    assert ended["status"] == "failed" and ended["retry_count"] == 0  # not retried: it timed out


def test_a_repeat_without_timeout_digests_as_before(client):
    """A request stored before timeout_secs existed, sent again with its key, is the same request."""
    first = client.post("/jobs", json={"command": "x"}, headers={"Idempotency-Key": "k1"})
    again = client.post("/jobs", json={"command": "x", "timeout_secs": None}, headers={"Idempotency-Key": "k1"})
    assert (first.status_code, again.status_code) == (201, 200)
    other = client.post("/jobs", json={"command": "x", "timeout_secs": 60}, headers={"Idempotency-Key": "k1"})
    assert other.status_code == 409


# ---- constraints and refusals ------------------------------------------------------

@pytest.mark.parametrize("constraint", [
    {"label": "zone", "op": "=", "value": "=a"},
    {"label": "zone", "op": "!=", "value": "==a"},
])
def test_a_constraint_value_starting_with_equals_is_refused(client, constraint):
    answer = client.post("/jobs", json={"command": "x", "constraints": [constraint]})
    assert answer.status_code == 400
    assert "may not start with '='" in answer.json["error"] and "zone=a" in answer.json["error"], answer.json
    assert client.get("/jobs").json == []


def test_limits_no_node_allows_are_refused_without_none_in_the_message(client, store, clock):
    store.nodes.sync_nodes([{"node_id": "n1", "address": "a", "kind": "compute", "slots": 1, "status": "healthy",
                             "max_memory_mb": 512}], clock())
    answer = client.post("/jobs", json={"command": "x", "memory_mb": 4096})
    assert answer.status_code == 400
    assert answer.json["error"] == "no node allows memory_mb=4096 (n1: memory_mb<=512, cpu_percent: no maximum)"
    assert "None" not in answer.json["error"]


# ---- GET /jobs filters --------------------------------------------------------------

def test_jobs_are_listed_by_name_schedule_array_and_creation_time(client, store, clock):
    t0 = clock()
    etl = submit(client, command="a", name="etl")
    clock.now += 100
    other = submit(client, command="b", name="report")
    array = client.post("/jobs", json={"command": "c", "array": {"count": 3}}).json
    clock.now += 100
    etl2 = submit(client, command="d", name="etl")
    client.post("/schedules", json={"name": "tick", "interval_secs": 60, "job": {"command": "t"}})
    Firing(store, holder="t").tick(clock() + 60.5)
    run = client.get("/schedules/tick/runs").json[0]["job_id"]

    assert job_ids(client, name="etl") == [etl["job_id"], etl2["job_id"]]
    assert job_ids(client, name="etl", order="desc") == [etl2["job_id"], etl["job_id"]]
    assert job_ids(client, schedule="tick") == [run]
    assert job_ids(client, array=array["array_id"]) == ["job-3", "job-4", "job-5"]
    assert job_ids(client, created_after=iso(t0 + 100), created_before=iso(t0 + 200)) == \
        [other["job_id"], "job-3", "job-4", "job-5"]
    assert job_ids(client, created_before=iso(t0 + 100)) == [etl["job_id"]]
    assert job_ids(client, name="etl", created_after=iso(t0 + 1)) == [etl2["job_id"]]
    assert job_ids(client, name="nobody") == []
    # Pages follow the filter: the Link header keeps it.
    first = client.get("/jobs", query_string={"array": array["array_id"], "limit": 2})
    assert [j["job_id"] for j in first.json] == ["job-3", "job-4"]
    link = first.headers["Link"].split(";")[0].strip("<>")
    assert [j["job_id"] for j in client.get(link).json] == ["job-5"]


@pytest.mark.parametrize("query, words", [
    ({"name": "a b"}, "'name'"), ({"name": "x" * 129}, "'name'"), ({"schedule": "../x"}, "'schedule'"),
    ({"array": "array-x"}, "'array'"), ({"array": "job-1"}, "'array'"),
    ({"created_after": "yesterday"}, "'created_after'"), ({"created_before": "2026-01-01T00:00:00"}, "zone"),
])
def test_bad_list_filters_are_400(client, query, words):
    submit(client, command="x", name="etl")
    answer = client.get("/jobs", query_string=query)
    assert answer.status_code == 400 and words in answer.json["error"], answer.json
