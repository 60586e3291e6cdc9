"""SQLite: the embedded default, one file per service on one host. Everything that is
SQLite's own lives here: the pooled database, WAL, every transaction `BEGIN
IMMEDIATE` and writers of the host queued on a flock (`QueuedWritersSqlite`), its
answers to the backend interface (`SqliteBackend`: one writer at a time), the
checks of the file at start (`check_file`: never a new, empty one in silence), and
the change feed of the long-poll claims (`DataVersionFeed` and `Doorbells`).
"""
from __future__ import annotations

import fcntl
import logging
import os
import socket
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager

import peewee
from playhouse.pool import PooledSqliteDatabase

from corral.server.audit_trail import AuditedCommits
from corral.server.changefeed import ERROR_BACKOFF_SECS, FALLBACK_INTERVAL_SECS, ChangeFeed, IntervalFeed
from corral.server.db_marker import Guard
from corral.shared.errors import SettingError

from .base import Backend, wait_for
from .sqlite_marker import SqliteGuard

log = logging.getLogger(__name__)

BUSY_TIMEOUT_SECS = 10
# Open SQLite connections one process keeps at most (CORRAL_DB_POOL_SIZE). Waiting
# long-poll claims give theirs back, so this bounds the requests that touch the
# database at once; a request beyond it waits up to BUSY_TIMEOUT_SECS for one
# (fairly, unlike SQLite's busy handler), then answers 503.
POOL_MAX_CONNECTIONS = 32
DATA_VERSION_INTERVAL_SECS = 0.05
# Below this much free space on the database's disk, writes answer 503 and
# /readyz says why: a write that fails half-way through a full disk is refused
# by SQLite anyway, this says so before and in words.
MIN_FREE_BYTES = 16 * 1024 * 1024


def open_sqlite(url: str, synchronous: str = "NORMAL", pool_size: int | None = None,
                pool_wait_secs: float = BUSY_TIMEOUT_SECS) -> peewee.Database:
    """Open a sqlite:// URL (its file checked first)."""
    path = sqlite_path(url)
    if path != ":memory:":
        check_file(path)
    pragmas = {
        "journal_mode": "wal",
        "synchronous": synchronous,
        "foreign_keys": 1,
        "cache_size": -16000,
        "busy_timeout": BUSY_TIMEOUT_SECS * 1000,
    }
    if path == ":memory:":  # every connection would be a database of its own
        db = MemorySqlite(":memory:", pragmas=pragmas, timeout=BUSY_TIMEOUT_SECS, lock_type="IMMEDIATE")
        return db
    # `timeout` is the pool's wait for a free connection; SQLite's busy timeout
    # is the pragma. A pooled connection serves one thread at a time, but not
    # always the thread that opened it.
    return QueuedWritersSqlite(path, max_connections=pool_size or POOL_MAX_CONNECTIONS, timeout=pool_wait_secs,
                               pragmas=pragmas, lock_type="IMMEDIATE", check_same_thread=False)


# How often a writer asks again for the flock another process holds: from 50 µs,
# doubling up to 200 µs, and once it has waited over 10 ms (a long transaction:
# a batch of 1,000, a purge) up to 2 ms. A write transaction is far shorter than a
# millisecond, so a writer that slept milliseconds left the lock idle most of that
# time (docs/dispatch.md, "Writers wait in line", has what each schedule gave).
FLOCK_RETRY_SECS = (0.00005, 0.0002)
FLOCK_LONG_WAIT_SECS, FLOCK_LONG_RETRY_SECS = 0.01, 0.002


def flock_retry_delay(delay: float, waited: float) -> float:
    """The pause before the next try for the writers' flock, after `delay` and `waited` in all."""
    cap = FLOCK_LONG_RETRY_SECS if waited > FLOCK_LONG_WAIT_SECS else FLOCK_RETRY_SECS[1]
    return min(delay * 2, cap)



class MemorySqlite(AuditedCommits, peewee.SqliteDatabase):
    """An in-memory database (tests, `sqlite:///:memory:`): one connection, audited commits."""

    reuses_ids = True

    @staticmethod
    def lost() -> str | None:
        return None  # nothing on disk to lose


