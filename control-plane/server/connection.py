"""One client connection of the gunicorn worker (control-plane/server/worker.py): what its
event loop buffers of the request and which phase the connection is in, and what
gunicorn's request handling reads of it (sock, client, server, parser).
"""
from __future__ import annotations

import ssl
from collections.abc import Callable
from functools import partial
from typing import Any

from corral.server import framing

# What a connection is doing, as the loop sees it.
NEW = "new"            # accepted (TLS: handshaking); no byte of a request yet
IDLE = "idle"          # kept alive after an answer; no byte of the next request yet
READING = "reading"    # part of a request is buffered
BUSY = "busy"          # a request thread has it
CLOSING = "closing"    # answered for the last time; lingering until the client closes
CLOSED = "closed"


class Conn:
    """One client connection: the loop's buffer and state, and what gunicorn's
    request handling uses (sock, client, server, parser)."""

    def __init__(self, sock: Any, client: Any, server: Any, limits: framing.Limits, deadline: float,
                 on_event: Callable[[Conn, Any], None]):
        self.sock = sock
        self.client = client
        self.server = server
        self.parser: Any = None   # gunicorn's RequestParser, made by the first request's thread
        self.limits = limits
        self.buf = bytearray()    # what the loop has read of the request so far
        self.handed = b""         # the request's bytes, as handed to a thread
        self.scanner = framing.RequestScanner(limits)
        self.phase = NEW
        self.deadline = deadline
        self.version = 0          # bumped at every phase change: older timers are void
        self.handshaken = not isinstance(sock, ssl.SSLSocket)
        self.whole = False        # the request was buffered whole (its body too)
        self.continue_sent = False
        self.paused = False
        self.events = 0           # what the poller watches it for; 0: not registered
        self.lingered = 0         # bytes drained while closing
        self.on_event = partial(on_event, self)
        self.busy_since = 0.0     # when the request being served was handed to a thread
        self.thread_id: int | None = None  # the thread serving it
        self.request_line = ""    # its first line, for the log of a stop that takes long

    def next_request(self) -> None:
        self.scanner = framing.RequestScanner(self.limits)
        self.whole = self.continue_sent = False

    def tls_pending(self) -> bool:
        """Whether TLS holds decrypted bytes the poller does not report."""
        return isinstance(self.sock, ssl.SSLSocket) and self.handshaken and self.sock.pending() > 0
