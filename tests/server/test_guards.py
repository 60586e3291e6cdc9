"""Browsers cannot be turned against a cluster (control-plane/server/guards.py): a loopback-only
server refuses a foreign Host (DNS rebinding), and state-changing requests need
`Content-Type: application/json`, which no cross-site form can send."""
import http.client
import json

import pytest
import requests

from cluster import Cluster

from corral.registry.app import create_app as create_registry
from corral.registry.settings import RegistrySettings
from corral.scheduler.app import create_app as create_scheduler
from corral.scheduler.settings import SchedulerSettings
from corral.server import guards, serve as server
from corral.shared.credentials import Credentials


@pytest.fixture
def loopback_only(monkeypatch):
    """As if served by corral-scheduler / corral-registry on a loopback address."""
    monkeypatch.setattr(server, "_loopback_only", True)


def scheduler(tmp_path, **settings):
    return create_scheduler(SchedulerSettings(database_url=f"sqlite:///{tmp_path}/s.db", **settings)).test_client()


def registry(tmp_path, **settings):
    return create_registry(RegistrySettings(database_url=f"sqlite:///{tmp_path}/r.db", **settings)).test_client()


@pytest.mark.parametrize("host, ok", [
    ("localhost", True), ("localhost:9001", True), ("LOCALHOST.", True), ("app.localhost:9001", True),
    ("127.0.0.1:9001", True), ("127.9.9.9", True), ("[::1]:9001", True),
    ("evil.example", False), ("evil.example:9001", False), ("127.0.0.1.evil.example", False),
    ("localhost.evil.example", False), ("10.0.0.5:9001", False), ("[::ffff:10.0.0.5]", False), ("", False),
])
@pytest.mark.slow
def test_a_loopback_only_server_takes_loopback_hosts_only(tmp_path, loopback_only, host, ok):
    client = scheduler(tmp_path)
    response = client.post("/jobs", json={"command": "true"}, headers={"Host": host})
    if ok:
        assert response.status_code == 201, response.json
    else:
        assert response.status_code == 400 and "Host" in response.json["error"], response.json
    assert client.get("/jobs").json == ([response.json] if ok else [])  # a refused request changed nothing


# Host values that name a loopback host somewhere in them but are no valid Host (RFC
# 9110 7.2: host, then an optional port): each could be read as a loopback name by a
# check that looks for one, and as another host by whatever reads the URL it makes.
NOT_A_HOST = [
    "127.0.0.1:80@evil.example", "evil.example#@127.0.0.1", "user@127.0.0.1", "127.0.0.1:80/x",
    "127.0.0.1/x", "127.0.0.1?x", "127.0.0.1#x", "127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:", "127.0.0.1:+80",
    "127.0.0.1:80:80", "127.0.0.1:8o", "localhost:80 evil.example", "127.0.0.1 ", " 127.0.0.1", "127.0.0.1,evil",
    "127.0.0.1, evil.example", "[::1", "[::1]x", "[::1]:", "[::1]:65536", "::1", "[evil.example]",
    "[::1%25lo]", "local\\host", "localhost..", ".localhost", "127.0.0.1\t", "loc%61lhost", "",
    "localhost\u00a0", "\u0131ocalhost",
]


@pytest.mark.parametrize("host", NOT_A_HOST)
def test_a_host_header_that_is_no_host_and_optional_port_is_refused(tmp_path, loopback_only, host):
    client = scheduler(tmp_path, allowed_hosts=frozenset({"corral.internal"}))
    response = client.post("/jobs", json={"command": "true"}, headers={"Host": host})
    assert response.status_code == 400 and "Host" in response.json["error"], response.json
    assert client.get("/jobs").json == []


@pytest.mark.parametrize("host", NOT_A_HOST)
def test_a_tokenless_server_on_other_addresses_refuses_them_too(tmp_path, host):
    client = scheduler(tmp_path)
    response = client.post("/jobs", json={"command": "true"}, headers={"Host": host})
    assert response.status_code == 400 and "Host" in response.json["error"], response.json


