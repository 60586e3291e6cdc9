"""Taking work: by long-poll (the claim thread, and the claims that ride on
reports), or by polling as the original design's agents do (poll_once).

The claim thread keeps one `POST /nodes/{id}/claim` waiting on the scheduler for as
many jobs as the agent has free slots; the scheduler answers the moment work is
placed on the node, each job already `running` for its attempt. The jobs go to the
agent's job table (queue), and the thread asks again once the work loop has taken
them (handed_over) or after HANDOFF_SECS. A claim that handed out jobs renewed the
lease (counted from when it was sent); a claim whose answer never came may have, so
the lease is renewed soon, and its answer lists what it handed out. Reports of
ended jobs carry a claim for the slots they free (riding), so a busy node gets its
next jobs in the same round trip. Failures and refusals back off and never end the
thread. `sent` and `done` count the claims sent and those whose answer was handled:
reconcile reports a job it does not know only once every claim that might bring
it was handled.

Polling (AGENT_LONG_POLL_SECS=0) asks `GET /jobs?node_id=..&status=pending`; the
`running` report goes first and is the claim.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from corral.shared.backoff import Backoff
from corral.shared.clients import ClientError, Rejected, SchedulerClient, Unreachable

from . import spans
from .jobs import END_FENCED, LocalJob
from .prepare import Plan
from .reconcile import Key, job_key
from .refusals import credential_refused

if TYPE_CHECKING:
    from .agent import Agent

log = logging.getLogger(__name__)

# An idle claim thread (no free slot, lease lapsed) looks again at least this often.
CLAIM_IDLE_SECS = 1.0
# The longest a claim thread that got jobs waits for the work loop to take them before
# it asks for more (Claims.handed_over).
HANDOFF_SECS = 0.05


class Claims:
    def __init__(self, agent: Agent):
        self.agent = agent
        self.sent = 0  # claims sent
        self.done = 0  # claims whose answer was handled (queued or failed)
        self.running = False  # the claim thread runs
        self.wake = threading.Event()  # a slot freed: the claim thread asks at once
        self.handed_over = threading.Event()  # the work loop took what the last claim queued

    def claim_once(self, client: SchedulerClient | None = None, wait_secs: float = 0.0
                   ) -> tuple[list[Key], bool]:
        """One claim for as many jobs as there are free slots, waiting up to wait_secs
        for work. The jobs are already `running` in the scheduler; they are queued for
        the work loop (take_claimed). Returns their keys and whether to pause before the
        next claim (the scheduler could not wait). Raises ClientError."""
        self.agent._require_startup()
        client = client or self.agent.scheduler
        if self.agent._stopping or self.agent.claims_blocked():
            return [], False
        free = self.agent.free_slots()
        if free <= 0:
            return [], False
        sequence = self.sent = self.sent + 1
        started = time.monotonic()
        sent_at = self.agent._clock()
        try:
            result = client.claim(self.agent.node_id, free, wait_secs, limits_enforced=self.agent.limits_enforced(),
                                  default_limits=self.agent.default_limits(), private_tmp=bool(self.agent.private_tmp))
            keys = self.queue(result.jobs, sent_at)
        except Unreachable:
            self.answer_lost()
            raise
        finally:
            self.done = sequence  # after the jobs are queued: see reconcile_once
        if result.not_waited == "again":  # work came while it waited: ask again at once
            return keys, False
        pause = result.not_waited is not None or (
            not keys and wait_secs > 0 and time.monotonic() - started < wait_secs / 2)
        return keys, pause

    def answer_lost(self) -> None:
        """A claim got no answer: it may have handed out jobs all the same. Renew at the
        lease thread's next beat, whose answer lists them (Membership.end_stale), instead of
        seldom later (Lease.due)."""
        self.agent.membership.lease.renew_soon()

    def queue(self, jobs: list, sent_at: float) -> list[Key]:
        """Queue claimed jobs (already `running` in the scheduler) for the work loop.
        The claim, sent at `sent_at`, renewed the lease when it handed out jobs."""
        if jobs:
            self.agent.membership.lease.evidence(sent_at)
        claimed = []
        for job in jobs:
            try:
                claimed.append((job_key(job), job))
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("ignoring a malformed claimed job from the scheduler (%s): %r", exc, job)
        self.agent.jobs.queue(claimed)
        keys = [key for key, _ in claimed]
        if keys:
            self.handed_over.clear()
            self.agent._work_wake.set()
        return keys

    def riding(self) -> dict | None:
        """The claim to send with reports (POST /jobs/reports `claim`) for the slots free
        now, or None: the claim thread takes work otherwise (long-poll only)."""
        if not (self.running and self.agent.long_poll) or self.agent._stopping \
                or self.agent.claims_blocked():
            return None
        free = self.agent.free_slots()
        if free <= 0:
            return None
        return {"node_id": self.agent.node_id, "max": free, "limits_enforced": self.agent.limits_enforced(),
                "private_tmp": bool(self.agent.private_tmp), "default_limits": self.agent.default_limits()}

    def loop(self, stop: threading.Event) -> None:
        """The claim thread: keep one long-poll claim open while there are free slots.
        Failures and refusals back off and never end it."""
        client = self.agent.scheduler.clone()
        backoff = Backoff(1.0, 30.0)
        refused = self.agent.membership.refused_backoff("scheduler", "claiming work")
        wait_secs = self.agent.settings.long_poll_secs
        try:
            while not stop.is_set() and not self.agent._stopping:
                if self.agent.claims_blocked() or self.agent.free_slots() <= 0:
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
                    stop.wait(self.agent.settings.poll_interval)
        finally:
            client.close()

    def poll_once(self) -> list[Key]:
        """Ask for pending jobs placed on this node and take as many as fit.

        The `running` report goes first and the job is prepared and started only if
        it was accepted: an accepted report is the claim, so two agents never both
        run one attempt. Returns the (job_id, attempt) pairs taken.
        """
        agent = self.agent
        agent._require_startup()
        if agent._stopping or agent.free_slots() <= 0 or agent.lease_lapsed() or agent.disk.low is not None:
            return []
        taken: list[Key] = []
        for job in agent.scheduler.pending_for(agent.node_id):
            if agent.free_slots() <= 0:
                break
            try:
                job_id, attempt = job_key(job)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("ignoring a malformed job from the scheduler (%s): %r", exc, job)
                continue
            # A newer attempt of a job we still run waits until reconcile ended the old one.
            if agent.jobs.holds_job(job_id):
                continue
            plan = agent.plan(job)
            enforced = self.agent.limits_enforced()
            try:
                agent.scheduler.report(job_id, agent.node_id, attempt, "running", limits_enforced=enforced,
                                       limits=agent.applied_limits(plan.limits) if enforced else None,
                                       private_tmp=bool(agent.private_tmp))
            except Rejected as exc:
                log.info("job %s attempt %s is not ours to start (%s); skipping it", job_id, attempt, exc)
                continue
            except Unreachable as exc:
                # We cannot know whether the claim landed. If it did, reconcile finds
                # the job running here without a process and reports it failed.
                log.warning("could not report job %s attempt %s running (%s); not starting it",
                            job_id, attempt, exc)
                break
            local = self.accept(job, job_id, attempt, plan)
            if local is not None:
                agent.jobs.add(local)
                self.start_preparing(local, job, plan)
            taken.append((job_id, attempt))
        if agent.outbox:
            agent.flush_reports()  # jobs that could not start are reported at once
        return taken

    def take_claimed(self) -> list[Key]:
        """Start preparing the claimed jobs (the work loop's thread). A job whose older attempt
        still ends here waits for it; with the lease lapsed a job is given back at once."""
        agent = self.agent
        if agent._stopping or not agent.jobs.has_claimed():
            self.handed_over.set()
            return []
        accepted: list[tuple[LocalJob, dict, Plan]] = []

        def start(key: Key, job: dict) -> LocalJob | None:
            if agent.lease_lapsed():
                log.warning("job %s attempt %s was claimed but the lease lapsed; giving it back", *key)
                assert agent.endings is not None  # made by startup, before any claim
                agent.outbox.add_failed(*key, -1, agent.endings.node_side_message(END_FENCED), requeue=True,
                                        attempt_span=spans.failed_attempt(job, *key, agent.node_id, END_FENCED))
                return None
            plan = agent.plan(job)
            local = self.accept(job, key[0], key[1], plan)
            if local is not None:
                accepted.append((local, job, plan))
            return local

        taken = agent.jobs.take_claimed(start)
        for local, job, plan in accepted:
            self.start_preparing(local, job, plan)
        self.handed_over.set()
        return taken

    def accept(self, job: dict, job_id: str, attempt: int, plan: Plan) -> LocalJob | None:
        """The LocalJob that holds the job's slot from now on, or None when it cannot run
        here (reported failed)."""
        if plan.error:
            log.warning("job %s attempt %s cannot run here: %s", job_id, attempt, plan.error)
            self.agent.outbox.add_failed(job_id, attempt, -1, plan.error, attempt_span=spans.failed_attempt(
                job, job_id, attempt, self.agent.node_id, "cannot run here"))
            return None
        now = self.agent._clock()
        timeout = job.get("timeout_secs")
        deadline = None
        # Only `run` jobs time out, counted from the claim as the scheduler does; a
        # service runs until it exits or is stopped.
        if plan.job_type == "run" and isinstance(timeout, (int, float)) \
                and not isinstance(timeout, bool) and timeout > 0:
            deadline = now + timeout
        trace = spans.attempt_context(job)
        return LocalJob(job_id, attempt, plan.job_type, self.agent.work_dir(job_id, attempt), now,
                        deadline, memory_mb=plan.memory_mb, disk_mb=_disk_mb(job.get("disk_mb")), trace=trace,
                        span=spans.start_attempt(job, trace, job_id, attempt, self.agent.node_id))

    def start_preparing(self, local: LocalJob, job: dict, plan: Plan) -> None:
        assert self.agent._preparer is not None  # made by startup, before any claim
        threading.Thread(target=self.agent._preparer.prepare, args=(local, job, plan), daemon=True,
                         name=f"prepare-{local.job_id}-{local.attempt}").start()


def _disk_mb(value: object) -> int | None:
    """A claimed job's disk limit: a positive whole number of MB, else none (a scheduler
    of a release before disk limits sends none)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
