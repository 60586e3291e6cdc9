"""How a job ends on the agent.

The agent ending it (timeout, cancel, fence, stop), noticing that it ended, and the
report that says how.

`end` starts a kill in the background and marks why (jobs.py: END_*); `reap`
is the work loop's pass over the held jobs: it ends those past their deadline and
finishes those whose process is gone, freeing the slot, the cgroup, the uid and
the work dir, and putting the report in the outbox. What the report says follows
from why the job ended and how its process exited (`report_of`, pure).
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

from corral.shared import states, wire

from . import cgroups, diskfs, identity, launch, services, slot_cgroups, spans
from .disk import DISK_MESSAGE
from .jobs import (END_DISK, END_DRAINED, END_FENCED, END_PREEMPTED, END_RECONCILED, END_STOPPING, END_TIMEOUT,
                   JobTable, LocalJob)
from .log_shipping import LogShipper
from .reconcile import Key
from .reports import Outbox
from .settings import AgentSettings
from .slot_cgroups import SlotCgroups

log = logging.getLogger(__name__)

TIMEOUT_MESSAGE = "job timed out"
STOPPED_MESSAGE = "agent stopped before the job finished"
FENCED_MESSAGE = ("the agent could not renew its lease with the scheduler for {:.0f}s and stopped the job, "
                  "so that it does not run twice once the scheduler moves it to another node")
OOM_MESSAGE = "job killed: out of memory (limit {} MB)"
FULL_MESSAGE = ("job reached its disk limit of {} MB: its work dir is a filesystem of that size and it is full "
                "(writes failed with 'No space left on device')")
SETUP_MESSAGE = ("the agent could not set the job up (its cgroup, private /tmp or environment), so the "
                 "command did not run (a problem of node {}, not of the job)")
# Ends that are the node's doing, not the job's: reported with requeue=True, so the
# scheduler runs the job again without spending its retry budget.
NODE_SIDE_ENDS = {END_STOPPING: STOPPED_MESSAGE, END_FENCED: FENCED_MESSAGE}
# Stops the scheduler asked for: reported with requeue=True and `ended_by` saying which, so
# it runs the job again, no retry spent; the job has its whole kill grace for them.
ASKED_ENDS = {END_DRAINED: "job stopped: the drain of its node reached its deadline (it runs again elsewhere)",
              END_PREEMPTED: "job preempted: stopped to make room for other work (it runs again)"}

Ended = tuple[str, int, str]  # (job_id, attempt, outcome)


@dataclass(frozen=True)
class Report:
    """What the agent reports of a job whose process ended."""
    status: str
    exit_code: int
    stderr: str
    requeue: bool = False


def node_side_message(end_reason: str, lease_secs: float) -> str:
    return NODE_SIDE_ENDS[end_reason].format(lease_secs)


def report_of(end_reason: str | None, exit_code: int, stderr: str, *, setup_failed: bool,
              oom_limit_mb: int | None, node_id: str, lease_secs: float, disk_mb: int | None = None,
              disk_full: bool = False) -> Report:
    """The report of a started job that ended, `end_reason` being why the agent ended
    it (None: on its own). A job the agent ended is failed (-1) whatever its exit
    code; the node's own ends are requeued; a launch chain that failed before the
    command is the node's problem; `oom_limit_mb` is set when the kernel killed it
    for memory; `disk_full` when it ended on its own with its work dir's filesystem
    full (diskfs.py), whose failure that explains."""
    if end_reason == END_TIMEOUT:
        return Report(states.FAILED, -1, _append_line(stderr, TIMEOUT_MESSAGE))
    if end_reason == END_DISK:  # the job's own doing: failed, and retried as any failure
        return Report(states.FAILED, -1, _append_line(stderr, DISK_MESSAGE.format(disk_mb)))
    if end_reason in NODE_SIDE_ENDS:
        return Report(states.FAILED, -1, _append_line(stderr, node_side_message(end_reason, lease_secs)), requeue=True)
    if end_reason in ASKED_ENDS:
        return Report(states.FAILED, -1, _append_line(stderr, ASKED_ENDS[end_reason]), requeue=True)
    if setup_failed:
        return Report(states.FAILED, -1, _append_line(stderr, SETUP_MESSAGE.format(node_id)))
    if disk_full and end_reason is None and exit_code != 0:  # it failed on its own, for want of space
        return Report(states.FAILED, exit_code, _append_line(stderr, FULL_MESSAGE.format(disk_mb)))
    if oom_limit_mb is not None:
        stderr = _append_line(stderr, OOM_MESSAGE.format(oom_limit_mb))
    return Report(states.DONE if exit_code == 0 else states.FAILED, exit_code, stderr)


def ended_by(end_reason: str | None, oom: bool, disk_full: bool = False) -> str | None:
    """A report's `ended_by` (wire.ENDED_BY_REPORTED): why the agent (or the kernel, for memory)
    ended the job; None when it exited on its own or the node gave it up. A job that
    failed on its own with its filesystem full (`disk_full`) was ended by its disk limit."""
    if end_reason == END_DISK or (disk_full and end_reason is None):
        return wire.ENDED_BY_DISK
    if end_reason == END_TIMEOUT:
        return wire.ENDED_BY_TIMEOUT
    if end_reason in ASKED_ENDS:
        return end_reason  # the scheduler's own word: drain, preemption
    return wire.ENDED_BY_OOM if oom and end_reason is None else None


class Endings:
    def __init__(self, settings: AgentSettings, jobs: JobTable, outbox: Outbox, users: identity.JobUsers,
                 lease_secs: Callable[[], float], clock: Callable[[], float], shipper: LogShipper | None = None,
                 diskfs: diskfs.DiskFs | None = None, gpu_use: Callable[[Key], dict] = lambda key: {},
                 slots: SlotCgroups | None = None):
        self.settings = settings
        self.slots = slots  # run jobs' cgroups kept between jobs (slot_cgroups.py), or None
        self.gpu_use = gpu_use  # what a job's GPUs used, for its report (gpu_usage.GpuMeter.take)
        self.diskfs = diskfs  # the work dirs' own filesystems, removed with them
        self.shipper = shipper  # the complete logs: told when an attempt's output is all read
        self.jobs = jobs
        self.outbox = outbox
        self.users = users
        self._lease_secs = lease_secs
        self._clock = clock
        # Monitors of ended services still removing their registry record.
        self.closing: list[services.ServiceMonitor] = []

    def node_side_message(self, end_reason: str) -> str:
        return node_side_message(end_reason, self._lease_secs())

    def end(self, local: LocalJob, reason: str) -> bool:
        """Kill a job's process tree in the background; reap reports it after.
        A job still being prepared is simply not started. False when there was nothing
        to end (being ended already, or exited on its own)."""
        with local.lock:
            if local.end_reason is not None:
                return False  # already being ended; the first reason is the one reported
            process = local.process
            if reason != END_RECONCILED and process is not None and process.poll() is not None:
                # It exited on its own before this (the work loop, busy with a slow
                # scheduler, had not reaped it yet): reap reports how it ended, a
                # result that must not be discarded as stopped and run again.
                return False
            local.end_reason = reason
        self.close_monitor(local)  # out of the load balancer before it is killed
        if process is None:
            return True
        # kill() waits up to the grace for the group to leave; the work loop must not.
        grace = local.stop.grace(reason in NODE_SIDE_ENDS, self.settings.kill_grace)
        local.killer = threading.Thread(target=process.kill, args=(grace, local.stop.kill_signal),
                                        name=f"kill-{local.job_id}-{local.attempt}", daemon=True)
        local.killer.start()
        return True

    def warn(self, local: LocalJob) -> None:
        """Send a running job its warning before its timeout (signal_before_end), once."""
        if not local.prepared.is_set():
            return  # still being prepared: warned once it runs, if before its deadline
        local.warn_at = None
        with local.lock:
            process = local.process if local.end_reason is None else None
        if process is None or process.poll() is not None or local.stop.warn_signal is None:
            return
        log.info("job %s attempt %s: sending SIG%s, %gs before its timeout", local.job_id, local.attempt,
                 signal.Signals(local.stop.warn_signal).name[3:], local.stop.warn_before or 0)
        process.send(local.stop.warn_signal)

    def reap(self) -> list[Ended]:
        """End the jobs past their deadline; finish those whose process is gone (or
        never started). Returns (job_id, attempt, outcome) for each job finished: the
        reported status, or "killed" for a job the scheduler had already ended (not
        reported)."""
        now = self._clock()
        for local in self.jobs.snapshot():
            if local.warn_at is not None and now >= local.warn_at:
                self.warn(local)
            if local.end_reason is None and local.deadline is not None and now >= local.deadline:
                log.warning("job %s attempt %s ran past its timeout; killing it", local.job_id, local.attempt)
                self.end(local, END_TIMEOUT)
        ended = []
        for local in self.jobs.snapshot():
            if not local.prepared.is_set():
                continue
            if local.process is None:
                ended.append(self._finish_unstarted(local))
                continue
            # While a kill is in progress the group may still have members: the slot
            # is free only once the whole tree is gone.
            if local.killer is not None and local.killer.is_alive():
                continue
            if local.process.poll() is None:
                continue
            ended.append(self._finish(local))
        return ended

    def _finish_unstarted(self, local: LocalJob) -> Ended:
        self._free(local)
        if local.end_reason == END_RECONCILED:
            spans.end_attempt(local.span, None, None)
            return (local.job_id, local.attempt, "killed")
        extra: dict[str, object] = {}
        if local.end_reason == END_TIMEOUT:
            exit_code, message = -1, TIMEOUT_MESSAGE
        elif local.end_reason in NODE_SIDE_ENDS:
            exit_code, message, extra = -1, self.node_side_message(local.end_reason), {"requeue": True}
        elif local.end_reason in ASKED_ENDS:
            exit_code, message = -1, ASKED_ENDS[local.end_reason]
            extra = {"requeue": True, "ended_by": local.end_reason}
        else:
            exit_code, message = local.start_error or (-1, "the agent could not start the job")
        spans.end_attempt(local.span, states.FAILED, exit_code, local.end_reason or "not started")
        self.outbox.add_failed(local.job_id, local.attempt, exit_code, message, attempt_span=local.span, **extra)
        return (local.job_id, local.attempt, states.FAILED)

    def _finish(self, local: LocalJob) -> Ended:
        assert local.process is not None  # reap finishes only started jobs here
        result = local.process.result()
        cg = local.cgroup
        usage = cg.stats() if cg is not None else {"peak_memory_bytes": None, "cpu_seconds": None}
        usage.update(self.gpu_use(local.key))
        oom = local.end_reason is None and cg is not None and cgroups.ended_by_oom(result.exit_code, cg)
        if cg is not None:
            slot_cgroups.release(self.slots, cg)
        # Before the work dir goes: was its filesystem full (its writes failed for it)?
        full = local.end_reason is None and result.exit_code != 0 and self.diskfs is not None \
            and self.diskfs.full(local.workdir)
        self._free(local)
        if local.end_reason == END_RECONCILED:
            log.info("job %s attempt %s was ended by the scheduler; killed (exit %s), not reported",
                     local.job_id, local.attempt, result.exit_code)
            spans.end_attempt(local.span, None, result.exit_code)
            return (local.job_id, local.attempt, "killed")
        limit = ((cg.limits.get("memory_mb") if cg is not None else None) or local.memory_mb) if oom else None
        report = report_of(local.end_reason, result.exit_code, result.stderr,
                           setup_failed=launch.setup_failed(result.exit_code, result.stderr),
                           oom_limit_mb=limit, node_id=self.settings.node_id, lease_secs=self._lease_secs(),
                           disk_mb=local.disk_mb, disk_full=full)
        log.info("job %s attempt %s finished: %s (exit %s%s)", local.job_id, local.attempt, report.status,
                 report.exit_code, ", out of memory" if oom else "")
        extra: dict[str, object] = {"requeue": True} if report.requeue else {}
        why = ended_by(local.end_reason, oom, full)
        if why is not None and report.status == states.FAILED:
            extra["ended_by"] = why
        spans.end_attempt(local.span, report.status, report.exit_code, local.end_reason)
        self.outbox.add(local.job_id, local.attempt, report.status, attempt_span=local.span, exit_code=report.exit_code,
                        stdout=result.stdout, stderr=report.stderr, oom_killed=oom, **usage, **extra)
        return (local.job_id, local.attempt, report.status)

    def _free(self, local: LocalJob) -> None:
        """The slot, uid, service record and files of a job whose processes are gone;
        the rest of its output is shipped."""
        self.jobs.remove(local.key)
        if self.shipper is not None:
            self.shipper.finish(local.job_id, local.attempt)
        if local.user_key is not None:
            self.users.release(local.user_key)
            local.user_key = None
        self.close_monitor(local)
        services.remove_file(local.state_path)
        self._remove_work_dir(local)

    def close_monitor(self, local: LocalJob) -> None:
        """Stop a service's checks and remove its registry record (in the background)."""
        with local.lock:
            monitor = local.monitor
        if monitor is not None and monitor not in self.closing:
            monitor.stop(remove=True)
            self.closing = [m for m in self.closing if m.is_alive()] + [monitor]

    def _remove_work_dir(self, local: LocalJob) -> None:
        if self.settings.keep_work_dirs:
            if self.users.mode == "per-job" and os.path.isdir(local.workdir):
                identity.disown_workdir(local.workdir)
            return
        if self.diskfs is not None:
            self.diskfs.release(local.workdir)  # unmounted first: what is in it goes with its image
        shutil.rmtree(local.workdir, ignore_errors=True)
        for path in local.log_files or ():
            services.remove_file(path)


def _append_line(text: str, line: str) -> str:
    if text and not text.endswith("\n"):
        text += "\n"
    return text + line
