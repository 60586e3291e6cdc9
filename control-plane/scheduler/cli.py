"""`corral-scheduler`: the scheduler under gunicorn, its loops in every worker behind a lease."""
from corral.server.serve import run_service

from .app import create_app, create_schema
from .settings import SchedulerSettings


def main(argv: list[str] | None = None) -> None:
    run_service("corral-scheduler", 9001,
                prepare=lambda: create_schema(SchedulerSettings.from_env()),
                migrate=lambda check: create_schema(SchedulerSettings.from_env(), check),
                loader=lambda: create_app(start_loops=True), argv=argv)
