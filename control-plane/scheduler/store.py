"""Everything the scheduler reads and writes, each write in one short transaction.

Functions take `now` (seconds since the epoch) instead of reading the clock, so
tests drive them with fixed times. Every status change goes through
`_apply_all`, which checks it against shared.states and records an event.

Concurrency: on SQLite every `db.atomic()` is BEGIN IMMEDIATE, so transactions
that place jobs are serialised by the database lock. On PostgreSQL placement is
serialised by transaction-level advisory locks (`db.lock_placement()`: over every
node, or per node for a placement that fills only some nodes' slots), which
service.Scheduler takes before its transaction locks any row; claims skip the
rows another claim holds, and placements the jobs another placement is placing
(FOR UPDATE SKIP LOCKED).

When SNS_TOPIC_ARN is set, `_apply_all` also writes a notification row to the
outbox (sns_outbox) for every final status, in the same transaction: the
notification exists exactly when the status change does (sns_outbox.py
publishes it).
"""
import contextlib
import copy
import functools
import json
import logging
import os
from collections.abc import Callable, Collection

import peewee
from peewee import fn

from corral.server.db import lock_placement, locked_nodes, one_writer, wakes_on_every_commit
from corral.shared.errors import BadRequest, BatchError, Conflict, CorralError, NotFound
from corral.server.leader import Fence
from corral.shared.states import ACTIVE, FINAL_STATUSES, check_transition
from corral.server.statements import Child, Statements, ValueList, param
from corral.shared.timeutil import epoch
from corral.shared import tracing

from . import admission, dependencies, lifecycle, metrics, notifications, placement, spans, waiting
from .event_log import EventLog
from .events import node_changes
from .models import (ConcurrencyLimit, Counter, Job, JobArray, JobDependency, JobEvent, LogChunk, Node, NodeLease,
                     OutboxEvent, SchedulerState)
from .settings import SchedulerSettings
from .validation import check_timeout, parse_job_id, request_hash

log = logging.getLogger(__name__)

RR_CURSOR = "rr_cursor"
# Changes (to a new random value) in every transaction that places jobs, where every
# commit wakes the watchers of waiting claims (SQLite): they need a look at the
# database only after a placement. On PostgreSQL only placements notify them, and a
# row every placement writes would make placements on different nodes queue on it.
PLACEMENT_MARK = "placement_mark"
# Counts the drains and undrains through the scheduler (set_drained); a node list
# fetched before the count moved keeps those nodes' drains (sync_nodes).
DRAINS_COUNTER = "node_drains"
# The design's default limits per job type, for a claim whose agent sent no defaults of its own.
DESIGN_LIMITS = {"run": {"memory_mb": 512, "cpu_percent": 100},
                 "service": {"memory_mb": 1024, "cpu_percent": 200}}
FALLBACK_LIMITS = {job_type: (limits["memory_mb"], limits["cpu_percent"])
                   for job_type, limits in DESIGN_LIMITS.items()}
# Rows per INSERT of a batch (well under every database's limit of bound parameters).
INSERT_CHUNK = 500
# What a claim reads of the jobs it takes: what their answer shows (views.job) and
# their transition reads; not the bookkeeping of how they queued.
CLAIMED = tuple(field for field in Job._meta.sorted_fields if field.name not in (
    "idempotency_key", "request_hash", "queue_at", "dependencies_left", "has_dependents", "pending_reason",
    "pending_code"))
# What placement reads of a queued job (_ask), then its stored reason and its place in the queue.
QUEUED = (Job.id, Job.attempt, Job.job_type, Job.instance_id, Job.memory_mb, Job.cpu_percent, Job.constraints,
          Job.pool, Job.array_id, Job.concurrency_key, Job.pending_reason, Job.queue_at)
# A placement pass reads the queue in pages of this many jobs after the first (as many
# as there are free slots) while it has room. The background pass looks at most
# PLACEMENT_SCAN_MAX jobs down the queue; a placement on the way of a submit, a report
# or a claim one page past the first read: when the jobs ahead fit nowhere (nodes full
# by their reservations, constraints no free node meets) it does not read thousands of
# rows on every request, and what is deeper is placed by the next background pass.
QUEUE_PAGE = 500
PLACEMENT_SCAN_MAX = 10_000
# The background pass gives this many jobs at the head of the queue their reasons.
EXPLAIN_MAX = 1000
# What a lifecycle decision reads of a job (lifecycle.py), with its metrics
# (metrics.moved) and its notification (notifications.py): not the output or the request.
DECIDING = (Job.id, Job.status, Job.attempt, Job.node_id, Job.job_type, Job.running_at, Job.retry_count,
            Job.max_retries, Job.on_node_lost, Job.node_losses, Job.name, Job.exit_code, Job.finished_at,
            Job.created_at, Job.has_dependents, Job.schedule, Job.slot, Job.timeout_secs)


