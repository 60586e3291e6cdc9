"""The agent's work loop, one pass at a time.

`tick(now)` checks the jobs (reap: timeouts, ends, reports), starts what was claimed,
and every POLL_INTERVAL_SECS compares with the scheduler (reconcile) or, when the agent
polls, asks for work. daemon.py calls it after each wake-up (a claim, a job's output
closing) or daemon.TICK_SECS; tests drive it step by step with their own clock.

Failures never end the loop: a failed reap is retried after a backoff (0.5 s
doubling to 30 s), a failed poll or reconcile too (1 s to 30 s), each logged.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from corral.shared.backoff import Backoff
from corral.shared.clients import ClientError, Rejected

from .refusals import RefusedBackoff, credential_refused

log = logging.getLogger(__name__)


@dataclass
class Steps:
    """The one-pass steps a tick runs, each of one of the agent's parts, and what paces them."""
    reap: Callable[[], object]  # Agent.reap_once
    take_claimed: Callable[[], object]  # Intake.take_claimed
    reconcile: Callable[[], object]  # Reconciler.reconcile_once
    reconcile_paced: Callable[[Backoff], float]  # Reconciler.reconcile_paced: when the next one is due
    poll: Callable[[], object]  # Intake.poll_once
    only_services_left: Callable[[], bool]
    refused_backoff: Callable[[str, str], RefusedBackoff]  # Membership.refused_backoff
    slot_freed: threading.Event  # a job ended: poll at once
    clock: Callable[[], float]
    poll_interval: float
    long_poll: bool


class WorkLoop:
    def __init__(self, steps: Steps, now: float, claims: bool, once: bool = False):
        """`claims`: a claim thread takes work (long-poll), so the loop only
        reconciles; else it polls. `once`: take work from one successful poll only
        (corral-agent --once)."""
        self.steps = steps
        self.claims = claims
        self.once = once
        self.reap_backoff = Backoff(0.5, 30.0)
        self.poll_backoff = Backoff(1.0, 30.0)
        self.poll_refused: RefusedBackoff | None = None  # made at the first refused credential
        self.next_reap = self.next_poll = now
        self.poll_ok = True
        self.polled = False  # once mode: a poll succeeded, take no more work

    def done(self) -> bool:
        """Once mode: the jobs of the one poll have ended (services may go on)."""
        return self.once and self.polled and self.steps.only_services_left()

    def tick(self, now: float) -> None:
        steps = self.steps
        if now >= self.next_reap:
            try:
                steps.reap()
                self.reap_backoff.reset()
            except Exception:
                delay = self.reap_backoff.next()
                log.exception("checking jobs failed; retrying in %.1fs", delay)
                self.next_reap = steps.clock() + delay
        steps.take_claimed()
        if self.claims and steps.long_poll:
            # Long-poll: the claim thread takes work; compare with the scheduler every
            # poll interval (cancelled, moved, timed-out jobs end here).
            if now >= self.next_poll:
                self.next_poll = steps.reconcile_paced(self.poll_backoff)
        # A freed slot means poll now, unless the scheduler is failing (then the backoff
        # decides).
        elif now >= self.next_poll or (self.poll_ok and steps.slot_freed.is_set()):
            steps.slot_freed.clear()
            try:
                steps.reconcile()
                if not (self.once and self.polled):
                    steps.poll()
                    self.polled = True
                self.poll_backoff.reset()
                if self.poll_refused is not None:
                    self.poll_refused.accepted()
                self.poll_ok = True
                self.next_poll = steps.clock() + steps.poll_interval
            except Exception as exc:
                self.poll_ok = False
                if isinstance(exc, Rejected) and credential_refused(exc):
                    if self.poll_refused is None:
                        self.poll_refused = steps.refused_backoff("scheduler", "asking the scheduler for work")
                    self.next_poll = steps.clock() + self.poll_refused.after(exc)
                    return
                delay = self.poll_backoff.next()
                if isinstance(exc, ClientError):
                    log.warning("asking the scheduler for work failed: %s; retrying in %.1fs", exc, delay)
                else:
                    log.exception("asking the scheduler for work failed; retrying in %.1fs", delay)
                self.next_poll = steps.clock() + delay
