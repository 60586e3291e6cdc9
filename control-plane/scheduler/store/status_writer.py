"""The one place a job's status is written.

A compare-and-set per group of alike decisions, the event rows, the metrics, and for a
final status its SNS notification in the outbox, and for an attempt that ended what it
used (usage.py), in the same transaction (sns_outbox.py publishes the notification).

Every status change is checked against shared.states first. Deciding the jobs that
waited on one that ended is not this module's: transitions.py adds that."""
import dataclasses
from typing import Any

from corral.server.statements import ValueList, param
from corral.shared.states import FINAL_STATUSES, check_transition

from .. import gangs, lifecycle, metrics, notifications
from ..models import Job, JobEvent, OutboxEvent
from . import usage
from .context import StoreContext


class StatusWriter:
    def __init__(self, ctx: StoreContext):
        self.ctx = ctx
        self.usage = usage.Usage(ctx)

    def write(self, decided: list[tuple[Job, lifecycle.Transition]], now: float,
              on_node: str | None = None) -> list[Job]:
        """For each (job, transition): a compare-and-set on the job's status and attempt
        (and node, `on_node`: a claim), its event row (all of them in one statement), its
        metrics on commit, and its notification in the outbox when it is final; each
        instance then says what its row says. Decisions that change the same fields
        share one UPDATE (_update_jobs). Returns the jobs whose row had changed
        meanwhile: nothing is written for them and their instances are as they were.
        A job appears at most once."""
        db, settings = self.ctx.db, self.ctx.settings
        groups: dict[tuple, list[tuple[Job, lifecycle.Transition]]] = {}
        for job, transition in decided:
            check_transition(job.status, transition.new)
            key = (job.status, job.attempt, transition.new, tuple(sorted(transition.changes)),
                   None if self.ctx.backend.one_writer else repr(sorted(transition.changes.items())))
            groups.setdefault(key, []).append((job, transition))
        stale, rows, ended = [], [], []
        for (old, attempt, new, _, _), members in groups.items():
            changed = self._update_jobs(members, old, attempt, new, on_node)
            for job, transition in members:
                if job.id not in changed:
                    stale.append(job)
                    continue
                rows.append({"job": job.id, "at": now, "old": old, "new": new, "attempt": attempt,
                             "node_id": job.node_id, "reason": transition.reason})
                # An attempt ended: what it used (before the instance changes). A job of many
                # nodes uses nothing itself: its members' attempts count.
                if old == "running" and not gangs.spans_nodes(job):
                    ended.append((job, usage.ended(job, transition.used or transition.changes, now)))
                metrics.moved(db, job, new, now, transition.changes)  # before the instance changes
                if transition.timed_out:
                    metrics.timed_out(db)
                for name, value in transition.changes.items():
                    setattr(job, name, value)
                job.status = new
                # A member's end is its job's to publish.
                if new in FINAL_STATUSES and settings.sns_topic_arn and not gangs.is_member(job):
                    message = notifications.notification(job, transition.reason)
                    OutboxEvent.create(event_id=message["event_id"], job_id=job.id, status=new, message=message,
                                       created_at=now)
        self.events(rows)
        if ended:
            self.account(ended, now)
        return stale

    def account(self, ended: list[tuple[Job, usage.Ended]], now: float) -> None:
        """Add the ended attempts to their users' and teams' usage (the team and submitter
        read here for jobs loaded without them)."""
        owners = self.usage.attributed([job for job, _ in ended
                                        if "team" not in job.__data__ or "submitted_by" not in job.__data__])
        self.usage.add([dataclasses.replace(one, team=owners[job.id][0], user=owners[job.id][1])
                        if job.id in owners else one for job, one in ended], now)

    def _update_jobs(self, members: list[tuple[Job, lifecycle.Transition]], old: str, attempt: int, new: str,
                     on_node: str | None) -> set[int]:
        """The compare-and-set of write() for decisions that change the same fields;
        returns the ids it changed. When the values are alike too (a claim's jobs) they
        are the statement's constants; else each row brings its own (reports: every
        job's output, CPU time and peak memory differ), joined in one statement rather
        than an UPDATE per job. Only with one writer (SQLite): on PostgreSQL the joined
        UPDATE measured no faster than an UPDATE per job under the capacity benchmark
        (docs/benchmarks.md), so there write() groups alike values only."""
        db, sql = self.ctx.db, self.ctx.sql
        fields = Job._meta.fields
        changes = members[0][1].changes
        names = sorted(changes)
        if any(transition.changes != changes for _, transition in members[1:]):
            where = {"status": old, "attempt": attempt, **({"node_id": on_node} if on_node is not None else {})}
            changed: set[int] = sql.update_rows(db, "transition", Job, [
                {"id": job.id, **{name: fields[name].db_value(transition.changes[name]) for name in names}}
                for job, transition in members], names, {"status": new}, where)
            return changed
        chosen = ValueList(db, "ids", [job.id for job, _ in members])

        def update() -> Any:
            # With the node: by the (node_id, status) index and the ids. Without: `status || ''`,
            # so that the rows are found by id, never by the status index, which SQLite
            # (without statistics) would otherwise walk: every running job, for eight.
            status = Job.status if on_node is not None else Job.status.concat("")
            where = chosen.matches(Job.id) & (status == param("old")) & (Job.attempt == param("was_attempt"))
            if on_node is not None:
                where &= Job.node_id == param("on_node")
            return Job.update(status=param("new"), **{name: param(name) for name in names}).where(
                where).returning(Job.id)

        return {row[0] for row in sql.rows(
            db, ("transition", tuple(names), on_node is not None, chosen.size), update,
            new=new, old=old, was_attempt=attempt, **chosen.values,
            **({"on_node": on_node} if on_node is not None else {}),
            **{name: fields[name].db_value(value) for name, value in changes.items()})}

    def event(self, job: Job, old: str | None, new: str, now: float, reason: str) -> None:
        self.events([{"job": job.id, "at": now, "old": old, "new": new, "attempt": job.attempt,
                      "node_id": job.node_id, "reason": reason}])

    def events(self, rows: list[dict]) -> None:
        """Record events: dicts of job (its row id), at, old, new, attempt, node_id, reason."""
        self.ctx.sql.insert_rows(self.ctx.db, "events", JobEvent, [
            {"job": row["job"], "at": row["at"], "from_status": row["old"], "to_status": row["new"],
             "attempt": row["attempt"], "node_id": row["node_id"], "reason": row["reason"]} for row in rows])
