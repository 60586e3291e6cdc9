"""The scheduler's API and store through Flask's test client, on each backend: a real
SQLite file and a real PostgreSQL database (`database_url`)."""
import peewee
import pytest

from corral.scheduler import lifecycle
from corral.scheduler.service import Scheduler
from corral.scheduler.models import Job, NodeLease
from scheduler_app import make_app, set_nodes, submit


def report(client, job, status, **extra):
    body = {"node_id": job["node_id"], "attempt": job["attempt"], "status": status, **extra}
    return client.post(f"/jobs/{job['job_id']}/status", json=body)


def run_to(client, job_id, status, exit_code=0):
    job = client.get(f"/jobs/{job_id}").json
    assert report(client, job, "running").status_code == 200
    return report(client, job, status, exit_code=exit_code, stdout="out", stderr="err")


# ---- submit and read -----------------------------------------------------------

def test_submit_returns_the_job_and_ids_count_up(client):
    first = submit(client, command="echo hi", env_vars={"A": "1"}, port=8080)
    second = submit(client, command="echo again")
    assert first["job_id"] == "job-1" and second["job_id"] == "job-2"
    assert first["status"] == "pending" and first["exit_code"] is None
    assert first["env_vars"] == {"A": "1"} and first["port"] == 8080 and first["job_type"] == "run"
    assert first["created_at"].endswith("Z") and first["finished_at"] is None
    for field in ("node_id", "instance_id", "deploy_url", "retry_count", "stdout", "stderr", "running_at"):
        assert field in first
    assert client.get("/jobs/job-1").json == first


@pytest.mark.parametrize("kwargs, status", [
    ({}, 415),
    ({"data": "command=echo"}, 415),
    ({"data": "", "content_type": "application/json"}, 400),
    ({"data": "{not json", "content_type": "application/json"}, 400),
    ({"data": "[1, 2]", "content_type": "application/json"}, 400),
    ({"data": "\xff\xfe", "content_type": "application/json"}, 400),
    ({"json": {"command": "x", "job_type": "cron"}}, 400),
    ({"json": {"command": "x", "port": 70000}}, 400),
    ({"json": {"command": "x", "env_vars": {"A": ["b"]}}}, 400),
    ({"json": {"job_type": "run"}}, 400),
    ({"data": '{"command": "' + "x" * (10 * 1024 * 1024) + '"}', "content_type": "application/json"}, 413),
])
def test_bad_submissions_get_a_json_error_and_store_nothing(client, kwargs, status):
    response = client.post("/jobs", **kwargs)
    assert response.status_code == status
    assert isinstance(response.json["error"], str) and response.json["error"]
    assert client.get("/jobs").json == []


def test_unknown_jobs_and_routes_are_404_json(client):
    for path in ("/jobs/job-99", "/jobs/nope", "/jobs/job-0/events", "/nowhere"):
        response = client.get(path)
        assert response.status_code == 404 and "error" in response.json


def test_wrong_method_is_405_json(client):
    response = client.delete("/jobs")
    assert response.status_code == 405 and "error" in response.json


def test_list_filters_and_keyset_pagination(client, store, clock):
    for i in range(5):
        submit(client, command=f"echo {i}", job_type="service" if i == 4 else "run")
    page = client.get("/jobs?limit=2")
    assert [j["job_id"] for j in page.json] == ["job-1", "job-2"]
    assert 'after=job-2' in page.headers["Link"] and 'rel="next"' in page.headers["Link"]
    page = client.get("/jobs?limit=2&after=job-2")
    assert [j["job_id"] for j in page.json] == ["job-3", "job-4"]
    last = client.get("/jobs?limit=2&after=job-4")
    assert [j["job_id"] for j in last.json] == ["job-5"] and "Link" not in last.headers
    assert [j["job_id"] for j in client.get("/jobs?order=desc&limit=2").json] == ["job-5", "job-4"]
    assert [j["job_id"] for j in client.get("/jobs?order=desc&after=job-4").json] == ["job-3", "job-2", "job-1"]
    assert [j["job_id"] for j in client.get("/jobs?job_type=service").json] == ["job-5"]
    assert client.get("/jobs?status=done").json == []
    for bad in ("status=weird", "limit=0", "limit=1001", "limit=x", "after=7", "order=up", "job_type=cron"):
        response = client.get(f"/jobs?{bad}")
        assert response.status_code == 400, bad
        assert "error" in response.json


