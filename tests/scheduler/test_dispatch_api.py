"""Fast dispatch, in process: claims, batches, the change feed, the waiting room and
the retention purge, through Flask's test client and the store on a real SQLite file,
with a fake clock. The same features against real gunicorn: test_dispatch.py."""
import contextlib
import sqlite3
import threading
import time

import peewee
import pytest

from corral.scheduler import longpoll
from corral.scheduler.app import create_schema, open_store
from corral.scheduler.loops import PURGE_INTERVAL_SECS, Background
from corral.scheduler.models import MODELS, Job, JobEvent, NodeLease
from corral.scheduler.service import Scheduler
from corral.scheduler.settings import SchedulerSettings
from corral.server.changefeed import ChangeFeed
from corral.shared.errors import SettingError
from helpers import wait_for
from scheduler_app import make_app, set_nodes, submit

T0 = 1_800_000_000.0


def claim(client, node_id, **body):
    body.setdefault("max", 10)
    body.setdefault("wait_secs", 0)
    response = client.post(f"/nodes/{node_id}/claim", json=body)
    assert response.status_code == 200, response.json
    return response.json


def submit_batch(client, jobs, **kwargs):
    return client.post("/jobs/batch", json={"jobs": jobs}, **kwargs)


# ---- claims ---------------------------------------------------------------------------

def test_a_claim_is_the_running_transition_of_the_current_attempt(client, store, clock):
    set_nodes(store, clock, "n1", "n2")
    submit_batch(client, [{"command": "a"}, {"command": "b", "memory_mb": 256}, {"command": "c"},
                          {"command": "s", "job_type": "service"}])
    clock.now += 5
    defaults = {"run": {"memory_mb": 300, "cpu_percent": 50}, "service": {"memory_mb": 900, "cpu_percent": 150}}
    jobs = claim(client, "n1", limits_enforced=True, default_limits=defaults)
    assert [j["job_id"] for j in jobs] == ["job-1", "job-3"]   # round-robin put job-2 and job-4 on n2
    assert all(j["status"] == "running" and j["attempt"] == 1 and j["node_id"] == "n1" for j in jobs)
    assert jobs[0]["running_at"] == "2027-01-15T08:00:05.000Z"
    assert jobs[0]["limits_enforced"] is True and jobs[0]["limits"] == {"memory_mb": 300, "cpu_percent": 50}
    others = {j["job_id"]: j for j in claim(client, "n2", limits_enforced=True, default_limits=defaults)}
    assert others["job-2"]["limits"] == {"memory_mb": 256, "cpu_percent": 50}     # its own request first
    assert others["job-4"]["limits"] == {"memory_mb": 900, "cpu_percent": 150}    # the service default
    events = client.get("/jobs/job-1/events").json
    assert [(e["from"], e["to"], e["attempt"], e["node_id"]) for e in events][-1] == ("pending", "running", 1, "n1")
    assert events[-1]["reason"] == "claimed by the node"
    # Claimed once: nothing more for anyone, and the old-style report is a harmless repeat.
    assert claim(client, "n1") == [] and claim(client, "n2") == []
    repeat = client.post("/jobs/job-1/status", json={"node_id": "n1", "attempt": 1, "status": "running"})
    assert repeat.status_code == 200 and len(client.get("/jobs/job-1/events").json) == len(events)
    done = client.post("/jobs/job-1/status", json={"node_id": "n1", "attempt": 1, "status": "done", "exit_code": 0})
    assert done.json["status"] == "done"


def test_without_limits_enforced_no_limits_are_recorded(client, store, clock):
    set_nodes(store, clock, "n1")
    client.post("/jobs", json={"command": "x"})
    (job,) = claim(client, "n1", limits_enforced=False)
    assert job["limits_enforced"] is False and job["limits"] is None
    client.post("/jobs", json={"command": "y"})
    (job,) = claim(client, "n1", limits_enforced=True)   # no defaults sent: the design's
    assert job["limits"] == {"memory_mb": 512, "cpu_percent": 100}


