"""`corral-agent`: run the node agent in the foreground, or `--check` what it would use.

systemd runs it in the foreground. Settings come from environment variables
(settings.py); flags override them. docs/agent.md ("Checking a node", "Running and
stopping") says what it does and how it stops.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading

from corral.shared import tracing, wire
from corral.shared.clients import RegistryClient, SchedulerClient
from corral.shared.errors import SettingError
from corral.shared.settings import LOG_LEVEL, LOG_LEVELS, split_urls
from corral.shared.signals import SignalWatch

from . import cgroups, disk, identity, launch, runner, startup
from .agent import Agent, AgentStartError
from .settings import AgentSettings

# --check: how long to wait for each server's /healthz.
CHECK_TIMEOUT_SECS = 3.0

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"

# flag destination -> the environment variable it overrides
FLAG_ENV = {
    "node_id": "NODE_ID",
    "registry_url": "REGISTRY_URL",
    "scheduler_url": "SCHEDULER_URL",
    "slots": "AGENT_SLOTS",
    "state_dir": "CORRAL_STATE_DIR",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="corral-agent",
        description="Corral node agent: registers this node, pulls jobs from the scheduler, "
                    "runs them and reports their outcome. Flags override environment variables.")
    parser.add_argument("--node-id", help="node id to register (NODE_ID; default: the host name)")
    parser.add_argument("--registry-url", help="registry base URL, or several comma-separated (REGISTRY_URL)")
    parser.add_argument("--scheduler-url", help="scheduler base URL, or several comma-separated (SCHEDULER_URL)")
    parser.add_argument("--slots", type=int, help="jobs run at once (AGENT_SLOTS; default: CPUs)")
    parser.add_argument("--state-dir", help="where work dirs live (CORRAL_STATE_DIR; default ./var)")
    parser.add_argument("--once", action="store_true",
                        help="register, poll once, run the jobs received to completion, "
                             "report and exit")
    parser.add_argument("--check", action="store_true",
                        help="show the node id, cgroup limits, job user and whether the registry "
                             "and scheduler answer, then exit (0: all is well, 1: a problem)")
    parser.add_argument("--json", action="store_true", help="with --check: print JSON")
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS,
                        help="logging level (CORRAL_LOG_LEVEL; default INFO)")
    return parser


def settings_from(args: argparse.Namespace, env=os.environ) -> AgentSettings:
    # Flags are applied as environment values so they get the very same checks.
    merged = dict(env)
    for dest, name in FLAG_ENV.items():
        value = getattr(args, dest)
        if value is not None:
            merged[name] = str(value)
    return AgentSettings.from_env(merged)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from(args)
        level = args.log_level or LOG_LEVEL.read(os.environ)
    except SettingError as exc:
        print(f"corral-agent: error: {exc.message}", file=sys.stderr)
        return 2
    if args.json and not args.check:
        parser.error("--json only goes with --check")
    logging.basicConfig(level=level, format=LOG_FORMAT)
    if args.check:
        report = check(settings)
        print(json.dumps(report, indent=2) if args.json else format_check(report))
        return 0 if report["ok"] else 1

    server = startup.fork_server(settings)
    runner.use_fork_server(server)
    try:
        return _serve(settings, args)
    finally:
        runner.use_fork_server(None)
        if server is not None:
            server.close()


def _serve(settings: AgentSettings, args: argparse.Namespace) -> int:
    stop = threading.Event()

    def request_stop(signum):
        if not stop.is_set():
            logging.getLogger(__name__).info("received %s; stopping",
                                             signal.Signals(signum).name)
        stop.set()

    # Not in the handler: the main thread may be inside stop.wait() holding its lock.
    watch = SignalWatch([signal.SIGTERM, signal.SIGINT], request_stop)
    registry = client_for(RegistryClient, settings.registry_url, settings)
    scheduler = client_for(SchedulerClient, settings.scheduler_url, settings)
    tracing.setup("corral-agent")  # spans exported only when OTEL_EXPORTER_OTLP_ENDPOINT is set
    try:
        agent = Agent(settings, registry, scheduler)
        try:
            agent.startup()
        except SettingError as exc:
            print(f"corral-agent: error: {exc.message}", file=sys.stderr)
            return 2
        except AgentStartError as exc:
            print(f"corral-agent: error: {exc}", file=sys.stderr)
            return 1
        return agent.run_forever(stop, once=args.once)
    finally:
        registry.close()
        scheduler.close()
        watch.close()
        tracing.shutdown()  # the spans of the last attempts and reports, within a time limit


def client_for(client_class, url: str, settings: AgentSettings):
    """A client of the registry or scheduler that carries this node's credential
    (CORRAL_NODE_TOKEN) and trusts AGENT_CA_BUNDLE when set."""
    return client_class(url, token=settings.token, verify=settings.ca_bundle or True)


def check(settings: AgentSettings) -> dict:
    """What `--check` reports; "ok" is False when something would stop the agent
    from working (a URL of the control plane does not answer, the job user is
    unusable, or AGENT_REQUIRE_CGROUPS is set and limits cannot be enforced: exit 1;
    a bad setting exits 2, as for a normal start). Looks only: creates no cgroup,
    registers nothing."""
    problems = []
    manager = cgroups.detect(root_name=settings.cgroup_root_name, prepare=False)
    described = manager.describe()
    if not manager.enforced:
        if settings.require_cgroups:
            problems.append(f"AGENT_REQUIRE_CGROUPS is set but limits cannot be enforced: "
                            f"{manager.reason}")
    try:
        job_user = identity.job_users(settings.run_as_root, settings.job_user, settings.uid_range,
                                      settings.uid_pool_path, load=False).describe()
    except SettingError as exc:
        job_user = {"error": exc.message}
        problems.append(exc.message)
    tmp_problem = "AGENT_PRIVATE_TMP is false" if not settings.private_tmp else _private_tmp_problem(settings)
    space = disk.describe(settings.work_root, settings.min_free_disk_mb)
    if space["under_floor"]:
        problems.append(f"only {space['free_mb']} MB free on the filesystem of {space['path']}, under "
                        f"AGENT_MIN_FREE_DISK_MB ({space['min_free_mb']} MB): the agent would take no work")
    servers = {}
    for name, client_class, setting in (("registry", RegistryClient, settings.registry_url),
                                        ("scheduler", SchedulerClient, settings.scheduler_url)):
        # Every replica on its own: the agent would fail over from one that does not
        # answer, but that one is still worth knowing of.
        urls = [_answers(client_class, url, settings) for url in split_urls(setting)]
        problems += [f"the {name} at {u['url']} does not answer: {u['error']}" for u in urls if not u["ok"]]
        errors = [u["error"] for u in urls if not u["ok"]]
        servers[name] = {"url": setting, "ok": not errors, "error": "; ".join(errors) or None, "urls": urls}
    run_limits, service_limits = settings.default_limits(wire.JOB_RUN), settings.default_limits(wire.JOB_SERVICE)
    return {
        "ok": not problems,
        "problems": problems,
        "node_id": settings.node_id,
        "cgroups": described,
        "limits_enforced": manager.enforced,
        "limits_reason": manager.reason,
        "require_cgroups": settings.require_cgroups,
        "default_limits": {
            wire.JOB_RUN: {"memory_mb": run_limits[0], "cpu_percent": run_limits[1],
                    "max_processes": settings.job_max_processes},
            wire.JOB_SERVICE: {"memory_mb": service_limits[0], "cpu_percent": service_limits[1],
                        "max_processes": settings.job_max_processes},
        },
        "max_limits": {"memory_mb": settings.max_memory_mb,
                       "cpu_percent": settings.max_cpu_percent,
                       "max_processes": settings.max_processes},
        "job_user": job_user,
        "private_tmp": {"enabled": tmp_problem is None, "reason": tmp_problem},
        "disk": space,
        **servers,
    }


def _answers(client_class, url: str, settings: AgentSettings) -> dict:
    """Whether the server at `url` answers /healthz: {"url", "ok", "error"}."""
    client = client_for(client_class, url, settings)
    try:
        client.healthz(timeout=CHECK_TIMEOUT_SECS)
        return {"url": url, "ok": True, "error": None}
    except Exception as exc:  # ClientError, or anything else: report, never crash
        return {"url": url, "ok": False, "error": str(exc)}
    finally:
        client.close()


def _private_tmp_problem(settings: AgentSettings) -> str | None:
    """launch.private_tmp_problem with an fstab of its own, removed after."""
    scratch = tempfile.mkdtemp(prefix="corral-check-")
    try:
        fstab = launch.write_fstab(os.path.join(scratch, launch.FSTAB_NAME))
        return launch.private_tmp_problem(launch.find_tools(), settings.work_root, fstab)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _describe_users(user: dict) -> str:
    if "error" in user:
        return f"error: {user['error']}"
    if user["mode"] == "per-job":
        return f"a uid of its own per job, from {user['uid_range']} (gid = uid, no groups)"
    return f"{user['user']} (uid {user['uid']}, gid {user['gid']})" + (f"; {user['note']}" if user.get("note") else "")


def format_check(report: dict) -> str:
    def limits(d):
        return (f"{d['memory_mb']} MB, {d['cpu_percent']}% CPU, "
                f"{d['max_processes']} processes")

    cg = report["cgroups"]
    user = report["job_user"]
    tmp = report["private_tmp"]
    lines = [
        f"node id:        {report['node_id']}",
        f"cgroups:        {cg['mode']}" + (f" ({', '.join(cg['controllers'])})" if cg["controllers"] else ""),
        f"limits:         {'enforced' if report['limits_enforced'] else 'NOT enforced'}: "
        f"{report['limits_reason']}" + ("  [AGENT_REQUIRE_CGROUPS]" if report["require_cgroups"] else ""),
        f"run jobs:       {limits(report['default_limits']['run'])} by default",
        f"service jobs:   {limits(report['default_limits']['service'])} by default",
        f"job maximum:    {limits(report['max_limits'])}",
        "jobs run as:    " + _describe_users(user),
        "private /tmp:   " + ("yes (and /var/tmp, /dev/shm, IPC)" if tmp["enabled"] else
                              f"no, TMPDIR in the work dir instead: {tmp['reason']}"),
    ]
    space = report.get("disk")
    if space is not None:
        lines.append(f"disk:           {space['free_mb']} MB free for the work dirs, "
                     f"{'UNDER' if space['under_floor'] else 'above'} AGENT_MIN_FREE_DISK_MB "
                     f"({space['min_free_mb']} MB)")
    for name in ("registry", "scheduler"):
        for index, server in enumerate(report[name]["urls"]):
            state = "answers" if server["ok"] else f"DOES NOT ANSWER: {server['error']}"
            lines.append(f"{name + ':' if index == 0 else '':<16}{server['url']} {state}")
    lines.append("ok" if report["ok"] else "problems:\n" + "\n".join(f"  - {p}" for p in report["problems"]))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
