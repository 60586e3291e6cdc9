"""Corral's gunicorn worker: gthread, except that a connection holds no request
thread until its whole request has arrived.

gunicorn's gthread worker hands every accepted connection to a pool thread,
which reads the request with blocking reads: a few hundred clients sending
their headers a byte at a time hold every thread, and nothing else is served
(the agents' lease renewals time out, and every node stops its jobs). Here the
worker's event loop reads every connection without blocking into a buffer of
the connection's own until control-plane/server/framing.py says the request is complete
(the head, and a body up to the services' body limit, `Content-Length` or
chunked), and only then hands the connection with its bytes to a thread, where
gunicorn's parser reads them from that buffer. Keep-alive connections that
become readable again go through the same buffering; so does a TLS handshake
(non-blocking, in the loop).

Bounds on what a client can hold:

- its request (line, headers, body; a new connection's TLS handshake too)
  must arrive within CORRAL_REQUEST_READ_TIMEOUT_SECS: counted from the accept
  for a new connection, from the first byte of the request on a kept-alive one
  (which may stay idle for gunicorn's `keepalive` before that, and is then
  closed without an answer). Past it the client gets a JSON 408 and the
  connection is closed;
- in a request thread every blocking socket operation waits at most that long
  for progress: a body that was not buffered (over the body limit) is read
  until the request's deadline at most, and an answer is written to a client
  that keeps reading it, never to one that stopped;
- bytes buffered: 64 KiB per connection always; beyond that only while the
  worker's buffers hold less than `buffer_budget` in all. A connection over it
  is not read for a while (TCP holds its client back) until other requests
  have been handed over, within its own deadline;
- closing lingers (RFC 9112 9.6: the last answer must not be cut off by a
  reset) in the loop, at most LINGER_SECS, never in a thread or blocking.

gunicorn's own refusals (an oversize or malformed request line, bad headers, a
bad chunk) answer JSON (control-plane/server/refusals.py). A head that can only be refused (a
bare CR, a NUL, a header line without a colon...) is refused by the loop itself
as soon as the bad byte arrives, with the parser's error, and the connection
closed: the parser would wait for the end of the head first. HTTP/2 is not served: TLS offers
only http/1.1 (ALPN) and h2c is never looked for.
"""
from __future__ import annotations

import errno
import faulthandler
import gc
import heapq
import itertools
import os
import selectors
import socket
import ssl
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Mapping
from datetime import timedelta
from functools import partial

from gunicorn import sock as gunicorn_sock
from gunicorn import util
from gunicorn.http import errors as http_errors
from gunicorn.http.message import Request
from gunicorn.http.parser import RequestParser
from gunicorn.http.unreader import SocketUnreader
from gunicorn.http.wsgi import Response, default_environ
from gunicorn.workers.gthread import ThreadWorker
from werkzeug.exceptions import RequestTimeout

from corral.server import framing, refusals
from corral.server.http import DEFAULT_MAX_BODY_BYTES
from corral.shared.settings import Setting

DEFAULT_READ_TIMEOUT_SECS = 10.0
REQUEST_READ_TIMEOUT = Setting(
    "CORRAL_REQUEST_READ_TIMEOUT_SECS", "read_timeout_secs", "float", DEFAULT_READ_TIMEOUT_SECS,
    "seconds a client may take to send one request (line, headers, body); past it `408` and the connection "
    "is closed", minimum=0.1, maximum=3600.0)
