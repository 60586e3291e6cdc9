"""What the API, the SQS intake and the background loops ask of the scheduler.

The store applies the change (its state decided by lifecycle.py), then placement fills
the slots it freed or the work it added, an explicit step never hidden in a write.

Placement runs under the placement lock (`placing()`): PostgreSQL's advisory locks,
per node, taken before any row lock (so nothing waits in a cycle, and placements on
different nodes run side by side); SQLite's one writer. How a write and its
placement share transactions is each backend's (backends/write_then_place.py;
docs/dispatch.md says what a batch of reports with a claim does).
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TypeVar

from corral.server.backends.base import Backend
from corral.server.backends.lookup import backend_of

from .models import Job
from .outcomes import ItemOutcome, JobState
from .store import Store

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")


@dataclass
class Scheduler:
    store: Store

    @property
    def backend(self) -> Backend:
        return backend_of(self.store.db)

    def open_nodes(self) -> Collection[str]:
        """The nodes with a free slot now (read without a lock)."""
        return self.store.snapshot.open_nodes()

    @contextlib.contextmanager
    def placing(self, only_places: bool = False, nodes: Collection[str] | None = None, skip_busy: bool = False):
        """A transaction that may place: the placement lock first. `only_places`: it
        writes nothing but placement, which a crash may undo and the next pass redoes,
        so its commit does not wait for the disk (lock_placement's `recomputable`).
        `nodes`: it places on these nodes only (None: on any); `skip_busy`: on those
        of them no other placement holds (new work: lock_placement)."""
        with self.store.db.atomic():
            self.backend.lock_placement(self.store.db, recomputable=only_places, nodes=nodes, skip_busy=skip_busy)
            self.store.check_fence()  # a background loop's placement: still its lease's holder
            yield

    def _write_then_place(self, write: Callable[[], T], place: Callable[[T], R], nothing: R,
                          scope: Callable[[T], Collection[str] | None] = lambda result: None,
                          new_work: bool = False, only_places: bool = True,
                          scope_ahead: Collection[str] | None = None) -> tuple[T, R]:
        """A write (`write()`) and the placement it calls for (`place(result)`, else
        `nothing`), on the nodes `scope(result)` names (None: any; none: no placement).
        `new_work`: the write only added work (a submit), so placement needs a free
        slot somewhere, and locks only the nodes that have one. `only_places`: `place`
        writes nothing else (no claim), so its commit need not wait for the disk
        (placing()).

        How the write and its placement share transactions is the backend's
        strategy (control-plane/server/backends/write_then_place.py): one transaction
        with one writer at a time (SQLite); the write committed first, then its
        placement under the lock of the nodes it places on, with several (PostgreSQL).

        `scope_ahead`: a superset of `scope(result)` known before the write (reports
        that cannot send a job back to pending, so they free only their own nodes'
        slots), which lets the strategy lock those nodes first and keep the write and
        its placement in one transaction.
        """
        return self.backend.write_then_place(self, write, place, nothing, scope, new_work, only_places,
                                             scope_ahead)

    def _add_then_place(self, add: Callable[[], tuple[T, bool]], now: float) -> tuple[tuple[T, bool], int]:
        """New work: `add()` stores it and says whether it created any (a repeated
        idempotency key creates none); then the jobs placed (_write_then_place)."""
        # Any count MAX_PENDING_JOBS needs is made now, not under the write lock (SQLite).
        self.store.admission.refresh()
        return self._write_then_place(add, lambda result: self.store.placing.dispatch(now, first_only=True), 0,
                                      scope=lambda result: None if result[1] else set(), new_work=True)

    def submit(self, fields: dict, now: float, idempotency_key: str | None = None) -> tuple[Job, bool]:
        """A new job, placed when a node has room. With an idempotency key, a repeat of
        the same request answers the job it created first (and False)."""
        (job, created), placed = self._add_then_place(
            lambda: self.store.submits.submit(fields, now, idempotency_key), now)
        return (self.store.jobs.get(job.job_id) if placed else job), created

    def submit_batch(self, items: list[dict], now: float, idempotency_key: str | None = None
                     ) -> tuple[list[Job], bool]:
        """Many jobs in one transaction (all or nothing), then placed."""
        (jobs, created), placed = self._add_then_place(
            lambda: self.store.submits.submit_batch(items, now, idempotency_key), now)
        # Read back after the commit (outside the lock): with a key, every job (of those an
        # earlier copy of the batch created, the store read only the ids), else the placed ones.
        if idempotency_key:
            return self.store.jobs.reload(jobs), created
        return (self.store.jobs.with_placements(jobs) if placed else jobs), created

    def submit_array(self, fields: dict, now: float, idempotency_key: str | None = None):
        """An array of jobs (Submits.submit_array), placed as far as nodes have room and
        its `parallel` allows."""
        def add():
            array, first, last, created = self.store.submits.submit_array(fields, now, idempotency_key)
            return (array, first, last), created
        (result, created), _ = self._add_then_place(add, now)
        return (*result, created)

    def cancel_array(self, array_id: str, now: float) -> None:
        """Cancel what has not finished of an array; the slots it held go to waiting work."""
        with self.placing():
            freed = self.store.actions.cancel_array(array_id, now)
            if freed:
                self.store.placing.dispatch(now, freed)

    def limits_changed(self, now: float) -> int:
        """A concurrency limit was set or raised: place what it held back."""
        return self.place(now)

    def report(self, job_id: str, report: dict, now: float) -> Job:
        """An agent's report; a job that ended (or went back to pending) freed its slot."""
        def offered(job: Job) -> set[str] | None:
            return _offered_work([(report["node_id"], job.status)])

        job, placed = self._write_then_place(
            lambda: self.store.reports.report(job_id, report, now),
            lambda job: self.store.placing.dispatch(now, offered(job)), 0, scope=offered)
        if placed and job.status == "pending":
            job = self.store.jobs.get(job_id)  # requeued: placement may have moved it since
        return job

    def report_batch(self, items: list, now: float, claim: tuple[str, dict] | None = None
                     ) -> tuple[list[ItemOutcome[JobState]], list[Job]]:
        """Many reports (each on its own), one placement for the slots they freed, and the
        claim riding on them (node_id, claim request): an agent's next work comes with
        the answer to its reports (no work when that placement failed: it claims again)."""
        def offered(results: list[ItemOutcome[JobState]]) -> set[str] | None:
            return _offered_work([(items[r.index][1]["node_id"], r.value.status)
                                  for r in results if r.error is None and r.value is not None])

        def scope(results: list[ItemOutcome[JobState]]) -> set[str] | None:
            nodes = offered(results)
            return nodes if nodes is None or claim is None else nodes | {claim[0]}

        def place_and_claim(results: list[ItemOutcome[JobState]]) -> list[Job]:
            nodes = offered(results)
            if nodes is None or nodes:
                self.store.placing.dispatch(now, nodes)
            if claim is None:
                return []
            # The claiming node's free slots were just offered the waiting work: no second look.
            return self._claim(claim[0], claim[1], now, offered=nodes is None or claim[0] in nodes)

        return self._write_then_place(lambda: self.store.reports.apply_reports(items, now), place_and_claim, [],
                                      scope=scope, only_places=claim is None,
                                      scope_ahead=_reported_nodes(items, claim))

    def claim(self, node_id: str, request: dict, now: float, poked: bool = False) -> list[Job]:
        """Take up to request['max'] jobs placed on the node (see Claims.take_placed). A
        claim that can take nothing writes nothing (no write transaction), as read
        first; but `poked`, a waiting claim that work placed on its node woke, skips that
        read where writers do not wait for each other (PostgreSQL): it almost always
        finds the work, and the read is a round trip on the dispatch path. (On SQLite
        a write transaction that finds nothing, the node's report-riding claim having
        taken it first, would hold up every other writer.)"""
        if not (poked and not self.backend.one_writer) and not self.store.claims.may_claim(node_id, now):
            return []  # nothing placed here and nothing to place
        with self.store.db.atomic():
            return self._claim(node_id, request, now)

    def _claim(self, node_id: str, request: dict, now: float, offered: bool = False) -> list[Job]:
        """The claim in the current transaction. `offered`: this transaction already offered
        the node's free slots the waiting work (what is left does not fit or is not due)."""
        free, fill_first = self.store.claims.claim_room(node_id, request, now)
        if free <= 0:
            return []
        if fill_first and not offered:
            self.store.placing.dispatch(now, [node_id])  # a slot is free here and work waits unplaced
        return self.store.claims.take_placed(node_id, request, free, now)

    def cancel(self, job_id: str, now: float) -> Job:
        """Cancel a pending or running job (its agent ends a running one); its slot is free."""
        with self.placing():
            job = self.store.actions.cancel(job_id, now)
            if job.node_id is not None:  # it held a slot there
                self.store.placing.dispatch(now, [job.node_id])
        return self.store.jobs.get(job_id)

    def retry(self, job_id: str, now: float) -> Job:
        """An operator's retry of a failed job, placed when a node has room."""
        with self.placing():
            self.store.actions.retry(job_id, now)
            self.store.placing.dispatch(now)
        return self.store.jobs.get(job_id)

    def place(self, now: float) -> int:
        """Placement on its own (the background pass: node changes, due retries), on
        the nodes that have a free slot (locked: the others' placements go on)."""
        if not self.store.claims.unplaced_due(now):
            return 0  # nothing waits: no node list read, no lock taken
        nodes = self.store.snapshot.open_nodes()
        if not nodes:
            return 0
        with self.placing(only_places=True, nodes=nodes, skip_busy=True):
            return self.store.placing.dispatch(now, deep=True)


def _reported_nodes(items: list, claim: tuple[str, dict] | None) -> set[str] | None:
    """The nodes whose slots these reports may free, with the claiming node: known
    before they are applied when every valid one says `done` or `running` (neither
    sends a job back to pending, which would offer work to every node); else None."""
    reports = [body for _, body in items if isinstance(body, dict)]
    if any(body["status"] not in ("done", "running") for body in reports):
        return None
    return {body["node_id"] for body in reports} | ({claim[0]} if claim else set())


def _offered_work(applied: list[tuple[str, str]]) -> set[str] | None:
    """The nodes whose free slots get the waiting work after these applied reports,
    (reporting node, new status) each; None for every node. A job back to pending is
    new work for any node; a job that ended freed a slot of its node, and only that
    node gets work (any other free slot got it when it came)."""
    if any(status == "pending" for _, status in applied):
        return None
    return {node_id for node_id, status in applied if status != "running"}