class QueuedWritersSqlite(AuditedCommits, PooledSqliteDatabase):
    """Write transactions of every thread and process on this host wait in line for
    their turn on an OS lock (flock on `<database>-writers.lock`) before BEGIN
    IMMEDIATE, instead of in SQLite's busy handler.

    SQLite lets one writer in at a time; a writer that finds the lock taken sleeps
    and retries (1, 2, 5, 10 ... up to 100 ms per try), so under contention most of
    a write's latency was sleeping past the moment the lock came free, and the
    handler is unfair: a writer that just arrived may win over one that has waited
    long (docs/dispatch.md, "Writers wait in line", has the measurements). Here the
    threads of a process queue on a lock, and one of them at a time asks for the
    flock, again and again while another process holds it (see FLOCK_RETRY_SECS).
    Waiting is bounded like the busy handler's: after `lock_timeout`
    (BUSY_TIMEOUT_SECS) it fails with `database is locked` (the servers answer
    503). The lock is released at COMMIT or ROLLBACK; the kernel releases it when a process dies. When the lock file
    cannot be opened, writers fall back to the busy handler (logged once). Writes
    outside atomic() (autocommit) always go through the busy handler.

    Connections are pooled per process (a request takes one and gives it back at
    teardown): opening one per request cost more than the request's own queries (the
    pragmas, the schema parsed and the page cache empty on every new connection).
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
        # An open descriptor of the file pins its inode: a file deleted under us keeps
        # it (with no link left), and a new file at the path cannot reuse its number.
        self._pin = _pin(database)

    # Without AUTOINCREMENT a deleted newest row's id is handed out again (max(id) + 1).
    reuses_ids = True

    def lost(self) -> str | None:
        """Why this database can no longer keep what it is given, or None: its file was
        deleted or replaced under the running server (writes would go to an inode
        nobody will open again), or its disk is (nearly) full."""
        gone = self._file_gone()
        if gone:
            return gone
        try:
            stats = os.statvfs(os.path.dirname(os.path.abspath(self.database)))
        except OSError as exc:
            return f"cannot check the disk of {self.database}: {exc}"
        free = stats.f_bavail * stats.f_frsize
        if free < MIN_FREE_BYTES:
            return f"the disk holding {self.database} is full ({free} bytes free)"
        return None

    def _file_gone(self) -> str | None:
        """Why the file at the path is not the one this server opened, or None."""
        if self._pin is None:  # the file did not exist yet when opened: the first look pins it
            self._pin = _pin(self.database)
        if self._pin is not None:
            ours = os.fstat(self._pin)
            try:
                there = os.stat(self.database)
            except FileNotFoundError:
                return f"the database file {self.database} was deleted"
            if ours.st_nlink == 0 or (there.st_dev, there.st_ino) != (ours.st_dev, ours.st_ino):
                return f"the database file {self.database} was deleted or replaced by another file"
        return None

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

    def _connect(self):
        # Never open a new connection on a file that is not the one this server opened:
        # sqlite3 would create an empty database at the path (and keep it in the pool).
        gone = self._file_gone()
        if gone:
            raise peewee.OperationalError(gone)
        if self._pin is None and not _may_create:
            # Nothing pinned: the file is missing (moved away while this worker booted).
            raise peewee.OperationalError(f"the database file {self.database} does not exist")
        return super()._connect()

    def begin(self, lock_type=None):
        gone = self.lost()
        if gone:
            raise peewee.OperationalError(gone)
        # The pooled connection first, the writers' lock second: a thread holding the lock
        # while it waits for a connection, with every connection held by threads waiting
        # for the lock, stalls them all until the pool's wait runs out.
        self.connection()
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


# Whether this process may create a database file by opening it: not a server's
# worker, whose master made the database (and migrated it) before forking it.
_may_create = True


def never_create() -> None:
    """From now on this process opens only database files that exist (a worker)."""
    global _may_create
    _may_create = False


def _pin(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def sqlite_path(url: str) -> str:
    """The file of a sqlite:// URL (or ':memory:')."""
    # sqlite:///relative.db, sqlite:////absolute.db, sqlite:///:memory:
    path = url.split("://", 1)[1]
    path = path[1:] if path.startswith("/") else path
    return path or ":memory:"


def check_file(path: str) -> None:
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



