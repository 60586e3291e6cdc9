"""`corral-agent`: run the node agent in the foreground (systemd runs it this way).

Settings come from environment variables (see settings.py); flags override them.
SIGTERM or SIGINT stops the agent cleanly: no new work, running jobs get
AGENT_STOP_GRACE_SECS to finish, the rest are killed and reported failed.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from corral.shared.clients import RegistryClient, SchedulerClient
from corral.shared.errors import SettingError
from corral.shared.settings import env_choice

from .agent import Agent
from .settings import AgentSettings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

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
    parser.add_argument("--registry-url", help="registry base URL (REGISTRY_URL)")
    parser.add_argument("--scheduler-url", help="scheduler base URL (SCHEDULER_URL)")
    parser.add_argument("--slots", type=int, help="jobs run at once (AGENT_SLOTS; default: CPUs)")
    parser.add_argument("--state-dir", help="where work dirs live (CORRAL_STATE_DIR; default ./var)")
    parser.add_argument("--once", action="store_true",
                        help="register, poll once, run the jobs received to completion, "
                             "report and exit")
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
        level = args.log_level or env_choice(os.environ, "CORRAL_LOG_LEVEL", "INFO", LOG_LEVELS)
    except SettingError as exc:
        print(f"corral-agent: error: {exc.message}", file=sys.stderr)
        return 2
    logging.basicConfig(level=level, format=LOG_FORMAT)

    stop = threading.Event()

    def request_stop(signum, _frame):
        if not stop.is_set():
            logging.getLogger(__name__).info("received %s; stopping",
                                             signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    registry = RegistryClient(settings.registry_url, token=settings.token)
    scheduler = SchedulerClient(settings.scheduler_url, token=settings.token)
    try:
        agent = Agent(settings, registry, scheduler)
        return agent.run_forever(stop, once=args.once)
    finally:
        registry.close()
        scheduler.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
