"""The charts' sampler (sampler.py) driven by hand with a clock on each backend, and
GET /stats/history: one sample per interval across lease holders, what a sample
counts, the retention, `since`."""
import time

import pytest

from corral.scheduler.models import StatsSample
from corral.scheduler.sampler import Sampler, start
from corral.scheduler.samples import SETTLE_SECS
from corral.shared.timeutil import epoch
from helpers import wait_for
from scheduler_app import make_app, set_nodes, submit

INTERVAL = 10.0


def report(client, job_id, status, **extra):
    job = client.get(f"/jobs/{job_id}").json
    answer = client.post(f"/jobs/{job_id}/status", json=dict({"node_id": job["node_id"], "attempt": job["attempt"],
                                                              "status": status}, **extra))
    assert answer.status_code == 200, answer.json


def history(client, since=None):
    answer = client.get("/stats/history" if since is None else f"/stats/history?since={since}")
    assert answer.status_code == 200, answer.json
    return answer.json


def test_a_sample_counts_what_finished_and_started_since_the_previous_one(client, store, clock):
    t0 = clock()
    set_nodes(store, clock, "n1", "n2", slots=4)
    sampler = Sampler(store, holder="a")
    assert sampler.tick(t0) == INTERVAL
    quick, slow, failing, waiting = (submit(client, command="true", max_retries=0)["job_id"] for _ in range(4))
    clock.now = t0 + 2.0
    for job_id in (quick, slow, failing):
        report(client, job_id, "running")   # 2 s after their submission
    clock.now = t0 + 3.0
    report(client, quick, "done", exit_code=0)
    report(client, failing, "failed", exit_code=3)
    assert client.post(f"/jobs/{waiting}/cancel", content_type="application/json").status_code == 200
    left = submit(client, command="sleep 60", instance_id="n2")["job_id"]  # placed, pending
    clock.now = t0 + INTERVAL
    assert sampler.tick(clock.now) == INTERVAL

    answer = history(client)
    assert (answer["interval_secs"], answer["retention_secs"]) == (INTERVAL, 7200.0)
    first, second = answer["samples"]
    assert first["finished"] == {"cancelled": 0, "done": 0, "failed": 0} and first["started"] == 0
    assert epoch(second["at"]) == t0 + INTERVAL and epoch(second["since"]) == t0
    assert second["finished"] == {"cancelled": 1, "done": 1, "failed": 1}
    assert (second["pending"], second["running"], second["started"]) == (1, 1, 3)
    assert second["dispatch_latency"] == {"p50_secs": 2.0, "p95_secs": 2.0}
    nodes = {n["node_id"]: n for n in second["nodes"]}
    assert sorted(nodes) == ["n1", "n2"]
    assert sum(n["slots_used"] for n in nodes.values()) == 2  # slow runs, left is placed
    assert nodes["n2"]["slots_used"] >= 1 and nodes["n1"]["capacity"] == 4
    assert nodes["n1"]["used"] is None  # its agent never said
    assert store.jobs.get(left).status == "pending"
    only = history(client, f"{t0 + 1}&node_id=n2")["samples"]
    assert [[n["node_id"] for n in s["nodes"]] for s in only] == [["n2"]]
    assert only[0]["nodes"][0] == nodes["n2"] and only[0]["finished"] == second["finished"]
    assert [s["nodes"] for s in history(client, "0&nodes=none")["samples"]] == [[], []]
    assert client.get("/stats/history?nodes=some").status_code == 400

    # A job that finishes a moment before a sample is taken counts in the next one (the
    # window lags SETTLE_SECS), so one that commits late with that time is not lost.
    clock.now = t0 + 2 * INTERVAL - SETTLE_SECS / 2
    report(client, slow, "done", exit_code=0)
    clock.now = t0 + 2 * INTERVAL
    sampler.tick(clock.now)
    clock.now = t0 + 3 * INTERVAL
    sampler.tick(clock.now)
    third, fourth = history(client)["samples"][2:]
    assert third["finished"]["done"] == 0 and fourth["finished"]["done"] == 1
    assert (fourth["running"], fourth["started"]) == (0, 0)
    assert fourth["dispatch_latency"] == {"p50_secs": None, "p95_secs": None}