class Store:
    def __init__(self, db: peewee.Database, settings: SchedulerSettings,
                 on_placed: Callable[[set[str]], None] | None = None):
        """`on_placed(node_ids)` is called after each commit that placed jobs (the
        waiting room: the claims of those nodes wake at once)."""
        self.db = db
        self.settings = settings
        # The statements of a job's trip (place, claim, report), compiled once: see control-plane/server/statements.py.
        self._sql = Statements()
        self.policy = lifecycle.Policy(settings.max_node_losses, settings.job_timeout_secs,
                                       settings.output_tail_bytes, settings.backoff)
        self.on_placed = on_placed
        self.marks_placements = wakes_on_every_commit(db)  # PLACEMENT_MARK
        # The lease the background loops write under (fenced()); None for the API's writes.
        self.fence: Fence | None = None
        # MAX_PENDING_JOBS: one per process, shared by its fenced copies (admission.py).
        self.admission = admission.PendingGate(settings.max_pending_jobs, self.count_pending, self._count_apart)

    def fenced(self, fence: Fence) -> "Store":
        """This store for a background loop: each of its write transactions first checks
        that the loop still holds its lease (control-plane/server/leader.py Fence)."""
        loop_store = copy.copy(self)
        loop_store.fence = fence
        return loop_store

    def check_fence(self) -> None:
        """Inside a write transaction: refuse it (LeaseLost) when a loop lost its lease."""
        if self.fence is not None:
            self.fence.check(self.db)

    # ---- views -------------------------------------------------------------

    def _tx(self):
        """A transaction, unless the caller (service.Scheduler) already runs one: then
        no savepoint either (its statements cost time on every submit and report)."""
        return contextlib.nullcontext() if self.db.in_transaction() else self.db.atomic()

    # ---- reads -------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        number = parse_job_id(job_id)
        found = self._sql.select(Job, "job by id", lambda: Job.select().where(Job.id == param("id")),
                                 id=number) if number else None
        job = found[0] if found else None
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        return job

    def events(self, job_id: str) -> list[JobEvent]:
        job = self.get(job_id)
        return list(JobEvent.select().where(JobEvent.job == job.id).order_by(JobEvent.id))

    def list_jobs(self, *, node_id=None, status=None, job_type=None, after: int | None = None,
                  limit: int = 100, newest_first: bool = False) -> list[Job]:
        return list(self.iter_jobs(node_id=node_id, status=status, job_type=job_type, after=after,
                                   limit=limit, newest_first=newest_first))

    def iter_jobs(self, *, node_id=None, status=None, job_type=None, after: int | None = None,
                  limit: int = 100, newest_first: bool = False, pending_reason: str | None = None,
                  now: float | None = None, name: str | None = None, schedule: str | None = None,
                  array_id: int | None = None, created_after: float | None = None,
                  created_before: float | None = None):
        """The jobs of a list, read one row at a time (a page of large jobs is never all in
        memory at once; pages.cut decides where it ends). `pending_reason`: only pending
        jobs that wait for that reason at `now` (waiting.current). `created_after` and
        `created_before` bound created_at (after: at or after; before: strictly before)."""
        query = Job.select()
        for column, value in ((Job.name, name), (Job.schedule, schedule), (Job.array_id, array_id)):
            if value is not None:
                query = query.where(column == value)
        if created_after is not None:
            query = query.where(Job.created_at >= created_after)
        if created_before is not None:
            query = query.where(Job.created_at < created_before)
        if pending_reason is not None:
            query = query.where(_waiting_for(pending_reason, now if now is not None else 0.0))
        if node_id is not None:
            query = query.where(Job.node_id == node_id)
        if status is not None:
            query = query.where(Job.status == status)
        if job_type is not None:
            query = query.where(Job.job_type == job_type)
        if after is not None:
            query = query.where(Job.id < after if newest_first else Job.id > after)
        return query.order_by(Job.id.desc() if newest_first else Job.id).limit(limit).iterator()

    def why(self, job_id: str) -> tuple[Job, list[dict]]:
        """A pending job and the nodes that came closest to taking it, each with what it
        lacks (placement.shortfalls); Conflict for a job that does not wait."""
        job = self.get(job_id)
        if job.status != "pending":
            raise Conflict(f"{job.job_id} is {job.status}: it does not wait")
        if job.node_id is not None:
            return job, []
        ask = _ask(tuple(getattr(job, f.name) for f in QUEUED))
        return job, placement.shortfalls(ask, self._placement_nodes(), FALLBACK_LIMITS)

    def pending_for_agent(self, node_id: str, limit: int) -> list[Job]:
        """The pending jobs placed on `node_id`, at most its free slots (what agents poll)."""
        node = Node.get_or_none(Node.node_id == node_id)
        capacity = self._capacity(node.slots if node else None)
        running = Job.select().where((Job.node_id == node_id) & (Job.status == "running")).count()
        free = min(limit, capacity - running)
        if free <= 0:
            return []
        return self.list_jobs(node_id=node_id, status="pending", limit=free)

    def placement_mark(self) -> str | None:
        """A value that changes whenever jobs are placed (None before the first placement),
        where placements are marked (`marks_placements`)."""
        rows = self._sql.rows(self.db, "placement mark", lambda: SchedulerState.select(SchedulerState.value).where(
            SchedulerState.key == PLACEMENT_MARK))
        return rows[0][0] if rows else None

    def event_mark(self) -> int | None:
        """The newest job event's id (None: none yet). Every placement writes an event,
        so an unchanged mark means no placement committed since, save one whose event
        id was drawn earlier and committed later (ids are drawn before the commit)."""
        return self._sql.rows(self.db, "event mark", lambda: JobEvent.select(fn.MAX(JobEvent.id)))[0][0]

    def nodes_with_work(self, node_ids: set[str]) -> set[str]:
        """Which of these nodes have something to claim: pending jobs placed on them and
        a free slot (for the waiting claims of a process: one grouped count, and the
        node rows of those that have pending jobs)."""
        if not node_ids:
            return set()
        pending: dict[str, int] = {}
        running: dict[str, int] = {}
        for node_id, status, count in (Job.select(Job.node_id, Job.status, fn.COUNT(Job.id))
                                       .where(Job.node_id.in_(sorted(node_ids))
                                              & Job.status.in_(["pending", "running"]))
                                       .group_by(Job.node_id, Job.status).tuples()):
            (pending if status == "pending" else running)[node_id] = count
        if not pending:
            return set()
        capacity = {node_id: self._capacity(slots) for node_id, slots in Node.select(Node.node_id, Node.slots).where(
            Node.node_id.in_(sorted(pending))).tuples()}
        return {node_id for node_id in pending
                if running.get(node_id, 0) < capacity.get(node_id, self._capacity(None))}

    # ---- writes ------------------------------------------------------------

    def submit(self, fields: dict, now: float, idempotency_key: str | None = None) -> tuple[Job, bool]:
        """Create a pending, unplaced job (service.Scheduler.submit places it).

        With an idempotency key, a repeat of the same request returns the job it
        created first (and False); the same key with another request is a Conflict.
        """
        digest = request_hash(fields) if idempotency_key else None
        columns = self._new_job(fields, now)
        # No transaction of its own: the insert (with its event) is the one write, and
        # the reads before it decide nothing that a write between them could change.
        existing = self._by_key(idempotency_key, digest)
        if existing is not None:
            return existing, False
        self._check_limits(fields)
        self.admission.admit(1)
        depends_on = [(other, condition) for _, other, condition in fields.get("depends_on") or ()]
        with self._tx() if depends_on else contextlib.nullcontext():
            # The jobs it waits for, read in the transaction that records the wait: one that
            # ends meanwhile decides its condition then (_settle_dependents), or here.
            known = self._dependency_targets(depends_on)
            on_failure = columns.get("on_dependency_failure") or "cancel"
            extra, cancel = self._dependency_columns(depends_on, known, on_failure)
            # A twin request with the same key may commit between the look above and
            # this insert (several writers at once: PostgreSQL): the insert then adds
            # nothing (ON CONFLICT DO NOTHING, no failed statement to roll back) and
            # this request answers with the twin's job, as if it had come second.
            inserted = self._insert_jobs([dict(columns, idempotency_key=idempotency_key, request_hash=digest,
                                               **extra)], now, skip_duplicate_key=bool(idempotency_key))
            if not inserted:
                return self._by_key(idempotency_key, digest), False
            if depends_on:
                self._link(inserted[0], depends_on, known, now, cancel)
        return inserted[0], True

    def submit_array(self, fields: dict, now: float, idempotency_key: str | None = None
                     ) -> tuple[JobArray, int, int, bool]:
        """Create `fields["array"]["count"]` jobs in one transaction, sharing a new array,
        each with CORRAL_ARRAY_INDEX and CORRAL_ARRAY_COUNT in its environment. Returns the
        array, its first and last job row ids, and whether it was created: with an
        idempotency key, job i is stored under `KEY:i`, and a repeat answers the array
        the first request created."""
        count, parallel = fields["array"]["count"], fields["array"]["parallel"]
        digest = request_hash(fields) if idempotency_key else None
        keys = [f"{idempotency_key}:{i}" if idempotency_key else None for i in range(count)]
        depends_on = [(other, condition) for _, other, condition in fields.get("depends_on") or ()]
        with self.db.atomic():
            first = self._by_key(keys[0], digest)
            if first is not None:
                array = JobArray.get_by_id(first.array_id)
                return array, *self._array_ends(array.id), False
            self._check_limits(fields)
            self.admission.admit(count)  # an array counts whole
            known = self._dependency_targets(depends_on)
            extra, cancel = self._dependency_columns(depends_on, known, fields.get("on_dependency_failure") or "cancel")
            array = JobArray.create(count=count, parallel=parallel, created_at=now)
            env = fields.get("env_vars") or {}
            rows = [dict(self._new_job(dict(fields, env_vars={**env, "CORRAL_ARRAY_INDEX": str(i),
                                                                "CORRAL_ARRAY_COUNT": str(count)}), now),
                         array_id=array.id, array_index=i, idempotency_key=keys[i], request_hash=digest, **extra)
                    for i in range(count)]
            created: list[Job] = []
            for start in range(0, count, INSERT_CHUNK):
                created += self._insert_jobs(rows[start:start + INSERT_CHUNK], now)
            for job in created if depends_on else ():
                self._link(job, depends_on, known, now, cancel)
            metrics.submitted(self.db, "array", count)
        return array, created[0].id, created[-1].id, True

    @staticmethod
    def _array_ends(array_id: int) -> tuple[int, int]:
        return Job.select(fn.MIN(Job.id), fn.MAX(Job.id)).where(Job.array_id == array_id).tuples().get()

    def array(self, array_id: str) -> tuple[JobArray, int, int, dict[str, int]]:
        """An array, its first and last job row ids, and its jobs by status."""
        number = _array_number(array_id)
        array = JobArray.get_or_none(JobArray.id == number) if number else None
        if array is None:
            raise NotFound(f"no array {array_id!r}")
        counts = dict(Job.select(Job.status, fn.COUNT(Job.id)).where(Job.array_id == array.id)
                      .group_by(Job.status).tuples())
        return array, *self._array_ends(array.id), counts

    def cancel_array(self, array_id: str, now: float) -> list[str]:
        """Cancel every job of the array that has not finished, in one transaction (their
        dependents are decided as for any cancel); returns the nodes whose slots freed."""
        array = self.array(array_id)[0]
        with self._tx():
            jobs = list(Job.select(*DECIDING).where((Job.array_id == array.id) & Job.status.in_(ACTIVE)))
            decided = [(job, transition) for job in jobs if (transition := lifecycle.cancelled(job, now)) is not None]
            held = {job.node_id for job, _ in decided if job.node_id is not None}
            self._apply_all(decided, now)
        return sorted(held)

    # ---- concurrency limits --------------------------------------------------

    @staticmethod
    def concurrency_limits(key: str | None = None) -> list[tuple[str, int, int]]:
        """(key, limit, jobs with the key placed or running), of every limit set (or of `key`'s)."""
        query = ConcurrencyLimit.select()
        if key is not None:
            query = query.where(ConcurrencyLimit.key == key)
        limits = {row.key: row.limit for row in query.order_by(ConcurrencyLimit.key)}
        if not limits:
            return []
        holding = _placed_or_running()
        active = dict(Job.select(Job.concurrency_key, fn.COUNT(Job.id)).where(
            Job.concurrency_key.in_(sorted(limits)) & holding).group_by(Job.concurrency_key).tuples())
        return [(k, limit, active.get(k, 0)) for k, limit in limits.items()]

    def set_concurrency_limit(self, key: str, limit: int) -> None:
        with self._tx():
            ConcurrencyLimit.insert(key=key, limit=limit).on_conflict(
                conflict_target=[ConcurrencyLimit.key], preserve=[ConcurrencyLimit.limit]).execute()

    def remove_concurrency_limit(self, key: str) -> None:
        with self._tx():
            if ConcurrencyLimit.delete().where(ConcurrencyLimit.key == key).execute() == 0:
                raise NotFound(f"no concurrency limit is set for {key!r}")

    def _dependency_targets(self, depends_on: list[tuple[int, str]]) -> dict[int, str]:
        """The status of each job a new job depends on; a BadRequest naming one that
        does not exist."""
        known = self._statuses_of([other for other, _ in depends_on]) if depends_on else {}
        missing = [other for other, _ in depends_on if other not in known]
        if missing:
            raise BadRequest(f"'depends_on' names job-{missing[0]}, which does not exist")
        return known

    @staticmethod
    def _statuses_of(ids: list[int]) -> dict[int, str]:
        found: dict[int, str] = {}
        wanted = sorted(set(ids))
        for start in range(0, len(wanted), INSERT_CHUNK):
            found.update(Job.select(Job.id, Job.status).where(Job.id.in_(wanted[start:start + INSERT_CHUNK])).tuples())
        return found

    def _new_job(self, fields: dict, now: float) -> dict:
        """A validated request's columns as a new job's: its retry budget, and when it
        may start and where it queues (a delay counted from `now`; placement.queue_at)."""
        columns = dict(fields, created_at=now)
        columns.pop("depends_on", None)  # not a column: the job_dependency rows (_link)
        columns.pop("array", None)       # not a column: the job_array row (submit_array)
        delay = columns.pop("delay_secs", None)
        if columns.get("max_retries") is None:
            columns["max_retries"] = self.settings.max_job_retries
        if delay is not None:
            columns["run_at"] = now + delay
        eligible = now
        if columns.get("run_at") is not None:
            columns["next_attempt_at"] = columns["run_at"]
            eligible = max(now, columns["run_at"])
        priority = columns.get("priority")
        columns["queue_at"] = placement.queue_at(
            eligible, placement.DEFAULT_PRIORITY if priority is None else priority, self.settings.priority_aging_secs)
        return columns

    def _insert_jobs(self, rows: list[dict], now: float, skip_duplicate_key: bool = False) -> list[Job]:
        """Insert jobs (dicts of Job fields; defaults fill the rest) in the order given,
        each with its "submitted" event at `now` (together: Statements.insert_rows);
        returns them as Job instances with their new ids, without reading them back.
        `skip_duplicate_key` (one row): a row whose idempotency key exists is not
        inserted, and [] is returned."""
        if skip_duplicate_key:
            assert len(rows) == 1, "only a single row can tell which one was skipped"
        # Built from the defaults and the row directly, and only the values that are
        # set converted and sent (insert_rows makes the others NULL): Job(**row) set
        # every field through its descriptor, which with the conversions of every
        # column was most of a 500-job batch's Python time.
        fields = Job._meta.fields
        jobs, values = [], []
        for row in rows:
            job = Job(__no_default__=1)
            job.__data__ = data = Job._meta.get_default_dict()
            data.update(row)
            jobs.append(job)
            values.append({name: fields[name].db_value(value) for name, value in data.items() if value is not None})
        submitted = Child(JobEvent, "job", {"at": now, "from_status": None, "to_status": "pending",
                                            "attempt": Job.attempt.default, "node_id": None, "reason": "submitted"})
        inserted = self._sql.insert_rows(self.db, ("jobs", skip_duplicate_key), Job, values,
                                         returning=Job.id, skip_duplicates=skip_duplicate_key, child=submitted)
        if skip_duplicate_key and not inserted:
            return []
        # Ids are assigned in the order of the rows; sorting undoes any order RETURNING used.
        ids = sorted(row[0] for row in inserted)
        for job, job_id in zip(jobs, ids):
            job.id = job_id
        return jobs

    @staticmethod
    def _by_key(key: str | None, digest: str | None) -> Job | None:
        if key is None:
            return None
        existing = Job.get_or_none(Job.idempotency_key == key)
        if existing is not None and existing.request_hash != digest:
            raise Conflict(_key_reused(key, existing))
        return existing

    def submit_batch(self, items: list[dict], now: float, idempotency_key: str | None = None
                     ) -> tuple[list[Job], bool]:
        """Create many pending, unplaced jobs (validated requests) in ONE transaction.

        All or nothing: an item whose limits no node allows raises BatchError and
        nothing is stored. With an idempotency key, item i gets the key `KEY:i`, so
        sending the same batch again returns the same jobs (and False) instead of
        creating them twice. Returns the jobs in request order.
        """
        try:
            return self._submit_batch(items, now, idempotency_key)
        except peewee.IntegrityError:
            # The same batch committed first on another connection (databases without a
            # single write lock): answer as if this one came second.
            if idempotency_key is None:
                raise
            return self._submit_batch(items, now, idempotency_key)

    def _submit_batch(self, items: list[dict], now: float, idempotency_key: str | None
                      ) -> tuple[list[Job], bool]:
        keys = [f"{idempotency_key}:{i}" if idempotency_key else None for i in range(len(items))]
        digests = [request_hash(fields) if idempotency_key else None for fields in items]
        with self.db.atomic():
            known = self._limit_nodes()
            errors = []
            for index, fields in enumerate(items):
                try:
                    self._check_limits(fields, known)
                except BadRequest as exc:
                    errors.append({"index": index, "error": exc.message})
            if errors:
                raise BatchError(errors)
            existing: dict[int, Job] = {}
            if idempotency_key:
                # The jobs an earlier copy of this batch created: one query per chunk of keys,
                # of their ids only (the caller reads them whole after the commit). Inside the
                # placement lock every answer stays small: a replica stopped while the server
                # sends it a large one would hold the lock, its session blocked in the send,
                # past every timeout.
                found: dict[str, Job] = {}
                for start in range(0, len(keys), INSERT_CHUNK):
                    found.update({job.idempotency_key: job for job in Job.select(
                        Job.id, Job.idempotency_key, Job.request_hash).where(
                        Job.idempotency_key.in_(keys[start:start + INSERT_CHUNK]))})
                for index, (key, digest) in enumerate(zip(keys, digests)):
                    job = found.get(key)
                    if job is not None and job.request_hash != digest:
                        raise Conflict(f"item {index}: {_key_reused(key, job)}")
                    if job is not None:
                        existing[index] = job
            new = [i for i in range(len(items)) if i not in existing]
            self.admission.admit(len(new))  # the items an earlier copy created are not new
            linked = any(items[i].get("depends_on") for i in new)
            waits = self._batch_dependencies(items, new, existing) if linked else {}
            rows = [dict(self._new_job(items[i], now), idempotency_key=keys[i], request_hash=digests[i],
                         **(waits[i][1] if linked else {})) for i in new]
            created = self._insert_jobs(rows, now)
            ids = [job.id for job in created]
            by_index = dict(zip(new, created))
            by_index.update(existing)
            # Their conditions, then the cancellations (down the chain), once every row exists.
            cancels = []
            for i in new if linked else ():
                depends_on, _, known, cancel = waits[i]
                resolved = [(by_index[other[1]].id if isinstance(other, tuple) else other, condition)
                            for other, condition in depends_on]
                statuses = {(by_index[k[1]].id if isinstance(k, tuple) else k): v for k, v in known.items()}
                self._link(by_index[i], resolved, statuses, now, None)
                if cancel is not None:
                    cancels.append((by_index[i], cancel))
            for job, cancel in cancels:
                if job.status == "pending":
                    self._apply(job, lifecycle.dependency_failed(job, now, cancel), now)
            metrics.submitted(self.db, "batch", len(ids))
        return [by_index[i] for i in range(len(items))], bool(ids)

    def _batch_dependencies(self, items: list[dict], new: list[int], existing: dict[int, Job]) -> dict:
        """For each new item of a batch: its conditions (an earlier item as ("index", i)),
        its columns for them, the statuses they were decided on, and the reason it is
        cancelled at once (None: it is not). A job named that does not exist: BatchError."""
        named = [other for i in new for kind, other, _ in items[i].get("depends_on") or () if kind == "job"]
        known_jobs = self._statuses_of(named) if named else {}
        errors, waits = [], {}
        for i in new:
            depends_on, known = [], {}
            for kind, other, condition in items[i].get("depends_on") or ():
                if kind == "index":
                    # An earlier item: new, so pending (or created by an earlier copy of this batch).
                    earlier = existing.get(other)
                    key = ("index", other)
                    known[key] = earlier.status if earlier is not None and earlier.status else "pending"
                    depends_on.append((key, condition))
                elif other not in known_jobs:
                    errors.append({"index": i, "error": f"'depends_on' names job-{other}, which does not exist"})
                    break
                else:
                    known[other] = known_jobs[other]
                    depends_on.append((other, condition))
            extra, cancel = self._dependency_columns(depends_on, known, items[i].get("on_dependency_failure")
                                                     or "cancel")
            waits[i] = (depends_on, extra, known, cancel)
        if errors:
            raise BatchError(errors)
        return waits

    @staticmethod
    def reload(jobs: list[Job]) -> list[Job]:
        """The jobs as the database has them now (after placement changed them), in order."""
        wanted = [job.id for job in jobs]
        by_id = {}
        for start in range(0, len(wanted), INSERT_CHUNK):
            chunk = wanted[start:start + INSERT_CHUNK]
            by_id.update({job.id: job for job in Job.select().where(Job.id.in_(chunk))})
        return [by_id[job_id] for job_id in wanted]

    def with_placements(self, jobs: list[Job]) -> list[Job]:
        """New jobs, those placed since they were read (placement is the only change
        they undergo as a rule) read again: the rest as they are. One statement, which
        returns only the placed rows (a batch of 500 usually has a few)."""
        chosen = ValueList(self.db, "ids", [job.id for job in jobs])
        placed = {job.id: job for job in self._sql.select(
            Job, ("placed of", chosen.size), lambda: Job.select().where(chosen.matches(Job.id)
                                                                         & Job.node_id.is_null(False)),
            **chosen.values)}
        return [placed.get(job.id, job) for job in jobs]

    def report(self, job_id: str, report: dict, now: float) -> Job:
        """Apply an agent's report; refuses other nodes, stale attempts and illegal moves.
        Returns the job as the report left it (a job no longer `running` freed its slot:
        the caller places)."""
        with self._tx():
            job = self.get(job_id)
            transition = self._decide_report(job, report, now)
            if transition is not None:
                self._apply(job, transition, now)
        return job  # as _apply left it: the row as committed

    def _decide_report(self, job: Job, report: dict, now: float) -> lifecycle.Transition | None:
        """What a report does to its job (None: nothing, a repeat); raises Conflict for a
        report of another node, a stale attempt or an illegal move."""
        if self._late_success(job, report):
            return lifecycle.late_success(job, report, now, self.policy)
        _check_attempt(job, report)
        new = report["status"]
        if job.status == new and new == "running":
            return None  # the agent repeated a report whose answer it lost
        if new == "running":
            return lifecycle.started(job, now, report["limits_enforced"], report["limits"],
                                     report.get("private_tmp"), "started on the node")
        if job.status != "running":
            raise Conflict(f"{job.job_id} is {job.status}, not running; the {new!r} report is refused")
        return lifecycle.finished(job, report, now, self.policy)

    def apply_reports(self, items: list[tuple[str, dict | CorralError]], now: float) -> list[dict]:
        """Apply many reports, each on its own: a refused one changes nothing and does
        not stop the others. `items` are (job_id, validated report or the error that
        made it invalid). One transaction: the reported jobs are read in one query (the
        columns a decision reads), decided one by one, and written together (_apply_all).
        Returns one result per item: {"index", "job_id", "code", and "job_status" and
        "attempt" (200) or "error" (anything else)}."""
        results: list[dict | None] = [None] * len(items)
        with self._tx():
            jobs = self._deciding({parse_job_id(job_id) for job_id, body in items
                                   if not isinstance(body, CorralError)} - {None})
            decided: list[tuple[int, Job, lifecycle.Transition | None]] = []
            for index, (job_id, body) in enumerate(items):
                try:
                    if isinstance(body, CorralError):
                        raise body
                    job = jobs.get(parse_job_id(job_id))
                    if job is None:
                        raise NotFound(f"no job {job_id!r}")
                    if any(seen is job for _, seen, _ in decided):
                        # The same job again: decided on what the reports before it did.
                        self._write_reports(decided, now, results)
                        decided = []
                    decided.append((index, job, self._decide_report(job, body, now)))
                except CorralError as exc:
                    results[index] = {"index": index, "job_id": job_id, "code": exc.status, "error": exc.message}
            self._write_reports(decided, now, results)
        return [r for r in results if r is not None]

    def _write_reports(self, decided: list, now: float, results: list) -> None:
        stale = self._apply_all([(job, t) for _, job, t in decided if t is not None], now)
        for index, job, _ in decided:
            if job in stale:
                results[index] = {"index": index, "job_id": job.job_id, "code": 409,
                                  "error": _changed_meanwhile(job).message}
            else:
                results[index] = {"index": index, "job_id": job.job_id, "code": 200, "job_status": job.status,
                                  "attempt": job.attempt}

    def _deciding(self, ids: set[int]) -> dict[int, Job]:
        """The jobs with these row ids, with the columns lifecycle decisions, their
        metrics and notifications read (not the output or the request)."""
        found: dict[int, Job] = {}
        wanted = sorted(ids)
        for start in range(0, len(wanted), INSERT_CHUNK):
            chunk = ValueList(self.db, "ids", wanted[start:start + INSERT_CHUNK])
            found.update({job.id: job for job in self._sql.select(
                Job, ("deciding", chunk.size), lambda: Job.select(*DECIDING).where(chunk.matches(Job.id)),
                **chunk.values)})
        return found

    def store_output(self, items: list[tuple[str, dict | CorralError]]) -> list[dict]:
        """Live output (POST /jobs/output): the tails agents send while attempts run,
        each item on its own, in one transaction. Fenced as reports are (the job's
        node, its current attempt) and only while the job is `running`, so a late
        update never overwrites a final report's output. Not a status change: no
        event. Returns one result per item: {"index", "job_id", "code", and "error"
        unless the code is 200}."""
        tail = self.settings.output_tail_bytes
        wanted = sorted({parse_job_id(job_id) for job_id, body in items if not isinstance(body, CorralError)})
        results = []
        with self.db.atomic():
            jobs = {job.id: job for job in Job.select(Job.id, Job.node_id, Job.attempt, Job.status)
                    .where(Job.id.in_(wanted))} if wanted else {}
            for index, (job_id, body) in enumerate(items):
                try:
                    if isinstance(body, CorralError):
                        raise body
                    job = jobs.get(parse_job_id(job_id))
                    if job is None:
                        raise NotFound(f"no job {job_id!r}")
                    _check_attempt(job, body)
                    if job.status != "running":
                        raise Conflict(f"{job.job_id} is {job.status}, not running; its live output is refused")
                    changes = {name: lifecycle.tail(body[name], tail) for name in ("stdout", "stderr")
                               if body[name] is not None}
                    if changes and Job.update(**changes).where(
                            (Job.id == job.id) & (Job.status == "running") & (Job.attempt == job.attempt)
                            & (Job.node_id == job.node_id)).execute() != 1:
                        raise Conflict(f"{job.job_id} changed while this request ran; its live output is refused")
                except CorralError as exc:
                    results.append({"index": index, "job_id": job_id, "code": exc.status, "error": exc.message})
                    continue
                results.append({"index": index, "job_id": job_id, "code": 200})
        return results

    def claim_room(self, node_id: str, request: dict, now: float) -> tuple[int, bool]:
        """How many jobs a claim of `node_id` may take now (its free slots, at most
        request['max']), and whether placement should fill a slot of it first: one is
        free (the node is a healthy compute node with room beyond what is placed) and
        due work waits unplaced (unplaced_due)."""
        def counted(status: str) -> peewee.Select:
            return Job.select(fn.COUNT(Job.id)).where((Job.node_id == param("node_id")) & (Job.status == status))

        # The node, its running and placed jobs (the (node_id, status) index) and whether
        # work waits unplaced, in one read.
        rows = self._sql.rows(self.db, "claiming node", lambda: Node.select(
            Node.slots, Node.status, Node.kind, counted("running"), counted("pending"),
            self._unplaced_due_query()).where(Node.node_id == param("node_id")), node_id=node_id, now=now)
        if rows:
            slots, status, kind, running, placed, waiting = rows[0]
        else:  # not (or no longer) a known node: its jobs alone
            slots = status = kind = waiting = None
            running, placed = self._sql.rows(self.db, "node job counts", lambda: peewee.Select(
                columns=[counted("running"), counted("pending")]).bind(self.db), node_id=node_id)[0]
        capacity = self._capacity(slots)
        free = min(request["max"], capacity - running)
        slot_open = free > 0 and status == "healthy" and kind == "compute" and running + placed < capacity
        return free, slot_open and waiting is not None

    def may_claim(self, node_id: str, now: float) -> bool:
        """Whether a claim could take anything (read without a write transaction)."""
        return self._may_claim(node_id, now)

    def unplaced_due(self, now: float) -> bool:
        return self._unplaced_due(now)

    def take_placed(self, node_id: str, request: dict, free: int, now: float) -> list[Job]:
        """Take up to `free` pending jobs placed on `node_id`: each becomes
        `running` for its current attempt, exactly as a `running` report would make
        it (running_at, an event, limits_enforced, limits, private_tmp). Never more than the
        node's free slots.

        A claim that takes jobs renews the node's lease in the same transaction (the
        agent counts that renewal from when it sent the claim). One that takes
        nothing writes nothing: an idle agent holds no lease, and nothing is written
        for the claims 500 idle agents keep waiting. Were jobs running there all the
        same (a claim whose answer was lost on the way), they are requeued as for a
        lost node once the lease is older than the lease period plus the grace.

        A job goes to exactly one claim: the update is conditional on status,
        node and attempt, and its row count is checked. On SQLite the whole claim
        runs under the write lock; on PostgreSQL the select skips rows another
        claim has locked (FOR UPDATE SKIP LOCKED).
        """
        with self._tx():
            def placed_here():
                query = (Job.select(*CLAIMED).where((Job.status == "pending") & (Job.node_id == param("node_id")))
                         .order_by(Job.status, Job.node_id, Job.queue_at, Job.id).limit(param("limit")))
                return query.for_update(skip_locked=True) if getattr(self.db, "for_update", False) else query

            decided = [(job, lifecycle.started(job, now, bool(request["limits_enforced"]), _claim_limits(job, request),
                                               request.get("private_tmp"), "claimed by the node"))
                       for job in self._sql.select(Job, "placed here", placed_here, node_id=node_id, limit=free)]
            # A job another claim took meanwhile is left out (not on SQLite: skip-locked elsewhere).
            stale = self._apply_all(decided, now, on_node=node_id)
            claimed = [job for job, _ in decided if job not in stale]
            if not claimed:
                return []
            self._touch_lease(node_id, now)
            return claimed  # the rows as just updated (no read back)

    def purge_finished(self, finished_before: float, limit: int, gone_objects: list[str] | None = None) -> int:
        """Delete up to `limit` finished jobs (done, failed, cancelled) that finished
        before `finished_before`, with their events and log chunks; one short
        transaction. The S3 keys of chunks stored there go into `gone_objects`, for the
        caller to delete once this committed (job_logs.py). Where the database would
        hand a deleted newest id out again (SQLite), the newest job row is always kept,
        so that job ids are never reused."""
        with self.db.atomic():
            self.check_fence()
            old = (Job.finished_at.is_null(False) & (Job.finished_at < finished_before)
                   & Job.status.in_(sorted(FINAL_STATUSES)))
            if self.db.reuses_ids:
                newest = Job.select(fn.MAX(Job.id)).scalar()
                if newest is None:
                    return 0
                old &= Job.id < newest
            ids = [job_id for (job_id,) in Job.select(Job.id).where(old)
                   .order_by(Job.finished_at).limit(limit).tuples()]
            if not ids:
                return 0
            JobEvent.delete().where(JobEvent.job.in_(ids)).execute()
            chunks = LogChunk.delete().where(LogChunk.job_id.in_(ids))
            if gone_objects is None:
                chunks.execute()
            else:
                gone_objects.extend(key for (key,) in chunks.returning(LogChunk.object_key).tuples().execute()
                                    if key is not None)
            return Job.delete().where(Job.id.in_(ids)).execute()

    @staticmethod
    def _late_success(job: Job, report: dict) -> bool:
        """A `done` report of an attempt given up for lost (lifecycle.is_late_success);
        the job's history says which attempts started where."""
        if report["status"] != "done" or job.status != "pending":
            return False  # the common refusals answer without reading the history
        started = JobEvent.select(JobEvent.attempt, JobEvent.node_id).where(
            (JobEvent.job == job.id) & (JobEvent.to_status == "running") & (JobEvent.attempt >= report["attempt"]))
        return lifecycle.is_late_success(job, report, [(e.attempt, e.node_id) for e in started])

    def cancel(self, job_id: str, now: float) -> Job:
        """Cancel a pending or running job; the agent ends a running one at its next poll."""
        with self._tx():
            job = self.get(job_id)
            transition = lifecycle.cancelled(job, now)
            if transition is None:
                return job  # cancelled already
            self._apply(job, transition, now)
        return job

    def retry(self, job_id: str, now: float) -> Job:
        """Put a failed job back to pending with a fresh retry budget (an operator's decision)."""
        with self._tx():
            job = self.get(job_id)
            self._apply(job, lifecycle.retried(job, now), now)
        return job

    def fail_timed_out(self, now: float) -> list[str]:
        """Fail `run` jobs running longer than their timeout_secs (else JOB_TIMEOUT_SECS);
        their agents kill them."""
        limit = fn.COALESCE(Job.timeout_secs, self.settings.job_timeout_secs)
        ended = []
        with self.db.atomic():
            self.check_fence()
            overdue = Job.select().where((Job.status == "running") & (Job.job_type == "run")
                                         & (Job.running_at < now - limit))
            for job in overdue:
                self._apply(job, lifecycle.timed_out(job, now), now)
                ended.append(job.job_id)
        return ended

    def sync_nodes(self, nodes: list[dict], now: float, seen_drains: int | None = None) -> None:
        """Replace the cached node list with the registry's, then move work off lost nodes.

        `seen_drains`: the `node_drains` count read before the list was fetched. A node
        drained or undrained through the scheduler since (set_drained) keeps that state:
        the list may predate the registry's write, and must not undo a drain that has
        already answered. None: the list is the newest word on every node."""
        rows = [{
            "node_id": n["node_id"], "address": n.get("address") or "", "kind": n.get("kind") or "compute",
            "slots": int(n.get("slots") or 1), "status": _placement_status(n), "synced_at": now,
            "max_memory_mb": n.get("max_memory_mb"), "max_cpu_percent": n.get("max_cpu_percent"),
            "drained": bool(n.get("drained")), "last_heartbeat": epoch(n.get("last_heartbeat")),
            # A registry of the previous release lists none: the node takes work.
            "refusing_work": n.get("refusing_work") or None,
            # As the columns store them (insert_rows): JSON as text.
            "labels": Node.labels.db_value(n.get("labels") or {}),
            "default_limits": Node.default_limits.db_value(n.get("default_limits")),
            "reserve_memory_mb": n.get("reserved_memory_mb") or 0,
            "reserve_cpu_percent": n.get("reserved_cpu_percent") or 0,
        } for n in nodes]
        with self.db.atomic():
            self.check_fence()
            current = {node_id: (status, drained, seq) for node_id, status, drained, seq in self._sql.rows(
                self.db, "node states", lambda: Node.select(Node.node_id, Node.status, Node.drained, Node.drain_seq))}
            before = {node_id: (status, drained) for node_id, (status, drained, _) in current.items()}
            for row in rows:
                _, drained, seq = current.get(row["node_id"], (None, False, None))
                row["drain_seq"] = seq
                if seen_drains is not None and seq is not None and seq > seen_drains:
                    row["drained"], row["status"] = drained, _drain_status(row["status"], drained)
            after = {row["node_id"]: (row["status"], row["drained"]) for row in rows}
            Node.delete().execute()
            # Every NODE_REFRESH_SECS: compiled once per number of nodes.
            self._sql.insert_rows(self.db, "node rows", Node, rows)
            # What changed since the last list, for the event stream (events.node_changes).
            EventLog(self.db).record({"at": now, "type": "node", "job_id": None, "node_id": node_id,
                                      "data": {"change": change, **data}}
                                     for node_id, change, data in node_changes(before, after))
            self.release_lost(now)

    def drain_count(self) -> int:
        """How many drains and undrains went through the scheduler (sync_nodes' `seen_drains`)."""
        return self.counters().get(DRAINS_COUNTER, 0)

    def set_drained(self, node_id: str, drained: bool, now: float) -> bool:
        """The operator's drain (or undrain) of a node, in force from this commit on:
        it waits for the placements on the node under way (the node's placement lock),
        so every placement after it reads the node drained, on every worker and replica;
        the jobs placed there but not yet claimed go back to the queue. False when the
        node list has no such node yet (its next refresh brings the registry's flag)."""
        with self._tx():
            lock_placement(self.db, nodes=[node_id])
            node = Node.get_or_none(Node.node_id == node_id)
            if node is None:
                return False
            self.bump(**{DRAINS_COUNTER: 1})
            status = _drain_status(node.status, drained)
            Node.update(drained=drained, status=status, drain_seq=self.drain_count()).where(
                Node.node_id == node_id).execute()
            EventLog(self.db).record({"at": now, "type": "node", "job_id": None, "node_id": node_id,
                                      "data": {"change": change, **data}} for _, change, data in node_changes(
                                          {node_id: (node.status, node.drained)}, {node_id: (status, drained)}))
            if drained:
                self.release_lost(now)
        return True

    def release_lost(self, now: float) -> int:
        """Unplace pending jobs whose node is unhealthy, drained, refusing work or gone, so
        they go elsewhere.

        Each write is conditional on the job being as it was read: still pending on that
        node at that attempt. On PostgreSQL a claim in another process can take the job
        between the read and the write, and an unconditional write then left a running
        job with no node, which nothing would ever finish or requeue."""
        stranded = self._stranded()
        if not stranded:
            return 0
        states = {node_id: f"is {status}" if refusing is None or status != "healthy"
                  else f"takes no new work: {refusing}"
                  for node_id, status, refusing in Node.select(Node.node_id, Node.status, Node.refusing_work).tuples()}
        released = 0
        for job in stranded:
            unplaced = Job.update(node_id=None, placed_at=None).where(
                (Job.id == job.id) & (Job.status == "pending") & (Job.node_id == job.node_id)
                & (Job.attempt == job.attempt)).execute()
            if unplaced:
                why = states.get(job.node_id, "is gone from the registry")
                self._event(job, "pending", "pending", now, f"node {job.node_id} {why}; unplaced")
                released += 1
        return released

    def _stranded(self) -> list[Job]:
        """Pending jobs placed on a node that is not a healthy compute node taking work (any more)."""
        healthy = Node.select(Node.node_id).where((Node.status == "healthy") & (Node.kind == "compute")
                                                  & Node.refusing_work.is_null())
        return list(Job.select().where((Job.status == "pending") & Job.node_id.is_null(False)
                                       & Job.node_id.not_in(healthy)))

    def renew_lease(self, node_id: str, now: float, usage: tuple[int, int] | None = None) -> list[Job]:
        """Record that `node_id`'s agent is alive, and what its jobs use (memory MB, CPU
        percent) when it says; returns the jobs the scheduler has running there.

        The agent compares that list with what it runs: an attempt it runs that is
        not listed is stale (moved, cancelled, timed out) and gets killed.
        """
        with self.db.atomic():
            self._touch_lease(node_id, now)
            if usage is not None:
                self._sql.execute(self.db, "lease usage", lambda: NodeLease.update(
                    used_memory_mb=param("memory"), used_cpu_percent=param("cpu")).where(
                    NodeLease.node_id == param("node_id")), memory=usage[0], cpu=usage[1], node_id=node_id)
        return self._sql.select(Job, "running on node", lambda: Job.select(Job.id, Job.attempt).where(
            (Job.node_id == param("node_id")) & (Job.status == "running")), node_id=node_id)

    def requeue_lost(self, now: float, watching_since: float) -> list[str]:
        """Requeue (or fail, per `on_node_lost`) running jobs of nodes whose lease lapsed.

        A node is lost when its agent has not renewed for HEARTBEAT_TIMEOUT_SECS
        plus NODE_LOST_GRACE_SECS, counted from `watching_since` at the earliest
        (when this process started watching) so that a scheduler restart gives
        every node a full period to renew first. The agent stops its run jobs
        itself after HEARTBEAT_TIMEOUT_SECS without a renewal, so the grace is
        what guarantees two copies never run at once.
        """
        deadline = now - self.settings.heartbeat_timeout_secs - self.settings.node_lost_grace_secs
        if watching_since > deadline:
            return []
        fresh = NodeLease.select(NodeLease.node_id).where(NodeLease.renewed_at >= deadline)
        lost = list(Job.select().where((Job.status == "running") & Job.node_id.not_in(fresh)
                                       & (Job.running_at < deadline)))
        ended = []
        with self.db.atomic():
            self.check_fence()
            for job in lost:
                renewed = NodeLease.get_or_none(NodeLease.node_id == job.node_id)
                silent = f"{now - renewed.renewed_at:.0f}s" if renewed else "ever"
                self._apply(job, lifecycle.node_lost(
                    job, now, f"node {job.node_id} lost (no lease renewal for {silent})", self.policy), now)
                ended.append(job.job_id)
        return ended

    def dispatch(self, now: float, nodes: Collection[str] | None = None, deep: bool = False,
                 first_only: bool = False) -> int:
        """Place waiting jobs on nodes with room (placement.Planner over the snapshot,
        the jobs offered in queue order, page by page, until no slot is left; each
        assignment a conditional update); the number placed. `nodes`: only these may
        take work (the nodes whose slots just freed: new work was offered to every
        node when it came), else every node the transaction locked for placement
        (service.Scheduler: on PostgreSQL, new work locks the nodes that had a free
        slot), and the round robin turns. A pass that may place on every node also
        keeps the reasons of the jobs it could not place (waiting.py). `deep`: look as far
        down the queue as the background pass does (PLACEMENT_SCAN_MAX). `first_only`:
        read no page past the first (as many jobs as there are free slots): the placement
        of new work (a submit), whose cost must not grow with the queue. The jobs ahead
        were offered these slots already (by the placement that freed them, or the
        background pass); when the first ones do not fit (throttled, constrained), the
        background pass, which looks deeper, places what is further down within
        DISPATCH_INTERVAL_SECS."""
        with self._tx():
            rotate = nodes is None
            if nodes is None:
                nodes = locked_nodes(self.db)
            every_node = nodes is None
            # One placement at a time on each node across every process (the caller
            # usually took the lock first; taking it again is free). Most calls find
            # no free slot.
            lock_placement(self.db, nodes=nodes)
            infos = self._placement_nodes(nodes)
            total_free = sum(max(0, n.free_slots) for n in infos if n.takes_work)
            if total_free <= 0:
                return 0
            # The round robin turns in placements of new work; filling the slots a node's
            # own jobs freed is not its turn (and leaves the cursor's row alone, which
            # placements on different nodes would otherwise queue on).
            cursor, cursor_stored = self._cursor() if rotate else (None, False)
            before = cursor
            planner = placement.Planner(infos, self.settings.placement_policy, cursor, fallback=FALLBACK_LIMITS)
            open_ids = sorted(n.node_id for n in infos if n.takes_work and n.free_slots > 0)
            scan = PLACEMENT_SCAN_MAX if deep else total_free if first_only else total_free + QUEUE_PAGE
            candidates = self._offer_queue(planner, open_ids, now, total_free, scan)
            plan = planner.plan()
            cursor = plan.cursor
            placed = self._write_placements(plan.placed, {row[0]: row[1] for row in candidates}, now)
            if every_node:
                self._keep_reasons(plan.waiting, {row[0]: row[2] for row in candidates})
            state = {}
            if placed:
                self._after_commit_placed({node_id for _, node_id in placed})
                if self.marks_placements:
                    state[PLACEMENT_MARK] = os.urandom(8).hex()
            if rotate and (not cursor_stored or cursor != before):
                state[RR_CURSOR] = cursor
            self._set_state(state)
            return len(placed)

    def _offer_queue(self, planner: placement.Planner, open_ids: list[str], now: float, first: int,
                     scan: int) -> list[tuple]:
        """Offer the planner the due jobs an open node may take (unpinned, or pinned to
        one of them), in queue order: `first` of them, then pages of QUEUE_PAGE while it
        has room, up to `scan` in all. Returns (id, attempt, stored reason) of each."""
        def unplaced(after: bool):
            # Ordered as the (status, node_id, queue_at, id) index is: status and node_id are the
            # same in every row, so this is queue order, read from the index up to the
            # limit. Ordered by id alone, PostgreSQL walks the primary key past every
            # finished job, and SQLite sorts every queued one. On PostgreSQL,
            # placements on other nodes run meanwhile: each skips the jobs another
            # is placing, rather than waiting for its commit to find them placed.
            where = ((Job.status == "pending") & Job.node_id.is_null() & (Job.dependencies_left == 0)
                     & (Job.next_attempt_at.is_null() | (Job.next_attempt_at <= param("now")))
                     & (Job.instance_id.is_null() | open_nodes.matches(Job.instance_id)))
            if after:
                where &= peewee.Tuple(Job.queue_at, Job.id) > peewee.Tuple(param("after_at"), param("after_id"))
            query = Job.select(*QUEUED).where(where).order_by(
                Job.status, Job.node_id, Job.queue_at, Job.id).limit(param("limit"))
            return query.for_update(skip_locked=True) if getattr(self.db, "for_update", False) else query

        open_nodes = ValueList(self.db, "open", open_ids)
        seen: list[tuple] = []
        limit, after = first, None
        while not planner.exhausted and len(seen) < scan:
            extra = {} if after is None else {"after_at": after[0], "after_id": after[1]}
            rows = self._sql.rows(self.db, ("unplaced", open_nodes.size, after is not None),
                                  lambda: unplaced(after is not None), now=now, limit=limit,
                                  **open_nodes.values, **extra)
            asks = [_ask(row) for row in rows]
            self._add_throttles(planner, asks)
            planner.offer(asks)
            seen += [(row[0], row[1], row[-2]) for row in rows]
            if len(rows) < limit:
                break
            limit, after = min(QUEUE_PAGE, scan - len(seen)), (rows[-1][-1], rows[-1][0])
        return seen

    def _write_placements(self, chosen: list[placement.Placed], attempts: dict[int, int], now: float
                          ) -> list[tuple[int, str]]:
        """Place the chosen jobs: one conditional update per node and reservation, and
        an event each. Returns (job row id, node) of those placed (not taken meanwhile)."""
        groups: dict[tuple[str, int, int], list[int]] = {}
        for p in chosen:
            groups.setdefault((p.node_id, p.memory_mb, p.cpu_percent), []).append(p.job_id)
        placed = []
        started, traced = spans.now_ns(), []
        for (node_id, memory, cpu), ids in groups.items():
            ids_list = ValueList(self.db, "ids", ids)
            done = {row[0]: row for row in self._sql.rows(self.db, ("place", ids_list.size), lambda: Job.update(
                    node_id=param("node_id"), attempt=Job.attempt + 1, placed_at=param("now"),
                    next_attempt_at=None, reserved_memory_mb=param("memory"), reserved_cpu_percent=param("cpu"),
                    pending_reason=None, pending_code=None).where(
                    ids_list.matches(Job.id) & (Job.status == "pending") & Job.node_id.is_null()).returning(
                        Job.id, Job.traceparent, Job.tracestate),
                    node_id=node_id, now=now, memory=memory, cpu=cpu, **ids_list.values)}
            placed += [(job_id, node_id) for job_id in ids if job_id in done]
            traced += [(f"job-{job_id}", *done[job_id][1:], attempts[job_id] + 1, node_id)
                       for job_id in ids if job_id in done]
        if placed:
            self._events([{"job": job_id, "at": now, "old": "pending", "new": "pending",
                           "attempt": attempts[job_id] + 1, "node_id": node_id,
                           "reason": f"placed on {node_id}"} for job_id, node_id in placed])
            if tracing.enabled():  # a corral.place span per placement, once committed
                self.db.after_commit(functools.partial(spans.placed, traced, started))
        return placed

    def _keep_reasons(self, reasons: dict[int, waiting.Reason], stored: dict[int, str | None]) -> int:
        """Keep the reason of each job placement could not place, where it changed: one
        update per distinct reason (in the caller's transaction, else one of its own).
        Returns how many changed."""
        changed: dict[str, tuple[waiting.Reason, list[int]]] = {}
        for job_id, reason in reasons.items():
            value = reason.as_dict()
            if _json(stored.get(job_id)) != value:
                changed.setdefault(json.dumps(value, sort_keys=True), (reason, []))[1].append(job_id)
        if not changed:
            return 0
        with self._tx():
            self.check_fence()
            for reason, ids in changed.values():
                for start in range(0, len(ids), INSERT_CHUNK):
                    Job.update(pending_reason=reason.as_dict(), pending_code=reason.code).where(
                        Job.id.in_(ids[start:start + INSERT_CHUNK]) & (Job.status == "pending")
                        & Job.node_id.is_null()).execute()
        return sum(len(ids) for _, ids in changed.values())

    def explain(self, now: float, limit: int = EXPLAIN_MAX) -> int:
        """Why the first `limit` due jobs in the queue are not placed, against every
        node (the background pass: the reasons of jobs no placement looks at, such as
        when no node has a free slot or none is healthy). Reads without a lock and
        writes only the reasons that changed; returns how many."""
        rows = self._sql.rows(self.db, "explain queue", lambda: Job.select(*QUEUED).where(
            (Job.status == "pending") & Job.node_id.is_null() & (Job.dependencies_left == 0)
            & (Job.next_attempt_at.is_null() | (Job.next_attempt_at <= param("now")))
        ).order_by(Job.status, Job.node_id, Job.queue_at, Job.id).limit(param("limit")), now=now, limit=limit)
        if not rows:
            return 0
        planner = placement.Planner(self._placement_nodes(), self.settings.placement_policy,
                                    fallback=FALLBACK_LIMITS, explain=True)
        asks = [_ask(row) for row in rows]
        self._add_throttles(planner, asks)
        planner.offer(asks)
        # A job the planner could place waits only for the next placement: it keeps its reason.
        return self._keep_reasons(planner.plan().waiting, {row[0]: row[-2] for row in rows})

    def next_due(self, now: float) -> float | None:
        """The earliest time after `now` an unplaced job comes due (a run_at, a retry's
        backoff), for the background pass to wake then; None when none waits for a time."""
        return self._sql.rows(self.db, "next due", lambda: Job.select(fn.MIN(Job.next_attempt_at)).where(
            (Job.next_attempt_at > param("now")) & (Job.status == "pending") & Job.node_id.is_null()),
            now=now)[0][0]

    def _add_throttles(self, planner: placement.Planner, asks: list[placement.Ask]) -> None:
        """Tell the planner the limits of the arrays and concurrency keys of these jobs
        it does not know yet, and how many of their jobs are placed or running."""
        known = set(planner.throttles)
        arrays = {a.array_id for a in asks if a.array_id is not None and ("array", a.array_id) not in known}
        keys = {a.concurrency_key for a in asks if a.concurrency_key is not None
                and ("key", a.concurrency_key) not in known}
        if not arrays and not keys:
            return
        holding = _holding_slots()
        found: dict[tuple[str, object], placement.Throttle] = {}
        if arrays:
            # `+ 0` (and `|| ''` below): read through the index of the jobs holding slots, not
            # the array's (or key's) own, which walks every queued job of a 100,000-job array.
            active = dict(Job.select(Job.array_id, fn.COUNT(Job.id)).where(
                (Job.array_id + 0).in_(sorted(arrays)) & holding).group_by(Job.array_id).tuples())
            for array_id, parallel in JobArray.select(JobArray.id, JobArray.parallel).where(
                    JobArray.id.in_(sorted(arrays))).tuples():
                found[("array", array_id)] = placement.Throttle(parallel, active.get(array_id, 0))
        if keys:
            limits = dict(ConcurrencyLimit.select(ConcurrencyLimit.key, ConcurrencyLimit.limit).where(
                ConcurrencyLimit.key.in_(sorted(keys))).tuples())
            if limits:
                active = dict(Job.select(Job.concurrency_key, fn.COUNT(Job.id)).where(
                    Job.concurrency_key.concat("").in_(sorted(limits)) & holding).group_by(
                    Job.concurrency_key).tuples())
                for key, limit in limits.items():
                    found[("key", key)] = placement.Throttle(limit, active.get(key, 0))
            for key in keys - set(limits):  # no limit set: unlimited (and not asked again this pass)
                found[("key", key)] = placement.Throttle(placement.UNCOUNTED, 0)
        planner.add_throttles(found)

    def _set_state(self, values: dict[str, str | None]) -> None:
        """Store scheduler_state values (key → value), all in one statement."""
        if not values:
            return
        named = {}
        for i, key in enumerate(sorted(values)):
            named[f"key{i}"], named[f"value{i}"] = key, values[key]
        self._sql.execute(self.db, ("set state", len(values)), lambda: SchedulerState.insert_many(
            [{"key": param(f"key{i}"), "value": param(f"value{i}")} for i in range(len(values))]).on_conflict(
            conflict_target=[SchedulerState.key], preserve=[SchedulerState.value]), **named)

    # ---- the SNS outbox, counters, /stats ----------------------------------

    @staticmethod
    def outbox_pending(limit: int) -> list[OutboxEvent]:
        """The oldest notifications not yet published."""
        return list(OutboxEvent.select().where(OutboxEvent.published_at.is_null())
                    .order_by(OutboxEvent.id).limit(limit))

    def outbox_published(self, ids: list[int], now: float) -> int:
        """Mark notifications published (after SNS accepted them)."""
        if not ids:
            return 0
        with self.db.atomic():
            self.check_fence()
            marked = OutboxEvent.update(published_at=now, publish_attempts=OutboxEvent.publish_attempts + 1,
                                        last_error=None).where(
                OutboxEvent.id.in_(ids) & OutboxEvent.published_at.is_null()).execute()
            self.bump(sns_published=marked)
            metrics.sns_published(self.db, marked)
        return marked

    def outbox_failed(self, errors: dict[int, str]) -> None:
        """Record a failed publish of each notification (it stays pending)."""
        if not errors:
            return
        with self.db.atomic():
            self.check_fence()
            for row_id, error in errors.items():
                OutboxEvent.update(publish_attempts=OutboxEvent.publish_attempts + 1, last_error=error[:1000]).where(
                    (OutboxEvent.id == row_id) & OutboxEvent.published_at.is_null()).execute()
            self.bump(sns_publish_failures=len(errors))
            metrics.sns_failed(self.db, len(errors))

    def outbox_purge(self, published_before: float) -> int:
        """Delete published notifications older than the retention."""
        with self.db.atomic():
            self.check_fence()
            return OutboxEvent.delete().where(OutboxEvent.published_at.is_null(False)
                                              & (OutboxEvent.published_at < published_before)).execute()

    @staticmethod
    def outbox_backlog(now: float) -> tuple[int, float | None]:
        """How many notifications wait, and the age in seconds of the oldest (None when none)."""
        waiting = OutboxEvent.select(fn.COUNT(OutboxEvent.id), fn.MIN(OutboxEvent.created_at)).where(
            OutboxEvent.published_at.is_null()).tuples().get()
        count, oldest = waiting
        return count, (max(0.0, now - oldest) if oldest is not None else None)

    def bump(self, **increments: int) -> None:
        """Add to named counters (one transaction; nested in the caller's when there is one)."""
        increments = {name: n for name, n in increments.items() if n}
        if not increments:
            return
        with self.db.atomic():
            for name, n in increments.items():
                Counter.insert(name=name, value=0).on_conflict_ignore().execute()
                Counter.update(value=Counter.value + n).where(Counter.name == name).execute()

    @staticmethod
    def counters() -> dict[str, int]:
        return dict(Counter.select(Counter.name, Counter.value).tuples())

    def count_pending(self) -> int:
        """How many jobs are pending (placed or not): an index-only count (admission.py)."""
        return self._sql.rows(self.db, "pending count", lambda: Job.select(fn.COUNT(Job.id)).where(
            Job.status == "pending"))[0][0]

    def _count_apart(self) -> int:
        """count_pending on a connection of its own, closed after (admission's count in
        a thread of its own)."""
        with self.db.connection_context():
            return self.count_pending()

    @staticmethod
    def job_counts() -> dict[str, int]:
        """How many jobs there are in each status."""
        return dict(Job.select(Job.status, fn.COUNT(Job.id)).group_by(Job.status).tuples())

    def nodes_and_slots(self) -> list[tuple[Node, int, placement.NodeInfo, tuple[int | None, int | None] | None]]:
        """The cached node list, each node with its capacity, what its jobs hold (as
        placement sees it) and what they use (as its agent last said; None: never)."""
        infos = {info.node_id: info for info in self._placement_nodes(include_others=True)}
        used = {node_id: (memory, cpu) for node_id, memory, cpu in NodeLease.select(
            NodeLease.node_id, NodeLease.used_memory_mb, NodeLease.used_cpu_percent).tuples()}
        # Two reads: a node the registry sync added or removed between them is left out
        # (it shows on the next read), not an error.
        return [(n, self._capacity(n.slots), infos[n.node_id], used.get(n.node_id))
                for n in Node.select().order_by(Node.node_id) if n.node_id in infos]

    # ---- helpers -----------------------------------------------------------

    def _capacity(self, slots: int | None) -> int:
        """How many jobs a node may hold: MAX_JOBS_PER_NODE, or fewer when its agent
        advertises fewer slots (None: a node the scheduler does not know)."""
        limit = self.settings.max_jobs_per_node
        return limit if slots is None else min(limit, slots)

    def open_nodes(self) -> list[str]:
        """The healthy compute nodes with a free slot (one read, no lock)."""
        return [n.node_id for n in self._placement_nodes() if n.takes_work and n.free_slots > 0]

    def _placement_nodes(self, only: Collection[str] | None = None, include_others: bool = False
                         ) -> list[placement.NodeInfo]:
        """The compute nodes (`only` these, when given; `include_others`: nodes of every
        kind) as placement sees them: status, labels, limits, free slots and what their
        jobs reserve."""
        if only is not None and not only:
            return []
        chosen = ValueList(self.db, "only", sorted(only)) if only is not None else None

        def compute_nodes():
            # Each node with the count of its jobs that hold a slot and what they reserve,
            # in one walk of the (node_id, status) index per node (a join, grouped).
            where = None if include_others else Node.kind == "compute"
            if chosen is not None:
                where = chosen.matches(Node.node_id) if where is None else where & chosen.matches(Node.node_id)
            return (Node.select(Node.node_id, Node.slots, Node.status, Node.refusing_work, Node.max_memory_mb,
                                Node.max_cpu_percent, Node.labels, Node.default_limits, Node.reserve_memory_mb,
                                Node.reserve_cpu_percent,
                                fn.COUNT(Job.id), fn.COALESCE(fn.SUM(Job.reserved_memory_mb), 0),
                                fn.COALESCE(fn.SUM(Job.reserved_cpu_percent), 0))
                    .join(Job, peewee.JOIN.LEFT_OUTER, on=(Job.node_id == Node.node_id) & Job.status.in_(ACTIVE))
                    .where(where if where is not None else peewee.SQL("1 = 1"))
                    .group_by(Node.node_id))

        rows = self._sql.rows(self.db, ("placement nodes", chosen and chosen.size, include_others), compute_nodes,
                              **(chosen.values if chosen else {}))
        return [placement.NodeInfo(
            node_id, self._capacity(slots) - held, status="healthy" if status in ("healthy", "drained") else status,
            drained=status == "drained", refusing_work=refusing, labels=_json(labels) or {},
            max_memory_mb=max_memory,
            max_cpu_percent=max_cpu, reserve_memory_mb=reserve_memory or 0, reserve_cpu_percent=reserve_cpu or 0,
            reserved_memory_mb=int(reserved_memory or 0), reserved_cpu_percent=int(reserved_cpu or 0),
            default_limits=_limits_by_type(_json(defaults)))
            for (node_id, slots, status, refusing, max_memory, max_cpu, labels, defaults, reserve_memory, reserve_cpu,
                 held, reserved_memory, reserved_cpu) in rows]

    def _touch_lease(self, node_id: str, now: float) -> None:
        if self._sql.execute(self.db, "touch lease", lambda: NodeLease.update(
                renewed_at=param("now")).where(NodeLease.node_id == param("node_id")),
                now=now, node_id=node_id).rowcount == 0:
            NodeLease.insert(node_id=node_id, renewed_at=now).on_conflict(
                conflict_target=[NodeLease.node_id], preserve=[NodeLease.renewed_at]).execute()

    def _may_claim(self, node_id: str, now: float) -> bool:
        """Whether a claim of this node may take something: jobs are placed on it, or
        work waits unplaced (the claim may place it here). Two reads, no lock; a job
        placed just after wakes the waiting claim, which looks again."""
        placed = self._sql.rows(self.db, "placed on node", lambda: Job.select(Job.id).where(
            (Job.status == "pending") & (Job.node_id == param("node_id"))).limit(1), node_id=node_id)
        return bool(placed) or self._unplaced_due(now)

    def _unplaced_due(self, now: float) -> bool:
        # Ordered as the (status, node_id, queue_at, id) index is, as in dispatch: without an order,
        # PostgreSQL's generic plan of this prepared statement may scan the whole table
        # for a LIMIT 1 that finds nothing (much slower under load; see docs/benchmarks.md).
        return bool(self._sql.rows(self.db, "unplaced due", self._unplaced_due_query, now=now))

    @staticmethod
    def _unplaced_due_query() -> peewee.Select:
        """The id of one pending job placed nowhere that is due at `now` (a parameter)."""
        return Job.select(Job.id).where(
            (Job.status == "pending") & Job.node_id.is_null()
            & (Job.next_attempt_at.is_null() | (Job.next_attempt_at <= param("now")))
        ).order_by(Job.status, Job.node_id, Job.queue_at, Job.id).limit(1)

    def _after_commit_placed(self, node_ids: set[str]) -> None:
        hook = self.on_placed
        if hook is None:
            return

        def notify():
            try:
                hook(node_ids)
            except Exception:  # after the commit: the request must not fail for it
                log.exception("waking the claims of %s failed", sorted(node_ids))

        self.db.after_commit(notify)

    @staticmethod
    def _limit_nodes() -> list[Node]:
        """The compute nodes with what _check_limits reads of them (not their labels and
        defaults, JSON parsed for every node)."""
        return list(Node.select(Node.node_id, Node.max_memory_mb, Node.max_cpu_percent).where(Node.kind == "compute"))

    def _check_limits(self, fields: dict, known: list[Node] | None = None) -> None:
        """Refuse limits no known node allows (a pinned job: its node), while nodes are known.
        `known`: the compute nodes, when the caller already read them. Also a job's own
        timeout_secs above JOB_TIMEOUT_MAX_SECS."""
        check_timeout(fields, self.settings.job_timeout_max_secs)
        if fields.get("memory_mb") is None and fields.get("cpu_percent") is None:
            return
        if known is None:
            known = self._limit_nodes()
        nodes = [n for n in known if not fields.get("instance_id") or n.node_id == fields["instance_id"]]
        job = placement.Ask(0, pin=fields.get("instance_id"), memory_mb=fields.get("memory_mb"),
                            cpu_percent=fields.get("cpu_percent"))
        if nodes and not any(placement.fits_maximum(job, placement.NodeInfo(
                n.node_id, 1, max_memory_mb=n.max_memory_mb, max_cpu_percent=n.max_cpu_percent)) for n in nodes):
            largest = ", ".join(f"{n.node_id}: {_maxima(n)}" for n in nodes[:5])
            raise BadRequest(f"no node allows {_asked(job)} ({largest})")

    def _cursor(self) -> tuple[str | None, bool]:
        """The round-robin cursor (read under the placement lock), and whether its row exists."""
        rows = self._sql.rows(self.db, "cursor value", lambda: SchedulerState.select(SchedulerState.value).where(
            SchedulerState.key == RR_CURSOR))
        return (rows[0][0], True) if rows else (None, False)

    def _apply(self, job: Job, transition: lifecycle.Transition, now: float) -> None:
        """One lifecycle decision (_apply_all); raises Conflict when the row changed meanwhile."""
        if self._apply_all([(job, transition)], now):
            raise _changed_meanwhile(job)

    def _apply_all(self, decided: list[tuple[Job, lifecycle.Transition]], now: float,
                   on_node: str | None = None, settle: bool = True) -> list[Job]:
        """The one place lifecycle decisions are written. For each (job, transition): a
        compare-and-set on the job's status and attempt (and node, `on_node`: a claim),
        its event row (all of them in one statement), its metrics on commit, and its notification in the outbox
        when it is final; each instance then says what its row says. Decisions that
        change the same fields share one UPDATE (_update_jobs). Returns
        the jobs whose row had changed meanwhile: nothing is written for them and their
        instances are as they were. A job appears at most once. The jobs that waited on
        those that ended are decided then (`settle`: _settle_dependents)."""
        groups: dict[tuple, list[tuple[Job, lifecycle.Transition]]] = {}
        for job, transition in decided:
            check_transition(job.status, transition.new)
            key = (job.status, job.attempt, transition.new, tuple(sorted(transition.changes)),
                   None if one_writer(self.db) else repr(sorted(transition.changes.items())))
            groups.setdefault(key, []).append((job, transition))
        stale, rows = [], []
        for (old, attempt, new, _, _), members in groups.items():
            changed = self._update_jobs(members, old, attempt, new, on_node)
            for job, transition in members:
                if job.id not in changed:
                    stale.append(job)
                    continue
                rows.append({"job": job.id, "at": now, "old": old, "new": new, "attempt": attempt,
                             "node_id": job.node_id, "reason": transition.reason})
                metrics.moved(self.db, job, new, now, transition.changes)  # before the instance changes
                if transition.timed_out:
                    metrics.timed_out(self.db)
                for name, value in transition.changes.items():
                    setattr(job, name, value)
                job.status = new
                if new in FINAL_STATUSES and self.settings.sns_topic_arn:
                    message = notifications.notification(job, transition.reason)
                    OutboxEvent.create(event_id=message["event_id"], job_id=job.id, status=new, message=message,
                                       created_at=now)
        self._events(rows)
        if settle:
            # Only jobs others wait on (a job read without the flag counts as one).
            ended = [job for job, _ in decided if job.status in FINAL_STATUSES and job not in stale
                     and job.__data__.get("has_dependents", True)]
            if ended:
                self._settle_dependents(ended, now)
        return stale

    # ---- dependencies ---------------------------------------------------------

    def _settle_dependents(self, ended: list[Job], now: float) -> None:
        """Decide the conditions that waited on these jobs, which just ended
        (dependencies.py): a job whose last condition is met queues from now; one whose
        condition can never hold is cancelled, and its own dependents are decided in
        turn, down the chain. Each condition is decided once (a conditional update)."""
        while ended:
            statuses = {job.id: (job.job_id, job.status) for job in ended}
            waiting = list(JobDependency.select().where(JobDependency.depends_on.in_(sorted(statuses))
                                                        & (JobDependency.state == "waiting")))
            if not waiting:
                return
            dependents = {job.id: job for job in Job.select(*DECIDING, Job.priority, Job.on_dependency_failure)
                          .where(Job.id.in_(sorted({row.job_id for row in waiting})))}
            cancelled: list[tuple[Job, lifecycle.Transition]] = []
            touched = set()
            for row in waiting:
                other_id, status = statuses[row.depends_on]
                outcome = dependencies.outcome(row.condition, status)
                if outcome is None or JobDependency.update(state=outcome).where(
                        (JobDependency.id == row.id) & (JobDependency.state == "waiting")).execute() != 1:
                    continue
                job = dependents.get(row.job_id)
                if job is None or job.status != "pending" or any(j is job for j, _ in cancelled):
                    continue
                if dependencies.cancels(outcome, job.on_dependency_failure):
                    cancelled.append((job, lifecycle.dependency_failed(
                        job, now, dependencies.reason(other_id, row.condition, status))))
                else:
                    Job.update(dependencies_left=Job.dependencies_left - 1).where(Job.id == job.id).execute()
                    touched.add(job.id)
            self._queue_released(touched, now)
            stale = self._apply_all(cancelled, now, settle=False)
            ended = [job for job, _ in cancelled if job not in stale]

    def settle_missed(self, now: float) -> int:
        """Decide the conditions still waiting on jobs that have ended (the background
        pass): a job's end decides its dependents' conditions in its own transaction,
        but on PostgreSQL a dependency recorded while that transaction ran is not
        seen by it. Returns how many ended jobs it settled."""
        final = Job.select(Job.id).where(Job.status.in_(sorted(FINAL_STATUSES)))
        ids = [row[0] for row in JobDependency.select(JobDependency.depends_on).where(
            (JobDependency.state == "waiting") & JobDependency.depends_on.in_(final)).distinct().limit(1000).tuples()]
        if not ids:
            return 0
        with self._tx():
            self.check_fence()
            self._settle_dependents(list(Job.select(*DECIDING).where(Job.id.in_(ids))), now)
        return len(ids)

    def _queue_released(self, job_ids: set[int], now: float) -> None:
        """Jobs one of whose conditions was just met: those with none left queue from
        now (placement.queue_at); the others name the next job they wait for."""
        if not job_ids:
            return
        for job in Job.select(Job.id, Job.dependencies_left, Job.priority).where(Job.id.in_(sorted(job_ids))):
            if job.dependencies_left <= 0:
                Job.update(dependencies_left=0, pending_reason=None, pending_code=None,
                           queue_at=placement.queue_at(now, job.priority, self.settings.priority_aging_secs)).where(
                    Job.id == job.id).execute()
                continue
            row = (JobDependency.select().where((JobDependency.job_id == job.id) & (JobDependency.state == "waiting"))
                   .order_by(JobDependency.id).first())
            if row is not None:
                reason = waiting.dependency(f"job-{row.depends_on}", row.condition)
                Job.update(pending_reason=reason.as_dict(), pending_code=reason.code).where(
                    Job.id == job.id).execute()

    @staticmethod
    def _dependency_columns(depends_on: list, known: dict, on_failure: str) -> tuple[dict, str | None]:
        """A new job's columns for its conditions on jobs of `known` statuses (id ->
        status; an earlier item of its batch is pending): how many wait, and the reason
        it is cancelled at once when one can never hold (None: it is not)."""
        left = [(other, condition) for other, condition in depends_on
                if dependencies.outcome(condition, known[other]) is None]
        for other, condition in depends_on:
            outcome = dependencies.outcome(condition, known[other])
            if outcome is not None and dependencies.cancels(outcome, on_failure):
                return {}, dependencies.reason(f"job-{other}", condition, known[other])
        return ({"dependencies_left": len(left)} if left else {}), None

    def _link(self, job: Job, depends_on: list[tuple[int, str]], known: dict[int, str], now: float,
              cancel_reason: str | None) -> None:
        """Record a new job's conditions (each decided already, or waiting), name the
        first it waits for, and cancel it when one can never hold."""
        rows = [{"job_id": job.id, "depends_on": other, "condition": condition,
                 "state": dependencies.outcome(condition, known[other]) or "waiting"}
                for other, condition in depends_on]
        if not rows:
            return
        JobDependency.insert_many(rows).execute()
        waited_on = sorted({row["depends_on"] for row in rows if row["state"] == "waiting"})
        if waited_on:
            Job.update(has_dependents=True).where(Job.id.in_(waited_on)).execute()
        # What the job's answer shows (an earlier item of a batch has its id only now).
        changes: dict = {"depends_on": [[other, condition] for other, condition in depends_on]}
        first = next((row for row in rows if row["state"] == "waiting"), None)
        if first is not None and cancel_reason is None:
            reason = waiting.dependency(f"job-{first['depends_on']}", first["condition"])
            changes.update(pending_reason=reason.as_dict(), pending_code=reason.code)
        Job.update(**changes).where(Job.id == job.id).execute()
        for name, value in changes.items():
            setattr(job, name, value)
        if cancel_reason is not None:
            self._apply(job, lifecycle.dependency_failed(job, now, cancel_reason), now)

    def _update_jobs(self, members: list[tuple[Job, lifecycle.Transition]], old: str, attempt: int, new: str,
                     on_node: str | None) -> set[int]:
        """The compare-and-set of _apply_all for decisions that change the same fields;
        returns the ids it changed. When the values are alike too (a claim's jobs) they
        are the statement's constants; else each row brings its own (reports: every
        job's output, CPU time and peak memory differ), joined in one statement rather
        than an UPDATE per job. Only with one writer (SQLite): on PostgreSQL the joined
        UPDATE measured no faster than an UPDATE per job under the capacity benchmark
        (docs/benchmarks.md), so there _apply_all groups alike values only."""
        fields = Job._meta.fields
        changes = members[0][1].changes
        names = sorted(changes)
        if any(transition.changes != changes for _, transition in members[1:]):
            where = {"status": old, "attempt": attempt, **({"node_id": on_node} if on_node is not None else {})}
            return self._sql.update_rows(self.db, "transition", Job, [
                {"id": job.id, **{name: fields[name].db_value(transition.changes[name]) for name in names}}
                for job, transition in members], names, {"status": new}, where)
        chosen = ValueList(self.db, "ids", [job.id for job, _ in members])

        def update():
            where = chosen.matches(Job.id) & (Job.status == param("old")) & (Job.attempt == param("was_attempt"))
            if on_node is not None:
                where &= Job.node_id == param("on_node")
            return Job.update(status=param("new"), **{name: param(name) for name in names}).where(
                where).returning(Job.id)

        return {row[0] for row in self._sql.rows(
            self.db, ("transition", tuple(names), on_node is not None, chosen.size), update,
            new=new, old=old, was_attempt=attempt, **chosen.values,
            **({"on_node": on_node} if on_node is not None else {}),
            **{name: fields[name].db_value(value) for name, value in changes.items()})}

    def _event(self, job: Job, old: str | None, new: str, now: float, reason: str) -> None:
        self._events([{"job": job.id, "at": now, "old": old, "new": new, "attempt": job.attempt,
                       "node_id": job.node_id, "reason": reason}])

    def _events(self, rows: list[dict]) -> None:
        """Record events: dicts of job (its row id), at, old, new, attempt, node_id, reason."""
        self._sql.insert_rows(self.db, "events", JobEvent, [
            {"job": row["job"], "at": row["at"], "from_status": row["old"], "to_status": row["new"],
             "attempt": row["attempt"], "node_id": row["node_id"], "reason": row["reason"]} for row in rows])