# ---- placement -------------------------------------------------------------------

def test_jobs_wait_without_nodes_and_are_placed_when_one_appears(client, store, clock):
    job = submit(client)
    assert job["node_id"] is None and job["status"] == "pending"
    set_nodes(store, clock, "n1")
    job = client.get("/jobs/job-1").json
    assert job["node_id"] == "n1" and job["attempt"] == 1 and job["placed_at"]


def test_round_robin_over_healthy_nodes(database_url, clock):
    app = make_app(database_url, clock, max_jobs_per_node=4)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1", "n2", ("n3", "unhealthy"))
    placed = [submit(client)["node_id"] for _ in range(6)]
    assert placed == ["n1", "n2", "n1", "n2", "n1", "n2"]


def test_a_node_never_holds_more_than_its_limit(database_url, clock):
    app = make_app(database_url, clock, max_jobs_per_node=2)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1", slots=8)
    jobs = [submit(client) for _ in range(4)]
    assert [j["node_id"] for j in jobs] == ["n1", "n1", None, None]
    polled = client.get("/jobs?node_id=n1&status=pending").json
    assert [j["job_id"] for j in polled] == ["job-1", "job-2"]
    for job in polled:
        assert report(client, job, "running").status_code == 200
    # Both slots run: the agents' poll answers nothing more.
    assert client.get("/jobs?node_id=n1&status=pending").json == []
    assert report(client, polled[0], "done", exit_code=0).status_code == 200
    # The freed slot went to the oldest waiting job.
    assert client.get("/jobs/job-3").json["node_id"] == "n1"
    assert client.get("/jobs/job-4").json["node_id"] is None


def test_by_default_a_node_runs_one_job_at_a_time(database_url, clock):
    app = make_app(database_url, clock)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1", "n2", slots=8)
    assert [submit(client)["node_id"] for _ in range(3)] == ["n1", "n2", None]


def test_an_agent_advertising_fewer_slots_gets_fewer_jobs(database_url, clock):
    app = make_app(database_url, clock, max_jobs_per_node=4)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1", slots=1)
    assert [submit(client)["node_id"] for _ in range(2)] == ["n1", None]


def test_instance_id_pins_a_job(client, store, clock):
    set_nodes(store, clock, "n1", "n2")
    assert submit(client, command="true", instance_id="n2")["node_id"] == "n2"
    assert submit(client, command="true", instance_id="n2")["node_id"] == "n2"
    waiting = submit(client, command="true", instance_id="n9")
    assert waiting["node_id"] is None
    set_nodes(store, clock, "n1", "n2", "n9")
    assert client.get(f"/jobs/{waiting['job_id']}").json["node_id"] == "n9"


def test_pending_jobs_of_an_unhealthy_node_move_to_a_healthy_one(client, store, clock):
    set_nodes(store, clock, "n1", "n2")
    jobs = [submit(client) for _ in range(2)]
    assert [j["node_id"] for j in jobs] == ["n1", "n2"]
    clock.now += 30
    set_nodes(store, clock, ("n1", "unhealthy"), "n2")
    moved = client.get("/jobs/job-1").json
    assert moved["node_id"] == "n2" and moved["attempt"] == 2
    # The old node's late claim for its attempt is refused.
    assert report(client, jobs[0], "running").status_code == 409
    assert client.get("/jobs/job-1").json["status"] == "pending"


def test_a_node_that_leaves_the_registry_releases_its_pending_jobs(client, store, clock):
    set_nodes(store, clock, "n1")
    submit(client)
    set_nodes(store, clock)
    assert client.get("/jobs/job-1").json["node_id"] is None


# ---- reports -----------------------------------------------------------------------

def test_a_job_runs_to_done_with_its_output(client, store, clock):
    set_nodes(store, clock, "n1")
    job = submit(client, command="echo hi")
    clock.now += 1
    running = report(client, job, "running")
    assert running.status_code == 200 and running.json["status"] == "running" and running.json["running_at"]
    assert report(client, job, "running").status_code == 200  # a repeated report is harmless
    clock.now += 1
    done = report(client, job, "done", exit_code=0, stdout="hi\n", stderr="")
    assert done.status_code == 200
    assert done.json["status"] == "done" and done.json["stdout"] == "hi\n" and done.json["exit_code"] == 0
    assert done.json["finished_at"]
    events = client.get("/jobs/job-1/events").json
    assert [(e["from"], e["to"]) for e in events] == [
        (None, "pending"), ("pending", "pending"), ("pending", "running"), ("running", "done")]
    assert events[1]["reason"] == "placed on n1" and events[2]["node_id"] == "n1"


