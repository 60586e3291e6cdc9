"""Schedules in the database: their definitions, and turning due slots into jobs.

A slot becomes a job in the transaction that records its run and advances the
schedule's `next_run_at`, and the job's idempotency key is derived from the
schedule's immutable id and the slot (`schedule:<id>:<slot in UTC>`, a prefix
no client may use: validation.idempotency_key). So a crash, a restart, a paused
loop that wakes up, or two replicas firing at once never create two jobs for
one slot: the second transaction finds the key taken (and, on PostgreSQL, the
schedule's row locked until the first commits) and the run's row unique per
(schedule, slot). When each slot falls is slots.py's; what the missed ones and
the overlapping ones do is decided there too (slots.due, slots.on_overlap).
"""
from __future__ import annotations

import logging
import typing
from collections.abc import Callable
from dataclasses import dataclass

import peewee
from opentelemetry.trace import INVALID_SPAN, Span
from peewee import fn

from corral.server.principals import DEFAULT_TEAM
from corral.server.backends.lookup import backend_of
from corral.shared.errors import BadRequest, Conflict, CorralError, NotFound
from corral.shared.states import ACTIVE
from corral.shared import tracecontext, tracing
from corral.shared.timeutil import iso

from . import metrics, slots, spans
from .contract import ScheduleChange, ScheduleRequest, parse_instant
from .models import Job, Schedule, ScheduleRun
from .store import Store
from .validation import check_stop, job_request

log = logging.getLogger(__name__)

# What a schedule's definition is made of (ScheduleRequest's fields but its name).
DEFINITION = ("cron", "interval_secs", "start_at", "time_zone", "job", "overlap", "catch_up", "enabled")


def run_key(schedule_id: int, slot: float) -> str:
    """The idempotency key of the job of a schedule's slot."""
    return f"schedule:{schedule_id}:{iso(slot)}"


def next_slot_of(schedule: Schedule) -> Callable[[float], float]:
    """The schedule's next-slot function: the first slot strictly after a time."""
    if schedule.cron is not None:
        cron, zone = slots.parse_cron(schedule.cron), slots.time_zone(schedule.time_zone)
        return lambda after: slots.next_cron_slot(cron, zone, after)
    anchor, every = schedule.start_at, schedule.interval_secs
    if anchor is None or every is None:
        raise ValueError(f"schedule {schedule.name!r} has neither a cron expression nor an anchored interval")
    return lambda after: slots.next_interval_slot(anchor, every, after)


@dataclass
class Fired:
    """What one schedule's due slots became."""

    created: list[int]   # job row ids
    skipped: int         # slots skipped (listed or counted)
    failed: int          # slots whose job could not be created (the template is no longer valid)