def test_a_claim_never_exceeds_max_nor_the_nodes_free_slots(database_url, clock):
    app = make_app(database_url, clock, max_jobs_per_node=3)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1", slots=8)
    submit_batch(client, [{"command": str(i)} for i in range(6)])
    assert [j["job_id"] for j in claim(client, "n1", max=2)] == ["job-1", "job-2"]
    assert [j["job_id"] for j in claim(client, "n1", max=5)] == ["job-3"]   # 3 running: the node is full
    assert claim(client, "n1") == []
    client.post("/jobs/reports", json={"reports": [{"job_id": "job-1", "node_id": "n1", "attempt": 1,
                                                    "status": "done", "exit_code": 0}]})
    assert [j["job_id"] for j in claim(client, "n1")] == ["job-4"]


def test_a_claim_renews_the_lease_and_places_waiting_work_first(client, store, clock):
    set_nodes(store, clock, "n1", slots=1)
    client.post("/jobs", json={"command": "first"})
    client.post("/jobs", json={"command": "second"})   # waits: n1 has one slot
    claim(client, "n1")
    assert NodeLease.get_by_id("n1").renewed_at == clock.now
    clock.now += 3
    # Free the slot without a dispatch (as when a retry's backoff just expired).
    Job.update(status="done", finished_at=clock.now).where(Job.id == 1).execute()
    (job,) = claim(client, "n1")
    assert job["job_id"] == "job-2" and NodeLease.get_by_id("n1").renewed_at == clock.now


def write_mark(db) -> object:
    """Something that changes with every committed write: SQLite's data_version (seen
    from a connection of its own), else the newest transaction id of any row."""
    if isinstance(db, peewee.SqliteDatabase):
        with contextlib.closing(sqlite3.connect(db.database)) as conn:
            return conn.execute("PRAGMA data_version").fetchone()[0]
    with db.connection_context():
        return [db.execute_sql(f"SELECT max(xmin::text::bigint) FROM {model._meta.table_name}").fetchone()[0]
                for model in MODELS]


def test_a_claim_that_takes_nothing_writes_nothing_and_a_lost_answer_is_requeued(client, store, clock):
    set_nodes(store, clock, "n1", slots=1)
    before = write_mark(store.db)
    assert claim(client, "n1") == []
    # No write at all: no lease for an idle node, and nothing for the watchers to see.
    assert NodeLease.get_or_none(NodeLease.node_id == "n1") is None
    assert write_mark(store.db) == before
    client.post("/jobs", json={"command": "x"})
    taken_at = clock.now
    (job,) = claim(client, "n1")          # say this answer never reaches the agent
    clock.now += 10
    assert claim(client, "n1") == []      # later empty claims do not keep the lease alive
    settings = store.settings
    clock.now = taken_at + settings.heartbeat_timeout_secs + settings.node_lost_grace_secs + 1
    assert store.leases.requeue_lost(clock.now, watching_since=taken_at - 100) == [job["job_id"]]
    assert client.get(f"/jobs/{job['job_id']}").json["status"] == "pending"


def test_claims_from_other_nodes_and_stale_placements_take_nothing(client, store, clock):
    set_nodes(store, clock, "n1", "n2")
    client.post("/jobs", json={"command": "x", "instance_id": "n1"})
    assert claim(client, "n2") == [] and claim(client, "nobody") == []
    assert client.get("/jobs/job-1").json["status"] == "pending"


@pytest.mark.parametrize("body, message", [
    ({}, "'max' is required"),
    ({"max": 0}, "'max' must be between 1 and 1000"),
    ({"max": 1001}, "'max' must be between 1 and 1000"),
    ({"max": 1, "wait_secs": 26}, "'wait_secs' must be a number of seconds from 0 to 25"),
    ({"max": 1, "wait_secs": -1}, "'wait_secs'"),
    ({"max": 1, "wait_secs": True}, "'wait_secs'"),
    ({"max": 1, "limits_enforced": "yes"}, "'limits_enforced' must be true or false"),
    ({"max": 1, "default_limits": {"batch": {}}}, "unknown field 'batch'"),
    ({"max": 1, "default_limits": {"run": {"memory_mb": 1}}}, "'cpu_percent' is required"),
    ({"max": 1, "surprise": 1}, "unknown field 'surprise'"),
])
def test_bad_claims_are_400(client, body, message):
    response = client.post("/nodes/n1/claim", json=body)
    assert response.status_code == 400 and message in response.json["error"], response.json
    assert client.post("/nodes/bad%20id/claim", json={"max": 1}).status_code == 400


