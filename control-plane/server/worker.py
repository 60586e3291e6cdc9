"""Corral's gunicorn worker: gthread, except that a connection holds no request thread
until its whole request has arrived (a few hundred clients sending a byte at a time
would otherwise hold every thread, and the agents' lease renewals time out).

Its event loop accepts connections and runs them (control-plane/server/connections.py)
until a request is in; a request thread then serves it with gunicorn's parser over the
buffered bytes (control-plane/server/request_io.py). The bounds on what a client can
hold are in docs/security.md ("Slow clients hold no thread"). HTTP/2 is not served: TLS
offers only http/1.1 (ALPN) and h2c is never looked for.
"""
from __future__ import annotations

import errno
import faulthandler
import gc
import os
import selectors
import socket
import ssl
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from datetime import timedelta
from functools import partial

from gunicorn import sock as gunicorn_sock
from gunicorn import util
from gunicorn.http import errors as http_errors
from gunicorn.http.message import Request
from gunicorn.http.parser import RequestParser
from gunicorn.http.wsgi import Response, default_environ
from gunicorn.workers.gthread import ThreadWorker

from corral.server import framing, refusals
from corral.server.connection import BUSY, Conn
from corral.server.connections import Connections
from corral.server.http import DEFAULT_MAX_BODY_BYTES
from corral.server.request_io import ClientSocket, RequestReadTimeout, RequestUnreader
from corral.shared.settings import Setting

DEFAULT_READ_TIMEOUT_SECS = 10.0
REQUEST_READ_TIMEOUT = Setting(
    "CORRAL_REQUEST_READ_TIMEOUT_SECS", "read_timeout_secs", "float", DEFAULT_READ_TIMEOUT_SECS,
    "seconds a client may take to send one request (line, headers, body); past it `408` and the connection "
    "is closed", minimum=0.1, maximum=3600.0)
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
        # gthread's own count of connections (nr_conns) is not used: this one counts them.
        self.connections = Connections(self.poller, self.log, self.read_timeout, self._limits(), self.enqueue_req)
        self.poller.register(self.method_queue.fileno(), selectors.EVENT_READ, self.method_queue.run_callbacks)
        while self.alive:
            self.notify()
            self._update_accepting()
            self.wait_for_and_dispatch_events(timeout=self._wait_secs())
            if not self.is_parent_alive():
                break
            self.connections.after_events()
        self._stop()

    def _update_accepting(self) -> None:
        self.set_accept_enabled(self.connections.count < self.worker_connections
                                and time.monotonic() >= self.accept_paused_until)

    def _wait_secs(self) -> float:
        now = time.monotonic()
        wait = 1.0
        next_deadline = self.connections.next_deadline()
        if next_deadline is not None:
            wait = min(wait, next_deadline - now)
        if self.accept_paused_until > now:
            wait = min(wait, self.accept_paused_until - now)
        return max(0.0, wait)

    def _stop(self) -> None:
        """Graceful stop: no new connections; requests being read or served finish
        within graceful_timeout; connections with no request close soon."""
        self.set_accept_enabled(False)
        self.connections.close_idle_by(time.monotonic() + STOP_LINGER_SECS)
        give_up = time.monotonic() + self.cfg.graceful_timeout
        report_at = time.monotonic() + STOP_REPORT_SECS
        while self.connections.count > 0 and time.monotonic() < give_up:
            self.notify()
            self.wait_for_and_dispatch_events(timeout=min(self._wait_secs(), max(0.0, report_at - time.monotonic())))
            self.connections.after_events()
            if time.monotonic() >= report_at:
                report_at = time.monotonic() + STOP_REPORT_SECS
                self._report_busy()
        self.connections.close_all_but_busy()
        self.tpool.shutdown(wait=False)
        self.poller.close()
        self.method_queue.close()
        for listener in self.sockets:
            listener.close()

    def _report_busy(self) -> None:
        """Log the requests a stopping worker is still serving, with where each one is,
        and what else keeps it: the other connections' phases and time left."""
        now = time.monotonic()
        conns = self.connections
        others = sorted(f"{conn.phase} {conn.deadline - now:.1f}s" for conn in conns.not_busy())
        if others or conns.count != len(conns.open):
            self.log.warning("stopping: %d connection(s) open (%d known), not busy: %s", conns.count,
                             len(conns.open), ", ".join(others) or "none")
        frames = sys._current_frames()
        for conn in conns.busy():
            frame = frames.get(conn.thread_id) if conn.thread_id is not None else None
            where = "".join(traceback.format_stack(frame)[-8:]) if frame is not None else "(not started)\n"
            self.log.warning("stopping: still serving %r from %s for %.1fs, in:\n%s", conn.request_line,
                             conn.client, now - conn.busy_since, where.rstrip())

    # ---- accepting -----------------------------------------------------------------------

    def accept(self, listener) -> None:
        for _ in range(ACCEPTS_PER_EVENT):
            if self.connections.count >= self.worker_connections:
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
                                     exc.strerror, self.connections.count, ACCEPT_PAUSE_SECS)
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
        self.connections.add(sock, client, server)

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
            self.connections.linger(conn)
            return
        # A stopping worker keeps it no longer than those it had when told to stop (_stop):
        # a request answered as the stop began would otherwise hold the stop for a whole keepalive.
        idle = self.cfg.keepalive if self.alive else min(self.cfg.keepalive, STOP_LINGER_SECS)
        self.connections.keep(conn, idle)

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
