"""How a job is stopped and warned, through the API on each backend: `signal_before_end`,
`kill_signal` and `kill_grace_secs` on every way a job comes in, bounded by the
cluster's settings; a team's `max_timeout_secs` (PATCH /teams/{team}); the deadline a
running job shows; and `ended_by` on every end of an attempt."""
import pytest

from corral.scheduler import lifecycle
from corral.scheduler.schedule_loop import Firing
from corral.shared.timeutil import epoch
from scheduler_app import make_app, set_nodes, submit


@pytest.fixture
def app(database_url, clock):
    return make_app(database_url, clock, max_jobs_per_node=4, job_timeout_secs=3600, job_timeout_max_secs=7200,
                    job_kill_grace_secs=10, job_kill_grace_max_secs=120)


def report(client, job, status, **extra):
    body = {"node_id": job["node_id"], "attempt": job["attempt"], "status": status, **extra}
    return client.post(f"/jobs/{job['job_id']}/status", json=body)


def running(client, store, clock, **request):
    set_nodes(store, clock, "n1")
    job = submit(client, **request)
    job = client.get(f"/jobs/{job['job_id']}").json
    assert report(client, job, "running").status_code == 200
    return client.get(f"/jobs/{job['job_id']}").json


def count(client) -> int:
    return len(client.get("/jobs", query_string={"limit": 1000}).json)


# ---- asked and shown ------------------------------------------------------------------

def test_a_job_shows_how_it_is_stopped_its_own_terms_or_the_clusters(client):
    own = submit(client, command="train", timeout_secs=600, signal_before_end={"signal": "SIGUSR1", "secs": 60},
                 kill_signal="int", kill_grace_secs=30)
    assert (own["signal_before_end"], own["kill_signal"], own["kill_grace_secs"]) == (
        {"signal": "USR1", "secs": 60}, "INT", 30)
    assert client.get(f"/jobs/{own['job_id']}").json["signal_before_end"] == {"signal": "USR1", "secs": 60}
    default = submit(client, command="true")
    assert (default["signal_before_end"], default["kill_signal"], default["kill_grace_secs"]) == (None, "TERM", 10)
    service = submit(client, command="serve", job_type="service", kill_signal="QUIT", kill_grace_secs=0)
    assert (service["kill_signal"], service["kill_grace_secs"], service["timeout_secs"]) == ("QUIT", 0, None)


def test_a_running_job_shows_its_deadline_and_an_ended_one_none(client, store, clock):
    job = running(client, store, clock, command="sleep 100", timeout_secs=600)
    assert job["deadline"] is not None
    assert epoch(job["deadline"]) - epoch(job["running_at"]) == pytest.approx(600)
    assert submit(client, command="true", instance_id="elsewhere")["deadline"] is None  # pending
    assert report(client, job, "done", exit_code=0).status_code == 200
    assert client.get(f"/jobs/{job['job_id']}").json["deadline"] is None


def test_every_way_a_job_comes_in_carries_its_terms(client, store, clock):
    terms = {"signal_before_end": {"signal": "USR2", "secs": 5}, "kill_signal": "HUP", "kill_grace_secs": 3}
    array = client.post("/jobs", json={"command": "x", "timeout_secs": 60, "array": {"count": 2}, **terms})
    assert array.status_code == 201, array.json
    batch = client.post("/jobs/batch", json={"jobs": [{"command": "y", "timeout_secs": 60, **terms}]})
    assert batch.status_code == 201, batch.json
    schedule = client.post("/schedules", json={"name": "etl", "interval_secs": 60,
                                               "job": {"command": "z", "timeout_secs": 60, **terms}})
    assert schedule.status_code == 201, schedule.json
    Firing(store, holder="t").tick(clock() + 60.5)
    jobs = client.get("/jobs", query_string={"limit": 100}).json
    assert len(jobs) == 4
    for job in jobs:
        assert (job["signal_before_end"], job["kill_signal"], job["kill_grace_secs"]) == (
            {"signal": "USR2", "secs": 5}, "HUP", 3), job["job_id"]


