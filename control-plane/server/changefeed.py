"""Change feeds: how a server process's waiting claims (scheduler/longpoll.py) hear
that the database may have changed, without querying it while they wait.

Each process has one `ChangeFeed`: its `generation` grows after every change it
noticed, listeners are called on its thread, and `ring` tells other processes of a
commit. Each backend has its own (backends/): SQLite watches `PRAGMA data_version`
and rings doorbell sockets between the processes of its host; PostgreSQL LISTENs
and NOTIFYs. `IntervalFeed`, a look every interval, is the fallback.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection

from corral.server.process_thread import ProcessThread

log = logging.getLogger(__name__)

FALLBACK_INTERVAL_SECS = 0.5
# While a feed's connection fails, waiters are woken this often (degraded to polling).
ERROR_BACKOFF_SECS = 1.0


class ChangeFeed:
    """Base class: a generation counter, a condition, listeners, a lazily started thread."""

    name = "change feed"

    def __init__(self, interval: float):
        self.interval = interval
        self._cond = threading.Condition()
        self._generation = 0
        self._listeners: list[Callable[[bool, set[str] | None], None]] = []
        self._stop = threading.Event()
        self._thread = ProcessThread(f"corral-{self.name}", self._run, self._after_fork)

    @property
    def generation(self) -> int:
        return self._generation

    def add_listener(self, fn: Callable[[bool, set[str] | None], None]) -> None:
        """Call `fn(recheck, nodes)` on the feed's thread after each change. `recheck`:
        the feed noticed nothing and only looks in case a notice was lost (PostgreSQL's
        periodic re-check), so a listener may first ask whether anything changed;
        `nodes`: the nodes the change placed work on when the notice said, else None."""
        self._listeners.append(fn)

    def ensure_started(self) -> None:
        """Start the feed's thread in this process (once; again after a fork: a feed made
        before gunicorn forked gets a thread in every worker). The first waiter calls it."""
        self._thread.ensure_started()

    def _after_fork(self) -> None:
        self._cond = threading.Condition()
        self._stop = threading.Event()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def changed(self, recheck: bool = False, nodes: set[str] | None = None) -> None:
        """Bump the generation and wake everyone: the database may have changed
        (`recheck`: nothing was noticed, this is only a look in case a notice was lost;
        `nodes`: the change placed work on these nodes, and did nothing else a waiter
        may want)."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
        for fn in list(self._listeners):
            try:
                fn(recheck, nodes)
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

    def ring(self, nodes: Collection[str] | None = None) -> None:
        """This process committed work other processes' waiters may want, placed on
        `nodes` (None: not said): tell them now (a feed that cannot, does nothing; they
        notice at their next look)."""


class IntervalFeed(ChangeFeed):
    """No change detection: 'maybe changed' every `interval` seconds (the fallback)."""

    name = "interval-feed"

    def __init__(self, interval: float = FALLBACK_INTERVAL_SECS):
        super().__init__(interval)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.changed()
