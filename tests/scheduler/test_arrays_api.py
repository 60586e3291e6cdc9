"""Arrays and concurrency limits through the API, on each backend."""
import pytest
from corral.scheduler.service import Scheduler
from scheduler_app import end_attempt, set_nodes, submit


def placed(client, **query):
    return [j for j in client.get("/jobs", query_string=dict(query, limit=1000)).json if j["node_id"] is not None
            and j["status"] in ("pending", "running")]


@pytest.mark.slow
def test_an_array_is_count_jobs_with_their_index_and_at_most_parallel_at_once(client, store, clock):
    set_nodes(store, clock, "n1", "n2")
    created = client.post("/jobs", json={"command": "echo $CORRAL_ARRAY_INDEX", "array": {"count": 50,
                                                                                          "parallel": 3}})
    assert created.status_code == 201
    array = created.json
    assert array["array_id"].startswith("array-") and array["count"] == 50 and array["parallel"] == 3
    first, last = int(array["first_job_id"][4:]), int(array["last_job_id"][4:])
    assert last - first == 49
    jobs = client.get("/jobs", query_string={"limit": 1000}).json
    assert [j["env_vars"] for j in jobs] == [{"CORRAL_ARRAY_INDEX": str(i), "CORRAL_ARRAY_COUNT": "50"}
                                             for i in range(50)]
    assert [(j["array_id"], j["array_index"]) for j in jobs] == [(array["array_id"], i) for i in range(50)]
    assert len(placed(client)) == 3
    store.placing.explain(clock())
    waiting = client.get(f"/jobs/job-{first + 3}").json["pending_reason"]
    assert waiting == {"code": "array_throttle", "message": "3 of its array's jobs are placed or running "
                       "(parallel 3)", "array_id": array["array_id"], "parallel": 3, "active": 3}
    for _ in range(10):  # as jobs end, the next ones go, never more than 3 at once
        end_attempt(client, placed(client)[0]["job_id"])
        assert len(placed(client)) == 3
    summary = client.get(f"/arrays/{array['array_id']}").json
    assert summary["jobs"] == {"pending": 40, "running": 0, "done": 10, "failed": 0, "cancelled": 0}
    cancelled = client.post(f"/arrays/{array['array_id']}/cancel", json={}).json
    assert cancelled["jobs"] == {"pending": 0, "running": 0, "done": 10, "failed": 0, "cancelled": 40}


def test_an_array_with_an_idempotency_key_is_created_once(client):
    body = {"command": "x", "array": {"count": 3}}
    first = client.post("/jobs", json=body, headers={"Idempotency-Key": "nightly-1"})
    again = client.post("/jobs", json=body, headers={"Idempotency-Key": "nightly-1"})
    assert (first.status_code, again.status_code) == (201, 200) and first.json == again.json
    assert len(client.get("/jobs").json) == 3
    other = client.post("/jobs", json=dict(body, command="y"), headers={"Idempotency-Key": "nightly-1"})
    assert other.status_code == 409


def test_bad_arrays_are_refused(client):
    for body, says in [({"array": {"count": 0}}, "'count' must be between 1 and 10000"),
                       ({"array": {"count": 10_001}}, "'count' must be between 1 and 10000"),
                       ({"array": {"count": 2, "parallel": 3}}, "'parallel' must be at most 'count'"),
                       ({"array": 5}, "'array' must be an object with 'count'")]:
        refused = client.post("/jobs", json={"command": "x", **body})
        assert refused.status_code == 400 and says in refused.json["error"], refused.json
    batch = client.post("/jobs/batch", json={"jobs": [{"command": "x", "array": {"count": 2}}]})
    assert batch.status_code == 400 and "cannot be part of a batch" in str(batch.json)
    assert client.get("/arrays/array-1").status_code == 404 and client.get("/arrays/nope").status_code == 404
    assert client.get("/jobs").json == []


def test_a_concurrency_key_limits_jobs_across_nodes(client, store, clock):
    set_nodes(store, clock, "n1", "n2")
    assert client.put("/concurrency/migrations", json={"limit": 1}).json == {"key": "migrations", "limit": 1,
                                                                             "active": 0, "team": "default"}
    jobs = [submit(client, command="migrate", concurrency_key="migrations") for _ in range(3)]
    other = submit(client, command="x", concurrency_key="unlimited")
    assert [j["node_id"] is not None for j in jobs] == [True, False, False] and other["node_id"] is not None
    assert {j["concurrency_key"] for j in jobs} == {"migrations"} and other["array_id"] is None
    assert client.get("/concurrency").json == [{"key": "migrations", "limit": 1, "active": 1, "team": "default"}]
    store.placing.explain(clock())
    assert client.get(f"/jobs/{jobs[1]['job_id']}").json["pending_reason"]["code"] == "concurrency_limit"
    end_attempt(client, jobs[0]["job_id"])
    assert [client.get(f"/jobs/{j['job_id']}").json["node_id"] is not None for j in jobs[1:]] == [True, False]
    client.put("/concurrency/migrations", json={"limit": 2})  # raised: what it held back goes at once
    assert client.get(f"/jobs/{jobs[2]['job_id']}").json["node_id"] is not None
    delete = client.delete("/concurrency/migrations", headers={"Content-Type": "application/json"})
    assert delete.status_code == 204 and client.get("/concurrency").json == []
    again = client.delete("/concurrency/migrations", headers={"Content-Type": "application/json"})
    assert again.status_code == 404


def test_bad_concurrency_limits_are_refused(client):
    for path, body, says in [("/concurrency/a%20b", {"limit": 1}, "the concurrency key must be"),
                             ("/concurrency/k", {"limit": 0}, "'limit' must be between 1 and 100000"),
                             ("/concurrency/k", {"limit": "2"}, "'limit' must be a whole number"),
                             ("/concurrency/k", {}, "'limit'")]:
        refused = client.put(path, json=body)
        assert refused.status_code == 400 and says in refused.json["error"], refused.json
    refused = client.post("/jobs", json={"command": "x", "concurrency_key": "a b"})
    assert refused.status_code == 400 and "'concurrency_key' must be letters" in refused.json["error"]
    assert client.get("/concurrency").json == []


def test_placement_never_places_more_than_the_limit_when_many_wait(client, store, clock):
    set_nodes(store, clock, "n1", "n2")
    client.put("/concurrency/k", json={"limit": 2})
    for _ in range(20):
        submit(client, command="x", concurrency_key="k")
    Scheduler(store).place(clock())
    assert len(placed(client)) == 2