def _changed_meanwhile(job: Job) -> Conflict:
    return Conflict(f"{job.job_id} changed while this request ran; try again")


def _key_reused(key: str, job: Job) -> str:
    return f"the Idempotency-Key {key!r} was used for {job.job_id} with a different request"


def _check_attempt(job: Job, sent: dict) -> None:
    """What an agent sends about a job (a report, live output) must come from the node
    the job is placed on and be about its current attempt."""
    if job.node_id != sent["node_id"]:
        raise Conflict(f"{job.job_id} is not placed on {sent['node_id']!r}")
    if job.attempt != sent["attempt"]:
        raise Conflict(f"attempt {sent['attempt']} of {job.job_id} is stale; "
                       f"the current attempt is {job.attempt}")


def _claim_limits(job: Job, request: dict) -> dict | None:
    """The limits a claimed job gets: its own request, else the node's default for its
    type (the design's defaults when the agent sent none); None when not enforced."""
    if not request.get("limits_enforced"):
        return None
    defaults = (request.get("default_limits") or {}).get(job.job_type) or DESIGN_LIMITS.get(
        job.job_type, DESIGN_LIMITS["run"])
    limits = {"memory_mb": job.memory_mb if job.memory_mb is not None else defaults["memory_mb"],
              "cpu_percent": job.cpu_percent if job.cpu_percent is not None else defaults["cpu_percent"]}
    processes = job.max_processes if job.max_processes is not None else defaults.get("max_processes")
    if processes is not None:  # an agent that sets no pids limit sends no default
        limits["max_processes"] = processes
    return limits


