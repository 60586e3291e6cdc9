"""Preparing one job, on a worker thread of its own.

Its environment (checked first), a fresh work dir, its deploy_url archive, a uid of its
own and the tree's ownership, a cgroup with its limits, then its process, in the warm
launch when one fits (warm.py) or through the launch chain (launch.py). A job ended
meanwhile (cancelled, timed out, the agent stopping) is not started; a job that cannot
be set up gets a start_error, which the agent reports. The agent's work loop never waits
for a download.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass

from corral.shared import wire

from . import artifacts, cgroups, devices, diskfs, identity, jobenv, launch, runner, services, uids, warm
from .jobs import END_STOPPING, LocalJob
from .log_shipping import LogShipper
from .settings import AgentSettings, safe_path_part
from . import slot_cgroups
from .slot_cgroups import SlotCgroups

log = logging.getLogger(__name__)

NO_RUN_SH_MESSAGE = ("the job has a deploy_url but no command, and the unpacked archive has no "
                     "run.sh at its top level to run; add run.sh to the zip or give the job a "
                     "command")
RUN_SH = "run.sh"
# Jobs' temporary files without a private /tmp: TMPDIR, in the work dir.
TMPDIR_NAME = ".tmp"


def cgroup_name(job_id: str, attempt: int) -> str:
    """A job's cgroup directory name: ASCII letters, digits, '.', '_', '-' only."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", safe_path_part(job_id))[:180] + f"-{attempt}"


@dataclass(frozen=True)
class Plan:
    """What the agent will give a job, decided before the claim: its type, limits,
    and an error when it cannot run here at all (it asks too much)."""
    job_type: str
    memory_mb: int
    cpu_percent: int
    max_processes: int
    error: str | None = None

    @property
    def limits(self) -> dict:
        return {"memory_mb": self.memory_mb, "cpu_percent": self.cpu_percent,
                "max_processes": self.max_processes}


def plan_of(settings: AgentSettings, job: dict) -> Plan:
    """The job's type and limits (its own, else the node's default for its type)."""
    job_type = job.get("job_type") or wire.JOB_RUN
    defaults = settings.default_limits(job_type)
    values, error = [], None
    for name, default, maximum, setting in (
            ("memory_mb", defaults[0], settings.max_memory_mb, "AGENT_MAX_MEMORY_MB"),
            ("cpu_percent", defaults[1], settings.max_cpu_percent, "AGENT_MAX_CPU_PERCENT"),
            ("max_processes", settings.job_max_processes, settings.max_processes, "AGENT_MAX_PROCESSES")):
        value = job.get(name)
        if value is None:
            value = default
        elif isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            error = error or f"job asks for {name}={value!r}, which is not a positive whole number"
            value = default
        elif value > maximum:
            error = error or f"job asks for {name}={value} but this node allows at most {maximum} ({setting})"
        values.append(value)
    return Plan(job_type, values[0], values[1], values[2], error)


def applied_limits(limits: dict, limits_processes: bool) -> dict:
    """`limits` as a node applies them: no max_processes without a pids controller."""
    return limits if limits_processes else dict(limits, max_processes=None)


def default_limits(settings: AgentSettings, limits_processes: bool) -> dict:
    """The limits a node gives jobs that ask for none, per job type (sent with claims)."""
    return {job_type: applied_limits(dict(zip(("memory_mb", "cpu_percent"), settings.default_limits(job_type)),
                                          max_processes=settings.job_max_processes), limits_processes)
            for job_type in wire.JOB_TYPES}


class _Aborted(Exception):
    """The job was ended (cancelled, timed out, agent stopping) while being prepared."""


class JobError(Exception):
    """The job cannot run as given; str() is the stderr to report."""