@pytest.mark.parametrize("host", [
    "127.0.0.1:1", "127.0.0.1:65535", "127.0.0.1:08080", "localhost.", "LocalHost:9001", "a-b_c.localhost",
    "[::1]", "[0:0:0:0:0:0:0:1]:9001", "corral.internal:443", "CORRAL.INTERNAL.",
])
def test_valid_host_headers_are_taken(tmp_path, loopback_only, host):
    client = scheduler(tmp_path, allowed_hosts=frozenset({"corral.internal"}))
    response = client.post("/jobs", json={"command": "true"}, headers={"Host": host})
    assert response.status_code == 201, response.json


@pytest.mark.e2e
def test_a_host_that_is_no_host_or_given_twice_is_refused_by_a_real_server(cluster):
    """Through gunicorn, which hands the header over as sent (two Host headers it
    refuses itself)."""
    for host_lines in ([b"Host: 127.0.0.1:80@evil.example"], [b"Host: 127.0.0.1:99999"],
                       [b"Host: 127.0.0.1", b"Host: evil.example"], [b"Host: evil.example", b"Host: 127.0.0.1"],
                       [b"Host:"]):
        conn = http.client.HTTPConnection("127.0.0.1", cluster.scheduler_port, timeout=20)
        try:
            conn.putrequest("GET", "/jobs", skip_host=True)
            for line in host_lines:
                name, _, value = line.partition(b": ")
                conn.putheader(name.rstrip(b":").decode(), value)
            conn.endheaders()
            response = conn.getresponse()
            body = json.loads(response.read())
        finally:
            conn.close()
        assert response.status == 400 and "HOST" in body["error"].upper(), (host_lines, body)


def test_allowed_hosts_add_the_names_a_proxy_uses(tmp_path, loopback_only):
    hosts = guards.allowed_hosts({"CORRAL_ALLOWED_HOSTS": "Corral.Internal, cp.example.com"})
    assert hosts == {"corral.internal", "cp.example.com"}
    client = registry(tmp_path, allowed_hosts=hosts)
    assert client.get("/nodes", headers={"Host": "corral.internal:443"}).status_code == 200
    assert client.get("/nodes", headers={"Host": "cp.example.com"}).status_code == 200
    assert client.get("/nodes", headers={"Host": "other.example.com"}).status_code == 400


def test_a_server_with_tokens_does_not_check_the_host(tmp_path):
    # Tokens protect it: a page cannot attach the bearer token.
    credentials = Credentials("guards-test-operator-token-1", "guards-test-agent-secret-123")
    client = scheduler(tmp_path, credentials=credentials)
    answer = client.get("/jobs", headers={"Host": "cp.example.com", "Authorization": f"Bearer {credentials.operator}"})
    assert answer.status_code == 200


@pytest.mark.parametrize("host, ok", [
    ("10.0.0.5:9001", True), ("[2001:db8::1]:9001", True), ("localhost", True), ("127.0.0.1", True),
    ("corral.internal", True), ("evil.example", False), ("10.0.0.5.nip.io", False),
])
@pytest.mark.slow
def test_a_tokenless_server_on_other_addresses_takes_ip_literals_but_no_foreign_name(tmp_path, host, ok):
    """--insecure: no tokens, not loopback only. A rebinding attack needs a name; an IP
    literal cannot be one."""
    client = scheduler(tmp_path, allowed_hosts=frozenset({"corral.internal"}))
    response = client.post("/jobs", json={"command": "true"}, headers={"Host": host})
    assert response.status_code == (201 if ok else 400), response.json


@pytest.mark.parametrize("binds, expected", [
    (["127.0.0.1:9000"], True), (["[::1]:9000", "localhost:9000"], True), (["127.0.0.1:9000", "unix:/x"], True),
    (["0.0.0.0:9000"], False), (["127.0.0.1:1", "10.0.0.5:9000"], False), (["unix:/run/c.sock"], False),
])
def test_which_binds_count_as_loopback_only(binds, expected):
    assert server.binds_loopback_only(binds) is expected


# Requests a page on another site can make without asking the server first: HTML forms
# (urlencoded, multipart, text/plain) and fetch() with a "simple" content type or none.
CROSS_SITE = [
    {},
    {"content_type": "text/plain"},
    {"content_type": "application/x-www-form-urlencoded", "data": "command=true"},
    {"content_type": "multipart/form-data; boundary=x", "data": "--x--"},
    {"content_type": "text/plain", "data": json.dumps({"command": "touch /tmp/pwned"})},
]


