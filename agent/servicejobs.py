"""The agent's side of service jobs.

What it does when one starts, when a new agent finds those an earlier one left running,
and when the agent stops.

A started service gets a state file (services.ServiceState) and a monitor (health
checks, its registry record). Stopping the agent detaches the running services:
their monitors stop without removing the record and they leave the job table, but
their processes, records and state files stay, so the next agent on the node adopts
them (`adopt`) instead of every service restarting with the agent.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from corral.shared import wire
from corral.shared.clients import RegistryClient

from . import cgroups, identity, services
from .jobs import JobTable, LocalJob
from .reconcile import Key
from .settings import AgentSettings

log = logging.getLogger(__name__)

# How long detaching waits for service monitors to notice they should stop.
MONITOR_JOIN_SECS = 2.0


class ServiceJobs:
    def __init__(self, settings: AgentSettings, registry: RegistryClient, jobs: JobTable,
                 clock: Callable[[], float]):
        self.settings = settings
        self.registry = registry
        self.jobs = jobs
        self._clock = clock

    def started(self, local: LocalJob, job: dict, port: int | None, cg) -> None:
        """Right after a service's process started: its state file, then its monitor."""
        process, log_files = local.process, local.log_files
        assert process is not None and log_files is not None  # a started service has both
        name = job.get("name") or local.job_id
        start_time = services.proc_start_time(process.pid)
        local.state_path = services.state_path(self.settings.service_state_root, local.job_id, local.attempt)
        try:
            services.ServiceState(local.job_id, local.attempt, process.pid, start_time or 0,
                                  cg.name, port, name, job.get("health_path"), local.workdir,
                                  log_files[0], log_files[1], uid=local.uid,
                                  grant=job.get("service_grant"), disk_mb=local.disk_mb,
                                  gpus=list(local.gpus)).write(local.state_path)
        except OSError as exc:
            log.warning("could not write the state file of service job %s: %s; a restarted agent "
                        "will not re-adopt it", local.job_id, exc)
        local.monitor = self._monitor(local.job_id, local.attempt, name, port, job.get("health_path"),
                                      log_files, job.get("service_grant"))

    def adopt(self, cgroups_: cgroups.Manager, users: identity.JobUsers) -> tuple[list[Key], list[services.Ended]]:
        """Take over the services an earlier agent of this node left running (their
        state files), each with its uid held again and a monitor that checks first.
        Returns their keys, and the services that ended while no agent watched them:
        their registry records are being removed (on threads of their own), their
        reports are the caller's to send."""
        adopted = []
        s = self.settings
        found_all, ended = services.adoptable(s.service_state_root, cgroups_, s.output_tail_bytes, s.kill_grace)
        for gone in ended:
            # Before anything else: a load balancer reading the registry must stop being
            # sent to its port now, not when the node's lease runs out.
            services.forget_record_soon(self.registry.clone(), gone.state.job_id, gone.state.attempt)
        for found in found_all:
            state = found.state
            key = services.file_stem(state.job_id, state.attempt)
            held = users.hold(key, state.uid)
            if not held and state.uid is not None:
                log.warning("service job %s attempt %s runs as uid %d, which this agent cannot hold for it "
                            "(outside AGENT_UID_RANGE, or held by another job); it keeps running",
                            state.job_id, state.attempt, state.uid)
            local = LocalJob(state.job_id, state.attempt, wire.JOB_SERVICE, state.workdir, self._clock(),
                             None, process=found.process, cgroup=found.process.cgroup,
                             memory_mb=found.process.cgroup.limits["memory_mb"],
                             state_path=found.path, log_files=(state.stdout, state.stderr),
                             uid=state.uid, user_key=key if held else None, adopted=True, disk_mb=state.disk_mb,
                             gpus=tuple(state.gpus))
            local.monitor = self._monitor(state.job_id, state.attempt, state.name, state.port,
                                          state.health_path, local.log_files, state.grant, check_first=True)
            local.prepared.set()
            self.jobs.add(local)
            adopted.append(local.key)
            log.info("re-adopted service job %s attempt %s (pid %d, port %s)", state.job_id,
                     state.attempt, state.pid, state.port)
        return adopted, ended

    def _monitor(self, job_id: str, attempt: int, name: str, port: int | None, health_path: str | None,
                 log_files, grant: str | None, check_first: bool = False) -> services.ServiceMonitor:
        """The service's health checks and registry record. The record names the attempt
        and carries the scheduler's grant for it (with tokens, the registry takes a
        node's record only with it)."""
        record = None
        if port is not None:
            record = {"job_id": job_id, "name": name, "node_id": self.settings.node_id,
                      "address": self.settings.address, "port": port, "attempt": attempt}
            if isinstance(grant, str):
                record["grant"] = grant
        return services.ServiceMonitor(
            self.registry.clone(), record, health_path, self.settings.health_interval,
            self.settings.health_timeout, log_files, self.settings.service_log_max_bytes,
            check_first=check_first).start()

    def only_services_left(self) -> bool:
        """Every job held here is a running service (corral-agent --once is done)."""
        return all(detachable(local) for local in self.jobs.snapshot())

    def detach(self) -> list[Key]:
        """Forget the running services without stopping them: their state files let
        the next agent re-adopt them. Returns their keys."""
        detached = [local for local in self.jobs.snapshot() if detachable(local)]
        for local in detached:
            if local.monitor is not None:
                local.monitor.stop(remove=False)
            self.jobs.remove(local.key)
        deadline = time.monotonic() + MONITOR_JOIN_SECS
        for local in detached:
            if local.monitor is not None:
                local.monitor.join(max(0.0, deadline - time.monotonic()))
            log.info("leaving service job %s attempt %s running (pid %s) for the next agent",
                     local.job_id, local.attempt, local.process.pid if local.process else "?")
        return [local.key for local in detached]


def detachable(local: LocalJob) -> bool:
    """A service that runs (prepared and started) and is not being ended."""
    return (local.job_type == wire.JOB_SERVICE and local.prepared.is_set()
            and local.process is not None and local.end_reason is None)
