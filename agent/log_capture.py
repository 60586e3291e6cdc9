"""The agent's own bounded copy of each attempt's stdout and stderr, for shipping whole.

A `Source` per stream (log_shipping.py reads them), kept in files the job cannot reach
and read only through the agent's own descriptors. docs/agent.md ("Output: the tail
and the whole of it") says what is kept past CORRAL_LOG_MAX_BYTES.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Protocol

from corral.shared.wire import LOG_DROPPED_MARK

from . import services

log = logging.getLogger(__name__)

# A part of a stream: `n` bytes from position `at` of where that part is kept.
Reader = Callable[[int, int], bytes]

FILE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


class Source(Protocol):
    """One stream of one attempt, as the shipper reads it. Kept whole up to `cap`
    (CORRAL_LOG_MAX_BYTES); past it, the head (what the job set out to do) and the last
    half (how it ended) with a line between them saying how many bytes were dropped
    (wire.LOG_DROPPED_MARK): never more than cap plus the mark. The head can be shipped
    while the job runs; the rest only once the attempt has ended (`finish`), when it is
    known which bytes are the tail. Reads are `os.pread` on the agent's own
    descriptors: a job can never make the agent read another file."""

    def available(self) -> int:
        """Bytes of the stream that may be shipped now (the final size once finished)."""

    def read(self, offset: int, size: int) -> bytes:
        """Up to `size` bytes from `offset` (below available())."""

    def finish(self) -> None:
        """The attempt ended: the stream is what it now holds."""

    @property
    def finished(self) -> bool: ...

    def resume_at(self, offset: int) -> None:
        """The scheduler holds the stream up to `offset` (an agent that restarted)."""

    def close(self) -> None:
        """Done with it: its files (if the agent's own) go."""


class Layout:
    """Where the shipped stream's bytes are once the attempt ended: `head` bytes, then
    the mark of `dropped` bytes (none when 0), then `tail_size` bytes of the tail from
    position `tail_at` of wherever the tail is kept."""

    def __init__(self, head: int, dropped: int, tail_size: int, tail_at: int):
        self.head = head
        self.mark = LOG_DROPPED_MARK.format(dropped).encode() if dropped > 0 else b""
        self.tail_size = tail_size
        self.tail_at = tail_at

    @classmethod
    def of(cls, written: int, cap: int) -> "Layout":
        """A stream of `written` bytes under `cap`: the first half whole, and of the
        rest what the other half holds (its newest bytes)."""
        head = min(written, cap // 2)
        rest = written - head
        tail = min(rest, cap - cap // 2)
        return cls(head, rest - tail, tail, rest - tail)

    @property
    def size(self) -> int:
        return self.head + len(self.mark) + self.tail_size

    def read(self, offset: int, size: int, head: Reader, tail: Reader) -> bytes:
        """The bytes of [offset, offset + size): the head's from `head(at, n)`, the
        mark's, and the tail's from `tail(at, n)` (`at`: from `tail_at` on)."""
        out = []
        end = min(offset + size, self.size)
        for part, start, length, base in ((head, 0, self.head, 0),
                                          (self._mark, self.head, len(self.mark), 0),
                                          (tail, self.head + len(self.mark), self.tail_size, self.tail_at)):
            lo, hi = max(offset, start), min(end, start + length)
            if lo < hi:
                out.append(part(base + lo - start, hi - lo))
        return b"".join(out)

    def _mark(self, at: int, n: int) -> bytes:
        return self.mark[at:at + n]


def pread_all(fd: int, size: int, offset: int) -> bytes:
    parts = []
    while size > 0:
        data = os.pread(fd, size, offset)
        if not data:
            break
        parts.append(data)
        size -= len(data)
        offset += len(data)
    return b"".join(parts)


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        done = os.pwrite(fd, data, offset)
        data, offset = data[done:], offset + done


class CapturedStream:
    """A run job's stream: written by the agent's pipe reader (write), read by the shipper.
    Two files of the agent's own under `<agent_dir>/output` (0700, files 0600, opened
    O_NOFOLLOW; the job gets none of their descriptors): the head, and a ring of
    `cap - cap/2` bytes that holds the newest bytes past it. Disk use is at most `cap`."""

    def __init__(self, path: str, cap: int):
        self.path = path
        self.cap = cap
        self.half = cap // 2
        self.ring_size = cap - self.half
        # Made on the first byte that goes there: a job that writes nothing costs no file.
        self.head_fd: int | None = None
        self.ring_fd: int | None = None
        self.written = 0
        self.failed = False
        self.layout: Layout | None = None
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        """What the job wrote next (the reader thread). Never raises: a disk that is
        full ends the capture (logged); the job runs on."""
        with self._lock:
            if self.layout is not None or self.failed:
                return
            view = memoryview(data)
            try:
                if self.written < self.half and view:
                    if self.head_fd is None:
                        self.head_fd = os.open(self.path, FILE_FLAGS, 0o600)
                    n = min(len(view), self.half - self.written)
                    _pwrite_all(self.head_fd, view[:n], self.written)
                    view, self.written = view[n:], self.written + n
                while view:
                    if self.ring_fd is None:
                        self.ring_fd = os.open(self.path + ".tail", FILE_FLAGS, 0o600)
                    at = (self.written - self.half) % self.ring_size
                    n = min(len(view), self.ring_size - at)
                    _pwrite_all(self.ring_fd, view[:n], at)
                    view, self.written = view[n:], self.written + n
            except OSError as exc:
                self.failed = True
                log.warning("stopped keeping the output in %s: %s", self.path, exc)

    def available(self) -> int:
        with self._lock:
            return self.layout.size if self.layout is not None else min(self.written, self.half)

    def read(self, offset: int, size: int) -> bytes:
        with self._lock:
            layout = self.layout or Layout(min(self.written, self.half), 0, 0, 0)
        return layout.read(offset, size, self._head, self._ring)

    def _head(self, at: int, n: int) -> bytes:
        return b"" if self.head_fd is None else pread_all(self.head_fd, n, at)

    def _ring(self, at: int, n: int) -> bytes:
        """`n` bytes from logical position `at` past the head, as the ring holds them."""
        out = []
        while n > 0 and self.ring_fd is not None:
            pos = at % self.ring_size
            take = min(n, self.ring_size - pos)
            out.append(pread_all(self.ring_fd, take, pos))
            at, n = at + take, n - take
        return b"".join(out)

    def finish(self) -> None:
        with self._lock:
            if self.layout is None:
                self.layout = Layout.of(self.written, self.cap)

    @property
    def finished(self) -> bool:
        return self.layout is not None

    def resume_at(self, offset: int) -> None:
        pass  # its files were made by this agent: the head is what the scheduler has

    def close(self) -> None:
        with self._lock:
            self.failed = True  # the reader of a job still running writes no more here
            made = [(fd, path) for fd, path in ((self.head_fd, self.path), (self.ring_fd, self.path + ".tail"))
                    if fd is not None]
            self.head_fd = self.ring_fd = None
        for fd, _ in made:
            try:
                os.close(fd)
            except OSError:
                pass
        for _, path in made:
            services.remove_file(path)


class ServiceStream:
    """A service's stream, read from the log file it writes to (through a descriptor
    the agent opened: the file itself stays the service's log, removed with it). The
    service writes it itself, so that it can outlive the agent (services.py); the file
    is emptied past AGENT_SERVICE_LOG_MAX_BYTES, so bytes past the head that no longer
    exist at the end count as dropped."""

    def __init__(self, path: str, cap: int):
        self.fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.cap = cap
        self.half = cap // 2
        self.seen = 0          # bytes the service wrote, as far as the agent saw
        self.last_size = 0
        self.head = self.half  # shrinks to what is known shipped if the file is emptied first
        self.read_upto = 0
        self.emptied = False
        self.layout: Layout | None = None
        self._lock = threading.Lock()

    def _look(self) -> int:
        size = os.fstat(self.fd).st_size
        if size < self.last_size:  # emptied past AGENT_SERVICE_LOG_MAX_BYTES
            if not self.emptied:
                self.head = min(self.head, self.read_upto)
            self.emptied = True
            self.seen += size
        else:
            self.seen += size - self.last_size
        self.last_size = size
        return size

    def available(self) -> int:
        with self._lock:
            if self.layout is not None:
                return self.layout.size
            size = self._look()
            return self.head if self.emptied else min(size, self.head)

    def read(self, offset: int, size: int) -> bytes:
        with self._lock:
            layout = self.layout
            if layout is None:
                self.read_upto = max(self.read_upto, offset + size)
                return pread_all(self.fd, size, offset)
        # Head and tail are both in the file, the tail from its position there (tail_at).
        return layout.read(offset, size, self._file, self._file)

    def _file(self, at: int, n: int) -> bytes:
        return pread_all(self.fd, n, at)

    def finish(self) -> None:
        with self._lock:
            if self.layout is not None:
                return
            size = self._look()
            if not self.emptied and size <= self.cap:
                self.layout = Layout(size, 0, 0, 0)  # whole
                return
            head = self.head if self.emptied else min(self.head, size)
            # The tail: the file's newest bytes, past the head unless the file was emptied.
            tail = min(self.cap - self.half, size if self.emptied else size - head)
            self.layout = Layout(head, self.seen - head - tail, tail, size - tail)

    @property
    def finished(self) -> bool:
        return self.layout is not None

    def resume_at(self, offset: int) -> None:
        with self._lock:
            if self.layout is None and offset < self.head and self.emptied:
                self.head = offset

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
