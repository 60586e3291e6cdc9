"""The registry's HTTP API (Flask), run by `corral-registry` under gunicorn.

Its database and schema, and `create_app`, the composition of its routes (api/) with the
servers' common plumbing (guards, OpenAPI, readiness, metrics)."""
import time
from collections.abc import Callable

import peewee
from flask import Flask
from peewee import fn

from corral.server import guards, revocations, serve as server
from corral.server import db as dbmod
from corral.server import migrations
from corral.server.http import base_app, serve_openapi, serve_readiness
from corral.server.metrics import serve_metrics
from corral.server.routes import check_declared, register

from . import metrics, openapi, routes
from .api.context import RegistryApi
from .liveness import Liveness
from .migrations import MIGRATIONS
from .models import Node, NodeCredential, Service, database
from .settings import RegistrySettings

SERVICE = "registry"  # its PostgreSQL schema: corral_registry


def open_store(settings: RegistrySettings):
    db = dbmod.open_database(settings.database_url, settings.sqlite_synchronous, service=SERVICE,
                             options=settings.db_options)
    database.initialize(db)
    return db


def create_schema(settings: RegistrySettings, check: bool = False) -> list[str]:
    """Apply the database's pending schema migrations (the gunicorn master before the
    workers fork, and `corral-registry migrate`); the steps applied. With `check`,
    only the steps pending. A database newer than this code is a SettingError."""
    db = open_store(settings)
    dbmod.check_server(db, processes=1)
    try:
        return (migrations.pending if check else migrations.apply)(db, MIGRATIONS, settings.db_options.init)
    finally:
        dbmod.close_idle(db)  # the master forks the workers next


def create_app(settings: RegistrySettings | None = None, clock: Callable[[], float] = time.time) -> Flask:
    """The WSGI app: the routes of api/ on the servers' common plumbing."""
    settings = settings or RegistrySettings.from_env()
    db = open_store(settings)
    clock = dbmod.deciding_clock(db, clock)  # PostgreSQL: the database's clock
    if not dbmod.in_a_worker():  # a server's master migrated before forking its workers
        migrations.apply(db, MIGRATIONS, settings.db_options.init)
    api = registry_api(db, settings, clock)
    app = base_app(__name__, settings.max_body_bytes)
    guards.install(app, settings.credentials, routes.ACCESS, settings.allowed_hosts, server.loopback_only(),
                   floors=api.floors)
    dbmod.init_app(app, db)
    serve_openapi(app, openapi.DOCUMENT)
    serve_readiness(app, lambda checks: dbmod.check_ready(db, checks))
    serve_metrics(app, metrics.FAMILIES, lambda: metrics.scrape(api.liveness.cutoff(clock()), db))
    register(app, routes.GROUPS, api)
    check_declared(app, routes.ACCESS)
    return app


def registry_api(db: peewee.Database, settings: RegistrySettings, clock: Callable[[], float]) -> RegistryApi:
    """What the routes read. Liveness starts from the newest heartbeat and health check
    stored, for the grace after a restart (liveness.py)."""
    with db.connection_context():
        last_up = Node.select(fn.MAX(Node.last_heartbeat)).scalar()
        last_checked = Service.select(fn.MAX(Service.checked_at)).scalar()
    liveness = Liveness(settings.heartbeat_timeout_secs, clock(), last_up)
    # A health check older than SERVICE_CHECK_MAX_AGE_SECS says nothing any more: its
    # agent stopped sending it (the same grace after a registry restart as for nodes).
    freshness = Liveness(settings.service_check_max_age_secs, clock(), last_checked)
    floors = revocations.Floors(lambda: revocations.load_floors(db, NodeCredential))
    return RegistryApi(db, settings, clock, liveness, freshness, floors)
