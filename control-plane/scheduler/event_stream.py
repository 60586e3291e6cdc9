"""`GET /events`: one client's Server-Sent Events stream, written by a request thread.

The thread holds no database connection while it waits, reads only when the process's
stream hub (stream_hub.py) says it may be behind, and ends after
EVENTS_STREAM_MAX_SECS. docs/api.md ("The event stream") says what a client gets.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import peewee

from corral.server.db import MaxConnectionsExceeded

from . import metrics
from .event_log import EventLog
from .events import Cursor, Filter, frame, keep_alive
from .stream_hub import StreamHub, behind

log = logging.getLogger(__name__)

# A stream reads at most this often: a burst of commits is one read.
MIN_GAP_SECS = 0.1
PAGE = 500
# Tells an EventSource-like client how soon to reconnect (ms).
RETRY_MS = 2000


@dataclass(frozen=True)
class Timing:
    keepalive_secs: float
    max_secs: float
    retention_secs: float


def start(log_: EventLog, last_event_id: str | None) -> tuple[Cursor, list[bytes]]:
    """Where a stream starts and what it sends first (a `missed` event when events
    after the client's position were deleted). Runs on the request, so that a bad
    Last-Event-ID is a 400 before the stream begins (events.BadCursor)."""
    if last_event_id is None or not last_event_id.strip():
        cursor = log_.now()
        return cursor, [frame("open", {"resumed": False}, cursor)]
    cursor = log_.parse(last_event_id)
    first: list[bytes] = []
    if cursor.missed_after(log_.pruned()):
        oldest = log_.oldest()
        resume = oldest if oldest is not None and oldest > cursor else cursor
        first.append(frame("missed", {
            "last_event_id": last_event_id.strip(), "resumed_from": str(resume),
            "reason": "events after this Last-Event-ID are older than EVENTS_RETENTION_SECS and were deleted; "
                      "the stream goes on from the oldest event kept"}, resume))
        cursor = resume
    first.append(frame("open", {"resumed": True}, cursor))
    return cursor, first


class Body:
    """A WSGI answer's body that runs `on_end` once when the server closes it, even if
    it never began to iterate (a generator's `finally` would not run then)."""

    def __init__(self, chunks: Iterator[bytes], on_end: Callable[[], None]):
        self._chunks = chunks
        self._on_end: Callable[[], None] | None = on_end

    def __iter__(self) -> Iterator[bytes]:
        return self._chunks

    def close(self) -> None:
        try:
            close = getattr(self._chunks, "close", None)
            if close is not None:
                close()
        finally:
            on_end, self._on_end = self._on_end, None
            if on_end is not None:
                on_end()


def stream(log_: EventLog, db: peewee.Database, hub: StreamHub, cursor: Cursor, wanted: Filter,
           first: list[bytes], timing: Timing, closed: Callable[[], bool],
           on_end: Callable[[], None]) -> Body:
    """The stream's body: the `open` event (after the client's Last-Event-ID, or now;
    a `missed` event before it when the retention deleted events the client had not
    seen), then each stored event the filter lets through (event_log.py), read when the
    hub says so and not more often than every MIN_GAP_SECS (a busy cluster costs each
    stream a few queries a second, not one per commit). An idle stream gets a keep-alive
    every EVENTS_KEEPALIVE_SECS (no query). It ends after EVENTS_STREAM_MAX_SECS (the
    client reconnects, so a worker being replaced is never pinned), when the worker
    stops, or when a write fails. `on_end` runs once, however it ends."""
    return Body(_chunks(log_, db, hub, cursor, wanted, first, timing, closed), on_end)


def _chunks(log_: EventLog, db: peewee.Database, hub: StreamHub, cursor: Cursor, wanted: Filter,
            first: list[bytes], timing: Timing, closed: Callable[[], bool]) -> Iterator[bytes]:
    yield f"retry: {RETRY_MS}\n\n".encode()
    yield from first
    hub.join()
    try:
        yield from _follow(log_, db, hub, cursor, wanted, timing, closed)
    finally:
        hub.leave()


def _follow(log_: EventLog, db: peewee.Database, hub: StreamHub, cursor: Cursor, wanted: Filter,
            timing: Timing, closed: Callable[[], bool]) -> Iterator[bytes]:
    began = last_write = time.monotonic()
    last_read = float("-inf")
    full = True  # the first read is unconditional: the hub's mark may not have caught up yet
    while not closed():
        seen = hub.generation  # before reading: a mark that moves during the read wakes the wait below
        shared = None if full else hub.take(cursor, wanted)
        if shared is not None:  # the hub read them for every stream: no query
            chunks, cursor = shared
            if chunks:
                yield b"".join(chunks)
                last_write = time.monotonic()
        elif full or behind(cursor, hub.mark):
            gap = last_read + MIN_GAP_SECS - time.monotonic()
            if gap > 0 and not full:
                time.sleep(gap)  # let a burst of commits land: one read for all of them
            try:
                with db.connection_context():
                    page = log_.read(cursor, wanted, PAGE)
            except (peewee.DatabaseError, MaxConnectionsExceeded) as exc:
                # The stream ends; the client resumes from its last event once the database is back.
                log.warning("an event stream stopped: reading events failed: %s", exc)
                return
            last_read = time.monotonic()
            metrics.event_stream_read()
            cursor, full = page.cursor, page.full
            if page.events:
                yield b"".join(event.sse() for event in page.events)
                last_write = time.monotonic()
            if full:
                continue
        now = time.monotonic()
        if now - began >= timing.max_secs:
            yield frame("end", {"reason": "EVENTS_STREAM_MAX_SECS reached; reconnect with Last-Event-ID"},
                        cursor)
            return
        if now - last_write >= timing.keepalive_secs:
            yield keep_alive(cursor)  # the stream's position, with no query
            last_write = now
        hub.wait(seen, min(last_write + timing.keepalive_secs - now, began + timing.max_secs - now))