@pytest.mark.parametrize("body, says", [
    ({"signal_before_end": {"signal": "KILL", "secs": 5}}, "must be one of TERM"),
    ({"signal_before_end": {"signal": "STOP", "secs": 5}}, "must be one of TERM"),
    ({"signal_before_end": {"signal": 10, "secs": 5}}, "signal"),
    ({"signal_before_end": {"signal": "USR1"}}, "secs"),
    ({"signal_before_end": {"signal": "USR1", "secs": 0}}, "secs"),
    ({"signal_before_end": {"signal": "USR1", "secs": 5, "extra": 1}}, "extra"),
    ({"signal_before_end": "USR1@60"}, "signal_before_end"),
    ({"signal_before_end": {"signal": "USR1", "secs": 60}, "timeout_secs": 60}, "less than 'timeout_secs'"),
    # No timeout of its own: JOB_TIMEOUT_SECS (3600) is the one it must come before.
    ({"signal_before_end": {"signal": "USR1", "secs": 3600}}, "less than the job's timeout (3600"),
    ({"signal_before_end": {"signal": "USR1", "secs": 5}, "job_type": "service"}, "for run jobs"),
    ({"kill_signal": "KILL"}, "must be one of TERM"),
    ({"kill_signal": ""}, "must be one of TERM"),
    ({"kill_signal": "SIG"}, "must be one of TERM"),
    ({"kill_grace_secs": -1}, "kill_grace_secs"),
    ({"kill_grace_secs": 121}, "JOB_KILL_GRACE_MAX_SECS"),
    ({"kill_grace_secs": "10"}, "kill_grace_secs"),
    ({"timeout_secs": 7201}, "JOB_TIMEOUT_MAX_SECS"),
])
@pytest.mark.slow
def test_bad_terms_are_refused_and_store_nothing(client, body, says):
    for path, payload in (("/jobs", {"command": "true", **body}),
                          ("/jobs", {"command": "true", "array": {"count": 2}, **body}),
                          ("/jobs/batch", {"jobs": [{"command": "true"}, {"command": "true", **body}]})):
        answer = client.post(path, json=payload)
        assert answer.status_code == 400, (payload, answer.json)
        assert says in str(answer.json), (payload, answer.json)
    schedule = client.post("/schedules", json={"name": "s", "interval_secs": 60, "job": {"command": "t", **body}})
    assert schedule.status_code == 400 and says in str(schedule.json), schedule.json
    assert count(client) == 0 and client.get("/schedules").json == []


# ---- a team's largest timeout -----------------------------------------------------------

def test_a_teams_max_timeout_bounds_what_its_jobs_ask_and_get(client):
    assert client.post("/teams", json={"name": "ml"}).status_code == 201
    changed = client.patch("/teams/ml", json={"max_timeout_secs": 600})
    assert changed.status_code == 200 and changed.json["max_timeout_secs"] == 600
    assert next(t for t in client.get("/teams").json if t["name"] == "ml")["max_timeout_secs"] == 600

    over = client.post("/jobs", json={"command": "x", "team": "ml", "timeout_secs": 601})
    assert over.status_code == 400 and "at most 600 seconds for team 'ml'" in over.json["error"]
    batch = client.post("/jobs/batch", json={"jobs": [{"command": "x", "team": "ml", "timeout_secs": 900}]})
    assert batch.status_code == 400 and batch.json["errors"][0]["index"] == 0
    assert count(client) == 0
    # Asking none, a job of the team gets the team's maximum (below JOB_TIMEOUT_SECS); its warning
    # must come before that.
    assert submit(client, command="x", team="ml")["timeout_secs"] == 600
    assert submit(client, command="x", team="ml", timeout_secs=300)["timeout_secs"] == 300
    late = client.post("/jobs", json={"command": "x", "team": "ml", "signal_before_end": {"signal": "USR1",
                                                                                         "secs": 600}})
    assert late.status_code == 400 and "(600 seconds)" in late.json["error"]
    # Another team, and the team once its maximum is cleared: the cluster's.
    assert submit(client, command="x", timeout_secs=3600)["timeout_secs"] == 3600
    assert client.patch("/teams/ml", json={"max_timeout_secs": None}).json["max_timeout_secs"] is None
    assert submit(client, command="x", team="ml")["timeout_secs"] == 3600
    assert submit(client, command="x", team="ml", timeout_secs=7200)["timeout_secs"] == 7200


