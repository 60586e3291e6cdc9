"""Schedules in the database, on each backend: definitions, and due slots turned into
jobs exactly once, with catch-up, overlap and templates that stopped being valid."""
import pytest

from corral.scheduler.models import Job, ScheduleRun
from corral.scheduler.schedules import Schedules, run_key
from corral.scheduler.validation import job_request
from corral.shared.errors import BadRequest, Conflict, NotFound

JOB = {"command": "python report.py"}
CATCH_UP_MAX = 100


@pytest.fixture
def schedules(store):
    return Schedules(store)


def every_second(schedules, clock, **extra):
    return schedules.create({"name": "tick", "interval_secs": 1, "job": JOB, **extra}, clock())


def fire(schedules, schedule, now, missed_before):
    return schedules.fire(schedule.id, now, missed_before, CATCH_UP_MAX)


def jobs_of(name):
    return list(Job.select().where(Job.schedule == name).order_by(Job.slot))


def test_a_schedule_is_created_once_by_name_with_its_first_slot(schedules, clock):
    t0 = clock()
    tick = every_second(schedules, clock)
    assert tick.next_run_at == t0 + 1 and tick.start_at == t0  # an interval is anchored at its creation
    nightly = schedules.create({"name": "nightly", "cron": "30 2 * * *", "time_zone": "Europe/Berlin",
                                "job": JOB}, t0)
    assert nightly.next_run_at > t0 and nightly.enabled and nightly.overlap == "allow"
    with pytest.raises(Conflict, match="a schedule named 'tick' exists"):
        every_second(schedules, clock)
    with pytest.raises(BadRequest, match="field 1 \\(minute\\)"):
        schedules.create({"name": "bad", "cron": "61 * * * *", "job": JOB}, t0)
    assert [s.name for s in schedules.list_schedules()] == ["nightly", "tick"]
    with pytest.raises(NotFound):
        schedules.get("nope")


def test_due_slots_become_jobs_each_with_its_slot_and_key_and_the_schedule_advances(schedules, clock):
    t0 = clock()
    tick = every_second(schedules, clock)
    assert schedules.due(t0 + 0.5) == []
    assert schedules.due(t0 + 3.5) == [tick.id]
    fired = fire(schedules, tick, t0 + 3.5, missed_before=t0)
    assert len(fired.created) == 3 and fired.skipped == fired.failed == 0
    jobs = jobs_of("tick")
    assert [j.slot for j in jobs] == [t0 + 1, t0 + 2, t0 + 3]
    assert [j.idempotency_key for j in jobs] == [run_key(tick.id, t0 + i) for i in (1, 2, 3)]
    assert all(j.command == JOB["command"] and j.status == "pending" for j in jobs)
    assert schedules.get("tick").next_run_at == t0 + 4 and schedules.get("tick").last_job_id == jobs[-1].id
    # Fired again at the same moment (another worker, a pass repeated): nothing is due.
    assert fire(schedules, tick, t0 + 3.5, missed_before=t0).created == []
    runs = schedules.runs("tick")
    assert [(r.slot, r.job_id, status) for r, status in runs] == [(j.slot, j.id, "pending") for j in reversed(jobs)]


def test_a_slot_whose_job_exists_already_makes_no_second_one(schedules, store, clock):
    # A pass that created the job and then lost its transaction cannot leave a job behind
    # (one transaction); but were the key taken, the slot would name that job.
    t0 = clock()
    tick = every_second(schedules, clock)
    earlier, _ = store.submits.submit(dict(job_request(JOB), schedule="tick", slot=t0 + 1), t0,
                                      idempotency_key=run_key(tick.id, t0 + 1))
    fired = fire(schedules, tick, t0 + 1.5, missed_before=t0)
    assert fired.created == [earlier.id] and len(jobs_of("tick")) == 1


@pytest.mark.parametrize("catch_up, fired_slots", [("latest", [9, 10]), ("none", [10]),
                                                    ("all", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])])
def test_catch_up_decides_what_downtime_missed(schedules, clock, catch_up, fired_slots):
    t0 = clock()
    tick = every_second(schedules, clock, catch_up=catch_up)
    # Down until t0 + 10: the loop takes over then, so slots 1-9 were missed and 10 is on time.
    fired = fire(schedules, tick, t0 + 10.2, missed_before=t0 + 10)
    assert [j.slot - t0 for j in jobs_of("tick")] == fired_slots
    skipped = [r for r, _ in schedules.runs("tick", limit=1000) if r.job_id is None]
    assert len(skipped) == fired.skipped == 10 - len(fired_slots)
    assert all("missed while the scheduler was down" in r.skipped for r in skipped)