def test_a_claim_that_waits_answers_when_work_is_placed_on_its_node(client, store, clock):
    set_nodes(store, clock, "n1", "n2")
    answers = {}

    def wait(node_id):
        started = time.monotonic()
        own = client.application.test_client()
        while True:
            response = own.post(f"/nodes/{node_id}/claim", json={"max": 1, "wait_secs": 20})
            if response.headers.get("X-Corral-Long-Poll") != "again":  # asked again at once, as agents do
                break
        answers[node_id] = (response.json, time.monotonic() - started)

    threads = [threading.Thread(target=wait, args=(n,)) for n in ("n1", "n2")]
    for thread in threads:
        thread.start()
    room = client.application.extensions["corral.wait_room"]
    wait_for(lambda: room.waiting == 2, timeout=10, message="both claims to wait")
    client.post("/jobs", json={"command": "x", "instance_id": "n2"})
    threads[1].join(10)
    jobs, elapsed = answers["n2"]
    assert [j["job_id"] for j in jobs] == ["job-1"] and elapsed < 10
    assert "n1" not in answers and room.waiting == 1   # the other node's claim still waits
    client.post("/jobs", json={"command": "y", "instance_id": "n1"})
    threads[0].join(10)
    assert [j["job_id"] for j in answers["n1"][0]] == ["job-2"]
    room.feed.stop()


def test_a_poked_claim_reads_nothing_before_its_transaction_where_writers_do_not_wait(
        database_url, clock, monkeypatch):
    """On PostgreSQL a claim woken by work placed on its node goes straight to its
    transaction; on SQLite it first reads whether it may claim (a write transaction
    that finds nothing would hold up every other writer)."""
    monkeypatch.setattr(longpoll, "FRESH_SECS", 60.0)   # a slow machine: no "ask again" to count
    app = make_app(database_url, clock)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1")
    reads = []
    may_claim = type(store.claims).may_claim
    monkeypatch.setattr(type(store.claims), "may_claim", lambda self, node_id, now: reads.append(node_id)
                        or may_claim(self, node_id, now))
    answer = []
    waiting = threading.Thread(target=lambda: answer.append(app.test_client().post(
        "/nodes/n1/claim", json={"max": 1, "wait_secs": 20}).json))
    waiting.start()
    room = app.extensions["corral.wait_room"]
    wait_for(lambda: room.waiting == 1, timeout=10, message="the claim to wait")
    client.post("/jobs", json={"command": "x"})
    waiting.join(10)
    assert [j["job_id"] for j in answer[0]] == ["job-1"]
    assert reads == (["n1"] if database_url.startswith("postgresql") else ["n1", "n1"])
    room.feed.stop()


def test_work_for_a_claim_that_waited_a_while_is_taken_by_the_next_claim(client, store, clock, monkeypatch):
    monkeypatch.setattr(longpoll, "FRESH_SECS", 0.0)   # every waiting claim is "old"
    set_nodes(store, clock, "n1")
    room = client.application.extensions["corral.wait_room"]
    looked = []  # the waiting claim's first look, which must find nothing
    first_look = Scheduler.claim

    def claim_and_tell(self, *args, **kwargs):
        try:
            return first_look(self, *args, **kwargs)
        finally:
            looked.append(True)

    monkeypatch.setattr(Scheduler, "claim", claim_and_tell)
    answer = {}
    thread = threading.Thread(target=lambda: answer.update(r=client.application.test_client().post(
        "/nodes/n1/claim", json={"max": 1, "wait_secs": 20})))
    thread.start()
    wait_for(lambda: room.waiting == 1 and looked, timeout=10, message="the claim to wait")
    client.post("/jobs", json={"command": "x"})
    thread.join(10)
    # The request may be no proof of life any more: nothing is claimed, ask again.
    assert answer["r"].json == [] and answer["r"].headers["X-Corral-Long-Poll"] == "again"
    assert client.get("/jobs/job-1").json["status"] == "pending"
    assert [j["job_id"] for j in claim(client, "n1", wait_secs=20)] == ["job-1"]
    room.feed.stop()


def test_a_full_waiting_room_answers_at_once(database_url, clock):
    app = make_app(database_url, clock, long_poll_max_waiters=0)
    response = app.test_client().post("/nodes/n1/claim", json={"max": 1, "wait_secs": 20})
    assert response.status_code == 200 and response.json == []
    assert response.headers["X-Corral-Long-Poll"] == "busy"
    quiet = app.test_client().post("/nodes/n1/claim", json={"max": 1, "wait_secs": 0})
    assert "X-Corral-Long-Poll" not in quiet.headers


