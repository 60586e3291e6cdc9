"""Complete logs: every attempt's whole stdout and stderr, stored and read back.

Shipped by its agent in numbered chunks (PUT /jobs/{id}/attempts/{n}/logs/{stream}/{seq})
and read back by byte range (GET /jobs/{id}/logs); kept in the database or, with
CORRAL_LOG_BUCKET, in S3 (log_objects.py). docs/api.md ("Complete logs") says what
clients see.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import peewee
from peewee import fn

from corral.shared.errors import BadRequest, Conflict, CorralError, NotFound, TooLarge
from corral.shared.wire import LOG_MARK_ROOM

from .event_log import EventLog
from .log_objects import LogObjects
from .models import Job, JobEvent, LogChunk
from .outcomes import ItemOutcome, LogPosition
from .settings import SchedulerSettings
from .validation import parse_job_id

REPEAT, STORE = "repeat", "store"


@dataclass(frozen=True)
class Piece:
    """Where a chunk sits in its stream, and its digest: what tells a repeat apart."""

    seq: int
    start: int
    size: int
    final: bool
    sha256: str

    @property
    def end(self) -> int:
        return self.start + self.size

    @classmethod
    def of(cls, row) -> "Piece":
        return cls(row.seq, row.start, row.size, bool(row.final), row.sha256)


def judge(chunk: Piece, same: Piece | None, last: Piece | None, cap: int) -> str:
    """Whether `chunk` is a repeat of the stored `same` (REPEAT) or the next one of a
    stream whose last stored chunk is `last` (STORE); anything else is refused.
    `cap`: CORRAL_LOG_MAX_BYTES.

    A stream is a run of chunks 0, 1, 2 … without gap or overlap, the last one `final`.
    That makes shipping idempotent and resumable: a chunk sent again is recognised by
    its seq, offset and digest and stored once; one that is not the next is refused
    (409) with the seq and offset expected, where the agent resumes. A stream growing
    past the cap and the mark's room (shared/wire.py) is refused (413)."""
    expected_seq = 0 if last is None else last.seq + 1
    expected_offset = 0 if last is None else last.end
    where = {"expected_seq": expected_seq, "expected_offset": expected_offset,
             "complete": last is not None and last.final}
    if same is not None:
        if same == chunk:
            return REPEAT
        raise Conflict(f"chunk {chunk.seq} of this stream is stored already, with other bytes "
                       f"({same.size} from offset {same.start})", **where)
    if last is not None and last.final:
        raise Conflict(f"this stream is complete ({last.end} bytes in {last.seq + 1} chunk(s)); "
                       f"chunk {chunk.seq} is refused", **where)
    if chunk.seq != expected_seq or chunk.start != expected_offset:
        raise Conflict(f"chunk {chunk.seq} at offset {chunk.start} is not the next one of this stream: "
                       f"that is chunk {expected_seq} at offset {expected_offset}", **where)
    if chunk.end > cap + LOG_MARK_ROOM:
        raise TooLarge(f"this stream would pass CORRAL_LOG_MAX_BYTES ({cap} bytes, and {LOG_MARK_ROOM} for the "
                       f"mark of what the agent dropped); the chunk is refused")
    return STORE


@dataclass(frozen=True)
class LogSlice:
    data: bytes
    size: int       # the stream's bytes stored so far
    complete: bool  # its final chunk came
    attempt: int


_PIECE = (LogChunk.seq, LogChunk.start, LogChunk.size, LogChunk.final, LogChunk.sha256)


def _chunk(seq: int, start: int, data: bytes, final: bool) -> Piece:
    """A chunk as sent: where it goes, and its digest."""
    if not data and not final:
        raise BadRequest("an empty chunk must be the stream's final one (X-Corral-Log-Final: 1)")
    return Piece(seq, start, len(data), final, hashlib.sha256(data).hexdigest())


def _not_ran(job_id: str, attempt: int, node_id: str) -> Conflict:
    return Conflict(f"attempt {attempt} of {job_id} did not run on node {node_id!r}; its log is refused")


def _position(last: Piece, stored: bool) -> LogPosition:
    """The answer to a chunk: whether it was stored, and the stream after it (its last
    chunk is `last`: the stream ends there, without gap)."""
    return LogPosition(stored, last.end, last.final, last.seq + 1)


def _row(job_row: int, attempt: int, stream: str, chunk: Piece, data: bytes, key: str | None, now: float) -> dict:
    """The log_chunk row of a chunk: its bytes, or the S3 key they are under."""
    return {"job_id": job_row, "attempt": attempt, "stream": stream, "seq": chunk.seq, "start": chunk.start,
            "size": chunk.size, "final": chunk.final, "sha256": chunk.sha256, "data": None if key else data,
            "object_key": key, "at": now}


