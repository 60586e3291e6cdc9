"""Preemption through the store and the API on each backend: a team below its
guarantee reclaims what another borrowed (the victim's stop in its node's lease
answer, its events naming the job it makes room for, requeued without spending a
retry, `preemptions` counted); a job that is not preemptible is never borrowed for
nor picked; priority preemption within a team is off unless a gap is set."""
import pytest
from scheduler_app import set_nodes
from teams_support import AGENT_SECRET, submit, three_teams

from corral.shared.credentials import node_token

ONE_EACH = {"guaranteed": {"jobs": 1}}


def make(database_url, **settings):
    cluster = three_teams(database_url, max_jobs_per_node=2, **settings)
    cluster.tokens["n1"] = node_token(AGENT_SECRET, "n1")
    set_nodes(cluster.store, cluster.clock, "n1", slots=2)
    for team in ("ml", "web"):
        assert cluster("operator", "PUT", f"/teams/{team}/quota", json=ONE_EACH).status_code == 200
    return cluster


@pytest.fixture
def cluster(database_url):
    return make(database_url)


def report(cluster, job_id, status, **extra):
    answer = cluster("n1", "POST", f"/jobs/{job_id}/status",
                     json={"node_id": "n1", "attempt": 1, "status": status, **extra})
    assert answer.status_code == 200, answer.json
    return answer.json


def started(cluster, who, **body):
    job = submit(cluster, who, **body)["job_id"]
    report(cluster, job, "running")
    cluster.clock.now += 10
    return job


def background(cluster):
    """The background pass: placement, the reasons, then preemption."""
    now = cluster.clock()
    from corral.scheduler.service import Scheduler
    Scheduler(cluster.store).place(now)
    cluster.store.placing.explain(now)
    return cluster.store.preemptions.run(now)


def lease(cluster):
    answer = cluster("n1", "POST", "/nodes/n1/lease", json={})
    assert answer.status_code == 200, answer.json
    return {r["job_id"]: r.get("stop") for r in answer.json["running"]}


def test_a_team_below_its_guarantee_reclaims_the_borrowed_slot_and_the_victim_reruns_without_a_retry(cluster):
    older, younger = started(cluster, "carol"), started(cluster, "carol")  # web borrows ml's slot
    waiting = submit(cluster, "bob")["job_id"]
    assert background(cluster) == [(younger, waiting)]  # the youngest of the borrowed work
    assert lease(cluster) == {older: None, younger: "preemption"}
    shown = cluster("carol", "GET", f"/jobs/{younger}").json
    assert shown["stop_reason"] == "preemption" and shown["preemptions"] == 0
    reasons = [e["reason"] for e in cluster("carol", "GET", f"/jobs/{younger}/events").json]
    assert any(f"preempted to make room for {waiting}" in r for r in reasons), reasons
    assert background(cluster) == []  # asked once: no second victim while the first stops
    # Its agent stops it (kill signal, grace) and reports it: requeued, no retry spent.
    ended = report(cluster, younger, "failed", exit_code=-1, requeue=True, ended_by="preemption")
    assert (ended["status"], ended["ended_by"], ended["retry_count"], ended["preemptions"]) == (
        "pending", "preemption", 0, 1)
    assert cluster("bob", "GET", f"/jobs/{waiting}").json["node_id"] == "n1"  # the freed slot is ml's
    assert background(cluster) == []
    again = cluster("carol", "GET", f"/jobs/{younger}").json
    assert again["node_id"] is None and again["pending_reason"]["code"] in ("quota", "no_capacity"), again


def test_a_job_that_is_not_preemptible_does_not_borrow_and_is_never_picked(cluster):
    guarded = started(cluster, "carol", preemptible=False)
    shown = cluster("carol", "GET", f"/jobs/{guarded}").json
    assert shown["preemptible"] is False and shown["status"] == "running"
    second = submit(cluster, "carol", preemptible=False)["job_id"]
    background(cluster)
    reason = cluster("carol", "GET", f"/jobs/{second}").json["pending_reason"]
    assert reason["code"] == "quota" and "not preemptible" in reason["message"], reason
    # ml fills its own slot; nothing of web's is borrowed, so nothing is reclaimed.
    mine = started(cluster, "bob")
    assert submit(cluster, "bob")["node_id"] is None
    assert background(cluster) == []
    assert lease(cluster) == {guarded: None, mine: None}


def test_without_preemption_the_team_waits_for_the_borrowers_jobs_to_end(database_url):
    cluster = make(database_url, preemption=False)
    started(cluster, "carol")
    younger = started(cluster, "carol")
    waiting = submit(cluster, "bob")["job_id"]
    assert background(cluster) == []
    report(cluster, younger, "done", exit_code=0)
    assert cluster("bob", "GET", f"/jobs/{waiting}").json["node_id"] == "n1"


def test_priority_preemption_within_a_team_needs_its_gap(database_url):
    cluster = make(database_url, priority_preemption_gap=30)
    low = started(cluster, "bob", priority=10)
    started(cluster, "bob", priority=50)
    assert background(cluster) == []  # nobody waits
    near = submit(cluster, "bob", priority=30)["job_id"]
    assert background(cluster) == []  # 20 points above: under the gap
    urgent = submit(cluster, "bob", priority=90)["job_id"]
    assert background(cluster) == [(low, urgent)]
    assert cluster("bob", "GET", f"/jobs/{near}").json["node_id"] is None
