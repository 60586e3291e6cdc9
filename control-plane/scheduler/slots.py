"""When a schedule's slots fall: a cron expression in a time zone, or a fixed interval.

Cron in an IANA zone is walked by cronsim, with ISC cron's daylight-saving rule
enforced on top (next_cron_slot); an interval is anchor + k × interval, with no zone.
Pure: times are epoch seconds (UTC) passed in. docs/schedules.md says what happens at
daylight-saving changes.
"""
from __future__ import annotations

import datetime
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass, field

from cronsim import CronSim, CronSimError

from corral.shared import wire

ALIASES = {"@hourly": "0 * * * *", "@daily": "0 0 * * *", "@weekly": "0 0 * * 0", "@monthly": "0 0 1 * *"}
FIELDS = ("minute", "hour", "day of month", "month", "day of week")
# cronsim's names of the fields, in its error messages ("Bad day-of-month").
_LIBRARY_FIELDS = {"minute": 0, "hour": 1, "day-of-month": 2, "month": 3, "day-of-week": 4}
# How many slots of the repeated hour a walk skips at most before giving up (a
# minute-by-minute entry has 60 there).
_MAX_SKIPPED = 1000


class SlotError(ValueError):
    """A cron expression, a zone or an interval that cannot make slots; the message says why."""


@dataclass(frozen=True)
class Cron:
    expression: str   # as given (an alias stays an alias)
    fields: str       # the five fields
    fixed_hours: bool  # the hour field does not start with '*' (ISC cron's "fixed-time" entry)


def parse_cron(text: str) -> Cron:
    """A five-field cron expression or one of ALIASES; SlotError naming the bad field."""
    expression = " ".join(text.split())
    fields = ALIASES.get(expression.lower(), expression)
    if fields.startswith("@"):
        raise SlotError(f"unknown cron alias {expression!r}: use {', '.join(ALIASES)} or five fields")
    parts = fields.split()
    if len(parts) != 5:
        raise SlotError(f"a cron expression has five fields (minute hour day-of-month month day-of-week), "
                        f"not {len(parts)}")
    try:
        CronSim(fields, datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc))
    except CronSimError as exc:
        message = str(exc)
        for name, index in _LIBRARY_FIELDS.items():
            if name in message:
                raise SlotError(f"the cron expression's field {index + 1} ({FIELDS[index]}) is not valid: "
                                f"{parts[index]!r}") from None
        raise SlotError(f"not a valid cron expression: {message}") from None
    return Cron(expression, fields, fixed_hours=not parts[1].startswith("*"))


def time_zone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA zone of that name; SlotError when there is none."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise SlotError(f"unknown time zone {name!r}: use an IANA name such as Europe/Berlin or UTC") from None


def next_cron_slot(cron: Cron, zone: zoneinfo.ZoneInfo, after: float) -> float:
    """The first slot strictly after `after`, in real time (a walk started inside a
    repeated hour could otherwise go back an hour). ISC cron's rule: an entry with fixed
    hours runs once in a spring-forward gap (at the first valid instant after it, as
    cronsim yields) and once in a fall-back repeat (the first pass: the second pass's
    slots are skipped, which cronsim would yield); one with wildcard or stepped hours
    runs at every real instant that matches."""
    start = datetime.datetime.fromtimestamp(after, zone)
    skipped = 0
    for local in CronSim(cron.fields, start):
        at = local.timestamp()
        if at <= after or (cron.fixed_hours and _second_pass(local)):
            skipped += 1
            if skipped > _MAX_SKIPPED:
                break
            continue
        return at
    raise SlotError(f"the cron expression {cron.expression!r} has no slot after {after}")


def _second_pass(local: datetime.datetime) -> bool:
    """Whether this wall time is the second of two instants with that name (fall back)."""
    return bool(local.fold) and local.replace(fold=0).utcoffset() != local.utcoffset()


def next_interval_slot(anchor: float, every: float, after: float) -> float:
    """The first of anchor + k × every (k ≥ 0) strictly after `after`."""
    if after < anchor:
        return anchor
    k = int((after - anchor) // every) + 1
    slot = anchor + k * every
    while slot <= after:  # floating point: never answer the slot just passed
        k += 1
        slot = anchor + k * every
    return slot


CATCH_UP = wire.SCHEDULE_CATCH_UP


@dataclass
class Due:
    """What a firing pass does with the slots that came due."""

    fire: list[float] = field(default_factory=list)      # a job each, oldest first
    skipped: list[float] = field(default_factory=list)   # skipped by catch_up (the newest `limit` of them)
    skipped_more: int = 0                                # skipped beyond those listed
    next_at: float = 0.0                                 # the schedule's next slot after them
    walk_cut: bool = False                               # more than max_walk slots were due


def due(next_slot: Callable[[float], float], first: float, now: float, missed_before: float, catch_up: str,
        limit: int, max_walk: int = 100_000) -> Due:
    """The slots from `first` (the schedule's stored next slot) up to `now`.

    A slot earlier than `missed_before` (when the firing loop last took over, or
    woke after a pause) was missed: the scheduler was down. The others came due
    while it ran and always fire. `catch_up` decides the missed ones: `all` fires
    them (the newest `limit`; the older are skipped), `latest` fires the newest
    and skips the rest, `none` skips them all. At most `limit` skipped slots are
    listed; `skipped_more` counts the others. After `max_walk` due slots (a
    one-minute cron after months of downtime) the walk stops: the schedule goes on
    from `now`, the on-time slots found fire, the missed ones are skipped."""
    assert limit >= 1, "SCHEDULE_CATCH_UP_MAX is at least 1"
    result = Due()
    missed: list[float] = []
    slot, walked = first, 0
    while slot <= now:
        if slot < missed_before:
            missed.append(slot)
            if len(missed) > 2 * limit:  # only the newest are fired or listed
                missed.pop(0)
                result.skipped_more += 1
        else:
            result.fire.append(slot)
        walked += 1
        if walked >= max_walk:
            # So far behind that the newest missed slot is not in sight: the schedule
            # goes on from now, and what it missed counts as skipped (not counted on).
            result.next_at = next_slot(now)
            result.skipped_more += len(missed)
            result.walk_cut = True
            return result
        slot = next_slot(slot)
    result.next_at = slot
    if catch_up == "all":
        fire, skip = missed[-limit:], missed[:-limit]
    elif catch_up == "latest":
        fire, skip = missed[-1:], missed[:-1]
    elif catch_up == "none":
        fire, skip = [], missed
    else:
        raise ValueError(f"unknown catch_up {catch_up!r}")
    result.fire = fire + result.fire
    result.skipped = skip[-limit:]
    result.skipped_more += len(skip) - len(result.skipped)
    return result


OVERLAP = wire.SCHEDULE_OVERLAP


def on_overlap(policy: str, previous_active: bool) -> str:
    """What a due slot does when the schedule's previous run may still be pending or
    running: `fire`, `skip` (Nomad's prohibit_overlap) or `cancel_previous` (cancel
    that run, then fire)."""
    if policy not in OVERLAP:
        raise ValueError(f"unknown overlap policy {policy!r}")
    if not previous_active or policy == "allow":
        return "fire"
    return policy