def test_overlap_skip_and_cancel_previous(schedules, store, clock):
    t0 = clock()
    skip = schedules.create({"name": "skip", "interval_secs": 1, "job": JOB, "overlap": "skip"}, t0)
    fire(schedules, skip, t0 + 1, missed_before=t0)
    first = jobs_of("skip")[0]
    fired = fire(schedules, skip, t0 + 2, missed_before=t0)  # the first run is still pending
    assert fired.created == [] and fired.skipped == 1
    assert schedules.runs("skip")[0][0].skipped == f"overlap: skip: {first.job_id} was still pending"
    last = schedules.last_runs(schedules.list_schedules())  # the skipped slot is the latest run
    assert [(r.slot, r.job_id, status) for r, status in last.values()] == [(t0 + 2, None, None)]
    store.actions.cancel(first.job_id, t0 + 2.5)  # it ended: the next slot runs
    assert len(fire(schedules, skip, t0 + 3, missed_before=t0).created) == 1

    cancel = schedules.create({"name": "cancel", "interval_secs": 1, "job": JOB, "overlap": "cancel_previous"}, t0)
    fire(schedules, cancel, t0 + 1, missed_before=t0)
    fire(schedules, cancel, t0 + 2, missed_before=t0)
    assert [j.status for j in jobs_of("cancel")] == ["cancelled", "pending"]
    last = schedules.last_runs([schedules.get("skip"), schedules.get("cancel")])
    assert {schedule_id: (r.slot, status) for schedule_id, (r, status) in last.items()} == {
        skip.id: (t0 + 3, "pending"), cancel.id: (t0 + 2, "pending")}


def test_a_template_no_longer_valid_records_a_failed_run_and_the_schedule_goes_on(schedules, store, clock):
    t0 = clock()
    store.nodes.sync_nodes([{"node_id": "n1", "address": "127.0.0.1", "kind": "compute", "slots": 4,
                             "status": "healthy", "max_memory_mb": 1024, "max_cpu_percent": 400}], t0)
    big = schedules.create({"name": "big", "interval_secs": 1, "job": dict(JOB, memory_mb=512)}, t0)
    store.nodes.sync_nodes([{"node_id": "n1", "address": "127.0.0.1", "kind": "compute", "slots": 4,
                             "status": "healthy", "max_memory_mb": 256, "max_cpu_percent": 400}], t0)  # the node shrank
    fired = fire(schedules, big, t0 + 1.5, missed_before=t0)
    assert fired.created == [] and fired.failed == 1
    run, status = schedules.runs("big")[0]
    assert run.job_id is None and run.skipped.startswith("not run: no node allows memory_mb=512")
    assert schedules.get("big").next_run_at == t0 + 2


def test_disabling_stops_the_slots_and_enabling_starts_them_from_then(schedules, clock):
    t0 = clock()
    every_second(schedules, clock)
    off = schedules.update("tick", {"enabled": False}, t0 + 0.5)
    assert not off.enabled and off.next_run_at is None and schedules.due(t0 + 100) == []
    on = schedules.update("tick", {"enabled": True}, t0 + 50.5)
    assert on.next_run_at == t0 + 51  # the creation's anchor, the first slot after now
    assert schedules.update("tick", {"interval_secs": 10}, t0 + 52).next_run_at == t0 + 60
    cron = schedules.update("tick", {"cron": "@hourly"}, t0 + 52)
    assert cron.interval_secs is None and cron.cron == "@hourly"
    with pytest.raises(BadRequest, match="name cannot change"):
        schedules.update("tick", {"name": "tock"}, t0)
    with pytest.raises(BadRequest, match="unknown time zone"):
        schedules.update("tick", {"time_zone": "Mars/Base"}, t0)
    assert schedules.get("tick").time_zone == "UTC"  # a refused change changes nothing


def test_deleting_a_schedule_keeps_the_jobs_it_created(schedules, clock):
    t0 = clock()
    tick = every_second(schedules, clock)
    fire(schedules, tick, t0 + 2.5, missed_before=t0)
    schedules.delete("tick")
    assert len(jobs_of("tick")) == 2 and ScheduleRun.select().count() == 0
    with pytest.raises(NotFound):
        schedules.delete("tick")