def _drain_status(status: str, drained: bool) -> str:
    """A node's placement status once drained (or undrained): only a healthy node shows it."""
    if drained and status == "healthy":
        return "drained"
    return "healthy" if not drained and status == "drained" else status


def _asked(job: placement.Ask) -> str:
    """The limits a job asks, those it gives only (`memory_mb=9000`, not `cpu_percent=None`)."""
    asked = [f"{name}={value}" for name, value in (("memory_mb", job.memory_mb), ("cpu_percent", job.cpu_percent))
             if value is not None]
    return ", ".join(asked)


def _maxima(node: Node) -> str:
    """A node's largest limits; one it does not state is `no maximum`."""
    return ", ".join(f"{name}<={value}" if value is not None else f"{name}: no maximum"
                     for name, value in (("memory_mb", node.max_memory_mb), ("cpu_percent", node.max_cpu_percent)))


def _placement_status(node: dict) -> str:
    """How the scheduler sees a registry node: a drained node takes no new work
    (what it runs finishes), so for placement it is not `healthy`."""
    status = node.get("status") or "unhealthy"
    return "drained" if status == "healthy" and node.get("drained") else status


def _json(value):
    """A JSON column's value as a SELECT of raw rows gives it (text), parsed. The same
    texts come back on every placement (a node's labels and defaults, the jobs' few
    constraint sets): they are parsed once. The result is shared: never change it."""
    return _parsed(value) if isinstance(value, str) else value


