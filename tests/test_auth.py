"""Access control (shared/auth.py): bearer tokens for operators and agents, agents kept
to their own node, no open server on a non-loopback address, tokens kept out of logs,
jobs and records, and TLS with a CA bundle."""
import datetime
import ipaddress
import os
import socket
import subprocess

import pytest
import requests
from click.testing import CliRunner

from cluster import BIN, Cluster, Proc, base_env, listening_socket
from helpers import wait_for

from corral.cli.main import cli
from corral.registry.app import ACCESS as REGISTRY_ACCESS
from corral.registry.app import create_app as create_registry
from corral.registry.settings import RegistrySettings
from corral.scheduler.app import ACCESS as SCHEDULER_ACCESS
from corral.scheduler.app import create_app as create_scheduler
from corral.scheduler.settings import SchedulerSettings
from corral.shared import auth
from corral.shared.errors import SettingError

OPERATOR_TOKEN = "auth-test-operator-7c1e9f2a5b"
AGENT_TOKEN = "auth-test-agent-3d8b6e0f4c"
WRONG_TOKEN = "auth-test-wrong-0000000000"
NODE = "auth-n1"
OTHER_NODE = "auth-n2"
TOKENS = auth.Tokens(OPERATOR_TOKEN, AGENT_TOKEN)
TOKEN_ENV = {"CORRAL_API_TOKEN": OPERATOR_TOKEN, "CORRAL_AGENT_TOKEN": AGENT_TOKEN}


