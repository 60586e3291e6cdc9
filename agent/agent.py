"""The agent's logic: register, heartbeat, take jobs, run them, report how they ended.

The Agent holds a node's parts together and offers each step as a small one-pass
method (startup, register, heartbeat_once, poll_once, claim_once, take_claimed,
reap_once, reconcile_once, flush_reports) that tests call directly; daemon.py only
schedules them on threads (work loop, claim, heartbeat, lease, fence, warm launch,
live output) and stops them. Its parts: the job table (jobs.py), the registry and
the lease (membership.py, lease.py), taking work (claims.py), a job's preparation
(prepare.py), its end and report (endings.py), the outbox of reports (reports.py),
the reconcile decisions (reconcile.py), the work loop's pass (workloop.py), service
jobs (servicejobs.py), start-up (startup.py), the warm launch (warm.py) and live
output (live_output.py). The scheduler's database is the
truth about jobs: the agent keeps in memory only the processes it runs and the
reports it has not delivered yet, both of which die with it (services excepted:
see below).

Taking a job. With long-poll (AGENT_LONG_POLL_SECS > 0, the default) a claim
thread keeps one `POST /nodes/{id}/claim` waiting on the scheduler for as many
jobs as there are free slots; the scheduler answers the moment work is placed
here, each job already `running` for its attempt (the claim is the same
transition as a `running` report, with the limits it will get). The claimed jobs
go to the work loop through the job table's queue (jobs.py). When jobs end, their reports
(POST /jobs/reports) carry a claim for the slots they freed, so a busy node gets
its next jobs with the answer to its reports, in one round trip; the claim thread
is woken at once only for slots still free after that. With AGENT_LONG_POLL_SECS=0
(the original design's agents) it polls instead: it asks `GET
/jobs?node_id=..&status=pending` every POLL_INTERVAL_SECS and the `running` report
goes first and is the claim; it also says which limits the job will get
(`limits_enforced`, `limits`, `private_tmp`).
Either way, a worker thread per job then prepares it: a fresh work dir (0700), the
`deploy_url` zip fetched and unpacked into it (artifacts.py), a uid of the job's own
(identity.py) that gets everything in it, a cgroup with the job's limits
(cgroups.py), its environment from an allowlist (jobenv.py); then it starts the
process through launch.py's chain: private /tmp, cgroup, privilege drop, and only
then the job's environment. The job holds its slot (claimed, then held, in the
job table) from the claim on, so reconcile never takes it for lost, and the work loop
never waits for a slow download. A job cancelled or timed out
while it is prepared is not started.

Limits: the job's `memory_mb` / `cpu_percent` / `max_processes`, or the node's
default (per job type; AGENT_JOB_MAX_PROCESSES); asking for more than
AGENT_MAX_MEMORY_MB / AGENT_MAX_CPU_PERCENT / AGENT_MAX_PROCESSES fails the job. A
job whose env_vars set LD_PRELOAD or LD_AUDIT fails without anything started.
Without usable cgroups (not root, no writable hierarchy) jobs run without
limits, `limits_enforced` is false, and AGENT_REQUIRE_CGROUPS=true makes the agent
refuse to start instead.

A `deploy_url` job without a `command` runs the archive's top-level `run.sh`:
`exec ./run.sh` when the file has an execute bit (so its #! line picks the
interpreter), else `exec /bin/sh ./run.sh` (zips made without Unix modes lose
the bit). A job with both runs its command in the unpacked tree.

Finishing: the report carries `oom_killed` (the job died of SIGKILL and its
cgroup's OOM counter went up; stderr then ends with "job killed: out of memory
(limit N MB)"), `peak_memory_bytes` and `cpu_seconds` from the cgroup (null when
unknown). The cgroup is always removed and the job's uid given back; the work dir
of a finished job (and the log files of a finished service) unless
CORRAL_KEEP_WORK_DIRS.

Services (services.py) run detached, are recorded in the registry and
health-checked, and are stopped only when they exit or the scheduler cancels them.
Stopping the agent (SIGTERM) stops taking work, gives run jobs AGENT_STOP_GRACE_SECS,
kills and reports the rest, and LEAVES SERVICES RUNNING with their state files:
the next agent on this node re-adopts them, so restarting the agent does not
restart every service.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable

from corral.shared.backoff import Backoff
from corral.shared.clients import ClientError, RegistryClient, SchedulerClient

from . import cgroups, daemon, diskfs, identity, jobenv, launch, reconcile, runner, startup, warm
from .claims import Claims
from .disk import DiskWatch
from .endings import STOPPED_MESSAGE, TIMEOUT_MESSAGE, Endings
from .jobs import END_RECONCILED, JobTable, LocalJob
from .log_shipping import LogShipper
from .lease import Lease
from .membership import Membership
from .prepare import Plan, Preparer, applied_limits, default_limits, plan_of, warm_limits
from .reconcile import Key, listed_keys
from .reports import Outbox, PendingReport
from .servicejobs import ServiceJobs, detachable
from .settings import AgentSettings, safe_path_part, total_memory_mb

log = logging.getLogger(__name__)

__all__ = ["Agent", "AgentStartError", "Backoff", "LocalJob", "Plan", "STOPPED_MESSAGE", "TIMEOUT_MESSAGE",
           "total_memory_mb"]


class AgentStartError(Exception):
    """The agent must not start (AGENT_REQUIRE_CGROUPS without usable cgroups)."""


class Agent:
    def __init__(self, settings: AgentSettings, registry: RegistryClient,
                 scheduler: SchedulerClient, clock: Callable[[], float] = time.monotonic,
                 start_job: Callable[..., runner.RunningJob] = runner.start,
                 cgroup_manager: cgroups.Manager | None = None,
                 job_identity: identity.Identity | identity.JobUsers | None = None,
                 private_tmp: bool | None = None):
        """`cgroup_manager`, `job_identity` (one Identity for every job, or a policy)
        and `private_tmp` default to what startup() detects (cgroups.detect,
        identity.job_users from the settings, launch.private_tmp_problem)."""
        self.settings = settings
        self.registry = registry
        self.scheduler = scheduler
        self._clock = clock
        self._start_job = start_job  # the runner seam
        self.cgroups = cgroup_manager
        self.users = (identity.JobUsers(job_identity, "fixed") if isinstance(job_identity, identity.Identity)
                      else job_identity)
        self.private_tmp = private_tmp
        self.private_tmp_reason = ""
        self._fstab = os.path.join(settings.agent_dir, launch.FSTAB_NAME)
        self._started = False
        self._stopping = False
        # The held and claimed jobs (jobs.py): only the work loop adds and removes held
        # ones; other threads read snapshots; a preparing thread changes its own LocalJob.
        self.jobs = JobTable()
        # Work dirs held to their disk_mb, and no new work under the free-space floor (disk.py).
        self.disk = DiskWatch(settings.work_root, settings.min_free_disk_mb, settings.disk_check_interval,
                              self.jobs, self._end, full=lambda path: self.disk_fs_on and self.diskfs.full(path))
        # The work dirs' own filesystems (diskfs.py), when startup() finds them usable.
        self.diskfs = diskfs.DiskFs(os.path.join(settings.agent_dir, "disk"), settings.work_root)
        self.disk_fs_on = False
        # The heartbeats say why no new work is taken (the floor), so the scheduler knows.
        self.membership = Membership(settings, registry, scheduler, self.jobs, self._end, clock,
                                     self.default_limits, self.limits_enforced, lambda: self.disk.low)
        self.claims = Claims(self)
        self.outbox = Outbox(settings.node_id, scheduler, clock, self.claims.queue, self.claims.answer_lost)
        self.services = ServiceJobs(settings, registry, self.jobs, clock)
        # The complete logs: every attempt's output, shipped whole (log_shipping.py).
        self.logs = LogShipper(settings.node_id, settings.output_root, settings.log_max_bytes)
        # Set when a job ends so the work loop asks for more work at once.
        self.slot_freed = threading.Event()
        self._work_wake = threading.Event()   # claimed jobs, or a job's output closed: the work loop looks
        # Jobs the scheduler lists here that this agent does not know, with the claims
        # sent by then (see reconcile_once).
        self._suspects: dict[Key, int] = {}
        # Made by startup(), from what it detects: the job launch kept started ahead
        # (warm.py; None when off), a job's preparation, and its end.
        self.warm: warm.WarmKeeper | None = None
        self._preparer: Preparer | None = None
        self.endings: Endings | None = None

    @property
    def node_id(self) -> str:
        return self.settings.node_id

    @property
    def long_poll(self) -> bool:
        """Work comes by long-poll claims (else by polling)."""
        return self.membership.long_poll

    @property
    def lease(self) -> Lease:
        return self.membership.lease

    def running_count(self) -> int:
        return len(self.jobs)

    def free_slots(self) -> int:
        """Slots neither running a job nor holding a claimed one (under the job table's
        lock, which also covers moving a job from claimed to running)."""
        return self.jobs.free(self.settings.slots)

    def running_keys(self) -> set[Key]:
        return self.jobs.keys()

    def held_jobs(self) -> list[LocalJob]:
        """The jobs this agent holds (a snapshot: live output, the lease and fence threads)."""
        return self.jobs.snapshot()

    def local_job(self, job_id: str, attempt: int) -> LocalJob | None:
        return self.jobs.get((job_id, attempt))

    def pending_reports(self) -> list[PendingReport]:
        return list(self.outbox)

    def claimed_keys(self) -> list[Key]:
        """Jobs claimed but not started yet (waiting for the work loop)."""
        return self.jobs.claimed_keys()

    def work_dir(self, job_id: str, attempt: int) -> str:
        return os.path.join(self.settings.work_root, f"{safe_path_part(job_id)}-{attempt}")

    # --- start-up ---------------------------------------------------------------

    def startup(self) -> list[Key]:
        """Detect cgroups and the job user, re-adopt the services an earlier agent
        left running, and remove every other leftover job cgroup of this node.
        Idempotent. Raises AgentStartError (AGENT_REQUIRE_CGROUPS without cgroups)
        and SettingError (a bad job user). Returns the keys of the adopted services."""
        if self._started:
            return []
        s = self.settings
        if self.cgroups is None:
            self.cgroups = cgroups.detect(root_name=s.cgroup_root_name)
        if self.cgroups.enforced:
            log.info("job limits are enforced: %s", self.cgroups.reason)
        elif s.require_cgroups:
            raise AgentStartError(f"AGENT_REQUIRE_CGROUPS is set but job limits cannot be "
                                  f"enforced: {self.cgroups.reason}")
        else:
            log.warning("jobs run WITHOUT memory and cpu limits: %s", self.cgroups.reason)
        startup.make_dirs(s)
        self.diskfs, self.disk_fs_on = startup.detect_disk_fs(s, wanted=self._start_job is runner.start)
        try:  # before the first claim: a node short of space takes nothing
            self.disk.check_floor()
        except OSError as exc:
            log.warning("could not read the free space of %s: %s", s.work_root, exc)
        if self.users is None:
            self.users = identity.job_users(s.run_as_root, s.job_user, s.uid_range, s.uid_pool_path,
                                            kill_leftovers=not self.cgroups.enforced)
        if self.users.mode == "per-job":
            log.info("jobs run as a uid of their own from %d-%d", *s.uid_range)
        else:
            who = self.users.identity
            log.info("jobs run as %s (uid %d)%s", who.name, who.uid, f": {who.note}" if who.note else "")
        runner.tools()  # the launch programs, looked up once
        self.private_tmp, self.private_tmp_reason = startup.detect_private_tmp(s, self._fstab, self.private_tmp)
        self.endings = Endings(s, self.jobs, self.outbox, self.users, lambda: self.lease.secs or 0, self._clock,
                               self.logs, diskfs=self.diskfs)
        adopted_keys, ended = self.services.adopt(self.cgroups, self.users)
        adopted = [self.jobs.held(key) for key in adopted_keys]
        for gone in ended:
            # Sent by the work loop's first pass, right after registering: the scheduler
            # learns it at once instead of when this node's lease or a reconcile runs out.
            self.outbox.add(gone.state.job_id, gone.state.attempt, "failed", exit_code=-1, stdout=gone.stdout,
                            stderr=gone.stderr, oom_killed=False, peak_memory_bytes=None, cpu_seconds=None)
        for local in adopted:  # their output goes on being shipped (from where the scheduler is)
            if local.log_files:
                self.logs.follow_files(local.job_id, local.attempt, local.log_files)
        self.cgroups.remove_job_cgroups({local.cgroup.name for local in adopted if local.cgroup},
                                        why="left over by an earlier agent")
        for key, uid in self.users.forget_others(local.user_key for local in adopted if local.user_key):
            log.info("uid %d of job %s (left by an earlier agent) is free again", uid, key)
        if not s.keep_work_dirs:
            self.diskfs.sweep(local.workdir for local in adopted)
            startup.remove_leftover_files(s, [path for local in adopted
                                              for path in (local.workdir, *(local.log_files or ()))])
        self._keep_warm(self.users, self.cgroups)
        self._preparer = Preparer(s, self.node_id, self.users, self.cgroups, self.warm, bool(self.private_tmp),
                                  self._private_tmp_of, jobenv.from_agent(os.environ, s.job_env_passthrough),
                                  self._start_job, stopping=lambda: self._stopping, wake=self._work_wake.set,
                                  service_started=self.services.started, shipper=self.logs,
                                  diskfs=self.diskfs if self.disk_fs_on else None)
        self._started = True
        return [local.key for local in adopted]

    def _keep_warm(self, users: identity.JobUsers, cgroup_manager: cgroups.Manager) -> None:
        """Keep a launch started ahead (warm.py) when AGENT_WARM_START is on and jobs run
        through the real runner. With a uid per job the range must have one uid more than
        the slots: the warm launch holds one while every slot may hold one too."""
        s = self.settings
        if not s.warm_start or self._start_job is not runner.start:
            return
        if users.mode == "per-job" and s.uid_range[1] - s.uid_range[0] + 1 <= s.slots:
            log.info("no warm job launch: AGENT_UID_RANGE has no uid beyond one per slot")
            return
        self.warm = warm.WarmKeeper(users, cgroup_manager, s.output_tail_bytes, self._private_tmp_of,
                                    warm_limits(self.plan({"job_type": "run"})),
                                    wanted=lambda: not self._stopping and self.free_slots() > 0,
                                    # It waits in the work dirs' directory and enters the
                                    # job's by a relative path (runner.WarmStart.launch).
                                    start=functools.partial(runner.start_warm, cwd=s.work_root),
                                    clock=self._clock)

    def _private_tmp_of(self, memory_mb: int) -> launch.PrivateTmp | None:
        """The private /tmp of a job with `memory_mb` (None: jobs get none here)."""
        return launch.PrivateTmp(self._fstab, memory_mb) if self.private_tmp else None

    def _require_startup(self) -> None:
        if not self._started:
            raise RuntimeError("Agent.startup() must run before the agent takes or checks jobs")

    # --- the registry and the lease (membership.py) -----------------------------------

    def register(self) -> dict:
        return self.membership.register()

    def heartbeat_once(self) -> None:
        self.membership.heartbeat_once()

    def renew_lease_once(self) -> None:
        self.membership.renew_with(self.scheduler)

    def holds_work(self) -> bool:
        return self.membership.holds_work()

    def lease_lapsed(self) -> bool:
        return self.membership.lapsed()

    def claims_blocked(self) -> bool:
        """No claims while fencing (Membership.claims_blocked) or under the free-space floor (disk.py)."""
        return self.membership.claims_blocked() or self.disk.low is not None

    def check_disk_once(self) -> list[Key]:
        """The disk thread's pass (DiskWatch.check_once): the floor read, jobs past their
        disk limit ended; their keys."""
        self._require_startup()
        return self.disk.check_once()

    def fence_once(self) -> list[Key]:
        return self.membership.fence_once()

    # --- taking work ----------------------------------------------------------

    def plan(self, job: dict) -> Plan:
        return plan_of(self.settings, job)

    def default_limits(self) -> dict:
        return default_limits(self.settings, self._limits_processes())

    def applied_limits(self, limits: dict) -> dict:
        return applied_limits(limits, self._limits_processes())

    def limits_enforced(self) -> bool:
        """Whether jobs run in cgroups with their limits here (detected at start-up, before
        any claim or renewal)."""
        return self.cgroups is not None and self.cgroups.enforced

    def _limits_processes(self) -> bool:
        """Whether jobs' process counts are limited here (a pids controller; known after startup)."""
        return self.cgroups is not None and self.cgroups.limits_processes

    def poll_once(self) -> list[Key]:
        """Take work by polling (Claims.poll_once)."""
        return self.claims.poll_once()

    def claim_once(self, client: SchedulerClient | None = None, wait_secs: float = 0.0
                   ) -> tuple[list[Key], bool]:
        """One claim (Claims.claim_once)."""
        return self.claims.claim_once(client, wait_secs)

    def take_claimed(self) -> list[Key]:
        """Start preparing the claimed jobs (Claims.take_claimed)."""
        return self.claims.take_claimed()

    # --- ending jobs (endings.py) -----------------------------------------------

    def _endings(self) -> Endings:
        self._require_startup()
        assert self.endings is not None  # made by startup()
        return self.endings

    def _end(self, local: LocalJob, reason: str) -> bool:
        return self._endings().end(local, reason)

    def reap_once(self) -> list[tuple[str, int, str]]:
        """Kill jobs past their timeout, report jobs that ended, retry due reports.
        Returns (job_id, attempt, outcome) for each job that ended in this pass
        (Endings.reap)."""
        self.fence_once()
        ended = self._endings().reap()
        if ended:
            self.slot_freed.set()
            if self.warm is not None:
                self.warm.wake()
        # With long-poll, the reports of the jobs that ended ask for the next jobs too
        # (one round trip instead of a report and a claim); the claim thread asks at
        # once only for the slots still free after that.
        self.flush_reports(claim=bool(ended))
        if ended and self.free_slots() > 0:
            self.claims.wake.set()
        return ended

    def flush_reports(self, force: bool = False, claim: bool = False) -> int:
        """Send the reports that are due (all of them with force): Outbox.flush; with
        `claim`, the batch also claims jobs for the free slots (Claims.riding).
        How many are still undelivered."""
        return self.outbox.flush(force, self.claims.riding if claim else None)

    # --- reconcile --------------------------------------------------------------

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
        self._require_startup()
        self.take_claimed()
        known = self.jobs.keys() | set(self.claimed_keys())
        listed, malformed = listed_keys(self.scheduler.running_on(self.node_id))
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
            self._end(local, END_RECONCILED)
            killed.append(key)
        claims_done = self.claims.done  # before looking at the queue: what was handled is in it
        known = self.jobs.keys() | set(self.claimed_keys()) | {(r.job_id, r.attempt) for r in self.outbox}
        lost, self._suspects = reconcile.lost_here(listed, known, self._suspects, claims_sent, claims_done)
        for key in lost:
            log.warning("job %s attempt %s is running on this node according to the scheduler, "
                        "but this agent does not run it; reporting it failed", *key)
            # The node's doing, not the job's (the job may never have started): it goes
            # back to pending without spending a retry, like a node loss.
            self.outbox.add_failed(*key, -1, f"the agent on node {self.node_id} was not running this job "
                                           "(it restarted or lost track of it)", requeue=True)
        return killed

    def reconcile_paced(self, backoff: Backoff) -> float:
        """reconcile_once; when the next one is due. An idle agent (no job held or
        claimed) skips it unless its last lease answer listed attempts it does not
        hold: that answer (once a minute when idle, and soon after a claim that got
        no answer) already says what runs here, and an idle agent has nothing to
        kill, so a fleet of idle agents sends no reconcile requests (one every
        POLL_INTERVAL_SECS per agent otherwise)."""
        if not self.holds_work() and not self.membership.unknown_listed:
            return self._clock() + self.settings.poll_interval
        try:
            self.reconcile_once()
            self.membership.unknown_listed = False  # (a renewal meanwhile that lists one again sets it again)
            backoff.reset()
            return self._clock() + self.settings.poll_interval
        except Exception as exc:
            delay = backoff.next()
            if isinstance(exc, ClientError):
                log.warning("checking jobs with the scheduler failed: %s; retrying in %.1fs", exc, delay)
            else:
                log.exception("checking jobs with the scheduler failed; retrying in %.1fs", delay)
            return self._clock() + delay

    # --- running and stopping (daemon.py) -----------------------------------------

    def only_services_left(self) -> bool:
        return all(detachable(local) for local in self.jobs.snapshot())

    def detach_services(self) -> list[Key]:
        return self.services.detach()

    def run_forever(self, stop_event: threading.Event, once: bool = False) -> int:
        return daemon.run(self, stop_event, once)

    def shutdown(self, flush_secs: float = daemon.FLUSH_SECS) -> int:
        return daemon.shutdown(self, flush_secs)
