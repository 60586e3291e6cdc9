"""The agent's composition root.

The Agent makes a node's parts and wires them to one another, each with the narrow
collaborators it needs (never the Agent itself).

Its own steps are the ones that span parts: startup (detect what the node offers, re-adopt
services, make the parts that need what it found) and reap_once (end jobs, report, claim
for the freed slots). Tests drive the parts' one-pass methods directly; daemon.py runs
them on threads. How the agent behaves: docs/agent.md.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable

from corral.shared import states, wire
from corral.shared.backoff import Backoff
from corral.shared.clients import RegistryClient, SchedulerClient

from . import cgroups, daemon, devices, diskfs, identity, jobenv, launch, runner, startup, warm
from . import gpus as gpu_discovery
from .claims import Claims, ClaimsNeed
from .disk import DiskWatch
from .endings import STOPPED_MESSAGE, TIMEOUT_MESSAGE, Endings
from .gpu_usage import GpuMeter, NvmlReader
from .intake import Intake
from .jobs import JobTable, LocalJob
from .log_shipping import LogShipper
from .membership import Membership
from .prepare import Plan, Preparer, applied_limits, default_limits, plan_of, warm_limits
from .reconcile import Key
from .reconciler import Reconciler
from .reports import Outbox
from .servicejobs import ServiceJobs
from .settings import AgentSettings, total_memory_mb
from .slot_cgroups import SlotCgroups
from .workloop import Steps

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
        self.isolation: devices.Isolation | None = None  # how jobs are held to their GPUs (startup)
        self._fstab = os.path.join(settings.agent_dir, launch.FSTAB_NAME)
        self._started = False
        self.stopping = threading.Event()  # set once the agent stops: no new work
        # Set when a job ends so the work loop asks for more work at once.
        self.slot_freed = threading.Event()
        self._work_wake = threading.Event()   # claimed jobs, or a job's output closed: the work loop looks
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
        self.claims = Claims(ClaimsNeed(
            settings.node_id, scheduler, self.jobs, self.membership.lease, clock, self.stopping,
            blocked=self.claims_blocked, free_slots=self.free_slots, terms=self._claim_terms,
            refused_backoff=self.membership.refused_backoff, work_wake=self._work_wake,
            long_poll=self.membership.long_poll, long_poll_secs=settings.long_poll_secs,
            poll_interval=settings.poll_interval))
        self.outbox = Outbox(settings.node_id, scheduler, clock, self.claims.queue, self.claims.answer_lost)
        self.services = ServiceJobs(settings, registry, self.jobs, clock)
        # The complete logs: every attempt's output, shipped whole (log_shipping.py).
        self.logs = LogShipper(settings.node_id, settings.output_root, settings.log_max_bytes)
        # Made by startup(), from what it detects: the job launch kept started ahead
        # (warm.py; None when off), a job's preparation, and its end.
        self.warm: warm.WarmKeeper | None = None
        self.slots: SlotCgroups | None = None  # run jobs' cgroups kept between jobs (slot_cgroups.py)
        self.endings: Endings | None = None
        self.intake: Intake | None = None  # taking claimed or polled jobs in
        self.reconciler: Reconciler | None = None  # comparing with the scheduler

    def free_slots(self) -> int:
        """Slots neither running a job nor holding a claimed one (under the job table's
        lock, which also covers moving a job from claimed to running)."""
        return self.jobs.free(self.settings.slots)

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
            self.cgroups = cgroups.detect(root_name=s.cgroup_root_name, devices=bool(s.gpus))
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
        if s.gpus:  # found while the settings were read, before logging was set up
            log.info("GPUs: %s", gpu_discovery.describe(s.gpus))
        try:
            self.isolation = startup.detect_isolation(s, self.cgroups)
        except ValueError as exc:
            raise AgentStartError(str(exc)) from None
        if s.gpus:  # what they use, read with each renewal and reported with each job
            self.membership.usage.gpus = GpuMeter(NvmlReader.open(), [gpu.uuid for gpu in s.gpus])
        gpus = self.membership.usage.gpus
        self.slots = self._slot_cgroups()
        self.endings = Endings(s, self.jobs, self.outbox, self.users, lambda: self.membership.lease.secs or 0,
                               self._clock,
                               self.logs, diskfs=self.diskfs,
                               gpu_use=gpus.take if gpus is not None else lambda key: {},
                               slots=self.slots)
        adopted_keys, ended = self.services.adopt(self.cgroups, self.users)
        adopted = [self.jobs.held(key) for key in adopted_keys]
        for gone in ended:
            # Sent by the work loop's first pass, right after registering: the scheduler
            # learns it at once instead of when this node's lease or a reconcile runs out.
            self.outbox.add(gone.state.job_id, gone.state.attempt, states.FAILED, exit_code=-1, stdout=gone.stdout,
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
        preparer = Preparer(s, s.node_id, self.users, self.cgroups, self.warm, bool(self.private_tmp),
                            self._private_tmp_of, jobenv.from_agent(os.environ, s.job_env_passthrough),
                            self._start_job, stopping=self.stopping.is_set, wake=self._work_wake.set,
                            service_started=self.services.started, shipper=self.logs,
                            diskfs=self.diskfs if self.disk_fs_on else None, isolation=self.isolation,
                            slots=self.slots)
        self.intake = Intake(s, self.scheduler, self.jobs, self.outbox, preparer, self._clock, self.stopping,
                             self.free_slots, self.membership.lapsed, lambda: self.disk.low is not None,
                             self.endings.node_side_message, self.limits_enforced, self.applied_limits,
                             bool(self.private_tmp), self.claims.taken)
        self.reconciler = Reconciler(s, self.scheduler, self.jobs, self.outbox, self.claims, self.membership,
                                     self.endings.end, self.intake.take_claimed, self._clock)
        self._started = True
        return [local.key for local in adopted]

    def _slot_cgroups(self) -> SlotCgroups | None:
        """Run jobs' cgroups kept from one job to the next (slot_cgroups.py), where jobs
        start through the fork server (whose start is cheap enough for it to matter) and
        a cgroup can be reused safely."""
        if not (runner.fork_server_in_use() and self._start_job is runner.start and self.cgroups is not None
                and self.cgroups.enforced and self.cgroups.reusable and self.isolation is None):
            return None
        return SlotCgroups(self.cgroups, self.settings.slots)

    def _keep_warm(self, users: identity.JobUsers, cgroup_manager: cgroups.Manager) -> None:
        """Keep a launch started ahead (warm.py) when AGENT_WARM_START is on and jobs run
        through the real runner. With a uid per job the range must have one uid more than
        the slots: the warm launch holds one while every slot may hold one too."""
        s = self.settings
        if not s.warm_start or self._start_job is not runner.start:
            return
        if runner.fork_server_in_use():
            return  # a job starts with one clone and one exec: nothing to start ahead
        if self.isolation is not None and self.isolation.mode == devices.MOUNT:
            # A warm chain's namespace is made before its job, and so its /dev.
            log.info("no warm job launch: each job's /dev is made for its own GPUs")
            return
        if users.mode == "per-job" and s.uid_range[1] - s.uid_range[0] + 1 <= s.slots:
            log.info("no warm job launch: AGENT_UID_RANGE has no uid beyond one per slot")
            return
        self.warm = warm.WarmKeeper(users, cgroup_manager, s.output_tail_bytes, self._private_tmp_of,
                                    warm_limits(plan_of(s, {"job_type": wire.JOB_RUN})),
                                    wanted=lambda: not self.stopping.is_set() and self.free_slots() > 0,
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

    # --- what the node offers jobs ----------------------------------------------

    def claims_blocked(self) -> bool:
        """No claims while fencing (Membership.claims_blocked) or under the free-space floor (disk.py)."""
        return self.membership.claims_blocked() or self.disk.low is not None

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

    def _claim_terms(self) -> dict:
        """What a claim says of this node: whether limits are enforced, the default limits,
        whether jobs get a private /tmp."""
        self._require_startup()
        return {"limits_enforced": self.limits_enforced(), "default_limits": self.default_limits(),
                "private_tmp": bool(self.private_tmp)}

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
        self.membership.fence_once()
        ended = self._endings().reap()
        if ended:
            self.slot_freed.set()
            if self.warm is not None:
                self.warm.wake()
        # With long-poll, the reports of the jobs that ended ask for the next jobs too
        # (one round trip instead of a report and a claim); the claim thread asks at
        # once only for the slots still free after that.
        self.outbox.flush(claim=self.claims.riding if ended else None)
        if ended and self.free_slots() > 0:
            self.claims.wake.set()
        return ended

    # --- running and stopping (daemon.py) -----------------------------------------

    def run_forever(self, stop_event: threading.Event, once: bool = False) -> int:
        """Start up, then run the agent's threads until stop_event is set (daemon.run)."""
        self.startup()
        assert self.intake is not None and self.reconciler is not None  # made by startup()
        steps = Steps(self.reap_once, self.intake.take_claimed, self.reconciler.reconcile_once,
                      self.reconciler.reconcile_paced, self.intake.poll_once, self.services.only_services_left,
                      self.membership.refused_backoff, self.slot_freed, self._clock, self.settings.poll_interval,
                      self.membership.long_poll)
        return daemon.run(self._parts(), steps, stop_event, once)

    def shutdown(self, flush_secs: float = daemon.FLUSH_SECS) -> int:
        """Stop the agent's work (daemon.shutdown); how many reports are still undelivered."""
        return daemon.shutdown(self._parts(), flush_secs)

    def _parts(self) -> daemon.Parts:
        return daemon.Parts(self.settings, self.scheduler, self.membership, self.jobs, self.claims, self.outbox,
                            self.services, self.logs, self.disk, self.reap_once, self._clock, self.stopping,
                            self._work_wake, self.warm, self.endings, self.cgroups, self.users,
                            self.diskfs if self.disk_fs_on else None, self.slots)
