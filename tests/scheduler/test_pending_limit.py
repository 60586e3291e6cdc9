"""MAX_PENDING_JOBS, on each backend: beyond it every path that creates jobs is refused
(429 with Retry-After and a JSON error naming the limit, the count and the setting)
and writes nothing; a repeat of an idempotent request and a retry of an existing job
are never refused; a schedule's slot refused records a failed run saying why. And
the count behind it (admission.py): made once a second, not on every submit."""
import threading

import pytest

from corral.scheduler import admission
from corral.scheduler.models import Job, JobArray, ScheduleRun
from corral.scheduler.schedules import Schedules
from corral.shared.errors import TooManyRequests
from helpers import wait_for
from corral.scheduler.service import Scheduler
from scheduler_app import end_attempt, make_app, set_nodes, submit

LIMIT = 3


@pytest.fixture
def app(database_url, clock):
    return make_app(database_url, clock, max_jobs_per_node=4, max_pending_jobs=LIMIT)


def stored():
    """Everything a refused request could have written: jobs, arrays, events."""
    return Job.select().count(), JobArray.select().count(), Job.select().where(Job.status == "pending").count()


def assert_refused(response, pending, requested):
    assert response.status_code == 429, response.json
    assert response.headers["Retry-After"] == str(admission.RETRY_AFTER_SECS)
    body = response.json
    assert body["setting"] == "MAX_PENDING_JOBS" and body["max_pending_jobs"] == LIMIT
    assert body["pending_jobs"] == pending and body["requested"] == requested
    assert "MAX_PENDING_JOBS" in body["error"] and f"{pending} pending jobs" in body["error"]


def test_every_submit_path_is_refused_beyond_the_limit_and_writes_nothing(client):
    for _ in range(LIMIT - 1):
        submit(client)
    before = stored()
    assert_refused(client.post("/jobs/batch", json={"jobs": [{"command": "true"}] * 2}), LIMIT - 1, 2)
    assert_refused(client.post("/jobs", json={"command": "true", "array": {"count": 2}}), LIMIT - 1, 2)
    assert stored() == before
    submit(client)  # the last one that fits
    before = stored()
    assert_refused(client.post("/jobs", json={"command": "true"}), LIMIT, 1)
    assert_refused(client.post("/jobs/batch", json={"jobs": [{"command": "true"}]}), LIMIT, 1)
    assert_refused(client.post("/jobs", json={"command": "true", "array": {"count": 1}}), LIMIT, 1)
    assert stored() == before == (LIMIT, 0, LIMIT)


def test_repeats_of_idempotent_requests_are_answered_at_the_limit(client):
    key = {"Idempotency-Key": "nightly-1"}
    first = client.post("/jobs", json={"command": "true"}, headers=key)
    batch = client.post("/jobs/batch", json={"jobs": [{"command": "true"}]}, headers={"Idempotency-Key": "b-1"})
    array = client.post("/jobs", json={"command": "true", "array": {"count": 1}}, headers={"Idempotency-Key": "a-1"})
    assert [r.status_code for r in (first, batch, array)] == [201] * 3
    # At the limit: the same requests again create nothing, so they are answered, not refused.
    assert client.post("/jobs", json={"command": "true"}, headers=key).json == first.json
    assert client.post("/jobs/batch", json={"jobs": [{"command": "true"}]},
                       headers={"Idempotency-Key": "b-1"}).status_code == 200
    assert client.post("/jobs", json={"command": "true", "array": {"count": 1}},
                       headers={"Idempotency-Key": "a-1"}).status_code == 200
    assert client.post("/jobs", json={"command": "true"}, headers={"Idempotency-Key": "new"}).status_code == 429


def test_a_retry_of_an_existing_job_is_never_refused(client, store, clock):
    set_nodes(store, clock, "n1")
    failed = submit(client, command="false", max_retries=0)["job_id"]
    end_attempt(client, failed, status="failed", exit_code=1)
    store.admission.forget()  # the failed job no longer pends: seen at the next count (within RECOUNT_SECS)
    for _ in range(LIMIT):
        submit(client)
    assert client.post("/jobs", json={"command": "true"}).status_code == 429
    retried = client.post(f"/jobs/{failed}/retry", json={})
    assert retried.status_code == 200 and retried.json["status"] == "pending", retried.json
    assert store.stats.count_pending() == LIMIT + 1  # over the limit: a retry is not new work


