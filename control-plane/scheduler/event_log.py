"""The stored events of the stream (table `stream_event`).

Reading a page after a position, writing node and log events, and the retention.

Job transitions reach the table without code here: a trigger copies every
job_event row in the transaction that wrote it (migration 0008). Positions and
why PostgreSQL reads in windows of transaction ids: events.py.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

import peewee
from peewee import fn

from corral.server.backends.lookup import backend_of
from corral.shared.timeutil import iso

from .events import Cursor, Event, Filter
from .models import SchedulerState, StreamEvent

# SchedulerState key: where the newest row the retention deleted was ("tx id").
PRUNED_KEY = "events_pruned"

# PostgreSQL's horizon: the smallest transaction id among those open in the snapshot
# (pg_snapshot_xip) that belong to this database, else the snapshot's xmax. The
# snapshot's own xmin would do, but it counts every database of the server: another
# application's long transaction would hold every stream back. The snapshot is the
# statement's, taken before pg_stat_activity is read, so a transaction of ours open
# in it and not found there has ended since, and its rows are visible to the next
# statement. pg_stat_activity is read once per transaction and kept, hence autocommit.
# backend_xid and the database are shown to every role.
HORIZON = """
WITH snap AS (SELECT pg_current_snapshot() AS s)
SELECT COALESCE(
    (SELECT MIN(x) FROM snap, pg_snapshot_xip(snap.s) AS x
     WHERE xid(x) IN (SELECT backend_xid FROM pg_stat_activity
                      WHERE datname = current_database() AND backend_xid IS NOT NULL)),
    (SELECT pg_snapshot_xmax(s) FROM snap))::text::bigint
