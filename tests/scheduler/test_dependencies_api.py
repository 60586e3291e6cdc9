"""Dependencies through the API, on each backend: a job waits for others to end as it
asks, a chain runs in order, a condition that can never hold cancels down the chain."""
from scheduler_app import end_attempt, set_nodes, submit


def state(client, job_id):
    job = client.get(f"/jobs/{job_id}").json
    return job["status"], job["node_id"] is not None


def place(store, clock):
    from corral.scheduler.service import Scheduler
    Scheduler(store).place(clock())


def test_a_chain_runs_in_order(client, store, clock):
    set_nodes(store, clock, "n1")
    a = submit(client, command="a", max_retries=0)
    b = submit(client, command="b", depends_on=[{"job_id": a["job_id"]}])
    c = submit(client, command="c", depends_on=[{"job_id": b["job_id"], "condition": "done"}])
    assert b["pending_reason"] == {"code": "dependency", "message": f"waiting for {a['job_id']} to be done",
                                   "job_id": a["job_id"], "condition": "done"}
    # The answer shows what was asked (the default condition filled in), and so does a read.
    assert b["depends_on"] == [{"job_id": a["job_id"], "condition": "done"}]
    assert client.get(f"/jobs/{c['job_id']}").json["depends_on"] == [{"job_id": b["job_id"], "condition": "done"}]
    assert a["depends_on"] is None and a["on_dependency_failure"] == "cancel"
    assert [j["job_id"] for j in client.get("/jobs?pending_reason=dependency").json] == [b["job_id"], c["job_id"]]
    assert state(client, b["job_id"]) == ("pending", False)
    end_attempt(client, a["job_id"], "done")
    place(store, clock)
    assert state(client, b["job_id"]) == ("pending", True) and state(client, c["job_id"]) == ("pending", False)
    end_attempt(client, b["job_id"], "done")
    place(store, clock)
    assert state(client, c["job_id"]) == ("pending", True)


def test_a_failed_first_job_cancels_the_rest_of_the_chain(client, store, clock):
    set_nodes(store, clock, "n1")
    a = submit(client, command="a", max_retries=0)
    b = submit(client, command="b", depends_on=[{"job_id": a["job_id"]}])
    c = submit(client, command="c", depends_on=[{"job_id": b["job_id"]}])
    on_failure = submit(client, command="alert", depends_on=[{"job_id": a["job_id"], "condition": "failed"}])
    always = submit(client, command="cleanup", depends_on=[{"job_id": c["job_id"], "condition": "finished"}])
    end_attempt(client, a["job_id"], "failed", 1)
    place(store, clock)
    assert client.get(f"/jobs/{b['job_id']}").json["status"] == "cancelled"
    assert client.get(f"/jobs/{c['job_id']}").json["status"] == "cancelled"
    reason = client.get(f"/jobs/{c['job_id']}/events").json[-1]["reason"]
    assert reason == f"dependency {b['job_id']} ended cancelled, so it can never be done; cancelled"
    assert state(client, on_failure["job_id"]) == ("pending", True)  # afternotok: its condition holds
    assert state(client, always["job_id"]) == ("pending", True)      # afterany: a cancelled job finished too


def test_on_dependency_failure_run_runs_anyway(client, store, clock):
    set_nodes(store, clock, "n1")
    a = submit(client, command="a", max_retries=0)
    b = submit(client, command="b", depends_on=[{"job_id": a["job_id"]}], on_dependency_failure="run")
    assert b["on_dependency_failure"] == "run"
    end_attempt(client, a["job_id"], "failed", 1)
    place(store, clock)
    assert state(client, b["job_id"]) == ("pending", True)


def test_cancelling_a_job_cancels_the_jobs_it_can_no_longer_satisfy(client, store, clock):
    set_nodes(store, clock, "n1")
    a = submit(client, command="a")
    b = submit(client, command="b", depends_on=[{"job_id": a["job_id"]}])
    after = submit(client, command="c", depends_on=[{"job_id": a["job_id"], "condition": "finished"}])
    client.post(f"/jobs/{a['job_id']}/cancel", json={})
    place(store, clock)
    assert client.get(f"/jobs/{b['job_id']}").json["status"] == "cancelled"
    assert state(client, after["job_id"]) == ("pending", True)