def test_submits_are_admitted_again_once_pending_jobs_start_or_end(client, store):
    ids = [submit(client)["job_id"] for _ in range(LIMIT)]
    assert client.post("/jobs", json={"command": "true"}).status_code == 429
    assert client.post(f"/jobs/{ids[0]}/cancel", json={}).status_code == 200
    # The process counts again at most every RECOUNT_SECS: within that it may still refuse.
    wait_for(lambda: client.post("/jobs", json={"command": "true"}).status_code == 201, timeout=30,
             message="a submit admitted after a pending job was cancelled")
    assert store.stats.count_pending() == LIMIT


def test_a_schedule_slot_refused_at_the_limit_records_a_failed_run_saying_why(client, store, clock):
    schedules = Schedules(store)
    t0 = clock()
    tick = schedules.create({"name": "tick", "interval_secs": 1, "job": {"command": "true"}}, t0)
    for _ in range(LIMIT):
        submit(client)
    fired = schedules.fire(tick.id, t0 + 1.5, t0, 100)
    assert fired.created == [] and fired.failed == 1
    run = ScheduleRun.get(ScheduleRun.schedule_id == tick.id)
    assert run.job_id is None and run.skipped.startswith(f"not run: the cluster has {LIMIT} pending jobs")
    assert "MAX_PENDING_JOBS" in run.skipped
    assert schedules.get("tick").next_run_at == t0 + 2  # the schedule goes on
    assert Job.select().where(Job.schedule == "tick").count() == 0


# ---- the gate on its own: when it counts --------------------------------------------

class Counted:
    def __init__(self, pending):
        self.pending, self.threads = pending, []

    def __call__(self):
        self.threads.append(threading.current_thread())
        return self.pending

    @property
    def calls(self):
        return len(self.threads)


def test_the_gate_decides_on_its_count_and_its_own_admissions_and_counts_again_apart():
    now = [100.0]
    count = Counted(0)
    gate = admission.PendingGate(10, count, clock=lambda: now[0])
    for _ in range(8):
        gate.admit(1)
    assert count.calls == 1  # one count, then its own admissions
    gate.admit(2)            # exactly at the limit
    with pytest.raises(TooManyRequests) as refused:
        gate.admit(1)
    assert refused.value.fields["pending_jobs"] == 10 and refused.value.retry_after == admission.RETRY_AFTER_SECS
    assert count.calls == 1  # refused on what it knows: counted again at most every REFUSED_RECOUNT_SECS
    count.pending = 4        # jobs started meanwhile
    now[0] += 2 * admission.REFUSED_RECOUNT_SECS
    gate.admit(1)            # it would have refused: a fresh count first, on the caller's thread
    assert count.threads[1] is threading.current_thread()
    now[0] += admission.RECOUNT_SECS
    gate.admit(1)            # an old estimate that admits: decided at once, counted again apart
    wait_for(lambda: count.calls == 3, timeout=30, message="the count in the background")
    assert count.threads[2] is not threading.current_thread()


def test_the_recount_decision():
    fresh = admission.Estimate(counted=5, at=10.0, added=3)
    assert admission.needs_count(None, 1, 10, 10.0)
    assert not admission.needs_count(fresh, 2, 10, 10.5)         # fits: the estimate decides
    assert admission.needs_count(fresh, 3, 10, 10.5)             # would refuse: look again first
    assert not admission.needs_count(fresh, 3, 10, 10.05)        # ... but not at every refusal
    assert admission.needs_count(fresh, 1, 10, 9.0)              # a clock that went back
    old = 10.0 + admission.RECOUNT_SECS
    assert not admission.needs_count(fresh, 1, 10, old) and admission.stale(fresh, old)  # counted apart
    assert not admission.stale(fresh, 10.5)


# ---- what a submit reads of the queue --------------------------------------------------

def test_a_submit_behind_jobs_that_fit_nowhere_is_placed_by_the_background_pass(client, store, clock, app):
    """A submit's placement reads as many queued jobs as there are free slots, not the
    queue's next page: here the four jobs ahead need a GPU no node has, so the new job
    waits for the background pass (every DISPATCH_INTERVAL_SECS), which looks deeper."""
    app.extensions["corral.store"].admission.limit = 1000
    set_nodes(store, clock, "n1")  # 4 free slots
    gpu = [{"label": "gpu", "op": "exists"}]
    for _ in range(4):
        clock.now += 1
        assert client.post("/jobs", json={"command": "x", "constraints": gpu}).status_code == 201
    clock.now += 1
    job = submit(client)
    assert job["status"] == "pending" and job["node_id"] is None
    Scheduler(store).place(clock())
    assert client.get(f"/jobs/{job['job_id']}").json["node_id"] == "n1"
