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

- `SqliteDataVersionFeed` (SQLite files, what runs today): a thread polls
  `PRAGMA data_version` every `interval` (5 ms) on a dedicated connection
  that never writes. The value changes whenever ANY other connection commits,
  including the request connections of this very process (the committing
  connection itself does not see its own change, which is why the watcher has
  a connection of its own). A commit in another worker is seen 2.5 ms later on
  average (50 ms, the first interval used, was half of the idle dispatch
  latency). Cost: 200 reads a second per process of a value SQLite keeps in
  memory (well under 1% of a core), whatever the number of waiters; after a
  change, the waiting room reads one row to learn whether anything was placed.
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
import sqlite3
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

DATA_VERSION_INTERVAL_SECS = 0.005
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
            self._stop.wait(delay)
        if conn is not None:
            conn.close()


_START_LOCK = threading.Lock()


def feed_for(database_url: str, sqlite_path: str | None) -> ChangeFeed:
    """The change feed for this database: data_version for a SQLite file, else the interval fallback."""
    if database_url.startswith("sqlite") and sqlite_path and sqlite_path != ":memory:":
        return SqliteDataVersionFeed(sqlite_path)
    return IntervalFeed()
