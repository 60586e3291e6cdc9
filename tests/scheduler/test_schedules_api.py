"""Schedules through the API, on each backend: create, read, list, change, delete and
the runs, with the refusals; the jobs of runs name their schedule and slot."""
from corral.scheduler.schedule_loop import Firing
from corral.shared.timeutil import iso

JSON = {"Content-Type": "application/json"}  # what a mutating request carries (the CSRF guard)
BODY = {"name": "nightly", "cron": "30 2 * * *", "time_zone": "Europe/Berlin", "job": {"command": "python etl.py"}}


def test_a_schedule_through_its_life(client, store, clock):
    t0 = clock()  # 2027-01-15T08:00:00Z
    created = client.post("/schedules", json=BODY)
    assert created.status_code == 201
    nightly = created.json
    assert nightly["next_run_at"] == "2027-01-16T01:30:00.000Z"  # 02:30 in Berlin (CET, +01:00)
    assert nightly["next_run_local"] == "2027-01-16T02:30:00+01:00"
    assert (nightly["overlap"], nightly["catch_up"], nightly["enabled"], nightly["last_job_id"],
            nightly["last_run"]) == ("allow", "latest", True, None, None)
    assert nightly["job"] == {"command": "python etl.py"} and nightly["created_at"] == iso(t0)
    assert client.post("/schedules", json=BODY).status_code == 409
    tick = client.post("/schedules", json={"name": "tick", "interval_secs": 60, "job": {"command": "true"}}).json
    assert tick["start_at"] == iso(t0) and tick["next_run_at"] == iso(t0 + 60) and tick["cron"] is None
    assert [s["name"] for s in client.get("/schedules").json] == ["nightly", "tick"]
    assert client.get("/schedules/nightly").json == nightly

    off = client.patch("/schedules/nightly", json={"enabled": False})
    assert off.status_code == 200 and off.json["enabled"] is False and off.json["next_run_at"] is None
    moved = client.patch("/schedules/nightly", json={"enabled": True, "cron": "0 6 * * 1-5"}).json
    assert moved["next_run_at"] == "2027-01-18T05:00:00.000Z"  # Monday 06:00 in Berlin
    refused = client.patch("/schedules/nightly", json={"time_zone": "Mars/Base"})
    assert refused.status_code == 400 and "unknown time zone" in refused.json["error"]
    assert client.get("/schedules/nightly").json == moved  # a refused change changes nothing

    Firing(store, holder="t").tick(t0 + 60.5)
    runs = client.get("/schedules/tick/runs").json
    assert len(runs) == 1 and runs[0]["slot"] == iso(t0 + 60) and runs[0]["status"] == "pending"
    job = client.get(f"/jobs/{runs[0]['job_id']}").json
    assert (job["schedule"], job["slot"], job["command"]) == ("tick", iso(t0 + 60), "true")
    assert client.get("/schedules/tick").json["last_job_id"] == job["job_id"]
    client.post(f"/jobs/{job['job_id']}/cancel", headers=JSON)
    Firing(store, holder="t").tick(t0 + 120.5)
    listed = {s["name"]: s for s in client.get("/schedules").json}
    assert listed["nightly"]["last_run"] is None
    assert listed["tick"]["last_run"]["slot"] == iso(t0 + 120) and listed["tick"]["last_run"]["status"] == "pending"
    assert client.get("/schedules/tick/runs").json[1]["status"] == "cancelled"  # the earlier run's job, now

    assert client.delete("/schedules/tick", headers=JSON).status_code == 204
    assert client.get("/schedules/tick").status_code == 404
    assert client.get("/schedules/tick/runs").status_code == 404
    assert client.get(f"/jobs/{job['job_id']}").status_code == 200  # its jobs stay


def test_bad_schedules_are_refused_and_change_nothing(client):
    for body, status, says in [
        (dict(BODY, cron="61 2 * * *"), 400, "field 1 (minute) is not valid: '61'"),
        (dict(BODY, job={"command": "x", "run_at": "2027-01-01T00:00:00Z"}), 400, "'job' may not have 'run_at'"),
        ({"name": "x", "interval_secs": 0.2, "job": {"command": "x"}}, 400, "'interval_secs' must be"),
        ([BODY], 400, "JSON object"),
    ]:
        answer = client.post("/schedules", json=body)
        assert answer.status_code == status and says in answer.json["error"], answer.json
    assert client.get("/schedules").json == []
    assert client.patch("/schedules/none", json={"enabled": False}).status_code == 404
    assert client.delete("/schedules/none", headers=JSON).status_code == 404
    client.post("/schedules", json=BODY)
    renamed = client.patch("/schedules/nightly", json={"name": "other"})
    assert renamed.status_code == 400 and "name cannot change" in renamed.json["error"]
    assert client.get("/schedules/nightly/runs?limit=0").status_code == 400


def test_metrics_count_runs_by_outcome_their_lag_and_overdue_slots(client, store, clock):
    """In this process /metrics shows its own counters (no multiprocess directory): compared
    before and after, as other tests in the process count too."""
    from prometheus_client.parser import text_string_to_metric_families

    def scrape() -> dict:
        text = client.get("/metrics").get_data(as_text=True)
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    t0 = clock()
    client.post("/schedules", json={"name": "tick", "interval_secs": 1, "overlap": "skip", "job": {"command": "x"}})
    client.post("/schedules", json=dict(BODY, enabled=False))
    before = scrape()
    assert before[("corral_schedules", (("enabled", "true"),))] == 1
    assert before[("corral_schedules", (("enabled", "false"),))] == 1
    assert before[("corral_schedules_overdue_seconds", ())] == 0
    clock.now = t0 + 3.25  # slots t0+1..t0+3 are due; nothing fired them yet
    assert scrape()[("corral_schedules_overdue_seconds", ())] == 2.25

    Firing(store, holder="t").tick(t0 + 1.25)  # the first slot: a job, fired 0.25 s late
    Firing(store, holder="t").tick(t0 + 2.5)   # the second: skipped, the first job still pending
    after = scrape()

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)
    assert delta("corral_schedule_runs_total", outcome="created") == 1
    assert delta("corral_schedule_runs_total", outcome="skipped") == 1
    assert delta("corral_schedule_runs_total", outcome="failed") == 0
    assert delta("corral_schedule_firing_lag_seconds_count") == 1
    assert delta("corral_schedule_firing_lag_seconds_bucket", le="0.25") == 1
    assert delta("corral_schedule_firing_lag_seconds_bucket", le="0.1") == 0
    assert after[("corral_schedules_overdue_seconds", ())] == 0.25  # the slot t0+3 is due, not yet fired


def test_next_run_local_is_shown_to_the_second_or_to_the_millisecond():
    from corral.scheduler.views import local_time
    assert local_time(1_800_000_000.0, "Europe/Berlin") == "2027-01-15T09:00:00+01:00"
    assert local_time(1_800_000_000.25, "America/New_York") == "2027-01-15T03:00:00.250-05:00"
    assert local_time(None, "UTC") is None