def test_default_waiters_leave_threads_for_other_requests():
    assert longpoll.default_max_waiters(128) == 120
    assert longpoll.default_max_waiters(64) == 56
    assert longpoll.default_max_waiters(8) == 4
    assert longpoll.default_max_waiters(1) == 0


# ---- the change feed and the waiting room ----------------------------------------------------

class ManualFeed(ChangeFeed):
    def __init__(self):
        super().__init__(interval=1.0)

    def ensure_started(self):
        pass


def test_the_room_pokes_one_node_and_checks_once_per_change_for_all():
    checks = []
    work = {"n2"}

    def check(nodes, recheck):
        checks.append(set(nodes))
        assert recheck is False   # a change noticed: not a re-check
        return nodes & work

    feed = ManualFeed()
    room = longpoll.WaitRoom(feed, max_waiters=3, check=check)
    a, b, c = room.enter("n1"), room.enter("n2"), room.enter("n3")
    assert room.enter("n4") is None and room.refused == 1   # full
    room.poke({"n1"})   # a local commit placed a job on n1
    assert a.event.is_set() and room.take_poke(a) and not b.event.is_set() and not c.event.is_set()
    a.event.clear()
    feed.changed()      # a commit somewhere: one query for every waiting node
    assert checks == [{"n1", "n2", "n3"}]
    assert b.event.is_set() and room.take_poke(b)
    assert not a.event.is_set() and not c.event.is_set()   # nothing for them: not even woken
    room.leave(b)
    assert room.waiting == 2 and room.enter("n4") is not None
    room.leave(a), room.leave(c)
    feed.changed()
    assert len(checks) == 2 and checks[-1] == {"n4"}
    room.close()
    assert room.closed and room.enter("n5") is None


def test_a_change_that_names_its_nodes_wakes_their_waiters_without_a_query():
    checks = []

    def check(nodes, recheck):
        checks.append(nodes)
        return set(nodes)

    feed = ManualFeed()
    room = longpoll.WaitRoom(feed, max_waiters=3, check=check)
    a, b = room.enter("n1"), room.enter("n2")
    feed.changed(nodes={"n2", "n9"})   # another replica placed work on n2 (and on n9, nobody waits)
    assert checks == [] and room.take_poke(b) and not a.event.is_set()
    feed.changed(recheck=True, nodes={"n2"})   # a re-check always asks
    assert len(checks) == 1


def test_a_failing_check_lets_every_waiter_look(caplog):
    def check(nodes, recheck):
        raise RuntimeError("database is locked")

    feed = ManualFeed()
    room = longpoll.WaitRoom(feed, max_waiters=2, check=check)
    a, b = room.enter("n1"), room.enter("n2")
    feed.changed()
    assert room.take_poke(a) and room.take_poke(b) and "checking 2 waiting node(s)" in caplog.text


# ---- batches -----------------------------------------------------------------------------------

def test_a_batch_of_1000_jobs_is_stored_in_one_call(client, store, clock):
    set_nodes(store, clock, "n1", "n2")
    response = submit_batch(client, [{"command": f"echo {i}", "env_vars": {"N": str(i)}} for i in range(1000)])
    assert response.status_code == 201
    jobs = response.json
    assert len(jobs) == 1000 and [j["job_id"] for j in jobs] == [f"job-{i}" for i in range(1, 1001)]
    assert [j["command"] for j in jobs[:3]] == ["echo 0", "echo 1", "echo 2"] and jobs[999]["env_vars"] == {"N": "999"}
    assert [j["node_id"] for j in jobs[:10]] == ["n1", "n2"] * 4 + [None, None]   # placed as far as there is room
    assert Job.select().count() == 1000 and JobEvent.select().where(JobEvent.reason == "submitted").count() == 1000


def test_one_invalid_item_stores_nothing(client):
    jobs = [{"command": "true"} for _ in range(1000)]
    jobs[417] = {"command": "true", "port": 0}
    jobs[998] = "echo not an object"
    response = submit_batch(client, jobs)
    assert response.status_code == 400
    assert response.json["errors"] == [{"index": 417, "error": "'port' must be between 1 and 65535"},
                                       {"index": 998, "error": "a job request must be a JSON object"}]
    assert response.json["error"].startswith("item 417: ")
    assert client.get("/jobs").json == [] and Job.select().count() == 0