"""


@dataclass
class Page:
    events: list[Event]
    cursor: Cursor  # the position after this page (past rows the filter left out too)
    full: bool      # the page stopped at its limit: more may follow at once


@dataclass(frozen=True)
class Recent:
    """An event as every stream that wants it sends it (stream_hub.StreamHub's ring)."""
    id: int
    type: str
    job_row: int | None
    node_id: str | None
    sse: bytes


class EventLog:
    def __init__(self, db: peewee.Database):
        self.db = db
        self.windowed = backend_of(db).windowed_events

    def parse(self, text: str) -> Cursor:
        return Cursor.parse(text, self.windowed)

    def now(self) -> Cursor:
        """The position of a stream that starts now: after everything committed."""
        if self.windowed:
            horizon = self._horizon()
            return Cursor(horizon, horizon, 0, True)
        return Cursor(id=self._newest_id())

    def read(self, after: Cursor, wanted: Filter, limit: int) -> Page:
        """The events after `after` that `wanted` lets through, at most `limit`."""
        if self.windowed:
            lo, hi, last = after.lo, after.hi, after.id
            if after.window_done:  # open the next window: every transaction below hi has ended
                lo, hi, last = after.hi, max(after.hi, self._horizon()), 0
            where = (StreamEvent.tx >= lo) & (StreamEvent.tx < hi) & (StreamEvent.id > last)
            rows = self._rows(where, wanted, limit)
            events = [_event(row, Cursor(lo, hi, row.id, True)) for row in rows]
            full = len(rows) == limit
            return Page(events, Cursor(lo, hi, rows[-1].id, True) if full else Cursor(hi, hi, 0, True), full)
        # Read the newest id first: every row up to it has committed (one writer at a time).
        top = self._newest_id()
        if top <= after.id:
            return Page([], after, False)  # nothing new: no second query
        rows = self._rows((StreamEvent.id > after.id) & (StreamEvent.id <= top), wanted, limit)
        events = [_event(row, Cursor(id=row.id)) for row in rows]
        full = len(rows) == limit
        return Page(events, Cursor(id=rows[-1].id) if full else Cursor(id=max(top, after.id)), full)

    def recent(self, after: int, upto: int, limit: int) -> list[Recent] | None:
        """SQLite: every event with an id in (after, upto], unfiltered and ready to send
        (what the stream hub shares among the streams); None when there are more than
        `limit`."""
        rows = list(StreamEvent.select().where((StreamEvent.id > after) & (StreamEvent.id <= upto))
                    .order_by(StreamEvent.id).limit(limit + 1))
        if len(rows) > limit:
            return None
        return [Recent(row.id, row.type, row.job_id, row.node_id, _event(row, Cursor(id=row.id)).sse())
                for row in rows]

    def mark(self) -> int:
        """How far committed events reach, in one small query (stream_hub.behind compares a
        stream's position with it): SQLite the newest id, PostgreSQL the transaction horizon."""
        return self._horizon() if self.windowed else self._newest_id()

    def oldest(self) -> Cursor | None:
        """The position just before the oldest event kept (None: none kept)."""
        if self.windowed:
            tx = StreamEvent.select(fn.MIN(StreamEvent.tx)).scalar()
            return None if tx is None else Cursor(tx, tx, 0, True)
        first = StreamEvent.select(fn.MIN(StreamEvent.id)).scalar()
        return None if first is None else Cursor(id=first - 1)

    def pruned(self) -> Cursor | None:
        """Where the newest event the retention deleted was (None: none deleted)."""
        row = SchedulerState.get_or_none(SchedulerState.key == PRUNED_KEY)
        if row is None or not row.value:
            return None
        tx, row_id = (int(part) for part in row.value.split())
        return Cursor(tx, tx, row_id, self.windowed)

    def record(self, rows: Iterable[dict]) -> None:
        """Write node or log events: dicts of at, type, job_id (row id), node_id, data.
        In the caller's transaction, if it runs one."""
        values = [{**row, "data": json.dumps(row["data"], separators=(",", ":"))} for row in rows]
        if values:
            StreamEvent.insert_many(values).execute()

    def prune(self, before: float, batch: int) -> int:
        """Delete up to `batch` of the oldest events older than `before`, never the
        newest of all (SQLite would give its id again: a client past it would skip
        the new event), and remember where the newest deleted one was."""
        with self.db.atomic():
            newest = StreamEvent.select(fn.MAX(StreamEvent.id))
            oldest = (StreamEvent.select(StreamEvent.id).where(StreamEvent.id < newest)
                      .order_by(StreamEvent.id).limit(batch))
            gone = list(StreamEvent.delete().where(StreamEvent.id.in_(oldest) & (StreamEvent.at < before))
                        .returning(StreamEvent.tx, StreamEvent.id).tuples().execute())
            if not gone:
                return 0
            tx = max(row[0] or 0 for row in gone)
            row_id = max(row[1] for row in gone)
            known = self.pruned()
            if known is not None:
                tx, row_id = max(tx, known.lo), max(row_id, known.id)
            (SchedulerState.insert(key=PRUNED_KEY, value=f"{tx} {row_id}")
             .on_conflict(conflict_target=[SchedulerState.key], update={SchedulerState.value: f"{tx} {row_id}"})
             .execute())
            return len(gone)

    def _rows(self, where, wanted: Filter, limit: int) -> list[StreamEvent]:
        if wanted.job_row is not None:
            where &= StreamEvent.job_id == wanted.job_row
        if wanted.node_id is not None:
            where &= StreamEvent.node_id == wanted.node_id
        if wanted.types is not None:
            where &= StreamEvent.type.in_(sorted(wanted.types))
        return list(StreamEvent.select().where(where).order_by(StreamEvent.id).limit(limit))

    def _newest_id(self) -> int:
        return StreamEvent.select(fn.MAX(StreamEvent.id)).scalar() or 0

    def _horizon(self) -> int:
        """The oldest transaction of this database still open (every one of its
        transactions below it has ended). Call it outside a transaction: see HORIZON."""
        return int(self.db.execute_sql(HORIZON).fetchone()[0])


def _event(row: StreamEvent, cursor: Cursor) -> Event:
    """A row as the stream sends it: the job as `job-N`, with its node and the rest."""
    data = json.loads(row.data)
    if row.job_id is not None:
        data["job_id"] = f"job-{row.job_id}"
    if row.node_id is not None:
        data["node_id"] = row.node_id
    data["at"] = iso(row.at)
    return Event(cursor, row.type, data)
