"""The gunicorn worker's client connections, as its event loop runs them: each request
is read without blocking into the connection's own buffer until control-plane/server/framing.py
says it is whole, and only then is the connection handed to a request thread.

Here too are what the loop answers or closes by itself: a head that can only be
refused (at its first bad byte, control-plane/server/refusals.py), a request not in by
its deadline (408), the lingering close after a last answer (RFC 9112 9.6: send FIN,
drop what the client still sends, LINGER_SECS at most, never blocking).
"""
from __future__ import annotations

import selectors
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from typing import Any

from gunicorn import util

from corral.server import framing, refusals
from corral.server.buffer_budget import BufferBudget
from corral.server.connection import BUSY, CLOSED, CLOSING, IDLE, NEW, READING, Conn
from corral.server.deadlines import Deadlines

RECV_BYTES = 64 * 1024
LINGER_SECS = 2.0
LINGER_DRAIN_BYTES = 64 * 1024
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _peer(client: Any) -> str:
    """The client's address for the log (a unix socket's peer has none)."""
    return str(client[0]) if isinstance(client, tuple) and client else ""


class Connections:
    """The worker's open connections, their buffers, deadlines and poller registrations.
    `hand_over` gives a connection whose request is in to a request thread."""

    def __init__(self, poller: selectors.BaseSelector, log: Any, read_timeout: float, limits: framing.Limits,
                 hand_over: Callable[[Conn], None]):
        self.poller = poller
        self.log = log
        self.read_timeout = read_timeout
        self.limits = limits
        self.hand_over = hand_over
        self.open: set[Conn] = set()
        self.count = 0  # as `open` holds, unless a connection went astray (a stop that takes long says)
        self.deadlines = Deadlines()
        self.budget = BufferBudget(limits.body)

    def add(self, sock: Any, client: Any, server: Any) -> None:
        """A connection just accepted (its TLS handshake, if any, not done yet)."""
        self.count += 1
        conn = Conn(sock, client, server, self.limits, 0.0, self._on_event)
        self.open.add(conn)
        self.deadlines.move(conn, NEW, time.monotonic() + self.read_timeout)
        self._watch(conn, selectors.EVENT_READ)

    def next_deadline(self) -> float | None:
        return self.deadlines.next_at()

    def after_events(self) -> None:
        """Deadlines that passed, then paused connections the budget has room for again."""
        for conn in self.deadlines.passed(time.monotonic()):
            self._deadline_passed(conn)
        for conn in self.budget.resumed():
            if conn.phase == READING:
                self._watch(conn, selectors.EVENT_READ)
                if conn.tls_pending():
                    self._read(conn)

    # ---- reading requests ---------------------------------------------------------------

    def _on_event(self, conn: Conn, _fileobj: Any) -> None:
        if conn.phase == CLOSING:
            self._drain(conn)
        elif conn.phase in (NEW, IDLE, READING):
            if conn.handshaken or self._handshake(conn):
                self._read(conn)
        # BUSY or CLOSED: an event reported before the connection moved on

    def _handshake(self, conn: Conn) -> bool:
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(conn, selectors.EVENT_READ)
            return False
        except ssl.SSLWantWriteError:
            self._watch(conn, selectors.EVENT_WRITE)
            return False
        except OSError as exc:  # ssl.SSLError included: not TLS, a bad client, a reset
            self.log.debug("TLS handshake with %s failed: %s", conn.client, exc)
            self.close(conn)
            return False
        conn.handshaken = True
        self._watch(conn, selectors.EVENT_READ)
        return True

    def _read(self, conn: Conn) -> None:
        """Read what the client sent; hand the connection over once its request is in."""
        while True:
            if self.budget.over(conn):
                self._unwatch(conn)
                self.budget.pause(conn)
                return
            try:
                data = conn.sock.recv(RECV_BYTES)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                self._watch(conn, selectors.EVENT_READ)
                return
            except ssl.SSLWantWriteError:
                self._watch(conn, selectors.EVENT_WRITE)
                return
            except OSError:
                self.close(conn)
                return
            if not data:
                if conn.buf:
                    # The client stopped sending (half-closed) before its request was
                    # whole: the parser finds the end at once and answers if it can.
                    self._hand_over(conn)
                else:
                    self.close(conn)
                return
            if self._received(conn, data) or conn.phase == CLOSED:
                return
            self._watch(conn, selectors.EVENT_READ)
            if not conn.tls_pending():
                return  # the poller reports the next bytes (TLS: bytes it has decrypted are not)

    def _received(self, conn: Conn, data: bytes) -> bool:
        """Buffer bytes of a request; True when the connection was handed to a thread."""
        if conn.phase == IDLE:
            self.deadlines.move(conn, READING, time.monotonic() + self.read_timeout)
        elif conn.phase == NEW:
            self.deadlines.move(conn, READING)  # its deadline counts from the accept
        conn.buf += data
        self.budget.hold(len(data))
        verdict = conn.scanner.scan(conn.buf)
        if verdict is framing.Verdict.MORE:
            if conn.scanner.expects_continue and not conn.continue_sent:
                self._send_continue(conn)
            return False
        problem = conn.scanner.problem
        if verdict is framing.Verdict.BAD_HEAD and problem is not None:
            # No thread: the parser would wait for the rest of a head it is bound to refuse.
            self.log.warning("Invalid request from ip=%s: %s", _peer(conn.client), problem)
            self._refuse(conn, refusals.refusal_for(problem, self.read_timeout))
            return True
        conn.whole = verdict is framing.Verdict.COMPLETE
        self._hand_over(conn)
        return True

    def _send_continue(self, conn: Conn) -> None:
        """`100 Continue` for a client waiting for it before sending its body (curl
        does for large bodies): the body is what the loop waits for."""
        conn.continue_sent = True
        try:
            sent = conn.sock.send(CONTINUE)
        except (OSError, ValueError):
            sent = 0
        if sent != len(CONTINUE):  # cannot happen on an empty send buffer; the client waits instead
            self.log.debug("could not send 100 Continue to %s", conn.client)
            if sent:
                self.close(conn)

    def _hand_over(self, conn: Conn) -> None:
        self._unwatch(conn)
        conn.handed, conn.buf = bytes(conn.buf), bytearray()
        self.budget.release(len(conn.handed))  # the thread takes the bytes over
        conn.busy_since, conn.thread_id = time.monotonic(), None
        conn.request_line = conn.handed.split(b"\r\n", 1)[0][:200].decode("latin-1")
        self.deadlines.move(conn, BUSY)
        self.hand_over(conn)

    # ---- back from a request thread ----------------------------------------------------

    def keep(self, conn: Conn, idle_secs: float) -> None:
        """Keep a connection a thread has answered for its next request, idle_secs at
        most until that request's first byte: its bytes are buffered here again."""
        try:
            conn.sock.setblocking(False)
        except OSError:
            self.close(conn)
            return
        # A request pipelined behind the last one may be in gunicorn's reader already.
        leftover = conn.parser.unreader.leftover()
        conn.next_request()
        self.deadlines.move(conn, IDLE, time.monotonic() + idle_secs)
        if leftover and (self._received(conn, leftover) or conn.phase == CLOSED):
            return
        self._watch(conn, selectors.EVENT_READ)
        if conn.tls_pending():
            self._read(conn)

    # ---- deadlines and closing ----------------------------------------------------------

    def _deadline_passed(self, conn: Conn) -> None:
        if conn.phase in (NEW, READING) and conn.handshaken:
            self.log.debug("no whole request from %s within %g s: 408", conn.client, self.read_timeout)
            self._refuse(conn, refusals.read_timeout(self.read_timeout))
        elif conn.phase in (NEW, IDLE, READING, CLOSING):
            self.close(conn)

    def _refuse(self, conn: Conn, refusal: refusals.Refusal) -> None:
        """Answer a request the loop refuses itself, and close. The answer is small: it
        fits an empty send buffer, so one non-blocking send sends it."""
        try:
            conn.sock.send(refusal.response())
        except (OSError, ValueError):
            pass  # best effort: the client may not be reading
        self.linger(conn)

    def linger(self, conn: Conn) -> None:
        """Close after the last answer: send FIN, read (and drop) what the client still
        sends until it closes, LINGER_SECS at most, so that the answer is not cut
        off by a reset (gunicorn's close_graceful, without blocking)."""
        self.budget.release(len(conn.buf))
        conn.buf = bytearray()
        try:
            conn.sock.setblocking(False)
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self.close(conn)
            return
        self.deadlines.move(conn, CLOSING, time.monotonic() + LINGER_SECS)
        self._watch(conn, selectors.EVENT_READ)

    def _drain(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:
            data = b""
        conn.lingered += len(data)
        if not data or conn.lingered >= LINGER_DRAIN_BYTES:
            self.close(conn)

    def close(self, conn: Conn) -> None:
        if conn.phase == CLOSED:
            return
        self._unwatch(conn)
        self.budget.release(len(conn.buf))
        conn.buf = bytearray()
        self.deadlines.move(conn, CLOSED)
        self.open.discard(conn)
        self.count -= 1
        util.close(conn.sock)

    # ---- stopping --------------------------------------------------------------------

    def close_idle_by(self, until: float) -> None:
        """A stopping worker's connections with no request yet close by `until` at the latest."""
        for conn in list(self.open):
            if conn.phase in (NEW, IDLE) and conn.deadline > until:
                self.deadlines.move(conn, conn.phase, until)

    def close_all_but_busy(self) -> None:
        for conn in list(self.open):
            if conn.phase != BUSY:
                self.close(conn)

    def busy(self) -> Iterator[Conn]:
        return (conn for conn in self.open if conn.phase == BUSY)

    def not_busy(self) -> Iterator[Conn]:
        return (conn for conn in self.open if conn.phase != BUSY)

    # ---- the poller ---------------------------------------------------------------------

    def _watch(self, conn: Conn, events: int) -> None:
        if conn.events == events:
            return
        if conn.events:
            self.poller.modify(conn.sock, events, conn.on_event)
        else:
            self.poller.register(conn.sock, events, conn.on_event)
        conn.events = events

    def _unwatch(self, conn: Conn) -> None:
        if conn.events:
            try:
                self.poller.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                pass
            conn.events = 0
