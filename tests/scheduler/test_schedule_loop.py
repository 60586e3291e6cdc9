"""The loop that fires schedules, driven by hand with a clock, on each backend: once
across replicas (a lease), missed slots told from on-time ones, new jobs placed."""
from corral.scheduler.models import Job
from corral.scheduler.schedule_loop import LEASE_TTL_SECS, SCHEDULE_POLL_SECS, Firing
from corral.scheduler.schedules import Schedules
from scheduler_app import set_nodes


def slots_of(name, t0):
    return [j.slot - t0 for j in Job.select().where(Job.schedule == name).order_by(Job.slot)]


def test_a_pass_fires_what_is_due_places_it_and_sleeps_until_the_next_slot(store, clock):
    t0 = clock()
    set_nodes(store, clock, "n1")
    Schedules(store).create({"name": "tick", "interval_secs": 1, "job": {"command": "true"}}, t0)
    Schedules(store).create({"name": "slow", "interval_secs": 3600, "job": {"command": "true"}}, t0)
    firing = Firing(store, holder="a")
    assert firing.tick(t0 + 0.25) == 0.75            # the first slot is at t0 + 1
    assert firing.tick(t0 + 1.0) == 1.0
    assert slots_of("tick", t0) == [1.0]
    assert Job.get(Job.schedule == "tick").node_id == "n1"  # placed in the same pass
    assert firing.tick(t0 + 2.5) == 0.5 and slots_of("tick", t0) == [1.0, 2.0]
    Schedules(store).update("tick", {"enabled": False}, t0 + 2.6)
    assert firing.tick(t0 + 2.7) == SCHEDULE_POLL_SECS  # nothing within a second: it looks again in one


def test_only_the_lease_holder_fires_and_a_replica_taking_over_treats_the_gap_as_missed(store, clock):
    t0 = clock()
    Schedules(store).create({"name": "tick", "interval_secs": 1, "job": {"command": "true"}}, t0)
    a, b = Firing(store, holder="a"), Firing(store, holder="b")
    a.tick(t0 + 0.5)
    b.tick(t0 + 3.5)                      # a holds the lease: b fires nothing
    assert slots_of("tick", t0) == []
    a.tick(t0 + 3.5)
    assert slots_of("tick", t0) == [1.0, 2.0, 3.0]  # a ran all along: no slot was missed
    # a stops; once its lease has run out b takes over, and the slots since a's last pass
    # were missed: catch_up latest runs the newest of them only.
    takeover = t0 + 3.5 + LEASE_TTL_SECS + 1
    b.tick(takeover)
    assert slots_of("tick", t0) == [1.0, 2.0, 3.0, 14.0]
    b.tick(takeover + 0.5)  # then on time again
    assert slots_of("tick", t0) == [1.0, 2.0, 3.0, 14.0, 15.0]


def test_a_holder_back_from_a_pause_treats_the_pause_as_missed(store, clock):
    t0 = clock()
    Schedules(store).create({"name": "tick", "interval_secs": 1, "job": {"command": "true"}, "catch_up": "none"},
                            t0)
    firing = Firing(store, holder="a")
    firing.tick(t0 + 1.0)
    firing.tick(t0 + 1.0 + LEASE_TTL_SECS + 5)  # stopped for longer than a lease, nobody took over
    assert slots_of("tick", t0) == [1.0, 1.0 + LEASE_TTL_SECS + 5]


def test_a_schedule_that_fails_to_fire_holds_up_no_other(store, clock, monkeypatch, caplog):
    t0 = clock()
    broken = Schedules(store).create({"name": "broken", "interval_secs": 1, "job": {"command": "true"}}, t0)
    Schedules(store).create({"name": "fine", "interval_secs": 1, "job": {"command": "true"}}, t0)
    firing = Firing(store, holder="a")
    fire = firing.schedules.fire

    def failing(schedule_id, *args):
        if schedule_id == broken.id:
            raise RuntimeError("the disk is full")
        return fire(schedule_id, *args)

    monkeypatch.setattr(firing.schedules, "fire", failing)
    firing.tick(t0 + 1.5)
    assert slots_of("fine", t0) == [1.0] and slots_of("broken", t0) == []
    assert "firing schedule" in caplog.text and "the disk is full" in caplog.text
    assert "tried again in 1s" in caplog.text
    firing.tick(t0 + 2.5)  # tried again after a second, fails again: then after 2 s
    assert "tried again in 2s" in caplog.text and slots_of("fine", t0) == [1.0, 2.0]
    caplog.clear()
    firing.tick(t0 + 3.5)
    assert caplog.text == "" and slots_of("fine", t0) == [1.0, 2.0, 3.0]  # not tried: no log line each pass
    monkeypatch.setattr(firing.schedules, "fire", fire)
    firing.tick(t0 + 4.5)  # tried again: what it missed fired, none lost
    assert slots_of("broken", t0) == [1.0, 2.0, 3.0, 4.0]
    assert firing.failing == {}