def test_a_failed_job_is_retried_once_then_failed(client, store, clock):
    set_nodes(store, clock, "n1")
    submit(client, command="false")
    retried = run_to(client, "job-1", "failed", exit_code=3).json
    assert retried["status"] == "pending" and retried["retry_count"] == 1
    assert retried["exit_code"] is None and retried["attempt"] == 2 and retried["node_id"] == "n1"
    final = run_to(client, "job-1", "failed", exit_code=4).json
    assert final["status"] == "failed" and final["exit_code"] == 4 and final["retry_count"] == 1
    assert final["stderr"] == "err"


def test_max_job_retries_zero_fails_at_once(database_url, clock):
    app = make_app(database_url, clock, max_job_retries=0)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1")
    submit(client)
    assert run_to(client, "job-1", "failed", exit_code=1).json["status"] == "failed"


def test_refused_reports_change_nothing(client, store, clock):
    set_nodes(store, clock, "n1", "n2")
    job = submit(client)
    before = client.get("/jobs/job-1").json
    cases = [
        ({"node_id": "n2", "attempt": 1, "status": "running"}, 409),          # another node
        ({"node_id": "n1", "attempt": 7, "status": "running"}, 409),          # a stale attempt
        ({"node_id": "n1", "attempt": 1, "status": "done", "exit_code": 0}, 409),  # skips running
        ({"node_id": "n1", "attempt": 1, "status": "paused"}, 400),
        ({"node_id": "n1", "status": "running"}, 400),
    ]
    for body, status in cases:
        response = client.post("/jobs/job-1/status", json=body)
        assert response.status_code == status, body
        assert "error" in response.json
    assert client.post("/jobs/job-42/status", json={"node_id": "n1", "attempt": 1,
                                                     "status": "running"}).status_code == 404
    assert client.get("/jobs/job-1").json == before
    assert len(client.get("/jobs/job-1/events").json) == 2
    run_to(client, "job-1", "done")
    late = report(client, job, "failed", exit_code=1)
    assert late.status_code == 409 and client.get("/jobs/job-1").json["status"] == "done"


def test_output_is_kept_to_its_tail(database_url, clock):
    app = make_app(database_url, clock, output_tail_bytes=1000)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1")
    job = submit(client)
    report(client, job, "running")
    done = report(client, job, "done", exit_code=0, stdout="a" * 5000 + "END").json
    assert len(done["stdout"]) == 1000 and done["stdout"].endswith("END")


def test_binary_output_with_nul_bytes_is_kept_on_every_backend(database_url, clock):
    """A job that writes binary (NUL bytes, which PostgreSQL's text cannot hold) ends
    like any other, live and at the end; the tail shows U+FFFD where a NUL was."""
    app = make_app(database_url, clock)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1")
    job = submit(client)
    report(client, job, "running")
    live = client.post("/jobs/output", json={"outputs": [{"job_id": job["job_id"], "node_id": "n1", "attempt": 1,
                                                          "stdout": "so far\x00"}]})
    assert live.json["results"][0]["code"] == 200, live.json
    assert client.get(f"/jobs/{job['job_id']}").json["stdout"] == "so far\ufffd"
    done = report(client, job, "done", exit_code=0, stdout="a\x00b", stderr="\x00")
    assert done.status_code == 200, done.json
    assert (done.json["status"], done.json["stdout"], done.json["stderr"]) == ("done", "a\ufffdb", "\ufffd")


# ---- timeouts ------------------------------------------------------------------

def test_run_jobs_past_the_timeout_are_failed(database_url, clock):
    app = make_app(database_url, clock, job_timeout_secs=60, max_jobs_per_node=2)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1")
    slow, service = submit(client, command="sleep 1000"), submit(client, command="serve", job_type="service")
    for job in (slow, service):
        report(client, job, "running")
    clock.now += 60 + 10 + lifecycle.WATCHER_SLACK_SECS - 1  # its timeout, kill grace and the watcher's slack
    assert store.actions.fail_timed_out(clock()) == []
    clock.now += 2
    with store.db.connection_context():
        assert store.actions.fail_timed_out(clock()) == ["job-1"]
    timed_out = client.get("/jobs/job-1").json
    assert timed_out["status"] == "failed" and timed_out["exit_code"] == -1
    assert timed_out["stderr"] == "job timed out"
    assert client.get("/jobs/job-2").json["status"] == "running"  # services have no timeout
    # The agent's late report of the killed process is refused.
    assert report(client, slow, "failed", exit_code=-15).status_code == 409


