"""No bytes a client sends get a 500, on any route of either service.

The body decoder alone (json_body.decode), then every route of both apps, taken
from `app.url_map` so that a new route is covered the day it is added, with every
method it has, through Flask's test client on real SQLite files: hostile bodies
(lone surrogates, nesting, NaN, huge numbers, duplicate keys, bad UTF-8, a BOM,
values of every wrong type in every field of a valid body), hostile path segments
and query strings. Each answer must follow hostile.problem: no 5xx, a JSON error
for a 4xx, and a 4xx stored nothing.

Then the same against real gunicorn servers for what the test client cannot send:
chunked bodies with broken framing or past the body limit, and raw odd bytes in
paths and query strings; and last every route and method of both services, from
their URL maps, over raw sockets: hostile JSON, wrong content types, broken
chunked framing, CR, LF or NUL in a header, hostile path values (no 5xx, no hang).
"""
import http.client
import io
import json
import pathlib
import socket
import tempfile
import time
from collections.abc import Iterator
from urllib.parse import quote

import pytest
import requests
from gunicorn.http.errors import InvalidChunkSize

import hostile
from corral.scheduler import sqs_intake
from corral.server import json_body
from corral.server.http import DEFAULT_MAX_BODY_BYTES

# ---- the decoder ------------------------------------------------------------------

