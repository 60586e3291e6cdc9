"""The scheduler's HTTP API (Flask), run by `corral-scheduler` under gunicorn.

`create_app`, the composition of its routes (api/, routes.py), the parts a process
builds (wiring.py) and the servers' common plumbing (guards, OpenAPI, readiness,
metrics, the dashboard); and the schema's migration before the workers fork."""
import time
from collections.abc import Callable

from flask import Flask

from corral.server import db as dbmod
from corral.server import audit_trail, guards, migrations
from corral.server import serve as server
from corral.server.http import base_app, serve_openapi, serve_readiness
from corral.server.metrics import serve_metrics
from corral.server.routes import check_declared, register

from . import metrics, openapi, routes, ui, wiring
from .migrations import MIGRATIONS
from .settings import SchedulerSettings
from .wiring import open_db, open_store

__all__ = ["create_app", "create_schema", "open_db", "open_store"]


def create_schema(settings: SchedulerSettings, check: bool = False) -> list[str]:
    """Apply the database's pending schema migrations (the gunicorn master before the
    workers fork, and `corral-scheduler migrate`); the steps applied. With `check`,
    only the steps pending. A database newer than this code is a SettingError."""
    store = open_store(settings)
    dbmod.check_server(store.db, processes=1)
    try:
        return (migrations.pending if check else migrations.apply)(store.db, MIGRATIONS, settings.db_options.init)
    finally:
        dbmod.close_idle(store.db)  # the master forks the workers next


def create_app(settings: SchedulerSettings | None = None, clock: Callable[[], float] = time.time,
               start_loops: bool = False) -> Flask:
    """The WSGI app. `start_loops` runs the background loops in this process (gunicorn workers)."""
    settings = settings or SchedulerSettings.from_env()
    api = wiring.scheduler_api(settings, open_db(settings), clock)
    app = base_app(__name__, settings.max_body_bytes)
    guards.install(app, settings.credentials, routes.ACCESS, settings.allowed_hosts, server.loopback_only(),
                   routes.RAW_ROUTES, floors=api.floors, users=api.tokens)
    audit_trail.install(app, api.store.db, routes.AUDITED, api.store.audit.write, api.store.audit.set_status,
                        api.clock)
    dbmod.init_app(app, api.store.db)
    serve_openapi(app, openapi.DOCUMENT)
    app.register_blueprint(ui.blueprint)  # the dashboard at /ui
    serve_readiness(app, wiring.readiness(api))
    serve_metrics(app, metrics.FAMILIES, lambda: metrics.scrape(api.store, api.clock))
    register(app, routes.GROUPS, api)
    check_declared(app, routes.ACCESS)
    app.extensions.update({"corral.store": api.store, "corral.scheduler": api.scheduler,
                           "corral.wait_room": api.room, "corral.stream_hub": api.hub, "corral.tokens": api.tokens})
    if start_loops:
        app.extensions.update(wiring.start_loops(api))
    return app
