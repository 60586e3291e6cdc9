"""Slow and idle clients hold no request thread (control-plane/server/worker.py), their requests are
cut at CORRAL_REQUEST_READ_TIMEOUT_SECS with a JSON 408, and gunicorn's own refusals
answer JSON (control-plane/server/refusals.py). The framing logic (control-plane/server/framing.py) is checked on
its own first, then real servers (tests/cluster.py) under slow-client load."""
import heapq
import http.client
import json
import os
import random
import resource
import selectors
import signal
import socket
import ssl
import statistics
import threading
import time
from functools import partial

import pytest
import requests
from gunicorn.config import Config
from gunicorn.http import errors as e
from gunicorn.http.parser import RequestParser

from cluster import BIN, Cluster, Proc, base_env, listening_socket
from corral.server import framing, refusals, worker
from helpers import wait_for
from certs import make_certificates

LIMITS = framing.Limits(request_line=4094, head=framing.head_limit(4094, 100, 8190), body=1000,
                        request_line_check=partial(worker._check_request_line, Config()))
POST_HEAD = (b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"Content-Length: %d\r\n\r\n")
CHUNKED_HEAD = (b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")


def scan_bytewise(data: bytes) -> tuple[list[framing.Verdict], framing.RequestScanner]:
    """The verdict after each byte, as a client sending one byte at a time gets it
    (a few bytes at a time for long requests)."""
    step = max(1, len(data) // 5000)
    scanner, buf, verdicts = framing.RequestScanner(LIMITS), bytearray(), []
    for at in range(0, len(data), step):
        buf += data[at:at + step]
        verdicts.append(scanner.scan(buf))
    return verdicts, scanner


# ---- framing: when a request is whole --------------------------------------------------------

COMPLETE_REQUESTS = {
    "no body": b"GET /jobs/job-1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "an empty line first": b"\r\nGET /healthz HTTP/1.1\r\n\r\n",
    "sized body": POST_HEAD % 17 + b'{"command":"ls"}\n',
    "chunked body": CHUNKED_HEAD + b"5\r\n{\"com\r\nc;name=x\r\nmand\": \"ls\"}\r\n0\r\n\r\n",
    "chunked, trailers": CHUNKED_HEAD + b"2\r\n{}\r\n0\r\nX-Checksum: 1\r\n\r\n",
    "body at the limit": POST_HEAD % 1000 + b"x" * 1000,
}


@pytest.mark.parametrize("request_bytes", COMPLETE_REQUESTS.values(), ids=COMPLETE_REQUESTS.keys())
def test_a_request_is_whole_at_its_last_byte_and_not_before(request_bytes):
    verdicts, scanner = scan_bytewise(request_bytes)
    assert set(verdicts[:-1]) == {framing.Verdict.MORE}
    assert verdicts[-1] is framing.Verdict.COMPLETE and scanner.end == len(request_bytes)


def test_a_pipelined_request_ends_where_the_next_one_starts():
    first, second = COMPLETE_REQUESTS["sized body"], COMPLETE_REQUESTS["no body"]
    scanner = framing.RequestScanner(LIMITS)
    assert scanner.scan(first + second[:5]) is framing.Verdict.COMPLETE
    assert scanner.end == len(first)


def test_a_client_expecting_100_continue_is_noticed_once_its_head_is_in():
    head = POST_HEAD.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n") % 10
    scanner = framing.RequestScanner(LIMITS)
    assert scanner.scan(head) is framing.Verdict.MORE and scanner.expects_continue
    assert scanner.scan(head + b"x" * 10) is framing.Verdict.COMPLETE


HANDED_OVER = {  # the parser refuses these at once, or the body is over the limit (413)
    "request line too long": b"GET /" + b"a" * 4100,
    "head too long": b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 8000) for i in range(105)),
    "bare LF": b"GET / HTTP/1.1\nHost: x\n",
    "two lengths": b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    "a length that is no number": b"POST / HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n",
    "length and chunked": b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
    "gzip without chunked": b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
    "chunked on HTTP/1.0": b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
    "an unknown expectation": b"POST / HTTP/1.1\r\nExpect: lunch\r\nContent-Length: 5\r\n\r\n",
    "sized body over the limit": POST_HEAD % 1001,
}


@pytest.mark.parametrize("request_bytes", HANDED_OVER.values(), ids=HANDED_OVER.keys())
def test_a_request_the_parser_refuses_or_too_large_is_handed_over_without_waiting(request_bytes):
    verdicts, _ = scan_bytewise(request_bytes)
    assert verdicts[-1] is framing.Verdict.HAND_OVER
    assert framing.Verdict.COMPLETE not in verdicts


BAD_BODIES = {
    "bad size": (b"zz\r\n{}\r\n0\r\n\r\n", e.InvalidChunkSize),
    "negative size": (b"-2\r\n{}\r\n", e.InvalidChunkSize),
    "size line too long": (b"1" * 9000 + b"\r\n", e.InvalidChunkSize),
    "no terminator": (b"2\r\n{}XX", e.ChunkMissingTerminator),
    "bare CR in an extension": (b"2;a\rb\r\n", e.InvalidChunkExtension),
    "bad extension": (b"2;\x00\r\n", e.InvalidChunkExtension),
    "bare CR in a trailer": (b"2\r\n{}\r\n0\r\nX-Sum: 1\r2", e.InvalidHeader),
    "a trailer without a colon": (b"0\r\nX-Sum\r\n", e.InvalidHeader),
}


