"""Registry settings, read from the environment.

Those it shares with the scheduler (control-plane/server/settings.py) and its own
(SETTINGS); docs/settings.md lists them."""
import os
from collections.abc import Mapping
from dataclasses import dataclass

from corral.server.db import DatabaseOptions
from corral.shared.credentials import Credentials
from corral.server.http import DEFAULT_MAX_BODY_BYTES
from corral.server.settings import server_fields
from corral.shared.settings import Setting, read_all

SD_NODE_PORT = Setting(
    "SD_NODE_PORT", "sd_node_port", "int", 9100,
    "the port of the nodes' targets in the Prometheus discovery document `GET /sd/prometheus/nodes` "
    "(node_exporter's by default)", minimum=1, maximum=65535)
SERVICE_CHECK_MAX_AGE = Setting(
    "SERVICE_CHECK_MAX_AGE_SECS", "service_check_max_age_secs", "float", 60.0,
    "a service whose last health check is older than this reads `healthy: null` (unknown) and is not listed "
    "by `GET /services?healthy=true` nor the Prometheus discovery: its agent stopped reporting it. Agents "
    "send every service's health at least every 30 s plus AGENT_HEALTH_INTERVAL_SECS; keep it above that",
    minimum=35.0)
# The registry's own settings, besides those of both servers.
SETTINGS = (SD_NODE_PORT, SERVICE_CHECK_MAX_AGE)


@dataclass(frozen=True)
class RegistrySettings:
    database_url: str
    sqlite_synchronous: str = "NORMAL"
    # CORRAL_DB_POOL_SIZE, CORRAL_DB_POOL_WAIT_SECS, CORRAL_PG_POLL_ONLY (control-plane/server/db.py).
    db_options: DatabaseOptions = DatabaseOptions()
    heartbeat_timeout_secs: float = 20.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # CORRAL_API_TOKEN, CORRAL_AGENT_TOKEN (shared/credentials.py); unset: open, loopback only.
    credentials: Credentials = Credentials()
    # CORRAL_ALLOWED_HOSTS: Host names a loopback-only server accepts besides loopback ones.
    allowed_hosts: frozenset[str] = frozenset()
    sd_node_port: int = 9100
    service_check_max_age_secs: float = 60.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "RegistrySettings":
        return cls(**server_fields(env, "registry.db"), **read_all(SETTINGS, env))