REFUSED = [
    (b'{"command": "\\ud800"}', "lone UTF-16 surrogate", "command"),
    (b'{"jobs": [{"command": "a"}, {"env_vars": {"\\uDC00x": "1"}}]}', "lone UTF-16 surrogate", "jobs[1].env_vars"),
    (b'{"a": "\\ud800\\ud800"}', "lone UTF-16 surrogate", "at a"),   # two highs are no pair
    (b'{"a": "\\udc00\\ud800"}', "lone UTF-16 surrogate", "at a"),   # low before high is no pair
    (b'"\\udfff"', "lone UTF-16 surrogate", "the top level"),
    (b'{"command": "\xed\xa0\x80"}', "not valid UTF-8", "0xed at offset 13"),  # a surrogate, UTF-8 encoded
    (b'{"command": "\xff"}', "not valid UTF-8", "0xff at offset 13"),
    ('{"command": "é"}'.encode("latin-1"), "not valid UTF-8", "0xe9"),
    ('{"command": "x"}'.encode("utf-16"), "not valid UTF-8", ""),
    (b'\xef\xbb\xbf{"command": "true"}', "byte order mark", ""),
    (b'{"command": "a", "command": "b"}', "the key 'command' twice", ""),
    (b'{"x": {"k": 1, "k": 1}}', "the key 'k' twice", ""),
    (b'{"max": NaN}', "NaN, which is not a JSON number", ""),
    (b'{"max": Infinity}', "Infinity", ""),
    (b'{"max": -Infinity}', "-Infinity", ""),
    (b'{"max": 1e999999}', "the number 1e999999 is too large", ""),
    (b'{"max": -1.5e400}', "too large", ""),
    (b'{"max": ' + b"7" * 100_000 + b"}", "integer of more than", "digits"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply", ""),
    (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "nested too deeply", ""),
    (b'{"command": "a\x01b"}', "not valid JSON", "Invalid control character"),
    (b'{"command": "true"} x', "not valid JSON", "Extra data"),
    (b"{", "not valid JSON", ""),
]


@pytest.mark.parametrize("raw, reason, detail", REFUSED)
def test_the_decoder_refuses_what_cannot_be_stored_or_is_ambiguous(raw, reason, detail):
    with pytest.raises(json_body.JSONBodyError) as refused:
        json_body.decode(raw)
    message = str(refused.value)
    assert reason in message and detail in message
    message.encode("utf-8")  # the message itself can be sent: surrogates in it are escaped


@pytest.mark.parametrize("raw, value", [
    (b'{"command": "\\ud83d\\ude00 \\u00e9"}', {"command": "\U0001F600 \u00e9"}),  # a pair is a character
    (b'{"command": "\\\\ud800"}', {"command": "\\ud800"}),   # an escaped backslash, then text
    ('{"command": "\U0001F600"}'.encode(), {"command": "\U0001F600"}),
    (b'{"wait_secs": 1.5e3, "max": -0, "n": 1e-999}', {"wait_secs": 1500.0, "max": 0, "n": 0.0}),
    (b'{"a": {"k": 1}, "b": {"k": 2}}', {"a": {"k": 1}, "b": {"k": 2}}),  # one key in two objects
    (b'{"command": "a\\u0000b\\u001b"}', {"command": "a\x00b\x1b"}),     # escaped controls decode
    (b' \n{"a": [' + b"[" * 100 + b"]" * 100 + b"]}\t", {"a": [json.loads("[" * 100 + "]" * 100)]}),
    ("{\"a\": \"x\"}", {"a": "x"}),
])
def test_the_decoder_accepts_valid_json_as_json_does(raw, value):
    assert json_body.decode(raw) == value


def test_a_lone_surrogate_deep_down_is_found_and_named_by_its_path():
    deep = '{"a": ' + "[" * 500 + '"\\ud800"' + "]" * 500 + "}"
    with pytest.raises(json_body.JSONBodyError, match=r"a\[0\]\[0\]"):
        json_body.decode(deep)


@pytest.mark.parametrize("body", ['{"command": "\\ud800"}', '{"command": "true", "command": "false"}',
                                  '{"command": "true", "max_retries": NaN}'])
def test_an_sqs_message_is_decoded_as_strictly_as_a_request_body(body):
    """Rejected at once (dead-lettered as not_json) instead of failing its submit on
    every receive."""
    parsed = sqs_intake.parse_message({"MessageId": "m-1", "Body": body})
    assert isinstance(parsed, sqs_intake.Rejected) and parsed.reason == sqs_intake.NOT_JSON


# ---- every route, through the test client ------------------------------------------

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
# Values of path parameters that name what the services hold (unknown names: "x").
PATH_VALUES = {"node_id": "node-1", "job_id": "job-1", "filename": "x.txt"}
DEEP = b"[" * 100_000 + b"]" * 100_000
GENERIC_BODIES = [
    b'{"x": "\\ud800"}', b'{"\\udc00": 1}', b'{"x": "\xed\xa0\x80"}', b'{"x": "\xff\xfe"}', b"\xff\xfe\x00\x00",
    DEEP, b'{"x": ' + DEEP + b"}", b'{"a":' * 100_000, b'{"x": NaN}', b'{"x": 1e999999}',
    b'{"x": ' + b"9" * 100_000 + b"}", b'{"x": 1, "x": 2}', b'\xef\xbb\xbf{}', b"[]", b'"x"', b"1", b"null",
    b"", b" \r\n", b"{", b"\x00", b'{"x": "a\x00b"}', b"x" * (DEFAULT_MAX_BODY_BYTES + 1),
]
# What replaces one value (or key) of a valid body: types the field does not take,
# numbers past every column's range, strings the database cannot store.
HOSTILE_VALUES = [
    b'"\\ud800"', b'"a\\udfffb"', b'"\xed\xa0\x80"', b'"\xc0\xaf"', b'"\\u0000"', b'"\x07"', b'""',
    b'"' + b"x" * 70_000 + b'"', b"NaN", b"-Infinity", b"1e999999", b"1" * 5000, b"18446744073709551616",
    b"-9223372036854775809", b"9223372036854775807", b"-1", b"0.5", b"true", b"null", b"[]", b"{}",
    b'["\\ud800"]', b'{"\\ud800": "x"}', b"[" * 5000 + b"]" * 5000,
]
HOSTILE_KEYS = [b'"\\ud800"', b'"\xff"', b'""', b'"\\u0000"']
MARK = "\x00mark\x00"


def routes(app):
    """(rule, endpoint, methods) of every route, `static` and the dashboard included."""
    return [(rule, rule.endpoint, sorted(rule.methods)) for rule in app.url_map.iter_rules()]


def fill(rule, values: dict | None = None) -> str:
    """The rule's path with its parameters set from `values` (as they go in a URL), else
    from PATH_VALUES."""
    values = values or {}
    path = rule.rule
    for name in rule.arguments:
        value = values.get(name, PATH_VALUES.get(name, "x"))
        path = path.replace(f"<path:{name}>", value).replace(f"<{name}>", value)
    return path


def marked(body: dict, position: tuple) -> bytes:
    """`body` as JSON text with the value or key at `position` replaced by MARK."""
    return json.dumps(hostile.replace_at(body, position, MARK)).encode()


def hostile_bodies(body: dict) -> list[bytes]:
    """Every value and key of `body` replaced by every hostile value or key, one at a
    time; and `body` with its first key given twice."""
    mark = json.dumps(MARK).encode()
    out = []
    for position in hostile.positions(body):
        text = marked(body, position)
        replacements = HOSTILE_KEYS if position[0] == "key" else HOSTILE_VALUES
        out += [text.replace(mark, replacement) for replacement in replacements]
    first = json.dumps(dict([next(iter(body.items()))]))[1:-1].encode()
    out.append(b"{" + first + b", " + json.dumps(body).encode()[1:])
    return out


@pytest.fixture(params=["registry", "scheduler"])
def service(request, tmp_path) -> Iterator[hostile.Service]:
    made = getattr(hostile, request.param)(tmp_path)
    yield made
    made.close()


def send(service: hostile.Service, failures: list, method: str, path: str, *, query: str = "",
         data: bytes = b"", content_type: str = "application/json", headers: dict | None = None):
    before = service.stored()
    response = service.client.open(path, method=method, query_string=query or None, data=data,
                                   content_type=content_type, headers=headers)
    trouble = hostile.problem(response, method, before, service.stored())
    response.close()  # as a client that stops reading: an event stream gives its place back
    if trouble:
        failures.append(f"{method} {path[:100]}{'?' + query[:100] if query else ''} "
                        f"body {data[:80]!r}{'...' if len(data) > 80 else ''}: {trouble}")
    return response


@pytest.mark.slow
def test_hostile_bodies_on_every_route_and_method(service):
    failures: list[str] = []
    for rule, endpoint, allowed in routes(service.app):
        path = fill(rule)
        for method in METHODS:
            # A method the route does not have is refused (405) whatever the body.
            bodies = GENERIC_BODIES if method in allowed else GENERIC_BODIES[:1]
            for data in bodies:
                send(service, failures, method, path, data=data)
        valid = hostile.VALID_BODIES.get((service.name, endpoint))
        if valid is not None:
            method = next(m for m in allowed if m not in ("HEAD", "OPTIONS"))
            for data in hostile_bodies(valid):
                send(service, failures, method, path, data=data)
    assert not failures, "\n".join(failures[:40])


def test_every_route_that_reads_a_body_has_a_valid_one_here(service):
    """So the hostile variants above reach past the decoder into each route's checks: a
    route that reads a body but is missing from hostile.VALID_BODIES fails here."""
    for rule, endpoint, allowed in routes(service.app):
        method = next((m for m in allowed if m not in ("GET", "HEAD", "OPTIONS")), None)
        if method is None:
            continue
        response = service.client.open(fill(rule), method=method, data=b"[]", content_type="application/json")
        if response.status_code == 400 and "JSON object" in response.json["error"]:
            assert (service.name, endpoint) in hostile.VALID_BODIES, f"{method} {rule.rule} reads a body"


def test_valid_bodies_are_taken(service):
    """The templates are valid: any problem with a variant comes from the hostile part."""
    for rule, endpoint, allowed in routes(service.app):
        valid = hostile.VALID_BODIES.get((service.name, endpoint))
        if valid is not None:
            method = next(m for m in allowed if m not in ("HEAD", "OPTIONS"))
            response = service.client.open(fill(rule), method=method, json=valid)
            if (service.name, endpoint) in hostile.REFUSED_AFTER_CHECKS:
                assert response.status_code == hostile.REFUSED_AFTER_CHECKS[service.name, endpoint], rule.rule
            else:
                assert response.status_code < 300, (rule.rule, response.json)


@pytest.mark.slow
def test_bodies_of_other_content_types(service):
    failures: list[str] = []
    content_types = ["text/plain", "application/json; charset=utf-16", "application/x-www-form-urlencoded",
                     "multipart/form-data; boundary=x", "application/json\x00", "\xff/\xfe"]
    for rule, endpoint, allowed in routes(service.app):
        for method in allowed:
            for content_type in content_types:
                send(service, failures, method, fill(rule), data=b'{"x": "\\ud800"}\xff',
                     content_type=content_type)
    assert not failures, "\n".join(failures[:40])


SEGMENTS = ["%ff", "%ed%a0%80", "%c0%80", "%00", "a%00b", "%0a%0d", "%2f", "..%2f..%2f", "%25", "%20",
            "%f0%9f%98%80", "%e2%80%ae", "job-0", "job-" + "9" * 30, "9" * 5000, "x" * 100_000, "%5cud800"]


@pytest.mark.slow
def test_hostile_path_segments(service):
    failures: list[str] = []
    for rule, endpoint, allowed in routes(service.app):
        body = json.dumps(hostile.VALID_BODIES.get((service.name, endpoint), {})).encode()
        for name in rule.arguments:
            for segment in SEGMENTS:
                path = fill(rule, {name: segment})
                for method in allowed:
                    send(service, failures, method, path, data=body)
    assert not failures, "\n".join(failures[:40])


QUERY_NAMES = ["node_id", "status", "job_type", "limit", "order", "after", "type", "drained", "healthy", "name"]
QUERY_VALUES = ["%ff", "%00", "%ed%a0%80", "%0a", "9" * 40, "-1", "job-" + "9" * 40, "x" * 20_000]


@pytest.mark.slow
def test_hostile_query_strings(service):
    """Each parameter name any route reads, with each odd value, on every GET; the other
    methods (whose routes read no query string today) get every name at once."""
    failures: list[str] = []
    single = [f"{name}={value}" for name in QUERY_NAMES for value in QUERY_VALUES]
    single += ["%ff=%ff", "&&=&", "limit=1&limit=x", "node_id", "a=%", "a=%zz", "status=done&status=%ff"]
    combined = ["&".join(f"{name}={value}" for name in QUERY_NAMES) for value in QUERY_VALUES]
    for rule, endpoint, allowed in routes(service.app):
        for method in allowed:
            for query in single if method == "GET" else combined:
                send(service, failures, method, fill(rule), query=query, data=b"{}")
    assert not failures, "\n".join(failures[:40])


@pytest.mark.slow
def test_hostile_headers(service):
    failures: list[str] = []
    for value in ("\xff\xfe", "\x00", "x" * 8000, "\t", ""):
        for rule, endpoint, allowed in routes(service.app):
            body = json.dumps(hostile.VALID_BODIES.get((service.name, endpoint), {})).encode()
            for method in allowed:
                send(service, failures, method, fill(rule), data=body,
                     headers={"Idempotency-Key": value, "Authorization": value})
    assert not failures, "\n".join(failures[:40])


def test_a_lone_surrogate_is_refused_where_it_used_to_reach_the_database(tmp_path):
    """The cases first seen as 500s: a job's command, a batch item, a node address, a
    service name. Each is a 400 that names the field, and nothing is stored."""
    cases = [(hostile.scheduler, "/jobs", {"command": MARK}, "command"),
             (hostile.scheduler, "/jobs/batch", {"jobs": [{"command": "true"}, {"command": MARK}]},
              "jobs[1].command"),
             (hostile.registry, "/nodes", {"node_id": "node-9", "address": MARK}, "address"),
             (hostile.registry, "/services", {"job_id": "job-9", "name": MARK, "node_id": "node-1",
                                              "address": "a", "port": 1}, "name")]
    for index, (make, path, body, field) in enumerate(cases):
        svc = make(tmp_path / str(index))
        before = svc.stored()
        data = json.dumps(body).encode().replace(json.dumps(MARK).encode(), b'"x\\ud800y"')
        response = svc.client.post(path, data=data, content_type="application/json")
        assert response.status_code == 400, response.json
        assert response.json == {"error": f"the string at {field} holds a lone UTF-16 surrogate escape "
                                          f"(\\ud800-\\udfff without its pair), which is not a character"}
        assert svc.stored() == before


def test_a_body_of_exactly_the_limit_is_read_and_one_byte_more_is_413(tmp_path):
    """Sized and unsized (as a chunked body reaches the app: no Content-Length, the
    server terminating the stream) alike."""
    svc = hostile.scheduler(tmp_path)
    try:
        body = b'{"command": "true"}'
        exact = body + b" " * (DEFAULT_MAX_BODY_BYTES - len(body))
        for data, status in ((exact, 201), (exact + b" ", 413)):
            sized = svc.client.post("/jobs", data=data, content_type="application/json")
            unsized = svc.client.post("/jobs", input_stream=io.BytesIO(data), content_type="application/json",
                                      environ_overrides={"wsgi.input_terminated": True})
            assert (sized.status_code, unsized.status_code) == (status, status), (sized.json, unsized.json)
        assert len(svc.client.get("/jobs").json) == 2 + 2  # the seeded jobs and the two at the limit
    finally:
        svc.close()


def test_a_body_read_error_outside_read_json_object_is_a_json_400(tmp_path):
    """A route that reads the raw body itself (the heartbeat's optional body) meets a
    broken chunked stream through the error handlers."""
    class Broken:
        def read(self, *args):
            raise InvalidChunkSize(b"zz")

        readline = read

    svc = hostile.registry(tmp_path)
    response = svc.client.post("/nodes/node-1/heartbeat", content_type="application/json",
                               environ_overrides={"wsgi.input": Broken(), "wsgi.input_terminated": True})
    assert response.status_code == 400
    assert response.json == {"error": "the chunked request body is malformed: Invalid chunk size: b'zz'"}


# ---- real gunicorn servers -------------------------------------------------------------

e2e = pytest.mark.e2e


@pytest.fixture
def live(cluster):
    """A registry and a scheduler under gunicorn (conftest's `cluster`), whose logs show
    no unhandled error afterwards: a 500 the answers did not show would be there."""
    yield cluster
    for name in ("registry", "scheduler"):
        log = cluster.procs[name].output()
        assert "unhandled error" not in log and "Traceback" not in log, f"{name} log:\n{log[-6000:]}"


def raw_request(port: int, head: bytes, body: bytes = b"", end_body: bool = False) -> http.client.HTTPResponse:
    """Send exactly these bytes; `end_body`: then close our side (the body ends early).
    The first answer on the connection, read as an HTTP client would."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    try:
        sock.sendall(head + body)
        if end_body:
            sock.shutdown(socket.SHUT_WR)
        response = http.client.HTTPResponse(sock)
        response.begin()
        response.body = response.read()
        return response
    finally:
        sock.close()


def chunked_head(path: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Transfer-Encoding: chunked\r\n\r\n").encode()


def chunks(data: bytes, size: int = 64 * 1024) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(data[i:i + size]), data[i:i + size])
                    for i in range(0, len(data), size)) + b"0\r\n\r\n"


def route_tables() -> dict[str, list]:
    """routes() of each service, from its app's own table."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("registry", "scheduler"):
            made = getattr(hostile, name)(pathlib.Path(tmp))
            try:
                out[name] = routes(made.app)
            finally:
                made.close()
    return out


def body_routes() -> list[tuple[str, str, bool]]:
    """(service, path, whether it reads its body) of every route that takes a POST,
    from the apps' own tables."""
    return [(name, fill(rule), (name, endpoint) in hostile.VALID_BODIES)
            for name, table in route_tables().items() for rule, endpoint, allowed in table if "POST" in allowed]


# Chunked framing gunicorn's parser refuses; True: the client then closes its side.
BROKEN_CHUNKED = {
    "bad size": (b"zz\r\n{}\r\n0\r\n\r\n", False),
    "negative size": (b"-2\r\n{}\r\n0\r\n\r\n", False),
    "no terminator": (b"2\r\n{}XX0\r\n\r\n", False),
    "bad extension": (b"2;\x00\r\n{}\r\n0\r\n\r\n", False),
    "ends early": (b"10\r\n{\"comm", True),
    "no last chunk": (b"2\r\n{}\r\n", True),
}


def stored_counts(live) -> tuple[int, int, int]:
    jobs = requests.get(live.scheduler_url + "/jobs", params={"limit": 1000}, timeout=10).json()
    nodes = requests.get(live.registry_url + "/nodes", timeout=10).json()
    services = requests.get(live.registry_url + "/services", timeout=10).json()
    return len(jobs), len(nodes), len(services)


def wrong_answer(response: http.client.HTTPResponse, reads_body: bool) -> str | None:
    """A route that reads the body refuses it with a JSON 4xx; one that ignores it
    (drain, cancel, ...) may answer anything but a 5xx, in JSON too."""
    try:
        answer = json.loads(response.body)
    except ValueError:
        answer = None
    if response.status >= 500 or response.getheader("Content-Type") != "application/json" or answer is None:
        return f"{response.status} {response.body[:200]!r}"
    if reads_body and not (400 <= response.status < 500 and isinstance(answer.get("error"), str)):
        return f"{response.status} {response.body[:200]!r}"
    return None


@e2e
def test_broken_chunked_bodies_are_a_json_4xx_on_every_route(live):
    before = stored_counts(live)
    port = {"registry": live.registry_port, "scheduler": live.scheduler_port}
    failures = []
    for service, path, reads_body in body_routes():
        for name, (body, end_body) in BROKEN_CHUNKED.items():
            wrong = wrong_answer(raw_request(port[service], chunked_head(path), body, end_body), reads_body)
            if wrong:
                failures.append(f"{service} {path} {name}: {wrong}")
    assert not failures, "\n".join(failures)
    assert stored_counts(live) == before


@e2e
def test_a_chunked_body_past_the_limit_is_413_and_one_of_exactly_the_limit_is_read(live):
    before = stored_counts(live)
    head = chunked_head("/jobs")
    padding = b" " * (DEFAULT_MAX_BODY_BYTES - 19)
    too_large = raw_request(live.scheduler_port, head, chunks(b'{"command": "true"}' + padding + b" "))
    assert too_large.status == 413 and json.loads(too_large.body) == {"error": "request body too large"}
    failures = []
    for service, path, reads_body in body_routes():
        port = live.registry_port if service == "registry" else live.scheduler_port
        response = raw_request(port, chunked_head(path), chunks(b"[" + b" " * (3 << 20) + b"]"))
        wrong = wrong_answer(response, reads_body)
        if wrong or reads_body and response.status != 413:
            failures.append(f"{service} {path}: {wrong or response.status}")
    assert not failures, "\n".join(failures)
    assert stored_counts(live) == before
    exact = raw_request(live.scheduler_port, head, chunks(b'{"command": "true"}' + padding))
    assert exact.status == 201, exact.body


@e2e
def test_a_chunk_announcing_more_than_the_limit_is_413_at_once(live):
    """Without waiting for the chunk's data, which never comes: not a 408 after the read
    timeout, with a request thread held all along."""
    for size in (b"%x" % (DEFAULT_MAX_BODY_BYTES + 1), b"f" * 30):
        response = raw_request(live.scheduler_port, chunked_head("/jobs"), size + b"\r\n{")
        assert response.status == 413 and json.loads(response.body) == {"error": "request body too large"}


@e2e
def test_hostile_bodies_over_a_real_socket(live):
    """Sized and chunked, the decoder's refusals reach the client as they do in-process."""
    before = stored_counts(live)
    for body in (b'{"command": "\\ud800"}', b'{"command": "\xed\xa0\x80"}', DEEP, b'{"command": "a", "command": "b"}',
                 b'{"command": "true", "max_retries": ' + b"1" * 100_000 + b"}"):
        sized = requests.post(live.scheduler_url + "/jobs", data=body, timeout=20,
                              headers={"Content-Type": "application/json"})
        chunked = raw_request(live.scheduler_port, chunked_head("/jobs"), chunks(body))
        assert sized.status_code == chunked.status == 400, (sized.text, chunked.body)
        assert json.loads(chunked.body) == sized.json() and isinstance(sized.json()["error"], str)
    assert stored_counts(live) == before


@e2e
def test_odd_bytes_in_paths_and_query_strings_over_a_real_socket(live):
    """gunicorn hands the app the raw path as latin-1 (not as the test client does)."""
    failures = []
    targets = [(live.scheduler_port, p) for p in ("/jobs/{}", "/jobs/{}/events", "/jobs?node_id={}",
                                                   "/jobs?after={}", "/nodes/{}/claim")]
    targets += [(live.registry_port, p) for p in ("/nodes/{}", "/services?name={}", "/nodes?type={}")]
    for port, template in targets:
        for segment in SEGMENTS[:13] + ["%" + quote("\u00e9")[1:]]:
            target = template.format(segment)
            method = "POST" if template.endswith("claim") else "GET"
            head = (f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    f"Content-Length: 2\r\nConnection: close\r\n\r\n").encode()
            response = raw_request(port, head, b"{}")
            if response.status >= 500 or response.getheader("Content-Type") != "application/json":
                failures.append(f"{method} {target}: {response.status} {response.body[:200]!r}")
    assert not failures, "\n".join(failures)


# ---- every route and method, over a raw socket -------------------------------------------

# Hostile bodies each route and method gets as a real client sends them (sized).
SOCKET_BODIES = {
    "escaped lone surrogates": (b'{"x": "\\ud800", "\\udc00": ["a\\udfff"]}', "application/json"),
    "raw invalid UTF-8": (b'{"x": "\xed\xa0\x80", "y": "\xff\xfe"}', "application/json"),
    "wrong content type": (b'{"x": "\\ud800"}', "text/plain; charset=utf-8"),
    "UTF-16 said to be JSON": ('{"x": "\ud800"}'.encode("utf-16", "surrogatepass"), "application/json; charset=utf-16"),
    "deeply nested arrays": (DEEP, "application/json"),
    "deeply nested objects": (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "application/json"),
    "huge numbers": (b'{"x": 1e999999, "y": ' + b"9" * 100_000 + b", \"z\": -1e-999999}", "application/json"),
}
# Chunked bodies: (the body's bytes, whether the client then closes its side).
SOCKET_CHUNKED = {
    "chunked lone surrogate": (chunks(b'{"x": "\\ud800"}'), False),
    "bad chunk size": (b"zz\r\n{}\r\n0\r\n\r\n", False),
    "chunk size past any limit": (b"fffffffffffffffffffff\r\n{}\r\n0\r\n\r\n", False),
    "chunk extension junk": (b"2;\x01=\xff\r\n{}\r\n0\r\n\r\n", False),
    "no last chunk": (b"2\r\n{}\r\n", True),
}
# Header lines with what no header may hold.
SOCKET_HEADERS = {
    "bare CR in a header": b"X-Fuzz: a\rb",
    "NUL in a header": b"Idempotency-Key: a\x00b",
    "bare LF in a header": b"Authorization: Bearer a\nb",
}
SOCKET_SEGMENTS = ["%ed%a0%80", "%00%0d%0a", "%ff" * 1000]
# What each answer gets at most: far below the servers' read timeout (10 s), so that a
# request held until then shows here as a hang; far above a real answer on a loaded host.
ANSWER_SECS = 30


def socket_routes() -> dict[str, list[tuple[str, str, list[str]]]]:
    """For each service: (path with plausible values, rule, methods) of every route."""
    return {name: [(fill(rule), rule, allowed) for rule, _, allowed in table]
            for name, table in route_tables().items()}


def exchange(port: int, method: str, path: str, body: bytes = b"", content_type: str = "application/json",
             extra: bytes = b"", chunked: bool = False, end_body: bool = False) -> tuple[int, bytes, str]:
    """Send one request exactly; (status, body, content type) of the answer. An event
    stream's answer is cut after its head (the stream does not end by itself)."""
    length = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % len(body)
    head = b"\r\n".join([f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close",
                         b"Content-Type: " + content_type.encode(), length] + ([extra] if extra else []))
    sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_SECS)
    try:
        try:
            sock.sendall(head + b"\r\n\r\n" + body)
            if end_body:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the whole body was sent: the answer is there to read
        response = http.client.HTTPResponse(sock, method=method)
        response.begin()
        kind = response.getheader("Content-Type") or ""
        data = b"" if kind.startswith("text/event-stream") else response.read()
        return response.status, data, kind
    finally:
        sock.close()


