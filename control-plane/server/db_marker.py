"""A lost database is refused at start, never replaced by a new, empty one.

Each service records that it has had a database, somewhere that outlives the
database itself, and says which one (its id: the name and time of the first
migration step applied to it, which a backup and its restore share):

- SQLite: the file `<database>-id` beside the database file (with the
  `-writers.lock` and `-migrate.lock` files). The marker without the database
  (deleted, moved, a disk not mounted) or with an empty one in its place is a
  lost database. Where a release before markers ran, its `-writers.lock` (made
  by the first write) says as much until the next start writes the marker.
- PostgreSQL: the database server is the durable thing, so the marker is a row
  of `corral_cluster.service_database`, a schema of its own that neither
  service's schema holds: the row without the service's tables (its schema
  dropped, its tables dropped) is a lost database. A whole database dropped and
  made again empty looks like a first start: that is what backups are for.

A refused start is one line and exit code 2 (SettingError) that names what is
missing and how to start fresh on purpose: `--init` or CORRAL_DB_INIT=1. A
first start (no marker) just works, and a database from before markers gets its
marker at its next start. A database whose id differs from the marker's (a
different file, or another database's restore) is used and said in the log.

It runs in the migrating process under the service's migration lock
(control-plane/server/migrations.py): `before_connect()` (SQLite: opening a missing file
would create it), `check()`, the migrations, then `record()`.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

import peewee

from corral.server.backends import postgres
from corral.shared.errors import SettingError

log = logging.getLogger(__name__)

MARKER_SCHEMA = "corral_cluster"
MARKER_TABLE = f"{MARKER_SCHEMA}.service_database"
# Serialises both services' creation of the marker's schema and table (two
# `CREATE ... IF NOT EXISTS` at once can collide); "CorralM", 0.
MARKER_LOCK_KEY = 0x436F7272_616C4D00
HOW_TO_START_FRESH = "start a new, empty database on purpose with --init (or CORRAL_DB_INIT=1) for one start"


@dataclass(frozen=True)
class Found:
    """What a start finds: the marker and the database."""

    marked: bool                 # a marker says this service has had a database here
    marked_id: str | None        # the id the marker records (None: unreadable)
    holds_data: bool             # the database has the service's tables (or a history)
    database_id: str | None      # its id, or None before its first migration step


@dataclass(frozen=True)
class Verdict:
    refuse: bool
    warning: str | None = None


def judge(found: Found, init: bool) -> Verdict:
    """Whether to start on what was found (pure)."""
    if found.marked and not found.holds_data:
        if init:
            return Verdict(False, "starting a new, empty database where one existed, as asked (--init or "
                                  "CORRAL_DB_INIT); every job and node it held is gone")
        return Verdict(True)
    if init and found.holds_data:
        return Verdict(False, "--init (CORRAL_DB_INIT) is set but the database holds data: nothing is reset; "
                              "remove the setting once the new database has started")
    if found.marked and found.database_id and found.marked_id and found.marked_id != found.database_id:
        return Verdict(False, f"this is not the database this server last used (its first step: "
                              f"{found.database_id}; the one recorded: {found.marked_id}): a restore of "
                              f"another database, or a different file; using it, and recording it")
    return Verdict(False)


class Guard:
    """The marker of one service's database (one backend's)."""

    def __init__(self, db: peewee.Database, service: str, history_table: str, init: bool):
        self.db = db
        self.service = service
        self.history_table = history_table
        self.init = init

    # --- the backend's own ---------------------------------------------------------
    def read_marker(self) -> tuple[bool, str | None]:
        raise NotImplementedError

    def write_marker(self, database_id: str) -> None:
        raise NotImplementedError

    def tables(self) -> list[str]:
        raise NotImplementedError

    def missing(self) -> str:
        """The refusal, naming what is missing and what says it existed."""
        raise NotImplementedError

    # --- shared ----------------------------------------------------------------------
    def before_connect(self) -> None:
        """Refuse before a connection could create the missing database."""

    def check(self) -> None:
        """Connected: refuse a lost database (SettingError), or say what is odd."""
        marked, marked_id = self.read_marker()
        tables = self.tables()
        database_id = self.database_id(tables)
        holds_data = bool(database_id) or any(t != self.history_table for t in tables)
        verdict = judge(Found(marked, marked_id, holds_data, database_id), self.init)
        if verdict.refuse:
            raise SettingError(self.missing())
        if verdict.warning:
            log.warning("the %s database: %s", self.service, verdict.warning)

    def record(self) -> None:
        """Connected, after the migrations: the marker names this database."""
        marked, marked_id = self.read_marker()
        database_id = self.database_id(self.tables())
        if database_id and (not marked or marked_id != database_id):
            self.write_marker(database_id)

    def database_id(self, tables: list[str]) -> str | None:
        """The name and time of the first step in the history, or None (no history yet)."""
        if self.history_table not in tables:
            return None
        row = self.db.execute_sql(f'SELECT name, applied FROM "{self.history_table}" '
                                  f'ORDER BY name LIMIT 1').fetchone()
        return f"{row[0]} applied {row[1]}" if row else None


class SqliteGuard(Guard):
    def __init__(self, db: peewee.Database, service: str, history_table: str, init: bool):
        super().__init__(db, service, history_table, init)
        self.path = db.database
        self.marker_path = f"{self.path}-id"
        # Made by the first write to a database: a release before markers leaves it, so a
        # database lost before that release's first start here is refused too.
        self.writers_lock = f"{self.path}-writers.lock"
        self.said_by = self.marker_path

    def read_marker(self) -> tuple[bool, str | None]:
        self.said_by = self.marker_path
        try:
            with open(self.marker_path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            if os.path.exists(self.writers_lock):
                self.said_by = self.writers_lock
                return True, None
            return False, None
        except OSError as exc:
            raise SettingError(f"cannot read {self.marker_path}: {exc.strerror or exc}") from None
        try:
            marked_id = json.loads(text).get("database_id")
        except (ValueError, AttributeError):
            marked_id = None  # damaged: it still says a database existed
        return True, marked_id if isinstance(marked_id, str) else None

    def write_marker(self, database_id: str) -> None:
        text = json.dumps({"service": self.service, "database_id": database_id,
                           "says": f"this host has had the {self.service} database {os.path.basename(self.path)}; "
                                   f"without it, the server refuses to start (see --init)"}) + "\n"
        temporary = f"{self.marker_path}.tmp"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, text.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, self.marker_path)
            directory = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(directory)  # the rename itself survives a crash
            finally:
                os.close(directory)
        except OSError as exc:
            raise SettingError(f"cannot write {self.marker_path}: {exc.strerror or exc}") from None

    def tables(self) -> list[str]:
        return [name for (name,) in self.db.execute_sql(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'").fetchall()]

    def before_connect(self) -> None:
        if not os.path.exists(self.path) and not self.init and self.read_marker()[0]:
            raise SettingError(self.missing())

    def missing(self) -> str:
        state = "is missing" if not os.path.exists(self.path) else "is empty"
        return (f"the {self.service} database {self.path} {state}, but {self.said_by} says this server has "
                f"had one there (deleted, moved, or its disk not mounted?): restore it or fix DATABASE_URL, "
                f"or {HOW_TO_START_FRESH}")


class PostgresGuard(Guard):
    def __init__(self, db: postgres.PostgresDatabase, service: str, history_table: str, init: bool):
        super().__init__(db, service, history_table, init)
        self.url = db.url

    def read_marker(self) -> tuple[bool, str | None]:
        if self.db.execute_sql("SELECT to_regclass(%s)", (MARKER_TABLE,)).fetchone()[0] is None:
            return False, None
        row = self.db.execute_sql(f"SELECT database_id FROM {MARKER_TABLE} WHERE service = %s",
                                  (self.service,)).fetchone()
        return (True, row[0]) if row else (False, None)

    def write_marker(self, database_id: str) -> None:
        with self.db.atomic():
            self.db.execute_sql("SELECT pg_advisory_xact_lock(%s)", (MARKER_LOCK_KEY,))
            self.db.execute_sql(f"CREATE SCHEMA IF NOT EXISTS {MARKER_SCHEMA}")
            self.db.execute_sql(f"CREATE TABLE IF NOT EXISTS {MARKER_TABLE} (service text PRIMARY KEY, "
                                f"database_id text NOT NULL, recorded_at timestamptz NOT NULL DEFAULT now())")
            self.db.execute_sql(f"INSERT INTO {MARKER_TABLE} (service, database_id) VALUES (%s, %s) "
                                f"ON CONFLICT (service) DO UPDATE SET database_id = excluded.database_id, "
                                f"recorded_at = now()", (self.service, database_id))

    def tables(self) -> list[str]:
        return [name for (name,) in self.db.execute_sql(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (postgres.schema_for(self.service),)).fetchall()]

    def missing(self) -> str:
        where = postgres.redact(self.url)
        return (f"the {self.service}'s tables (schema {postgres.schema_for(self.service)}) are missing from "
                f"{where}, but {MARKER_TABLE} there says they existed (dropped, or DATABASE_URL names "
                f"another database?): restore them or fix the URL, or {HOW_TO_START_FRESH}")


def guard(db: peewee.Database, service: str, history_table: str, init: bool) -> Guard | None:
    """The marker's guard of `db`, or None where nothing outlives it (in memory)."""
    if isinstance(db, postgres.PostgresDatabase):
        return PostgresGuard(db, service, history_table, init)
    if isinstance(db, peewee.SqliteDatabase) and db.database not in ("", ":memory:"):
        return SqliteGuard(db, service, history_table, init)
    return None
