"""Usage accounting (store/usage.py, api/usage.py): every ended attempt adds what its node
measured to its user's and team's totals of its UTC day, in the transaction that
ends it; GET /usage sums them by day, week, user or team for those who may see them.
On each backend."""
import pytest
from scheduler_app import set_nodes
from teams_support import AGENT_SECRET, submit, three_teams

from corral.shared.credentials import node_token

MiB = 1024 * 1024


@pytest.fixture
def cluster(database_url):
    made = three_teams(database_url)
    set_nodes(made.store, made.clock, "n1", slots=8)
    made.tokens["n1"] = node_token(AGENT_SECRET, "n1")
    return made


def run(cluster, who, secs, cpu, peak_mb, ok=True, **body):
    """Submit a job as `who`, and have n1 claim it, run it `secs` and report its end."""
    job = submit(cluster, who, **body)["job_id"]
    claimed = cluster("n1", "POST", "/nodes/n1/claim", json={"max": 8, "wait_secs": 0}).json
    attempt = next(j["attempt"] for j in claimed if j["job_id"] == job)
    assert cluster("n1", "POST", f"/jobs/{job}/status", json={"node_id": "n1", "attempt": attempt,
                                                              "status": "running"}).status_code == 200
    cluster.clock.now += secs
    end = {"node_id": "n1", "attempt": attempt, "status": "done" if ok else "failed", "exit_code": 0 if ok else 1,
           "cpu_seconds": cpu, "peak_memory_bytes": peak_mb * MiB}
    answer = cluster("n1", "POST", f"/jobs/{job}/status", json=end)
    assert answer.status_code == 200, answer.json
    return job


def usage(cluster, who="operator", **params):
    answer = cluster(who, "GET", "/usage", query_string=params)
    assert answer.status_code == 200, answer.json
    return answer.json


def test_each_ended_attempt_adds_what_it_used_to_its_user_and_team(cluster):
    run(cluster, "bob", 10, 4.0, 100)
    run(cluster, "bob", 20, 6.5, 50, ok=False, max_retries=0)
    run(cluster, "carol", 30, 1.0, 10, team="web")
    by_user = {row["group"]: row for row in usage(cluster, group_by="user")["rows"]}
    assert set(by_user) == {"bob", "carol"}
    assert by_user["bob"]["attempts"] == 2 and by_user["bob"]["cpu_seconds"] == pytest.approx(10.5)
    assert by_user["bob"]["wall_seconds"] == pytest.approx(30.0)
    assert by_user["bob"]["memory_mb_seconds"] == pytest.approx(100 * 10 + 50 * 20)
    by_team = {row["group"]: row["cpu_seconds"] for row in usage(cluster, group_by="team")["rows"]}
    assert by_team == pytest.approx({"ml": 10.5, "web": 1.0})
    days = usage(cluster)["rows"]
    assert len(days) == 1 and days[0]["attempts"] == 3 and days[0]["group"] == "2027-01-15"


def test_a_retried_job_counts_every_attempt_and_a_cancel_its_wall_time(cluster):
    job = submit(cluster, "alice")["job_id"]
    claimed = cluster("n1", "POST", "/nodes/n1/claim", json={"max": 1, "wait_secs": 0}).json
    assert cluster("n1", "POST", f"/jobs/{job}/status", json={"node_id": "n1", "attempt": claimed[0]["attempt"],
                                                              "status": "running"}).status_code == 200
    cluster.clock.now += 7
    assert cluster("alice", "POST", f"/jobs/{job}/cancel", json={}).status_code == 200
    retried = run(cluster, "bob", 5, 1.0, 1, ok=False, max_retries=1)  # failed, back to pending
    assert cluster("bob", "GET", f"/jobs/{retried}").json["status"] == "pending"
    claimed = cluster("n1", "POST", "/nodes/n1/claim", json={"max": 1, "wait_secs": 0}).json
    end = {"node_id": "n1", "attempt": claimed[0]["attempt"]}
    cluster("n1", "POST", f"/jobs/{retried}/status", json=dict(end, status="running"))
    cluster.clock.now += 2
    cluster("n1", "POST", f"/jobs/{retried}/status", json=dict(end, status="done", exit_code=0, cpu_seconds=0.5))
    by_user = {row["group"]: row for row in usage(cluster, group_by="user")["rows"]}
    assert by_user["alice"]["attempts"] == 1 and by_user["alice"]["wall_seconds"] == pytest.approx(7.0)
    assert by_user["alice"]["cpu_seconds"] == 0  # the node reported none
    assert by_user["bob"]["attempts"] == 2 and by_user["bob"]["cpu_seconds"] == pytest.approx(1.5)
    assert by_user["bob"]["wall_seconds"] == pytest.approx(7.0)


