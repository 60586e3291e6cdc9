"""Opening the database and tying connections to Flask requests.

SQLite is opened in WAL mode with a busy timeout, and every transaction that
peewee's `atomic()` starts is `BEGIN IMMEDIATE`: a deferred transaction that
reads and then writes fails with `database is locked` under concurrent writers
instead of waiting for the lock. Queries stay dialect-neutral so PostgreSQL can
be used through the same `DATABASE_URL`.

SQLite connections are pooled per process (playhouse.pool): a request takes an
open connection and gives it back at teardown. Opening one per request cost
more than the request's own queries (the pragmas, and SQLite parsing the
schema and starting with an empty page cache on every new connection).
"""
import fcntl
import json
import logging
import os
import sqlite3
import threading
import time

import peewee
from playhouse.db_url import connect
from playhouse.pool import MaxConnectionsExceeded, PooledSqliteDatabase

from .errors import SettingError

log = logging.getLogger(__name__)

BUSY_TIMEOUT_SECS = 10
# Open SQLite connections one process keeps at most. Waiting long-poll claims give
# theirs back, so this bounds the requests that touch the database at once; a
# request beyond it waits up to BUSY_TIMEOUT_SECS for one (fairly, unlike SQLite's
# busy handler), then answers 503.
POOL_MAX_CONNECTIONS = 32

__all__ = ["MaxConnectionsExceeded", "open_database", "close_idle", "sqlite_path", "init_app", "JSONField"]


def open_database(url: str, synchronous: str = "NORMAL") -> peewee.Database:
    """Open `url` (a peewee database URL). For SQLite, check the file first.

    A file that cannot be opened, is locked exclusively or is not a database is
    a SettingError: we never silently start on a new, empty database.
    """
    if url.startswith("sqlite"):
        path = sqlite_path(url)
        if path != ":memory:":
            _check_sqlite_file(path)
        pragmas = {
            "journal_mode": "wal",
            "synchronous": synchronous,
            "foreign_keys": 1,
            "cache_size": -16000,
            "busy_timeout": BUSY_TIMEOUT_SECS * 1000,
        }
        if path == ":memory:":  # every connection would be a database of its own
            return connect(url, pragmas=pragmas, timeout=BUSY_TIMEOUT_SECS, lock_type="IMMEDIATE")
        # `timeout` is the pool's wait for a free connection; SQLite's busy timeout
        # is the pragma. A pooled connection serves one thread at a time, but not
        # always the thread that opened it.
        return QueuedWritersSqlite(path, max_connections=POOL_MAX_CONNECTIONS, timeout=BUSY_TIMEOUT_SECS,
                                   pragmas=pragmas, lock_type="IMMEDIATE", check_same_thread=False)
    return connect(url)


# How often a writer asks again for the flock another process holds: from 50 µs,
# doubling up to 200 µs, and once it has waited over 10 ms (a long transaction:
# a batch of 1,000, a purge) up to 2 ms. Write transactions here last about
# 0.3 ms, so a writer that slept 2 ms left the lock idle most of that time: with 8
# clients submitting one job per request, retries every 0.5-2 ms gave 928 jobs/s
# and 1.34 ms of server CPU per job, every 50-200 µs 1,206 jobs/s and 1.17 ms
# (medians of 18 runs each, interleaved; 20-100 µs was no better).
FLOCK_RETRY_SECS = (0.00005, 0.0002)
FLOCK_LONG_WAIT_SECS, FLOCK_LONG_RETRY_SECS = 0.01, 0.002


def flock_retry_delay(delay: float, waited: float) -> float:
    """The pause before the next try for the writers' flock, after `delay` and `waited` in all."""
    cap = FLOCK_LONG_RETRY_SECS if waited > FLOCK_LONG_WAIT_SECS else FLOCK_RETRY_SECS[1]
    return min(delay * 2, cap)


class QueuedWritersSqlite(PooledSqliteDatabase):
    """Write transactions of every thread and process on this host wait in line for
    their turn on an OS lock (flock on `<database>-writers.lock`) before BEGIN
    IMMEDIATE, instead of in SQLite's busy handler.

    SQLite lets one writer in at a time; a writer that finds the lock taken sleeps
    and retries (1, 2, 5, 10 ... up to 100 ms per try), so under contention most of
    a write's latency was sleeping past the moment the lock came free (submits from
    8 clients: p99 ~240 ms, PYTHON-NOTES §1 calls the handler unfair). Here the
    threads of a process queue on a lock, and one of them at a time asks for the
    flock, again and again while another process holds it (see FLOCK_RETRY_SECS).
    Waiting is bounded like the busy handler's: after `lock_timeout`
    (BUSY_TIMEOUT_SECS) it fails with `database is locked` (the servers answer
    503). The lock is released at COMMIT or ROLLBACK; the kernel releases it when a process dies. When the lock file
    cannot be opened, writers fall back to the busy handler (logged once). Writes
    outside atomic() (autocommit) always go through the busy handler.
    """

    def __init__(self, database, *args, **kwargs):
        super().__init__(database, *args, **kwargs)
        self._writers_path = f"{database}-writers.lock"
        self._in_process = threading.Lock()  # threads of one process: flock is per open file
        self._fd: int | None = None
        self._fd_pid: int | None = None
        self._no_lock_file = False
        self._holding = threading.local()
        self.lock_timeout = BUSY_TIMEOUT_SECS

    def _lock_fd(self) -> int | None:
        if self._fd_pid != os.getpid():  # first use, or opened again in a forked child
            self._fd, self._fd_pid, self._no_lock_file = None, os.getpid(), False
        if self._fd is None and not self._no_lock_file:
            try:
                self._fd = os.open(self._writers_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                self._no_lock_file = True
                log.warning("cannot open %s (%s): writers wait in SQLite's busy handler instead",
                            self._writers_path, exc)
        return self._fd

    def begin(self, lock_type=None):
        started = time.monotonic()
        deadline = started + self.lock_timeout
        if not self._in_process.acquire(timeout=self.lock_timeout):
            raise peewee.OperationalError(f"database is locked (no turn to write in {self.lock_timeout:g} s)")
        try:
            fd = self._lock_fd()
            delay = FLOCK_RETRY_SECS[0]
            while fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    now = time.monotonic()
                    if now >= deadline:
                        raise peewee.OperationalError(
                            f"database is locked (another process wrote for over {self.lock_timeout:g} s)") from None
                    time.sleep(delay)
                    delay = flock_retry_delay(delay, now - started)
            self._holding.fd = fd
        except BaseException:
            self._in_process.release()
            raise
        try:
            super().begin(lock_type)
        except BaseException:
            self._release()
            raise

    def commit(self):
        try:
            super().commit()
        finally:
            self._release()

    def rollback(self):
        try:
            super().rollback()
        finally:
            self._release()

    def _release(self) -> None:
        if not hasattr(self._holding, "fd"):
            return
        fd = self._holding.fd
        del self._holding.fd
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._in_process.release()


def close_idle(db: peewee.Database) -> None:
    """Close this thread's connection and every pooled one. Call before forking:
    a SQLite connection must never be used, or closed, by a forked child."""
    if not db.is_closed():
        db.close()
    if hasattr(db, "close_all"):
        db.close_all()


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
