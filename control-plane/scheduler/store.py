"""Everything the scheduler reads and writes, each write in one short transaction.

Functions take `now` (seconds since the epoch) instead of reading the clock, so
tests drive them with fixed times. Every status change goes through
`_transition`, which checks it against shared.states and records an event.

Concurrency: on SQLite every `db.atomic()` is BEGIN IMMEDIATE, so transactions
that place jobs are serialised by the database lock. On other databases the
first statement of `dispatch` updates the round-robin row, which takes a row
lock and serialises placement the same way.

When SNS_TOPIC_ARN is set, `_transition` also writes a notification row to the
outbox (sns_outbox) for every final status, in the same transaction: the
notification exists exactly when the status change does (sns_outbox.py
publishes it).
"""
import peewee
from peewee import fn

from corral.shared.errors import BadRequest, Conflict, NotFound
from corral.shared.states import ACTIVE, ALL, FINAL, JobStatus, after_failure, check_transition
from corral.shared.timeutil import iso

from . import placement, sns_outbox
from .models import Counter, Job, JobEvent, Node, NodeLease, OutboxEvent, SchedulerState
from .settings import SchedulerSettings
from .validation import parse_job_id, request_hash

RR_CURSOR = "rr_cursor"
FINAL_STATUSES = frozenset(s.value for s in FINAL)