@dataclass
class Preparer:
    """What preparing a job needs of its agent (made by Agent.startup)."""
    settings: AgentSettings
    node_id: str
    users: identity.JobUsers
    cgroup_manager: cgroups.Manager
    warm_keeper: warm.WarmKeeper | None
    private_tmp: bool  # jobs get a private /tmp here
    private_tmp_of: Callable[[int], launch.PrivateTmp | None]
    agent_env: dict[str, str]  # what jobs get of the agent's environment
    start_job: Callable[..., runner.RunningJob]  # the runner seam
    stopping: Callable[[], bool]
    wake: Callable[[], None]  # the work loop looks (a job was prepared, or its output closed)
    service_started: Callable[[LocalJob, dict, int | None, cgroups.JobCgroup], None]
    shipper: LogShipper | None = None  # the complete logs (log_shipping.py); None: not kept
    diskfs: diskfs.DiskFs | None = None  # work dirs get a filesystem of their disk_mb (None: the watch alone)
    isolation: devices.Isolation | None = None  # the node's GPUs and how jobs are held to theirs
    slots: SlotCgroups | None = None  # run jobs' cgroups kept from one job to the next (None: one each)

    def prepare(self, local: LocalJob, job: dict, plan: Plan) -> None:
        """On a worker thread: environment, work dir, artifact, uid and ownership, cgroup,
        then the process. Sets local.process, or local.start_error, or neither (aborted);
        then prepared."""
        s = self.settings
        cg = None
        taken = None
        captures = None
        try:
            job_env = jobenv.job_vars(job)  # a forbidden variable fails the job before anything
            if self.diskfs is not None:
                self.diskfs.release(local.workdir)  # one an earlier agent left on this attempt's dir
            _fresh_dir(local.workdir)
            if self.diskfs is not None and local.disk_mb:  # before the archive, which counts too
                self.diskfs.create(local.workdir, local.disk_mb)
            command = job.get("command")
            if job.get("deploy_url"):
                unpacked = artifacts.fetch_and_unpack(job["deploy_url"], local.workdir,
                                                      sha256=job.get("deploy_sha256"),
                                                      limits=s.artifact_limits)
                log.info("job %s attempt %s: unpacked %d files (%d bytes) from %s", local.job_id,
                         local.attempt, unpacked.files, unpacked.bytes,
                         artifacts.display_url(job["deploy_url"]))
                if not (isinstance(command, str) and command.strip()):
                    command = _run_sh_command(local.workdir)
            self._check_not_ended(local)
            key = services.file_stem(local.job_id, local.attempt)
            taken = self.warm_keeper.take(plan.job_type, warm_limits(plan)) if self.warm_keeper is not None else None
            if taken is not None:
                who = self.users.transfer(taken.key, key, local.workdir)
            else:
                who = self.users.acquire(key, local.workdir)
            local.user_key, local.uid = key, who.uid
            own = who.env(local.workdir)
            if not self.private_tmp:
                own["TMPDIR"] = _tmp_dir(local.workdir)
            identity.prepare_workdir(local.workdir, who)
            access = self.isolation.for_job(job.get("gpus_assigned") or ()) if self.isolation is not None else None
            cg = taken.cgroup if taken is not None else self._job_cgroup(local, plan)
            private_dev = self._hold_to_devices(access, cg)
            fixed = {"CORRAL_JOB_ID": local.job_id, "CORRAL_NODE_ID": self.node_id,
                     "CORRAL_ATTEMPT": str(local.attempt), **(access.env() if access is not None else {}),
                     **jobenv.gang_vars(job.get("gang"))}
            if local.deadline_epoch is not None:  # when its timeout ends it, epoch seconds
                fixed["CORRAL_DEADLINE"] = str(int(local.deadline_epoch))
            port = _port(job)
            if port is not None:
                fixed["PORT"] = str(port)
            if local.trace is not None:  # the attempt's span (spans.py), in the job's trace
                fixed.update(local.trace.env())
            env = jobenv.build({"env_vars": job_env}, self.agent_env, own, fixed)
            if plan.job_type == wire.JOB_SERVICE:
                local.log_files = services.log_paths(s.log_root, local.job_id, local.attempt)
            elif self.shipper is not None:
                captures = self.shipper.capture(local.job_id, local.attempt)
            with local.lock:
                if local.end_reason is None and self.stopping():
                    local.end_reason = END_STOPPING
                self._check_not_ended(local)
                if taken is not None:
                    local.process = self._launch_warm(local, taken, command or "", env, captures)
                    taken = None
                    if local.process is None:  # the chain is gone, and its cgroup with it
                        cg = self._job_cgroup(local, plan)
                if local.process is None:
                    local.process = self.start_job(
                        dict(job, command=command), local.workdir, env, s.output_tail_bytes,
                        cgroup=cg, user=who.launch_user(), output_files=local.log_files,
                        private_tmp=self.private_tmp_of(plan.memory_mb), captures=captures,
                        **({"private_dev": private_dev} if private_dev is not None else {}))
                local.cgroup = cg
                if hasattr(local.process, "on_output_closed"):
                    # The pipes close when the job exits: the work loop looks at once.
                    local.process.on_output_closed = self.wake
                if plan.job_type == wire.JOB_SERVICE:
                    self.service_started(local, job, port, cg)
                if self.shipper is not None:  # its output is shipped whole from now on
                    if captures is not None:
                        self.shipper.add(local.job_id, local.attempt, captures)
                        captures = None
                    elif local.log_files is not None:
                        self.shipper.follow_files(local.job_id, local.attempt, local.log_files)
            log.info("job %s attempt %s started (pid %d, %s, limits %s, cgroup %s, timeout %s) in %s",
                     local.job_id, local.attempt, local.process.pid, plan.job_type,
                     plan.limits if self.cgroup_manager.enforced else "none",
                     cg.name if self.cgroup_manager.enforced else "none",
                     job.get("timeout_secs") if local.deadline is not None else "none",
                     local.workdir)
        except _Aborted:
            log.info("job %s attempt %s ended (%s) before it started", local.job_id, local.attempt,
                     local.end_reason)
        except artifacts.ArtifactError as exc:
            log.warning("job %s attempt %s: deploy_url: %s", local.job_id, local.attempt, exc)
            local.start_error = (-1, f"the agent could not use the job's deploy_url: {exc}")
        except runner.StartError as exc:
            log.warning("job %s attempt %s could not start: %s", local.job_id, local.attempt, exc)
            local.start_error = (exc.exit_code, f"the agent could not start the job: {exc}")
        except (JobError, jobenv.JobEnvError, uids.UidsExhausted, devices.DeviceError) as exc:
            log.warning("job %s attempt %s cannot run: %s", local.job_id, local.attempt, exc)
            local.start_error = (-1, str(exc))
        except OSError as exc:  # the work dir, chown, cgroup creation (CgroupError)
            log.warning("job %s attempt %s could not be prepared: %s", local.job_id,
                        local.attempt, exc)
            local.start_error = (-1, f"the agent could not prepare the job: {exc}")
        except Exception as exc:  # a bug must fail the job, not leave it holding a slot
            log.exception("preparing job %s attempt %s failed", local.job_id, local.attempt)
            local.start_error = (-1, f"the agent could not prepare the job: {exc!r}")
        finally:
            for capture in captures or ():  # it did not start: nothing to ship
                capture.close()
            if taken is not None:  # not launched: the chain goes (the job's key has its uid)
                taken.start.discard()
                cg = taken.cgroup
            if local.process is None and cg is not None:
                slot_cgroups.release(self.slots, cg)
            local.prepared.set()
            self.wake()

    def _hold_to_devices(self, access: devices.Access | None, cg: cgroups.JobCgroup) -> launch.PrivateDev | None:
        """Keep the job to the devices of `access`: its cgroup's device rules (cgroup v1),
        or the /dev of its own it is started with (returned); nothing where not isolated."""
        if access is None or self.isolation is None:
            return None
        if self.isolation.mode == devices.CGROUP:
            cg.restrict_devices(access.cgroup_rules())
        elif self.isolation.mode == devices.MOUNT:
            return launch.PrivateDev(access.specs())
        return None

    def _job_cgroup(self, local: LocalJob, plan: Plan) -> cgroups.JobCgroup:
        if self.slots is not None and plan.job_type == wire.JOB_RUN:
            return self.slots.take(plan.memory_mb, plan.cpu_percent, plan.max_processes)
        return self.cgroup_manager.create(cgroup_name(local.job_id, local.attempt), plan.memory_mb,
                                   plan.cpu_percent, plan.max_processes)

    def _launch_warm(self, local: LocalJob, taken: warm.Warm, command: str, env: dict, captures: tuple | None
                     ) -> runner.RunningJob | None:
        """The job started in the warm launch it took; None when that could not take it
        (logged; its cgroup is removed, and the job starts cold). Raises StartError as
        runner.start does."""
        try:
            return taken.start.launch(command, local.workdir, env, captures)
        except runner.WarmGone as exc:
            log.warning("job %s attempt %s starts without the warm launch: %s", local.job_id,
                        local.attempt, exc)
            taken.cgroup.remove()  # launch() discarded the chain, which killed its cgroup
            return None

    def _check_not_ended(self, local: LocalJob) -> None:
        if local.end_reason is not None:
            raise _Aborted()


