"""Personal tokens: their secrets, and who one stands for without a database read on
every request (docs/security.md, "Personal tokens").

A secret is `corral_pat_` and 256 random bits (URL-safe base64); the database keeps
only its SHA-256 (a secret that random needs no salt or slow hash: nobody can guess
one from its digest), and finds a token by that digest. `TokenCache` keeps what each
digest stood for (a principal, or nothing) for TTL_SECS in each process, so a
revoked or expired token, or a changed membership, is in force on every replica
within that time and at once in the process that made the change.
"""
from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable

from corral.server.principals import Principal

PREFIX = "corral_pat_"
SECRET_BYTES = 32
TOKEN_ID_PREFIX = "tok-"
TTL_SECS = 2.0
MAX_ENTRIES = 10_000  # digests cached per process; past it the cache starts afresh
# last_used_at is written when a token is read from the database and the stored time
# is older than this: a used token costs at most one write a minute per process.
LAST_USED_STEP_SECS = 60.0


def new_secret() -> str:
    return PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def new_token_id() -> str:
    return TOKEN_ID_PREFIX + secrets.token_hex(8)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def looks_personal(presented: str) -> bool:
    """Whether a bearer token has a personal token's form (others never reach the database)."""
    return presented.startswith(PREFIX) and len(presented) <= 128


class TokenCache:
    """Who each personal token stands for, read through `load(digest)` (None: no such
    token, or revoked or expired) and kept TTL_SECS. Called with the presented secret."""

    def __init__(self, load: Callable[[str], Principal | None], ttl: float = TTL_SECS,
                 clock: Callable[[], float] = time.monotonic, accepts: Callable[[str], bool] = looks_personal,
                 by_secret: bool = False):
        """`accepts(presented)`: the tokens this cache is for; `by_secret`: `load` gets the
        presented token itself (a JWT, which holds its claims), not its digest."""
        self._load, self._ttl, self._clock = load, ttl, clock
        self._accepts, self._by_secret = accepts, by_secret
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, Principal | None]] = {}

    def __call__(self, presented: str) -> Principal | None:
        if not self._accepts(presented):
            return None
        key = digest(presented)
        now = self._clock()
        with self._lock:
            entry = self._entries.get(key)
        if entry is not None and now - entry[0] < self._ttl:
            return entry[1]
        principal = self._load(presented if self._by_secret else key)  # a failure propagates: no stale "accept"
        with self._lock:
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[key] = (now, principal)
        return principal

    def forget(self) -> None:
        """Read every token again (after this process revoked one or changed a user)."""
        with self._lock:
            self._entries.clear()