def test_only_first_attempts_count_for_the_dispatch_latency(client, store, clock):
    """As the corral_job_dispatch_latency_seconds histogram: a retry's wait includes a
    failed run and a backoff."""
    t0 = clock()
    set_nodes(store, clock, "n1")
    sampler = Sampler(store, holder="a")
    sampler.tick(t0)
    job_id = submit(client, command="false", max_retries=1)["job_id"]
    clock.now = t0 + 1.0
    report(client, job_id, "running")
    report(client, job_id, "failed", exit_code=1)   # back to pending for its retry
    clock.now = t0 + 4.0
    report(client, job_id, "running")               # its second attempt
    clock.now = t0 + INTERVAL
    sampler.tick(clock.now)
    latest = history(client)["samples"][-1]
    assert (latest["running"], latest["started"]) == (1, 0)


def test_one_sample_per_interval_whoever_holds_the_lease(client, store, clock):
    t0 = clock()
    a, b = Sampler(store, holder="a"), Sampler(store, holder="b")
    assert a.tick(t0) == INTERVAL
    assert b.tick(t0 + 1.0) == INTERVAL         # a holds the lease: b takes nothing
    assert a.tick(t0 + 4.0) == pytest.approx(6.0)  # not due yet: it sleeps until it is
    a.tick(t0 + INTERVAL)
    assert [epoch(s["at"]) - t0 for s in history(client)["samples"]] == [0.0, INTERVAL]
    # a stops; b takes the lease over once it has lapsed and goes on from the last sample.
    takeover = t0 + INTERVAL + a.lease_ttl + 0.5
    assert b.tick(takeover) == INTERVAL
    assert b.tick(takeover + 1.0) == pytest.approx(INTERVAL - 1.0)
    a.tick(takeover + 2.0)                      # a is back: b holds the lease now
    assert [epoch(s["at"]) - t0 for s in history(client)["samples"]] == [0.0, INTERVAL, takeover - t0]


@pytest.mark.slow
def test_two_loops_under_one_lease_take_one_sample_per_interval(database_url, tmp_path):
    """Two processes' sampler loops (threads here, each with its own holder id) run
    against the same database on the real clock: the samples are an interval apart."""
    interval = 0.25
    app = make_app(database_url, time.time, stats_interval_secs=interval)
    store = app.extensions["corral.store"]
    loops = [start(store) for _ in range(2)]
    try:
        with store.db.connection_context():
            wait_for(lambda: StatsSample.select().count() >= 12, timeout=30, message="a dozen samples")
    finally:
        for loop in loops:
            loop.stop()
    with store.db.connection_context():
        times = [row.at for row in StatsSample.select().order_by(StatsSample.at)]
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    assert min(gaps) >= interval * 0.94, gaps
    # Every interval sampled: on a loaded machine a pass may be late, never doubled.
    assert sum(gaps) / len(gaps) < interval * 1.6, gaps


def test_samples_older_than_the_retention_are_deleted(database_url, clock):
    app = make_app(database_url, clock, stats_interval_secs=INTERVAL, stats_retention_secs=60.0)
    client, store = app.test_client(), app.extensions["corral.store"]
    sampler = Sampler(store, holder="a")
    t0 = clock()
    for i in range(10):
        sampler.tick(t0 + i * INTERVAL)
    times = [epoch(s["at"]) - t0 for s in history(client)["samples"]]
    assert times == [30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0]  # the last 60 s, both ends kept


def test_since_answers_the_samples_taken_after_it(client, store, clock):
    t0 = clock()
    sampler = Sampler(store, holder="a")
    for i in range(4):
        sampler.tick(t0 + 0.0005 + i * INTERVAL)   # taken at a millisecond's fraction: stored to the millisecond
    samples = history(client)["samples"]
    assert len(samples) == 4 and len(history(client, 0)["samples"]) == 4
    # The ISO time of a sample, as unix seconds, leaves that sample out: the dashboard asks for what is newer.
    assert [s["at"] for s in history(client, epoch(samples[1]["at"]))["samples"]] == [s["at"] for s in samples[2:]]
    assert history(client, epoch(samples[3]["at"]))["samples"] == []
    assert len(history(client, f"{t0 + 5:.3f}")["samples"]) == 3
    assert history(client, "")["samples"] == samples  # empty: not given


@pytest.mark.parametrize("since", ["yesterday", "nan", "inf", "-1", "1e300", "0x10", "1,5"])
def test_a_bad_since_is_a_400(client, since):
    answer = client.get(f"/stats/history?since={since}")
    assert answer.status_code == 400
    assert "'since'" in answer.json["error"]
