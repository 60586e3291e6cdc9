"""The storage backends the benchmark runs the control plane on: SQLite (the
default, a file under each cluster's state dir) and PostgreSQL.

PostgreSQL is either a throwaway server the bench starts itself (tests/pg.py's,
as the tests start theirs, but with `fsync=on` and `synchronous_commit=on`: the
durability users get) or a server the user names with a URL. Either way every
cluster gets fresh databases of its own (the scheduler's and the registry's, whose
tables share names), created when the cluster is made and dropped after it
stops, so no round sees another's jobs or nodes.

Also here: what the run records about the server (its version and settings), and
the CPU its processes used (the postmaster's tree, backends that exited included).
"""
from __future__ import annotations

import itertools
import sqlite3
import urllib.parse
import uuid

import psycopg

import benchlib as bl  # first: it puts tests/ on sys.path
import pg  # tests/pg.py: the throwaway server

BACKENDS = ("sqlite", "postgresql")
# What the meta line records of a PostgreSQL server.
RECORDED_SETTINGS = ("fsync", "synchronous_commit", "shared_buffers", "max_connections", "wal_level")
CONNECT_TIMEOUT = 10  # seconds


class Sqlite:
    """Each cluster's servers use their default file under its state dir
    (two scheduler replicas of one cluster share it)."""

    name = "sqlite"

    def new_database(self) -> str | None:
        return None  # no DATABASE_URL: the default file

    def drop_database(self, url: str | None) -> None:
        pass

    def describe(self) -> dict:
        return {"sqlite": sqlite3.sqlite_version, "journal_mode": "wal", "synchronous": "NORMAL",
                "file": "one per cluster, under its state dir"}

    def cpu_seconds(self) -> float | None:
        return None  # SQLite runs inside the servers: their CPU includes it

    def stop(self) -> None:
        pass


class Postgres:
    """A PostgreSQL server: one this process started (`own`), or one named by a URL.
    new_database() gives each caller a fresh, empty database on it."""

    name = "postgresql"

    def __init__(self, admin_url: str, own: pg.PgServer | None = None):
        self.admin_url = admin_url  # a database to connect to for CREATE/DROP DATABASE
        self.own = own
        marker = uuid.uuid4().hex[:8]  # this run's databases, apart from anyone else's on the server
        self._names = (f"corral_bench_{marker}_{n}" for n in itertools.count(1))
        self._postmaster: int | None = own.pid if own else None

    @classmethod
    def start(cls) -> Postgres:
        """A throwaway server on a free loopback port, durable as in production."""
        reason = pg.missing()
        if reason:
            raise RuntimeError(reason)
        server = pg.start(fsync=True, synchronous_commit=True)
        return cls(server.url("postgres"), own=server)

    @classmethod
    def at(cls, url: str) -> Postgres:
        """A running server; `url`'s role must be allowed to create databases."""
        server = cls(url)
        server._admin("SELECT 1")  # fails early, with the server's own message
        return server

    def new_database(self) -> str:
        name = next(self._names)
        self._admin(f'CREATE DATABASE "{name}"')
        return with_database(self.admin_url, name)

    def drop_database(self, url: str | None) -> None:
        if url:
            name = urllib.parse.urlsplit(url).path.lstrip("/")
            # FORCE: connections a stopped server left behind would block the drop.
            self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _admin(self, sql: str) -> None:
        # CREATE and DROP DATABASE cannot run inside a transaction: autocommit.
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=CONNECT_TIMEOUT) as conn:
            conn.execute(sql)

    def describe(self) -> dict:
        """The server's version and the settings that decide what a commit costs."""
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=CONNECT_TIMEOUT) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
            settings = {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in RECORDED_SETTINGS}
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            if self._postmaster is None:
                # While the connection is open: its backend exits with it, and then
                # /proc no longer tells whose child it was.
                self._postmaster = local_postmaster(backend)
        return {"server": "started by the bench (initdb, trust on 127.0.0.1)" if self.own
                else "given by --database-url", "version": version, **settings,
                "cpu_measured": self._postmaster is not None}

    def cpu_seconds(self) -> float | None:
        """CPU the server used so far: every process of the postmaster's tree (None when
        the server is not on this machine)."""
        return bl.tree_cpu_seconds(self._postmaster) if self._postmaster else None

    def stop(self) -> None:
        if self.own is not None:
            self.own.stop()


# The columns a pending job needs (the others have SQL defaults or may be NULL), as a
# fresh `{"command": "true"}` submit stores them, queued one after another.
PENDING_COLUMNS = ("command, job_type, env_vars, status, attempt, retry_count, max_retries, on_node_lost, "
                   "node_losses, created_at, priority, queue_at, dependencies_left, has_dependents, "
                   "on_dependency_failure")


def fill_pending(database_url: str | None, sqlite_path: str, count: int, now: float) -> None:
    """Add `count` pending, unplaced jobs to a scheduler's database in one INSERT ... SELECT
    (seconds for 100,000, where POST /jobs/batch would take minutes): the queue a burst of
    submits leaves. `database_url`: its PostgreSQL database (tables in the corral_scheduler
    schema); None: the SQLite file at `sqlite_path` (its servers keep running: WAL).
    Then the database is left as it would be had the queue built up over minutes: the
    WAL checkpointed (SQLite), the table vacuumed and analyzed (PostgreSQL's autovacuum),
    so that the first submits after do not pay for the bulk insert."""
    def values(now: str, false: str) -> str:
        return f"'true', 'run', '{{}}', 'pending', 0, 0, 1, 'requeue', 0, {now}, 50, {now} + n, 0, {false}, 'cancel'"

    if database_url:
        with psycopg.connect(database_url, connect_timeout=CONNECT_TIMEOUT) as conn:
            conn.execute(f"INSERT INTO corral_scheduler.job ({PENDING_COLUMNS}) SELECT {values('%(now)s', 'false')} "
                         "FROM generate_series(1, %(count)s) AS s(n)", {"now": now, "count": count})
        with psycopg.connect(database_url, connect_timeout=CONNECT_TIMEOUT, autocommit=True) as conn:
            conn.execute("VACUUM (ANALYZE) corral_scheduler.job")
        return
    conn = sqlite3.connect(sqlite_path, timeout=60)
    try:
        with conn:
            conn.execute(f"WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < :count) "
                         f"INSERT INTO job ({PENDING_COLUMNS}) SELECT {values(':now', '0')} FROM s",
                         {"now": now, "count": count})
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def local_postmaster(backend_pid: int) -> int | None:
    """The postmaster of a backend, when that backend runs on this machine (and in this
    pid namespace): the parent of a process named postgres."""
    parent = bl.parent_pid(backend_pid)
    try:
        with open(f"/proc/{backend_pid}/comm") as f:
            ours = f.read().strip() == "postgres"
    except OSError:
        return None
    return parent if ours else None


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def with_database(url: str, name: str) -> str:
    """`url` with its database replaced by `name`."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + name))


def choose(backends: list[str], database_url: str | None) -> dict[str, Sqlite | Postgres]:
    """Make the backends asked for (starting PostgreSQL when no URL names one)."""
    made: dict[str, Sqlite | Postgres] = {}
    try:
        for name in backends:
            if name == "sqlite":
                made[name] = Sqlite()
            else:
                made[name] = Postgres.at(database_url) if database_url else Postgres.start()
    except BaseException:
        for backend in made.values():
            backend.stop()
        raise
    return made