def test_a_teams_max_above_the_default_leaves_the_default(client):
    client.post("/teams", json={"name": "ml"})
    client.patch("/teams/ml", json={"max_timeout_secs": 5000})
    assert submit(client, command="x", team="ml")["timeout_secs"] == 3600
    assert submit(client, command="x", team="ml", timeout_secs=5000)["timeout_secs"] == 5000


@pytest.mark.parametrize("body", [{"max_timeout_secs": 0}, {"max_timeout_secs": -5}, {"max_timeout_secs": "1h"},
                                  {"max_timeout_secs": 400 * 86400}, {"max_timeout": 60}, []])
@pytest.mark.slow
def test_a_bad_team_change_is_refused_and_changes_nothing(client, body):
    client.post("/teams", json={"name": "ml"})
    client.patch("/teams/ml", json={"max_timeout_secs": 600})
    answer = client.patch("/teams/ml", json=body)
    assert answer.status_code == 400, answer.json
    assert next(t for t in client.get("/teams").json if t["name"] == "ml")["max_timeout_secs"] == 600


def test_changing_a_team_that_does_not_exist_is_not_found(client):
    assert client.patch("/teams/nobody", json={"max_timeout_secs": 60}).status_code == 404


# ---- why an attempt ended ----------------------------------------------------------------

def test_each_end_of_an_attempt_says_why(client, store, clock):
    done = running(client, store, clock, command="true")
    report(client, done, "done", exit_code=0)
    assert client.get(f"/jobs/{done['job_id']}").json["ended_by"] == "exit"

    cancelled = running(client, store, clock, command="sleep 100")
    assert client.post(f"/jobs/{cancelled['job_id']}/cancel", json={}).status_code == 200
    assert client.get(f"/jobs/{cancelled['job_id']}").json["ended_by"] == "cancel"
    never_ran = submit(client, command="true", instance_id="elsewhere")
    client.post(f"/jobs/{never_ran['job_id']}/cancel", json={})
    assert client.get(f"/jobs/{never_ran['job_id']}").json["ended_by"] is None

    old_agent = running(client, store, clock, command="eat", max_retries=0)
    report(client, old_agent, "failed", exit_code=-9, oom_killed=True, ended_by="memory")
    assert client.get(f"/jobs/{old_agent['job_id']}").json["ended_by"] == "oom"

    given_up = running(client, store, clock, command="sleep 100")
    report(client, given_up, "failed", exit_code=-1, requeue=True)
    requeued = client.get(f"/jobs/{given_up['job_id']}").json
    assert (requeued["status"], requeued["ended_by"]) == ("pending", "node_lost")

    stopped = running(client, store, clock, command="sleep 100", max_retries=3)
    answer = report(client, stopped, "failed", exit_code=0, ended_by="timeout").json
    assert (answer["status"], answer["ended_by"], answer["retry_count"]) == ("failed", "timeout", 0)


def test_the_watcher_waits_out_the_jobs_own_kill_grace(client, store, clock):
    job = running(client, store, clock, command="sleep 100", timeout_secs=60, kill_grace_secs=100)
    clock.now += 60 + 100 + lifecycle.WATCHER_SLACK_SECS - 1
    with store.db.connection_context():
        assert store.actions.fail_timed_out(clock()) == []
    clock.now += 2
    with store.db.connection_context():
        assert store.actions.fail_timed_out(clock()) == [job["job_id"]]
    ended = client.get(f"/jobs/{job['job_id']}").json
    assert (ended["status"], ended["ended_by"]) == ("failed", "timeout")
