"""The settings both servers (the registry and the scheduler) read, defined once.

`server_fields(env, filename)` reads those that fill fields of both settings
dataclasses; the rest are defined and read where they act, and listed here for
the docs: CORRAL_REQUEST_READ_TIMEOUT_SECS by the gunicorn worker
(control-plane/server/worker.py), CORRAL_INSECURE by control-plane/server/auth.py, PROMETHEUS_MULTIPROC_DIR
by control-plane/server/metrics.py, CORRAL_LOG_LEVEL (shared/settings.py) by control-plane/server/serve.py.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.shared import settings as s
from corral.shared.credentials import TOKENS, server_credentials
from corral.server.db import POOL, DatabaseOptions
from corral.server.auth import INSECURE
from corral.server.guards import ALLOWED_HOSTS, allowed_hosts
from corral.server.http import DEFAULT_MAX_BODY_BYTES
from corral.server.metrics import METRICS_DIR
from corral.server.worker import REQUEST_READ_TIMEOUT

HEARTBEAT_TIMEOUT = s.Setting(
    "HEARTBEAT_TIMEOUT_SECS", "heartbeat_timeout_secs", "float", 20.0,
    "silence after which the registry marks a node `unhealthy`, and the scheduler's lease period for an "
    "agent's jobs: give both the same", minimum=0.1)
MAX_BODY_BYTES = s.Setting("CORRAL_MAX_BODY_BYTES", "max_body_bytes", "int", DEFAULT_MAX_BODY_BYTES,
                           "larger request bodies get `413`", minimum=1024)

# In the order docs/settings.md lists them.
SERVERS = (*s.DATABASE, *POOL, HEARTBEAT_TIMEOUT, MAX_BODY_BYTES, REQUEST_READ_TIMEOUT, METRICS_DIR,
           *TOKENS, INSECURE, ALLOWED_HOSTS)


def server_fields(env: Mapping[str, str], filename: str) -> dict[str, Any]:
    """The fields RegistrySettings and SchedulerSettings share, read from `env`;
    `filename`: the service's SQLite file under the state dir."""
    return dict(
        database_url=s.database_url(env, filename),
        sqlite_synchronous=s.sqlite_synchronous(env),
        db_options=DatabaseOptions.from_database_env(env),
        heartbeat_timeout_secs=HEARTBEAT_TIMEOUT.read(env),
        max_body_bytes=MAX_BODY_BYTES.read(env),
        credentials=server_credentials(env),
        allowed_hosts=allowed_hosts(env),
    )