def warm_limits(plan: Plan) -> warm.Limits:
    return warm.Limits(plan.memory_mb, plan.cpu_percent, plan.max_processes)


def _run_sh_command(workdir: str) -> str:
    path = os.path.join(workdir, RUN_SH)
    try:
        st = os.stat(path)
    except OSError:
        raise JobError(NO_RUN_SH_MESSAGE) from None
    if not stat.S_ISREG(st.st_mode):
        raise JobError(NO_RUN_SH_MESSAGE)
    return f"exec ./{RUN_SH}" if st.st_mode & 0o111 else f"exec /bin/sh ./{RUN_SH}"


def _port(job: dict) -> int | None:
    port = job.get("port")
    if isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535:
        return port
    if port is not None:
        log.warning("job %s has an unusable port %r; ignoring it", job.get("job_id"), port)
    return None


def _fresh_dir(path: str) -> None:
    """An empty work dir, private from the start (0700): leftovers of an earlier agent's
    run of the same attempt go."""
    if os.path.lexists(path):
        shutil.rmtree(path)
    os.makedirs(path, mode=0o700)
    os.chmod(path, 0o700)  # whatever the umask


def _tmp_dir(workdir: str) -> str:
    """TMPDIR of a job without a private /tmp: a directory in its work dir (prepare_workdir
    then gives it to the job). One a deploy zip brought is used when it is a directory."""
    path = os.path.join(workdir, TMPDIR_NAME)
    if not os.path.lexists(path):
        os.mkdir(path, 0o700)
    elif not stat.S_ISDIR(os.lstat(path).st_mode):
        raise JobError(f"the job's work dir holds {TMPDIR_NAME}, which is not a directory; the agent "
                        "makes it the job's TMPDIR (this node gives jobs no private /tmp)")
    return path
