"""Schedule slots: cron expressions in a zone (ISC cron's rule at daylight-saving
changes), intervals, and what a firing pass does with the slots that came due. The
vectors are exact UTC instants. America/New_York changes on 2026-03-08 (02:00 EST
→ 03:00 EDT, at 07:00Z) and 2026-11-01 (02:00 EDT → 01:00 EST, at 06:00Z);
Europe/Berlin on 2026-03-29 (02:00 CET → 03:00 CEST, at 01:00Z) and 2026-10-25
(03:00 CEST → 02:00 CET, at 01:00Z)."""
import datetime

import pytest

from corral.scheduler.slots import (SlotError, due, next_cron_slot, next_interval_slot, on_overlap, parse_cron,
                                    time_zone)


def at(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


def slots(expression: str, zone: str, after: str, count: int) -> list[str]:
    cron, tz = parse_cron(expression), time_zone(zone)
    found, t = [], at(after)
    for _ in range(count):
        t = next_cron_slot(cron, tz, t)
        found.append(iso(t))
    return found


NY, BERLIN = "America/New_York", "Europe/Berlin"


@pytest.mark.parametrize("expression, zone, after, expected", [
    # Fixed hours, spring forward: the local time does not exist; it runs at the first valid instant after.
    ("30 2 * * *", NY, "2026-03-07T12:00Z", ["2026-03-08T07:00Z", "2026-03-09T06:30Z"]),
    # ...and the slots that fall into the gap collapse into that one run.
    ("15,45 2 * * *", NY, "2026-03-07T12:00Z", ["2026-03-08T07:00Z", "2026-03-09T06:15Z", "2026-03-09T06:45Z"]),
    ("0 2 * * *", BERLIN, "2026-03-28T12:00Z", ["2026-03-29T01:00Z", "2026-03-30T00:00Z"]),
    # Fixed hours, fall back: the local time happens twice; it runs once, at the first occurrence.
    ("30 1 * * *", NY, "2026-10-31T12:00Z", ["2026-11-01T05:30Z", "2026-11-02T06:30Z"]),
    ("*/20 1 * * *", NY, "2026-11-01T04:50Z",
     ["2026-11-01T05:00Z", "2026-11-01T05:20Z", "2026-11-01T05:40Z", "2026-11-02T06:00Z"]),
    ("0 2 * * *", BERLIN, "2026-10-24T12:00Z", ["2026-10-25T00:00Z", "2026-10-26T01:00Z"]),
    ("30 2 * * *", BERLIN, "2026-10-25T00:45Z", ["2026-10-26T01:30Z"]),
    # A walk that starts in the repeated hour's second pass never goes back an hour.
    ("30 1 * * *", NY, "2026-11-01T06:15Z", ["2026-11-02T06:30Z"]),
    # Wildcard and stepped hours run at every real instant that matches: no stop, no double.
    ("*/30 * * * *", NY, "2026-03-08T06:00Z", ["2026-03-08T06:30Z", "2026-03-08T07:00Z", "2026-03-08T07:30Z"]),
    ("@hourly", NY, "2026-03-08T05:30Z", ["2026-03-08T06:00Z", "2026-03-08T07:00Z", "2026-03-08T08:00Z"]),
    ("0 * * * *", NY, "2026-11-01T04:30Z", ["2026-11-01T05:00Z", "2026-11-01T06:00Z", "2026-11-01T07:00Z"]),
    ("30 * * * *", NY, "2026-03-08T06:00Z", ["2026-03-08T06:30Z", "2026-03-08T07:30Z"]),
    ("*/30 * * * *", BERLIN, "2026-10-25T00:15Z",
     ["2026-10-25T00:30Z", "2026-10-25T01:00Z", "2026-10-25T01:30Z", "2026-10-25T02:00Z"]),
    # @weekly across a change: Sunday 00:00 local on either side.
    ("@weekly", NY, "2026-03-01T12:00Z", ["2026-03-08T05:00Z", "2026-03-15T04:00Z"]),
    ("@weekly", BERLIN, "2026-10-20T00:00Z", ["2026-10-24T22:00Z", "2026-10-31T23:00Z"]),
    # Feb 29, month ends, @daily/@monthly, steps and ranges.
    ("0 12 29 2 *", "UTC", "2026-01-01T00:00Z", ["2028-02-29T12:00Z", "2032-02-29T12:00Z"]),
    ("0 0 31 * *", "UTC", "2026-01-31T01:00Z", ["2026-03-31T00:00Z", "2026-05-31T00:00Z"]),
    ("@monthly", "UTC", "2026-01-31T12:00Z", ["2026-02-01T00:00Z", "2026-03-01T00:00Z"]),
    ("@daily", BERLIN, "2026-12-03T12:00Z", ["2026-12-03T23:00Z", "2026-12-04T23:00Z"]),
    ("5-15/5 9-10 * * 1-5", "UTC", "2026-12-04T10:14Z",
     ["2026-12-04T10:15Z", "2026-12-07T09:05Z", "2026-12-07T09:10Z"]),
])
def test_the_next_slots_are_these_instants(expression, zone, after, expected):
    assert slots(expression, zone, after, len(expected)) == expected


@pytest.mark.parametrize("expression, says", [
    ("61 * * * *", "field 1 (minute) is not valid: '61'"),
    ("* 24 * * *", "field 2 (hour) is not valid: '24'"),
    ("* * 0 * *", "field 3 (day of month) is not valid: '0'"),
    ("* * * 13 *", "field 4 (month) is not valid: '13'"),
    ("* * * * 8", "field 5 (day of week) is not valid: '8'"),
    ("*/0 * * * *", "field 1 (minute) is not valid: '*/0'"),
    ("* * *", "five fields (minute hour day-of-month month day-of-week), not 3"),
    ("0 * * * * *", "five fields (minute hour day-of-month month day-of-week), not 6"),
    ("@yearly", "unknown cron alias '@yearly'"),
    ("", "five fields"),
])
def test_a_bad_cron_expression_says_which_field(expression, says):
    with pytest.raises(SlotError) as refused:
        parse_cron(expression)
    assert says in str(refused.value)


def test_zones_are_iana_names():
    assert str(time_zone("Europe/Berlin")) == "Europe/Berlin"
    for name in ("Mars/Base", "../etc/passwd", "", "EST5EDT "):
        with pytest.raises(SlotError, match="unknown time zone"):
            time_zone(name)


def test_aliases_and_spacing_mean_their_five_fields():
    assert parse_cron("@HOURLY").fields == "0 * * * *"
    assert parse_cron(" 0  3 * * 1 ").fields == "0 3 * * 1"
    assert parse_cron("0 3 * * *").fixed_hours and not parse_cron("*/5 * * * *").fixed_hours
    assert not parse_cron("@hourly").fixed_hours and parse_cron("@daily").fixed_hours


def test_interval_slots_are_anchor_plus_multiples_and_strictly_later():
    assert next_interval_slot(1000.0, 60.0, 900.0) == 1000.0
    assert next_interval_slot(1000.0, 60.0, 1000.0) == 1060.0
    assert next_interval_slot(1000.0, 60.0, 1059.5) == 1060.0
    t = 0.0
    for _ in range(1000):  # no drift and no repeat with a step floating point cannot hold exactly
        following = next_interval_slot(0.0, 0.1, t)
        assert following > t
        t = following
    assert t == pytest.approx(100.0)


def every_second(slot: float) -> float:
    return next_interval_slot(100.0, 1.0, slot)


def test_slots_that_came_due_while_the_scheduler_ran_all_fire():
    result = due(every_second, 100.0, now=102.5, missed_before=90.0, catch_up="latest", limit=100)
    assert result.fire == [100.0, 101.0, 102.0] and result.skipped == [] and result.next_at == 103.0


@pytest.mark.parametrize("catch_up, fire, skipped, more", [
    ("latest", [109.0, 110.0], [106.0, 107.0, 108.0], 6),
    ("none", [110.0], [107.0, 108.0, 109.0], 7),
    ("all", [107.0, 108.0, 109.0, 110.0], [104.0, 105.0, 106.0], 4),
])
def test_catch_up_decides_the_slots_missed_while_it_was_down(catch_up, fire, skipped, more):
    # Down from before 100 until 110: slots 100-109 were missed; 110 came due as it took over.
    # The newest `limit` (3) skipped slots are listed, the others counted.
    result = due(every_second, 100.0, now=110.2, missed_before=110.0, catch_up=catch_up, limit=3)
    assert (result.fire, result.skipped, result.skipped_more, result.next_at) == (fire, skipped, more, 111.0)


def test_a_walk_too_long_goes_on_from_now_and_skips_what_it_missed():
    result = due(every_second, 100.0, now=10_000.5, missed_before=10_000.0, catch_up="latest", limit=3,
                 max_walk=50)
    assert result.walk_cut and result.fire == [] and result.next_at == 10_001.0


@pytest.mark.parametrize("policy, active, action", [
    ("allow", True, "fire"), ("allow", False, "fire"),
    ("skip", True, "skip"), ("skip", False, "fire"),
    ("cancel_previous", True, "cancel_previous"), ("cancel_previous", False, "fire"),
])
def test_overlap_decides_a_slot_whose_previous_run_is_still_on(policy, active, action):
    assert on_overlap(policy, active) == action
