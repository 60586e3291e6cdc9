"""Taking work by long-poll: the claim thread, and the claims that ride on reports.

The claim thread keeps one `POST /nodes/{id}/claim` waiting for as many jobs as there
are free slots; the scheduler answers the moment work is placed here, each job
already `running`. The jobs go to the job table's queue for the work loop (intake.py).
`sent` and `done` count the claims sent and those whose answer was handled, so that
reconcile reports a job it does not know only once every claim that might bring it
was handled.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from corral.shared.backoff import Backoff
from corral.shared.clients import ClientError, Rejected, SchedulerClient, Unreachable

from .jobs import JobTable
from .lease import Lease
from .reconcile import Key, job_key
from .refusals import RefusedBackoff, credential_refused

log = logging.getLogger(__name__)

# An idle claim thread (no free slot, lease lapsed) looks again at least this often.
CLAIM_IDLE_SECS = 1.0
# The longest a claim thread that got jobs waits for the work loop to take them before
# it asks for more (Claims.handed_over).
HANDOFF_SECS = 0.05


@dataclass
class ClaimsNeed:
    """What claiming needs of the rest of the agent."""
    node_id: str
    scheduler: SchedulerClient
    jobs: JobTable
    lease: Lease
    clock: Callable[[], float]
    stopping: threading.Event
    blocked: Callable[[], bool]  # no claims now (fencing, the free-space floor)
    free_slots: Callable[[], int]
    terms: Callable[[], dict]  # what a claim says of this node's limits (limits_enforced, default_limits, private_tmp)
    refused_backoff: Callable[[str, str], RefusedBackoff]
    work_wake: threading.Event  # set when jobs were queued: the work loop looks
    long_poll: bool
    long_poll_secs: float
    poll_interval: float


class Claims:
    def __init__(self, need: ClaimsNeed):
        self.need = need
        self.sent = 0  # claims sent
        self.done = 0  # claims whose answer was handled (queued or failed)
        self.running = False  # the claim thread runs
        self.wake = threading.Event()  # a slot freed: the claim thread asks at once
        self.handed_over = threading.Event()  # the work loop took what the last claim queued

    def claim_once(self, client: SchedulerClient | None = None, wait_secs: float = 0.0
                   ) -> tuple[list[Key], bool]:
        """One claim for as many jobs as there are free slots, waiting up to wait_secs
        for work. The jobs are already `running` in the scheduler; they are queued for
        the work loop (Intake.take_claimed). Returns their keys and whether to pause
        before the next claim (the scheduler could not wait). Raises ClientError."""
        need = self.need
        terms = need.terms()
        client = client or need.scheduler
        if need.stopping.is_set() or need.blocked():
            return [], False
        free = need.free_slots()
        if free <= 0:
            return [], False
        sequence = self.sent = self.sent + 1
        started = time.monotonic()
        sent_at = need.clock()
        try:
            result = client.claim(need.node_id, free, wait_secs, **terms)
            keys = self.queue(result.jobs, sent_at)
        except Unreachable:
            self.answer_lost()
            raise
        finally:
            self.done = sequence  # after the jobs are queued: see Reconciler.reconcile_once
        if result.not_waited == "again":  # work came while it waited: ask again at once
            return keys, False
        pause = result.not_waited is not None or (
            not keys and wait_secs > 0 and time.monotonic() - started < wait_secs / 2)
        return keys, pause

    def taken(self) -> None:
        """The work loop took what was queued: the claim thread may ask for more."""
        self.handed_over.set()

    def answer_lost(self) -> None:
        """A claim got no answer: it may have handed out jobs all the same. Renew at the
        lease thread's next beat, whose answer lists them (Membership.end_stale), instead of
        seldom later (Lease.due)."""
        self.need.lease.renew_soon()

    def queue(self, jobs: list, sent_at: float) -> list[Key]:
        """Queue claimed jobs (already `running` in the scheduler) for the work loop.
        The claim, sent at `sent_at`, renewed the lease when it handed out jobs."""
        if jobs:
            self.need.lease.evidence(sent_at)
        claimed = []
        for job in jobs:
            try:
                claimed.append((job_key(job), job))
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("ignoring a malformed claimed job from the scheduler (%s): %r", exc, job)
        self.need.jobs.queue(claimed)
        keys = [key for key, _ in claimed]
        if keys:
            self.handed_over.clear()
            self.need.work_wake.set()
        return keys

    def riding(self) -> dict | None:
        """The claim to send with reports (POST /jobs/reports `claim`) for the slots free
        now, or None: the claim thread takes work otherwise (long-poll only)."""
        need = self.need
        if not (self.running and need.long_poll) or need.stopping.is_set() or need.blocked():
            return None
        free = need.free_slots()
        if free <= 0:
            return None
        return {"node_id": need.node_id, "max": free, **need.terms()}

    def loop(self, stop: threading.Event) -> None:
        """The claim thread: keep one long-poll claim open while there are free slots.
        Failures and refusals back off and never end it."""
        need = self.need
        client = need.scheduler.clone()
        backoff = Backoff(1.0, 30.0)
        refused = need.refused_backoff("scheduler", "claiming work")
        wait_secs = need.long_poll_secs
        try:
            while not stop.is_set() and not need.stopping.is_set():
                if need.blocked() or need.free_slots() <= 0:
                    self.wake.wait(CLAIM_IDLE_SECS)
                    self.wake.clear()
                    continue
                try:
                    keys, pause = self.claim_once(client, wait_secs)
                    backoff.reset()
                    refused.accepted()
                    if keys:
                        self.handed_over.wait(HANDOFF_SECS)
                except Rejected as exc:
                    if credential_refused(exc):
                        delay = refused.after(exc)
                    else:
                        delay = backoff.next()
                        log.warning("the scheduler refused a claim (%s); retrying in %.1fs", exc, delay)
                    stop.wait(delay)
                    continue
                except ClientError as exc:
                    delay = backoff.next()
                    log.warning("claiming work failed: %s; retrying in %.1fs", exc, delay)
                    stop.wait(delay)
                    continue
                except Exception:
                    delay = backoff.next()
                    log.exception("claiming work failed; retrying in %.1fs", delay)
                    stop.wait(delay)
                    continue
                if pause:  # the scheduler could not wait (busy): ask again after the poll interval
                    stop.wait(need.poll_interval)
        finally:
            client.close()
