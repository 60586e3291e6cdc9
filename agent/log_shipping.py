"""Complete logs: each attempt's whole stdout and stderr, shipped to the scheduler.

In numbered chunks from the agent's own copies (log_capture.py), while the job runs and
once it has ended, nothing lost while the scheduler is away and nothing stored twice.
docs/agent.md ("Output: the tail and the whole of it") says how it behaves.
"""
from __future__ import annotations

import base64
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from corral.shared import backoff
from corral.shared.clients import ClientError, Rejected, SchedulerClient, split_batches
from corral.shared.wire import LOG_CHUNK_MAX_BYTES, LOG_STREAMS

from .log_capture import CapturedStream, ServiceStream, Source

log = logging.getLogger(__name__)

BACKOFF_CAP_SECS = 30.0
# What is left of a stream up to this size goes in one POST /jobs/logs with the other
# streams' small pieces (base64 makes it a third larger); larger, by the PUT in chunks.
SMALL_BYTES = 64 * 1024
# One POST /jobs/logs carries at most this many pieces and about this much JSON (the
# scheduler takes CORRAL_MAX_BODY_BYTES, 2 MiB by default).
BATCH_ITEMS = 500
BATCH_BYTES = 1024 * 1024
Key = tuple[str, int, str]  # (job_id, attempt, stream)


@dataclass
class Shipment:
    job_id: str
    attempt: int
    stream: str
    source: Source
    seq: int = 0      # the seq of the next chunk
    offset: int = 0   # where it starts: what the scheduler has
    done: bool = False


class Unshippable(Exception):
    """The scheduler will never take this stream (its reason is the message)."""


