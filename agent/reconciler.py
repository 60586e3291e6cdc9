"""Acting on the difference between what runs here and what the scheduler lists.

It kills what the scheduler ended and reports what this agent lost. The decisions are
reconcile.py's (pure); this part asks, kills and reports.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from corral.shared.backoff import Backoff
from corral.shared.clients import ClientError, SchedulerClient

from . import reconcile
from .claims import Claims
from .jobs import END_RECONCILED, JobTable, LocalJob
from .membership import Membership
from .reconcile import Key, listed_keys
from .reports import Outbox
from .settings import AgentSettings

log = logging.getLogger(__name__)


@dataclass
class Reconciler:
    """What reconciling needs of the rest of the agent (made by Agent.startup)."""
    settings: AgentSettings
    scheduler: SchedulerClient
    jobs: JobTable
    outbox: Outbox
    claims: Claims  # the claims sent and handled (Claims.sent, Claims.done)
    membership: Membership  # whether work is held, and what the last lease answer listed
    end: Callable[[LocalJob, str], bool]  # Endings.end
    take_claimed: Callable[[], object]  # Intake.take_claimed
    clock: Callable[[], float]
    # Jobs the scheduler lists here that this agent does not know, with the claims
    # sent by then (reconcile.lost_here).
    suspects: dict[Key, int] = field(default_factory=dict)

    def reconcile_once(self) -> list[Key]:
        """Compare what runs here with what the scheduler thinks runs here.

        A local job missing from the scheduler's running list was ended there
        (timed out, moved, cancelled): kill it (a service also leaves the registry),
        do not report; a claimed job not started yet is simply dropped. Only jobs
        known before the request was sent count, since their claim (or `running`
        report) was accepted before it. A job listed as running here that this agent
        neither runs nor still has a report for was lost (a restart, a claim whose
        answer never arrived, a service that ended while no agent watched it): it is
        reported failed so it does not hold the node forever. With long-poll, a
        claim may be on its way back while the list is read, so such a job is
        reported only once every claim sent before the list was read has been
        handled (a later reconcile, at most one long poll later).
        Returns the keys of the jobs killed.
        """
        self.take_claimed()
        known = self.jobs.keys() | set(self.jobs.claimed_keys())
        listed, malformed = listed_keys(self.scheduler.running_on(self.settings.node_id))
        for job in malformed:
            log.warning("ignoring a malformed job from the scheduler: %r", job)
        claims_sent = self.claims.sent  # read after the list: claims that may be in it
        killed = []
        for key in reconcile.ended_there(known, listed):
            local = self.jobs.get(key)
            if local is None:
                if self.jobs.drop_claimed(key):
                    log.info("job %s attempt %s was ended by the scheduler before it started here; "
                             "not starting it", *key)
                continue
            if local.end_reason is not None:
                continue
            log.warning("job %s attempt %s is no longer running here according to the scheduler; "
                        "killing it", *key)
            self.end(local, END_RECONCILED)
            killed.append(key)
        claims_done = self.claims.done  # before looking at the queue: what was handled is in it
        known = self.jobs.keys() | set(self.jobs.claimed_keys()) | {(r.job_id, r.attempt) for r in self.outbox}
        lost, self.suspects = reconcile.lost_here(listed, known, self.suspects, claims_sent, claims_done)
        for key in lost:
            log.warning("job %s attempt %s is running on this node according to the scheduler, "
                        "but this agent does not run it; reporting it failed", *key)
            # The node's doing, not the job's (the job may never have started): it goes
            # back to pending without spending a retry, like a node loss.
            self.outbox.add_failed(*key, -1, f"the agent on node {self.settings.node_id} was not running "
                                           "this job (it restarted or lost track of it)", requeue=True)
        return killed

    def reconcile_paced(self, backoff: Backoff) -> float:
        """reconcile_once; when the next one is due. An idle agent (no job held or
        claimed) skips it unless its last lease answer listed attempts it does not
        hold: that answer (once a minute when idle, and soon after a claim that got
        no answer) already says what runs here, and an idle agent has nothing to
        kill, so a fleet of idle agents sends no reconcile requests (one every
        POLL_INTERVAL_SECS per agent otherwise)."""
        if not self.membership.holds_work() and not self.membership.unknown_listed:
            return self.clock() + self.settings.poll_interval
        try:
            self.reconcile_once()
            self.membership.unknown_listed = False  # (a renewal meanwhile that lists one again sets it again)
            backoff.reset()
            return self.clock() + self.settings.poll_interval
        except Exception as exc:
            delay = backoff.next()
            if isinstance(exc, ClientError):
                log.warning("checking jobs with the scheduler failed: %s; retrying in %.1fs", exc, delay)
            else:
                log.exception("checking jobs with the scheduler failed; retrying in %.1fs", delay)
            return self.clock() + delay