def test_days_weeks_and_the_range_asked(cluster):
    run(cluster, "bob", 1, 1.0, 1)
    cluster.clock.now += 86400
    run(cluster, "bob", 1, 2.0, 1)
    days = usage(cluster)["rows"]
    assert [(row["group"], row["cpu_seconds"]) for row in days] == [("2027-01-15", 1.0), ("2027-01-16", 2.0)]
    assert usage(cluster, **{"from": "2027-01-16"})["rows"][0]["cpu_seconds"] == 2.0
    assert usage(cluster, **{"to": "2027-01-16"})["rows"][0]["cpu_seconds"] == 1.0
    weeks = usage(cluster, group_by="week")
    assert [row["group"] for row in weeks["rows"]] == ["2027-01-11"]  # the Monday of that week
    assert weeks["rows"][0]["cpu_seconds"] == 3.0 and weeks["from_day"] == "2027-01-10"


def test_a_member_sees_their_teams_usage_and_readers_see_all(cluster):
    run(cluster, "bob", 1, 1.0, 1)
    run(cluster, "carol", 1, 1.0, 1, team="web")
    assert [row["group"] for row in usage(cluster, "carol", group_by="team")["rows"]] == ["web"]
    assert usage(cluster, "carol", group_by="team", team="ml")["rows"] == []
    assert [row["group"] for row in usage(cluster, "dave", group_by="team")["rows"]] == ["ml", "web"]
    assert [row["group"] for row in usage(cluster, "bob", group_by="user")["rows"]] == ["bob"]


@pytest.mark.parametrize("params", [{"from": "yesterday"}, {"from": "2027-01-10", "to": "2027-01-01"},
                                    {"group_by": "month"}, {"team": "a:b"}, {"user": "a b"},
                                    {"from": "2000-01-01", "to": "2027-01-01"}])
def test_bad_questions_are_refused(cluster, params):
    answer = cluster("operator", "GET", "/usage", query_string=params)
    assert answer.status_code == 400 and answer.json["error"]


def test_usage_outlives_the_jobs(cluster):
    run(cluster, "bob", 3, 2.0, 1)
    submit(cluster, "bob")  # the newest job row stays (SQLite hands its id out again otherwise)
    cluster.clock.now += 30 * 86400
    assert cluster.store.purge.finished(cluster.clock(), 100) >= 1
    rows = usage(cluster, **{"from": "2027-01-01"})["rows"]
    assert [row["cpu_seconds"] for row in rows] == [2.0]


def test_a_job_read_without_its_team_is_still_attributed_to_it(cluster):
    """A transition's job may be read with a few columns only: its owners are read then."""
    from corral.scheduler.models import Job
    from corral.scheduler.store import usage as usage_store
    from corral.scheduler.store.status_writer import StatusWriter

    job_id = int(submit(cluster, "carol", team="web")["job_id"].removeprefix("job-"))
    partial = Job.select(Job.id, Job.running_at).where(Job.id == job_id).get()
    partial.running_at = cluster.clock() - 4
    with cluster.store.db.atomic():
        StatusWriter(cluster.store.context).account(
            [(partial, usage_store.ended(partial, {"cpu_seconds": 3.0}, cluster.clock()))], cluster.clock())
    rows = usage(cluster, group_by="user")["rows"]
    assert [(row["group"], row["cpu_seconds"], row["wall_seconds"]) for row in rows] == [("carol", 3.0, 4.0)]
    assert usage(cluster, group_by="team")["rows"][0]["group"] == "web"


def test_prometheus_counts_usage_per_team(cluster):
    run(cluster, "bob", 10, 4.0, 100)
    run(cluster, "carol", 5, 1.5, 10, team="web")
    text = cluster.app.test_client().get("/metrics").get_data(as_text=True)
    assert 'corral_usage_cpu_seconds_total{team="ml"} 4.0' in text
    assert 'corral_usage_cpu_seconds_total{team="web"} 1.5' in text
    assert 'corral_usage_attempts_total{team="ml"} 1.0' in text
    assert 'corral_usage_wall_seconds_total{team="web"} 5.0' in text