@pytest.mark.parametrize("body", [{}, {"jobs": []}, {"jobs": {"command": "x"}}, {"jobs": [{"command": "x"}] * 1001},
                                  {"jobs": [{"command": "x"}], "extra": 1}])
def test_bad_batch_bodies_are_400(client, body):
    response = client.post("/jobs/batch", json=body)
    assert response.status_code == 400 and response.json["error"]
    assert Job.select().count() == 0


@pytest.mark.slow
def test_a_batch_over_a_nodes_limits_stores_nothing(client, store, clock):
    store.nodes.sync_nodes([{"node_id": "n1", "address": "a", "kind": "compute", "slots": 4, "status": "healthy",
                             "max_memory_mb": 1024, "max_cpu_percent": 200}], clock())
    response = submit_batch(client, [{"command": "ok"}, {"command": "big", "memory_mb": 4096}])
    assert response.status_code == 400 and response.json["errors"][0]["index"] == 1
    assert Job.select().count() == 0


def test_a_batch_with_an_idempotency_key_is_stored_once(client):
    jobs = [{"command": "a"}, {"command": "b"}]
    first = submit_batch(client, jobs, headers={"Idempotency-Key": "nightly-1"})
    again = submit_batch(client, jobs, headers={"Idempotency-Key": "nightly-1"})
    assert first.status_code == 201 and again.status_code == 200
    assert [j["job_id"] for j in again.json] == [j["job_id"] for j in first.json] == ["job-1", "job-2"]
    other = submit_batch(client, [{"command": "a"}, {"command": "c"}], headers={"Idempotency-Key": "nightly-1"})
    assert other.status_code == 409 and "item 1" in other.json["error"]
    assert Job.select().count() == 2


def test_batched_reports_apply_each_on_its_own(client, store, clock):
    set_nodes(store, clock, "n1")
    submit_batch(client, [{"command": str(i)} for i in range(4)])
    claim(client, "n1")
    reports = [
        {"job_id": "job-1", "node_id": "n1", "attempt": 1, "status": "done", "exit_code": 0, "stdout": "one"},
        {"job_id": "job-2", "node_id": "n1", "attempt": 9, "status": "done", "exit_code": 0},   # stale
        {"job_id": "job-3", "node_id": "n1", "attempt": 1, "status": "failed", "exit_code": 2},
        {"job_id": "job-4", "node_id": "n2", "attempt": 1, "status": "done", "exit_code": 0},   # other node
        {"job_id": "job-77", "node_id": "n1", "attempt": 1, "status": "done", "exit_code": 0},  # unknown
        {"job_id": "job-4", "node_id": "n1", "attempt": 1, "status": "done"},                   # invalid
    ]
    response = client.post("/jobs/reports", json={"reports": reports})
    assert response.status_code == 200
    results = response.json["results"]
    assert [(r["index"], r["job_id"], r["code"]) for r in results] == [
        (0, "job-1", 200), (1, "job-2", 409), (2, "job-3", 200), (3, "job-4", 409), (4, "job-77", 404),
        (5, "job-4", 400)]
    assert results[0]["job_status"] == "done" and results[2]["job_status"] == "pending"   # retried
    assert "stale" in results[1]["error"] and "'exit_code'" in results[5]["error"]
    assert client.get("/jobs/job-1").json["stdout"] == "one"
    assert client.get("/jobs/job-2").json["status"] == "running"   # refused: unchanged
    assert client.get("/jobs/job-4").json["status"] == "running"
    assert client.get("/jobs/job-3").json["attempt"] == 2          # placed again in the freed slot
    assert client.post("/jobs/reports", json={"reports": []}).status_code == 400


