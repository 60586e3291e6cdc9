"""Creating jobs.

One (POST /jobs), an array (its jobs in one transaction), a batch (all or nothing). Each
path checks the limits (limits.py) and the pending-jobs bound (admission.py) after its
idempotency key was looked up, and records the new jobs' conditions on others
(links.py). New jobs are pending and unplaced: service.Scheduler places them."""
import contextlib

import peewee

from corral.server import audit_trail
from corral.shared.errors import BadRequest, BatchError, Conflict

from .. import admission, lifecycle, metrics
from ..models import Job, JobArray
from ..validation import request_hash
from .columns import INSERT_CHUNK
from .context import StoreContext
from .jobs import array_ends
from .limits import Limits
from .links import Links
from .new_jobs import NewJobs, key_reused
from .transitions import Transitions


class Submits:
    def __init__(self, ctx: StoreContext, limits: Limits, links: Links, new_jobs: NewJobs,
                 transitions: Transitions, gate: admission.PendingGate):
        self.ctx = ctx
        self.limits = limits
        self.links = links
        self.new_jobs = new_jobs
        self.transitions = transitions
        self.gate = gate

    def submit(self, fields: dict, now: float, idempotency_key: str | None = None) -> tuple[Job, bool]:
        """Create a pending, unplaced job (service.Scheduler.submit places it).

        With an idempotency key, a repeat of the same request returns the job it
        created first (and False); the same key with another request is a Conflict.
        """
        digest = request_hash(fields) if idempotency_key else None
        # No transaction of its own: the insert (with its event) is the one write, and
        # the reads before it decide nothing that a write between them could change.
        # But one for the wait on other jobs, and for a user's request, whose audit entry
        # commits with the job (control-plane/server/audit_trail.py; on PostgreSQL the
        # insert alone would be one statement without a transaction).
        existing = self.new_jobs.by_key(idempotency_key, digest)
        if existing is not None:
            return existing, False
        fields = self.limits.check(fields)
        columns = self.new_jobs.columns(fields, now)
        self.gate.admit(1)
        depends_on = [(other, condition) for _, other, condition in fields.get("depends_on") or ()]
        with self.ctx.tx() if depends_on or audit_trail.pending() else contextlib.nullcontext():
            # The jobs it waits for, read in the transaction that records the wait: one that
            # ends meanwhile decides its condition then (dependents.py), or here.
            known = self.links.targets(depends_on)
            on_failure = columns.get("on_dependency_failure") or "cancel"
            extra, cancel = self.links.columns(depends_on, known, on_failure)
            # A twin request with the same key may commit between the look above and
            # this insert (several writers at once: PostgreSQL): the insert then adds
            # nothing (ON CONFLICT DO NOTHING, no failed statement to roll back) and
            # this request answers with the twin's job, as if it had come second.
            inserted = self.new_jobs.insert([dict(columns, idempotency_key=idempotency_key, request_hash=digest,
                                                  **extra)], now, skip_duplicate_key=bool(idempotency_key))
            if not inserted:
                return self.new_jobs.by_key(idempotency_key, digest), False  # type: ignore[return-value]
            if depends_on:
                self.links.link(inserted[0], depends_on, known, now, cancel)
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
        with self.ctx.db.atomic():
            first = self.new_jobs.by_key(keys[0], digest)
            if first is not None:
                array = JobArray.get_by_id(first.array_id)
                return array, *array_ends(array.id), False
            fields = self.limits.check(fields)
            self.gate.admit(count)  # an array counts whole
            known = self.links.targets(depends_on)
            extra, cancel = self.links.columns(depends_on, known, fields.get("on_dependency_failure") or "cancel")
            array = JobArray.create(count=count, parallel=parallel, created_at=now)
            env = fields.get("env_vars") or {}
            rows = [dict(self.new_jobs.columns(dict(fields, env_vars={**env, "CORRAL_ARRAY_INDEX": str(i),
                                                                      "CORRAL_ARRAY_COUNT": str(count)}), now),
                         array_id=array.id, array_index=i, idempotency_key=keys[i], request_hash=digest, **extra)
                    for i in range(count)]
            created: list[Job] = []
            for start in range(0, count, INSERT_CHUNK):
                created += self.new_jobs.insert(rows[start:start + INSERT_CHUNK], now)
            for job in created if depends_on else ():
                self.links.link(job, depends_on, known, now, cancel)
            metrics.submitted(self.ctx.db, "array", count)
        return array, created[0].id, created[-1].id, True

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
        with self.ctx.db.atomic():
            known = self.limits.compute_nodes()
            errors = []
            items = list(items)
            for index, fields in enumerate(items):
                try:
                    items[index] = self.limits.check(fields, known)
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
                found: dict[str | None, Job] = {}
                for start in range(0, len(keys), INSERT_CHUNK):
                    found.update({job.idempotency_key: job for job in Job.select(
                        Job.id, Job.idempotency_key, Job.request_hash).where(
                        Job.idempotency_key.in_(keys[start:start + INSERT_CHUNK]))})
                for index, (key, digest) in enumerate(zip(keys, digests)):
                    job = found.get(key)
                    if job is not None and job.request_hash != digest:
                        raise Conflict(f"item {index}: {key_reused(str(key), job)}")
                    if job is not None:
                        existing[index] = job
            new = [i for i in range(len(items)) if i not in existing]
            self.gate.admit(len(new))  # the items an earlier copy created are not new
            linked = any(items[i].get("depends_on") for i in new)
            waits = self.links.batch(items, new, existing) if linked else {}
            rows = [dict(self.new_jobs.columns(items[i], now), idempotency_key=keys[i], request_hash=digests[i],
                         **(waits[i][1] if linked else {})) for i in new]
            created = self.new_jobs.insert(rows, now)
            ids = [job.id for job in created]
            by_index = dict(zip(new, created))
            by_index.update(existing)
            # Their conditions, then the cancellations (down the chain), once every row exists.
            cancels = []
            for i in new if linked else ():
                depends_on, _, statuses_known, cancel = waits[i]
                resolved = [(by_index[other[1]].id if isinstance(other, tuple) else other, condition)
                            for other, condition in depends_on]
                statuses = {(by_index[k[1]].id if isinstance(k, tuple) else k): v for k, v in statuses_known.items()}
                self.links.link(by_index[i], resolved, statuses, now, None)
                if cancel is not None:
                    cancels.append((by_index[i], cancel))
            for job, cancel in cancels:
                if job.status == "pending":
                    self.transitions.apply(job, lifecycle.dependency_failed(job, now, cancel), now)
            metrics.submitted(self.ctx.db, "batch", len(ids))
        return [by_index[i] for i in range(len(items))], bool(ids)
