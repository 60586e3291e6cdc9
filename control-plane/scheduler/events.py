"""The event stream's pure parts: positions, node changes, Server-Sent Events' bytes.

Positions in it (Cursor), what a node change is, and the bytes of `GET /events`
(event_stream.py; the rows: event_log.py).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from corral.shared import wire

TYPES = wire.EVENT_TYPES
# The stream's own events: where it starts, what it missed, and that it ends.
STREAM_TYPES = ("open", "missed", "end")
# Node changes, from one node list to the next (the node refresh).
NODE_CHANGES = ("registered", "healthy", "unhealthy", "drained", "undrained", "deregistered")


class BadCursor(ValueError):
    """A Last-Event-ID that is not a position of this scheduler's stream."""


@dataclass(frozen=True, order=True)
class Cursor:
    """A position in the table `stream_event`: the id a client resumes with
    (`Last-Event-ID`). SQLite: `id` only, since it commits one writer at a time and row
    ids are in commit order ("1234").

    PostgreSQL draws ids before the commit, so a smaller id can commit after a larger
    one a reader already passed. Each row keeps its writing transaction's id (`tx`),
    and a reader takes rows in windows of transaction ids [lo, hi), `hi` being the
    oldest transaction of the database still open when the window opened: every
    one of its transactions below it has ended, so the window's rows are final, and a later writer
    has an id of `hi` or more. Within a window rows go by id. The position is
    "lo.hi.id"; a window read to its end is "hi.hi.0". Nothing committed is skipped
    or sent twice; a transaction left open holds the windows back, which is why Corral
    keeps its transactions short."""

    lo: int = 0
    hi: int = 0
    id: int = 0
    windowed: bool = False  # PostgreSQL's form

    def __str__(self) -> str:
        return f"{self.lo}.{self.hi}.{self.id}" if self.windowed else str(self.id)

    @property
    def window_done(self) -> bool:
        return self.lo == self.hi

    @classmethod
    def parse(cls, text: str, windowed: bool) -> "Cursor":
        parts = text.strip().split(".")
        if len(parts) != (3 if windowed else 1) or not all(p.isascii() and p.isdigit() and len(p) <= 19
                                                           for p in parts):
            raise BadCursor(f"Last-Event-ID {text[:60]!r} is not an event id of this scheduler's stream")
        numbers = [int(p) for p in parts]
        if windowed:
            lo, hi, row = numbers
            if lo > hi:
                raise BadCursor(f"Last-Event-ID {text[:60]!r} is not an event id of this scheduler's stream")
            return cls(lo, hi, row, True)
        return cls(id=numbers[0])

    def missed_after(self, pruned: "Cursor | None") -> bool:
        """Whether rows this position had not reached may have been deleted by the
        retention, given where the newest deleted row was (`pruned`: its id, and on
        PostgreSQL its transaction as `lo`)."""
        if pruned is None:
            return False
        if self.windowed:
            # Read so far: every transaction below `hi` when the window is done, else
            # below `lo` (and part of the window). A deleted row of a transaction at or
            # past that may not have been read (its id is not kept: say so, to be safe).
            return pruned.lo >= (self.hi if self.window_done else self.lo)
        return pruned.id > self.id


@dataclass(frozen=True)
class Filter:
    """Which events a stream wants: None means any."""

    job_row: int | None = None
    node_id: str | None = None
    types: frozenset[str] | None = None

    def lets(self, event_type: str, job_row: int | None, node_id: str | None) -> bool:
        """Whether an event of this type, job (row id) and node passes (what
        event_log's query asks of the rows, for events already read)."""
        return ((self.job_row is None or job_row == self.job_row)
                and (self.node_id is None or node_id == self.node_id)
                and (self.types is None or event_type in self.types))


@dataclass(frozen=True)
class Event:
    """One event as sent: its position, type and body."""

    cursor: Cursor
    type: str
    data: Mapping

    def sse(self) -> bytes:
        return frame(self.type, self.data, self.cursor)


def frame(event_type: str, data: Mapping, cursor: Cursor | None) -> bytes:
    """One SSE event: `id` (when there is one), `event`, and `data` on one line of JSON."""
    head = f"id: {cursor}\n" if cursor is not None else ""
    body = json.dumps(data, separators=(",", ":"), sort_keys=True)
    return f"{head}event: {event_type}\ndata: {body}\n\n".encode()


def keep_alive(cursor: Cursor) -> bytes:
    """A comment that keeps an idle connection open, carrying the stream's position
    (an `id` with no data moves a client's Last-Event-ID without an event), so that a
    filtered stream does not resume from far behind what it already looked at."""
    return f"id: {cursor}\n: keep-alive\n\n".encode()


NodeState = tuple[str, bool]  # (status as placement sees it, drained)


def node_changes(before: Mapping[str, NodeState], after: Mapping[str, NodeState]) -> list[tuple[str, str, dict]]:
    """What changed between two node lists (node id -> state): (node id, change, data)
    in node id order; a node may have two (drained and unhealthy at once)."""
    changes: list[tuple[str, str, dict]] = []
    for node_id in sorted(set(before) | set(after)):
        old, new = before.get(node_id), after.get(node_id)
        if new is None:
            changes.append((node_id, "deregistered", {}))
            continue
        status, drained = new
        if old is None:
            changes.append((node_id, "registered", {"status": status, "drained": drained}))
            continue
        if drained != old[1]:
            changes.append((node_id, "drained" if drained else "undrained", {"status": status}))
        if _healthy(status) != _healthy(old[0]):
            changes.append((node_id, "healthy" if _healthy(status) else "unhealthy", {"status": status}))
    return changes


def _healthy(status: str) -> bool:
    # A drained node is healthy (its agent is alive): draining is said on its own.
    return status in ("healthy", "drained")


def parse_types(values: Iterable[str]) -> frozenset[str] | None:
    """`type=job,log` (or repeated) as a set; None for any; ValueError names a bad one."""
    wanted = {t.strip() for value in values for t in value.split(",") if t.strip()}
    unknown = sorted(wanted - set(TYPES))
    if unknown:
        raise ValueError(f"unknown event type(s) {', '.join(map(repr, unknown))}; "
                         f"the types are {', '.join(TYPES)}")
    return frozenset(wanted) or None