def test_reports_with_outputs_of_their_own_each_keep_theirs(client, store, clock):
    """Reports that change the same fields with different values (every real job's
    output, CPU time and peak memory differ) are written together; a stale one among
    them changes nothing."""
    set_nodes(store, clock, "n1", slots=4)
    submit_batch(client, [{"command": str(i)} for i in range(4)])
    claimed = claim(client, "n1")
    assert len(claimed) == 4
    reports = [{"job_id": job["job_id"], "node_id": "n1", "attempt": 1 if i < 3 else 9, "status": "done",
                "exit_code": 0, "stdout": f"out {i}", "stderr": f"err {i}" if i else "", "cpu_seconds": i + 0.5,
                "peak_memory_bytes": (i + 1) << 20, "oom_killed": False} for i, job in enumerate(claimed)]
    results = client.post("/jobs/reports", json={"reports": reports}).json["results"]
    assert [r["code"] for r in results] == [200, 200, 200, 409]
    for i, job in enumerate(claimed[:3]):
        got = client.get(f"/jobs/{job['job_id']}").json
        assert (got["status"], got["stdout"], got["stderr"], got["cpu_seconds"], got["peak_memory_bytes"]) == (
            "done", f"out {i}", f"err {i}" if i else "", i + 0.5, (i + 1) << 20)
    untouched = client.get(f"/jobs/{claimed[3]['job_id']}").json
    assert (untouched["status"], untouched["stdout"]) == ("running", None)


def test_a_claim_riding_on_reports_takes_the_freed_slots(client, store, clock):
    set_nodes(store, clock, "n1", slots=2)
    submit_batch(client, [{"command": str(i)} for i in range(5)])
    assert [j["job_id"] for j in claim(client, "n1")] == ["job-1", "job-2"]  # the node is full
    done = [{"job_id": "job-1", "node_id": "n1", "attempt": 1, "status": "done", "exit_code": 0}]
    answer = client.post("/jobs/reports", json={"reports": done, "claim": {
        "node_id": "n1", "max": 5, "wait_secs": 20, "limits_enforced": False}}).json
    assert [r["code"] for r in answer["results"]] == [200]
    # One slot freed: exactly one job, placed and claimed in the same transaction.
    (taken,) = answer["claimed"]
    assert taken["job_id"] == "job-3" and taken["status"] == "running" and taken["node_id"] == "n1"
    assert [e["to"] for e in client.get("/jobs/job-3/events").json] == ["pending", "pending", "running"]
    # A refused report frees nothing; the claim then finds the node full.
    stale = [{"job_id": "job-2", "node_id": "n1", "attempt": 7, "status": "done", "exit_code": 0}]
    answer = client.post("/jobs/reports", json={"reports": stale, "claim": {"node_id": "n1", "max": 1}}).json
    assert answer["results"][0]["code"] == 409 and answer["claimed"] == []
    assert "claimed" not in client.post("/jobs/reports", json={"reports": stale}).json


def test_a_node_no_longer_listed_may_claim_only_within_the_slots_its_running_jobs_leave(database_url, clock):
    """Its running jobs still count against the most a node may run, and placement
    offers it nothing (it is not a healthy compute node any more)."""
    app = make_app(database_url, clock, max_jobs_per_node=3)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1", slots=3)
    submit_batch(client, [{"command": "a"}, {"command": "b"}])
    assert len(claim(client, "n1")) == 2
    assert store.claims.claim_room("n1", {"max": 5}, clock()) == (1, False)  # a free slot, but nothing waits
    submit(client, command="c", instance_id="n2")   # waits unplaced for n2, which nobody lists yet
    assert store.claims.claim_room("n1", {"max": 5}, clock()) == (1, True)   # placement may look first
    set_nodes(store, clock, "n2", slots=1)  # n1 is gone from the registry's list
    assert store.claims.claim_room("n1", {"max": 5}, clock()) == (1, False)
    assert store.claims.claim_room("n1", {"max": 1}, clock()) == (1, False)
    assert store.claims.claim_room("never-seen", {"max": 5}, clock()) == (3, False)


def test_a_claim_riding_on_reports_that_freed_nothing_still_places_due_work(database_url, clock):
    """The claim's own look for waiting work is skipped only when the reports' placement
    already offered this node's free slots: here none of them applied, and a retry that
    became due meanwhile goes to the claiming node's free slot."""
    app = make_app(database_url, clock, max_jobs_per_node=2, retry_base_secs=10.0, max_job_retries=1)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1", slots=2)
    submit_batch(client, [{"command": "a"}])
    (job,) = claim(client, "n1")
    failed = [{"job_id": job["job_id"], "node_id": "n1", "attempt": 1, "status": "failed", "exit_code": 1}]
    assert client.post("/jobs/reports", json={"reports": failed}).json["results"][0]["job_status"] == "pending"
    assert client.get(f"/jobs/{job['job_id']}").json["node_id"] is None  # its retry is not due yet
    clock.now += 3600
    stale = [{"job_id": job["job_id"], "node_id": "n1", "attempt": 7, "status": "done", "exit_code": 0}]
    answer = client.post("/jobs/reports", json={"reports": stale, "claim": {"node_id": "n1", "max": 2}}).json
    assert answer["results"][0]["code"] == 409
    assert [(j["job_id"], j["attempt"], j["status"]) for j in answer["claimed"]] == [(job["job_id"], 2, "running")]


