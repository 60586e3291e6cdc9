"""Registry settings, read from the environment. The registry reads only settings it
shares with the scheduler (shared/server_settings.py); docs/settings.md lists them."""
import os
from collections.abc import Mapping
from dataclasses import dataclass

from corral.shared.db import DatabaseOptions
from corral.shared.credentials import Credentials
from corral.shared.http import DEFAULT_MAX_BODY_BYTES
from corral.shared.server_settings import server_fields


@dataclass(frozen=True)
class RegistrySettings:
    database_url: str
    sqlite_synchronous: str = "NORMAL"
    # CORRAL_DB_POOL_SIZE, CORRAL_DB_POOL_WAIT_SECS, CORRAL_PG_POLL_ONLY (shared/db.py).
    db_options: DatabaseOptions = DatabaseOptions()
    heartbeat_timeout_secs: float = 20.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # CORRAL_API_TOKEN, CORRAL_AGENT_TOKEN (shared/credentials.py); unset: open, loopback only.
    credentials: Credentials = Credentials()
    # CORRAL_ALLOWED_HOSTS: Host names a loopback-only server accepts besides loopback ones.
    allowed_hosts: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "RegistrySettings":
        return cls(**server_fields(env, "registry.db"))
