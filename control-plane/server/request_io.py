"""A request thread's socket I/O in the gunicorn worker (control-plane/server/worker.py),
every blocking operation bounded: gunicorn's parser reads first the bytes the event
loop buffered, then the socket until the request's deadline; an answer is written
to a client that keeps reading it, never to one that stopped.
"""
from __future__ import annotations

import socket
import time
from typing import Any

from gunicorn.http.unreader import SocketUnreader
from werkzeug.exceptions import RequestTimeout


class RequestReadTimeout(RequestTimeout):
    """A body read from the socket (one too large to buffer) went past the request's
    deadline. A werkzeug error, so that the application answers it as JSON 408 when
    it was reading the body."""
    description = "the request body did not arrive in time (CORRAL_REQUEST_READ_TIMEOUT_SECS)"


class ClientSocket(socket.socket):
    """A client connection whose sendall() waits at most the socket's timeout for
    each bit of progress, as SSLSocket's does, instead of for the whole answer: a
    client reading a large answer slowly is served, one that stopped reading is not
    waited for."""

    __slots__ = ()

    def sendall(self, data: Any, flags: int = 0) -> None:
        with memoryview(data) as view, view.cast("B") as octets:
            sent = 0
            while sent < len(octets):
                sent += self.send(octets[sent:], flags)


class RequestUnreader(SocketUnreader):
    """gunicorn's reader of a connection's requests. It serves first the bytes the
    loop buffered (`hold`), in the pieces a socket read would have returned, so
    gunicorn's parser reads them exactly as it reads a socket; then the socket,
    each read stopping at the request's deadline (the rest of a body too large to
    buffer)."""

    def __init__(self, sock: Any, io_timeout: float):
        super().__init__(sock)
        self.io_timeout = io_timeout
        self.deadline = float("inf")
        self._held = b""
        self._held_at = 0

    def hold(self, data: bytes, deadline: float) -> None:
        self._held, self._held_at = data, 0
        self.deadline = deadline

    def leftover(self) -> bytes:
        """Bytes received and not parsed: the start of the client's next request."""
        rest: bytes = self.take_buffered() + self._held[self._held_at:]
        self._held, self._held_at = b"", 0
        return rest

    def chunk(self, size_hint: int | None = None) -> bytes:
        if self._held_at < len(self._held):
            size = self.mxchunk
            if size_hint and size_hint > size:
                size = min(size_hint, self.max_body_chunk)
            piece = self._held[self._held_at:self._held_at + size]
            self._held_at += len(piece)
            return piece
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise RequestReadTimeout()
        self.sock.settimeout(min(self.io_timeout, remaining))
        try:
            chunk: bytes = super().chunk(size_hint)
            return chunk
        except TimeoutError:
            raise RequestReadTimeout() from None
        finally:
            self.sock.settimeout(self.io_timeout)