@pytest.mark.parametrize("claim_body", ["n1", {"max": 1}, {"node_id": "n1"}, {"node_id": "n1", "max": 0},
                                        {"node_id": "n1", "max": 1, "extra": 1}])
def test_a_bad_riding_claim_is_400_and_applies_no_report(client, store, clock, claim_body):
    set_nodes(store, clock, "n1")
    submit_batch(client, [{"command": "x"}])
    claim(client, "n1")
    done = [{"job_id": "job-1", "node_id": "n1", "attempt": 1, "status": "done", "exit_code": 0}]
    assert client.post("/jobs/reports", json={"reports": done, "claim": claim_body}).status_code == 400
    assert client.get("/jobs/job-1").json["status"] == "running"


# ---- retention -----------------------------------------------------------------------------------

@pytest.fixture
def plain_store(database_url):
    settings = SchedulerSettings(database_url=database_url, job_retention_secs=1000,
                                 job_purge_batch=2, retry_base_secs=0.0)
    create_schema(settings)
    store = open_store(settings)
    return store


class NoRegistry:
    def list_nodes(self, kind=None, status=None):
        return [{"node_id": "n1", "address": "a", "kind": "compute", "slots": 10, "status": "healthy"}]


def finish(store, job_id, status, now):
    scheduler = Scheduler(store)
    job = store.jobs.get(job_id)
    if status == "cancelled":
        return scheduler.cancel(job_id, now)
    scheduler.report(job_id, {"node_id": job.node_id, "attempt": job.attempt, "status": "running",
                              "limits_enforced": None, "limits": None}, now)
    return scheduler.report(job_id, {"node_id": job.node_id, "attempt": job.attempt, "status": status,
                                 "exit_code": 0 if status == "done" else 1, "stdout": "", "stderr": "",
                                 "oom_killed": None, "peak_memory_bytes": None, "cpu_seconds": None,
                                 "requeue": False}, now)


def test_old_finished_jobs_are_purged_in_chunks_with_their_events(plain_store):
    store = plain_store
    background = Background(store, NoRegistry(), "me")
    background.tick(T0)   # nodes known
    ids = [Scheduler(store).submit({"command": str(i), "max_retries": 0}, T0)[0].job_id for i in range(8)]
    for job_id, status in zip(ids[:4], ("done", "failed", "cancelled", "done")):
        finish(store, job_id, status, T0 + 10)           # old, once the clock moves on
    finish(store, ids[4], "done", T0 + 900)               # recent
    store.reports.report(ids[5], {"node_id": "n1", "attempt": 1, "status": "running", "limits_enforced": None,
                                  "limits": None}, T0 + 10)       # running since long ago: active, kept
    finish(store, ids[7], "done", T0 + 10)                # old; on SQLite the newest row: kept
    keeps_newest = store.db.reuses_ids
    now = T0 + 1500
    before = JobEvent.select().count()
    assert background.purge(now) == 2                     # one chunk per pass
    assert background.next_purge == now                   # a full chunk: more to do next pass
    store.leases.renew_lease("n1", now)                          # (n1 is alive: job-6 stays running)
    background.tick(now + 1)                              # the leader's pass runs the next chunk
    assert background.purge(now + 2) == (0 if keeps_newest else 1)   # the rest: no full chunk left
    assert background.next_purge == now + 2 + PURGE_INTERVAL_SECS
    left = {job.job_id: job.status for job in Job.select()}
    assert set(left) == {ids[4], ids[5], ids[6]} | ({ids[7]} if keeps_newest else set())
    assert left[ids[5]] == "running" and left[ids[6]] == "pending"
    assert JobEvent.select().where(JobEvent.job.not_in([int(j[4:]) for j in left])).count() == 0
    assert JobEvent.select().count() < before
    # Ids are never handed out again: the next job gets a new one.
    assert store.submits.submit({"command": "new"}, now)[0].id == 9


