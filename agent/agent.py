"""The agent's logic: register, heartbeat, take jobs, run them, report how they ended.

Each step is a small one-pass method (startup, register, heartbeat_once, poll_once,
claim_once, take_claimed, reap_once, reconcile_once, flush_reports) that tests
call directly; run_forever only schedules them on threads (work loop, claim,
heartbeat, lease, fence, warm launch, and live output). Its parts: the job table
(jobs.py), the claims (claims.py), a job's preparation (prepare.py), the outbox of reports (reports.py),
the lease's state (lease.py), the reconcile decisions (reconcile.py), the work
loop's pass (workloop.py), the warm launch (warm.py), live output (live_output.py). The scheduler's database is the
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

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable

from corral.shared.backoff import Backoff
from corral.shared.clients import ClientError, Rejected, RegistryClient, SchedulerClient, Unreachable

from . import cgroups, identity, jobenv, launch, live_output, reconcile, runner, services, warm
from .claims import Claims
from .jobs import END_FENCED, END_RECONCILED, END_STOPPING, END_TIMEOUT, JobTable, LocalJob
from .lease import Lease
from .prepare import Plan, Preparer, warm_limits
from .reconcile import job_key, listed_keys
from .reports import Outbox, PendingReport
from .settings import AgentSettings, safe_path_part, total_memory_mb
from .workloop import WorkLoop

log = logging.getLogger(__name__)

TIMEOUT_MESSAGE = "job timed out"
STOPPED_MESSAGE = "agent stopped before the job finished"
FENCED_MESSAGE = ("the agent could not renew its lease with the scheduler for {:.0f}s and stopped the job, "
                  "so that it does not run twice once the scheduler moves it to another node")
OOM_MESSAGE = "job killed: out of memory (limit {} MB)"
SETUP_MESSAGE = ("the agent could not set the job up (its cgroup, private /tmp or environment), so the "
                 "command did not run (a problem of node {}, not of the job)")
# The directories of the agent: its dir and `work` may be traversed (a job reaches its
# own work dir by its absolute path) but not listed; logs and service state are its own.
DIR_MODES = {"agent_dir": 0o711, "work_root": 0o711, "log_root": 0o700, "service_state_root": 0o700}

# Lease renewals must not hang for long: a renewal stuck on a slow read is one that
# cannot be retried before the lease runs out.
LEASE_TIMEOUT = (3.05, 5.0)
# How often the work loop looks at its processes (finish, timeout) between polls.
TICK_SECS = 0.1
# Bounded effort to deliver the last reports when the agent stops.
FLUSH_SECS = 5.0
# How long shutdown waits for service monitors to notice they should stop.
MONITOR_JOIN_SECS = 2.0

# Ends that are the node's doing, not the job's: reported with requeue=True, so the
# scheduler runs the job again without spending its retry budget.
NODE_SIDE_ENDS = {END_STOPPING: STOPPED_MESSAGE, END_FENCED: FENCED_MESSAGE}

Key = tuple[str, int]  # (job_id, attempt)

__all__ = ["Agent", "AgentStartError", "Backoff", "LocalJob", "Plan", "total_memory_mb"]


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
        self._agent_env: dict[str, str] = {}  # what jobs get of the agent's environment
        self._started = False
        # The held and claimed jobs (jobs.py): only the work loop adds and removes held
        # ones; other threads read snapshots; a preparing thread changes its own LocalJob.
        self.jobs = JobTable()
        self.long_poll = settings.long_poll_secs > 0
        self.claims = Claims(self)
        self.outbox = Outbox(settings.node_id, scheduler, clock, self.claims.queue, self.claims.answer_lost)
        # Monitors of ended services still removing their registry record.
        self._closing: list[services.ServiceMonitor] = []
        self._stopping = False
        # Set when a job ends so the work loop asks for more work at once.
        self.slot_freed = threading.Event()
        self._work_wake = threading.Event()   # claimed jobs, or a job's output closed: the work loop looks
        # Jobs the scheduler lists here that this agent does not know, with the claims
        # sent by then (see reconcile_once).
        self._suspects: dict[Key, int] = {}
        # Set by the lease thread when the scheduler lists attempts running here that this
        # agent does not hold: the next reconcile must look even if the agent is idle.
        self._unknown_listed = False
        # The lease with the scheduler: when the last renewal that succeeded was sent
        # (this agent's monotonic clock; a claim that handed out jobs counts too) and
        # the period the scheduler gave; when the lease thread last tried to renew.
        self.lease = Lease()
        # The job launch kept started ahead (warm.py); None when off. Made by startup().
        self.warm: warm.WarmKeeper | None = None

    @property
    def node_id(self) -> str:
        return self.settings.node_id

    def running_count(self) -> int:
        return len(self.jobs)

    def free_slots(self) -> int:
        """Slots neither running a job nor holding a claimed one (under the claim lock,
        which also covers moving a job from claimed to running)."""
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
        self._make_dirs()
        if self.users is None:
            self.users = identity.job_users(s.run_as_root, s.job_user, s.uid_range, s.uid_pool_path,
                                            kill_leftovers=not self.cgroups.enforced)
        if self.users.mode == "per-job":
            log.info("jobs run as a uid of their own from %d-%d", *s.uid_range)
        else:
            who = self.users.identity
            log.info("jobs run as %s (uid %d)%s", who.name, who.uid, f": {who.note}" if who.note else "")
        runner.tools()  # the launch programs, looked up once
        self._detect_private_tmp()
        self._agent_env = jobenv.from_agent(os.environ, s.job_env_passthrough)
        adopted = self._adopt_services()
        keep = {self.jobs.held(key).cgroup.name for key in adopted if self.jobs.held(key).cgroup}
        self.cgroups.remove_job_cgroups(keep, why="left over by an earlier agent")
        for key, uid in self.users.forget_others(self.jobs.held(key).user_key for key in adopted):
            log.info("uid %d of job %s (left by an earlier agent) is free again", uid, key)
        if not s.keep_work_dirs:
            self._remove_leftover_files(adopted)
        self._keep_warm()
        self._preparer = Preparer(s, self.node_id, self.users, self.cgroups, self.warm, bool(self.private_tmp),
                                  self._private_tmp_of, self._agent_env, self._start_job,
                                  stopping=lambda: self._stopping, wake=self._work_wake.set,
                                  service_started=self._service_started)
        self._started = True
        return adopted

    def _keep_warm(self) -> None:
        """Keep a launch started ahead (warm.py) when AGENT_WARM_START is on and jobs run
        through the real runner. With a uid per job the range must have one uid more than
        the slots: the warm launch holds one while every slot may hold one too."""
        s = self.settings
        if not s.warm_start or self._start_job is not runner.start:
            return
        if self.users.mode == "per-job" and s.uid_range[1] - s.uid_range[0] + 1 <= s.slots:
            log.info("no warm job launch: AGENT_UID_RANGE has no uid beyond one per slot")
            return
        first = self.plan({"job_type": "run"})
        self.warm = warm.WarmKeeper(self.users, self.cgroups, s.output_tail_bytes, self._private_tmp_of,
                                    warm_limits(first),
                                    wanted=lambda: not self._stopping and self.free_slots() > 0,
                                    clock=self._clock)

    def _private_tmp_of(self, memory_mb: int) -> launch.PrivateTmp | None:
        """The private /tmp of a job with `memory_mb` (None: jobs get none here)."""
        return launch.PrivateTmp(self._fstab, memory_mb) if self.private_tmp else None

    def _make_dirs(self) -> None:
        """The agent's directories with their modes (DIR_MODES), also when an older agent
        made them with others."""
        for attr, mode in DIR_MODES.items():
            path = getattr(self.settings, attr)
            os.makedirs(path, mode=mode, exist_ok=True)
            os.chmod(path, mode)

    def _detect_private_tmp(self) -> None:
        s = self.settings
        if self.private_tmp is not False and s.private_tmp:
            launch.write_fstab(self._fstab)
        if self.private_tmp is None:
            problem = "AGENT_PRIVATE_TMP is false" if not s.private_tmp else \
                launch.private_tmp_problem(runner.tools(), s.work_root, self._fstab)
            self.private_tmp = problem is None
            self.private_tmp_reason = problem or ""
        if self.private_tmp:
            log.info("jobs get a private /tmp, /var/tmp and /dev/shm")
        else:
            log.warning("jobs share /tmp with the node (TMPDIR points into their work dir): %s",
                        self.private_tmp_reason or "turned off")

    def _remove_leftover_files(self, adopted: list[Key]) -> None:
        """Work dirs and service logs an earlier agent left behind (it was killed, or
        its services ended while no agent ran), except those of adopted services."""
        keep = set()
        for key in adopted:
            keep.add(self.jobs.held(key).workdir)
            keep.update(self.jobs.held(key).log_files or ())
        removed = 0
        for root in (self.settings.work_root, self.settings.log_root):
            for entry in os.scandir(root):
                if entry.path in keep:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    services.remove_file(entry.path)
                removed += 1
        if removed:
            log.info("removed %d work dir(s) and log file(s) left by an earlier agent", removed)

    def _adopt_services(self) -> list[Key]:
        adopted = []
        for found in services.adoptable(self.settings.service_state_root, self.cgroups,
                                        self.settings.output_tail_bytes, self.settings.kill_grace):
            state = found.state
            key = services.file_stem(state.job_id, state.attempt)
            held = self.users.hold(key, state.uid)
            if not held and state.uid is not None:
                log.warning("service job %s attempt %s runs as uid %d, which this agent cannot hold for it "
                            "(outside AGENT_UID_RANGE, or held by another job); it keeps running",
                            state.job_id, state.attempt, state.uid)
            local = LocalJob(state.job_id, state.attempt, "service", state.workdir, self._clock(),
                             None, process=found.process, cgroup=found.process.cgroup,
                             memory_mb=found.process.cgroup.limits["memory_mb"],
                             state_path=found.path, log_files=(state.stdout, state.stderr),
                             uid=state.uid, user_key=key if held else None, adopted=True)
            local.monitor = self._monitor(state.job_id, state.attempt, state.name, state.port,
                                          state.health_path, local.log_files, state.grant, check_first=True)
            local.prepared.set()
            self.jobs.add(local)
            adopted.append(local.key)
            log.info("re-adopted service job %s attempt %s (pid %d, port %s)", state.job_id,
                     state.attempt, state.pid, state.port)
        return adopted

    # --- registry -------------------------------------------------------------

    def node_info(self) -> dict:
        return {
            "node_id": self.node_id,
            "address": self.settings.address,
            "kind": "compute",
            "slots": self.settings.slots,
            "cpus": os.cpu_count(),
            "memory_mb": total_memory_mb(),
            "max_memory_mb": self.settings.max_memory_mb,
            "max_cpu_percent": self.settings.max_cpu_percent,
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

    # --- the lease ------------------------------------------------------------------

    def renew_lease_once(self) -> None:
        """Renew this node's lease with the scheduler (counted from when it was sent:
        lease.py)."""
        self._renew_with(self.scheduler)

    def holds_work(self) -> bool:
        """Whether this agent holds jobs (running, starting or claimed)."""
        return len(self.jobs) > 0 or self.jobs.has_claimed()

    def _renew_if_due(self, client: SchedulerClient) -> None:
        """The lease thread's beat: at every one while the agent holds work or polls
        (no claim renews the lease then), else seldom (Lease.due)."""
        now = self._clock()
        if self.lease.due(now, self.holds_work() or not self.long_poll):
            self.lease.tried(now)
            self._renew_with(client)

    def _renew_with(self, client: SchedulerClient) -> None:
        sent_at = self._clock()
        answer = client.renew_lease(self.node_id)
        self._apply_lease(sent_at, answer)

    def _apply_lease(self, sent_at: float, answer) -> None:
        was_lapsed, last = self.lease_lapsed() and self.holds_work(), self.lease.sent_at
        running = self.lease.renewed(sent_at, answer)
        if was_lapsed and last is not None:
            log.warning("lease renewed again after %.1fs", sent_at - last)
        self._end_stale(sent_at, running)

    def _end_stale(self, sent_at: float, running) -> list[Key]:
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
        if listed - set(holding) - set(self.claimed_keys()):
            self._unknown_listed = True
        stale = reconcile.stale(((key, local.started_at) for key, local in holding.items()
                                 if local.end_reason is None), listed, sent_at)
        for key in stale:
            log.warning("job %s attempt %s is stale according to the lease answer; killing it", *key)
            self._end(holding[key], END_RECONCILED)
        return stale

    def lease_lapsed(self) -> bool:
        """True when no renewal succeeded for a whole lease period: the scheduler may
        hand this node's run jobs to another node soon, so they must stop here."""
        return self.lease.lapsed(self._clock())

    def claims_blocked(self) -> bool:
        """No claims while the lease is lapsed with jobs held (they are being fenced).
        An idle agent may claim whatever its lease: a claim that hands it jobs
        renews the lease on the scheduler, counted here from when it was sent."""
        return self.lease_lapsed() and self.holds_work()

    def fence_once(self) -> list[Key]:
        """Stop every run job while the lease is lapsed (self-fencing). Services are
        not fenced: a cut-off node keeps serving until it can be told otherwise."""
        if not self.lease_lapsed():
            return []
        fenced = []
        holding = self.jobs.snapshot()
        for local in holding:
            if local.job_type == "run" and local.end_reason is None and self._end(local, END_FENCED):
                fenced.append(local.key)
        if fenced:
            log.error("no lease renewal for %.1fs (lease %.0fs): stopping %d run job(s) so that they do "
                      "not run twice", self._clock() - (self.lease.sent_at or 0.0), self.lease.secs or 0.0,
                      len(fenced))
        return fenced

    # --- taking work ----------------------------------------------------------

    def plan(self, job: dict) -> Plan:
        """The job's type and limits (its own, else the node's default for its type)."""
        job_type = job.get("job_type") or "run"
        defaults = self.settings.default_limits(job_type)
        values, error = [], None
        for name, default, maximum, setting in (
                ("memory_mb", defaults[0], self.settings.max_memory_mb, "AGENT_MAX_MEMORY_MB"),
                ("cpu_percent", defaults[1], self.settings.max_cpu_percent, "AGENT_MAX_CPU_PERCENT"),
                ("max_processes", self.settings.job_max_processes, self.settings.max_processes,
                 "AGENT_MAX_PROCESSES")):
            value = job.get(name)
            if value is None:
                value = default
            elif isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                error = error or f"job asks for {name}={value!r}, which is not a positive whole number"
                value = default
            elif value > maximum:
                error = error or (f"job asks for {name}={value} but this node allows at most "
                                  f"{maximum} ({setting})")
            values.append(value)
        return Plan(job_type, *values, error)

    def poll_once(self) -> list[Key]:
        """Ask for pending jobs placed on this node and take as many as fit.

        The `running` report goes first and the job is prepared and started only if
        it was accepted: an accepted report is the claim, so two agents never both
        run one attempt. Returns the (job_id, attempt) pairs taken.
        """
        self._require_startup()
        if self._stopping or self.free_slots() <= 0 or self.lease_lapsed():
            return []
        taken: list[Key] = []
        for job in self.scheduler.pending_for(self.node_id):
            if self.free_slots() <= 0:
                break
            try:
                job_id, attempt = job_key(job)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("ignoring a malformed job from the scheduler (%s): %r", exc, job)
                continue
            # A newer attempt of a job we still run waits until reconcile ended the old one.
            if self.jobs.holds_job(job_id):
                continue
            plan = self.plan(job)
            enforced = self.cgroups.enforced
            try:
                self.scheduler.report(job_id, self.node_id, attempt, "running",
                                      limits_enforced=enforced,
                                      limits=self.applied_limits(plan.limits) if enforced else None,
                                      private_tmp=bool(self.private_tmp))
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
            local = self._accept(job, job_id, attempt, plan)
            if local is not None:
                self.jobs.add(local)
                self._start_preparing(local, job, plan)
            taken.append((job_id, attempt))
        if self.outbox:
            self.flush_reports()  # jobs that could not start are reported at once
        return taken

    def default_limits(self) -> dict:
        """The limits this node gives jobs that ask for none, per job type (sent with claims)."""
        return {job_type: self.applied_limits(dict(zip(("memory_mb", "cpu_percent"),
                                                       self.settings.default_limits(job_type)),
                                                   max_processes=self.settings.job_max_processes))
                for job_type in ("run", "service")}

    def applied_limits(self, limits: dict) -> dict:
        """`limits` as this node applies them: no max_processes without a pids controller."""
        return limits if self.cgroups.limits_processes else dict(limits, max_processes=None)

    def claim_once(self, client: SchedulerClient | None = None, wait_secs: float = 0.0
                   ) -> tuple[list[Key], bool]:
        """One claim (Claims.claim_once)."""
        return self.claims.claim_once(client, wait_secs)

    def take_claimed(self) -> list[Key]:
        """Start preparing the claimed jobs (work loop thread). A job whose older attempt
        still ends here waits for it; with the lease lapsed a job is given back at once."""
        if self._stopping or not self.jobs.has_claimed():
            self.claims.handed_over.set()
            return []
        accepted: list[tuple[LocalJob, dict, Plan]] = []

        def start(key: Key, job: dict) -> LocalJob | None:
            if self.lease_lapsed():
                log.warning("job %s attempt %s was claimed but the lease lapsed; giving it back", *key)
                self.outbox.add_failed(*key, -1, self._node_side_message(END_FENCED), requeue=True)
                return None
            plan = self.plan(job)
            local = self._accept(job, key[0], key[1], plan)
            if local is not None:
                accepted.append((local, job, plan))
            return local

        taken = self.jobs.take_claimed(start)
        for local, job, plan in accepted:
            self._start_preparing(local, job, plan)
        self.claims.handed_over.set()
        return taken

    def _requeue_claimed(self) -> None:
        """Stopping: claimed jobs that never started go back to the scheduler (requeued
        without spending a retry)."""
        claimed = self.jobs.take_all_claimed()
        for key, _ in claimed:
            self.outbox.add_failed(*key, -1, STOPPED_MESSAGE, requeue=True)

    def _accept(self, job: dict, job_id: str, attempt: int, plan: Plan) -> LocalJob | None:
        """The LocalJob that holds the job's slot from now on, or None when it cannot run
        here (reported failed)."""
        if plan.error:
            log.warning("job %s attempt %s cannot run here: %s", job_id, attempt, plan.error)
            self.outbox.add_failed(job_id, attempt, -1, plan.error)
            return None
        now = self._clock()
        timeout = job.get("timeout_secs")
        deadline = None
        # Only `run` jobs time out, counted from the claim as the scheduler does; a
        # service runs until it exits or is stopped.
        if plan.job_type == "run" and isinstance(timeout, (int, float)) \
                and not isinstance(timeout, bool) and timeout > 0:
            deadline = now + timeout
        return LocalJob(job_id, attempt, plan.job_type, self.work_dir(job_id, attempt), now,
                        deadline, memory_mb=plan.memory_mb)

    def _start_preparing(self, local: LocalJob, job: dict, plan: Plan) -> None:
        threading.Thread(target=self._preparer.prepare, args=(local, job, plan), daemon=True,
                         name=f"prepare-{local.job_id}-{local.attempt}").start()

    def _service_started(self, local: LocalJob, job: dict, port: int | None, cg) -> None:
        """Right after a service's process started: its state file, then its monitor."""
        name = job.get("name") or local.job_id
        start_time = services.proc_start_time(local.process.pid)
        local.state_path = services.state_path(self.settings.service_state_root, local.job_id,
                                               local.attempt)
        try:
            services.ServiceState(local.job_id, local.attempt, local.process.pid, start_time or 0,
                                  cg.name, port, name, job.get("health_path"), local.workdir,
                                  *local.log_files, uid=local.uid,
                                  grant=job.get("service_grant")).write(local.state_path)
        except OSError as exc:
            log.warning("could not write the state file of service job %s: %s; a restarted agent "
                        "will not re-adopt it", local.job_id, exc)
        local.monitor = self._monitor(local.job_id, local.attempt, name, port, job.get("health_path"),
                                      local.log_files, job.get("service_grant"))

    def _monitor(self, job_id: str, attempt: int, name: str, port: int | None, health_path: str | None,
                 log_files, grant: str | None, check_first: bool = False) -> services.ServiceMonitor:
        """The service's health checks and registry record. The record names the attempt
        and carries the scheduler's grant for it (with tokens, the registry takes a
        node's record only with it)."""
        record = None
        if port is not None:
            record = {"job_id": job_id, "name": name, "node_id": self.node_id,
                      "address": self.settings.address, "port": port, "attempt": attempt}
            if isinstance(grant, str):
                record["grant"] = grant
        return services.ServiceMonitor(
            self.registry.clone(), record, health_path, self.settings.health_interval,
            self.settings.health_timeout, log_files, self.settings.service_log_max_bytes,
            check_first=check_first).start()

    def _require_startup(self) -> None:
        if not self._started:
            raise RuntimeError("Agent.startup() must run before the agent takes or checks jobs")

    # --- finished processes ---------------------------------------------------

    def reap_once(self) -> list[tuple[str, int, str]]:
        """Kill jobs past their timeout, report jobs that ended, retry due reports.

        Returns (job_id, attempt, outcome) for each job that ended in this pass;
        the outcome is the reported status, or "killed" for a job the scheduler
        had already ended (not reported).
        """
        self.fence_once()
        now = self._clock()
        for local in self.jobs.snapshot():
            if local.end_reason is None and local.deadline is not None and now >= local.deadline:
                log.warning("job %s attempt %s ran past its timeout; killing it",
                            local.job_id, local.attempt)
                self._end(local, END_TIMEOUT)
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

    def _finish_unstarted(self, local: LocalJob) -> tuple[str, int, str]:
        self.jobs.remove(local.key)
        self._release_user(local)
        self._remove_work_dir(local)
        if local.end_reason == END_RECONCILED:
            return (local.job_id, local.attempt, "killed")
        if local.end_reason == END_TIMEOUT:
            self.outbox.add_failed(local.job_id, local.attempt, -1, TIMEOUT_MESSAGE)
        elif local.end_reason in NODE_SIDE_ENDS:
            self.outbox.add_failed(local.job_id, local.attempt, -1, self._node_side_message(local.end_reason),
                                 requeue=True)
        else:
            exit_code, message = local.start_error or (-1, "the agent could not start the job")
            self.outbox.add_failed(local.job_id, local.attempt, exit_code, message)
        return (local.job_id, local.attempt, "failed")

    def _finish(self, local: LocalJob) -> tuple[str, int, str]:
        result = local.process.result()
        cg = local.cgroup
        usage = cg.stats() if cg is not None else {"peak_memory_bytes": None, "cpu_seconds": None}
        oom = local.end_reason is None and cg is not None and cgroups.ended_by_oom(result.exit_code, cg)
        if cg is not None:
            cg.remove()
        self.jobs.remove(local.key)
        self._release_user(local)
        self._close_monitor(local)
        services.remove_file(local.state_path)
        self._remove_work_dir(local)
        if local.end_reason == END_RECONCILED:
            log.info("job %s attempt %s was ended by the scheduler; killed (exit %s), not reported",
                     local.job_id, local.attempt, result.exit_code)
            return (local.job_id, local.attempt, "killed")
        stderr = result.stderr
        extra = {}
        if local.end_reason == END_TIMEOUT:
            status, exit_code, stderr = "failed", -1, _append_line(stderr, TIMEOUT_MESSAGE)
        elif local.end_reason in NODE_SIDE_ENDS:
            status, exit_code = "failed", -1
            stderr = _append_line(stderr, self._node_side_message(local.end_reason))
            extra["requeue"] = True
        elif launch.setup_failed(result.exit_code, stderr):
            status, exit_code = "failed", -1
            stderr = _append_line(stderr, SETUP_MESSAGE.format(self.node_id))
        else:
            status = "done" if result.exit_code == 0 else "failed"
            exit_code = result.exit_code
            if oom:
                limit = (cg.limits.get("memory_mb") if cg is not None else None) or local.memory_mb
                stderr = _append_line(stderr, OOM_MESSAGE.format(limit))
        log.info("job %s attempt %s finished: %s (exit %s%s)", local.job_id, local.attempt, status,
                 exit_code, ", out of memory" if oom else "")
        self.outbox.add(local.job_id, local.attempt, status, exit_code=exit_code,
                      stdout=result.stdout, stderr=stderr, oom_killed=oom, **usage, **extra)
        return (local.job_id, local.attempt, status)

    def _release_user(self, local: LocalJob) -> None:
        """Give the job's uid back; its processes are gone (result() or kill() ended them)."""
        if local.user_key is not None:
            self.users.release(local.user_key)
            local.user_key = None

    def _node_side_message(self, end_reason: str) -> str:
        return NODE_SIDE_ENDS[end_reason].format(self.lease.secs or 0)

    def _end(self, local: LocalJob, reason: str) -> bool:
        """Kill a job's process tree in the background; reap_once reports it after.
        A job still being prepared is simply not started. False when there was nothing
        to end (being ended already, or exited on its own)."""
        with local.lock:
            if local.end_reason is not None:
                return False  # already being ended; the first reason is the one reported
            process = local.process
            if reason != END_RECONCILED and process is not None and process.poll() is not None:
                # It exited on its own before this (the work loop, busy with a slow
                # scheduler, had not reaped it yet): reap_once reports how it ended, a
                # result that must not be discarded as stopped and run again.
                return False
            local.end_reason = reason
        self._close_monitor(local)  # out of the load balancer before it is killed
        if process is None:
            return True
        # kill() waits up to kill_grace for the group to leave; the work loop must not.
        local.killer = threading.Thread(target=process.kill, args=(self.settings.kill_grace,),
                                        name=f"kill-{local.job_id}-{local.attempt}", daemon=True)
        local.killer.start()
        return True

    def _close_monitor(self, local: LocalJob) -> None:
        """Stop a service's checks and remove its registry record (in the background)."""
        with local.lock:
            monitor = local.monitor
        if monitor is not None and monitor not in self._closing:
            monitor.stop(remove=True)
            self._closing = [m for m in self._closing if m.is_alive()] + [monitor]

    def _remove_work_dir(self, local: LocalJob) -> None:
        if self.settings.keep_work_dirs:
            if self.users.mode == "per-job" and os.path.isdir(local.workdir):
                identity.disown_workdir(local.workdir)
            return
        shutil.rmtree(local.workdir, ignore_errors=True)
        for path in local.log_files or ():
            services.remove_file(path)

    # --- reports --------------------------------------------------------------

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
                self._drop_claimed(key)
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

    def _drop_claimed(self, key: Key) -> None:
        if self.jobs.drop_claimed(key):
            log.info("job %s attempt %s was ended by the scheduler before it started here; "
                     "not starting it", *key)

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

    def heartbeat_loop(self, stop_event: threading.Event, beat: Callable[[], None] | None = None,
                       what: str = "heartbeat") -> None:
        """Call `beat` (the registry heartbeat by default) every heartbeat interval.

        Failures are retried sooner than the interval, never later: a late
        heartbeat is what gets a healthy node marked unhealthy, and a late lease
        renewal what makes it stop its jobs.
        """
        beat = beat or self.heartbeat_once
        interval = self.settings.heartbeat_interval
        backoff = Backoff(min(0.5, interval), interval)
        while not stop_event.is_set():
            try:
                beat()
                backoff.reset()
                delay = interval
            except ClientError as exc:
                delay = backoff.next()
                log.warning("%s failed: %s; retrying in %.1fs", what, exc, delay)
            except Exception:
                delay = backoff.next()
                log.exception("%s failed; retrying in %.1fs", what, delay)
            stop_event.wait(delay)

    def run_forever(self, stop_event: threading.Event, once: bool = False) -> int:
        """Start up (see startup()), register, then heartbeat on a thread of its own
        and run the work loop in this thread (with long-poll, beside a claim thread:
        see claims.py) until stop_event is set (or, with once,
        until the jobs of one successful poll have ended; services are left running).
        Then stop: see shutdown(). Returns the exit status: 0, or 1 in once mode when
        reports could not be delivered."""
        self.startup()
        if not self.register_until_done(stop_event):
            self.shutdown()
            return 0
        heartbeat_stop = threading.Event()
        # Registry heartbeats and scheduler lease renewals on threads of their own,
        # so that a slow registry never delays a renewal (nor the other way round).
        lease_client = self.scheduler.clone()
        lease_client.timeout = LEASE_TIMEOUT
        beats = [threading.Thread(target=self.heartbeat_loop, args=(heartbeat_stop,),
                                  name="heartbeat", daemon=True),
                 threading.Thread(target=self.heartbeat_loop, name="lease", daemon=True,
                                  args=(heartbeat_stop, lambda: self._renew_if_due(lease_client), "lease renewal")),
                 threading.Thread(target=self._fence_loop, args=(heartbeat_stop,), name="fence", daemon=True)]
        if self.warm is not None:
            beats.append(threading.Thread(target=self.warm.run, args=(heartbeat_stop,), name="warm", daemon=True))
        if self.settings.output_interval > 0:
            sender = live_output.LiveOutput(self.node_id, self.held_jobs, self.scheduler.clone(),
                                            self.settings.output_interval)
            beats.append(threading.Thread(target=sender.run, args=(heartbeat_stop,), name="output", daemon=True))
        for thread in beats:
            thread.start()
        try:
            self._work_loop(stop_event, once)
        finally:
            # Heartbeats go on while running jobs are given their grace period.
            undelivered = self.shutdown()
            heartbeat_stop.set()
            for thread in beats:
                thread.join(timeout=1.0)
        return 1 if once and undelivered else 0

    def _fence_loop(self, stop_event: threading.Event) -> None:
        """Self-fencing on a thread of its own: the work loop can spend seconds in
        network calls to a scheduler it cannot reach, and the fence must not wait."""
        while not stop_event.wait(TICK_SECS):
            try:
                self.fence_once()
            except Exception:
                log.exception("checking the lease failed")

    def only_services_left(self) -> bool:
        return all(self._detachable(local) for local in self.jobs.snapshot())

    def _work_loop(self, stop_event: threading.Event, once: bool) -> None:
        claim_stop = threading.Event()
        claims = self.long_poll and not once
        if claims:
            threading.Thread(target=self.claims.loop, args=(claim_stop,), name="claim", daemon=True).start()
            self.claims.running = True
        loop = WorkLoop(self, self._clock(), claims, once)
        try:
            while not stop_event.is_set() and not loop.done():
                loop.tick(self._clock())
                self._work_wake.wait(TICK_SECS)
                self._work_wake.clear()
        finally:
            self.claims.running = False
            claim_stop.set()
            self.claims.wake.set()

    def _reconcile_paced(self, backoff: Backoff) -> float:
        """reconcile_once; when the next one is due. An idle agent (no job held or
        claimed) skips it unless its last lease answer listed attempts it does not
        hold: that answer (once a minute when idle, and soon after a claim that got
        no answer) already says what runs here, and an idle agent has nothing to
        kill, so a fleet of idle agents sends no reconcile requests (one every
        POLL_INTERVAL_SECS per agent otherwise)."""
        if not self.holds_work() and not self._unknown_listed:
            return self._clock() + self.settings.poll_interval
        try:
            self.reconcile_once()
            self._unknown_listed = False  # (a renewal meanwhile that lists one again sets it again)
            backoff.reset()
            return self._clock() + self.settings.poll_interval
        except Exception as exc:
            delay = backoff.next()
            if isinstance(exc, ClientError):
                log.warning("checking jobs with the scheduler failed: %s; retrying in %.1fs", exc, delay)
            else:
                log.exception("checking jobs with the scheduler failed; retrying in %.1fs", delay)
            return self._clock() + delay

    def shutdown(self, flush_secs: float = FLUSH_SECS) -> int:
        """Stop taking work and leave the running services to the next agent (their
        processes, registry records and state files stay). Give run jobs stop_grace
        seconds, kill the rest (reported failed), then try for about flush_secs to
        deliver every report. Returns how many reports are still undelivered."""
        self._stopping = True
        self.claims.wake.set()
        if self.warm is not None:
            self.warm.close()
        self.detach_services()
        if len(self.jobs):
            log.info("stopping: %d job(s) running, waiting up to %.1fs for them",
                     len(self.jobs), self.settings.stop_grace)
        self._reap_until_empty(self._clock() + self.settings.stop_grace)
        self.detach_services()
        if len(self.jobs):
            log.warning("stopping: killing %d job(s) that did not finish in time", len(self.jobs))
            for local in self.jobs.snapshot():
                self._end(local, END_STOPPING)
            # kill() takes at most kill_grace, then SIGKILL and reap. A download cannot
            # be interrupted: jobs still being prepared are not waited for.
            self._reap_until_empty(self._clock() + self.settings.kill_grace + 5.0,
                                   only_started=True)
        for local in self.jobs.snapshot():
            if not local.prepared.is_set():  # still downloading: it will never be started
                self.jobs.remove(local.key)
                self.outbox.add_failed(local.job_id, local.attempt, -1, STOPPED_MESSAGE, requeue=True)
        self._requeue_claimed()
        deadline = self._clock() + flush_secs
        while self.outbox and self._clock() < deadline:
            if self.flush_reports(force=True):
                time.sleep(0.2)  # brief pause between tries; bounded by the deadline
            self._requeue_claimed()  # a long poll that was under way may still have answered
        end = time.monotonic() + flush_secs  # ended services leave the registry, if it answers
        for monitor in self._closing:
            monitor.join(max(0.0, end - time.monotonic()))
        if self.outbox:
            log.warning("stopping with %d undelivered report(s): %s", len(self.outbox),
                        ", ".join(f"{r.job_id} attempt {r.attempt} {r.status}" for r in self.outbox))
        if self.cgroups is not None and not len(self.jobs) and not self.cgroups.list_job_cgroups():
            self.cgroups.cleanup()  # this node's cgroup directories, when no service uses them
        self.users.flush()  # the uids the detached services keep, for the next agent
        return len(self.outbox)

    def detach_services(self) -> list[Key]:
        """Forget the running services without stopping them: their state files let
        the next agent re-adopt them. Returns their keys."""
        detached = [local for local in self.jobs.snapshot() if self._detachable(local)]
        for local in detached:
            local.monitor.stop(remove=False)
            self.jobs.remove(local.key)
        deadline = time.monotonic() + MONITOR_JOIN_SECS
        for local in detached:
            local.monitor.join(max(0.0, deadline - time.monotonic()))
            log.info("leaving service job %s attempt %s running (pid %d) for the next agent",
                     local.job_id, local.attempt, local.process.pid)
        return [local.key for local in detached]

    @staticmethod
    def _detachable(local: LocalJob) -> bool:
        """A service that runs (prepared and started) and is not being ended."""
        return (local.job_type == "service" and local.prepared.is_set()
                and local.process is not None and local.end_reason is None)

    def _reap_until_empty(self, deadline: float, only_started: bool = False) -> None:
        def waiting():
            return any(local.prepared.is_set() or not only_started
                       for local in self.jobs.snapshot())

        while waiting() and self._clock() < deadline:
            # A service whose start was under way when the stop began is left running too.
            self.detach_services()
            try:
                self.reap_once()
            except Exception:
                log.exception("checking jobs failed while stopping")
            if waiting():
                time.sleep(TICK_SECS)


def _append_line(text: str, line: str) -> str:
    if text and not text.endswith("\n"):
        text += "\n"
    return text + line