def test_a_failure_reported_past_the_timeout_is_final(database_url, clock):
    app = make_app(database_url, clock, job_timeout_secs=60)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1")
    job = submit(client, command="sleep 1000")
    report(client, job, "running")
    clock.now += 60
    ended = report(client, job, "failed", exit_code=-1, stderr="job timed out").json
    assert ended["status"] == "failed" and ended["retry_count"] == 0
    assert client.get("/jobs/job-1/events").json[-1]["reason"] == "timed out"


def test_the_store_refuses_an_unknown_status(store):
    with pytest.raises(peewee.IntegrityError):
        Job.create(created_at=0, command="x", status="finished")


def test_the_agents_poll_honours_other_filters(client, store, clock):
    set_nodes(store, clock, "n1")
    submit(client, command="true")
    submit(client, command="serve", job_type="service")
    listed = client.get("/jobs?node_id=n1&status=pending&job_type=service").json
    assert [j["job_id"] for j in listed] == ["job-2"]


def test_deeply_nested_json_is_a_400(client):
    body = '{"command": ' + "[" * 50000 + "]" * 50000 + "}"
    response = client.post("/jobs", data=body, content_type="application/json")
    assert response.status_code == 400 and "nested" in response.json["error"]


# ---- limits, results and cancel ---------------------------------------------------

def test_limits_and_results_are_recorded(client, store, clock):
    set_nodes(store, clock, "n1")
    job = submit(client, command="work", memory_mb=256, cpu_percent=50, name="etl")
    assert (job["memory_mb"], job["cpu_percent"], job["name"]) == (256, 50, "etl")
    started = report(client, job, "running", limits_enforced=True,
                     limits={"memory_mb": 256, "cpu_percent": 50}).json
    assert started["limits_enforced"] is True and started["limits"] == {"memory_mb": 256, "cpu_percent": 50}
    ended = report(client, job, "failed", exit_code=-9, stderr="job killed: out of memory (limit 256 MB)",
                   oom_killed=True, peak_memory_bytes=268435456, cpu_seconds=0.25).json
    assert ended["status"] == "pending"  # retried
    assert "out of memory" in client.get("/jobs/job-1/events").json[-2]["reason"]
    job = client.get("/jobs/job-1").json
    report(client, job, "running", limits_enforced=False)
    final = report(client, job, "failed", exit_code=-9, oom_killed=True, peak_memory_bytes=1, cpu_seconds=1).json
    assert final["oom_killed"] is True and final["peak_memory_bytes"] == 1 and final["cpu_seconds"] == 1.0
    assert final["limits_enforced"] is False and final["limits"] is None


def nodes_with_maxima(store, clock, *maxima):
    store.nodes.sync_nodes([{"node_id": f"n{i + 1}", "address": "a", "kind": "compute", "slots": 4, "status": "healthy",
                             "max_memory_mb": mem, "max_cpu_percent": cpu} for i, (mem, cpu) in enumerate(maxima)],
                           clock())


def test_limits_above_every_known_nodes_maximum_are_refused(client, store, clock):
    submit(client, command="x", memory_mb=10**6)  # no node known yet: accepted, fails on a node if too big
    nodes_with_maxima(store, clock, (1024, 200), (4096, 400))
    assert submit(client, command="x", memory_mb=4096, cpu_percent=400)["node_id"] == "n2"
    for body in ({"memory_mb": 8192}, {"cpu_percent": 800}, {"memory_mb": 2048, "instance_id": "n1"}):
        response = client.post("/jobs", json={"command": "x", **body})
        assert response.status_code == 400 and "no node allows" in response.json["error"], body
    assert len(client.get("/jobs").json) == 2