def test_retention_zero_keeps_everything(database_url):
    settings = SchedulerSettings(database_url=database_url, job_retention_secs=0)
    create_schema(settings)
    store = open_store(settings)
    job, _ = store.submits.submit({"command": "x"}, T0)
    store.actions.cancel(job.job_id, T0)
    store.submits.submit({"command": "y"}, T0)
    assert Background(store, NoRegistry(), "me").purge(T0 + 10**9) == 0 and Job.select().count() == 2
    assert SchedulerSettings.from_env({"JOB_RETENTION_SECS": "0"}).job_retention_secs == 0
    defaults = SchedulerSettings.from_env({})
    assert (defaults.job_retention_secs, defaults.job_purge_batch, defaults.long_poll_max_waiters) == \
        (7 * 86400, 500, None)
    assert SchedulerSettings.from_env({"LONG_POLL_MAX_WAITERS": "0"}).long_poll_max_waiters == 0
    with pytest.raises(SettingError, match="JOB_PURGE_BATCH must be at least 1"):
        SchedulerSettings.from_env({"JOB_PURGE_BATCH": "0"})


def test_a_recheck_with_no_placement_since_the_last_look_runs_no_grouped_query(database_url, clock, monkeypatch):
    """The idle fleet's cost: a feed's periodic re-check (PostgreSQL) or a commit that
    placed nothing (SQLite: a lease renewal) must not query every waiting node; a
    placement, or on PostgreSQL a notification or FULL_LOOK_SECS passed, must."""
    from corral.scheduler import wiring as appmod
    app = make_app(database_url, clock)
    client, store = app.test_client(), app.extensions["corral.store"]
    check = app.extensions["corral.wait_room"]._check
    looks = []
    real = store.claims.nodes_with_work
    monkeypatch.setattr(store.claims, "nodes_with_work", lambda nodes: looks.append(set(nodes)) or real(nodes))
    set_nodes(store, clock, "n1", "n2")
    assert check({"n1"}, True) == set() and len(looks) == 1        # the first look always queries
    assert check({"n1"}, True) == set() and len(looks) == 1        # nothing placed since
    submit_batch(client, [{"command": "true"}])                     # placed on n1 (round robin's first)
    assert check({"n1", "n2"}, True) == {"n1"} and len(looks) == 2
    assert check({"n1", "n2"}, True) == set() and len(looks) == 2
    if store.marks.marks_placements:
        return   # SQLite: the placement mark is exact; no notification, no full look
    assert check({"n1", "n2"}, False) == {"n1"} and len(looks) == 3  # a notification always looks
    monkeypatch.setattr(appmod, "FULL_LOOK_SECS", 0.0)              # once in a while, it looks all the same
    assert check({"n1", "n2"}, True) == {"n1"} and len(looks) == 4


def test_the_background_pass_reads_no_node_list_when_nothing_waits_unplaced(database_url, clock, monkeypatch):
    app = make_app(database_url, clock, max_jobs_per_node=1)
    client, store = app.test_client(), app.extensions["corral.store"]
    scheduler = app.extensions["corral.scheduler"]
    set_nodes(store, clock, "n1")
    reads = []
    real = store.snapshot.open_nodes
    monkeypatch.setattr(store.snapshot, "open_nodes", lambda: reads.append(1) or real())
    assert scheduler.place(clock()) == 0 and reads == []               # idle: no read, no lock
    submit_batch(client, [{"command": "a"}, {"command": "b"}])        # b waits: n1 is full
    del reads[:]
    assert scheduler.place(clock()) == 0 and reads == [1]
    set_nodes(store, clock, "n1", "n2")        # a node came: the pass after the refresh places b there
    assert reads == [1, 1] and Job.get(Job.command == "b").node_id == "n2"


def test_the_waiters_check_counts_only_nodes_with_a_free_slot(database_url, clock):
    app = make_app(database_url, clock, max_jobs_per_node=2)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1", "n2", slots=2)
    submit_batch(client, [{"command": str(i)} for i in range(4)])
    assert store.claims.nodes_with_work({"n1", "n2", "n3"}) == {"n1", "n2"}
    claim(client, "n1", max=1)
    assert store.claims.nodes_with_work({"n1", "n2"}) == {"n1", "n2"}
    # n2 shrinks to one slot while a job runs there: its pending job is not claimable.
    claim(client, "n2", max=1)
    set_nodes(store, clock, "n1", "n2", slots=1)
    assert store.claims.nodes_with_work({"n1", "n2"}) == set()
