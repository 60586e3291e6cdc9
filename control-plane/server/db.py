"""The storage seam: one database backend per process, chosen once from its URL.

`open_database(url, service=...)` gives a peewee database of the backend the URL
names: `sqlite:///PATH` (backends/sqlite.py, the embedded default) or
`postgresql://USER:PASSWORD@HOST:PORT/DATABASE` (backends/postgres.py, replicas on
one database). What differs between them each `Backend` answers (backends/base.py,
reached with `backend_of(db)`), so the code above never tests which database it
runs on, and queries stay dialect-neutral.
"""
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import peewee
from playhouse.pool import MaxConnectionsExceeded

from corral.shared import settings as s
from corral.server.backends import postgres, postgres_url, sqlite
from corral.server.backends.base import Backend
from corral.server.backends.lookup import backend_of
from corral.server.backends.sqlite import sqlite_path
from corral.server.changefeed import ChangeFeed
from corral.shared.errors import SettingError

log = logging.getLogger(__name__)

__all__ = ["MaxConnectionsExceeded", "DatabaseOptions", "open_database", "schema_for", "change_feed",
           "close_idle", "sqlite_path", "init_app", "JSONField", "Backend", "backend_of"]


@dataclass(frozen=True)
class DatabaseOptions:
    """How a server process uses its database beyond the URL (CORRAL_DB_* settings)."""

    # Connections one process keeps open at most; None: the backend's default
    # (SQLite 32, PostgreSQL 16). A request that finds them all taken waits up to
    # pool_wait_secs, then answers 503.
    pool_size: int | None = None
    pool_wait_secs: float | None = None  # None: the backend's default (SQLite 10 s, PostgreSQL 5 s)
    # PostgreSQL: no LISTEN/NOTIFY between replicas, a look every 0.25 s instead
    # (PgBouncer in transaction mode delivers no notifications).
    poll_only: bool = False
    # Start on a new, empty database even where one existed and is now missing
    # (control-plane/server/db_marker.py); the servers' --init.
    init: bool = False

    @classmethod
    def from_database_env(cls, env: Mapping[str, str]) -> "DatabaseOptions":
        return cls(**s.read_all(POOL, env))


# The CORRAL_DB_* settings, read into DatabaseOptions.
POOL = (
    s.Setting("CORRAL_DB_POOL_SIZE", "pool_size", "int", None,
              "database connections one server process (a gunicorn worker) keeps at most; a request holds one "
              "only while it runs its queries (a waiting claim holds none). On PostgreSQL at least 5, and "
              "replicas × workers × this must fit in the server's `max_connections`",
              minimum=1, maximum=10_000, shown="`32` on SQLite, `16` on PostgreSQL"),
    s.Setting("CORRAL_DB_POOL_WAIT_SECS", "pool_wait_secs", "float", None,
              "how long a request waits for a free connection before it answers `503` (retry)",
              minimum=0.0, maximum=300.0, shown="`10` on SQLite, `5` on PostgreSQL"),
    s.Setting("CORRAL_PG_POLL_ONLY", "poll_only", "bool", False,
              "PostgreSQL: replicas look for each other's work every 0.25 s instead of `LISTEN`/`NOTIFY` "
              "(for PgBouncer in transaction mode, where `LISTEN` does nothing)"),
    s.Setting("CORRAL_DB_INIT", "init", "bool", False,
              "start on a new, empty database where this service's database existed and is now missing or "
              "empty (deleted, dropped), which is otherwise refused; for one start only",
              flag="--init"),
)


PG_DEFAULT_POOL_SIZE = 16
# PostgreSQL's lock_timeout: a request waits no longer for a connection than for a lock.
PG_DEFAULT_POOL_WAIT_SECS = 5.0


def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def schema_for(service: str) -> str:
    """The PostgreSQL schema of a service's tables ("scheduler" -> "corral_scheduler")."""
    return postgres_url.schema_for(service)


