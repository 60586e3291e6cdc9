"""Opening the database and tying connections to Flask requests.

SQLite is opened in WAL mode with a busy timeout, and every transaction that
peewee's `atomic()` starts is `BEGIN IMMEDIATE`: a deferred transaction that
reads and then writes fails with `database is locked` under concurrent writers
instead of waiting for the lock. Queries stay dialect-neutral so PostgreSQL can
be used through the same `DATABASE_URL`.
"""
import json
import logging
import os
import sqlite3

import peewee
from playhouse.db_url import connect

from .errors import SettingError

log = logging.getLogger(__name__)

BUSY_TIMEOUT_SECS = 10


def open_database(url: str, synchronous: str = "NORMAL") -> peewee.Database:
    """Open `url` (a peewee database URL). For SQLite, check the file first.

    A file that cannot be opened, is locked exclusively or is not a database is
    a SettingError: we never silently start on a new, empty database.
    """
    if url.startswith("sqlite"):
        path = sqlite_path(url)
        if path != ":memory:":
            _check_sqlite_file(path)
        return connect(url, pragmas={
            "journal_mode": "wal",
            "synchronous": synchronous,
            "foreign_keys": 1,
            "cache_size": -16000,
        }, timeout=BUSY_TIMEOUT_SECS, lock_type="IMMEDIATE")
    return connect(url)


def sqlite_path(url: str) -> str:
    """The file of a sqlite:// URL (or ':memory:')."""
    # sqlite:///relative.db, sqlite:////absolute.db, sqlite:///:memory:
    path = url.split("://", 1)[1]
    path = path[1:] if path.startswith("/") else path
    return path or ":memory:"


def _check_sqlite_file(path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise SettingError(f"cannot create the database directory {directory}: {exc}") from None
    if not os.path.exists(path):
        return
    if not os.access(path, os.R_OK | os.W_OK):
        raise SettingError(f"the database file {path} is not readable and writable by this user")
    try:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_SECS)
        try:
            row = conn.execute("PRAGMA quick_check").fetchone()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise SettingError(f"the database file {path} cannot be used: {exc}") from None
    if not row or row[0] != "ok":
        raise SettingError(f"the database file {path} failed its integrity check: {row[0] if row else '?'}")


def init_app(app, db: peewee.Database) -> None:
    """One connection per request, opened lazily and closed at teardown."""

    @app.before_request
    def _connect():
        db.connect(reuse_if_open=True)

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