def socket_problem(method: str, status: int, data: bytes, kind: str) -> str | None:
    if status >= 500 or status == 408:
        return f"{status} {data[:200]!r}"
    if status >= 300 and method != "HEAD":
        try:
            error = json.loads(data).get("error")
        except (ValueError, AttributeError):
            error = None
        if kind != "application/json" or not isinstance(error, str) or not error:
            return f"{status} without a JSON error: {kind} {data[:200]!r}"
    return None


@e2e
def test_hostile_bytes_on_every_route_and_method_of_real_servers(live):
    """Every route of both services from their URL maps, with every method it has:
    hostile JSON (lone surrogates escaped and raw, deep nesting, huge numbers), the
    wrong content type, broken chunked framing, CR, LF or NUL in a header, hostile
    path values. Never a 5xx, never a hang (no answer waits for the read timeout),
    every refusal a JSON error, and the server answers /healthz afterwards."""
    requests.post(live.registry_url + "/nodes", json={"node_id": "node-1", "address": "10.0.0.1"}, timeout=10)
    requests.post(live.scheduler_url + "/jobs", json={"command": "sleep 1000"}, timeout=10)
    requests.post(live.scheduler_url + "/schedules", json={"name": "x", "cron": "@daily", "job": {"command": "true"}},
                  timeout=10)
    port = {"registry": live.registry_port, "scheduler": live.scheduler_port}
    failures, took = [], {}
    for service, table in socket_routes().items():
        started, sent = time.monotonic(), 0

        def send(method, path, case, **kwargs):
            nonlocal sent
            sent += 1
            try:
                trouble = socket_problem(method, *exchange(port[service], method, path, **kwargs))
            except (TimeoutError, OSError, http.client.HTTPException) as exc:
                trouble = f"no answer: {exc!r}"
            if trouble:
                failures.append(f"{service} {method} {path[:80]} {case}: {trouble}")

        for path, rule, allowed in table:
            for method in allowed:
                with_body = method in ("POST", "PUT", "PATCH", "DELETE")
                for case, (body, content_type) in SOCKET_BODIES.items():
                    if with_body or not case.startswith(("deeply", "huge")):
                        send(method, path, case, body=body, content_type=content_type)
                for case, line in SOCKET_HEADERS.items():
                    send(method, path, case, body=b"{}", extra=line)
                if with_body:
                    for case, (body, end_body) in SOCKET_CHUNKED.items():
                        send(method, path, case, body=body, chunked=True, end_body=end_body)
                for name in rule.arguments:
                    for segment in SOCKET_SEGMENTS:
                        send(method, fill(rule, {name: segment}), f"{name}={segment[:12]}", body=b"{}")
        assert requests.get(live.url_of(service) + "/healthz", timeout=10).status_code == 200
        took[service] = (sent, round(time.monotonic() - started, 1))
    print(f"requests sent and seconds taken: {took}")
    assert not failures, "\n".join(failures[:60])
