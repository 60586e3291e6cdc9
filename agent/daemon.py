"""The agent as a running process: its threads, and how it stops.

`run` starts the agent (Agent.startup), registers, then runs each concern on a
thread of its own with one job and a name: `heartbeat` (the registry), `lease`
(renewals with the scheduler), `fence` (stopping run jobs when the lease lapsed),
`warm` (the launch kept started ahead), `output` (live output), `logs` (complete
logs, log_shipping.py), `claim` (long-poll
claims), and the work loop in the calling thread (WorkLoop.tick after each wake-up
or TICK_SECS). Everything they do is a one-pass method of the Agent that tests call
step by step instead.

`shutdown` stops taking work and leaves the running services to the next agent
(their processes, registry records and state files stay); run jobs get
AGENT_STOP_GRACE_SECS, the rest are killed and reported, claimed jobs that never
started go back to the scheduler, and the last reports get about FLUSH_SECS.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from corral.shared.clients import ClientError

from . import live_output
from .endings import STOPPED_MESSAGE
from .jobs import END_STOPPING
from .workloop import WorkLoop

if TYPE_CHECKING:
    from .agent import Agent

log = logging.getLogger(__name__)

# How often the work loop looks at its processes (finish, timeout) between wake-ups.
TICK_SECS = 0.1
# Bounded effort to deliver the last reports when the agent stops.
FLUSH_SECS = 5.0
# With live output off, how often finished attempts' complete logs are looked at.
LOGS_AT_END_SECS = 2.0


def run(agent: Agent, stop_event: threading.Event, once: bool = False) -> int:
    """Run until stop_event is set (or, with once, until the jobs of one successful
    poll have ended; services are left running), then shutdown(). Returns the exit
    status: 0, or 1 in once mode when reports could not be delivered."""
    agent.startup()
    membership = agent.membership
    if not membership.register_until_done(stop_event):
        shutdown(agent)
        return 0
    beats_stop = threading.Event()
    lease_client = membership.lease_client()
    beats = [threading.Thread(target=membership.beat, args=(beats_stop,), name="heartbeat", daemon=True),
             threading.Thread(target=membership.beat, name="lease", daemon=True,
                              args=(beats_stop, lambda: membership.renew_if_due(lease_client), "lease renewal"),
                              kwargs={"server": "scheduler"}),
             threading.Thread(target=membership.fence_loop, args=(beats_stop,), name="fence", daemon=True)]
    if agent.warm is not None:
        beats.append(threading.Thread(target=agent.warm.run, args=(beats_stop,), name="warm", daemon=True))
    if agent.settings.output_interval > 0:
        sender = live_output.LiveOutput(agent.node_id, agent.held_jobs, agent.scheduler.clone(),
                                        agent.settings.output_interval)
        beats.append(threading.Thread(target=sender.run, args=(beats_stop,), name="output", daemon=True))
    # Complete logs: while jobs run every AGENT_OUTPUT_INTERVAL_SECS (only at their end when 0).
    beats.append(threading.Thread(target=agent.logs.run, name="logs", daemon=True, args=(
        agent.scheduler.clone(), beats_stop, agent.settings.output_interval or LOGS_AT_END_SECS,
        agent.settings.output_interval > 0)))
    beats.append(threading.Thread(target=agent.disk.run, args=(beats_stop,), name="disk", daemon=True))
    for thread in beats:
        thread.start()
    try:
        _work(agent, stop_event, once)
    finally:
        # Heartbeats go on while running jobs are given their grace period.
        undelivered = shutdown(agent)
        beats_stop.set()
        for thread in beats:
            thread.join(timeout=1.0)
    return 1 if once and undelivered else 0


def _work(agent: Agent, stop_event: threading.Event, once: bool) -> None:
    claim_stop = threading.Event()
    claims = agent.long_poll and not once
    if claims:
        threading.Thread(target=agent.claims.loop, args=(claim_stop,), name="claim", daemon=True).start()
        agent.claims.running = True
    loop = WorkLoop(agent, agent._clock(), claims, once)
    try:
        while not stop_event.is_set() and not loop.done():
            loop.tick(agent._clock())
            agent._work_wake.wait(TICK_SECS)
            agent._work_wake.clear()
    finally:
        agent.claims.running = False
        claim_stop.set()
        agent.claims.wake.set()


def shutdown(agent: Agent, flush_secs: float = FLUSH_SECS) -> int:
    """Stop the agent's work (see the module's docstring). Returns how many reports
    are still undelivered."""
    agent._stopping = True
    agent.claims.wake.set()
    if agent.warm is not None:
        agent.warm.close()
    jobs, settings = agent.jobs, agent.settings
    agent.detach_services()
    if len(jobs):
        log.info("stopping: %d job(s) running, waiting up to %.1fs for them", len(jobs), settings.stop_grace)
    _reap_until_empty(agent, agent._clock() + settings.stop_grace)
    agent.detach_services()
    if len(jobs):
        log.warning("stopping: killing %d job(s) that did not finish in time", len(jobs))
        for local in jobs.snapshot():
            agent._end(local, END_STOPPING)
        # kill() takes at most kill_grace, then SIGKILL and reap. A download cannot
        # be interrupted: jobs still being prepared are not waited for.
        _reap_until_empty(agent, agent._clock() + settings.kill_grace + 5.0, only_started=True)
    for local in jobs.snapshot():
        if not local.prepared.is_set():  # still downloading: it will never be started
            jobs.remove(local.key)
            agent.outbox.add_failed(local.job_id, local.attempt, -1, STOPPED_MESSAGE, requeue=True)
    _requeue_claimed(agent)
    deadline = agent._clock() + flush_secs
    while agent.outbox and agent._clock() < deadline:
        if agent.flush_reports(force=True):
            time.sleep(0.2)  # brief pause between tries; bounded by the deadline
        _requeue_claimed(agent)  # a long poll that was under way may still have answered
    _ship_last_logs(agent, agent._clock() + flush_secs)
    end = time.monotonic() + flush_secs  # ended services leave the registry, if it answers
    for monitor in agent.endings.closing if agent.endings else ():
        monitor.join(max(0.0, end - time.monotonic()))
    if agent.outbox:
        log.warning("stopping with %d undelivered report(s): %s", len(agent.outbox),
                    ", ".join(f"{r.job_id} attempt {r.attempt} {r.status}" for r in agent.outbox))
    if agent.cgroups is not None and not len(jobs) and not agent.cgroups.list_job_cgroups():
        agent.cgroups.cleanup()  # this node's cgroup directories, when no service uses them
    if agent.disk_fs_on:
        agent.diskfs.unshare_work_root()  # the work root's shared mount, when no job filesystem is left
    if agent.users is not None:
        agent.users.flush()  # the uids the detached services keep, for the next agent
    return len(agent.outbox)


def _requeue_claimed(agent: Agent) -> None:
    """Claimed jobs that never started go back to the scheduler (requeued without
    spending a retry)."""
    for key, _ in agent.jobs.take_all_claimed():
        agent.outbox.add_failed(*key, -1, STOPPED_MESSAGE, requeue=True)


def _reap_until_empty(agent: Agent, deadline: float, only_started: bool = False) -> None:
    def waiting():
        return any(local.prepared.is_set() or not only_started for local in agent.jobs.snapshot())

    while waiting() and agent._clock() < deadline:
        # A service whose start was under way when the stop began is left running too.
        agent.detach_services()
        try:
            agent.reap_once()
        except Exception:
            log.exception("checking jobs failed while stopping")
        if waiting():
            time.sleep(TICK_SECS)


def _ship_last_logs(agent: Agent, deadline: float) -> None:
    """The ended attempts' output still to ship, until `deadline` (bounded: a request
    to a scheduler that does not answer takes its timeout). A service left running
    is shipped on by the next agent; what cannot be sent now is lost with the
    agent's copies, and the scheduler keeps what it had."""
    client = agent.scheduler.clone()
    try:
        while agent.logs.pending() and agent._clock() < deadline:
            try:
                agent.logs.ship_once(client, finished_only=True)
                break
            except ClientError as exc:
                log.warning("stopping: shipping the last job output failed: %s", exc)
                time.sleep(0.2)
    finally:
        client.close()
        agent.logs.close()
