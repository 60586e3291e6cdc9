"""Teams sharing a cluster end to end, on real agents: quotas with preemption give a
team its guarantee back within a kill grace and a lease renewal (on SQLite, and on
PostgreSQL with two scheduler replicas); without preemption it waits only for the
borrowers' running jobs to end, not for their backlog; and two teams that both keep
the cluster busy each get about half of it (fair share)."""
import time

import pytest
import requests

from cluster import Cluster
from corral.shared.timeutil import epoch
from helpers import wait_for

pytestmark = pytest.mark.e2e

NODES = ("share-n1", "share-n2")
SLOTS = 2  # per node: 4 in all
HALF = {"guaranteed": {"jobs": 2}}


def start(c: Cluster, replicas: int = 1) -> list[str]:
    c.start_registry()
    urls = [c.start_scheduler()] + [c.start_scheduler(name=f"scheduler-{i}") for i in range(1, replicas)]
    for node in NODES:
        c.start_agent(node, slots=SLOTS)
    c.wait_nodes_healthy(*NODES)
    for team in ("ml", "web"):
        assert requests.post(f"{urls[0]}/teams", json={"name": team}, timeout=10).status_code == 201
    return urls


def flood(url: str, team: str, count: int, command: str) -> list[str]:
    answer = requests.post(f"{url}/jobs/batch", json={"jobs": [
        {"command": command, "team": team, "max_retries": 0} for _ in range(count)]}, timeout=30)
    assert answer.status_code == 201, answer.text
    return [job["job_id"] for job in answer.json()]


def jobs_of(url: str, team: str) -> list[dict]:
    return requests.get(f"{url}/jobs", params={"team": team, "limit": 1000}, timeout=10).json()


def running(url: str, team: str) -> list[dict]:
    return [j for j in jobs_of(url, team) if j["status"] == "running"]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_team_below_its_guarantee_gets_it_back_by_preemption(tmp_path, request, backend):
    pg = request.getfixturevalue("pg_url") if backend == "postgresql" else None
    c = Cluster(tmp_path, database_url=pg, MAX_JOBS_PER_NODE=SLOTS)
    try:
        urls = start(c, replicas=2 if pg else 1)
        for team in ("ml", "web"):
            assert requests.put(f"{urls[-1]}/teams/{team}/quota", json=HALF, timeout=10).status_code == 200
        # ml floods the cluster with long jobs, borrowing web's idle half.
        flood(urls[0], "ml", 100, "sleep 120")
        wait_for(lambda: len(running(urls[0], "ml")) == 4, timeout=30, message="ml on every slot")
        asked = [requests.post(f"{urls[-1]}/jobs", json={"command": "sleep 120", "team": "web"}, timeout=10).json()
                 ["job_id"] for _ in range(20)]
        # Two of web's jobs (its guarantee) start within a kill grace, a lease renewal and a claim.
        started_web = wait_for(lambda: (lambda r: r if len(r) >= 2 else None)(running(urls[0], "web")),
                               timeout=15, message="web's guaranteed slots given back")
        assert {j["job_id"] for j in started_web} <= set(asked)
        preempted = [j for j in jobs_of(urls[0], "ml") if j["preemptions"]]
        assert len(preempted) == 2, [(j["job_id"], j["status"]) for j in preempted]
        for job in preempted:
            assert (job["ended_by"], job["retry_count"], job["preemptions"]) == ("preemption", 0, 1), job
            reasons = [e["reason"] for e in requests.get(f"{urls[0]}/jobs/{job['job_id']}/events", timeout=10).json()]
            assert any("preempted to make room for job-" in r for r in reasons), reasons
            assert "preempted; requeued" in reasons, reasons
        # It settles: ml keeps its two, web its two, and nothing more is preempted over the
        # next background passes (every 0.2 s) and lease renewals (every 0.5 s).
        wait_for(lambda: len(running(urls[0], "ml")) == 2 and len(running(urls[0], "web")) == 2, timeout=10,
                 message="two jobs of each team running")
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert sum(j["preemptions"] for j in jobs_of(urls[0], "ml")) == 2
            assert len(running(urls[0], "web")) == 2
    finally:
        c.stop()


def test_without_preemption_a_team_waits_for_the_running_jobs_not_the_backlog(tmp_path):
    c = Cluster(tmp_path, PREEMPTION="false", MAX_JOBS_PER_NODE=SLOTS)
    try:
        url = start(c)[0]
        for team in ("ml", "web"):
            assert requests.put(f"{url}/teams/{team}/quota", json=HALF, timeout=10).status_code == 200
        flood(url, "ml", 100, "sleep 6")
        first = wait_for(lambda: (lambda r: r if len(r) == 4 else None)(running(url, "ml")), timeout=30,
                         message="ml on every slot")
        ends = max(epoch(j["running_at"]) for j in first) + 6
        asked = [requests.post(f"{url}/jobs", json={"command": "true", "team": "web"}, timeout=10).json()["job_id"]
                 for _ in range(20)]
        done = wait_for(lambda: (lambda d: d if d else None)(
            [j for j in jobs_of(url, "web") if j["status"] == "done"]), timeout=30, message="web's first job done")
        # Within the first of ml's running jobs' ends (and a claim), not after ml's 96 waiting ones.
        assert min(epoch(j["running_at"]) for j in done) < ends + 5
        assert not any(j["preemptions"] for j in jobs_of(url, "ml"))
        assert {j["job_id"] for j in done} <= set(asked)
    finally:
        c.stop()


def test_two_teams_that_keep_the_cluster_busy_each_get_about_half_of_it(tmp_path):
    """ml floods first; web a moment later. From the first job's start until one team
    has nothing left waiting, each team's share of the slot-seconds is 50% ± 10%:
    web's turns come first until its usage catches up with ml's head start."""
    c = Cluster(tmp_path, MAX_JOBS_PER_NODE=SLOTS)
    try:
        url = start(c)[0]
        flood(url, "ml", 100, "sleep 1")
        wait_for(lambda: len(running(url, "ml")) == 4, timeout=30, message="ml on every slot")
        flood(url, "web", 100, "sleep 1")

        def both_waiting_ended():
            jobs = jobs_of(url, "ml") + jobs_of(url, "web")
            return jobs if sum(j["status"] == "done" for j in jobs) >= 100 else None

        jobs = wait_for(both_waiting_ended, timeout=180, interval=0.5, message="100 jobs done")
        # The window: from the first job's start to a moment both teams still had work waiting.
        start_at = min(epoch(j["running_at"]) for j in jobs if j["running_at"])
        pending_left = {team: [j for j in jobs if j["team"] == team and j["status"] == "pending"]
                        for team in ("ml", "web")}
        assert all(pending_left.values()), "both teams must still have work waiting at the end of the window"
        end_at = max(epoch(j["finished_at"]) for j in jobs if j["status"] == "done")
        held = {"ml": 0.0, "web": 0.0}
        for job in jobs:
            if job["running_at"] is None:
                continue
            begin = max(start_at, epoch(job["running_at"]))
            finish = min(end_at, epoch(job["finished_at"]) if job["finished_at"] else end_at)
            held[job["team"]] += max(0.0, finish - begin)
        part = held["web"] / (held["ml"] + held["web"])
        assert 0.4 <= part <= 0.6, held
        shown = requests.get(f"{url}/usage/fair-share", timeout=10).json()
        assert shown["enabled"] and {t["team"] for t in shown["teams"]} >= {"ml", "web"}
    finally:
        c.stop()