class DataVersionFeed(ChangeFeed):
    """Watches `PRAGMA data_version` of one SQLite file from a never-writing connection.

    The value changes whenever any other connection commits, this process's request
    connections included (a connection does not see its own commits: hence one of its
    own). It looks every `interval`, and at once when its doorbell rings (`Doorbells`:
    a process that placed jobs rings every other after its commit), so a job placed by
    one worker for a claim waiting in another is seen within a millisecond while an
    idle process wakes rarely: polling more often cost an idle scheduler much of its
    CPU, its wake-ups fighting the request threads for the GIL (docs/dispatch.md)."""

    name = "sqlite-watcher"

    def __init__(self, path: str, interval: float = DATA_VERSION_INTERVAL_SECS):
        super().__init__(interval)
        self.path = path
        self.doorbells = Doorbells(f"{path}-wake")

    def ring(self, nodes: Collection[str] | None = None) -> None:
        self.doorbells.ring()  # a byte only: the other processes' watchers look at data_version

    def _connect(self) -> sqlite3.Connection:
        # Autocommit (isolation_level=None): PRAGMA data_version opens no lasting
        # read transaction, so the watcher never holds back a WAL checkpoint.
        # mode=rw: a file that is away is waited for, never created again (empty) at its path.
        conn = sqlite3.connect(f"file:{urllib.parse.quote(self.path)}?mode=rw", uri=True, timeout=5,
                               isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA query_only = 1")
        return conn

    def _run(self) -> None:
        conn = None
        last = None
        failing = False
        bell = self.doorbells.open_own()
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = self._connect()
                    last = None
                version = conn.execute("PRAGMA data_version").fetchone()[0]
                if failing:
                    log.info("watching %s for changes again", self.path)
                    failing = False
                if version != last:
                    # Also on the first read: a commit may have landed between a waiter's
                    # own check and this thread's start, and a spurious wake costs one check.
                    self.changed()
                    last = version
                delay = self.interval
            except sqlite3.Error as exc:
                if not failing:
                    log.warning("cannot watch %s for changes (%s); waking waiters every %.0fs instead",
                                self.path, exc, ERROR_BACKOFF_SECS)
                    failing = True
                if conn is not None:
                    try:
                        conn.close()
                    except sqlite3.Error:
                        pass
                    conn = None
                self.changed()  # something may have changed: let waiters look
                delay = ERROR_BACKOFF_SECS
            if bell is None or failing:
                self._stop.wait(delay)
            else:
                self.doorbells.wait(bell, delay)
        if conn is not None:
            conn.close()
        self.doorbells.close_own(bell)



class Doorbells:
    """One unix datagram socket per process in a directory (`<pid>.sock`): `ring()`
    sends a byte to every other one, `wait()` blocks on this process's own until it
    rings or a timeout. Best effort: a failure costs a wake-up delay of at most the
    watcher's interval, never an error. Sockets of processes that are gone
    (connection refused) are removed by the next ring."""

    def __init__(self, directory: str):
        self.directory = directory
        self._own_path: str | None = None
        self._sender: socket.socket | None = None
        self._sender_pid: int | None = None

    def open_own(self) -> socket.socket | None:
        """Bind this process's doorbell (on the watcher's thread); None when it cannot."""
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            path = os.path.join(self.directory, f"{os.getpid()}.sock")
            if os.path.exists(path):  # a dead process with our pid left it
                os.unlink(path)
            bell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            bell.bind(path)
            self._own_path = path
            return bell
        except OSError as exc:
            log.warning("no doorbell in %s (%s): other workers' work is noticed within %.0f ms instead",
                        self.directory, exc, DATA_VERSION_INTERVAL_SECS * 1000)
            return None

    def close_own(self, bell: socket.socket | None) -> None:
        if bell is None:
            return
        bell.close()
        if self._own_path:
            try:
                os.unlink(self._own_path)
            except OSError:
                pass

    @staticmethod
    def wait(bell: socket.socket, timeout: float) -> None:
        """Until the doorbell rings (its queued rings are drained) or `timeout`."""
        try:
            bell.settimeout(timeout)
            bell.recv(64)
            bell.setblocking(False)  # (a socket with a timeout waits even with MSG_DONTWAIT)
            while True:
                bell.recv(64)
        except OSError:  # the timeout, or nothing more queued
            return

    def ring(self) -> None:
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        own = f"{os.getpid()}.sock"
        for name in names:
            if name == own or not name.endswith(".sock"):
                continue
            path = os.path.join(self.directory, name)
            try:
                self._socket().sendto(b"!", socket.MSG_DONTWAIT, path)
            except ConnectionRefusedError:  # nobody listens: its process is gone
                try:
                    os.unlink(path)
                except OSError:
                    pass
            except OSError:  # full (it will look anyway), vanished, ...
                pass

    def _socket(self) -> socket.socket:
        if self._sender is None or self._sender_pid != os.getpid():
            self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sender_pid = os.getpid()
        return self._sender



def change_feed(db: peewee.Database) -> ChangeFeed:
    """The change feed of this database: data_version and doorbells for a file, the
    interval fallback for an in-memory database."""
    path = getattr(db, "database", ":memory:")
    if isinstance(db, QueuedWritersSqlite):
        return DataVersionFeed(path)
    return IntervalFeed(FALLBACK_INTERVAL_SECS)


def _is_file(db: peewee.Database) -> bool:
    return isinstance(db, peewee.SqliteDatabase) and db.database not in ("", ":memory:")


class SqliteBackend(Backend):
    """SQLite, a file or in memory: the interface's defaults (one writer at a time),
    and what a file has that outlives the process."""

    name = "sqlite"

    def change_feed(self, db: peewee.Database, service: str, poll_only: bool) -> ChangeFeed:
        return change_feed(db)

    @contextmanager
    def migration_lock(self, db: peewee.Database, key: int,
                       before_connect: Callable[[], None] | None = None) -> Iterator[None]:
        """An exclusive flock on `<database>-migrate.lock`, before the connection:
        opening one sets the file's journal mode (WAL), which a process must not do
        while another is migrating it (and opening a missing file creates it)."""
        if not _is_file(db):
            with super().migration_lock(db, key, before_connect):
                yield
            return
        with _file_lock(f"{db.database}-migrate.lock"):
            if before_connect:
                before_connect()
            with db.connection_context():
                yield

    def marker_guard(self, db: peewee.Database, service: str, history_table: str, init: bool) -> Guard | None:
        return SqliteGuard(db, service, history_table, init) if _is_file(db) else None


SQLITE = SqliteBackend()


@contextmanager
def _file_lock(path: str) -> Iterator[None]:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise SettingError(f"cannot open the migration lock file {path}: {exc.strerror or exc}") from None
    try:
        def take() -> bool:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False

        wait_for(take, f"the migration lock ({path})")
        yield
    finally:
        os.close(fd)  # releases the flock