def _event(job_row: int, node_id: str, attempt: int, stream: str, chunk: Piece, now: float) -> dict:
    """The `log` event of a stored chunk (GET /events)."""
    return {"at": now, "type": "log", "job_id": job_row, "node_id": node_id, "data": {
        "attempt": attempt, "stream": stream, "offset": chunk.start, "size": chunk.size, "final": chunk.final}}


class JobLogs:
    """The chunks' store. Only the node an attempt ran on (its `running` event says so)
    may ship its logs, an earlier attempt's too after the job moved on. Nothing answered
    200 is lost on a restart: the row commits before the answer, and an S3 object is
    written before its row."""

    def __init__(self, db: peewee.Database, settings: SchedulerSettings):
        self.db = db
        self.cap = settings.log_max_bytes
        self.objects = LogObjects(settings) if settings.log_bucket else None
        self.event_log = EventLog(db)

    # ---- shipping ----------------------------------------------------------------

    def put(self, job_id: str, attempt: int, stream: str, seq: int, node_id: str, start: int, final: bool,
            data: bytes, now: float) -> LogPosition:
        """Store one chunk (judge, JobLogs); the answer: whether it was stored, what the
        stream holds after it, and the seq its next chunk takes."""
        job_row = self._job_row(job_id)
        chunk = _chunk(seq, start, data, final)
        where = (LogChunk.job_id == job_row) & (LogChunk.attempt == attempt) & (LogChunk.stream == stream)
        if not JobEvent.select().where((JobEvent.job == job_row) & (JobEvent.attempt == attempt)
                                       & (JobEvent.to_status == "running") & (JobEvent.node_id == node_id)).exists():
            if not Job.select().where(Job.id == job_row).exists():
                raise NotFound(f"no job {job_id!r}")
            raise _not_ran(job_id, attempt, node_id)
        key = None
        if self.objects is not None:
            # Judged first without a write transaction, so that the S3 put holds none.
            if (last := self._repeated(chunk, where)) is not None:
                return _position(last, stored=False)
            key = self.objects.key(job_row, attempt, stream, seq, chunk.sha256)
            self.objects.put(key, data)
        try:
            with self.db.atomic():
                if (last := self._repeated(chunk, where)) is not None:
                    return _position(last, stored=False)
                LogChunk.insert(_row(job_row, attempt, stream, chunk, data, key, now)).execute()
                self.event_log.record([_event(job_row, node_id, attempt, stream, chunk, now)])
        except peewee.IntegrityError:  # the same chunk, sent twice at once, committed first
            if (last := self._repeated(chunk, where)) is not None:
                return _position(last, stored=False)
            raise
        return _position(chunk, stored=True)

    def put_many(self, items: list[tuple[str, dict | CorralError]], now: float
                 ) -> list[ItemOutcome[LogPosition]]:
        """Many small chunks (POST /jobs/logs), each stored or refused on its own, as put
        would. One outcome per item: put's answer, or the error (which says where the
        stream is when that was the reason).

        Without S3 the whole batch costs a few statements, however many chunks: what
        the batch's jobs ran where and their streams' chunks are read at once, each
        chunk is judged against them (and the batch's earlier chunks), and the stored
        ones are inserted together with their events, in one transaction. Two batches
        racing on one chunk (a unique key conflict) fall back to one chunk at a time."""
        if self.objects is None:
            try:
                with self.db.atomic():
                    return self._put_together(items, now)
            except peewee.IntegrityError:
                pass
        results: list[ItemOutcome[LogPosition]] = []
        for index, (job_id, item) in enumerate(items):
            try:
                if isinstance(item, CorralError):
                    raise item
                answer = self.put(job_id, now=now, **item)
            except CorralError as exc:
                results.append(ItemOutcome(index, job_id, error=exc))
                continue
            results.append(ItemOutcome(index, job_id, answer))
        return results

    def _put_together(self, items: list[tuple[str, dict | CorralError]], now: float
                      ) -> list[ItemOutcome[LogPosition]]:
        rows = {parse_job_id(job_id) for job_id, item in items if not isinstance(item, CorralError)} - {None}
        jobs = set(Job.select(Job.id).where(Job.id.in_(rows)).scalars()) if rows else set()
        ran = set(JobEvent.select(JobEvent.job, JobEvent.attempt, JobEvent.node_id).where(
            JobEvent.job.in_(jobs) & (JobEvent.to_status == "running")).tuples()) if jobs else set()
        stored: dict[tuple, dict[int, Piece]] = {}  # (job row, attempt, stream) -> seq -> piece
        for row in (LogChunk.select(LogChunk.job_id, LogChunk.attempt, LogChunk.stream, *_PIECE)
                    .where(LogChunk.job_id.in_(jobs)) if jobs else ()):
            stored.setdefault((row.job_id, row.attempt, row.stream), {})[row.seq] = Piece.of(row)
        results: list[ItemOutcome[LogPosition]] = []
        inserts, events = [], []
        for index, (job_id, item) in enumerate(items):
            try:
                if isinstance(item, CorralError):
                    raise item
                chunk = _chunk(item["seq"], item["start"], item["data"], item["final"])
                job_row = self._job_row(job_id)
                if job_row not in jobs:
                    raise NotFound(f"no job {job_id!r}")
                if (job_row, item["attempt"], item["node_id"]) not in ran:
                    raise _not_ran(job_id, item["attempt"], item["node_id"])
                chunks = stored.setdefault((job_row, item["attempt"], item["stream"]), {})
                last = chunks[max(chunks)] if chunks else None
                if judge(chunk, chunks.get(chunk.seq), last, self.cap) == REPEAT:
                    assert last is not None  # a repeat: a chunk is stored
                    results.append(ItemOutcome(index, job_id, _position(last, stored=False)))
                    continue
            except CorralError as exc:
                results.append(ItemOutcome(index, job_id, error=exc))
                continue
            chunks[chunk.seq] = chunk
            inserts.append(_row(job_row, item["attempt"], item["stream"], chunk, item["data"], None, now))
            events.append(_event(job_row, item["node_id"], item["attempt"], item["stream"], chunk, now))
            results.append(ItemOutcome(index, job_id, _position(chunk, stored=True)))
        if inserts:
            LogChunk.insert_many(inserts).execute()
            self.event_log.record(events)
        return results

    def _repeated(self, chunk: Piece, where) -> Piece | None:
        """The stream's last stored chunk when `chunk` repeats a stored one (None: the
        next one, to store); anything else is refused (judge)."""
        rows = list(LogChunk.select(*_PIECE).where(where & ((LogChunk.seq == chunk.seq) | (LogChunk.seq == (
            LogChunk.select(fn.MAX(LogChunk.seq)).where(where))))))
        same = next((Piece.of(row) for row in rows if row.seq == chunk.seq), None)
        last = max((Piece.of(row) for row in rows), key=lambda piece: piece.seq, default=None)
        return last if judge(chunk, same, last, self.cap) == REPEAT else None

    # ---- reading -----------------------------------------------------------------

    def read(self, job_id: str, attempt: int | None, stream: str, offset: int, limit: int) -> LogSlice:
        """At most `limit` bytes of a stream from `offset` (fewer at its end, none past
        it). `attempt` None: the job's current (latest) attempt."""
        job = Job.select(Job.id, Job.attempt).where(Job.id == self._job_row(job_id)).first()
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        if attempt is None:
            attempt = job.attempt
        elif attempt > job.attempt:
            raise NotFound(f"{job_id} has no attempt {attempt} (its latest is {job.attempt})")
        where = (LogChunk.job_id == job.id) & (LogChunk.attempt == attempt) & (LogChunk.stream == stream)
        size, complete = self._extent(where)
        rows = list(LogChunk.select(LogChunk.id, LogChunk.start, LogChunk.size, LogChunk.object_key)
                    .where(where & (LogChunk.start < offset + limit) & (LogChunk.start + LogChunk.size > offset))
                    .order_by(LogChunk.seq))
        parts = []
        for row in rows:
            first = max(offset, row.start) - row.start
            last = min(offset + limit, row.start + row.size) - row.start  # exclusive
            if row.object_key is None:  # only the bytes asked for leave the database
                parts.append(bytes(LogChunk.select(fn.SUBSTR(LogChunk.data, first + 1, last - first))
                                   .where(LogChunk.id == row.id).scalar() or b""))
            elif self.objects is not None:
                parts.append(self.objects.get(row.object_key, first, last - 1))
            else:
                raise NotFound(f"a chunk of this log is in S3 ({row.object_key}), and CORRAL_LOG_BUCKET is unset")
        return LogSlice(b"".join(parts), size, complete, attempt)

    def _extent(self, where) -> tuple[int, bool]:
        size, complete = LogChunk.select(fn.MAX(LogChunk.start + LogChunk.size),
                                         fn.MAX(LogChunk.final.cast("integer"))).where(where).scalar(as_tuple=True)
        return int(size or 0), bool(complete)

    # ---- retention ---------------------------------------------------------------

    def delete_objects(self, keys: list[str]) -> int:
        """Delete the S3 objects of purged jobs' chunks (Purge.finished's keys)."""
        return self.objects.delete(keys) if self.objects is not None and keys else 0

    @staticmethod
    def _job_row(job_id: str) -> int:
        job_row = parse_job_id(job_id)
        if job_row is None:
            raise NotFound(f"no job {job_id[:64]!r}")
        return job_row
