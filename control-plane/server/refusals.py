"""The answers gunicorn's worker gives by itself, as JSON like every other Corral error.

gunicorn refuses a request its parser cannot take (a request line or headers
over the limits, a malformed request line or header, a bad chunk) before the
application sees it, and answers in HTML. control-plane/server/worker.py answers with these
instead: `{"error": "..."}`, `Content-Type: application/json`, and the status
gunicorn would give (4xx when the client is at fault), always closing the
connection (where the next request would start is unknown).
"""
from __future__ import annotations

import json
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus

from gunicorn.http import errors as e

from corral.server import framing

# How much of the offending text an error message quotes.
QUOTE_CHARS = 80


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str
    client_error: bool = True  # False: the server's fault, logged with its traceback

    @property
    def reason(self) -> str:
        return HTTPStatus(self.status).phrase

    @property
    def body(self) -> bytes:
        return json.dumps({"error": self.message}).encode()

    def response(self) -> bytes:
        """The whole HTTP/1.1 answer, closing the connection."""
        body = self.body
        head = (f"HTTP/1.1 {self.status} {self.reason}\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        return head.encode("latin-1") + body


def _quote(value) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "..."


def read_timeout(timeout_secs: float) -> Refusal:
    """A client that took longer than the read timeout to send its request."""
    return Refusal(408, f"the request did not arrive within {timeout_secs:g} s (CORRAL_REQUEST_READ_TIMEOUT_SECS)")


INTERNAL = Refusal(500, "internal error; see the server log", client_error=False)


def _line_too_long(exc: e.LimitRequestLine) -> str:
    size = f" ({exc.size} bytes; at most {exc.max_size})" if exc.max_size else ""
    return f"the request line is too long{size}: use a shorter URL or query string"


# gunicorn's parse errors, most specific first: (classes, status, message).
CLIENT_ERRORS: list[tuple[tuple[type, ...], int, Callable[[Exception], str]]] = [
    ((e.LimitRequestLine,), 414, _line_too_long),
    ((e.LimitRequestHeaders,), 431, lambda exc: f"the request headers are too large or too many ({exc})"),
    ((e.InvalidRequestLine,), 400,
     lambda exc: f"malformed request line {_quote(exc.req)}: expected 'METHOD /path HTTP/1.1'"),
    ((e.InvalidRequestMethod,), 400, lambda exc: f"invalid HTTP method {_quote(exc.method)}"),
    ((e.InvalidHTTPVersion,), 400,
     lambda exc: f"unsupported HTTP version {_quote(exc.version)}: HTTP/1.0 and HTTP/1.1 are served"),
    ((e.ObsoleteFolding,), 400,
     lambda exc: f"header {_quote(exc.hdr)} is folded over several lines, which is not allowed"),
    ((e.InvalidHeaderName,), 400, lambda exc: f"invalid header name {_quote(exc.hdr)}"),
    ((e.InvalidHeader,), 400, lambda exc: f"invalid or conflicting header {_quote(exc.hdr)}"),
    ((e.UnsupportedTransferCoding,), 501,
     lambda exc: f"unsupported Transfer-Encoding {_quote(exc.hdr)}: only chunked is served"),
    ((framing.BodyTooLarge,), 413, lambda exc: "request body too large"),  # as the application says it
    ((e.InvalidChunkSize, e.ChunkMissingTerminator, e.InvalidChunkExtension), 400,
     lambda exc: f"malformed chunked body: {_quote(str(exc))}"),
    ((e.ExpectationFailed,), 417,
     lambda exc: f"unsupported Expect header {_quote(exc.expect)}: only 100-continue is served"),
    ((e.InvalidSchemeHeaders,), 400, lambda exc: "contradictory headers about the request's scheme (http or https)"),
    ((e.ForbiddenProxyRequest,), 403, lambda exc: "PROXY protocol headers are not accepted from this address"),
    ((e.InvalidProxyLine, e.InvalidProxyHeader), 400,
     lambda exc: f"malformed PROXY protocol header: {_quote(str(exc))}"),
    ((ssl.SSLError,), 400, lambda exc: "TLS error on this connection"),
    ((e.ParseException,), 400, lambda exc: f"malformed request: {_quote(str(exc))}"),
]


def refusal_for(exc: BaseException, read_timeout_secs: float) -> Refusal:
    """What to answer for an exception gunicorn's worker caught while reading a request."""
    if isinstance(exc, (e.InvalidResponseHeader, e.InvalidResponseHeaderName)):
        return INTERNAL  # the application's fault, not the client's
    if isinstance(exc, e.ConfigurationProblem):
        return Refusal(500, "the server is misconfigured; see the server log", client_error=False)
    if isinstance(exc, TimeoutError):
        return read_timeout(read_timeout_secs)
    for classes, status, message in CLIENT_ERRORS:
        if isinstance(exc, classes):
            return Refusal(status, message(exc))
    return INTERNAL