@pytest.mark.parametrize("kwargs", CROSS_SITE)
def test_cross_site_requests_change_nothing(tmp_path, kwargs):
    client = scheduler(tmp_path)
    client.post("/jobs", json={"command": "sleep 100"})
    for path in ("/jobs", "/jobs/batch", "/jobs/job-1/cancel", "/jobs/job-1/retry"):
        response = client.post(path, **kwargs)
        assert response.status_code == 415, (path, response.json)
        assert "application/json" in response.json["error"]
    assert [(j["job_id"], j["status"]) for j in client.get("/jobs").json] == [("job-1", "pending")]
    reg = registry(tmp_path)
    reg.post("/nodes", json={"node_id": "n1", "address": "10.0.0.1"})
    for method, path in (("POST", "/nodes/n1/drain"), ("DELETE", "/nodes/n1"), ("POST", "/nodes"),
                         ("POST", "/services")):
        assert reg.open(path, method=method, **kwargs).status_code == 415, path
    assert reg.get("/nodes/n1").json["drained"] is False


def test_a_body_less_request_that_says_json_goes_through(tmp_path):
    client = scheduler(tmp_path)
    client.post("/jobs", json={"command": "sleep 100"})
    cancelled = client.post("/jobs/job-1/cancel", content_type="application/json")
    assert cancelled.status_code == 200 and cancelled.json["status"] == "cancelled"
    reg = registry(tmp_path)
    reg.post("/nodes", json={"node_id": "n1", "address": "10.0.0.1"})
    assert reg.post("/nodes/n1/drain", content_type="application/json; charset=utf-8").json["drained"] is True


# ---- against real servers ------------------------------------------------------------------


def raw(url: str, method: str, path: str, headers: dict, body: bytes = b"") -> tuple[int, dict]:
    """One request with exactly these headers (requests would add its own Host)."""
    host, port = url.rsplit("/", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read() or b"null")
    finally:
        conn.close()


@pytest.mark.e2e
def test_dns_rebinding_and_cross_site_posts_are_refused_by_a_local_cluster(tmp_path):
    """`make run`'s cluster: no tokens, loopback only. A page on evil.example whose name
    now points at 127.0.0.1 cannot submit, cancel or drain; a form cannot either."""
    cluster = Cluster(tmp_path)
    try:
        cluster.start_registry(CORRAL_ALLOWED_HOSTS="corral.internal")
        cluster.start_scheduler()
        job = cluster.submit(command="sleep 100")
        submit = json.dumps({"command": "touch /tmp/rebound"}).encode()
        port = cluster.scheduler_port
        for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1.nip.io:{port}"):
            status, body = raw(cluster.scheduler_url, "POST", "/jobs",
                               {"Host": host, "Content-Type": "application/json"}, submit)
            assert status == 400 and "Host" in body["error"], body
            status, body = raw(cluster.scheduler_url, "POST", f"/jobs/{job['job_id']}/cancel",
                               {"Host": host, "Content-Type": "application/json"})
            assert status == 400, body
        # A cross-site form posts text/plain with the right Host (the page is on localhost).
        status, body = raw(cluster.scheduler_url, "POST", f"/jobs/{job['job_id']}/cancel",
                           {"Host": f"localhost:{port}", "Content-Type": "text/plain"})
        assert status == 415, body
        assert [j["job_id"] for j in requests.get(cluster.scheduler_url + "/jobs", timeout=5).json()] \
            == [job["job_id"]] and cluster.job(job["job_id"])["status"] == "pending"
        requests.post(cluster.registry_url + "/nodes", json={"node_id": "n1", "address": "10.0.0.1"}, timeout=5)
        status, body = raw(cluster.registry_url, "POST", "/nodes/n1/drain",
                           {"Host": "evil.example", "Content-Type": "application/json"})
        assert status == 400, body
        status, body = raw(cluster.registry_url, "POST", "/nodes/n1/drain",
                           {"Host": "corral.internal", "Content-Type": "application/json"})
        assert status == 200 and body["drained"] is True, body  # a name from CORRAL_ALLOWED_HOSTS
        # The clients, the CLI and the agents send what passes (requests sends Host 127.0.0.1:port).
        cancelled = requests.post(f"{cluster.scheduler_url}/jobs/{job['job_id']}/cancel",
                                  headers={"Content-Type": "application/json"}, timeout=5)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    finally:
        cluster.stop()