def test_cancel(client, store, clock):
    set_nodes(store, clock, "n1", slots=1)
    running, _ = submit(client, command="sleep 100"), submit(client, command="sleep 100")
    report(client, running, "running")
    cancelled = client.post("/jobs/job-2/cancel", json={})
    assert cancelled.status_code == 200 and cancelled.json["status"] == "cancelled"
    assert cancelled.json["finished_at"]
    assert client.post("/jobs/job-2/cancel", json={}).status_code == 200           # again: a no-op
    stopped = client.post("/jobs/job-1/cancel", json={}).json
    assert stopped["status"] == "cancelled"
    # The agent no longer sees it as running (it kills it) and its late report is refused.
    assert client.get("/jobs?node_id=n1&status=running").json == []
    assert report(client, running, "done", exit_code=0).status_code == 409
    submit(client, command="true")
    done = run_to(client, "job-3", "done").json
    assert done["status"] == "done"
    refused = client.post("/jobs/job-3/cancel", json={})
    assert refused.status_code == 409 and "already done" in refused.json["error"]
    assert client.post("/jobs/job-99/cancel", json={}).status_code == 404
    reasons = [e["reason"] for e in client.get("/jobs/job-1/events").json]
    assert reasons[-1] == "cancelled by request"


# ---- retries, backoff and idempotency ------------------------------------------------

def test_a_retry_waits_out_its_backoff(database_url, clock):
    app = make_app(database_url, clock, retry_base_secs=10.0, retry_factor=2.0, retry_cap_secs=300.0)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1")
    submit(client, command="false", max_retries=3)
    waiting = run_to(client, "job-1", "failed", exit_code=1).json
    assert waiting["status"] == "pending" and waiting["node_id"] is None
    due = parse_iso(waiting["next_attempt_at"])
    assert clock.now <= due <= clock.now + 10.0
    clock.now = due - 0.01
    store.placing.dispatch(clock())
    assert client.get("/jobs/job-1").json["node_id"] is None
    clock.now = due + 0.001  # the view shows milliseconds, truncated
    store.placing.dispatch(clock())
    placed = client.get("/jobs/job-1").json
    assert placed["node_id"] == "n1" and placed["next_attempt_at"] is None and placed["attempt"] == 2


def test_backoff_ceiling_grows_and_is_capped():
    from corral.scheduler.retry import RetryDelay
    backoff = RetryDelay(base_secs=2, factor=3, cap_secs=50)
    assert [backoff.ceiling(n) for n in range(5)] == [2, 6, 18, 50, 50]
    assert backoff.ceiling(10**6) == 50
    import random
    rng = random.Random(7)
    delays = [backoff.delay(2, rng) for _ in range(200)]
    assert all(0 <= d <= 18 for d in delays) and max(delays) > 9 and min(delays) < 9


def test_per_job_retry_budget(client, store, clock):
    set_nodes(store, clock, "n1")
    assert submit(client, command="false", max_retries=0)["max_retries"] == 0
    assert run_to(client, "job-1", "failed", exit_code=1).json["status"] == "failed"
    for bad in (-1, 21, "2"):
        assert client.post("/jobs", json={"command": "x", "max_retries": bad}).status_code == 400


def test_an_operator_retries_a_failed_job_with_a_fresh_budget(client, store, clock):
    set_nodes(store, clock, "n1")
    submit(client, command="false", max_retries=0)
    run_to(client, "job-1", "failed", exit_code=2)
    again = client.post("/jobs/job-1/retry", json={})
    assert again.status_code == 200
    job = again.json
    assert job["status"] == "pending" and job["retry_count"] == 0 and job["exit_code"] is None
    assert job["node_id"] == "n1" and job["attempt"] == 2 and job["stdout"] is None
    assert client.post("/jobs/job-1/retry", json={}).status_code == 409      # pending now
    assert client.post("/jobs/job-9/retry", json={}).status_code == 404
    assert client.get("/jobs/job-1/events").json[-2]["reason"] == "retried by request"