RECV_BYTES = 64 * 1024
# Every connection may buffer this much whatever the others hold: heads and the
# bodies of submits, claims and leases fit, so those are never held back.
FREE_BUFFER_BYTES = 64 * 1024
# The least a worker's connections may buffer in all (at least 4 bodies at the limit).
MIN_BUFFER_BUDGET = 64 * 1024 * 1024
LINGER_SECS = 2.0
LINGER_DRAIN_BYTES = 64 * 1024
ACCEPTS_PER_EVENT = 32
# Out of file descriptors: accepting again at once would spin on the same error.
ACCEPT_PAUSE_SECS = 0.5
# A stopping worker still serves kept-alive connections this long (gthread's linger).
STOP_LINGER_SECS = 2.0
# A stopping worker still serving requests after this long says which, and where they
# are (their threads' stacks), then again every as long: a stop that hangs is explained.
STOP_REPORT_SECS = 5.0
# A worker not gone this long after SIGTERM writes every thread's stack to stderr
# (faulthandler): where its main thread is too, which the report of the requests
# still served cannot say when the loop itself is stuck.
STOP_DUMP_SECS = 8.0
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

# What a connection is doing, as the loop sees it.
NEW = "new"            # accepted (TLS: handshaking); no byte of a request yet
IDLE = "idle"          # kept alive after an answer; no byte of the next request yet
READING = "reading"    # part of a request is buffered
BUSY = "busy"          # a request thread has it
CLOSING = "closing"    # answered for the last time; lingering until the client closes
CLOSED = "closed"


def read_timeout_secs(env: Mapping[str, str] = os.environ) -> float:
    """CORRAL_REQUEST_READ_TIMEOUT_SECS: how long a client may take to send one request."""
    return REQUEST_READ_TIMEOUT.read(env)


def _check_request_line(cfg, line: bytes) -> None:
    """gunicorn's own check of a request line, with the server's settings: raises the
    error its parser raises for it (message.py's Request.parse_request_line, run on
    an empty request that holds only the settings it reads)."""
    request = Request.__new__(Request)
    request.cfg = cfg
    Request.parse_request_line(request, line)


def _peer(client) -> str:
    """The client's address for the log (a unix socket's peer has none)."""
    return str(client[0]) if isinstance(client, tuple) and client else ""


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

    def sendall(self, data, flags: int = 0) -> None:
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

    def __init__(self, sock, io_timeout: float):
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
        rest = self.take_buffered() + self._held[self._held_at:]
        self._held, self._held_at = b"", 0
        return rest

    def chunk(self, size_hint=None):
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
            return super().chunk(size_hint)
        except TimeoutError:
            raise RequestReadTimeout() from None
        finally:
            self.sock.settimeout(self.io_timeout)


class Conn:
    """One client connection: the loop's buffer and state, and what gunicorn's
    request handling uses (sock, client, server, parser)."""

    def __init__(self, sock, client, server, limits: framing.Limits, deadline: float, on_event):
        self.sock = sock
        self.client = client
        self.server = server
        self.parser: RequestParser | None = None
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