class Schedules:
    def __init__(self, store: Store):
        self.store = store
        self.db = store.db

    # ---- definitions -------------------------------------------------------

    def create(self, body: dict, now: float, created_by: str = "admin") -> Schedule:
        """A new schedule from a POST /schedules body (its `team` decided by the caller),
        made by `created_by`; Conflict when the name is taken."""
        request = ScheduleRequest.check(body)
        check_stop(job_request(request.job), self.store.settings)
        fields = {name: getattr(request, name) for name in DEFINITION}
        row = {"name": request.name, **_columns(fields, now), "created_at": now, "updated_at": now,
               "team": request.team or DEFAULT_TEAM, "created_by": created_by}
        try:
            with self.db.atomic():
                schedule = Schedule.create(**row)
        except peewee.IntegrityError:
            raise Conflict(f"a schedule named {request.name!r} exists") from None
        return schedule

    def get(self, name: str) -> Schedule:
        schedule = Schedule.get_or_none(Schedule.name == name)
        if schedule is None:
            raise NotFound(f"no schedule {name!r}")
        return schedule

    def list_schedules(self, teams: frozenset[str] | None = None) -> list[Schedule]:
        """Every schedule (of `teams` only, unless None), by name."""
        query = Schedule.select()
        if teams is not None:
            query = query.where(Schedule.team.in_(sorted(teams)))
        return list(query.order_by(Schedule.name))

    def update(self, name: str, changes: dict, now: float) -> Schedule:
        """Change a schedule (PATCH): the fields given replace its own, checked as a whole
        as POST /schedules checks one. Its next slot is computed again from `now` when its
        timing changed or it was enabled; a disabled schedule has none."""
        if not isinstance(changes, dict):
            raise BadRequest("the body must be a JSON object")
        if "name" in changes:
            raise BadRequest("a schedule's name cannot change: create another one")
        ScheduleChange.check(changes)  # the fields and their types; the whole is checked below
        with self.db.atomic():
            schedule = self.get(name)
            current = {field: getattr(schedule, field) for field in DEFINITION}
            if current["start_at"] is not None:
                current["start_at"] = iso(current["start_at"])
            merged = {**current, **changes}
            if "cron" in changes and changes["cron"] is not None:
                merged.update(interval_secs=None, start_at=None)
            if "interval_secs" in changes and changes["interval_secs"] is not None:
                merged["cron"] = None
            request = ScheduleRequest.check({"name": name, **{k: v for k, v in merged.items() if v is not None}})
            check_stop(job_request(request.job), self.store.settings)
            fields = {field: getattr(request, field) for field in DEFINITION}
            retimed = any(fields[f] != current[f] for f in ("cron", "interval_secs", "start_at", "time_zone"))
            enabled_now = fields["enabled"] is not False and not schedule.enabled
            columns = _columns(fields, now, anchor=schedule.created_at)
            if not (retimed or enabled_now) and fields["enabled"] is not False:
                columns["next_run_at"] = schedule.next_run_at
            Schedule.update(**columns, updated_at=now).where(Schedule.id == schedule.id).execute()
            return self.get(name)

    def delete(self, name: str) -> None:
        """Delete a schedule and its runs' records; the jobs it created stay."""
        with self.db.atomic():
            schedule = self.get(name)
            ScheduleRun.delete().where(ScheduleRun.schedule_id == schedule.id).execute()
            schedule.delete_instance()

    def runs(self, name: str, limit: int = 100) -> list[tuple[ScheduleRun, str | None]]:
        """The schedule's newest runs, newest first, each with its job's status (None:
        no job, or the job was deleted by retention)."""
        schedule = self.get(name)
        return _with_status(list(ScheduleRun.select().where(ScheduleRun.schedule_id == schedule.id)
                                 .order_by(ScheduleRun.slot.desc()).limit(limit)))

    def last_runs(self, schedules: list[Schedule]) -> dict[int, tuple[ScheduleRun, str | None]]:
        """Each schedule's latest run (by slot) with its job's status, by schedule id; a
        schedule with no run yet is left out. One query for all, however many."""
        ids = [s.id for s in schedules]
        if not ids:
            return {}
        latest = (ScheduleRun.select(ScheduleRun.schedule_id, fn.MAX(ScheduleRun.slot).alias("slot"))
                  .where(ScheduleRun.schedule_id.in_(ids)).group_by(ScheduleRun.schedule_id).alias("latest"))
        rows = list(ScheduleRun.select().join(latest, on=(
            (ScheduleRun.schedule_id == latest.c.schedule_id) & (ScheduleRun.slot == latest.c.slot))))
        return {run.schedule_id: (run, status) for run, status in _with_status(rows)}

    # ---- firing ------------------------------------------------------------

    def due(self, now: float) -> list[int]:
        """The ids of the enabled schedules with a slot due at `now`."""
        return [s.id for s in Schedule.select(Schedule.id).where(
            Schedule.enabled & (Schedule.next_run_at <= now)).order_by(Schedule.next_run_at)]

    def next_slot(self) -> float | None:
        """The earliest next slot of the enabled schedules (None: there is none)."""
        first = Schedule.select(Schedule.next_run_at).where(Schedule.enabled & Schedule.next_run_at.is_null(False)) \
            .order_by(Schedule.next_run_at).first()
        return None if first is None else first.next_run_at

    def fire(self, schedule_id: int, now: float, missed_before: float, catch_up_max: int) -> Fired:
        """Turn one schedule's due slots into jobs (and skipped runs), and advance it, in
        one transaction. `missed_before`: slots earlier than this were missed (the
        firing loop took over or woke then; slots.due)."""
        with self.db.atomic():
            self.store.check_fence()  # the firing loop's lease: still its holder
            query = Schedule.select().where((Schedule.id == schedule_id) & Schedule.enabled
                                            & (Schedule.next_run_at <= now))
            # Where writers run side by side, a second replica's pass waits here, then finds it advanced.
            query = backend_of(self.db).lock_rows(query)
            schedule = query.first()
            if schedule is None:
                return Fired([], 0, 0)
            decided = slots.due(next_slot_of(schedule), schedule.next_run_at, now, missed_before,
                                schedule.catch_up, catch_up_max)
            reason = f"missed while the scheduler was down (catch_up: {schedule.catch_up})"
            runs = [{"schedule_id": schedule.id, "slot": slot, "job_id": None, "skipped": reason, "created_at": now}
                    for slot in decided.skipped]
            fired = Fired([], len(decided.skipped) + decided.skipped_more, 0)
            last = schedule.last_job_id
            for slot in decided.fire:
                run, job_id, failed = self._fire_slot(schedule, slot, last, now)
                runs.append(run)
                if job_id is not None:
                    fired.created.append(job_id)
                    last = job_id
                elif failed:
                    fired.failed += 1
                else:
                    fired.skipped += 1
            if runs:
                ScheduleRun.insert_many(runs).on_conflict_ignore().execute()
            made = [run["slot"] for run in runs if run["job_id"] is not None]
            metrics.schedule_fired(self.db, [now - slot for slot in made], fired.skipped, fired.failed)
            Schedule.update(next_run_at=decided.next_at, last_job_id=last).where(
                Schedule.id == schedule.id).execute()
        return fired

    def _fire_slot(self, schedule: Schedule, slot: float, last: int | None, now: float
                   ) -> tuple[dict, int | None, bool]:
        """One slot: its run's row, the id of the job it created (None: skipped or failed),
        and whether it failed."""
        run: dict = {"schedule_id": schedule.id, "slot": slot, "job_id": None, "skipped": None, "created_at": now}
        # The last run's job matters only to an overlap policy other than allow (no read per slot else).
        previous = Job.get_or_none(Job.id == last) if last is not None and schedule.overlap != "allow" else None
        action = slots.on_overlap(schedule.overlap, previous is not None and previous.status in ACTIVE)
        if previous is not None and action == "skip":
            run["skipped"] = f"overlap: skip: {previous.job_id} was still {previous.status}"
            return run, None, False
        if previous is not None and action == "cancel_previous":
            self.store.actions.cancel(previous.job_id, now)
        span: Span = INVALID_SPAN
        try:
            # Each run is the root of a trace of its own (no request came with one).
            got = tracecontext.received(None)
            fields = dict(job_request(schedule.job), schedule=schedule.name, slot=slot, team=schedule.team,
                          submitted_by=schedule.created_by, **tracecontext.job_fields(got))
            span = spans.submit(got, fields, "schedule", kind=tracing.INTERNAL,
                                attributes={"corral.schedule": schedule.name})
            job, created = self.store.submits.submit(fields, now, idempotency_key=run_key(schedule.id, slot))
            spans.submitted(span, created, {"corral.job_id": job.job_id, "corral.job_count": 1})
            tracing.end(span)
        except CorralError as exc:
            tracing.end(span, error=exc.message)
            # The template no longer passes (a node size, a refused variable): this run
            # is recorded as failed with why, and the schedule goes on.
            log.warning("schedule %s: the run of %s could not be created: %s", schedule.name, iso(slot), exc)
            run["skipped"] = f"not run: {exc}"
            return run, None, True
        run["job_id"] = job.id
        return run, job.id, False