def test_idempotent_submission(client):
    first = client.post("/jobs", json={"command": "echo once"}, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == 201
    again = client.post("/jobs", json={"command": "echo once"}, headers={"Idempotency-Key": "k-1"})
    assert again.status_code == 200 and again.json["job_id"] == first.json["job_id"]
    other = client.post("/jobs", json={"command": "echo twice"}, headers={"Idempotency-Key": "k-1"})
    assert other.status_code == 409 and "different request" in other.json["error"]
    assert client.post("/jobs", json={"command": "echo once"}, headers={"Idempotency-Key": "k-2"}).status_code == 201
    assert client.post("/jobs", json={"command": "x"}, headers={"Idempotency-Key": "has space"}).status_code == 400
    # The keys of schedules' runs are no client's: a job, a batch and an array are refused.
    for path, body in (("/jobs", {"command": "x"}), ("/jobs/batch", {"jobs": [{"command": "x"}]}),
                       ("/jobs", {"command": "x", "array": {"count": 2}})):
        for key in ("schedule:1:2026-12-24T02:00:00Z", "Schedule:x"):
            taken = client.post(path, json=body, headers={"Idempotency-Key": key})
            assert taken.status_code == 400 and "kept for the runs of schedules" in taken.json["error"]
    assert [j["job_id"] for j in client.get("/jobs").json] == ["job-1", "job-2"]


def parse_iso(text):
    import datetime
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_an_attempt_the_node_gave_up_is_requeued_without_spending_retries(client, store, clock):
    set_nodes(store, clock, "n1")
    job = submit(client, command="sleep 100", max_retries=0)
    report(client, job, "running")
    given_up = report(client, job, "failed", exit_code=-1, stderr="agent stopped", requeue=True).json
    assert given_up["status"] == "pending" and given_up["retry_count"] == 0 and given_up["node_losses"] == 1
    assert "gave the attempt up; requeued" in client.get("/jobs/job-1/events").json[-2]["reason"]
    assert client.post("/jobs/job-1/status", json={"node_id": "n1", "attempt": 2, "status": "running",
                                                   "requeue": True}).status_code == 400


def test_the_lease_answer_lists_the_attempts_running_on_the_node(client, store, clock):
    set_nodes(store, clock, "n1", "n2")
    a, _ = submit(client, command="a"), submit(client, command="b")
    report(client, a, "running")
    answer = client.post("/nodes/n1/lease", json={}).json
    assert answer == {"node_id": "n1", "lease_secs": 20.0, "running": [{"job_id": a["job_id"], "attempt": 1}]}
    assert client.post("/nodes/n2/lease", json={}).json["running"] == []
    assert client.post("/nodes/bad%20id/lease", json={}).status_code == 400


def test_a_lease_renewal_may_say_what_the_node_s_jobs_use(client, store, clock):
    set_nodes(store, clock, "n1")
    assert client.post("/nodes/n1/lease", data="", content_type="application/json").status_code == 200
    assert client.post("/nodes/n1/lease", json={"usage": {"memory_mb": 300, "cpu_percent": 150}}).status_code == 200
    lease = NodeLease.get(NodeLease.node_id == "n1")
    assert (lease.used_memory_mb, lease.used_cpu_percent) == (300, 150)
    for bad, says in [({"usage": {"memory_mb": -1, "cpu_percent": 0}}, "'memory_mb' must be between 0"),
                      ({"usage": {"memory_mb": 1}}, "'cpu_percent'"),
                      ({"usage": "lots"}, "'usage' must be an object with memory_mb and cpu_percent"),
                      ({"used": 1}, "'used'")]:
        refused = client.post("/nodes/n1/lease", json=bad)
        assert refused.status_code == 400 and says in refused.json["error"], refused.json
    lease = NodeLease.get(NodeLease.node_id == "n1")
    assert (lease.used_memory_mb, lease.used_cpu_percent) == (300, 150)  # a refused renewal changed nothing


def test_a_busy_database_is_a_503_not_a_500(client, store, monkeypatch):
    def locked(*args, **kwargs):
        raise peewee.OperationalError("database is locked")
    monkeypatch.setattr(store.submits, "submit", locked)
    response = client.post("/jobs", json={"command": "true"})
    assert response.status_code == 503 and response.headers["Retry-After"] == "1"
    assert "nothing was changed" in response.json["error"]


def test_a_drained_node_gets_no_new_work_and_keeps_what_it_runs(client, store, clock):
    nodes = [{"node_id": n, "address": "a", "kind": "compute", "slots": 4, "status": "healthy"} for n in ("n1", "n2")]
    store.nodes.sync_nodes(nodes, clock())
    Scheduler(store).place(clock())
    running, waiting = submit(client, command="a"), submit(client, command="b", instance_id="n1")
    report(client, running, "running")
    nodes[0]["drained"] = True
    store.nodes.sync_nodes(nodes, clock())
    assert client.get(f"/jobs/{running['job_id']}").json["status"] == "running"   # finishes there
    assert client.get(f"/jobs/{waiting['job_id']}").json["node_id"] is None       # pinned: waits
    assert "n1 is drained" in client.get(f"/jobs/{waiting['job_id']}/events").json[-1]["reason"]
    assert {submit(client)["node_id"] for _ in range(3)} == {"n2"}
    nodes[0]["drained"] = False
    store.nodes.sync_nodes(nodes, clock())
    Scheduler(store).place(clock())
    assert client.get(f"/jobs/{waiting['job_id']}").json["node_id"] == "n1"


def test_readiness_needs_the_database_and_a_fresh_node_list_or_the_registry(database_url, clock):
    app = make_app(database_url, clock, registry_url="http://127.0.0.1:1", node_refresh_secs=2)
    client, store = app.test_client(), app.extensions["corral.store"]
    assert client.get("/healthz").status_code == 200
    stale = client.get("/readyz")          # no node list yet and the registry does not answer
    assert stale.status_code == 503 and stale.json["status"] == "not ready" and stale.json["error"]
    set_nodes(store, clock, "n1")
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json["checks"]["database"] == "ok"
    clock.now += 7                          # more than three refresh periods old
    assert client.get("/readyz").status_code == 503


def test_an_error_quoting_a_huge_id_stays_small(client):
    response = client.get("/jobs/job-" + "9" * 100_000)
    assert response.status_code in (400, 404) and len(response.json["error"]) <= 1001


# ---- a late result of an attempt the scheduler gave up on ------------------------------------

def lose_node(store, clock, job):
    """n1 went silent long enough: its running job is requeued (and placed on n2)."""
    store.leases.renew_lease(job["node_id"], clock())
    clock.now += 100
    set_nodes(store, clock, ("n1", "unhealthy"), "n2")
    assert store.leases.requeue_lost(clock(), 0.0) == [job["job_id"]]
    Scheduler(store).place(clock())  # the background pass places it again


def started_on_n1_then_requeued(client, store, clock, **body):
    set_nodes(store, clock, "n1")
    job = submit(client, **body)
    assert report(client, job, "running").status_code == 200
    lose_node(store, clock, job)
    return job


def test_a_finished_run_reported_after_its_requeue_keeps_its_result(client, store, clock):
    job = started_on_n1_then_requeued(client, store, clock, command="echo once", max_retries=0)
    requeued = client.get(f"/jobs/{job['job_id']}").json
    assert (requeued["status"], requeued["node_id"], requeued["attempt"]) == ("pending", "n2", 2)
    # The run on n1 had exited 0; its report arrives now (the agent kept it queued).
    late = report(client, job, "done", exit_code=0, stdout="once\n", stderr="")
    assert late.status_code == 200, late.json
    done = client.get(f"/jobs/{job['job_id']}").json
    assert (done["status"], done["attempt"], done["node_id"], done["stdout"]) == ("done", 1, "n1", "once\n")
    assert done["retry_count"] == 0
    assert "its result is kept" in client.get(f"/jobs/{job['job_id']}/events").json[-1]["reason"]
    # n2 never gets it.
    assert client.post("/nodes/n2/claim", json={"max": 4, "wait_secs": 0}).json == []


def test_a_late_result_never_replaces_a_newer_attempt_that_started(client, store, clock):
    job = started_on_n1_then_requeued(client, store, clock, command="echo once", max_retries=0)
    requeued = client.get(f"/jobs/{job['job_id']}").json
    assert report(client, requeued, "running").status_code == 200  # attempt 2 started on n2
    assert report(client, job, "done", exit_code=0, stdout="late\n").status_code == 409
    now = client.get(f"/jobs/{job['job_id']}").json
    assert (now["status"], now["attempt"], now["node_id"]) == ("running", 2, "n2")


def test_a_late_failure_is_not_kept_and_another_node_cannot_claim_the_run(client, store, clock):
    job = started_on_n1_then_requeued(client, store, clock, command="false")
    assert report(client, job, "failed", exit_code=1).status_code == 409  # the requeued attempt runs
    # A node that never ran attempt 1 cannot pass a `done` off as its result.
    forged = client.post(f"/jobs/{job['job_id']}/status",
                         json={"node_id": "n3", "attempt": 1, "status": "done", "exit_code": 0})
    assert forged.status_code == 409
    assert client.get(f"/jobs/{job['job_id']}").json["status"] == "pending"
