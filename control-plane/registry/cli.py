"""`corral-registry`: the registry under gunicorn."""
from corral.server.serve import run_service

from .app import create_app, create_schema
from .settings import RegistrySettings


def main(argv: list[str] | None = None) -> None:
    run_service("corral-registry", 9000,
                prepare=lambda: create_schema(RegistrySettings.from_env()),
                migrate=lambda check: create_schema(RegistrySettings.from_env(), check),
                loader=create_app, argv=argv)
