"""A job's disk limit (`disk_mb`) and why its agent ended it (`ended_by`) through the
scheduler's API, on each backend."""
import pytest

from corral.scheduler.contract import MAX_DISK_MB
from scheduler_app import make_app, set_nodes, submit


def test_disk_mb_is_stored_and_shown_and_defaults_to_the_clusters_setting(client):
    assert submit(client, command="true", disk_mb=20)["disk_mb"] == 20
    assert submit(client, command="true", job_type="service", disk_mb=MAX_DISK_MB)["disk_mb"] == MAX_DISK_MB
    assert submit(client, command="true")["disk_mb"] == 10240  # JOB_DEFAULT_DISK_MB
    assert client.get("/jobs/job-1").json["disk_mb"] == 20
    batch = client.post("/jobs/batch", json={"jobs": [{"command": "true", "disk_mb": 7}, {"command": "true"}]})
    assert batch.status_code == 201 and [j["disk_mb"] for j in batch.json] == [7, 10240]


def test_a_default_of_0_means_no_limit_for_jobs_that_ask_none(database_url, clock):
    client = make_app(database_url, clock, job_default_disk_mb=0).test_client()
    assert submit(client, command="true")["disk_mb"] is None
    assert submit(client, command="true", disk_mb=5)["disk_mb"] == 5


@pytest.mark.parametrize("value", [0, -1, MAX_DISK_MB + 1, "20", 1.5, True, [20], {"mb": 20}])
def test_a_bad_disk_mb_is_refused_with_a_clear_error_and_nothing_is_stored(client, value):
    response = client.post("/jobs", json={"command": "true", "disk_mb": value})
    assert response.status_code == 400, response.json
    assert "'disk_mb'" in response.json["error"], response.json
    batch = client.post("/jobs/batch", json={"jobs": [{"command": "true"}, {"command": "true", "disk_mb": value}]})
    assert batch.status_code == 400 and "disk_mb" in str(batch.json)
    assert client.get("/jobs").json == []


def _running(client, store, clock):
    set_nodes(store, clock, "n1")
    job = submit(client, command="true", disk_mb=20, max_retries=0)
    body = {"node_id": job["node_id"], "attempt": job["attempt"]}
    assert client.post("/jobs/job-1/status", json=dict(body, status="running")).status_code == 200
    return body


def test_a_job_its_agent_ended_for_disk_shows_ended_by_disk(client, store, clock):
    body = _running(client, store, clock)
    answer = client.post("/jobs/job-1/status", json=dict(
        body, status="failed", exit_code=-1, ended_by="disk", stderr="job exceeded its disk limit of 20 MB"))
    assert answer.status_code == 200, answer.json
    job = client.get("/jobs/job-1").json
    assert (job["status"], job["ended_by"], job["exit_code"]) == ("failed", "disk", -1)
    assert "over its disk limit" in client.get("/jobs/job-1/events").json[-1]["reason"]


def test_a_job_that_exits_on_its_own_was_ended_by_its_exit(client, store, clock):
    body = _running(client, store, clock)
    assert client.get("/jobs/job-1").json["ended_by"] is None  # no attempt has ended yet
    assert client.post("/jobs/job-1/status", json=dict(body, status="done", exit_code=0)).status_code == 200
    assert client.get("/jobs/job-1").json["ended_by"] == "exit"


@pytest.mark.parametrize("extra", [{"status": "done", "exit_code": 0, "ended_by": "disk"},
                                   {"status": "failed", "exit_code": -1, "ended_by": "cpu"},
                                   {"status": "failed", "exit_code": -1, "ended_by": 1}])
def test_a_bad_ended_by_is_refused_and_changes_nothing(client, store, clock, extra):
    body = _running(client, store, clock)
    before = client.get("/jobs/job-1").json
    answer = client.post("/jobs/job-1/status", json=dict(body, **extra))
    assert answer.status_code == 400 and "ended_by" in answer.json["error"], answer.json
    assert client.get("/jobs/job-1").json == before