def _with_status(rows: list[ScheduleRun]) -> list[tuple[ScheduleRun, str | None]]:
    """Runs with their jobs' statuses now (None: no job, or retention deleted it)."""
    ids = [r.job_id for r in rows if r.job_id is not None]
    found = Job.select(Job.id, Job.status).where(Job.id.in_(ids)).tuples() if ids else []
    statuses = dict(typing.cast(list[tuple[int, str]], list(found)))
    return [(r, None if r.job_id is None else statuses.get(r.job_id)) for r in rows]


def _columns(fields: dict, now: float, anchor: float | None = None) -> dict:
    """A schedule's columns from its checked fields, with its next slot after `now`."""
    start_at = None if fields["start_at"] is None else parse_instant("start_at", fields["start_at"])
    columns = {**fields, "time_zone": fields["time_zone"] or "UTC", "overlap": fields["overlap"] or "allow",
               "catch_up": fields["catch_up"] or "latest", "enabled": fields["enabled"] is not False,
               "start_at": None, "next_run_at": None}
    if fields["interval_secs"] is not None:
        columns["start_at"] = start_at if start_at is not None else (anchor if anchor is not None else now)
    if columns["enabled"]:
        probe = Schedule(**{k: v for k, v in columns.items() if k in DEFINITION})
        try:
            columns["next_run_at"] = next_slot_of(probe)(now)
        except slots.SlotError as exc:
            raise BadRequest(str(exc)) from None
    return columns