class BufferingWorker(ThreadWorker):
    """gthread, reading each request in the event loop before a thread serves it."""

    @classmethod
    def check_config(cls, cfg, log) -> None:
        super().check_config(cfg, log)
        if "h2" in cfg.http_protocols or cfg.http2_cleartext != "off":
            log.warning("HTTP/2 is not served by this worker: http_protocols and http2_cleartext are ignored")
        if getattr(cfg, "protocol", "http") != "http":
            log.warning("only HTTP is served by this worker: protocol = %r is ignored", cfg.protocol)

    def init_process(self) -> None:
        self.read_timeout = read_timeout_secs()
        self.ssl_context = self._ssl_context() if self.cfg.is_ssl else None
        self.conns: set[Conn] = set()
        self.timers: list = []  # (deadline, seq, conn, version), a heap
        self.timer_seq = itertools.count()
        self.paused: deque[Conn] = deque()
        self.buffered = 0
        self.accept_paused_until = 0.0
        super().init_process()  # loads the application, then run()

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        faulthandler.dump_traceback_later(STOP_DUMP_SECS)  # the process exits first, normally

    def _ssl_context(self) -> ssl.SSLContext:
        context = gunicorn_sock.ssl_context(self.cfg)
        context.set_alpn_protocols(["http/1.1"])  # never HTTP/2, whatever the config says
        return context

    def _limits(self) -> framing.Limits:
        cfg = self.cfg
        # gunicorn's parser caps the request line at 8190, and counts 0 as that too.
        request_line = cfg.limit_request_line if 0 < cfg.limit_request_line < 8190 else 8190
        fields = cfg.limit_request_fields if 0 < cfg.limit_request_fields <= 32768 else 32768
        field_size = cfg.limit_request_field_size if cfg.limit_request_field_size > 0 else 8190
        # The services' own body limit (control-plane/server/http.py sets it as Flask's MAX_CONTENT_LENGTH).
        config = getattr(self.wsgi, "config", None) or {}
        body = config.get("MAX_CONTENT_LENGTH") or DEFAULT_MAX_BODY_BYTES
        return framing.Limits(request_line=request_line,
                              head=framing.head_limit(request_line, fields, field_size),
                              body=body, chunk_line=field_size, trailers=fields * (field_size + 2) + 4,
                              obsolete_folding=bool(cfg.permit_obsolete_folding),
                              check_head=getattr(cfg, "proxy_protocol", "off") in ("off", False, None),
                              request_line_check=partial(_check_request_line, cfg))

    # ---- the event loop ----------------------------------------------------------------

    def run(self) -> None:
        # What the worker holds by now (modules, the app, the contract models and their
        # validators, the OpenAPI documents) lives as long as the process: moved out of
        # the collector's generations, it is no longer walked by every full collection,
        # a pause that otherwise lands in whichever request happens to trigger one.
        gc.freeze()
        self.limits = self._limits()
        self.buffer_budget = max(MIN_BUFFER_BUDGET, 4 * self.limits.body)
        self.poller.register(self.method_queue.fileno(), selectors.EVENT_READ, self.method_queue.run_callbacks)
        while self.alive:
            self.notify()
            self._update_accepting()
            self.wait_for_and_dispatch_events(timeout=self._wait_secs())
            if not self.is_parent_alive():
                break
            self._after_events()
        self._stop()

    def _update_accepting(self) -> None:
        self.set_accept_enabled(self.nr_conns < self.worker_connections
                                and time.monotonic() >= self.accept_paused_until)

    def _wait_secs(self) -> float:
        now = time.monotonic()
        wait = 1.0
        if self.timers:
            wait = min(wait, self.timers[0][0] - now)
        if self.accept_paused_until > now:
            wait = min(wait, self.accept_paused_until - now)
        return max(0.0, wait)

    def _after_events(self) -> None:
        now = time.monotonic()
        while self.timers and self.timers[0][0] <= now:
            _, _, conn, version = heapq.heappop(self.timers)
            if version == conn.version:  # else the connection moved on since
                self._deadline_passed(conn)
        self._resume_paused()

    def _stop(self) -> None:
        """Graceful stop: no new connections; requests being read or served finish
        within graceful_timeout; connections with no request close soon."""
        self.set_accept_enabled(False)
        linger_until = time.monotonic() + STOP_LINGER_SECS
        for conn in list(self.conns):
            if conn.phase in (NEW, IDLE) and conn.deadline > linger_until:
                self._set_phase(conn, conn.phase, linger_until)
        give_up = time.monotonic() + self.cfg.graceful_timeout
        report_at = time.monotonic() + STOP_REPORT_SECS
        while self.nr_conns > 0 and time.monotonic() < give_up:
            self.notify()
            self.wait_for_and_dispatch_events(timeout=min(self._wait_secs(), max(0.0, report_at - time.monotonic())))
            self._after_events()
            if time.monotonic() >= report_at:
                report_at = time.monotonic() + STOP_REPORT_SECS
                self._report_busy()
        for conn in list(self.conns):
            if conn.phase != BUSY:
                self._close(conn)
        self.tpool.shutdown(wait=False)
        self.poller.close()
        self.method_queue.close()
        for listener in self.sockets:
            listener.close()

    def _report_busy(self) -> None:
        """Log the requests a stopping worker is still serving, with where each one is,
        and what else keeps it: the other connections' phases and time left."""
        now = time.monotonic()
        others = sorted(f"{conn.phase} {conn.deadline - now:.1f}s" for conn in self.conns if conn.phase != BUSY)
        if others or self.nr_conns != len(self.conns):
            self.log.warning("stopping: %d connection(s) open (%d known), not busy: %s", self.nr_conns,
                             len(self.conns), ", ".join(others) or "none")
        frames = sys._current_frames()
        for conn in self.conns:
            if conn.phase != BUSY:
                continue
            frame = frames.get(conn.thread_id) if conn.thread_id is not None else None
            where = "".join(traceback.format_stack(frame)[-8:]) if frame is not None else "(not started)\n"
            self.log.warning("stopping: still serving %r from %s for %.1fs, in:\n%s", conn.request_line,
                             conn.client, now - conn.busy_since, where.rstrip())

    def _set_phase(self, conn: Conn, phase: str, deadline: float | None = None) -> None:
        """Move a connection on; its deadline stays unless a new one is given. Timers
        set before are void (a heap entry is only valid for the version it was set for)."""
        conn.phase = phase
        conn.version += 1
        if deadline is not None:
            conn.deadline = deadline
        if phase not in (BUSY, CLOSED):
            heapq.heappush(self.timers, (conn.deadline, next(self.timer_seq), conn, conn.version))

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

    # ---- accepting -----------------------------------------------------------------------

    def accept(self, listener) -> None:
        for _ in range(ACCEPTS_PER_EVENT):
            if self.nr_conns >= self.worker_connections:
                return
            try:
                raw, client = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.log.warning("cannot accept connections (%s): %d open; trying again in %.1f s",
                                     exc.strerror, self.nr_conns, ACCEPT_PAUSE_SECS)
                    self.accept_paused_until = time.monotonic() + ACCEPT_PAUSE_SECS
                    self.set_accept_enabled(False)
                    return
                raise
            self._open(raw, client, listener.getsockname())

    def _open(self, raw: socket.socket, client, server) -> None:
        try:
            sock = ClientSocket(fileno=raw.detach())
            sock.setblocking(False)
            if self.ssl_context is not None:
                sock = self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False,
                                                    suppress_ragged_eofs=self.cfg.suppress_ragged_eofs)
        except OSError as exc:  # the client is gone already
            self.log.debug("dropping a connection from %s: %s", client, exc)
            util.close(raw)
            return
        self.nr_conns += 1
        conn = Conn(sock, client, server, self.limits, 0.0, self._on_event)
        self.conns.add(conn)
        self._set_phase(conn, NEW, time.monotonic() + self.read_timeout)
        self._watch(conn, selectors.EVENT_READ)

    # ---- reading requests ---------------------------------------------------------------

    def _on_event(self, conn: Conn, _fileobj) -> None:
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
            self._close(conn)
            return False
        conn.handshaken = True
        self._watch(conn, selectors.EVENT_READ)
        return True

    def _read(self, conn: Conn) -> None:
        """Read what the client sent; hand the connection over once its request is in."""
        while True:
            if self._over_budget(conn):
                self._pause(conn)
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
                self._close(conn)
                return
            if not data:
                if conn.buf:
                    # The client stopped sending (half-closed) before its request was
                    # whole: the parser finds the end at once and answers if it can.
                    self._hand_over(conn)
                else:
                    self._close(conn)
                return
            if self._received(conn, data) or conn.phase == CLOSED:
                return
            self._watch(conn, selectors.EVENT_READ)
            if not self._tls_pending(conn):
                return  # the poller reports the next bytes (TLS: bytes it has decrypted are not)

    def _received(self, conn: Conn, data: bytes) -> bool:
        """Buffer bytes of a request; True when the connection was handed to a thread."""
        if conn.phase == IDLE:
            self._set_phase(conn, READING, time.monotonic() + self.read_timeout)
        elif conn.phase == NEW:
            self._set_phase(conn, READING)  # its deadline counts from the accept
        conn.buf += data
        self.buffered += len(data)
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
                self._close(conn)

    def _tls_pending(self, conn: Conn) -> bool:
        return isinstance(conn.sock, ssl.SSLSocket) and conn.handshaken and conn.sock.pending() > 0

    def _hand_over(self, conn: Conn) -> None:
        self._unwatch(conn)
        conn.handed, conn.buf = bytes(conn.buf), bytearray()
        self._release(len(conn.handed))  # the thread takes the bytes over
        conn.busy_since, conn.thread_id = time.monotonic(), None
        conn.request_line = conn.handed.split(b"\r\n", 1)[0][:200].decode("latin-1")
        self._set_phase(conn, BUSY)
        self.enqueue_req(conn)

    # ---- memory ------------------------------------------------------------------------

    def _over_budget(self, conn: Conn) -> bool:
        """Whether reading this connection must wait for others' buffers to empty
        (never when it is the only one holding bytes: it would wait for nothing)."""
        return (len(conn.buf) >= FREE_BUFFER_BYTES and self.buffered >= self.buffer_budget
                and self.buffered > len(conn.buf))

    def _pause(self, conn: Conn) -> None:
        self._unwatch(conn)
        if not conn.paused:
            conn.paused = True
            self.paused.append(conn)

    def _release(self, nbytes: int) -> None:
        self.buffered -= nbytes

    def _resume_paused(self) -> None:
        while self.paused and self.buffered < self.buffer_budget:
            conn = self.paused.popleft()
            conn.paused = False
            if conn.phase == READING:
                self._watch(conn, selectors.EVENT_READ)
                if self._tls_pending(conn):
                    self._read(conn)

    # ---- deadlines and closing ----------------------------------------------------------

    def _deadline_passed(self, conn: Conn) -> None:
        if conn.phase in (NEW, READING) and conn.handshaken:
            self.log.debug("no whole request from %s within %g s: 408", conn.client, self.read_timeout)
            self._refuse(conn, refusals.read_timeout(self.read_timeout))
        elif conn.phase in (NEW, IDLE, READING, CLOSING):
            self._close(conn)

    def _refuse(self, conn: Conn, refusal: refusals.Refusal) -> None:
        """Answer a request the loop refuses itself, and close. The answer is small: it
        fits an empty send buffer, so one non-blocking send sends it."""
        try:
            conn.sock.send(refusal.response())
        except (OSError, ValueError):
            pass  # best effort: the client may not be reading
        self._linger(conn)

    def _linger(self, conn: Conn) -> None:
        """Close after the last answer: send FIN, read (and drop) what the client still
        sends until it closes, LINGER_SECS at most, so that the answer is not cut
        off by a reset (gunicorn's close_graceful, without blocking)."""
        self._release(len(conn.buf))
        conn.buf = bytearray()
        try:
            conn.sock.setblocking(False)
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        self._set_phase(conn, CLOSING, time.monotonic() + LINGER_SECS)
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
            self._close(conn)

    def _close(self, conn: Conn) -> None:
        if conn.phase == CLOSED:
            return
        self._unwatch(conn)
        self._release(len(conn.buf))
        conn.buf = bytearray()
        self._set_phase(conn, CLOSED)
        self.conns.discard(conn)
        self.nr_conns -= 1
        util.close(conn.sock)

    # ---- back from a request thread ----------------------------------------------------

    def finish_request(self, conn: Conn, fs) -> None:
        """In the loop, after a thread served a request: keep the connection for the
        next one (its bytes buffered here again), or close it."""
        try:
            keep = bool(fs.result()) if not fs.cancelled() else False
        except Exception:
            keep = False
        if conn.phase != BUSY:
            return
        if not keep:
            self._linger(conn)
            return
        try:
            conn.sock.setblocking(False)
        except OSError:
            self._close(conn)
            return
        # A request pipelined behind the last one may be in gunicorn's reader already.
        leftover = conn.parser.unreader.leftover()
        conn.next_request()
        # A stopping worker keeps it no longer than those it had when told to stop (_stop):
        # a request answered as the stop began would otherwise hold the stop for a whole keepalive.
        idle = self.cfg.keepalive if self.alive else min(self.cfg.keepalive, STOP_LINGER_SECS)
        self._set_phase(conn, IDLE, time.monotonic() + idle)
        if leftover and (self._received(conn, leftover) or conn.phase == CLOSED):
            return
        self._watch(conn, selectors.EVENT_READ)
        if self._tls_pending(conn):
            self._read(conn)

    # ---- in a request thread ------------------------------------------------------------

    def handle(self, conn: Conn) -> bool:
        """Serve the request the loop buffered. Whether the connection stays open."""
        req = None
        conn.thread_id = threading.get_ident()
        try:
            conn.sock.settimeout(self.read_timeout)
            if conn.parser is None:
                conn.parser = RequestParser(self.cfg, conn.sock, conn.client)
                conn.parser.unreader = RequestUnreader(conn.sock, self.read_timeout)
            conn.parser.unreader.hold(conn.handed, conn.deadline)
            conn.handed = b""
            req = next(conn.parser)
            # The loop sent `100 Continue` itself when it waited for the body; a body
            # too large to buffer is refused unread, so the client need not send it.
            req._expected_100_continue = False
            if conn.scanner.problem is not None:  # the loop found the chunked body malformed
                self.handle_error(req, conn.sock, conn.client, conn.scanner.problem)
                return False
            if not conn.whole:
                req.force_close()  # the body is not all read: where the next request starts is unknown
            keepalive = self.handle_request(req, conn)
            try:
                return conn.whole and self._keepalive_after(conn, keepalive)
            except http_errors.ParseException:  # a malformed body the application did not read
                return False
        except http_errors.NoMoreData as exc:
            self.log.debug("Ignored premature client disconnection. %s", exc)
        except StopIteration as exc:
            self.log.debug("Closing connection. %s", exc)
        except (RequestReadTimeout, TimeoutError) as exc:
            # Reading the rest of a body, or writing an answer the client does not read.
            self.log.debug("timed out on %s: %s", conn.client, exc)
            if req is None or isinstance(exc, RequestReadTimeout):
                self._answer(conn.sock, refusals.read_timeout(self.read_timeout))
        except ssl.SSLError as exc:
            self.log.debug("TLS error on %s: %s", conn.client, exc)
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                self.log.debug("client %s went away: %s", conn.client, exc)
            else:
                self.log.exception("Socket error processing request.")
        except Exception as exc:
            self.handle_error(req, conn.sock, conn.client, exc)
        return False

    def handle_error(self, req, client, addr, exc) -> None:
        """gunicorn's refusal of a request it could not read, or its answer to an
        error outside the application: JSON (control-plane/server/refusals.py) instead of HTML."""
        addr = addr or ("", -1)  # a unix socket's peer
        refusal = refusals.refusal_for(exc, self.read_timeout)
        if refusal.client_error:
            self.log.warning("Invalid request from ip=%s: %s", addr[0], exc)
            if req is None and isinstance(exc, (http_errors.InvalidHeader, http_errors.InvalidHeaderName)):
                req = getattr(exc, "req", None)  # parsed far enough for the access log
        else:
            self.log.exception("Error handling request %s", getattr(req, "uri", "(no URI read)"))
        if req is not None and not isinstance(req, str):
            environ = default_environ(req, client, self.cfg)
            environ.update(REMOTE_ADDR=addr[0], REMOTE_PORT=str(addr[1]))
            resp = Response(req, client, self.cfg)
            resp.status = f"{refusal.status} {refusal.reason}"
            resp.response_length = len(refusal.body)
            self.log.access(resp, req, environ, timedelta(0))
        self._answer(client, refusal)

    def _answer(self, sock, refusal: refusals.Refusal) -> None:
        try:
            sock.sendall(refusal.response())
        except Exception:
            self.log.debug("Failed to send error message.")