@functools.lru_cache(maxsize=4096)
def _parsed(text: str):
    return json.loads(text)


def _limits_by_type(defaults: dict | None) -> dict[str, placement.Limits]:
    """A node's default limits per job type, as its agent advertised them."""
    return {job_type: (limits["memory_mb"], limits["cpu_percent"]) for job_type, limits in (defaults or {}).items()
            if isinstance(limits, dict) and "memory_mb" in limits and "cpu_percent" in limits}


def _ask(row: tuple) -> placement.Ask:
    """A queued job (a row of QUEUED) as placement reads it."""
    job_id, _, job_type, pin, memory, cpu, constraints, pool, array_id, key = row[:10]
    return placement.Ask(job_id, job_type=job_type, pin=pin, memory_mb=memory, cpu_percent=cpu,
                         constraints=tuple((label, op, tuple(value) if isinstance(value, list) else value)
                                           for label, op, value in (_json(constraints) or ())),
                         pool=pool, array_id=array_id, concurrency_key=key)


def _waiting_for(code: str, now: float) -> peewee.Expression:
    """The pending jobs whose reason at `now` has this code, as waiting.current decides it."""
    pending = Job.status == "pending"
    if code == "placed":
        return pending & Job.node_id.is_null(False)
    unplaced = pending & Job.node_id.is_null()
    if code == "dependency":
        return unplaced & (Job.dependencies_left > 0)
    free = unplaced & (Job.dependencies_left == 0)
    later = Job.next_attempt_at > now
    first_attempt = (Job.attempt == 0) & (Job.retry_count == 0)
    if code == "scheduled":
        return free & later & first_attempt
    if code == "backoff":
        return free & later & ~first_attempt
    due = free & (Job.next_attempt_at.is_null() | (Job.next_attempt_at <= now))
    if code == "no_capacity":  # also the jobs placement has not looked at: the queue ahead took every slot
        return due & ((Job.pending_code == code) | Job.pending_code.is_null())
    return due & (Job.pending_code == code)


def _array_number(array_id: str) -> int | None:
    prefix, _, number = array_id.partition("-")
    return int(number) if prefix == "array" and number.isdigit() and 0 < len(number) <= 18 else None


def _holding_slots() -> peewee.Expression:
    """_placed_or_running, as a range of the (status, node_id, ...) index: a running job
    is always on a node. Its rows are bounded by the cluster's slots, not by the queue."""
    return Job.status.in_(["pending", "running"]) & Job.node_id.is_null(False)


def _placed_or_running() -> peewee.Expression:
    """The jobs that count against an array's `parallel` and a concurrency key's limit."""
    return (Job.status == "running") | ((Job.status == "pending") & Job.node_id.is_null(False))