class Store:
    def __init__(self, db: peewee.Database, settings: SchedulerSettings):
        self.db = db
        self.settings = settings

    # ---- views -------------------------------------------------------------

    def job_view(self, job: Job) -> dict:
        return {
            "job_id": job.job_id, "name": job.name, "node_id": job.node_id, "instance_id": job.instance_id,
            "command": job.command, "deploy_url": job.deploy_url, "deploy_sha256": job.deploy_sha256,
            "job_type": job.job_type, "port": job.port, "health_path": job.health_path,
            "env_vars": job.env_vars or {}, "memory_mb": job.memory_mb, "cpu_percent": job.cpu_percent,
            "status": job.status, "attempt": job.attempt, "retry_count": job.retry_count,
            "max_retries": job.max_retries, "next_attempt_at": iso(job.next_attempt_at),
            "on_node_lost": job.on_node_lost, "node_losses": job.node_losses,
            "exit_code": job.exit_code,
            "stdout": job.stdout, "stderr": job.stderr, "oom_killed": job.oom_killed,
            "peak_memory_bytes": job.peak_memory_bytes, "cpu_seconds": job.cpu_seconds,
            "limits_enforced": job.limits_enforced, "limits": job.limits,
            "timeout_secs": self.settings.job_timeout_secs if job.job_type == "run" else None,
            "created_at": iso(job.created_at), "placed_at": iso(job.placed_at),
            "running_at": iso(job.running_at), "finished_at": iso(job.finished_at),
        }

    @staticmethod
    def event_view(event: JobEvent) -> dict:
        return {"at": iso(event.at), "from": event.from_status, "to": event.to_status,
                "attempt": event.attempt, "node_id": event.node_id, "reason": event.reason}

    # ---- reads -------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        number = parse_job_id(job_id)
        job = Job.get_or_none(Job.id == number) if number else None
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        return job

    def events(self, job_id: str) -> list[JobEvent]:
        job = self.get(job_id)
        return list(JobEvent.select().where(JobEvent.job == job.id).order_by(JobEvent.id))

    def list_jobs(self, *, node_id=None, status=None, job_type=None, after: int | None = None,
                  limit: int = 100, newest_first: bool = False) -> list[Job]:
        query = Job.select()
        if node_id is not None:
            query = query.where(Job.node_id == node_id)
        if status is not None:
            query = query.where(Job.status == status)
        if job_type is not None:
            query = query.where(Job.job_type == job_type)
        if after is not None:
            query = query.where(Job.id < after if newest_first else Job.id > after)
        return list(query.order_by(Job.id.desc() if newest_first else Job.id).limit(limit))

    def pending_for_agent(self, node_id: str, limit: int) -> list[Job]:
        """The pending jobs placed on `node_id`, at most its free slots (what agents poll)."""
        node = Node.get_or_none(Node.node_id == node_id)
        capacity = self._capacity(node) if node else self.settings.max_jobs_per_node
        running = Job.select().where((Job.node_id == node_id) & (Job.status == "running")).count()
        free = min(limit, capacity - running)
        if free <= 0:
            return []
        return self.list_jobs(node_id=node_id, status="pending", limit=free)

    # ---- writes ------------------------------------------------------------

    def submit(self, fields: dict, now: float, idempotency_key: str | None = None) -> tuple[Job, bool]:
        """Create a pending job and place it if a node has room; committed on return.

        With an idempotency key, a repeat of the same request returns the job it
        created first (and False); the same key with another request is a Conflict.
        """
        digest = request_hash(fields) if idempotency_key else None
        columns = dict(fields, max_retries=self.settings.max_job_retries if fields.get("max_retries") is None
                       else fields["max_retries"])
        try:
            with self.db.atomic():
                existing = self._by_key(idempotency_key, digest)
                if existing is not None:
                    return existing, False
                self._check_limits(fields)
                job = Job.create(created_at=now, idempotency_key=idempotency_key, request_hash=digest, **columns)
                self._event(job, None, "pending", now, "submitted")
                self.dispatch(now)
        except peewee.IntegrityError:
            # Another request with the same key committed first (databases without
            # a single write lock): answer as if this one came second.
            existing = self._by_key(idempotency_key, digest) if idempotency_key else None
            if existing is None:
                raise
            return existing, False
        return Job.get_by_id(job.id), True

    @staticmethod
    def _by_key(key: str | None, digest: str | None) -> Job | None:
        if key is None:
            return None
        existing = Job.get_or_none(Job.idempotency_key == key)
        if existing is not None and existing.request_hash != digest:
            raise Conflict(f"the Idempotency-Key {key!r} was used for {existing.job_id} with a different request")
        return existing

    def report(self, job_id: str, report: dict, now: float) -> Job:
        """Apply an agent's report; refuses other nodes, stale attempts and illegal moves."""
        with self.db.atomic():
            job = self.get(job_id)
            if job.node_id != report["node_id"]:
                raise Conflict(f"{job.job_id} is not placed on {report['node_id']!r}")
            if job.attempt != report["attempt"]:
                raise Conflict(f"attempt {report['attempt']} of {job.job_id} is stale; "
                               f"the current attempt is {job.attempt}")
            new = report["status"]
            if job.status == new and new == "running":
                return job  # the agent repeated a report whose answer it lost
            if new == "running":
                self._transition(job, "running", now, "started on the node", running_at=now,
                                 limits_enforced=report["limits_enforced"], limits=report["limits"])
            elif job.status != "running":
                raise Conflict(f"{job.job_id} is {job.status}, not running; the {new!r} report is refused")
            else:
                self._finish(job, new, report, now)
        return Job.get_by_id(job.id)

    def _finish(self, job: Job, new: str, report: dict, now: float) -> None:
        tail = self.settings.output_tail_bytes
        outcome = {"exit_code": report["exit_code"],
                   "stdout": _tail(report["stdout"], tail), "stderr": _tail(report["stderr"], tail),
                   "oom_killed": report["oom_killed"], "peak_memory_bytes": report["peak_memory_bytes"],
                   "cpu_seconds": report["cpu_seconds"]}
        why = f"exit code {report['exit_code']}" + (", out of memory" if report["oom_killed"] else "")
        if new == "done":
            self._transition(job, "done", now, "exit code 0", finished_at=now, **outcome)
        elif report["requeue"]:
            self._node_lost(job, now, f"node {job.node_id} gave the attempt up", outcome)
        elif self._past_timeout(job, now):
            # The agent killed it at the deadline; a timeout is final, as when the
            # watcher below gets there first.
            self._transition(job, "failed", now, "timed out", finished_at=now, **outcome)
        elif after_failure(job.retry_count, job.max_retries) is JobStatus.PENDING:
            delay = self.settings.backoff.delay(job.retry_count)
            reason = f"attempt {job.attempt} failed ({why}); retrying in {delay:.1f}s"
            self._transition(job, "pending", now, reason, retry_count=job.retry_count + 1,
                             node_id=None, running_at=None, placed_at=None, next_attempt_at=now + delay)
        else:
            self._transition(job, "failed", now, f"{why}; no retries left",
                             finished_at=now, **outcome)
        self.dispatch(now)  # a slot is free

    def _past_timeout(self, job: Job, now: float) -> bool:
        return (job.job_type == "run" and job.running_at is not None
                and now - job.running_at >= self.settings.job_timeout_secs)

    def cancel(self, job_id: str, now: float) -> Job:
        """Cancel a pending or running job; the agent ends a running one at its next poll."""
        with self.db.atomic():
            job = self.get(job_id)
            if job.status == "cancelled":
                return job
            if job.status in ("done", "failed"):
                raise Conflict(f"{job.job_id} is already {job.status}; only pending or running jobs can be cancelled")
            self._transition(job, "cancelled", now, "cancelled by request", finished_at=now)
            self.dispatch(now)
        return Job.get_by_id(job.id)

    def retry(self, job_id: str, now: float) -> Job:
        """Put a failed job back to pending with a fresh retry budget (an operator's decision)."""
        with self.db.atomic():
            job = self.get(job_id)
            if job.status != "failed":
                raise Conflict(f"{job.job_id} is {job.status}; only failed jobs can be retried")
            self._transition(job, "pending", now, "retried by request", retry_count=0, node_id=None,
                             placed_at=None, running_at=None, finished_at=None, next_attempt_at=None,
                             exit_code=None, stdout=None, stderr=None, oom_killed=None,
                             peak_memory_bytes=None, cpu_seconds=None)
            self.dispatch(now)
        return Job.get_by_id(job.id)

    def fail_timed_out(self, now: float) -> list[str]:
        """Fail `run` jobs running longer than JOB_TIMEOUT_SECS; their agents kill them."""
        deadline = now - self.settings.job_timeout_secs
        ended = []
        with self.db.atomic():
            overdue = Job.select().where((Job.status == "running") & (Job.job_type == "run")
                                         & (Job.running_at < deadline))
            for job in overdue:
                self._transition(job, "failed", now, "timed out", finished_at=now, exit_code=-1,
                                 stderr="job timed out")
                ended.append(job.job_id)
            if ended:
                self.dispatch(now)
        return ended

    def sync_nodes(self, nodes: list[dict], now: float) -> None:
        """Replace the cached node list with the registry's, then move work off lost nodes."""
        with self.db.atomic():
            Node.delete().execute()
            if nodes:
                Node.insert_many([{
                    "node_id": n["node_id"], "address": n.get("address") or "", "kind": n.get("kind") or "compute",
                    "slots": int(n.get("slots") or 1), "status": n.get("status") or "unhealthy", "synced_at": now,
                    "max_memory_mb": n.get("max_memory_mb"), "max_cpu_percent": n.get("max_cpu_percent"),
                } for n in nodes]).execute()
            self.release_lost(now)
            self.dispatch(now)

    def release_lost(self, now: float) -> int:
        """Unplace pending jobs whose node is unhealthy or gone, so they go elsewhere."""
        healthy = Node.select(Node.node_id).where((Node.status == "healthy") & (Node.kind == "compute"))
        stranded = list(Job.select().where((Job.status == "pending") & Job.node_id.is_null(False)
                                           & Job.node_id.not_in(healthy)))
        for job in stranded:
            self._event(job, "pending", "pending", now, f"node {job.node_id} is not healthy; unplaced")
            Job.update(node_id=None, placed_at=None).where(Job.id == job.id).execute()
        return len(stranded)

    def renew_lease(self, node_id: str, now: float) -> list[Job]:
        """Record that `node_id`'s agent is alive; returns the jobs the scheduler has running there.

        The agent compares that list with what it runs: an attempt it runs that is
        not listed is stale (moved, cancelled, timed out) and gets killed.
        """
        with self.db.atomic():
            if NodeLease.update(renewed_at=now).where(NodeLease.node_id == node_id).execute() == 0:
                NodeLease.insert(node_id=node_id, renewed_at=now).on_conflict_replace().execute()
        return list(Job.select(Job.id, Job.attempt).where((Job.node_id == node_id) & (Job.status == "running")))

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
            for job in lost:
                renewed = NodeLease.get_or_none(NodeLease.node_id == job.node_id)
                silent = f"{now - renewed.renewed_at:.0f}s" if renewed else "ever"
                self._node_lost(job, now, f"node {job.node_id} lost (no lease renewal for {silent})")
                ended.append(job.job_id)
            if ended:
                self.dispatch(now)
        return ended

    def _node_lost(self, job: Job, now: float, why: str, outcome: dict | None = None) -> None:
        """The attempt ended through no fault of the job's: run it again elsewhere
        without spending its retry budget, unless it asked not to (on_node_lost=fail)
        or has lost its node too often (MAX_NODE_LOSSES)."""
        result = dict(outcome or {}, exit_code=-1)
        if job.on_node_lost == "fail":
            result["stderr"] = _append(result.get("stderr"), f"{why}; not requeued (on_node_lost=fail)")
            self._transition(job, "failed", now, f"{why}; on_node_lost=fail", finished_at=now, **result)
        elif job.node_losses >= self.settings.max_node_losses:
            result["stderr"] = _append(result.get("stderr"), f"{why}; the job lost its node too often "
                                                             f"(MAX_NODE_LOSSES={self.settings.max_node_losses})")
            self._transition(job, "failed", now, f"{why}; lost its node {job.node_losses + 1} times",
                             finished_at=now, **result)
        else:
            self._transition(job, "pending", now, f"{why}; requeued", node_id=None, placed_at=None,
                             running_at=None, node_losses=job.node_losses + 1)

    def dispatch(self, now: float) -> int:
        """Place waiting jobs on nodes with free slots. Call inside a transaction."""
        with self.db.atomic():
            cursor = self._lock_cursor()
            slots = self._free_slots()
            total_free = sum(s.free for s in slots)
            if total_free <= 0:
                return 0
            unplaced = Job.select(Job.id, Job.instance_id, Job.memory_mb, Job.cpu_percent).where(
                (Job.status == "pending") & Job.node_id.is_null()
                & (Job.next_attempt_at.is_null() | (Job.next_attempt_at <= now)))
            open_nodes = [s.node_id for s in slots if s.free > 0]
            candidates = list(unplaced.where(Job.instance_id.is_null()).order_by(Job.id).limit(total_free))
            candidates += list(unplaced.where(Job.instance_id.in_(open_nodes)).order_by(Job.id).limit(total_free))
            candidates.sort(key=lambda j: j.id)
            assignments, cursor = placement.plan(
                [placement.Unplaced(j.id, j.instance_id, j.memory_mb, j.cpu_percent) for j in candidates],
                slots, cursor)
            for job_id, node_id in assignments:
                Job.update(node_id=node_id, attempt=Job.attempt + 1, placed_at=now, next_attempt_at=None).where(
                    (Job.id == job_id) & (Job.status == "pending") & Job.node_id.is_null()).execute()
            if assignments:
                placed = Job.select().where(Job.id.in_([job_id for job_id, _ in assignments]))
                JobEvent.insert_many([{
                    "job": j.id, "at": now, "from_status": "pending", "to_status": "pending",
                    "attempt": j.attempt, "node_id": j.node_id, "reason": f"placed on {j.node_id}",
                } for j in placed]).execute()
            SchedulerState.update(value=cursor).where(SchedulerState.key == RR_CURSOR).execute()
            return len(assignments)

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
            marked = OutboxEvent.update(published_at=now, publish_attempts=OutboxEvent.publish_attempts + 1,
                                        last_error=None).where(
                OutboxEvent.id.in_(ids) & OutboxEvent.published_at.is_null()).execute()
            self.bump(sns_published=marked)
        return marked

    def outbox_failed(self, errors: dict[int, str]) -> None:
        """Record a failed publish of each notification (it stays pending)."""
        if not errors:
            return
        with self.db.atomic():
            for row_id, error in errors.items():
                OutboxEvent.update(publish_attempts=OutboxEvent.publish_attempts + 1, last_error=error[:1000]).where(
                    (OutboxEvent.id == row_id) & OutboxEvent.published_at.is_null()).execute()
            self.bump(sns_publish_failures=len(errors))

    def outbox_purge(self, published_before: float) -> int:
        """Delete published notifications older than the retention."""
        with self.db.atomic():
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

    def stats(self, now: float) -> dict:
        """Job counts by status, SQS intake counters and the SNS outbox backlog (GET /stats)."""
        by_status = dict(Job.select(Job.status, fn.COUNT(Job.id)).group_by(Job.status).tuples())
        counters = self.counters()
        pending, oldest_age = self.outbox_backlog(now)
        return {
            "jobs": {status: by_status.get(status, 0) for status in ALL},
            "sqs": {"enabled": bool(self.settings.sqs_url), "dead_letter_queue": bool(self.settings.sqs_dlq_url),
                    **{name: counters.get(f"sqs_{name}", 0) for name in
                       ("received", "jobs_created", "duplicates", "rejected", "dead_lettered", "dropped",
                        "requeued")}},
            "sns": {"enabled": bool(self.settings.sns_topic_arn), "pending": pending,
                    "oldest_pending_age_secs": None if oldest_age is None else round(oldest_age, 3),
                    "published": counters.get("sns_published", 0),
                    "publish_failures": counters.get("sns_publish_failures", 0)},
        }

    # ---- helpers -----------------------------------------------------------

    def _capacity(self, node: Node) -> int:
        return min(self.settings.max_jobs_per_node, node.slots)

    def _free_slots(self) -> list[placement.NodeSlots]:
        nodes = list(Node.select().where((Node.status == "healthy") & (Node.kind == "compute")))
        held = dict(Job.select(Job.node_id, fn.COUNT(Job.id))
                    .where(Job.status.in_(ACTIVE) & Job.node_id.is_null(False))
                    .group_by(Job.node_id).tuples())
        return [placement.NodeSlots(n.node_id, self._capacity(n) - held.get(n.node_id, 0),
                                    n.max_memory_mb, n.max_cpu_percent) for n in nodes]

    def _check_limits(self, fields: dict) -> None:
        """Refuse limits no known node allows (a pinned job: its node), while nodes are known."""
        if fields.get("memory_mb") is None and fields.get("cpu_percent") is None:
            return
        query = Node.select().where(Node.kind == "compute")
        if fields.get("instance_id"):
            query = query.where(Node.node_id == fields["instance_id"])
        nodes = list(query)
        job = placement.Unplaced(0, fields.get("instance_id"), fields.get("memory_mb"), fields.get("cpu_percent"))
        if nodes and not any(placement.fits(job, placement.NodeSlots(n.node_id, 1, n.max_memory_mb,
                                                                     n.max_cpu_percent)) for n in nodes):
            largest = ", ".join(f"{n.node_id}: memory_mb<={n.max_memory_mb}, cpu_percent<={n.max_cpu_percent}"
                                for n in nodes[:5])
            raise BadRequest(f"no node allows memory_mb={job.memory_mb}, cpu_percent={job.cpu_percent} "
                             f"({largest})")

    def _lock_cursor(self) -> str | None:
        SchedulerState.insert(key=RR_CURSOR, value=None).on_conflict_ignore().execute()
        # A no-op write first: on PostgreSQL it row-locks the cursor for this transaction.
        SchedulerState.update(value=SchedulerState.value).where(SchedulerState.key == RR_CURSOR).execute()
        return SchedulerState.get_by_id(RR_CURSOR).value

    def _transition(self, job: Job, new: str, now: float, reason: str, **changes) -> None:
        check_transition(job.status, new)
        updated = Job.update(status=new, **changes).where(
            (Job.id == job.id) & (Job.status == job.status) & (Job.attempt == job.attempt)).execute()
        if updated != 1:
            raise Conflict(f"{job.job_id} changed while this request ran; try again")
        self._event(job, job.status, new, now, reason)
        if new in FINAL_STATUSES and self.settings.sns_topic_arn:
            message = sns_outbox.notification(Job.get_by_id(job.id), reason)
            OutboxEvent.create(event_id=message["event_id"], job_id=job.id, status=new, message=message,
                               created_at=now)

    @staticmethod
    def _event(job: Job, old: str | None, new: str, now: float, reason: str) -> None:
        JobEvent.create(job=job.id, at=now, from_status=old, to_status=new, attempt=job.attempt,
                        node_id=job.node_id, reason=reason)


def _append(text: str | None, line: str) -> str:
    return f"{text.rstrip()}\n{line}" if text else line


def _tail(text: str | None, limit: int) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[-limit:]
