"""What the open event streams of one server process share: a budget and a watcher.

Their budget (StreamBudget), and the one watcher (StreamHub) that tells the streams
(`GET /events`, event_stream.py) when to read, so that N idle streams cost no query and
no wake-up.
"""
from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable

import peewee

from corral.server.changefeed import ChangeFeed
from corral.server.process_thread import ProcessThread

from .event_log import EventLog, Recent
from .events import Cursor, Filter

log = logging.getLogger(__name__)

# PostgreSQL: the hub looks at least this often while streams are open (its feed
# announces only placements; other commits are found by looking).
LOOK_SECS = 0.5
# The hub looks at most this often: a burst of commits is one look (and one read per stream).
MIN_GAP_SECS = 0.1
# While the hub's query fails it tries again after this long (the streams keep sleeping).
ERROR_BACKOFF_SECS = 1.0
# Without any change the hub's thread wakes this often anyway (a feed that missed a
# change, which no feed should).
IDLE_LOOK_SECS = 30.0

# SQLite: the newest events the hub keeps for the streams to share (a stream further
# behind reads for itself).
RING_EVENTS = 2000

# Why a stream was refused (StreamBudget.take).
PROCESS_FULL = "process"
CREDENTIAL_FULL = "credential"


def default_max_streams(threads: int) -> int:
    """EVENTS_STREAMS_MAX when unset: an eighth of the worker's threads (16 of 128)."""
    return threads // 8


class StreamBudget:
    """Open streams per process and per credential (pure counting, thread-safe). Each
    open stream holds a request thread, so a process holds at most EVENTS_STREAMS_MAX
    (default: an eighth of its threads), and one credential (the token's role, or the
    client's address without tokens) at most EVENTS_STREAMS_PER_CREDENTIAL of those. A
    stream beyond either cap is refused before it begins (503 for the process, 429 for
    the credential). Waiting claims have a budget of their own (longpoll.WaitRoom),
    whose default leaves room for this one (longpoll.default_max_waiters)."""

    def __init__(self, max_streams: int, per_credential: int):
        self.max_streams = max_streams
        self.per_credential = per_credential
        self._lock = threading.Lock()
        self._by_credential: dict[str, int] = {}
        self.open = 0

    def take(self, credential: str) -> str | None:
        """A place for a stream of `credential`: None when granted, else why not
        (PROCESS_FULL, CREDENTIAL_FULL)."""
        with self._lock:
            if self.open >= self.max_streams:
                return PROCESS_FULL
            held = self._by_credential.get(credential, 0)
            if held >= self.per_credential:
                return CREDENTIAL_FULL
            self._by_credential[credential] = held + 1
            self.open += 1
            return None

    def give_back(self, credential: str) -> None:
        with self._lock:
            held = self._by_credential.get(credential, 0) - 1
            if held > 0:
                self._by_credential[credential] = held
            else:
                self._by_credential.pop(credential, None)
            self.open = max(0, self.open - 1)


def behind(cursor: Cursor, mark: int | None) -> bool:
    """Whether a stream at `cursor` may have events to read, given the hub's mark (None:
    not known yet). SQLite: an event newer than the cursor was committed. PostgreSQL:
    a window is being read, or transactions past the cursor's window have ended."""
    if mark is None:
        return True
    if cursor.windowed:
        return not cursor.window_done or cursor.hi < mark
    return cursor.id < mark