def test_a_job_waits_for_every_condition(client, store, clock):
    set_nodes(store, clock, "n1")
    a, b = submit(client, command="a"), submit(client, command="b")
    both = submit(client, command="c", depends_on=[{"job_id": a["job_id"]}, {"job_id": b["job_id"]}])
    end_attempt(client, a["job_id"], "done")
    place(store, clock)
    job = client.get(f"/jobs/{both['job_id']}").json
    assert job["node_id"] is None and job["pending_reason"]["job_id"] == b["job_id"]
    end_attempt(client, b["job_id"], "done")
    place(store, clock)
    assert state(client, both["job_id"]) == ("pending", True)


def test_a_dependency_that_already_ended_is_decided_at_once(client, store, clock):
    set_nodes(store, clock, "n1")
    a = submit(client, command="a", max_retries=0)
    end_attempt(client, a["job_id"], "done")
    assert submit(client, command="b", depends_on=[{"job_id": a["job_id"]}])["node_id"] is not None
    assert submit(client, command="c", depends_on=[{"job_id": a["job_id"], "condition": "failed"}])["status"] \
        == "cancelled"


def test_a_batch_submits_a_whole_pipeline(client, store, clock):
    set_nodes(store, clock, "n1")
    jobs = client.post("/jobs/batch", json={"jobs": [
        {"command": "extract"},
        {"command": "transform", "depends_on": [{"index": 0}]},
        {"command": "load", "depends_on": [{"index": 1}], "priority": 80}]}).json
    assert [j["pending_reason"]["code"] for j in jobs] == ["placed", "dependency", "dependency"]
    assert jobs[2]["pending_reason"]["job_id"] == jobs[1]["job_id"]
    # An earlier item named by its index shows as its job id.
    assert [j["depends_on"] for j in jobs] == [None, [{"job_id": jobs[0]["job_id"], "condition": "done"}],
                                               [{"job_id": jobs[1]["job_id"], "condition": "done"}]]
    assert [j["depends_on"] for j in client.get("/jobs").json] == [j["depends_on"] for j in jobs]
    for first, then in ((jobs[0], jobs[1]), (jobs[1], jobs[2])):
        end_attempt(client, first["job_id"], "done")
        place(store, clock)
        assert state(client, then["job_id"]) == ("pending", True)


def test_bad_dependencies_are_refused_and_change_nothing(client, store, clock):
    set_nodes(store, clock, "n1")
    for body, says in [
        ({"depends_on": [{"job_id": "job-99"}]}, "'depends_on' names job-99, which does not exist"),
        ({"depends_on": [{"index": 0}]}, "names an item of the same POST /jobs/batch"),
        ({"depends_on": [{"job_id": "job-1", "index": 0}]}, "a dependency names a 'job_id' or"),
        ({"depends_on": [{"job_id": "job-1", "condition": "ok"}]}, "'condition' must be one of"),
        ({"depends_on": [{"job_id": "nope"}]}, "'job_id' must be a job id"),
        ({"on_dependency_failure": "ignore"}, "'on_dependency_failure' must be one of"),
    ]:
        refused = client.post("/jobs", json={"command": "x", **body})
        assert refused.status_code == 400 and says in refused.json["error"], (body, refused.json)
    for jobs, says in [
        ([{"command": "x", "depends_on": [{"index": 0}]}], "item 0: a dependency's 'index' must name an earlier"),
        ([{"command": "x"}, {"command": "x", "depends_on": [{"index": 1}]}], "must name an earlier item (0 to 0)"),
        ([{"command": "x"}, {"command": "x", "depends_on": [{"job_id": "job-42"}]}], "job-42, which does not"),
    ]:
        refused = client.post("/jobs/batch", json={"jobs": jobs})
        assert refused.status_code == 400 and says in str(refused.json), refused.json
    assert client.get("/jobs").json == []


def test_the_background_pass_settles_a_condition_a_concurrent_end_missed(client, store, clock):
    """On PostgreSQL a job may end in a transaction that cannot see a dependency recorded
    meanwhile; the background pass decides it."""
    from corral.scheduler.models import Job
    set_nodes(store, clock, "n1")
    a = submit(client, command="a")
    b = submit(client, command="b", depends_on=[{"job_id": a["job_id"]}])
    Job.update(status="done", finished_at=clock()).where(Job.id == int(a["job_id"][4:])).execute()  # unseen
    assert client.get(f"/jobs/{b['job_id']}").json["pending_reason"]["code"] == "dependency"
    assert store.dependents.settle_missed(clock()) == 1
    assert store.dependents.settle_missed(clock()) == 0
    place(store, clock)
    assert state(client, b["job_id"]) == ("pending", True)
