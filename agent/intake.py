"""Taking jobs in.

The claimed ones the work loop starts (take_claimed), or, when the agent polls
(AGENT_LONG_POLL_SECS=0), pending ones whose `running` report is the claim (poll_once).
A job taken holds its slot in the job table from then on and is prepared on a thread of
its own (Preparer.prepare), so the work loop never waits for a download.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from corral.shared import states, wire
from corral.shared.clients import Rejected, SchedulerClient, Unreachable

from . import spans
from .jobs import END_FENCED, JobTable, LocalJob
from .prepare import Plan, Preparer, plan_of
from .reconcile import Key, job_key
from .reports import Outbox
from .settings import AgentSettings
from .stop_terms import stop_terms

log = logging.getLogger(__name__)


@dataclass
class Intake:
    """What taking jobs in needs of the rest of the agent (made by Agent.startup)."""
    settings: AgentSettings
    scheduler: SchedulerClient
    jobs: JobTable
    outbox: Outbox
    preparer: Preparer
    clock: Callable[[], float]
    stopping: threading.Event
    free_slots: Callable[[], int]
    lease_lapsed: Callable[[], bool]
    disk_low: Callable[[], bool]  # under the free-space floor: no new work
    node_side_message: Callable[[str], str]  # a job's end for the node's reason (Endings.node_side_message)
    limits_enforced: Callable[[], bool]
    applied_limits: Callable[[dict], dict]
    private_tmp: bool
    taken: Callable[[], None]  # the claimed jobs were taken (Claims.taken)

    def poll_once(self) -> list[Key]:
        """Ask for pending jobs placed on this node and take as many as fit.

        The `running` report goes first and the job is prepared and started only if
        it was accepted: an accepted report is the claim, so two agents never both
        run one attempt. Returns the (job_id, attempt) pairs taken.
        """
        node_id = self.settings.node_id
        if self.stopping.is_set() or self.free_slots() <= 0 or self.lease_lapsed() or self.disk_low():
            return []
        taken: list[Key] = []
        for job in self.scheduler.pending_for(node_id):
            if self.free_slots() <= 0:
                break
            try:
                job_id, attempt = job_key(job)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("ignoring a malformed job from the scheduler (%s): %r", exc, job)
                continue
            # A newer attempt of a job we still run waits until reconcile ended the old one.
            if self.jobs.holds_job(job_id):
                continue
            plan = plan_of(self.settings, job)
            enforced = self.limits_enforced()
            try:
                self.scheduler.report(job_id, node_id, attempt, states.RUNNING, limits_enforced=enforced,
                                      limits=self.applied_limits(plan.limits) if enforced else None,
                                      private_tmp=self.private_tmp)
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
                self.jobs.add(local)
                self.start_preparing(local, job, plan)
            taken.append((job_id, attempt))
        if self.outbox:
            self.outbox.flush()  # jobs that could not start are reported at once
        return taken

    def take_claimed(self) -> list[Key]:
        """Start preparing the claimed jobs (the work loop's thread). A job whose older attempt
        still ends here waits for it; with the lease lapsed a job is given back at once."""
        if self.stopping.is_set() or not self.jobs.has_claimed():
            self.taken()
            return []
        accepted: list[tuple[LocalJob, dict, Plan]] = []
        node_id = self.settings.node_id

        def start(key: Key, job: dict) -> LocalJob | None:
            if self.lease_lapsed():
                log.warning("job %s attempt %s was claimed but the lease lapsed; giving it back", *key)
                self.outbox.add_failed(*key, -1, self.node_side_message(END_FENCED), requeue=True,
                                       attempt_span=spans.failed_attempt(job, *key, node_id, END_FENCED))
                return None
            plan = plan_of(self.settings, job)
            local = self.accept(job, key[0], key[1], plan)
            if local is not None:
                accepted.append((local, job, plan))
            return local

        taken = self.jobs.take_claimed(start)
        for local, job, plan in accepted:
            self.start_preparing(local, job, plan)
        self.taken()
        return taken

    def accept(self, job: dict, job_id: str, attempt: int, plan: Plan) -> LocalJob | None:
        """The LocalJob that holds the job's slot from now on, or None when it cannot run
        here (reported failed)."""
        node_id = self.settings.node_id
        if plan.error:
            log.warning("job %s attempt %s cannot run here: %s", job_id, attempt, plan.error)
            self.outbox.add_failed(job_id, attempt, -1, plan.error, attempt_span=spans.failed_attempt(
                job, job_id, attempt, node_id, "cannot run here"))
            return None
        now = self.clock()
        timeout = job.get("timeout_secs")
        deadline = None
        # Only `run` jobs time out, counted from the claim as the scheduler does; a
        # service runs until it exits or is stopped.
        if plan.job_type == wire.JOB_RUN and isinstance(timeout, (int, float)) \
                and not isinstance(timeout, bool) and timeout > 0:
            deadline = now + timeout
        trace = spans.attempt_context(job)
        terms = stop_terms(job)
        return LocalJob(job_id, attempt, plan.job_type, self.settings.work_dir(job_id, attempt), now,
                        deadline, memory_mb=plan.memory_mb, disk_mb=_disk_mb(job.get("disk_mb")), trace=trace,
                        gpus=_gpus(job.get("gpus_assigned")),
                        span=spans.start_attempt(job, trace, job_id, attempt, node_id), stop=terms,
                        warn_at=terms.warn_at(deadline),
                        deadline_epoch=None if deadline is None else time.time() + (deadline - now))

    def start_preparing(self, local: LocalJob, job: dict, plan: Plan) -> None:
        threading.Thread(target=self.preparer.prepare, args=(local, job, plan), daemon=True,
                         name=f"prepare-{local.job_id}-{local.attempt}").start()


def _gpus(value: object) -> tuple[str, ...]:
    """A claim's `gpus_assigned` (None or a list of UUIDs; anything else: none)."""
    if isinstance(value, list) and all(isinstance(uuid, str) for uuid in value):
        return tuple(value)
    return ()


def _disk_mb(value: object) -> int | None:
    """A claimed job's disk limit: a positive whole number of MB, else none (a scheduler
    of a release before disk limits sends none)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