def open_database(url: str, synchronous: str = "NORMAL", *, service: str = "scheduler",
                  options: DatabaseOptions = DatabaseOptions()) -> peewee.Database:
    """Open `url` for `service` ("scheduler" or "registry"). A SQLite file is checked
    first; a PostgreSQL URL is only parsed (check_server() connects)."""
    wait = options.pool_wait_secs
    if url.startswith("sqlite"):
        return sqlite.open_sqlite(url, synchronous, options.pool_size,
                                  sqlite.BUSY_TIMEOUT_SECS if wait is None else wait)
    if is_postgres(url):
        return postgres.open_postgres(url, service, options.pool_size or PG_DEFAULT_POOL_SIZE,
                                      PG_DEFAULT_POOL_WAIT_SECS if wait is None else wait)
    raise SettingError(f"DATABASE_URL must start with sqlite:/// or postgresql://, got {postgres_url.redact(url)!r}")


def check_server(db: peewee.Database, processes: int) -> None:
    """At start (the gunicorn master): refuse a database server we cannot use (exit 2)."""
    backend_of(db).check_server(db, processes)


def change_feed(db: peewee.Database, service: str, options: DatabaseOptions = DatabaseOptions()) -> ChangeFeed:
    """How this process hears that other processes committed work (control-plane/server/changefeed.py)."""
    return backend_of(db).change_feed(db, service, options.poll_only)


def check_ready(db: peewee.Database, checks: dict) -> None:
    """/readyz's database part: it answers, it can keep what it is given, and (PostgreSQL)
    this host's clock agrees with the server's. Raises with the reason when not."""
    db.execute_sql("SELECT 1")
    gone = db.lost() if hasattr(db, "lost") else None
    if gone:
        raise RuntimeError(gone)
    checks["database"] = "ok"
    clock = clock_of(db)
    if clock is not None:
        clock()  # measured again when the last look is old
        skew = clock.skew()
        checks["clock_skew_secs"] = round(skew, 3)
        if abs(skew) > postgres.MAX_SKEW_SECS:
            raise RuntimeError(f"this host's clock differs from the database's by {skew:+.1f} s "
                               f"(more than {postgres.MAX_SKEW_SECS:g} s)")


def clock_of(db: peewee.Database):
    """The clock that decides on this database (PostgreSQL: the server's), or None for this host's."""
    return getattr(db, "clock", None)


def deciding_clock(db: peewee.Database, clock: Callable[[], float]) -> Callable[[], float]:
    """The clock a server decides by: the database's where it has one (PostgreSQL), unless
    the caller gave a clock of its own (tests); else `clock`."""
    return (clock_of(db) or clock) if clock is time.time else clock


_in_a_worker = False


def serve_in_a_worker() -> None:
    """Called in each server worker before its app is made: the master made the
    database and applied its migrations before forking, so a worker neither migrates
    nor creates a database file (one moved away while it boots would otherwise come
    back empty at its path, and the worker keep that one)."""
    global _in_a_worker
    _in_a_worker = True
    sqlite.never_create()


def in_a_worker() -> bool:
    return _in_a_worker


def close_idle(db: peewee.Database) -> None:
    """Close this thread's connection and every pooled one. Call before forking:
    a SQLite connection must never be used, or closed, by a forked child."""
    if not db.is_closed():
        db.close()
    if hasattr(db, "close_all"):
        db.close_all()


def init_app(app, db: peewee.Database) -> None:
    """One connection per request, taken from the pool by its first query (so a route
    that reads nothing, /healthz, answers while the database is down) and given
    back at teardown."""

    @app.teardown_request
    def _close(exc):
        if not db.is_closed():
            db.close()


class JSONField(peewee.TextField):
    """A JSON document stored as text (portable across SQLite and PostgreSQL)."""

    def db_value(self, value):
        return None if value is None else json.dumps(value, sort_keys=True)

    def python_value(self, value):
        return None if value is None else json.loads(value)
