"""The agent's logic: register, heartbeat, take jobs, run them, report how they ended.

Each step is a small one-pass method (register, heartbeat_once, poll_once,
reap_once, reconcile_once, flush_reports) that tests call directly; run_forever
only schedules them on two threads. The scheduler's database is the truth about
jobs: the agent keeps in memory only the processes it runs and the reports it has
not delivered yet, both of which die with it.
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from corral.shared.clients import ClientError, Rejected, RegistryClient, SchedulerClient, Unreachable

from . import runner
from .settings import AgentSettings, safe_path_part

log = logging.getLogger(__name__)

TIMEOUT_MESSAGE = "job timed out"
STOPPED_MESSAGE = "agent stopped before the job finished"
DEPLOY_MESSAGE = "deploy_url artifacts are not supported by this agent yet"

# How often the work loop looks at its processes (finish, timeout) between polls.
TICK_SECS = 0.1
# Bounded effort to deliver the last reports when the agent stops.
FLUSH_SECS = 5.0
# A report refused as too large (413) is sent once more with this much output kept.
SHRUNK_OUTPUT_CHARS = 4096

# Why the agent ended a job itself; None means the job exited on its own.
END_TIMEOUT = "timeout"
END_RECONCILED = "reconciled"  # the scheduler no longer lists it: do not report
END_STOPPING = "stopping"

Key = tuple[str, int]  # (job_id, attempt)


def job_attempt(job: dict) -> int:
    """The attempt a job dict belongs to: `attempt` if the scheduler sends one,
    otherwise `retry_count` (the attempt number in the design's job fields)."""
    value = job.get("attempt")
    if value is None:
        value = job.get("retry_count") or 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"job {job.get('job_id')!r} has a bad attempt number {value!r}")
    return value


def total_memory_mb() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024  # the value is in kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError, AttributeError):
        return None


class Backoff:
    """Delays that double after each failure, up to `cap`; reset() after a success."""

    def __init__(self, initial: float = 0.5, cap: float = 30.0):
        self.initial = min(initial, cap)
        self.cap = cap
        self._next = self.initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self.cap, self._next * 2)
        return delay

    def reset(self) -> None:
        self._next = self.initial


@dataclass
class LocalJob:
    job_id: str
    attempt: int
    job_type: str
    process: runner.RunningJob
    workdir: str
    started_at: float
    deadline: float | None
    end_reason: str | None = None
    killer: threading.Thread | None = None

    @property
    def key(self) -> Key:
        return (self.job_id, self.attempt)


@dataclass
class PendingReport:
    job_id: str
    attempt: int
    status: str
    result: dict
    next_try: float = 0.0
    tries: int = 0
    shrunk: bool = False
    backoff: Backoff = field(default_factory=lambda: Backoff(1.0, 30.0))