class StreamHub:
    """An open stream sleeps here, holding no database connection, and reads only when
    the hub says an event it has not read may have been committed. The hub's one thread
    waits on the process's change feed (control-plane/server/changefeed.py) and, on a
    change, runs one small query for every stream: the newest position committed
    (SQLite: the newest event id; PostgreSQL: the transaction horizon, events.Cursor).
    Only when it moved are the streams woken, and only a stream behind it reads; a
    commit that writes no event costs one query per process. PostgreSQL's feed
    announces only placements, so there the hub also looks every LOOK_SECS while
    streams are open. It runs only while at least one stream is open."""

    def __init__(self, log_: EventLog, db: peewee.Database, feed: ChangeFeed,
                 clock: Callable[[], float] = time.monotonic):
        self.log = log_
        self.db = db
        self.feed = feed
        self._clock = clock
        self._cond = threading.Condition()
        self._thread = ProcessThread("corral-event-streams", self._run, self._after_fork)
        self.mark: int | None = None
        self.generation = 0   # grows when the mark moves
        self.streams = 0      # open streams using the hub
        self.looks = 0        # the hub's queries
        self.stopped = False
        # SQLite: the events with ids in (_ring_from, mark], read once for every stream.
        self._ring_from: int | None = None
        self._ring_ids: list[int] = []
        self._ring: list[Recent] = []

    def join(self) -> None:
        """A stream opens: the hub runs (its thread starts in this process if it has not)."""
        self.feed.ensure_started()
        with self._cond:
            self.streams += 1
            self._cond.notify_all()
        self._thread.ensure_started()

    def leave(self) -> None:
        with self._cond:
            self.streams = max(0, self.streams - 1)

    def wait(self, seen: int, timeout: float) -> int:
        """Sleep until the mark moved since generation `seen` (or `timeout`); the generation."""
        with self._cond:
            self._cond.wait_for(lambda: self.generation != seen or self.stopped, max(0.0, timeout))
            return self.generation

    def stop(self) -> None:
        """The worker is stopping: every stream wakes (and ends), the thread ends."""
        with self._cond:
            self.stopped = True
            self._cond.notify_all()

    def _after_fork(self) -> None:
        self._cond = threading.Condition()

    def _run(self) -> None:
        seen = self.feed.generation
        last_look = float("-inf")  # the first stream's hub looks at once: its mark is not known
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self.streams > 0 or self.stopped)
                if self.stopped:
                    return
            # Every change is looked at, and only changes, except where the feed
            # announces placements only (PostgreSQL): there every LOOK_SECS too. A
            # change while no stream was open is seen at once when one opens.
            interval = LOOK_SECS if self.log.windowed else IDLE_LOOK_SECS
            if last_look > float("-inf"):
                seen = self.feed.wait_for_change(seen, max(0.0, last_look + interval - self._clock()))
            else:
                seen = self.feed.generation
            gap = last_look + MIN_GAP_SECS - self._clock()
            if gap > 0:
                time.sleep(gap)  # let a burst of commits land: one look for all of them
            last_look = self._clock()
            try:
                self.look()
            except Exception:  # the thread must outlive a database outage
                log.warning("the event streams' watcher failed to look for new events; trying again in %.0fs",
                            ERROR_BACKOFF_SECS, exc_info=True)
                time.sleep(ERROR_BACKOFF_SECS)

    def look(self) -> None:
        """One query for every open stream: the newest position committed; when it
        moved (SQLite), one more for the new events, kept for the streams to share;
        then wake the streams."""
        self.looks += 1
        with self.db.connection_context():
            mark = self.log.mark()
            fresh = None
            if not self.log.windowed and self.mark is not None and mark > self.mark:
                fresh = self.log.recent(self.mark, mark, RING_EVENTS)
        with self._cond:
            if mark == self.mark:
                return
            if fresh is None:  # the first look, too many at once, or PostgreSQL: the ring starts again
                self._ring_ids, self._ring = [], []
                self._ring_from = mark
            else:
                self._ring_ids.extend(event.id for event in fresh)
                self._ring.extend(fresh)
                extra = len(self._ring) - RING_EVENTS
                if extra > 0:
                    self._ring_from = self._ring_ids[extra - 1]
                    del self._ring_ids[:extra], self._ring[:extra]
            self.mark = mark
            self.generation += 1
            self._cond.notify_all()

    def take(self, cursor: Cursor, wanted: Filter) -> tuple[list[bytes], Cursor] | None:
        """What a stream at `cursor` sends next, from the events the hub read (no query),
        and its position after them; None when the hub does not hold every event after
        `cursor` (a stream resuming from further back, PostgreSQL): it reads them itself."""
        with self._cond:
            if cursor.windowed or self._ring_from is None or cursor.id < self._ring_from:
                return None
            start = bisect.bisect_right(self._ring_ids, cursor.id)
            chunks = [e.sse for e in self._ring[start:] if wanted.lets(e.type, e.job_row, e.node_id)]
            return chunks, Cursor(id=max(cursor.id, self.mark or 0))
