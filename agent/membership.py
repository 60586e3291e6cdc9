"""The agent's standing with the control plane.

Registered with the registry and heartbeating there, its lease with the scheduler
renewed, and its run jobs fenced when the lease lapses. The lease's bookkeeping is pure
(lease.py); here are its I/O and what its answers mean for the jobs held.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from corral.shared.backoff import Backoff
from corral.shared.clients import ClientError, Rejected, RegistryClient, SchedulerClient

from . import gpus, reconcile
from .jobs import END_FENCED, END_RECONCILED, JobTable, LocalJob
from .lease import Lease
from .reconcile import Key, listed_keys
from .refusals import RefusedBackoff, credential_refused
from .settings import AgentSettings, total_memory_mb
from .usage import Meter

log = logging.getLogger(__name__)

# Lease renewals must not hang for long: a renewal stuck on a slow read is one that
# cannot be retried before the lease runs out.
LEASE_TIMEOUT = (3.05, 5.0)
# The longest `refusing_work` the registry takes.
REFUSING_WORK_MAX = 1024
# How often the fence thread looks at the lease.
FENCE_SECS = 0.1


class Membership:
    """The heartbeat and the lease renewal run on threads of their own (`beat`), so a
    slow registry never delays a renewal nor the other way round; failures are retried
    sooner than the interval, never later. An attempt the scheduler no longer lists is
    stale and ended. Fencing runs on a thread of its own too (`fence_loop`), since the
    work loop can spend seconds in calls to a scheduler it cannot reach.

    The registration says what placement needs of the node beyond its size: the limits
    it gives jobs that ask for none and what it keeps for the system; each renewal
    carries what the jobs use (usage.py). Agents speak the control plane's current API
    (upgrade the control plane first: it takes what older agents send)."""

    def __init__(self, settings: AgentSettings, registry: RegistryClient, scheduler: SchedulerClient,
                 jobs: JobTable, end: Callable[[LocalJob, str], bool], clock: Callable[[], float],
                 default_limits: Callable[[], dict], limits_enforced: Callable[[], bool],
                 refusing_work: Callable[[], str | None] = lambda: None):
        """`end` ends a held job for a reason (Endings.end); `default_limits` the limits
        jobs that ask for none get here, per job type (what claims say too);
        `limits_enforced` whether jobs run in cgroups here; `refusing_work` why the agent
        takes no new work now (under the free-space floor, disk.py), None when it does:
        each heartbeat says it, so the scheduler places nothing here meanwhile."""
        self.settings = settings
        self.registry = registry
        self.scheduler = scheduler
        self.jobs = jobs
        self._end = end
        self._clock = clock
        self._default_limits = default_limits
        self.refusing_work = refusing_work
        self.usage = Meter(jobs.snapshot, limits_enforced, clock)
        self.long_poll = settings.long_poll_secs > 0
        # When the last renewal that succeeded was sent (this agent's monotonic clock;
        # a claim that handed out jobs counts too) and the period the scheduler gave.
        self.lease = Lease()
        # Set when a lease answer lists attempts running here that this agent does not
        # hold: the next reconcile must look even if the agent is idle.
        self.unknown_listed = False

    # --- the registry -----------------------------------------------------------

    def node_info(self) -> dict:
        """The node's size, labels and devices. The labels its GPUs imply (gpus.labels)
        come under the operator's AGENT_LABELS, which win on the same key. `gpus` and
        `resources` are sent only when there are some: a registry of an earlier release
        refuses fields it does not know, and nodes without either keep registering there."""
        s = self.settings
        info = {"node_id": s.node_id, "address": s.address, "kind": "compute", "slots": s.slots,
                "cpus": os.cpu_count(), "memory_mb": total_memory_mb(), "max_memory_mb": s.max_memory_mb,
                "max_cpu_percent": s.max_cpu_percent, "labels": {**gpus.labels(s.gpus), **s.labels}}
        if s.gpus:
            info["gpus"] = [gpu.advertised() for gpu in s.gpus]
        if s.resources:
            info["resources"] = dict(s.resources)
        return info

    def placement_info(self) -> dict:
        """What the registry keeps for placement beyond the node's size."""
        s = self.settings
        return {"default_limits": self._default_limits(), "reserved_memory_mb": s.reserved_memory_mb,
                "reserved_cpu_percent": s.reserved_cpu_percent}

    def register(self) -> dict:
        refusing = self.refusing()
        answer = self.registry.register_node({**self.node_info(), **self.placement_info(),
                                              **({"refusing_work": refusing} if refusing else {})})
        log.info("registered node %s (%d slots) with %s", self.settings.node_id, self.settings.slots,
                 self.settings.registry_url)
        return answer

    def refusing(self) -> str | None:
        """Why no new work is taken, within what the registry takes (a very long work
        root must not get every heartbeat refused)."""
        reason = self.refusing_work()
        return None if reason is None else reason[:REFUSING_WORK_MAX]

    def refused_backoff(self, server: str, what: str) -> RefusedBackoff:
        """The pace of a loop whose calls are refused for this node's credential (refusals.py)."""
        return RefusedBackoff(self.settings.node_id, self.settings.token is not None, server, what)

    def register_until_done(self, stop_event: threading.Event) -> bool:
        """Register, retrying with backoff until the registry answers; False if stopped first."""
        what = f"registering node {self.settings.node_id}"
        return self.keep_trying(stop_event, self.register, Backoff(1.0, 30.0), self.refused_backoff("registry", what),
                                what)

    def heartbeat_once(self) -> None:
        try:
            self.registry.heartbeat(self.settings.node_id, running=len(self.jobs), refusing_work=self.refusing())
        except Rejected as exc:
            if exc.status != 404:
                raise
            # The registry lost its state (or expired us): it needs the full node again.
            log.warning("the registry does not know node %s (%s); registering again",
                        self.settings.node_id, exc.message)
            self.register()

    def beat(self, stop_event: threading.Event, beat: Callable[[], None] | None = None,
             what: str = "heartbeat", server: str = "registry") -> None:
        """Call `beat` (the registry heartbeat by default) every heartbeat interval.

        Failures are retried sooner than the interval, never later: a late
        heartbeat is what gets a healthy node marked unhealthy, and a late lease
        renewal what makes it stop its jobs. Except a refused credential (`server`
        answered 401/403): nothing changes until someone acts, so that is said as an
        error and retried ever later (refusals.py).
        """
        interval = self.settings.heartbeat_interval
        self.keep_trying(stop_event, beat or self.heartbeat_once, Backoff(min(0.5, interval), interval),
                         self.refused_backoff(server, what), what, interval)

    @staticmethod
    def keep_trying(stop_event: threading.Event, attempt: Callable[[], object], backoff: Backoff,
                    refused: RefusedBackoff, what: str, interval: float | None = None) -> bool:
        """Call `attempt` until `stop_event` is set: until it succeeds once (then True) when
        `interval` is None, else every `interval` seconds; False once stopped.

        A failure waits `backoff`'s next delay and is logged (a warning for an answer or
        a connection error, with the traceback for anything else); a refused credential
        waits what `refused` says (refusals.py). A success starts both over."""
        while not stop_event.is_set():
            try:
                attempt()
                refused.accepted()
                if interval is None:
                    return True
                backoff.reset()
                delay = interval
            except Rejected as exc:
                if credential_refused(exc):
                    delay = refused.after(exc)
                else:
                    delay = backoff.next()
                    log.warning("%s failed: %s; retrying in %.1fs", what, exc, delay)
            except ClientError as exc:
                delay = backoff.next()
                log.warning("%s failed: %s; retrying in %.1fs", what, exc, delay)
            except Exception:
                delay = backoff.next()
                log.exception("%s failed; retrying in %.1fs", what, delay)
            stop_event.wait(delay)
        return False

    # --- the lease --------------------------------------------------------------

    def holds_work(self) -> bool:
        """Whether this agent holds jobs (running, starting or claimed)."""
        return len(self.jobs) > 0 or self.jobs.has_claimed()

    def renew_with(self, client: SchedulerClient) -> None:
        """Renew this node's lease (counted from when it was sent: lease.py)."""
        sent_at = self._clock()
        usage = self.usage.read()
        node_id = self.settings.node_id
        answer = client.renew_lease(node_id) if usage is None else client.renew_lease(node_id, usage=usage)
        self.apply_lease(sent_at, answer)

    def renew_if_due(self, client: SchedulerClient) -> None:
        """The lease thread's beat: at every one while the agent holds work or polls
        (no claim renews the lease then), else seldom (Lease.due)."""
        now = self._clock()
        if self.lease.due(now, self.holds_work() or not self.long_poll):
            self.lease.tried(now)
            self.renew_with(client)

    def lease_client(self) -> SchedulerClient:
        client = self.scheduler.clone()
        client.timeout = LEASE_TIMEOUT
        return client

    def apply_lease(self, sent_at: float, answer) -> None:
        was_lapsed, last = self.lapsed() and self.holds_work(), self.lease.sent_at
        running = self.lease.renewed(sent_at, answer)
        if was_lapsed and last is not None:
            log.warning("lease renewed again after %.1fs", sent_at - last)
        self.end_stale(sent_at, running)

    def end_stale(self, sent_at: float, running) -> list[Key]:
        """Kill the attempts the lease answer says are no longer running here.

        Only jobs accepted before the renewal was sent count: the scheduler had
        them running then, so one missing from its list was ended there (moved,
        cancelled, timed out) and its process here is stale.
        """
        if not isinstance(running, list):
            return []
        listed, malformed = listed_keys(running)
        if malformed:
            return []  # a malformed list proves nothing; reconcile will look again
        holding = {local.key: local for local in self.jobs.snapshot()}
        if listed - set(holding) - set(self.jobs.claimed_keys()):
            self.unknown_listed = True
        stale = reconcile.stale(((key, local.started_at) for key, local in holding.items()
                                 if local.end_reason is None), listed, sent_at)
        for key in stale:
            log.warning("job %s attempt %s is stale according to the lease answer; killing it", *key)
            self._end(holding[key], END_RECONCILED)
        for key, reason in reconcile.stops_asked(running).items():
            local = holding.get(key)
            if local is not None and local.end_reason is None and self._end(local, reason):
                log.info("job %s attempt %s: the scheduler asks it stopped (%s); stopping it", *key, reason)
        return stale

    def lapsed(self) -> bool:
        """True when no renewal succeeded for a whole lease period: the scheduler may
        hand this node's run jobs to another node soon, so they must stop here."""
        return self.lease.lapsed(self._clock())

    def claims_blocked(self) -> bool:
        """No claims while the lease is lapsed with jobs held (they are being fenced).
        An idle agent may claim whatever its lease: a claim that hands it jobs
        renews the lease on the scheduler, counted here from when it was sent."""
        return self.lapsed() and self.holds_work()

    def fence_once(self) -> list[Key]:
        """Stop every run job while the lease is lapsed (self-fencing). Services are
        not fenced: a cut-off node keeps serving until it can be told otherwise."""
        if not self.lapsed():
            return []
        fenced = [local.key for local in self.jobs.snapshot()
                  if local.job_type == "run" and local.end_reason is None and self._end(local, END_FENCED)]
        if fenced:
            log.error("no lease renewal for %.1fs (lease %.0fs): stopping %d run job(s) so that they do "
                      "not run twice", self._clock() - (self.lease.sent_at or 0.0), self.lease.secs or 0.0,
                      len(fenced))
        return fenced

    def fence_loop(self, stop_event: threading.Event) -> None:
        while not stop_event.wait(FENCE_SECS):
            try:
                self.fence_once()
            except Exception:
                log.exception("checking the lease failed")