class Agent:
    def __init__(self, settings: AgentSettings, registry: RegistryClient,
                 scheduler: SchedulerClient, clock: Callable[[], float] = time.monotonic,
                 start_job: Callable[..., runner.RunningJob] = runner.start):
        self.settings = settings
        self.registry = registry
        self.scheduler = scheduler
        self._clock = clock
        self._start_job = start_job  # the runner seam; a cgroup-aware starter can replace it
        # Only the work loop thread changes these two; the heartbeat thread reads len().
        self._jobs: dict[Key, LocalJob] = {}
        self._outbox: list[PendingReport] = []
        self._stopping = False
        # Set when a job ends so the work loop asks for more work at once.
        self.slot_freed = threading.Event()

    @property
    def node_id(self) -> str:
        return self.settings.node_id

    def running_count(self) -> int:
        return len(self._jobs)

    def free_slots(self) -> int:
        return max(0, self.settings.slots - len(self._jobs))

    def running_keys(self) -> set[Key]:
        return set(self._jobs)

    def pending_reports(self) -> list[PendingReport]:
        return list(self._outbox)

    def work_dir(self, job_id: str, attempt: int) -> str:
        return os.path.join(self.settings.work_root, f"{safe_path_part(job_id)}-{attempt}")

    # --- registry -------------------------------------------------------------

    def node_info(self) -> dict:
        return {
            "node_id": self.node_id,
            "address": self.settings.address,
            "kind": "compute",
            "slots": self.settings.slots,
            "cpus": os.cpu_count(),
            "memory_mb": total_memory_mb(),
            "labels": dict(self.settings.labels),
        }

    def register(self) -> dict:
        answer = self.registry.register_node(self.node_info())
        log.info("registered node %s (%d slots) with %s", self.node_id, self.settings.slots,
                 self.settings.registry_url)
        return answer

    def heartbeat_once(self) -> None:
        try:
            self.registry.heartbeat(self.node_id, running=self.running_count())
        except Rejected as exc:
            if exc.status != 404:
                raise
            # The registry lost its state (or expired us): it needs the full node again.
            log.warning("the registry does not know node %s (%s); registering again",
                        self.node_id, exc.message)
            self.register()

    # --- taking work ----------------------------------------------------------

    def poll_once(self) -> list[Key]:
        """Ask for pending jobs placed on this node and start as many as fit.

        The `running` report goes first and the process starts only if it was
        accepted: an accepted report is the claim, so two agents never both run
        one attempt. Returns the (job_id, attempt) pairs taken.
        """
        if self._stopping or self.free_slots() <= 0:
            return []
        taken: list[Key] = []
        for job in self.scheduler.pending_for(self.node_id):
            if self.free_slots() <= 0:
                break
            try:
                job_id, attempt = str(job["job_id"]), job_attempt(job)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("ignoring a malformed job from the scheduler (%s): %r", exc, job)
                continue
            # A newer attempt of a job we still run waits until reconcile ended the old one.
            if any(local.job_id == job_id for local in self._jobs.values()):
                continue
            try:
                self.scheduler.report(job_id, self.node_id, attempt, "running")
            except Rejected as exc:
                log.info("job %s attempt %s is not ours to start (%s); skipping it",
                         job_id, attempt, exc)
                continue
            except Unreachable as exc:
                # We cannot know whether the claim landed. If it did, reconcile finds
                # the job running here without a process and reports it failed.
                log.warning("could not report job %s attempt %s running (%s); not starting it",
                            job_id, attempt, exc)
                break
            self._start(job, job_id, attempt)
            taken.append((job_id, attempt))
        if self._outbox:
            self.flush_reports()  # jobs that could not start are reported at once
        return taken

    def _start(self, job: dict, job_id: str, attempt: int) -> None:
        job_type = job.get("job_type") or "run"
        if job.get("deploy_url"):
            log.warning("job %s attempt %s needs deploy_url %s, which is not supported yet",
                        job_id, attempt, job["deploy_url"])
            self._enqueue(job_id, attempt, "failed", exit_code=-1, stdout="", stderr=DEPLOY_MESSAGE)
            return
        workdir = self.work_dir(job_id, attempt)
        extra_env = {"CORRAL_NODE_ID": self.node_id, "CORRAL_ATTEMPT": str(attempt)}
        try:
            _fresh_dir(workdir)
            process = self._start_job(job, workdir, runner.build_environment(job, extra_env),
                                      self.settings.output_tail_bytes)
        except (runner.StartError, OSError) as exc:
            exit_code = exc.exit_code if isinstance(exc, runner.StartError) else -1
            log.warning("job %s attempt %s could not start: %s", job_id, attempt, exc)
            self._enqueue(job_id, attempt, "failed", exit_code=exit_code, stdout="",
                          stderr=f"the agent could not start the job: {exc}")
            self._remove_work_dir(workdir, job_type)
            return
        now = self._clock()
        timeout = job.get("timeout_secs")
        deadline = None
        # Only `run` jobs time out; a service runs until it exits or is stopped.
        if job_type == "run" and isinstance(timeout, (int, float)) and not isinstance(timeout, bool) \
                and timeout > 0:
            deadline = now + timeout
        self._jobs[(job_id, attempt)] = LocalJob(job_id, attempt, job_type, process, workdir,
                                                 now, deadline)
        log.info("job %s attempt %s started (pid %d, %s, timeout %s) in %s", job_id, attempt,
                 process.pid, job_type, timeout if deadline is not None else "none", workdir)

    # --- finished processes ---------------------------------------------------

    def reap_once(self) -> list[tuple[str, int, str]]:
        """Kill jobs past their timeout, report jobs that ended, retry due reports.

        Returns (job_id, attempt, outcome) for each job that ended in this pass;
        the outcome is the reported status, or "killed" for a job the scheduler
        had already ended (not reported).
        """
        now = self._clock()
        for local in list(self._jobs.values()):
            if local.end_reason is None and local.deadline is not None and now >= local.deadline:
                log.warning("job %s attempt %s ran past its timeout; killing it",
                            local.job_id, local.attempt)
                self._end(local, END_TIMEOUT)
        ended = []
        for local in list(self._jobs.values()):
            # While a kill is in progress the group may still have members: the slot
            # is free only once the whole tree is gone.
            if local.killer is not None and local.killer.is_alive():
                continue
            if local.process.poll() is None:
                continue
            ended.append(self._finish(local))
        if ended:
            self.slot_freed.set()
        self.flush_reports()
        return ended

    def _finish(self, local: LocalJob) -> tuple[str, int, str]:
        result = local.process.result()
        del self._jobs[local.key]
        self._remove_work_dir(local.workdir, local.job_type)
        if local.end_reason == END_RECONCILED:
            log.info("job %s attempt %s was ended by the scheduler; killed (exit %s), not reported",
                     local.job_id, local.attempt, result.exit_code)
            return (local.job_id, local.attempt, "killed")
        if local.end_reason in (END_TIMEOUT, END_STOPPING):
            message = TIMEOUT_MESSAGE if local.end_reason == END_TIMEOUT else STOPPED_MESSAGE
            status, exit_code, stderr = "failed", -1, _append_line(result.stderr, message)
        else:
            status = "done" if result.exit_code == 0 else "failed"
            exit_code, stderr = result.exit_code, result.stderr
        log.info("job %s attempt %s finished: %s (exit %s)", local.job_id, local.attempt, status,
                 exit_code)
        self._enqueue(local.job_id, local.attempt, status, exit_code=exit_code,
                      stdout=result.stdout, stderr=stderr)
        return (local.job_id, local.attempt, status)

    def _end(self, local: LocalJob, reason: str) -> None:
        """Kill a job's process tree in the background; reap_once reports it after."""
        if local.end_reason is not None:
            return  # already being killed; the first reason is the one reported
        local.end_reason = reason
        # kill() waits up to kill_grace for the group to leave; the work loop must not.
        local.killer = threading.Thread(target=local.process.kill, args=(self.settings.kill_grace,),
                                        name=f"kill-{local.job_id}-{local.attempt}", daemon=True)
        local.killer.start()

    def _remove_work_dir(self, workdir: str, job_type: str) -> None:
        if job_type == "run" and not self.settings.keep_work_dirs:
            shutil.rmtree(workdir, ignore_errors=True)

    # --- reports --------------------------------------------------------------

    def _enqueue(self, job_id: str, attempt: int, status: str, **result) -> None:
        self._outbox.append(PendingReport(job_id, attempt, status, result))

    def flush_reports(self, force: bool = False) -> int:
        """Send the reports that are due (all of them with force); returns how many
        are still undelivered. Unreachable: kept and retried with backoff.
        Rejected: the attempt is stale or unknown, nothing to retry; dropped."""
        now = self._clock()
        for report in list(self._outbox):
            if not force and report.next_try > now:
                continue
            try:
                self._send(report)
            except Unreachable as exc:
                report.tries += 1
                delay = report.backoff.next()
                report.next_try = self._clock() + delay
                log.warning("could not deliver the %s report of job %s attempt %s (try %d): %s; "
                            "retrying in %.1fs", report.status, report.job_id, report.attempt,
                            report.tries, exc, delay)
                break  # the scheduler is down or slow: one timeout per pass is enough
            except Rejected as exc:
                log.warning("the scheduler refused the %s report of job %s attempt %s (%s); "
                            "dropping it", report.status, report.job_id, report.attempt, exc)
            self._outbox.remove(report)
        return len(self._outbox)

    def _send(self, report: PendingReport) -> None:
        try:
            self.scheduler.report(report.job_id, self.node_id, report.attempt, report.status,
                                  **report.result)
        except Rejected as exc:
            if exc.status != 413 or report.shrunk:
                raise
            # Too large for the scheduler: keep less output rather than lose the outcome.
            report.shrunk = True
            for name in ("stdout", "stderr"):
                if isinstance(report.result.get(name), str):
                    report.result[name] = report.result[name][-SHRUNK_OUTPUT_CHARS:]
            log.warning("the %s report of job %s attempt %s was too large; sending the last "
                        "%d characters of output", report.status, report.job_id, report.attempt,
                        SHRUNK_OUTPUT_CHARS)
            self.scheduler.report(report.job_id, self.node_id, report.attempt, report.status,
                                  **report.result)

    # --- reconcile --------------------------------------------------------------

    def reconcile_once(self) -> list[Key]:
        """Compare what runs here with what the scheduler thinks runs here.

        A local job missing from the scheduler's running list was ended there
        (timed out, moved, cancelled): kill it, do not report. Only jobs known
        before the request was sent count, since their `running` report was
        accepted before it. A job listed as running here that this agent neither
        runs nor still has a report for was lost (a restart, a claim whose answer
        never arrived): it is reported failed so it does not hold the node forever.
        Returns the keys of the jobs killed.
        """
        known = set(self._jobs)
        listed: set[Key] = set()
        for job in self.scheduler.running_on(self.node_id):
            try:
                listed.add((str(job["job_id"]), job_attempt(job)))
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("ignoring a malformed job from the scheduler (%s): %r", exc, job)
        killed = []
        for key in sorted(known - listed):
            local = self._jobs.get(key)
            if local is None or local.end_reason is not None:
                continue
            log.warning("job %s attempt %s is no longer running here according to the scheduler; "
                        "killing it", *key)
            self._end(local, END_RECONCILED)
            killed.append(key)
        unreported = {(r.job_id, r.attempt) for r in self._outbox}
        for job_id, attempt in sorted(listed - set(self._jobs) - unreported):
            log.warning("job %s attempt %s is running on this node according to the scheduler, "
                        "but this agent does not run it; reporting it failed", job_id, attempt)
            self._enqueue(job_id, attempt, "failed", exit_code=-1, stdout="",
                          stderr=f"the agent on node {self.node_id} was not running this job "
                                 "(it restarted or lost track of it)")
        return killed

    # --- loops ------------------------------------------------------------------

    def register_until_done(self, stop_event: threading.Event) -> bool:
        """Register, retrying with backoff until the registry answers; False if stopped first."""
        backoff = Backoff(1.0, 30.0)
        while not stop_event.is_set():
            try:
                self.register()
                return True
            except ClientError as exc:
                delay = backoff.next()
                log.warning("registering node %s failed: %s; retrying in %.1fs", self.node_id,
                            exc, delay)
            except Exception:
                delay = backoff.next()
                log.exception("registering node %s failed; retrying in %.1fs", self.node_id, delay)
            stop_event.wait(delay)
        return False

    def heartbeat_loop(self, stop_event: threading.Event) -> None:
        # Failures are retried sooner than the interval, never later: a late
        # heartbeat is what gets a healthy node marked unhealthy.
        interval = self.settings.heartbeat_interval
        backoff = Backoff(min(0.5, interval), interval)
        while not stop_event.is_set():
            try:
                self.heartbeat_once()
                backoff.reset()
                delay = interval
            except ClientError as exc:
                delay = backoff.next()
                log.warning("heartbeat failed: %s; retrying in %.1fs", exc, delay)
            except Exception:
                delay = backoff.next()
                log.exception("heartbeat failed; retrying in %.1fs", delay)
            stop_event.wait(delay)

    def run_forever(self, stop_event: threading.Event, once: bool = False) -> int:
        """Register, then heartbeat on a thread of its own and run the work loop in
        this thread until stop_event is set (or, with once, until the jobs of one
        successful poll have ended). Then stop: see shutdown(). Returns the exit
        status: 0, or 1 in once mode when reports could not be delivered."""
        if not self.register_until_done(stop_event):
            return 0
        heartbeat_stop = threading.Event()
        heartbeats = threading.Thread(target=self.heartbeat_loop, args=(heartbeat_stop,),
                                      name="heartbeat", daemon=True)
        heartbeats.start()
        try:
            self._work_loop(stop_event, once)
        finally:
            # Heartbeats go on while running jobs are given their grace period.
            undelivered = self.shutdown()
            heartbeat_stop.set()
            heartbeats.join(timeout=1.0)
        return 1 if once and undelivered else 0

    def _work_loop(self, stop_event: threading.Event, once: bool) -> None:
        reap_backoff = Backoff(0.5, 30.0)
        poll_backoff = Backoff(1.0, 30.0)
        next_reap = next_poll = self._clock()
        poll_ok = True
        polled = False  # once mode: a poll succeeded, take no more work
        while not stop_event.is_set():
            if once and polled and not self._jobs:
                return
            now = self._clock()
            if now >= next_reap:
                try:
                    self.reap_once()
                    reap_backoff.reset()
                except Exception:
                    delay = reap_backoff.next()
                    log.exception("checking jobs failed; retrying in %.1fs", delay)
                    next_reap = self._clock() + delay
            # A freed slot means poll now, unless the scheduler is failing (then the
            # backoff decides).
            if now >= next_poll or (poll_ok and self.slot_freed.is_set()):
                self.slot_freed.clear()
                try:
                    self.reconcile_once()
                    if not (once and polled):
                        self.poll_once()
                        polled = True
                    poll_backoff.reset()
                    poll_ok = True
                    next_poll = self._clock() + self.settings.poll_interval
                except Exception as exc:
                    poll_ok = False
                    delay = poll_backoff.next()
                    if isinstance(exc, ClientError):
                        log.warning("asking the scheduler for work failed: %s; retrying in %.1fs",
                                    exc, delay)
                    else:
                        log.exception("asking the scheduler for work failed; retrying in %.1fs",
                                      delay)
                    next_poll = self._clock() + delay
            stop_event.wait(TICK_SECS)

    def shutdown(self, flush_secs: float = FLUSH_SECS) -> int:
        """Stop taking work, give running jobs stop_grace seconds, kill the rest
        (reported failed), then try for about flush_secs to deliver every report.
        Returns how many reports are still undelivered."""
        self._stopping = True
        if self._jobs:
            log.info("stopping: %d job(s) running, waiting up to %.1fs for them",
                     len(self._jobs), self.settings.stop_grace)
        self._reap_until_empty(self._clock() + self.settings.stop_grace)
        if self._jobs:
            log.warning("stopping: killing %d job(s) that did not finish in time", len(self._jobs))
            for local in list(self._jobs.values()):
                self._end(local, END_STOPPING)
            # kill() takes at most kill_grace, then SIGKILL and reap.
            self._reap_until_empty(self._clock() + self.settings.kill_grace + 5.0)
        deadline = self._clock() + flush_secs
        while self._outbox and self._clock() < deadline:
            if self.flush_reports(force=True):
                time.sleep(0.2)  # brief pause between tries; bounded by the deadline
        if self._outbox:
            log.warning("stopping with %d undelivered report(s): %s", len(self._outbox),
                        ", ".join(f"{r.job_id} attempt {r.attempt} {r.status}" for r in self._outbox))
        return len(self._outbox)

    def _reap_until_empty(self, deadline: float) -> None:
        while self._jobs and self._clock() < deadline:
            try:
                self.reap_once()
            except Exception:
                log.exception("checking jobs failed while stopping")
            if self._jobs:
                time.sleep(TICK_SECS)


def _fresh_dir(path: str) -> None:
    """An empty work dir: leftovers of an earlier agent's run of the same attempt go."""
    if os.path.lexists(path):
        shutil.rmtree(path)
    os.makedirs(path)


def _append_line(text: str, line: str) -> str:
    if text and not text.endswith("\n"):
        text += "\n"
    return text + line