@pytest.mark.parametrize("body, error", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_a_malformed_chunked_body_is_refused_with_gunicorns_own_error(body, error):
    verdicts, scanner = scan_bytewise(CHUNKED_HEAD + body)
    assert framing.Verdict.BAD_BODY in verdicts and isinstance(scanner.problem, error)
    assert refusals.refusal_for(scanner.problem, 10).status == 400


# Heads gunicorn's parser refuses, but only once the whole head is in: each stops
# where the refusal is certain (the client may send nothing more).
BAD_HEADS = {
    "bare CR in a header": (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\rb", e.InvalidHeader),
    "bare CR ending a header line": (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\rX", e.InvalidHeader),
    "bare CR ending the request line": (b"GET /healthz HTTP/1.1\rH", e.InvalidRequestLine),
    "bare CR in the target": (b"GET /hea\rl", e.InvalidRequestLine),
    "bare CR in a header name": (b"GET / HTTP/1.1\r\nX-\rA", e.InvalidHeaderName),
    "NUL in the target": (b"GET /a\x00", e.InvalidRequestLine),
    "NUL in a header value": (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\x00", e.InvalidHeader),
    "escape in a header value": (b"GET / HTTP/1.1\r\nX-A: \x1b", e.InvalidHeader),
    "DEL in a header value": (b"GET / HTTP/1.1\r\nX-A: a\x7f", e.InvalidHeader),
    "a header without a colon": (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nno-colon\r\n", e.InvalidHeader),
    "a header without a name": (b"GET / HTTP/1.1\r\n:", e.InvalidHeader),
    "space in a header name": (b"GET / HTTP/1.1\r\nBad ", e.InvalidHeaderName),
    "a folded header line": (b"GET / HTTP/1.1\r\nX-A: a\r\n ", e.ObsoleteFolding),
    "white space before the first header": (b"GET / HTTP/1.1\r\n ", e.InvalidHeaderName),
    "an empty request line": (b"\r\n\r\n", e.InvalidRequestLine),
    "a lower-case method": (b"get /healthz HTTP/1.1\r\n", e.InvalidRequestMethod),
    "HTTP/2.0": (b"GET /healthz HTTP/2.0\r\n", e.InvalidHTTPVersion),
    "a target that is no path": (b"GET healthz HTTP/1.1\r\n", e.InvalidRequestLine),
    "a space too many": (b"GET /healthz HTTP/1.1 \r\n", e.InvalidHTTPVersion),
}


@pytest.mark.parametrize("head, error", BAD_HEADS.values(), ids=BAD_HEADS.keys())
def test_a_malformed_head_is_refused_at_its_first_bad_byte_as_gunicorns_parser_refuses_it(head, error):
    """Refused with the error gunicorn's parser gives once the head is whole (so the
    answer is the same whoever finds it), not left waiting for the rest of the head."""
    verdicts, scanner = scan_bytewise(head)
    assert verdicts[-1] is framing.Verdict.BAD_HEAD and set(verdicts[:-1]) <= {framing.Verdict.MORE}
    assert isinstance(scanner.problem, error), scanner.problem
    assert refusals.refusal_for(scanner.problem, 10).status == 400
    with pytest.raises(e.ParseException) as parsed:  # the parser refuses the same head ended
        next(RequestParser(Config(), iter([head + b"\r\n\r\n"]), ("127.0.0.1", 1)))
    assert refusals.refusal_for(parsed.value, 10).status == 400


ODD_GOOD_HEADS = {
    "tab, colon and latin-1 in values, an empty value": b"GET / HTTP/1.1\r\nX-A: a\tb:\xff\r\nX-B:\r\n\r\n",
    "an empty line first": b"\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    "no headers": b"GET / HTTP/1.0\r\n\r\n",
    "token characters in a name": b"GET / HTTP/1.1\r\nX!#$%&'*+-.^_`|~9: y\r\n\r\n",
    "HTTP/1.0 without a Host": b"GET /healthz?a=%00&b=%0d HTTP/1.0\r\nX-A: 1\r\n\r\n",
    "OPTIONS *": b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
    "an absolute URL": b"GET http://127.0.0.1:9001/healthz#x HTTP/1.1\r\n\r\n",
}


@pytest.mark.parametrize("head", ODD_GOOD_HEADS.values(), ids=ODD_GOOD_HEADS.keys())
def test_an_odd_head_the_parser_takes_is_not_refused(head):
    verdicts, scanner = scan_bytewise(head)
    assert verdicts[-1] is framing.Verdict.COMPLETE and scanner.problem is None
    next(RequestParser(Config(), iter([head]), ("127.0.0.1", 1)))


def test_a_folded_header_line_passes_where_gunicorn_permits_folding():
    limits = framing.Limits(request_line=4094, head=LIMITS.head, body=1000, obsolete_folding=True)
    head = b"GET / HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n"
    assert framing.RequestScanner(limits).scan(head) is framing.Verdict.COMPLETE
    assert framing.RequestScanner(limits).scan(head.replace(b" b", b" \x00")) is framing.Verdict.BAD_HEAD


@pytest.mark.parametrize("body", [b"3e8\r\n" + b"x" * 1000 + b"\r\n1\r\n", b"3e9\r\n", b"f" * 40 + b"\r\n"],
                         ids=["the last chunk", "the first chunk", "an absurd size"])
def test_a_chunked_body_over_the_limit_is_refused_413_at_the_chunk_size_that_takes_it_there(body):
    """As a sized body is from its Content-Length: the chunk's data is not waited for
    (it may never come, and the request would hold a thread until the read timeout)."""
    verdicts, scanner = scan_bytewise(CHUNKED_HEAD + body)
    assert verdicts[-1] is framing.Verdict.BAD_BODY and set(verdicts[:-1]) <= {framing.Verdict.MORE}
    assert isinstance(scanner.problem, framing.BodyTooLarge)
    refusal = refusals.refusal_for(scanner.problem, 10)
    assert (refusal.status, refusal.message) == (413, "request body too large")


# ---- refusals: JSON for every error gunicorn's parser raises -------------------------------

PARSE_ERRORS = [
    (e.LimitRequestLine(5000, 4094), 414), (e.LimitRequestHeaders("limit request headers fields"), 431),
    (e.InvalidRequestLine("GARBAGE"), 400), (e.InvalidRequestMethod("get"), 400),
    (e.InvalidHTTPVersion((2, 0)), 400), (e.InvalidHeader("CONTENT-LENGTH"), 400),
    (e.InvalidHeaderName("Bad Name"), 400), (e.ObsoleteFolding("X"), 400),
    (e.UnsupportedTransferCoding("br"), 501), (e.InvalidChunkSize(b"zz"), 400),
    (e.ChunkMissingTerminator(b"XX"), 400), (e.InvalidChunkExtension("bare CR"), 400),
    (e.ExpectationFailed("lunch"), 417), (e.InvalidSchemeHeaders(), 400),
    (e.InvalidProxyLine("PROXY x"), 400), (e.ForbiddenProxyRequest("10.0.0.1"), 403),
    (e.InvalidH2CPreface(b"PRI"), 400), (ssl.SSLError(1, "bad record"), 400),
]


@pytest.mark.parametrize("exc, status", PARSE_ERRORS, ids=[type(x).__name__ for x, _ in PARSE_ERRORS])
def test_each_refusal_of_the_parser_is_a_json_error_with_its_status(exc, status):
    answer = refusals.refusal_for(exc, 10).response()
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0].startswith(f"HTTP/1.1 {status} ")
    assert {"Connection: close", "Content-Type: application/json", f"Content-Length: {len(body)}"} <= set(lines)
    message = json.loads(body)["error"]
    assert message and "<" not in message, message


def test_an_application_error_outside_flask_is_a_500_and_not_blamed_on_the_client():
    for exc in (RuntimeError("boom"), e.InvalidResponseHeader("X-Bad")):
        refusal = refusals.refusal_for(exc, 10)
        assert (refusal.status, refusal.client_error) == (500, False)
        assert "boom" not in refusal.message


# ---- real servers -----------------------------------------------------------------------------

class _Unbuffered:
    """What http.client.HTTPResponse reads a socket through, without reading ahead."""

    def __init__(self, sock):
        self.sock = sock

    def makefile(self, mode: str, *args, **kwargs):
        return self.sock.makefile(mode, buffering=0)


class RawConnection:
    """A client socket that sends exactly the bytes given and reads whatever comes back."""

    def __init__(self, port: int, source: str = "127.0.0.1", timeout: float = 20.0, tls: ssl.SSLContext | None = None):
        self.sock = socket.socket()
        self.sock.bind((source, 0))
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        if tls is not None:
            self.sock = tls.wrap_socket(self.sock, server_hostname="127.0.0.1")

    def send(self, data: bytes) -> "RawConnection":
        self.sock.sendall(data)
        return self

    def read_until_closed(self) -> bytes:
        """Everything the server sends until it closes the connection."""
        chunks = []
        while True:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                return b"".join(chunks)
            chunks.append(data)

    def response(self) -> http.client.HTTPResponse:
        """The next answer on the connection (after any 1xx). Read unbuffered: a buffered
        reader would swallow the start of a pipelined answer that arrived with this one."""
        answer = http.client.HTTPResponse(_Unbuffered(self.sock))
        answer.begin()
        answer.body = answer.read()
        return answer

    def close(self) -> None:
        self.sock.close()


def json_refusal(data: bytes) -> tuple[int, str]:
    """(status, error message) of one whole answer that closes the connection."""
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert "Content-Type: application/json" in lines and "Connection: close" in lines, data
    return int(lines[0].split()[1]), json.loads(body)["error"]


class TunedCluster(Cluster):
    """A Cluster whose servers get extra gunicorn flags (`flags`)."""

    def __init__(self, tmp_path, flags: list[str] = (), **scheduler_env):
        super().__init__(tmp_path, **scheduler_env)
        self.flags = list(flags)

    def server_flags(self, name: str) -> list[str]:
        return self.flags


@pytest.fixture
def start_cluster(tmp_path, request):
    started = []

    def start(flags=(), agents=(), workers=2, **scheduler_env) -> Cluster:
        c = TunedCluster(tmp_path, flags, **scheduler_env)
        started.append(c)
        c.start_registry()
        c.start_scheduler(workers=workers)
        for node_id in agents:
            c.start_agent(node_id)
        if agents:
            c.wait_nodes_healthy(*agents)
        return c

    try:
        yield start
    finally:
        for c in started:
            failed = getattr(request.node, "rep_call", None)
            if failed is not None and failed.failed:
                print(c.logs())
            c.stop()


@pytest.fixture
def many_files():
    """Room for a thousand sockets in this process (CI's default soft limit may be 1024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard == resource.RLIM_INFINITY else min(hard, 8192)
    if soft < 3000 and wanted < 3000:
        pytest.skip(f"the open-files hard limit ({hard}) is too low for 1,000 client sockets and the servers'")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


READ_TIMEOUT = 1.5


@pytest.mark.e2e
def test_a_request_that_stalls_gets_a_json_408_and_is_closed_after_the_read_timeout(start_cluster):
    c = start_cluster(CORRAL_REQUEST_READ_TIMEOUT_SECS=READ_TIMEOUT)
    port = c.scheduler_port
    stalls = {
        "mid-request-line": b"POST /jo",
        "mid-headers": POST_HEAD[:40],
        "mid-body": POST_HEAD % 100 + b'{"command": ',
        "mid-chunked-body": CHUNKED_HEAD + b"10\r\n{\"comm",
        "nothing at all": b"",
    }
    started = time.monotonic()
    conns = {name: RawConnection(port).send(data) for name, data in stalls.items()}
    # A kept-alive connection that sends one byte of its next request and stops.
    kept = RawConnection(port).send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert kept.response().status == 200
    kept_started = time.monotonic()
    conns["one byte of the next request"] = kept.send(b"G")
    try:
        answers = {name: (conn.read_until_closed(), time.monotonic()) for name, conn in conns.items()}
    finally:
        for conn in conns.values():
            conn.close()
    for name, (data, closed_at) in answers.items():
        status, message = json_refusal(data)
        assert status == 408 and "CORRAL_REQUEST_READ_TIMEOUT_SECS" in message, (name, data)
        since = kept_started if name.startswith("one byte") else started
        assert READ_TIMEOUT - 0.1 <= closed_at - since <= READ_TIMEOUT + 2.5, (name, closed_at - since)


@pytest.mark.e2e
def test_an_idle_kept_alive_connection_is_closed_silently_after_the_keepalive_timeout(start_cluster, tmp_path):
    # gunicorn's keepalive from a config file (the default's 15 s, test_infra.py, would make a slow test).
    config = tmp_path / "keepalive.conf.py"
    config.write_text("keepalive = 3\n")
    c = start_cluster(["--gunicorn-config", str(config)], CORRAL_REQUEST_READ_TIMEOUT_SECS=READ_TIMEOUT)
    conn = RawConnection(c.scheduler_port).send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    try:
        assert conn.response().status == 200
        idle_since = time.monotonic()
        assert conn.read_until_closed() == b""  # closed, with nothing sent: no request was under way
        assert 3 - 0.1 <= time.monotonic() - idle_since <= 3 + 2.5
    finally:
        conn.close()


REFUSED = {
    "request line over 4094 bytes": (b"GET /jobs?" + b"a" * 5000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 414),
    "a header over 8190 bytes": (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
                                 431),
    "over 100 headers": (b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(120)) + b"\r\n",
                         431),
    "head past the header buffer": (b"GET /healthz HTTP/1.1\r\n"
                                    + b"".join(b"X-%d: %s\r\n" % (i, b"b" * 8000) for i in range(105)), 431),
    "malformed request line": (b"GARBAGE\r\n\r\n", 400),
    "lower-case method": (b"get /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400),
    "HTTP/2.0 request line": (b"GET /healthz HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n", 400),
    "space in a header name": (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Name: x\r\n\r\n", 400),
    "bare LF": (b"GET /healthz HTTP/1.1\nHost: 127.0.0.1\n\n", 400),
    "two Content-Lengths": (POST_HEAD.replace(b"\r\n\r\n", b"\r\nContent-Length: 3\r\n\r\n") % 2 + b"{}", 400),
    "unknown transfer coding": (CHUNKED_HEAD.replace(b"chunked", b"br, chunked"), 501),
    "invalid chunk size": (CHUNKED_HEAD + b"zz\r\n{}\r\n0\r\n\r\n", 400),
    "missing chunk terminator": (CHUNKED_HEAD + b"2\r\n{}XX0\r\n\r\n", 400),
    "an unknown expectation": (POST_HEAD.replace(b"\r\n\r\n", b"\r\nExpect: lunch\r\n\r\n") % 2 + b"{}", 417),
}


@pytest.mark.e2e
def test_a_malformed_head_is_refused_at_once_not_at_the_read_timeout(start_cluster):
    """A head that can only be refused (a bare CR, a NUL, a header without a colon, a
    folded line) gets its JSON 400 as soon as the bad byte arrives, though the head
    never ends, and the connection is closed: the client waits for no timeout. So
    does a chunked body's trailer section."""
    c = start_cluster(CORRAL_REQUEST_READ_TIMEOUT_SECS=60)
    stalled = {name: head for name, (head, _) in BAD_HEADS.items()}
    stalled["bare CR in a trailer"] = CHUNKED_HEAD + b"2\r\n{}\r\n0\r\nX-Sum: 1\r2"
    conns = {name: RawConnection(c.scheduler_port, timeout=30) for name in stalled}
    try:
        started = time.monotonic()
        for name, conn in conns.items():
            conn.send(stalled[name])
        answers = {name: conn.read_until_closed() for name, conn in conns.items()}
        took = time.monotonic() - started
    finally:
        for conn in conns.values():
            conn.close()
    for name, data in answers.items():
        assert json_refusal(data)[0] == 400, (name, data)
    assert took < 20, f"answered after {took:.1f} s, as if waiting for the rest of the heads"
    assert requests.get(c.scheduler_url + "/healthz", timeout=10).status_code == 200


@pytest.mark.e2e
def test_gunicorns_own_refusals_answer_json(start_cluster):
    c = start_cluster()
    failures = []
    for name, (data, status) in REFUSED.items():
        conn = RawConnection(c.scheduler_port).send(data)
        try:
            answer = conn.read_until_closed()
        finally:
            conn.close()
        try:
            got, message = json_refusal(answer)
            assert got == status and message, (got, message)
        except (AssertionError, ValueError) as exc:
            failures.append(f"{name}: {exc!r} {answer[:300]!r}")
    assert not failures, "\n".join(failures)
    assert requests.get(c.scheduler_url + "/jobs", timeout=5).json() == []  # nothing was stored
    assert "Traceback" not in c.procs["scheduler"].output()


@pytest.mark.e2e
def test_pipelined_requests_100_continue_and_a_body_over_the_limit(start_cluster):
    c = start_cluster()
    port = c.scheduler_port
    # Two requests in one write, and one byte of a third: all served in order.
    health = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    conn = RawConnection(port).send(health + POST_HEAD % 17 + b'{"command":"ls"}\n' + health[:1])
    try:
        assert conn.response().status == 200
        assert conn.response().status == 201
        conn.send(health[1:])
        assert conn.response().status == 200
    finally:
        conn.close()
    # A client that waits for `100 Continue` before its body gets it, then its answer.
    conn = RawConnection(port).send(POST_HEAD.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n") % 17)
    try:
        assert conn.sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        answer = conn.send(b'{"command":"ls"}\n').response()
        assert answer.status == 201 and json.loads(answer.body)["command"] == "ls"
    finally:
        conn.close()
    # A body over the limit is refused from its head, without waiting for the body.
    conn = RawConnection(port, timeout=5).send(POST_HEAD % (3 * 1024 * 1024))
    try:
        answer = conn.response()
        assert answer.status == 413 and json.loads(answer.body) == {"error": "request body too large"}
        assert answer.getheader("Connection") == "close"
    finally:
        conn.close()


# ---- slow clients against few threads: none of them holds one ---------------------------------

def slow_mix(port: int, count: int, tls: ssl.SSLContext | None = None) -> list[RawConnection]:
    """`count` connections stalled in different places: sent nothing, part of a head,
    a head and part of its body."""
    stalls = [b"", b"P", POST_HEAD[:30], POST_HEAD % 50 + b'{"comm']
    return [RawConnection(port, tls=tls).send(stalls[i % len(stalls)]) for i in range(count)]


def serve(tmp_path, script: str, flags: list[str], **env) -> tuple[Proc, int]:
    sock = listening_socket()
    port = sock.getsockname()[1]
    argv = [os.path.join(BIN, script), "--bind", f"fd://{sock.fileno()}", *flags]
    proc = Proc(script, argv, base_env(str(tmp_path / "state"), **env), str(tmp_path / f"{script}.log"),
                pass_fds=(sock.fileno(),))
    sock.close()
    return proc, port


@pytest.mark.e2e
def test_slow_clients_hold_no_thread_of_a_small_server(start_cluster):
    c = start_cluster(flags=["--threads", "4"], workers=1)
    slow = slow_mix(c.scheduler_port, 40)  # ten times the threads
    try:
        session = requests.Session()
        for _ in range(20):
            started = time.monotonic()
            job = session.post(c.scheduler_url + "/jobs", json={"command": "true"}, timeout=5)
            assert job.status_code == 201, job.text
            assert session.get(f"{c.scheduler_url}/jobs/{job.json()['job_id']}", timeout=5).ok
            assert time.monotonic() - started < 1.0
    finally:
        for conn in slow:
            conn.close()


@pytest.mark.e2e
def test_a_client_that_does_not_read_its_answer_frees_the_thread(start_cluster):
    c = start_cluster(flags=["--threads", "2"], workers=1, CORRAL_REQUEST_READ_TIMEOUT_SECS=2)
    for _ in range(5):  # 8 MB of jobs: more than the kernel buffers between a server and a client
        batch = {"jobs": [{"command": "true # " + "x" * 12_000} for _ in range(130)]}
        assert requests.post(c.scheduler_url + "/jobs/batch", json=batch, timeout=30).status_code == 201
    # Two clients ask for a large page and read nothing of it: each holds a thread
    # in a send that makes no progress.
    stuck = []
    for _ in range(2):
        conn = socket.socket()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.connect(("127.0.0.1", c.scheduler_port))
        conn.sendall(b"GET /jobs?limit=1000 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        stuck.append(conn)
    try:
        started = time.monotonic()
        answer = requests.get(c.scheduler_url + "/healthz", timeout=15)
        assert answer.status_code == 200
        assert time.monotonic() - started < 2 + 3  # the read timeout bounds each send too
    finally:
        for conn in stuck:
            conn.close()


@pytest.mark.e2e
def test_tls_is_served_and_slow_tls_clients_hold_no_thread(tmp_path):
    ca, cert, key = make_certificates(tmp_path)
    proc, port = serve(tmp_path, "corral-scheduler", ["--workers", "1", "--threads", "4", "--certfile", cert,
                                                      "--keyfile", key], CORRAL_REQUEST_READ_TIMEOUT_SECS=3)
    url = f"https://127.0.0.1:{port}"
    trusting = ssl.create_default_context(cafile=ca)
    slow: list = []
    try:
        wait_for(lambda: requests.get(url + "/healthz", verify=ca, timeout=2).ok, timeout=30,
                 message="the scheduler to answer over TLS")
        # Stalled before, during and after the handshake: TCP only, half a ClientHello,
        # and a finished handshake with part of a request.
        slow += [RawConnection(port) for _ in range(10)]
        hello = client_hello(trusting)
        slow += [RawConnection(port).send(hello[:len(hello) // 2]) for _ in range(10)]
        slow += slow_mix(port, 12, tls=trusting)
        session = requests.Session()
        for _ in range(10):
            started = time.monotonic()
            job = session.post(url + "/jobs", json={"command": "true"}, verify=ca, timeout=5)
            assert job.status_code == 201, job.text
            assert time.monotonic() - started < 1.0
        # HTTP/2 stays off: a client offering it gets HTTP/1.1.
        offering = ssl.create_default_context(cafile=ca)
        offering.set_alpn_protocols(["h2", "http/1.1"])
        alpn = RawConnection(port, tls=offering)
        assert alpn.sock.selected_alpn_protocol() == "http/1.1"
        alpn.close()
        # A stalled TLS request is answered 408 over TLS, then closed.
        status, _ = json_refusal(slow[-1].read_until_closed())
        assert status == 408
    finally:
        for conn in slow:
            conn.close()
        assert proc.stop() == 0, proc.output()
    assert "Traceback" not in proc.output()


def client_hello(context: ssl.SSLContext) -> bytes:
    """The first bytes a TLS client sends (its ClientHello), made without a socket."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def worker_rss_bytes(master_pid: int) -> int:
    """Resident memory of the one worker of a gunicorn master."""
    with open(f"/proc/{master_pid}/task/{master_pid}/children") as f:
        (worker,) = f.read().split()
    with open(f"/proc/{worker}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def unread_by_server(port: int) -> int:
    """Bytes sent to the server on `port` and not read by it yet: in its connections'
    receive queues, and still in its clients' send queues (/proc/net/tcp)."""
    total = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if fields[3] != "01":  # ESTABLISHED
                continue
            tx_queue, rx_queue = (int(n, 16) for n in fields[4].split(":"))
            if int(fields[1].split(":")[1], 16) == port:
                total += rx_queue
            elif int(fields[2].split(":")[1], 16) == port:
                total += tx_queue
    return total


@pytest.mark.e2e
def test_buffered_bodies_are_bounded_in_memory_and_small_requests_still_pass(start_cluster, many_files):
    c = start_cluster(workers=1, CORRAL_REQUEST_READ_TIMEOUT_SECS=8)
    port, size = c.scheduler_port, 1_900_000
    before = worker_rss_bytes(c.procs["scheduler"].pid)
    # 100 bodies of 1.9 MB each (190 MB), all stalled 1 KB short of their end: sent
    # for as long as the kernel takes them.
    stalled = [RawConnection(port) for _ in range(100)]
    unsent = {conn: memoryview(POST_HEAD % size + b" " * (size - 1000)) for conn in stalled}
    sent = sum(len(data) for data in unsent.values())
    with selectors.DefaultSelector() as selector:
        for conn in stalled:
            conn.sock.setblocking(False)
            selector.register(conn.sock, selectors.EVENT_WRITE, conn)
        while unsent:
            ready = selector.select(timeout=1.0)
            if not ready:
                break
            for key, _ in ready:
                conn = key.data
                unsent[conn] = unsent[conn][conn.sock.send(unsent[conn]):]
                if not unsent[conn]:
                    del unsent[conn]
                    selector.unregister(conn.sock)
    sent -= sum(len(data) for data in unsent.values())
    for conn in stalled:
        conn.sock.setblocking(True)
    try:
        # For 2 s the worker reads at most its budget (64 MiB) and 64 KiB per connection.
        most_read, window_ends = 0, time.monotonic() + 2
        while time.monotonic() < window_ends:
            most_read = max(most_read, sent - unread_by_server(port))
            time.sleep(0.1)
        assert most_read <= (64 << 20) + 100 * (64 << 10) + (4 << 20), f"{most_read >> 20} MB read of {sent >> 20}"
        grown = worker_rss_bytes(c.procs["scheduler"].pid) - before
        assert grown < 120 << 20, f"the worker grew by {grown >> 20} MB"
        # Small requests are never held back, however full the buffers are.
        started = time.monotonic()
        assert requests.post(c.scheduler_url + "/jobs", json={"command": "true"}, timeout=5).status_code == 201
        assert time.monotonic() - started < 1.0
        # A large request arriving now is read once the stalled ones are cut (408).
        body = json.dumps({"command": "true", "name": "x" * (size - 40)}).encode()
        big = RawConnection(port, timeout=20).send(POST_HEAD % len(body) + body)
        answer = big.response()
        assert answer.status != 408 and json.loads(answer.body), answer.body[:200]
        big.close()
    finally:
        for conn in stalled:
            conn.close()


# ---- a thousand slow connections against the default server ------------------------------------

SLOW_KINDS = ("silent", "one byte", "headers a byte at a time", "body a byte at a time")
TRICKLED_HEAD = POST_HEAD % 1000


class Background:
    """Runs `_run` on a daemon thread from start() until stop() (`_stop` is set)."""

    def __init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        raise NotImplementedError


class SlowClients(Background):
    """`count` connections to `port` from several loopback addresses, each stalling in
    one of SLOW_KINDS (a byte every 1.5-3 s for the trickling ones). One the server
    closes (its read timeout) is opened again, so `count` stay open until stop()."""

    OPEN_PER_ROUND = 10  # while ramping up, every 50 ms: 200 a second

    def __init__(self, port: int, count: int, sources: list[str]):
        super().__init__()
        self.port, self.count, self.sources = port, count, sources
        self.selector = selectors.DefaultSelector()
        self.socks: dict[int, socket.socket] = {}
        self.progress: dict[int, int] = {}
        self.due: list[tuple[float, int]] = []
        self.opened = self.timeouts = self.connect_failures = 0
        # Connection-seconds open after the ramp, and the seconds measured: their ratio
        # is how many were open on average (the server closes each one at its header
        # deadline and it is opened again at once; a busy machine slows the reopening,
        # so a single low sample says more about this thread than about the server).
        self.open_seconds = self.measured_seconds = 0.0
        self._last_sample: float | None = None
        self.ramped = threading.Event()

    @property
    def mean_open(self) -> float:
        return self.open_seconds / self.measured_seconds if self.measured_seconds else 0.0

    def stop(self) -> None:
        super().stop()
        for sock in self.socks.values():
            sock.close()
        self.socks.clear()
        self.selector.close()

    def _open(self, index: int) -> None:
        sock = socket.socket()
        try:
            sock.bind((self.sources[index % len(self.sources)], 0))
            sock.settimeout(5)
            sock.connect(("127.0.0.1", self.port))
            kind = SLOW_KINDS[index % len(SLOW_KINDS)]
            first = {"silent": b"", "one byte": b"P", "headers a byte at a time": TRICKLED_HEAD[:1],
                     "body a byte at a time": TRICKLED_HEAD}[kind]
            sock.sendall(first)
        except OSError:
            sock.close()
            self.connect_failures += 1
            return
        sock.setblocking(False)
        self.socks[index] = sock
        self.progress[index] = len(first)
        self.selector.register(sock, selectors.EVENT_READ, index)
        self.opened += 1
        if SLOW_KINDS[index % len(SLOW_KINDS)] in ("headers a byte at a time", "body a byte at a time"):
            heapq.heappush(self.due, (time.monotonic() + random.uniform(1.5, 3.0), index))

    def _trickle(self, index: int) -> None:
        sock = self.socks.get(index)
        if sock is None:
            return
        sent = self.progress[index]
        byte = TRICKLED_HEAD[sent:sent + 1] if sent < len(TRICKLED_HEAD) else b"x"
        try:
            sock.send(byte)
            self.progress[index] = sent + 1
        except OSError:
            return
        heapq.heappush(self.due, (time.monotonic() + random.uniform(1.5, 3.0), index))

    def _closed_by_server(self, index: int) -> None:
        sock = self.socks.pop(index)
        try:
            data = sock.recv(4096)
        except OSError:
            data = b""
        if data.startswith(b"HTTP/1.1 408 "):
            self.timeouts += 1
        self.selector.unregister(sock)
        sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.ramped.is_set():  # before opening again those the server closed
                sampled = time.monotonic()
                if self._last_sample is not None:
                    self.open_seconds += len(self.socks) * (sampled - self._last_sample)
                    self.measured_seconds += sampled - self._last_sample
                self._last_sample = sampled
            # Opened over about 5 s at first, so that their deadlines are spread out
            # as a real crowd's are; then each one closed is opened again at once.
            missing = [i for i in range(self.count) if i not in self.socks]
            for index in missing if self.ramped.is_set() else missing[:self.OPEN_PER_ROUND]:
                self._open(index)
            if len(self.socks) >= self.count:
                self.ramped.set()
            now = time.monotonic()
            while self.due and self.due[0][0] <= now:
                self._trickle(heapq.heappop(self.due)[1])
            for key, _ in self.selector.select(timeout=0.05):
                self._closed_by_server(key.data)


class Latencies(Background):
    """Calls made over and over on one keep-alive connection, each one timed."""

    def __init__(self, port: int, name: str, call, interval: float):
        super().__init__()
        self.port, self.name, self.call, self.interval = port, name, call, interval
        self.seconds: list[float] = []
        self.errors: list[str] = []

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.call(conn)
                self.seconds.append(time.monotonic() - started)
            except Exception as exc:  # counted, and the next call reconnects
                self.errors.append(repr(exc))
                conn.close()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))
        conn.close()

    def p(self, quantile: float) -> float:
        ordered = sorted(self.seconds)
        return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]

    def summary(self) -> str:
        return (f"{self.name}: {len(self.seconds)} calls, p50 {statistics.median(self.seconds) * 1000:.1f} ms, "
                f"p99 {self.p(0.99) * 1000:.1f} ms, max {max(self.seconds) * 1000:.1f} ms")


def call_json(conn: http.client.HTTPConnection, method: str, path: str, body=None, expect: int = 200):
    conn.request(method, path, body=None if body is None else json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"} if body is not None else {})
    answer = conn.getresponse()
    data = answer.read()
    assert answer.status == expect, (method, path, answer.status, data[:200])
    return json.loads(data)


SLOW_CONNECTIONS = 1000
MEASURE_SECS = 25


@pytest.mark.e2e
def test_a_thousand_slow_connections_leave_submits_reads_claims_and_leases_fast(start_cluster, many_files,
                                                                                shared_dir):
    c = start_cluster(agents=["steady"])
    port = c.scheduler_port
    release = os.path.join(shared_dir, "release")
    long_job = c.submit(command=f"while [ ! -e {release} ]; do sleep 0.2; done")
    c.wait_status(long_job["job_id"], "running")
    submitted: list[str] = []

    def submit_and_read(conn):
        submitted.append(call_json(conn, "POST", "/jobs", {"command": "true"}, expect=201)["job_id"])

    def read(conn):
        if submitted:
            call_json(conn, "GET", f"/jobs/{submitted[-1]}")

    def claim(conn):  # the running agent's node: its slot is taken, so nothing is handed out
        assert call_json(conn, "POST", "/nodes/steady/claim", {"max": 1, "wait_secs": 0}) == []

    sources = [f"127.0.0.{i}" for i in range(2, 10)]
    slow = SlowClients(port, SLOW_CONNECTIONS, sources).start()
    measured: list[Latencies] = []
    try:
        assert slow.ramped.wait(60), f"only {len(slow.socks)} slow connections opened"
        measured = [Latencies(port, "POST /jobs", submit_and_read, 0.1).start(),
                    Latencies(port, "GET /jobs/{id}", read, 0.1).start(),
                    Latencies(port, "POST /nodes/{id}/claim", claim, 0.1).start()]
        deadline = time.monotonic() + MEASURE_SECS
        while time.monotonic() < deadline:
            assert c.job(long_job["job_id"])["status"] == "running"
            time.sleep(1)
    finally:
        for latencies in measured:
            latencies.stop()
        slow.stop()
    print(f"\n{SLOW_CONNECTIONS} slow connections from {len(sources)} addresses; {slow.opened} opened in all, "
          f"{slow.timeouts} answered 408, {slow.mean_open:.0f} open on average")
    for latencies in measured:
        print(latencies.summary())
    assert slow.mean_open >= SLOW_CONNECTIONS * 0.95 and slow.connect_failures == 0
    assert slow.timeouts > SLOW_CONNECTIONS  # the server read them all, and cut each at its deadline
    for latencies in measured:
        assert not latencies.errors, (latencies.name, latencies.errors[:5])
        assert len(latencies.seconds) > MEASURE_SECS * 5, latencies.summary()
        assert latencies.p(0.99) < 0.1, latencies.summary()
    # The agent kept its lease all along: the job ran once, to its end, never fenced or requeued.
    open(release, "w").close()
    done = c.wait_status(long_job["job_id"], "done", "failed", timeout=30)
    assert (done["status"], done["attempt"], done["retry_count"], done["node_losses"]) == ("done", 1, 0, 0), done
    events = c.events(long_job["job_id"])
    moves = [(ev["from"], ev["to"]) for ev in events]
    assert moves.count(("pending", "running")) == 1 and moves[-1] == ("running", "done"), events
    assert ("running", "pending") not in moves and {ev["attempt"] for ev in events[1:]} == {1}, events


SLOW_APP = '''
import os, time

def app(environ, start_response):
    # Busy until the test lets it go: a request a stopping worker has to wait for.
    open(os.environ["BUSY_FILE"], "w").close()
    while not os.path.exists(os.environ["RELEASE_FILE"]):
        time.sleep(0.05)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"done"]
'''


@pytest.mark.e2e
def test_a_stopping_worker_says_which_requests_it_still_waits_for_and_where_they_are(tmp_path):
    (tmp_path / "slow_app.py").write_text(SLOW_APP)
    release, busy = tmp_path / "release", tmp_path / "busy"
    sock = listening_socket()
    port = sock.getsockname()[1]
    argv = [os.path.join(BIN, "gunicorn"), "--chdir", str(tmp_path), "--worker-class",
            "corral.server.worker.BufferingWorker", "--workers", "1", "--threads", "2", "--no-control-socket",
            "--bind", f"fd://{sock.fileno()}", "slow_app:app"]
    env = {**os.environ, "RELEASE_FILE": str(release), "BUSY_FILE": str(busy)}
    proc = Proc("gunicorn", argv, env, str(tmp_path / "gunicorn.log"), pass_fds=(sock.fileno(),))
    sock.close()
    answers = []
    try:
        wait_for(lambda: "Booting worker" in proc.output(), message="the worker to boot")
        client = threading.Thread(target=lambda: answers.append(
            requests.get(f"http://127.0.0.1:{port}/slow?x=1", timeout=30)))
        client.start()
        wait_for(busy.exists, message="the request to be served")
        proc.signal(signal.SIGTERM)
        wait_for(lambda: "stopping: still serving 'GET /slow?x=1 HTTP/1.1'" in proc.output(), timeout=15,
                 message="the stopping worker to name the request it waits for")
        report = proc.output()
        assert "slow_app.py" in report and "time.sleep(0.05)" in report, report  # where it is
        # Still not gone: every thread's stack, the worker's main loop among them.
        wait_for(lambda: "(most recent call first)" in proc.output(), timeout=15,
                 message="the stopping worker to dump its threads")
        assert "wait_for_and_dispatch_events" in proc.output() or "_stop" in proc.output(), proc.output()
        release.touch()
        client.join(10)
        assert answers and answers[0].status_code == 200 and answers[0].text == "done"
        proc.popen.wait(10)
        assert proc.popen.returncode == 0, proc.output()
    finally:
        release.touch()
        proc.stop()


@pytest.mark.e2e
def test_a_connection_answered_as_the_stop_began_holds_the_stop_no_longer_than_the_others(tmp_path):
    """A request served when SIGTERM came is answered, and its connection, kept alive
    after that answer, is closed within the stop's linger (STOP_LINGER_SECS), not after
    the keepalive: a stop never waits out a client's idle connection."""
    (tmp_path / "slow_app.py").write_text(SLOW_APP)
    (tmp_path / "keepalive.conf.py").write_text("keepalive = 60\ngraceful_timeout = 60\n")
    release, busy = tmp_path / "release", tmp_path / "busy"
    sock = listening_socket()
    port = sock.getsockname()[1]
    argv = [os.path.join(BIN, "gunicorn"), "--config", str(tmp_path / "keepalive.conf.py"), "--chdir", str(tmp_path),
            "--worker-class", "corral.server.worker.BufferingWorker", "--workers", "1", "--threads", "2",
            "--no-control-socket", "--bind", f"fd://{sock.fileno()}", "slow_app:app"]
    env = {**os.environ, "RELEASE_FILE": str(release), "BUSY_FILE": str(busy)}
    proc = Proc("gunicorn", argv, env, str(tmp_path / "gunicorn.log"), pass_fds=(sock.fileno(),))
    sock.close()
    conn = None
    try:
        wait_for(lambda: "Booting worker" in proc.output(), message="the worker to boot")
        conn = RawConnection(port).send(b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        wait_for(busy.exists, message="the request to be served")
        proc.signal(signal.SIGTERM)
        wait_for(lambda: "Handling signal: term" in proc.output(), message="the stop to begin")
        release.touch()
        answer = conn.response()
        assert answer.status == 200 and answer.body == b"done"
        answered = time.monotonic()
        assert conn.read_until_closed() == b""  # the server closes it, the client never does
        proc.popen.wait(15)
        assert time.monotonic() - answered < worker.STOP_LINGER_SECS + 5 < 60, proc.output()
        assert proc.popen.returncode == 0, proc.output()
    finally:
        release.touch()
        if conn is not None:
            conn.close()
        proc.stop()
