"""The scheduler's background work, run by exactly one process at a time.

A leased loop (corral.server.leased): every gunicorn worker runs its thread, and the
lease decides which one does the work (Background.one_pass lists what a pass does).
Schedules, the sampler, the SQS intake and the SNS outbox are leased loops of their own.
"""
import logging
import time
from collections.abc import Callable

from corral.shared.clients import ClientError, RegistryClient
from corral.server.leased import LeasedLoop
from corral.server.leader import LoopThread

from . import liveness
from .event_log import EventLog
from .job_logs import JobLogs
from .service import Scheduler
from .store import Store

log = logging.getLogger(__name__)

LEASE_NAME = "scheduler-loops"
# The longest pause after failed passes (the database is down): short, because once it
# is back node loss, timeouts and due retries wait for the next pass.
MAX_BACKOFF_SECS = 5.0
# How often the retention purge looks for old finished jobs when there is no backlog.
PURGE_INTERVAL_SECS = 60.0


class Background(LeasedLoop[Store, bool]):
    """The scheduler's pass; `tick(now)` says whether this process held the lease for it."""

    doing = "running the background loops"

    def __init__(self, store: Store, registry: RegistryClient, holder: str | None = None,
                 clock: Callable[[], float] = time.time):
        # The lease outlives several passes, so a slow pass does not lose it. Agents get a
        # full lease period from the start of the tenure before any node counts as lost:
        # after a takeover, and after a pause longer than their lease (their renewals
        # could not land meanwhile either).
        super().__init__(store, LEASE_NAME, max(10.0, 5 * store.settings.dispatch_interval_secs), holder,
                         gap=store.settings.heartbeat_timeout_secs, max_backoff=MAX_BACKOFF_SECS)
        self.scheduler = Scheduler(self.store)
        self.registry = registry
        self.clock = clock
        self.settings = store.settings
        self.next_sync = 0.0
        self.next_timeout_check = 0.0
        self.next_purge = 0.0
        self.next_event_prune = 0.0
        self.event_log = EventLog(self.store.db)
        self.logs = JobLogs(self.store.db, self.settings)
        self.registry_down_since: float | None = None
        # The nodes already warned about for advertising more slots than MAX_JOBS_PER_NODE.
        self.capped_nodes: set[str] = set()

    def not_holding(self) -> bool:
        return False

    def delay(self, result: bool) -> float:
        return self.delay_after(self.clock())

    def resumed(self, paused: float) -> None:
        log.warning("the background loops did not run for %.1fs; every node gets a full lease period "
                    "before any counts as lost", paused)

    def one_pass(self, now: float) -> bool:
        """One pass:
        - refreshes the node list from the registry (every NODE_REFRESH_SECS); when the
          registry cannot be reached the cached list stays, so dispatch goes on;
        - unplaces pending jobs of nodes that turned unhealthy;
        - requeues running jobs of nodes whose agent stopped renewing its lease;
        - fails `run` jobs past their timeout, and requeues those a stop was asked of
          whose agents did not report it in time (every TIMEOUT_CHECK_SECS);
        - decides the dependencies a job's end missed (Dependents.settle_missed);
        - places waiting jobs, and keeps the reasons of those at the head of the queue
          (Placing.explain);
        - asks the stops that give teams below their guarantee their capacity back, and
          (PRIORITY_PREEMPTION_GAP) jobs of much higher priority room (Preemptions.run);
        - deletes finished jobs older than JOB_RETENTION_SECS with their events, at most
          JOB_PURGE_BATCH per pass, every PURGE_INTERVAL_SECS or on the next pass while
          a backlog remains; and so the stream's events past EVENTS_RETENTION_SECS."""
        if now >= self.next_sync:
            self.next_sync = now + self.settings.node_refresh_secs
            self.refresh_nodes(now)
        for job_id in self.store.leases.requeue_lost(now, self.tenure.since):
            log.warning("%s: its node stopped renewing its lease; handled per on_node_lost", job_id)
        if now >= self.next_timeout_check:
            self.next_timeout_check = now + self.settings.timeout_check_secs
            for job_id in self.store.actions.fail_timed_out(now):
                log.warning("%s ran past its timeout; failed", job_id)
            for job_id in self.store.actions.requeue_unstopped(now):
                log.warning("%s was not reported stopped in time (a drain's deadline or a preemption); requeued",
                            job_id)
        self.store.dependents.settle_missed(now)
        # Placement: the node list changed, slots freed, retries came due.
        self.scheduler.place(now)
        self.store.placing.explain(now)
        # Preemption after placement and its reasons: only jobs still waiting for room are served.
        for victim, beneficiary in self.store.preemptions.run(now):
            log.info("%s: preempted to make room for %s", victim, beneficiary)
        self.purge(now)
        self.prune_events(now)
        return True

    def delay_after(self, now: float) -> float:
        """How long the loop sleeps after a pass: DISPATCH_INTERVAL_SECS, or less when a
        waiting job comes due sooner (a run_at, a retry's backoff), so that it is placed
        when it comes due rather than at the next regular pass."""
        interval = self.settings.dispatch_interval_secs
        if self.tenure.token is None:
            return interval  # another process runs the passes
        due = self.store.snapshot.next_due(now)
        return interval if due is None else max(0.0, min(interval, due - now))

    def purge(self, now: float) -> int:
        """One bounded chunk of the retention purge, when it is due."""
        retention = self.settings.job_retention_secs
        if retention <= 0 or now < self.next_purge:
            return 0
        batch = self.settings.job_purge_batch
        gone_objects: list[str] = []
        purged = self.store.purge.finished(now - retention, batch, gone_objects)
        self.logs.delete_objects(gone_objects)  # after the commit: a row never names a deleted object
        # The audit log is kept as long as the jobs whose history it completes.
        purged = max(purged, self.store.audit.purge(now - retention, batch))
        # A full chunk means more are waiting: the next pass goes on; else wait a while.
        self.next_purge = now if purged >= batch else now + PURGE_INTERVAL_SECS
        if purged:
            log.info("deleted %d job(s) that finished more than %.0fs ago", purged, retention)
        return purged

    def prune_events(self, now: float) -> int:
        """One bounded chunk of the event stream's retention, when it is due."""
        if now < self.next_event_prune:
            return 0
        batch = self.settings.job_purge_batch
        pruned = self.event_log.prune(now - self.settings.events_retention_secs, batch)
        self.next_event_prune = now if pruned >= batch else now + PURGE_INTERVAL_SECS
        return pruned

    def refresh_nodes(self, now: float) -> None:
        seen_drains = self.store.nodes.drain_count()  # before the list: a drain after it stays (sync_nodes)
        try:
            nodes = self.registry.list_nodes(kind=liveness.COMPUTE)
        except ClientError as exc:
            if self.registry_down_since is None:
                self.registry_down_since = now
                log.warning("registry unreachable (%s); placing on the last known nodes", exc)
            return
        if self.registry_down_since is not None:
            log.info("registry reachable again after %.0fs", now - self.registry_down_since)
            self.registry_down_since = None
        self.store.nodes.sync_nodes(nodes, now, seen_drains)
        for message in over_cap(nodes, self.settings.max_jobs_per_node, self.capped_nodes):
            log.warning("%s", message)


def over_cap(nodes: list, cap: int, warned: set[str]) -> list[str]:
    """What to say of the nodes that advertise more slots than MAX_JOBS_PER_NODE (`cap`)
    lets them use, each once (`warned`: those said already, which this adds to): a node
    list showing `slots: 2` while one job runs at a time is a surprise otherwise."""
    messages = []
    for node in nodes:
        node_id, slots = (node.get("node_id"), node.get("slots")) if isinstance(node, dict) else (None, None)
        if not isinstance(node_id, str) or isinstance(slots, bool) or not isinstance(slots, int):
            continue
        if slots > cap and node_id not in warned:
            warned.add(node_id)
            jobs = "1 job" if cap == 1 else f"{cap} jobs"
            messages.append(f"node {node_id} advertises {slots} slots but MAX_JOBS_PER_NODE is {cap}: "
                            f"it runs at most {jobs} at once (raise MAX_JOBS_PER_NODE to use them all)")
    return messages


def start(store: Store, registry: RegistryClient, clock: Callable[[], float] = time.time) -> LoopThread:
    return Background(store, registry, clock=clock).start("scheduler-loops", store.settings.dispatch_interval_secs,
                                                          clock)
