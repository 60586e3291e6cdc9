"""The agent as a running process: its threads, and how it stops.

`run` registers, then runs each concern on a named thread (heartbeat, lease, fence,
warm, output, logs, disk, claim) and the work loop in the calling thread; each thread
repeats a one-pass method of one of the agent's parts, which tests call step by step.
`shutdown` stops taking work, leaves running services to the next agent, gives run
jobs AGENT_STOP_GRACE_SECS, then kills and reports the rest (docs/agent.md).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from corral.shared.clients import ClientError, SchedulerClient

from . import cgroups, diskfs, identity, live_output, warm
from .claims import Claims
from .disk import DiskWatch
from .endings import STOPPED_MESSAGE, Endings
from .jobs import END_STOPPING, JobTable
from .log_shipping import LogShipper
from .membership import Membership
from .slot_cgroups import SlotCgroups
from .reports import Outbox
from .servicejobs import ServiceJobs
from .settings import AgentSettings
from .workloop import Steps, WorkLoop

log = logging.getLogger(__name__)

# How often the work loop looks at its processes (finish, timeout) between wake-ups.
TICK_SECS = 0.1
# Bounded effort to deliver the last reports when the agent stops.
FLUSH_SECS = 5.0
# With live output off, how often finished attempts' complete logs are looked at.
LOGS_AT_END_SECS = 2.0


@dataclass
class Parts:
    """The parts of an agent that running and stopping use (after Agent.startup)."""
    settings: AgentSettings
    scheduler: SchedulerClient
    membership: Membership
    jobs: JobTable
    claims: Claims
    outbox: Outbox
    services: ServiceJobs
    logs: LogShipper
    disk: DiskWatch
    reap: Callable[[], object]  # Agent.reap_once
    clock: Callable[[], float]
    stopping: threading.Event
    work_wake: threading.Event  # claimed jobs, or a job's output closed: the work loop looks
    warm: warm.WarmKeeper | None
    endings: Endings | None
    cgroups: cgroups.Manager | None
    users: identity.JobUsers | None
    diskfs: diskfs.DiskFs | None  # the work dirs' filesystems, when in use
    slots: SlotCgroups | None = None  # run jobs' cgroups kept between jobs


def run(parts: Parts, steps: Steps, stop_event: threading.Event, once: bool = False) -> int:
    """Run until stop_event is set (or, with once, until the jobs of one successful
    poll have ended; services are left running), then shutdown(). Returns the exit
    status: 0, or 1 in once mode when reports could not be delivered."""
    membership = parts.membership
    if not membership.register_until_done(stop_event):
        shutdown(parts)
        return 0
    beats_stop = threading.Event()
    lease_client = membership.lease_client()
    beats = [threading.Thread(target=membership.beat, args=(beats_stop,), name="heartbeat", daemon=True),
             threading.Thread(target=membership.beat, name="lease", daemon=True,
                              args=(beats_stop, lambda: membership.renew_if_due(lease_client), "lease renewal"),
                              kwargs={"server": "scheduler"}),
             threading.Thread(target=membership.fence_loop, args=(beats_stop,), name="fence", daemon=True)]
    if parts.warm is not None:
        beats.append(threading.Thread(target=parts.warm.run, args=(beats_stop,), name="warm", daemon=True))
    if parts.settings.output_interval > 0:
        sender = live_output.LiveOutput(parts.settings.node_id, parts.jobs.snapshot, parts.scheduler.clone(),
                                        parts.settings.output_interval)
        beats.append(threading.Thread(target=sender.run, args=(beats_stop,), name="output", daemon=True))
    # Complete logs: while jobs run every AGENT_OUTPUT_INTERVAL_SECS (only at their end when 0).
    beats.append(threading.Thread(target=parts.logs.run, name="logs", daemon=True, args=(
        parts.scheduler.clone(), beats_stop, parts.settings.output_interval or LOGS_AT_END_SECS,
        parts.settings.output_interval > 0)))
    beats.append(threading.Thread(target=parts.disk.run, args=(beats_stop,), name="disk", daemon=True))
    for thread in beats:
        thread.start()
    try:
        _work(parts, steps, stop_event, once)
    finally:
        # Heartbeats go on while running jobs are given their grace period.
        undelivered = shutdown(parts)
        beats_stop.set()
        for thread in beats:
            thread.join(timeout=1.0)
    return 1 if once and undelivered else 0


def _work(parts: Parts, steps: Steps, stop_event: threading.Event, once: bool) -> None:
    claim_stop = threading.Event()
    claims = parts.membership.long_poll and not once
    if claims:
        threading.Thread(target=parts.claims.loop, args=(claim_stop,), name="claim", daemon=True).start()
        parts.claims.running = True
    loop = WorkLoop(steps, parts.clock(), claims, once)
    try:
        while not stop_event.is_set() and not loop.done():
            loop.tick(parts.clock())
            parts.work_wake.wait(TICK_SECS)
            parts.work_wake.clear()
    finally:
        parts.claims.running = False
        claim_stop.set()
        parts.claims.wake.set()


def shutdown(parts: Parts, flush_secs: float = FLUSH_SECS) -> int:
    """Stop the agent's work (see the module's docstring). Returns how many reports
    are still undelivered."""
    parts.stopping.set()
    parts.claims.wake.set()
    if parts.warm is not None:
        parts.warm.close()
    jobs, settings = parts.jobs, parts.settings
    parts.services.detach()
    if len(jobs):
        log.info("stopping: %d job(s) running, waiting up to %.1fs for them", len(jobs), settings.stop_grace)
    _reap_until_empty(parts, parts.clock() + settings.stop_grace)
    parts.services.detach()
    if len(jobs):
        log.warning("stopping: killing %d job(s) that did not finish in time", len(jobs))
        if parts.endings is None:
            raise RuntimeError("Agent.startup() must run before the agent takes or checks jobs")
        for local in jobs.snapshot():
            parts.endings.end(local, END_STOPPING)
        # kill() takes at most kill_grace, then SIGKILL and reap. A download cannot
        # be interrupted: jobs still being prepared are not waited for.
        _reap_until_empty(parts, parts.clock() + settings.kill_grace + 5.0, only_started=True)
    for local in jobs.snapshot():
        if not local.prepared.is_set():  # still downloading: it will never be started
            jobs.remove(local.key)
            parts.outbox.add_failed(local.job_id, local.attempt, -1, STOPPED_MESSAGE, requeue=True)
    _requeue_claimed(parts)
    deadline = parts.clock() + flush_secs
    while parts.outbox and parts.clock() < deadline:
        if parts.outbox.flush(force=True):
            time.sleep(0.2)  # brief pause between tries; bounded by the deadline
        _requeue_claimed(parts)  # a long poll that was under way may still have answered
    _ship_last_logs(parts, parts.clock() + flush_secs)
    end = time.monotonic() + flush_secs  # ended services leave the registry, if it answers
    for monitor in parts.endings.closing if parts.endings else ():
        monitor.join(max(0.0, end - time.monotonic()))
    if parts.outbox:
        log.warning("stopping with %d undelivered report(s): %s", len(parts.outbox),
                    ", ".join(f"{r.job_id} attempt {r.attempt} {r.status}" for r in parts.outbox))
    if parts.slots is not None:
        parts.slots.close()
    if parts.cgroups is not None and not len(jobs) and not parts.cgroups.list_job_cgroups():
        parts.cgroups.cleanup()  # this node's cgroup directories, when no service uses them
    if parts.diskfs is not None:
        parts.diskfs.unshare_work_root()  # the work root's shared mount, when no job filesystem is left
    if parts.users is not None:
        parts.users.flush()  # the uids the detached services keep, for the next agent
    return len(parts.outbox)


def _requeue_claimed(parts: Parts) -> None:
    """Claimed jobs that never started go back to the scheduler (requeued without
    spending a retry)."""
    for key, _ in parts.jobs.take_all_claimed():
        parts.outbox.add_failed(*key, -1, STOPPED_MESSAGE, requeue=True)


def _reap_until_empty(parts: Parts, deadline: float, only_started: bool = False) -> None:
    def waiting():
        return any(local.prepared.is_set() or not only_started for local in parts.jobs.snapshot())

    while waiting() and parts.clock() < deadline:
        # A service whose start was under way when the stop began is left running too.
        parts.services.detach()
        try:
            parts.reap()
        except Exception:
            log.exception("checking jobs failed while stopping")
        if waiting():
            time.sleep(TICK_SECS)


def _ship_last_logs(parts: Parts, deadline: float) -> None:
    """The ended attempts' output still to ship, until `deadline` (bounded: a request
    to a scheduler that does not answer takes its timeout). A service left running
    is shipped on by the next agent; what cannot be sent now is lost with the
    agent's copies, and the scheduler keeps what it had."""
    client = parts.scheduler.clone()
    try:
        while parts.logs.pending() and parts.clock() < deadline:
            try:
                parts.logs.ship_once(client, finished_only=True)
                break
            except ClientError as exc:
                log.warning("stopping: shipping the last job output failed: %s", exc)
                time.sleep(0.2)
    finally:
        client.close()
        parts.logs.close()
