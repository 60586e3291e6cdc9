"""What the agent does once when it starts, before it takes work.

Its directories, whether jobs get a private /tmp, and the leftovers an earlier agent of
this node left behind (work dirs and service logs; cgroups and uids are swept by their
own modules). Agent.startup runs these in order, with the cgroup and uid detection and
the adoption of the services still running (servicejobs.py).
"""
from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable

from . import cgroups, devices, diskfs, forkserver, launch, runner, services, spawner
from .settings import AgentSettings

log = logging.getLogger(__name__)

# The directories of the agent: its dir and `work` may be traversed (a job reaches its
# own work dir by its absolute path) but not listed; logs and service state are its own.
DIR_MODES = {"agent_dir": 0o711, "work_root": 0o711, "log_root": 0o700, "service_state_root": 0o700,
             "output_root": 0o700}


def make_dirs(settings: AgentSettings) -> None:
    """The agent's directories with their modes (DIR_MODES), also when an older agent
    made them with others."""
    for attr, mode in DIR_MODES.items():
        path = getattr(settings, attr)
        os.makedirs(path, mode=mode, exist_ok=True)
        os.chmod(path, mode)


def fork_server(settings: AgentSettings) -> forkserver.ForkServer | None:
    """The fork server jobs start through (AGENT_FORK_SERVER), proven by starting one
    `exit 0`; None, logged, where it is off or cannot work here (launch.py's chain then
    starts them)."""
    if not settings.fork_server:
        return None
    if not spawner.machine_known():
        log.info("jobs start through a chain of programs: no fork server on this machine's architecture")
        return None
    try:
        server = forkserver.ForkServer.start()
    except OSError as exc:
        log.warning("jobs start through a chain of programs: the fork server did not start (%s)", exc)
        return None
    try:
        pid = server.spawn(forkserver.Spec(command="exit 0", workdir="/", env={}), 2, 2)
        code = forkserver.ForkedProcess(pid).wait(timeout=10)
        if code != 0:
            raise OSError(f"a trial job exited {code}")
    except (OSError, forkserver.SpawnError) as exc:
        server.close()
        log.warning("jobs start through a chain of programs: the fork server cannot start jobs here (%s)", exc)
        return None
    log.info("jobs start through the fork server (pid %d): one clone and one exec each", server.pid)
    return server


def detect_private_tmp(settings: AgentSettings, fstab: str, forced: bool | None) -> tuple[bool, str]:
    """Whether jobs get a private /tmp here, and why not when they do not; `forced`
    (a test's choice) skips the detection. Writes the fstab the launch mounts from."""
    if forced is not False and settings.private_tmp:
        launch.write_fstab(fstab)
    if forced is None:
        problem = "AGENT_PRIVATE_TMP is false" if not settings.private_tmp else \
            launch.private_tmp_problem(runner.tools(), settings.work_root, fstab)
        enabled, reason = problem is None, problem or ""
    else:
        enabled, reason = forced, ""
    if enabled:
        log.info("jobs get a private /tmp, /var/tmp and /dev/shm")
    else:
        log.warning("jobs share /tmp with the node (TMPDIR points into their work dir): %s",
                    reason or "turned off")
    return enabled, reason


def detect_isolation(settings: AgentSettings, manager: cgroups.Manager) -> devices.Isolation | None:
    """How jobs are held to their GPUs here (devices.choose_mode), None on a node without
    GPUs. Raises ValueError where GPUs cannot be isolated as AGENT_DEVICE_ISOLATION asks."""
    if not settings.gpus:
        return None
    wanted = settings.device_isolation
    problem = None
    if wanted in (devices.AUTO, devices.MOUNT) and cgroups.V1_DEVICES not in manager.roots:
        ordinary = devices.Isolation(devices.NONE, settings.gpus, settings.device_dir).for_job(())
        problem = launch.private_dev_problem(runner.tools(), ordinary.specs() if ordinary else ())
    mode, why = devices.choose_mode(wanted, True, cgroups.V1_DEVICES in manager.roots, problem)
    if mode == devices.NONE:
        log.warning("jobs may open every GPU of this node: %s", why)
    else:
        log.info("jobs open only their own GPUs: %s", why)
    return devices.Isolation(mode, settings.gpus, settings.device_dir)


def detect_disk_fs(settings: AgentSettings, wanted: bool = True) -> tuple[diskfs.DiskFs, bool]:
    """The work dirs' filesystems (diskfs.py) and whether jobs get one here, decided once
    by AGENT_DISK_LIMIT_MODE and a real trial (`wanted` False: a test's fake runner, no
    trial). Logs the mode in force and why; raises SettingError for `fs` where it cannot."""
    fs = diskfs.DiskFs(os.path.join(settings.agent_dir, "disk"), settings.work_root)
    mode = settings.disk_limit_mode if wanted else "watch"
    on, why = diskfs.decide(mode, fs.probe() if mode != "watch" else None)
    if on:
        try:
            fs.share_work_root()
        except OSError as exc:
            on, why = diskfs.decide(mode, diskfs.Probe(True, True, "mkfs.ext4", f"sharing the work root: {exc}"))
    if on:
        log.info("jobs' disk limits are filesystems of their size on their work dirs (%s)", why)
    else:
        log.info("jobs' disk limits are watched every AGENT_DISK_CHECK_SECS, not filesystems: %s", why)
    return fs, on


def remove_leftover_files(settings: AgentSettings, keep: Iterable[str]) -> None:
    """Work dirs, service logs and run jobs' output copies (log_capture.py) an earlier
    agent left behind (it was killed, or its services ended while no agent ran),
    except the paths in `keep` (those of adopted services)."""
    kept = set(keep)
    removed = 0
    for root in (settings.work_root, settings.log_root, settings.output_root):
        for entry in os.scandir(root):
            if entry.path in kept:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                services.remove_file(entry.path)
            removed += 1
    if removed:
        log.info("removed %d work dir(s) and log file(s) left by an earlier agent", removed)
