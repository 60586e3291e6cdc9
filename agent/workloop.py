"""The agent's work loop, one pass at a time: `tick(now)` checks the jobs (reap:
timeouts, ends, reports), starts what was claimed, and every POLL_INTERVAL_SECS
compares with the scheduler (reconcile) or, when the agent polls, asks for work.
daemon.py calls it after each wake-up (a claim, a job's output closing) or
daemon.TICK_SECS; tests drive it step by step with their own clock.

Failures never end the loop: a failed reap is retried after a backoff (0.5 s
doubling to 30 s), a failed poll or reconcile too (1 s to 30 s), each logged.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from corral.shared.backoff import Backoff
from corral.shared.clients import ClientError, Rejected

from .refusals import RefusedBackoff, credential_refused

if TYPE_CHECKING:
    from .agent import Agent

log = logging.getLogger(__name__)


class WorkLoop:
    def __init__(self, agent: Agent, now: float, claims: bool, once: bool = False):
        """`claims`: a claim thread takes work (long-poll), so the loop only
        reconciles; else it polls. `once`: take work from one successful poll only
        (corral-agent --once)."""
        self.agent = agent
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
        return self.once and self.polled and self.agent.only_services_left()

    def tick(self, now: float) -> None:
        agent = self.agent
        if now >= self.next_reap:
            try:
                agent.reap_once()
                self.reap_backoff.reset()
            except Exception:
                delay = self.reap_backoff.next()
                log.exception("checking jobs failed; retrying in %.1fs", delay)
                self.next_reap = agent._clock() + delay
        agent.take_claimed()
        if self.claims and agent.long_poll:
            # Long-poll: the claim thread takes work; compare with the scheduler every
            # poll interval (cancelled, moved, timed-out jobs end here).
            if now >= self.next_poll:
                self.next_poll = agent.reconcile_paced(self.poll_backoff)
        # A freed slot means poll now, unless the scheduler is failing (then the backoff
        # decides).
        elif now >= self.next_poll or (self.poll_ok and agent.slot_freed.is_set()):
            agent.slot_freed.clear()
            try:
                agent.reconcile_once()
                if not (self.once and self.polled):
                    agent.poll_once()
                    self.polled = True
                self.poll_backoff.reset()
                if self.poll_refused is not None:
                    self.poll_refused.accepted()
                self.poll_ok = True
                self.next_poll = agent._clock() + agent.settings.poll_interval
            except Exception as exc:
                self.poll_ok = False
                if isinstance(exc, Rejected) and credential_refused(exc):
                    if self.poll_refused is None:
                        self.poll_refused = agent.membership.refused_backoff("scheduler",
                                                                            "asking the scheduler for work")
                    self.next_poll = agent._clock() + self.poll_refused.after(exc)
                    return
                delay = self.poll_backoff.next()
                if isinstance(exc, ClientError):
                    log.warning("asking the scheduler for work failed: %s; retrying in %.1fs", exc, delay)
                else:
                    log.exception("asking the scheduler for work failed; retrying in %.1fs", delay)
                self.next_poll = agent._clock() + delay
