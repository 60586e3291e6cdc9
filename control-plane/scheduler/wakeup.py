"""Change feeds: telling a process's waiting claims that the database may have changed.

A long-poll claim (longpoll.py) must not query the database on every tick while
it waits. Instead each server process has ONE change feed, and waiters sleep
until the feed says "something was committed" (or until a local commit pokes
their node directly, see longpoll.WaitRoom.poke).

The interface is `ChangeFeed`:

- `generation` grows by at least one after every change the feed noticed;
- `add_listener(fn)` calls `fn()` (on the feed's thread) after each change;
- `wait_for_change(seen, timeout)` blocks until `generation != seen`;
- `ensure_started()` starts the feed's thread in this process. It is called
  lazily, by the first waiter, and is guarded by `os.getpid()`: a feed created
  before gunicorn forked starts a thread of its own in every worker.

Implementations:

- `SqliteDataVersionFeed` (SQLite files, what runs today): a thread watches
  `PRAGMA data_version` on a dedicated connection that never writes. The value
  changes whenever ANY other connection commits, including the request
  connections of this very process (the committing connection itself does not
  see its own change, which is why the watcher has a connection of its own).
  It looks every `interval` (50 ms), and at once when its doorbell rings: a
  unix datagram socket per process in `<database>-wake/`, which a process that
  placed jobs rings for every other process after its commit (`ring()`). So a
  job placed by one worker for a claim waiting in another is seen within a
  millisecond, while an idle process wakes only 20 times a second. (Polling
  every 5 ms also gave quick wake-ups, but its 200 wake-ups a second per
  process, fighting hundreds of request threads for the GIL, were a fifth of
  an idle scheduler's CPU with 500 agents.)
- `IntervalFeed` (every other database URL, for now): no change detection;
  the generation simply grows every `interval` (0.5 s), so waiters re-check
  twice a second. Correct, slower to wake, and one grouped query per process
  per interval (not one per waiter).

The seam for PostgreSQL is a third implementation of the same interface,
`LISTEN`/`NOTIFY`, not written yet: `Store.dispatch` would run
`SELECT pg_notify('corral_jobs', <node ids>)` in its transaction (delivered
at commit), and the feed's thread would hold `psycopg.connect(dsn,
autocommit=True)`, `LISTEN corral_jobs`, and bump the generation for every
notification from `conn.notifies(timeout=5)`, plus once per timeout, because
notifications sent while the listener reconnects are lost (PYTHON-NOTES §2).
`feed_for()` is the one place that picks the implementation.
"""
from __future__ import annotations

import logging
import os
import socket
import sqlite3
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

DATA_VERSION_INTERVAL_SECS = 0.05
FALLBACK_INTERVAL_SECS = 0.5
# While the watcher's connection fails, waiters are woken this often (degraded to polling).
ERROR_BACKOFF_SECS = 1.0


class ChangeFeed:
    """Base class: a generation counter, a condition, listeners, a lazily started thread."""

    name = "change feed"

    def __init__(self, interval: float):
        self.interval = interval
        self._pid: int | None = None
        self._cond = threading.Condition()
        self._generation = 0
        self._listeners: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def generation(self) -> int:
        return self._generation

    def add_listener(self, fn: Callable[[], None]) -> None:
        self._listeners.append(fn)

    def ensure_started(self) -> None:
        """Start the feed's thread in this process (once; again after a fork)."""
        pid = os.getpid()
        if self._pid == pid:
            return
        with _START_LOCK:
            if self._pid == pid:
                return
            if self._pid is not None:
                # Inherited through a fork: the parent's thread and locks are not ours.
                self._cond = threading.Condition()
                self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, name=f"corral-{self.name}", daemon=True)
            self._thread.start()
            self._pid = pid

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive() and self._pid == os.getpid():
            self._thread.join(timeout)

    def changed(self) -> None:
        """Bump the generation and wake everyone: the database may have changed."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
        for fn in list(self._listeners):
            try:
                fn()
            except Exception:
                log.exception("a %s listener failed", self.name)

    def wait_for_change(self, seen: int, timeout: float) -> int:
        """Block until the generation differs from `seen` (or `timeout`); the generation."""
        self.ensure_started()
        with self._cond:
            self._cond.wait_for(lambda: self._generation != seen, timeout)
            return self._generation

    def _run(self) -> None:
        raise NotImplementedError

    def ring(self) -> None:
        """This process committed work other processes' waiters may want: tell them now
        (a feed that cannot, does nothing; they notice at their next look)."""


class IntervalFeed(ChangeFeed):
    """No change detection: 'maybe changed' every `interval` seconds (the fallback)."""

    name = "interval-feed"

    def __init__(self, interval: float = FALLBACK_INTERVAL_SECS):
        super().__init__(interval)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.changed()


class SqliteDataVersionFeed(ChangeFeed):
    """Watches `PRAGMA data_version` of one SQLite file from a never-writing connection."""

    name = "sqlite-watcher"

    def __init__(self, path: str, interval: float = DATA_VERSION_INTERVAL_SECS):
        super().__init__(interval)
        self.path = path
        self.doorbells = Doorbells(f"{path}-wake")

    def ring(self) -> None:
        self.doorbells.ring()

    def _connect(self) -> sqlite3.Connection:
        # Autocommit (isolation_level=None): PRAGMA data_version opens no lasting
        # read transaction, so the watcher never holds back a WAL checkpoint.
        conn = sqlite3.connect(self.path, timeout=5, isolation_level=None, check_same_thread=False)
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


_START_LOCK = threading.Lock()


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


def feed_for(database_url: str, sqlite_path: str | None) -> ChangeFeed:
    """The change feed for this database: data_version for a SQLite file, else the interval fallback."""
    if database_url.startswith("sqlite") and sqlite_path and sqlite_path != ":memory:":
        return SqliteDataVersionFeed(sqlite_path)
    return IntervalFeed()