class LogShipper:
    """One `Shipment` per stream of each attempt this agent ran and has not finished
    shipping. Its thread (`run`) passes over them every AGENT_OUTPUT_INTERVAL_SECS and
    sends what each stream holds past what the scheduler has (PUT
    /jobs/{id}/attempts/{n}/logs/{stream}/{seq} up to wire.LOG_CHUNK_MAX_BYTES, or many
    small pieces in one POST /jobs/logs), the last chunk marked final once the attempt
    has ended. Each answer says where the stream is: a `200` its size and next seq, a
    `409` the seq and offset expected; unanswered, the same chunk goes again after a
    backoff. A stream leaves once the scheduler has its final chunk or never will take
    it (404: the job is gone; 409 without a position: not this node's attempt; 413: past
    CORRAL_LOG_MAX_BYTES), and its files go. A restarted agent starts each adopted
    service's streams at 0 and the first answer moves them on."""

    def __init__(self, node_id: str, directory: str, cap: int, chunk_bytes: int = LOG_CHUNK_MAX_BYTES):
        self.node_id = node_id
        self.directory = directory  # the run jobs' copies: <agent_dir>/output, 0700
        self.cap = cap
        self.chunk_bytes = chunk_bytes
        self.small_bytes = min(SMALL_BYTES, chunk_bytes)
        self._shipments: dict[Key, Shipment] = {}
        self._lock = threading.Lock()

    # ---- what the agent tells it -----------------------------------------------------

    def capture(self, job_id: str, attempt: int) -> tuple[CapturedStream, CapturedStream]:
        """The copies a run job's output goes to (before it starts; their files are made
        on its first bytes); `add` them once it did."""
        stem = os.path.join(self.directory, f"{job_id}-{attempt}")
        return CapturedStream(f"{stem}.stdout", self.cap), CapturedStream(f"{stem}.stderr", self.cap)

    def follow_files(self, job_id: str, attempt: int, paths: Iterable[str]) -> None:
        """A service's log files (stdout, stderr), started or adopted."""
        sources = []
        try:
            for path in paths:
                sources.append(ServiceStream(path, self.cap))
        except OSError as exc:
            log.warning("job %s attempt %s: its output cannot be shipped whole: %s", job_id, attempt, exc)
            for source in sources:
                source.close()
            return
        self.add(job_id, attempt, sources)

    def add(self, job_id: str, attempt: int, sources: Iterable[Source]) -> None:
        with self._lock:
            for stream, source in zip(LOG_STREAMS, sources):
                old = self._shipments.pop((job_id, attempt, stream), None)
                if old is not None:
                    old.source.close()
                self._shipments[(job_id, attempt, stream)] = Shipment(job_id, attempt, stream, source)

    def finish(self, job_id: str, attempt: int) -> None:
        """The attempt ended (its output is all read): the next pass ships the rest.
        Not at once: a pass every interval takes the ends of every job that ended
        meanwhile in one request, where one pass per ending job would cost the
        scheduler a request and a transaction per job."""
        with self._lock:
            found = [s for s in self._shipments.values() if (s.job_id, s.attempt) == (job_id, attempt)]
        for shipment in found:
            shipment.source.finish()

    def pending(self) -> list[Key]:
        with self._lock:
            return sorted(self._shipments)

    def close(self) -> None:
        """The agent stops: let go of every file (a run job's copies go with it)."""
        with self._lock:
            shipments, self._shipments = list(self._shipments.values()), {}
        for shipment in shipments:
            shipment.source.close()

    # ---- shipping ---------------------------------------------------------------------

    def ship_once(self, client: SchedulerClient, finished_only: bool = False) -> int:
        """One pass over every stream (`finished_only`: of attempts that ended); the
        chunks the scheduler took. Raises ClientError when it cannot be reached
        (nothing is lost: the next pass sends the same bytes)."""
        with self._lock:
            shipments = [s for s in self._shipments.values() if s.source.finished or not finished_only]
        sent = 0
        small: list[tuple[Shipment, bytes, bool]] = []  # sent together below
        for shipment in shipments:
            try:
                piece = self._small_piece(shipment)
                if piece is not None:
                    small.append((shipment, *piece))
                    continue
                sent += self._ship(shipment, client)
            except Unshippable as exc:
                self._give_up(shipment, exc)
            if shipment.done:
                self._drop(shipment)
        entries = [(shipment, data, final, self._item(shipment, data, final)) for shipment, data, final in small]
        for batch in split_batches(entries, lambda entry: entry[3], BATCH_ITEMS, BATCH_BYTES):
            sent += self._ship_batch(batch, client)
        return sent

    def _item(self, shipment: Shipment, data: bytes, final: bool) -> dict:
        return {"job_id": shipment.job_id, "node_id": self.node_id, "attempt": shipment.attempt,
                "stream": shipment.stream, "seq": shipment.seq, "offset": shipment.offset, "final": final,
                "data": base64.b64encode(data).decode()}

    def _small_piece(self, shipment: Shipment) -> tuple[bytes, bool] | None:
        """All that is left to send now of a stream, when it is small enough for a batch
        (and there is something to send): its bytes and whether they end the stream."""
        finished = shipment.source.finished
        left = shipment.source.available() - shipment.offset
        if left > self.small_bytes or (left <= 0 and not finished):
            return None
        return shipment.source.read(shipment.offset, max(0, left)), finished

    def _ship_batch(self, batch: list[tuple[Shipment, bytes, bool, dict]], client: SchedulerClient) -> int:
        """Small pieces of many streams in one POST /jobs/logs; each result moves its
        stream on as a PUT's answer would."""
        try:
            results = client.put_log_chunks([item for _, _, _, item in batch])
        except ValueError as exc:
            raise ClientError(str(exc)) from None
        for (shipment, _, _, _), result in zip(batch, results):
            code = result["code"]
            try:
                if code == 200:
                    self._moved(shipment, result.get("next_seq"), result.get("size"), bool(result.get("complete")))
                elif code != 503:  # 503: S3 did not answer; the next pass sends it again
                    self._refused(shipment, Rejected(code, str(result.get("error")), result))
            except Unshippable as exc:
                self._give_up(shipment, exc)
            if shipment.done:
                self._drop(shipment)
        return sum(1 for result in results if result["code"] == 200)

    @staticmethod
    def _give_up(shipment: Shipment, exc: Exception) -> None:
        log.warning("job %s attempt %s: its %s is not shipped further: %s", shipment.job_id, shipment.attempt,
                    shipment.stream, exc)
        shipment.done = True

    def _ship(self, shipment: Shipment, client: SchedulerClient) -> int:
        sent = 0
        source = shipment.source
        while not shipment.done:
            finished = source.finished
            available = source.available()
            if shipment.offset >= available and not finished:
                return sent  # nothing new yet
            data = source.read(shipment.offset, min(self.chunk_bytes, max(0, available - shipment.offset)))
            if not data and not finished:
                return sent
            final = finished and shipment.offset + len(data) >= available
            try:
                answer = client.put_log_chunk(shipment.job_id, shipment.attempt, shipment.stream, shipment.seq,
                                              data, shipment.offset, final, self.node_id)
            except Rejected as exc:
                self._refused(shipment, exc)
                continue
            sent += 1
            if not isinstance(answer, dict):
                raise Unshippable(f"the scheduler's answer is not a JSON object: {answer!r:.100}")
            self._moved(shipment, answer.get("next_seq"), answer.get("size"), bool(answer.get("complete")))
        return sent

    def _refused(self, shipment: Shipment, exc: Rejected) -> None:
        fields = exc.fields
        if exc.status == 409 and "expected_seq" in fields:  # not the next one: go on from where it is
            before = (shipment.seq, shipment.offset)
            self._moved(shipment, fields.get("expected_seq"), fields.get("expected_offset"),
                        bool(fields.get("complete")))
            if not shipment.done and (shipment.seq, shipment.offset) == before:
                raise Unshippable(f"refused where the scheduler expects it: {exc.message}")
            return
        raise Unshippable(f"{exc.status}: {exc.message}")

    @staticmethod
    def _moved(shipment: Shipment, next_seq, size, complete: bool) -> None:
        if complete:
            shipment.done = True
            return
        if not (isinstance(next_seq, int) and isinstance(size, int)) or next_seq < 0 or size < 0:
            raise Unshippable(f"the scheduler's answer names no position (next_seq={next_seq!r}, size={size!r})")
        if size > shipment.offset:
            shipment.source.resume_at(size)
        shipment.seq, shipment.offset = next_seq, size

    def _drop(self, shipment: Shipment) -> None:
        with self._lock:
            key = (shipment.job_id, shipment.attempt, shipment.stream)
            if self._shipments.get(key) is shipment:
                del self._shipments[key]
        shipment.source.close()

    def run(self, client: SchedulerClient, stop: threading.Event, interval: float, live: bool = True) -> None:
        """Ship every `interval` until `stop`, while attempts run too
        when `live`; failures are logged and retried later (doubling the pause up to
        BACKOFF_CAP_SECS)."""
        try:
            backoff.every(interval, stop, lambda: self.ship_once(client, finished_only=not live),
                          "shipping job output", log, (ClientError,), BACKOFF_CAP_SECS)
        finally:
            client.close()