def bearer(token: str | None, node: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if node:
        headers[auth.NODE_HEADER] = node
    return headers


AS_OPERATOR = bearer(OPERATOR_TOKEN)
AS_AGENT = bearer(AGENT_TOKEN, NODE)


# ---- the rules, through each service's Flask app --------------------------------------

def make_registry(directory):
    app = create_registry(RegistrySettings(database_url=f"sqlite:///{directory}/registry.db", tokens=TOKENS))
    client = app.test_client()
    assert client.post("/nodes", json={"node_id": NODE, "address": "10.0.0.1"}, headers=AS_AGENT).status_code == 201
    assert client.post("/services", headers=AS_AGENT, json={
        "job_id": "job-1", "name": "web", "node_id": NODE, "address": "10.0.0.1", "port": 8080}).status_code == 201
    return client


def make_scheduler(directory):
    settings = SchedulerSettings(database_url=f"sqlite:///{directory}/scheduler.db", tokens=TOKENS)
    client = create_scheduler(settings).test_client()
    assert client.post("/jobs", json={"command": "true"}, headers=AS_OPERATOR).status_code == 201
    return client


MAKE = {"registry": make_registry, "scheduler": make_scheduler}


@pytest.fixture
def registry(tmp_path):
    return make_registry(tmp_path)


@pytest.fixture
def scheduler(tmp_path):
    return make_scheduler(tmp_path)


REPORT = {"node_id": NODE, "attempt": 1, "status": "running"}

# (method, path, body, the status the right role gets): the route ran, past the check.
SCHEDULER_CASES = {
    "operator": [
        ("POST", "/jobs", {"command": "true"}, 201),
        ("POST", "/jobs/batch", {"jobs": [{"command": "true"}]}, 201),
        ("GET", "/jobs/job-1", None, 200),
        ("GET", "/jobs/job-1/events", None, 200),
        ("POST", "/jobs/job-1/cancel", None, 200),
        ("POST", "/jobs/job-1/retry", None, 409),  # only failed jobs: the route said so
        ("GET", "/stats", None, 200),
    ],
    "agent": [
        ("POST", f"/nodes/{NODE}/claim", {"max": 1, "wait_secs": 0}, 200),
        ("POST", f"/nodes/{NODE}/lease", {}, 200),
        ("POST", "/jobs/job-1/status", REPORT, 409),  # not placed on the node: the store said so
        ("POST", "/jobs/reports", {"reports": [dict(REPORT, job_id="job-1")]}, 200),
        ("POST", "/jobs/output", {"outputs": [{"job_id": "job-1", "node_id": NODE, "attempt": 1,
                                               "stdout": "x"}]}, 200),
    ],
    "either": [
        ("GET", f"/jobs?node_id={NODE}&status=pending", None, 200),
    ],
}
REGISTRY_CASES = {
    "operator": [
        ("POST", f"/nodes/{NODE}/drain", None, 200),
        ("POST", f"/nodes/{NODE}/undrain", None, 200),
        ("DELETE", f"/nodes/{NODE}", None, 200),
    ],
    "agent": [
        ("POST", "/nodes", {"node_id": NODE, "address": "10.0.0.1"}, 200),
        ("POST", f"/nodes/{NODE}/heartbeat", {"running": 0}, 200),
        ("POST", "/services", {"job_id": "job-2", "name": "web", "node_id": NODE, "address": "10.0.0.1",
                               "port": 8081}, 201),
    ],
    "either": [
        ("GET", "/nodes", None, 200),
        ("GET", f"/nodes/{NODE}", None, 200),
        ("GET", "/services", None, 200),
        ("DELETE", "/services/job-1", None, 200),
    ],
}
ROLE_HEADERS = {"operator": AS_OPERATOR, "agent": AS_AGENT}


def cases(service: str, table: dict) -> list:
    return [pytest.param(service, role, *case, id=f"{service}-{role}-{case[0]} {case[1]}")
            for role, items in table.items() for case in items]


ALL_CASES = cases("scheduler", SCHEDULER_CASES) + cases("registry", REGISTRY_CASES)


def call(client, method, path, body, headers):
    return client.open(path, method=method, json=body, headers=headers)


@pytest.mark.parametrize("service, role, method, path, body, ok", ALL_CASES)
def test_a_missing_token_is_401(request, service, role, method, path, body, ok):
    client = request.getfixturevalue(service)
    response = call(client, method, path, body, {auth.NODE_HEADER: NODE})
    assert response.status_code == 401, response.json
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert "error" in response.json


@pytest.mark.parametrize("service, role, method, path, body, ok", ALL_CASES)
def test_a_wrong_token_is_401(request, service, role, method, path, body, ok):
    client = request.getfixturevalue(service)
    response = call(client, method, path, body, bearer(WRONG_TOKEN, NODE))
    assert response.status_code == 401, response.json
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert WRONG_TOKEN not in response.get_data(as_text=True)


@pytest.mark.parametrize("service, role, method, path, body, ok",
                         [c for c in ALL_CASES if c.values[1] != "either"])
def test_the_other_roles_token_is_403(request, service, role, method, path, body, ok):
    client = request.getfixturevalue(service)
    other = "agent" if role == "operator" else "operator"
    response = call(client, method, path, body, ROLE_HEADERS[other])
    assert response.status_code == 403, response.json
    assert f"an {other} token may not do this" in response.json["error"]


@pytest.mark.parametrize("service, role, method, path, body, ok", ALL_CASES)
def test_the_right_role_gets_through(tmp_path, service, role, method, path, body, ok):
    for name in (("operator", "agent") if role == "either" else (role,)):
        os.mkdir(tmp_path / name)
        client = MAKE[service](tmp_path / name)  # each role on a fresh server: a DELETE works once
        response = call(client, method, path, body, ROLE_HEADERS[name])
        assert response.status_code == ok, (name, response.json)


@pytest.mark.parametrize("service", ["scheduler", "registry"])
@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/openapi.json"])
def test_health_readiness_and_the_document_stay_open(request, service, path):
    client = request.getfixturevalue(service)
    response = client.get(path)
    # /readyz of the scheduler may say "not ready" (no registry here): it answered, unchecked.
    assert response.status_code in ((200, 503) if path == "/readyz" else (200,)), response.json


@pytest.mark.parametrize("service, access", [("scheduler", SCHEDULER_ACCESS), ("registry", REGISTRY_ACCESS)])
def test_every_route_has_an_access_class(request, service, access):
    app = request.getfixturevalue(service).application
    unlisted = sorted(rule.endpoint for rule in app.url_map.iter_rules()
                      if rule.endpoint not in access and rule.endpoint != "static"
                      and not (rule.rule in auth.OPEN_PATHS or rule.rule.startswith(auth.OPEN_PREFIXES)))
    assert not unlisted, f"add {unlisted} to the ACCESS table of the {service} (unlisted: operator-only)"


# ---- agents and their own node -------------------------------------------------------------

OTHER_NODE_CASES = [
    ("scheduler", "POST", f"/nodes/{OTHER_NODE}/claim", {"max": 1, "wait_secs": 0}),
    ("scheduler", "POST", f"/nodes/{OTHER_NODE}/lease", {}),
    ("scheduler", "POST", "/jobs/job-1/status", dict(REPORT, node_id=OTHER_NODE)),
    ("scheduler", "POST", "/jobs/reports", {"reports": [dict(REPORT, job_id="job-1"),
                                                        dict(REPORT, job_id="job-1", node_id=OTHER_NODE)]}),
    ("scheduler", "POST", "/jobs/output", {"outputs": [{"job_id": "job-1", "node_id": OTHER_NODE, "attempt": 1,
                                                        "stdout": "x"}]}),
    ("scheduler", "POST", "/jobs/reports", {"reports": [dict(REPORT, job_id="job-1")],
                                            "claim": {"node_id": OTHER_NODE, "max": 1}}),
    ("scheduler", "GET", f"/jobs?node_id={OTHER_NODE}&status=pending", None),
    ("scheduler", "GET", f"/jobs?node_id={NODE}&node_id={OTHER_NODE}", None),
    ("registry", "POST", "/nodes", {"node_id": OTHER_NODE, "address": "10.0.0.2"}),
    ("registry", "POST", f"/nodes/{OTHER_NODE}/heartbeat", {}),
    ("registry", "POST", "/services", {"job_id": "job-3", "name": "web", "node_id": OTHER_NODE,
                                       "address": "10.0.0.2", "port": 8080}),
]


@pytest.mark.parametrize("service, method, path, body", OTHER_NODE_CASES,
                         ids=[f"{c[0]}-{c[1]} {c[2]}" for c in OTHER_NODE_CASES])
def test_an_agent_naming_another_node_is_403(request, service, method, path, body):
    client = request.getfixturevalue(service)
    response = call(client, method, path, body, AS_AGENT)
    assert response.status_code == 403, response.json
    assert OTHER_NODE in response.json["error"]
    # An operator is not bound to a node.
    if service == "scheduler" and method == "GET":
        assert call(client, method, path, body, AS_OPERATOR).status_code == 200


def test_an_agent_may_not_list_every_nodes_jobs_or_read_one(scheduler):
    for path in ("/jobs", "/jobs?status=running", "/jobs/job-1"):
        assert scheduler.get(path, headers=AS_AGENT).status_code == 403, path


def test_an_agent_must_name_its_node(scheduler, registry):
    no_node = bearer(AGENT_TOKEN)
    assert scheduler.post(f"/nodes/{NODE}/lease", json={}, headers=no_node).status_code == 403
    answer = registry.post(f"/nodes/{NODE}/heartbeat", json={}, headers=no_node)
    assert answer.status_code == 403 and auth.NODE_HEADER in answer.json["error"]


def test_an_agent_removes_only_its_own_nodes_services(registry):
    as_other = bearer(AGENT_TOKEN, OTHER_NODE)
    registry.post("/nodes", json={"node_id": OTHER_NODE, "address": "10.0.0.2"}, headers=as_other)
    registry.post("/services", headers=as_other, json={
        "job_id": "job-9", "name": "db", "node_id": OTHER_NODE, "address": "10.0.0.2", "port": 5432})
    assert registry.delete("/services/job-9", headers=AS_AGENT).status_code == 403
    assert {s["job_id"] for s in registry.get("/services", headers=AS_OPERATOR).json} == {"job-1", "job-9"}
    assert registry.delete("/services/job-9", headers=as_other).status_code == 200


# ---- settings ------------------------------------------------------------------------------

def test_without_tokens_every_route_is_open(tmp_path):
    client = create_registry(RegistrySettings(database_url=f"sqlite:///{tmp_path}/r.db")).test_client()
    assert client.post("/nodes", json={"node_id": NODE, "address": "10.0.0.1"}).status_code == 201
    assert client.post(f"/nodes/{NODE}/drain").status_code == 200


def test_with_one_token_only_that_roles_routes_are_checked(tmp_path):
    only_agents = auth.Tokens(agent=AGENT_TOKEN)
    client = create_registry(RegistrySettings(database_url=f"sqlite:///{tmp_path}/r.db", tokens=only_agents)
                             ).test_client()
    assert client.post("/nodes", json={"node_id": NODE, "address": "10.0.0.1"}).status_code == 401
    assert client.post("/nodes", json={"node_id": NODE, "address": "10.0.0.1"}, headers=AS_AGENT).status_code == 201
    assert client.post(f"/nodes/{NODE}/drain").status_code == 200
    assert client.get("/nodes").status_code == 200


@pytest.mark.parametrize("env, message", [
    ({"CORRAL_API_TOKEN": "short"}, "CORRAL_API_TOKEN must be at least 16 characters"),
    ({"CORRAL_AGENT_TOKEN": "has a space in it, long enough"}, "CORRAL_AGENT_TOKEN may hold only printable"),
    ({"CORRAL_API_TOKEN": OPERATOR_TOKEN, "CORRAL_AGENT_TOKEN": OPERATOR_TOKEN}, "must differ"),
])
def test_bad_tokens_are_a_clear_error_that_does_not_show_them(env, message):
    with pytest.raises(SettingError) as caught:
        auth.server_tokens(env)
    assert message in caught.value.message
    for value in env.values():
        assert value not in caught.value.message
    assert OPERATOR_TOKEN not in repr(auth.server_tokens(TOKEN_ENV))


@pytest.mark.parametrize("bind, local", [
    ("127.0.0.1:9000", True), ("127.3.4.5:9000", True), ("[::1]:9000", True), ("localhost:9000", True),
    ("unix:/run/corral.sock", True), ("fd://3", True), ("tcp://127.0.0.1:9000", True), ("127.0.0.1", True),
    ("0.0.0.0:9000", False), ("10.1.2.3:9000", False), ("[::]:9000", False), (":9000", False),
    ("tcp://0.0.0.0:9000", False), ("no-such-host.invalid:9000", False),
])
def test_only_loopback_binds_are_served_without_tokens(bind, local):
    refusal = auth.bind_refusal(["127.0.0.1:1", bind])
    assert (refusal is None) is local, refusal
    if not local:
        assert bind in refusal and "--insecure" in refusal


# ---- the console scripts: non-loopback addresses ---------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(tmp_path, script, argv, **env) -> Proc:
    return Proc(script, [os.path.join(BIN, script), *argv], base_env(str(tmp_path / "state"), **env),
                str(tmp_path / f"{script}.log"))


def _answers(url: str, **kwargs) -> bool:
    return wait_for(lambda: requests.get(url + "/healthz", timeout=2, **kwargs).ok, timeout=30,
                    message=f"{url} to answer")


@pytest.mark.e2e
@pytest.mark.parametrize("script", ["corral-registry", "corral-scheduler"])
def test_a_server_without_tokens_refuses_a_non_loopback_address(tmp_path, script):
    port = _free_port()
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(f'bind = ["0.0.0.0:{port}"]\n')
    env = base_env(str(tmp_path / "state"))
    for argv in (["--host", "0.0.0.0", "--port", str(port)], ["--gunicorn-config", str(conf)]):
        result = subprocess.run([os.path.join(BIN, script), *argv], env=env, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 2, result.stderr
        lines = [line for line in result.stderr.splitlines() if "error" in line]
        assert lines == [f"{script}: error: refusing to listen on 0.0.0.0:{port} without CORRAL_API_TOKEN or "
                         "CORRAL_AGENT_TOKEN: anyone who reaches it could submit jobs that run as the agents' "
                         "job user; set the tokens (README: Security), or pass --insecure (CORRAL_INSECURE=1)"], \
            result.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["--insecure", "CORRAL_INSECURE=1", "tokens"])
def test_insecure_or_a_token_lets_a_server_listen_on_every_interface(tmp_path, how):
    port = _free_port()
    argv = ["--host", "0.0.0.0", "--port", str(port), "--workers", "1"]
    env = {"CORRAL_INSECURE": "1"} if how == "CORRAL_INSECURE=1" else TOKEN_ENV if how == "tokens" else {}
    proc = _start(tmp_path, "corral-registry", argv + (["--insecure"] if how == "--insecure" else []), **env)
    try:
        assert _answers(f"http://127.0.0.1:{port}")
        nodes = requests.get(f"http://127.0.0.1:{port}/nodes", timeout=5)
        assert nodes.status_code == (401 if how == "tokens" else 200)
    finally:
        assert proc.stop() == 0, proc.output()


# ---- a cluster with tokens: nothing leaks --------------------------------------------------

@pytest.mark.e2e
def test_tokens_never_reach_jobs_logs_or_records(tmp_path):
    cli_token = "auth-test-cli-token-5e5e5e5e5e"
    secrets = (OPERATOR_TOKEN, AGENT_TOKEN, WRONG_TOKEN, cli_token)
    c = Cluster(tmp_path)
    api = requests.Session()
    api.headers.update(AS_OPERATOR)
    try:
        debug = dict(TOKEN_ENV, CORRAL_LOG_LEVEL="DEBUG")
        c.start_registry(**debug)
        c.start_scheduler(**debug)
        # The agent's environment also holds another CORRAL_*TOKEN, which jobs must not see either.
        c.start_agent(NODE, CORRAL_AGENT_TOKEN=AGENT_TOKEN, CORRAL_TOKEN=cli_token, CORRAL_LOG_LEVEL="DEBUG")
        wait_for(lambda: NODE in {n["node_id"] for n in api.get(c.registry_url + "/nodes", timeout=5).json()
                                  if n["status"] == "healthy"}, timeout=30, message="the node to be healthy")
        # An agent with a wrong token is refused, and says so without the token.
        c.start_agent(OTHER_NODE, CORRAL_AGENT_TOKEN=WRONG_TOKEN)
        wait_for(lambda: "not valid" in c.procs[OTHER_NODE].output(), timeout=30,
                 message="the agent with a wrong token to be refused")
        assert requests.post(c.scheduler_url + "/jobs", json={"command": "env"}, timeout=5).status_code == 401
        job = api.post(c.scheduler_url + "/jobs", json={"command": "env; echo end-of-env"}, timeout=10).json()
        done = wait_for(lambda: (lambda j: j if j["status"] in ("done", "failed") else None)(
            api.get(f"{c.scheduler_url}/jobs/{job['job_id']}", timeout=5).json()), timeout=30,
            message="the job to finish")
        assert done["status"] == "done" and "end-of-env" in done["stdout"], done
        assert f"CORRAL_NODE_ID={NODE}" in done["stdout"]  # it is the agent's environment
        assert "TOKEN" not in done["stdout"], done["stdout"]
        events = api.get(f"{c.scheduler_url}/jobs/{job['job_id']}/events", timeout=5).text
        nodes = api.get(c.registry_url + "/nodes", timeout=5).text
        for text in (str(done), events, nodes):
            assert not [s for s in secrets if s in text]
    finally:
        # The databases (job records, events, nodes) and everything else in the state dir.
        stored = {}
        try:
            for root, _, files in os.walk(c.state_dir):
                for name in files:
                    path = os.path.join(root, name)
                    if os.path.isfile(path):  # not the workers' doorbell sockets
                        with open(path, "rb") as f:
                            stored[path] = f.read()
        finally:
            c.stop()
    logs = {name: proc.output() for name, proc in c.procs.items()}
    assert "DEBUG" in logs["scheduler"] and "DEBUG" in logs[NODE]
    for secret in secrets:
        for name, text in logs.items():
            assert secret not in text, f"a token in the {name} log"
        for path, data in stored.items():
            assert secret.encode() not in data, f"a token in {path}"


# ---- TLS -------------------------------------------------------------------------------------

def make_certificates(directory) -> tuple[str, str, str]:
    """A CA made here, and a server certificate it signed for 127.0.0.1: (ca, cert, key) paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corral test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = [str(directory / name) for name in ("ca.pem", "server.pem", "server.key")]
    for path, data in zip(paths, (ca.public_bytes(serialization.Encoding.PEM),
                                  cert.public_bytes(serialization.Encoding.PEM),
                                  key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))):
        with open(path, "wb") as f:
            f.write(data)
    return tuple(paths)


def serve_tls(tmp_path, script: str, cert: str, key: str, ca: str, procs: list, **env) -> str:
    sock = listening_socket()
    argv = [os.path.join(BIN, script), "--bind", f"fd://{sock.fileno()}", "--workers", "1",
            "--certfile", cert, "--keyfile", key]
    procs.append(Proc(script, argv, base_env(str(tmp_path / "state"), **env), str(tmp_path / f"{script}.log"),
                      pass_fds=(sock.fileno(),)))
    url = f"https://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    _answers(url, verify=ca)
    return url


@pytest.mark.e2e
def test_a_job_runs_end_to_end_over_tls_with_a_ca_bundle(tmp_path, state_dir):
    ca, cert, key = make_certificates(tmp_path)
    procs: list[Proc] = []
    try:
        registry = serve_tls(tmp_path, "corral-registry", cert, key, ca, procs, **TOKEN_ENV)
        scheduler = serve_tls(tmp_path, "corral-scheduler", cert, key, ca, procs, REGISTRY_URL=registry,
                              REGISTRY_CA_BUNDLE=ca, NODE_REFRESH_SECS=0.3, DISPATCH_INTERVAL_SECS=0.2, **TOKEN_ENV)
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(scheduler + "/healthz", timeout=5)  # the system's CAs do not know ours
        agent_env = dict(NODE_ID=NODE, REGISTRY_URL=registry, SCHEDULER_URL=scheduler, POLL_INTERVAL_SECS=0.2,
                         HEARTBEAT_INTERVAL_SECS=0.5, CORRAL_AGENT_TOKEN=AGENT_TOKEN)
        # Without the bundle the agent refuses the certificate.
        check = subprocess.run([os.path.join(BIN, "corral-agent"), "--check"], capture_output=True, text=True,
                               env=base_env(state_dir, **agent_env), timeout=60)
        assert check.returncode == 1, check.stdout + check.stderr
        assert "TLS certificate is not trusted" in check.stdout, check.stdout
        procs.append(Proc(NODE, [os.path.join(BIN, "corral-agent")], base_env(state_dir, AGENT_CA_BUNDLE=ca,
                                                                               **agent_env),
                          str(tmp_path / "agent.log")))
        # verify= on each call: requests lets REQUESTS_CA_BUNDLE override a session's own.
        job = requests.post(scheduler + "/jobs", json={"command": "echo over tls"}, headers=AS_OPERATOR,
                            verify=ca, timeout=10).json()
        done = wait_for(lambda: (lambda j: j if j["status"] in ("done", "failed") else None)(
            requests.get(f"{scheduler}/jobs/{job['job_id']}", headers=AS_OPERATOR, verify=ca, timeout=5).json()),
            timeout=60,
            message="the job to finish over TLS")
        assert (done["status"], done["stdout"], done["node_id"]) == ("done", "over tls\n", NODE), done
        # The command line trusts the same CA with --ca-bundle, and refuses the server without it.
        runner = CliRunner()
        base = ["--addr", scheduler, "--token", OPERATOR_TOKEN]
        shown = runner.invoke(cli, [*base, "--ca-bundle", ca, "job", "status", job["job_id"], "--json"])
        assert shown.exit_code == 0 and '"over tls\\n"' in shown.output, shown.output
        refused = runner.invoke(cli, [*base, "job", "status", job["job_id"]])
        assert refused.exit_code == 1 and "not trusted" in refused.output, refused.output
    finally:
        for proc in reversed(procs):
            proc.stop()
        logs = "\n".join(p.output() for p in procs)
    assert OPERATOR_TOKEN not in logs and AGENT_TOKEN not in logs
