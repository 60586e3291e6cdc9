"""A lost database is refused at start, never replaced by a new, empty one
(docs/operations.md, "A lost database is refused").

Each service records, somewhere that outlives the database, that it has had one and
which (its id: the name and time of its first migration step, which a backup and
its restore share): SQLite a `<database>-id` file beside it, PostgreSQL a row of
`corral_cluster.service_database`. The migrating process runs `before_connect()`,
`check()`, the migrations, then `record()`, under the migration lock; what each
backend checks is its `marker_guard()` (backends/sqlite_marker.py, postgres_marker.py).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import peewee

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
