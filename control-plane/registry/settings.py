"""Registry settings, read from the environment (see the README for each)."""
import os
from collections.abc import Mapping
from dataclasses import dataclass

from corral.shared import settings as s
from corral.shared.auth import Tokens, server_tokens
from corral.shared.http import DEFAULT_MAX_BODY_BYTES


@dataclass(frozen=True)
class RegistrySettings:
    database_url: str
    sqlite_synchronous: str = "NORMAL"
    heartbeat_timeout_secs: float = 20.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    tokens: Tokens = Tokens()  # CORRAL_API_TOKEN, CORRAL_AGENT_TOKEN (shared/auth.py); unset: open

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "RegistrySettings":
        return cls(
            database_url=s.database_url(env, "registry.db"),
            sqlite_synchronous=s.sqlite_synchronous(env),
            heartbeat_timeout_secs=s.env_float(env, "HEARTBEAT_TIMEOUT_SECS", 20.0, minimum=0.1),
            max_body_bytes=s.env_int(env, "CORRAL_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES, minimum=1024),
            tokens=server_tokens(env),
        )
