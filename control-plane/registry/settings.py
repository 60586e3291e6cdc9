"""Registry settings, read from the environment (see the README for each)."""
import os
from collections.abc import Mapping
from dataclasses import dataclass

from corral.shared import settings as s
from corral.shared.db import DatabaseOptions
from corral.shared.credentials import Credentials, server_credentials
from corral.shared.guards import allowed_hosts
from corral.shared.http import DEFAULT_MAX_BODY_BYTES


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
        return cls(
            database_url=s.database_url(env, "registry.db"),
            sqlite_synchronous=s.sqlite_synchronous(env),
            db_options=DatabaseOptions.from_database_env(env),
            heartbeat_timeout_secs=s.env_float(env, "HEARTBEAT_TIMEOUT_SECS", 20.0, minimum=0.1),
            max_body_bytes=s.env_int(env, "CORRAL_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES, minimum=1024),
            credentials=server_credentials(env),
            allowed_hosts=allowed_hosts(env),
        )
