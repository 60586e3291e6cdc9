"""Access control (control-plane/server/auth.py, shared/credentials.py): deny by default, node
identities derived from the agent secret, every route of both services against every
credential, no open server on a non-loopback address, tokens kept out of logs, jobs
and records, and TLS with a CA bundle."""
import os
import shutil
import subprocess
import time
from dataclasses import dataclass

import pytest
import requests
from click.testing import CliRunner

from cluster import BIN, Cluster, Proc, base_env, listening_socket, wait_scheduler_sees_healthy
from certs import make_certificates
from helpers import free_port, wait_for

from corral.agent.settings import AgentSettings
from corral.cli.main import cli
from corral.registry.app import create_app as create_registry
from corral.registry.settings import RegistrySettings
from corral.scheduler.app import create_app as create_scheduler
from corral.scheduler.settings import SchedulerSettings
from corral.shared import credentials as cred
from corral.shared.errors import SettingError

OPERATOR_TOKEN = "auth-test-operator-7c1e9f2a5b"
AGENT_SECRET = "auth-test-agent-secret-3d8b6e0f4c"
WRONG_TOKEN = "auth-test-wrong-0000000000"
READER_TOKEN = "auth-test-reader-9a2f4c6e1d"
NODE = "auth-n1"
OTHER_NODE = "auth-n2"
THIRD_NODE = "auth-n3"  # revoked by the route tables' revocation: no other request uses it
NODE_TOKEN = cred.node_token(AGENT_SECRET, NODE)
OTHER_NODE_TOKEN = cred.node_token(AGENT_SECRET, OTHER_NODE)
CREDENTIALS = cred.Credentials(OPERATOR_TOKEN, AGENT_SECRET, reader=READER_TOKEN)
TOKEN_ENV = {"CORRAL_API_TOKEN": OPERATOR_TOKEN, "CORRAL_AGENT_TOKEN": AGENT_SECRET}
GRANT = CREDENTIALS.service_grant("job-1", 1, NODE)
# A python3 every job user may run (the test's own virtualenv may be out of their reach).
PYTHON3 = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")


def bearer(token: str | None) -> dict:
    return {"Authorization": f"Bearer {token}"} if token else {}


AS_OPERATOR = bearer(OPERATOR_TOKEN)
AS_READER = bearer(READER_TOKEN)
AS_NODE = bearer(NODE_TOKEN)
AS_OTHER_NODE = bearer(OTHER_NODE_TOKEN)

# Every credential a client may present. The invalid ones: nothing, a random string,
# NODE's id with a made-up MAC, NODE's credential under another secret, a credential
# with a node id that is not one, the operator token with a byte changed, bytes no
# token has.
PRESENTED = {
    "none": None,
    "wrong": WRONG_TOKEN,
    "forged node": f"{NODE}.{'0' * 64}",
    "another secret": cred.node_token("some-other-cluster-secret-123", NODE),
    "bad node id": "../" + NODE_TOKEN,
    "near operator": OPERATOR_TOKEN[:-1] + "x",
    "near reader": READER_TOKEN[:-1] + "x",
    "binary": "\udcff\udcfe-not-a-token-at-all",
    "operator": OPERATOR_TOKEN,
    "reader": READER_TOKEN,
    "node": NODE_TOKEN,
    "other node": OTHER_NODE_TOKEN,
}
VALID = ("operator", "reader", "node", "other node")

# Every route of both services: one request about NODE's work, and who may make it.
# open: anyone; operator: operators only; node: NODE's own agent only; both: operators
# and every node; both-own: operators, and NODE's agent only (the request is about NODE).
# read...: the read-only token as well (read: with operators; read-both, read-both-own:
# as both and both-own).
REPORT = {"node_id": NODE, "attempt": 1, "status": "running"}


@dataclass(frozen=True)
class Raw:
    """A body of raw bytes (an agent's log chunk) with the headers it goes with."""

    data: bytes
    headers: dict


LOG_ITEM = {"job_id": "job-1", "attempt": 1, "stream": "stdout", "seq": 0, "offset": 0, "data": "aGVsbG8K"}


def log_chunk(node: str) -> Raw:
    return Raw(b"hello\n", {"X-Corral-Node": node, "X-Corral-Log-Offset": "0"})


SCHEDULER_ROUTES = {
    "healthz": ("GET", "/healthz", None, "open"),
    "readyz": ("GET", "/readyz", None, "open"),
    "metrics": ("GET", "/metrics", None, "open"),
    "openapi": ("GET", "/openapi.json", None, "open"),
    "ui.index_html": ("GET", "/ui", None, "open"),
    "ui.dashboard_js": ("GET", "/ui/dashboard.js", None, "open"),
    "ui.dashboard_css": ("GET", "/ui/dashboard.css", None, "open"),
    "stats": ("GET", "/stats", None, "read"),
    "stats_history": ("GET", "/stats/history?since=0", None, "read"),
    "list_nodes": ("GET", "/nodes", None, "read"),
    "submit": ("POST", "/jobs", {"command": "true"}, "operator"),
    "submit_batch": ("POST", "/jobs/batch", {"jobs": [{"command": "true"}]}, "operator"),
    "list_jobs": ("GET", f"/jobs?node_id={NODE}&status=running", None, "read-both-own"),
    "read_job": ("GET", "/jobs/job-1", None, "read"),
    "job_events": ("GET", "/jobs/job-1/events", None, "read"),
    "events_stream": ("GET", "/events", None, "read"),
    "why_it_waits": ("GET", "/jobs/job-2/why", None, "read"),
    "read_array": ("GET", "/arrays/array-1", None, "read"),
    "cancel_array": ("POST", "/arrays/array-1/cancel", None, "operator"),
    "list_schedules": ("GET", "/schedules", None, "read"),
    "create_schedule": ("POST", "/schedules", {"name": "nightly", "cron": "@daily", "job": {"command": "true"}},
                        "operator"),
    "read_schedule": ("GET", "/schedules/nightly", None, "read"),
    "change_schedule": ("PATCH", "/schedules/nightly", {"enabled": False}, "operator"),
    "delete_schedule": ("DELETE", "/schedules/nightly", None, "operator"),
    "schedule_runs": ("GET", "/schedules/nightly/runs", None, "read"),
    "list_concurrency": ("GET", "/concurrency", None, "read"),
    "set_concurrency": ("PUT", "/concurrency/migrations", {"limit": 2}, "operator"),
    "remove_concurrency": ("DELETE", "/concurrency/migrations", None, "operator"),
    "cancel": ("POST", "/jobs/job-2/cancel", None, "operator"),
    "retry": ("POST", "/jobs/job-2/retry", None, "operator"),
    "drain_node": ("POST", f"/nodes/{NODE}/drain", None, "operator"),
    "undrain_node": ("POST", f"/nodes/{NODE}/undrain", None, "operator"),
    "claim": ("POST", f"/nodes/{NODE}/claim", {"max": 1, "wait_secs": 0}, "node"),
    "renew_lease": ("POST", f"/nodes/{NODE}/lease", {}, "node"),
    "report": ("POST", "/jobs/job-1/status", REPORT, "node"),
    "report_batch": ("POST", "/jobs/reports", {"reports": [dict(REPORT, job_id="job-1")]}, "node"),
    "live_output": ("POST", "/jobs/output", {"outputs": [{"job_id": "job-1", "node_id": NODE, "attempt": 1,
                                                          "stdout": "x"}]}, "node"),
    "put_log_chunk": ("PUT", "/jobs/job-1/attempts/1/logs/stdout/0", log_chunk(NODE), "node"),
    "put_log_chunks": ("POST", "/jobs/logs", {"chunks": [dict(LOG_ITEM, node_id=NODE)]}, "node"),
    "revoke_credential": ("POST", f"/nodes/{THIRD_NODE}/credential/revoke", None, "operator"),
    "read_logs": ("GET", "/jobs/job-1/logs?stream=stderr", None, "read"),
    "whoami": ("GET", "/whoami", None, "read"),
    "list_tokens": ("GET", "/tokens", None, "read"),
    "create_token": ("POST", "/tokens", {"name": "laptop"}, "operator"),
    "revoke_token": ("DELETE", "/tokens/tok-0123456789abcdef", None, "operator"),
    "list_teams": ("GET", "/teams", None, "read"),
    "create_team": ("POST", "/teams", {"name": "ml"}, "operator"),
    "update_team": ("PATCH", "/teams/nope", {"max_timeout_secs": 60}, "operator"),
    "delete_team": ("DELETE", "/teams/nope", None, "operator"),
    "set_member": ("PUT", "/teams/nope/members/nobody", {"role": "member"}, "operator"),
    "remove_member": ("DELETE", "/teams/nope/members/nobody", None, "operator"),
    "list_users": ("GET", "/users", None, "read"),
    "create_user": ("POST", "/users", {"name": "alice"}, "operator"),
    "delete_user": ("DELETE", "/users/nobody", None, "operator"),
    "list_audit": ("GET", "/audit", None, "read"),
    "get_usage": ("GET", "/usage", None, "read"),
    "get_fair_share": ("GET", "/usage/fair-share", None, "read"),
    "get_quota": ("GET", "/teams/nope/quota", None, "read"),
    "set_quota": ("PUT", "/teams/nope/quota", {"guaranteed": {"jobs": 1}}, "operator"),
    "delete_quota": ("DELETE", "/teams/nope/quota", None, "operator"),
}
SERVICE = {"job_id": "job-1", "name": "web", "node_id": NODE, "address": "10.0.0.1", "port": 8080,
           "attempt": 1, "grant": GRANT}
REGISTRY_ROUTES = {
    "healthz": ("GET", "/healthz", None, "open"),
    "readyz": ("GET", "/readyz", None, "open"),
    "metrics": ("GET", "/metrics", None, "open"),
    "openapi": ("GET", "/openapi.json", None, "open"),
    "register_node": ("POST", "/nodes", {"node_id": NODE, "address": "10.0.0.1"}, "node"),
    "heartbeat": ("POST", f"/nodes/{NODE}/heartbeat", {"running": 0}, "node"),
    "list_nodes": ("GET", "/nodes", None, "read-both"),
    "read_node": ("GET", f"/nodes/{NODE}", None, "read-both"),
    "drain": ("POST", f"/nodes/{NODE}/drain", None, "operator"),
    "undrain": ("POST", f"/nodes/{NODE}/undrain", None, "operator"),
    "deregister_node": ("DELETE", f"/nodes/{NODE}", None, "operator"),
    "revoke_credential": ("POST", f"/nodes/{THIRD_NODE}/credential/revoke", None, "operator"),
    "register_service": ("POST", "/services", SERVICE, "node"),
    "list_services": ("GET", "/services", None, "read-both"),
    "sd_services": ("GET", "/sd/prometheus/services", None, "read"),
    "sd_nodes": ("GET", "/sd/prometheus/nodes", None, "read"),
    "remove_service": ("DELETE", "/services/job-1", None, "both-own"),
}
ROUTES = {"scheduler": SCHEDULER_ROUTES, "registry": REGISTRY_ROUTES}


def allowed(who: str, presented: str) -> bool:
    return (who == "open" or presented == "operator" and who != "node"
            or presented == "reader" and who.startswith("read")
            or presented == "node" and who in ("node", "both", "both-own", "read-both", "read-both-own")
            or presented == "other node" and who in ("both", "read-both"))


def seed_registry(client) -> None:
    assert client.post("/nodes", json={"node_id": NODE, "address": "10.0.0.1"}, headers=AS_NODE).status_code == 201
    assert client.post("/services", json=SERVICE, headers=AS_NODE).status_code == 201


def seed_scheduler(client) -> None:
    for _ in range(2):
        assert client.post("/jobs", json={"command": "true"}, headers=AS_OPERATOR).status_code == 201


def make(service: str, directory, credentials=CREDENTIALS):
    if service == "registry":
        app = create_registry(RegistrySettings(database_url=f"sqlite:///{directory}/registry.db",
                                               credentials=credentials))
    else:
        # An event stream that ends at once, so that reading its answer does not wait.
        app = create_scheduler(SchedulerSettings(database_url=f"sqlite:///{directory}/scheduler.db",
                                                 credentials=credentials, events_stream_max_secs=0.0,
                                                 registry_url="http://127.0.0.1:1"))  # answers nothing
    client = app.test_client()
    {"registry": seed_registry, "scheduler": seed_scheduler}[service](client)
    return client


def call(client, method, path, body, headers):
    # State-changing requests say they are JSON even without a body (control-plane/server/guards.py).
    if isinstance(body, Raw):
        return client.open(path, method=method, data=body.data, headers={**headers, **body.headers},
                           content_type="application/octet-stream")
    kwargs = {"json": body} if body is not None else (
        {"content_type": "application/json"} if method != "GET" else {})
    return client.open(path, method=method, headers=headers, **kwargs)


@pytest.mark.parametrize("service", ["scheduler", "registry"])
def test_the_route_table_of_this_test_covers_every_route(tmp_path, service):
    app = make(service, tmp_path, cred.Credentials()).application
    endpoints = {rule.endpoint for rule in app.url_map.iter_rules()}
    assert endpoints == set(ROUTES[service]), "a route was added or removed: say here who may call it"


@pytest.mark.slow
@pytest.mark.parametrize("service", ["scheduler", "registry"])
def test_every_route_against_every_credential_with_tokens(tmp_path, service):
    """Deny by default: 401 for no or an invalid credential, 403 for a valid one of a
    role the route does not allow or of another node, through for the rest."""
    client = make(service, tmp_path)
    failures = []
    for endpoint, (method, path, body, who) in ROUTES[service].items():
        # The refused callers first: a DELETE that gets through removes what the next would hit.
        for name, token in sorted(PRESENTED.items(), key=lambda item: allowed(who, item[0])):
            response = call(client, method, path, body, bearer(token))
            if allowed(who, name):
                ok = response.status_code not in (401, 403)
            elif name in VALID:
                ok = response.status_code == 403 and "error" in response.json
            else:
                ok = (response.status_code == 401 and response.headers["WWW-Authenticate"].startswith("Bearer")
                      and "error" in response.json)
            if not ok:
                failures.append((endpoint, name, response.status_code, response.get_data(as_text=True)[:200]))
            for secret in (OPERATOR_TOKEN, AGENT_SECRET, WRONG_TOKEN, READER_TOKEN):
                assert secret not in response.get_data(as_text=True)
    assert not failures, "\n".join(map(str, failures))


@pytest.mark.slow
@pytest.mark.parametrize("service", ["scheduler", "registry"])
def test_without_tokens_every_route_answers_every_caller(tmp_path, service):
    """The tokenless local mode (loopback only): no credential is checked at all."""
    client = make(service, tmp_path, cred.Credentials())
    for endpoint, (method, path, body, _) in ROUTES[service].items():
        for name, token in PRESENTED.items():
            response = call(client, method, path, body, bearer(token))
            assert response.status_code not in (401, 403), (endpoint, name, response.json)


# A node's credential names its node, whatever the request says: each of these is
# NODE's credential acting for OTHER_NODE (path, query, body, batch item, riding claim,
# a record of another node).
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
    ("scheduler", "PUT", "/jobs/job-1/attempts/1/logs/stdout/0", log_chunk(OTHER_NODE)),
    ("scheduler", "POST", "/jobs/logs", {"chunks": [dict(LOG_ITEM, node_id=NODE),
                                                    dict(LOG_ITEM, node_id=OTHER_NODE)]}),
    ("scheduler", "GET", f"/jobs?node_id={OTHER_NODE}&status=pending", None),
    ("scheduler", "GET", f"/jobs?node_id={NODE}&node_id={OTHER_NODE}", None),
    ("registry", "POST", "/nodes", {"node_id": OTHER_NODE, "address": "10.0.0.2"}),
    ("registry", "POST", f"/nodes/{OTHER_NODE}/heartbeat", {}),
    ("registry", "POST", "/services", dict(SERVICE, job_id="job-3", node_id=OTHER_NODE,
                                           grant=CREDENTIALS.service_grant("job-3", 1, OTHER_NODE))),
]


@pytest.mark.parametrize("service, method, path, body", OTHER_NODE_CASES,
                         ids=[f"{c[0]}-{c[1]} {c[2]}" for c in OTHER_NODE_CASES])
@pytest.mark.slow
def test_a_node_cannot_act_for_another_node(tmp_path, service, method, path, body):
    client = make(service, tmp_path)
    for header in ({}, {"X-Corral-Node": OTHER_NODE}):  # a header naming the other node changes nothing
        response = call(client, method, path, body, dict(AS_NODE, **header))
        assert response.status_code == 403, response.json
        assert OTHER_NODE in response.json["error"]
    if service == "scheduler" and method == "GET":  # an operator is bound to no node
        assert call(client, method, path, body, AS_OPERATOR).status_code == 200


def test_the_read_only_token_reads_everything_but_env_var_values_and_changes_nothing(tmp_path):
    client = make("scheduler", tmp_path)
    secret_env = {"DB_PASSWORD": "hunter2-very-secret", "STAGE": "prod"}
    job = client.post("/jobs", json={"command": "true", "env_vars": secret_env}, headers=AS_OPERATOR).json
    client.post("/schedules", json={"name": "nightly", "cron": "0 2 * * *", "job": {"command": "x", "env_vars":
                                    secret_env}}, headers=AS_OPERATOR)
    reads = [f"/jobs/{job['job_id']}", "/jobs", "/schedules/nightly", "/schedules", f"/jobs/{job['job_id']}/why"]
    for path in reads:
        answer = client.get(path, headers=AS_READER)
        assert answer.status_code == 200, (path, answer.json)
        assert "hunter2" not in answer.get_data(as_text=True), path
    assert client.get(f"/jobs/{job['job_id']}", headers=AS_READER).json["env_vars"] == {
        "DB_PASSWORD": "(hidden)", "STAGE": "(hidden)"}
    assert client.get("/schedules/nightly", headers=AS_READER).json["job"]["env_vars"] == {
        "DB_PASSWORD": "(hidden)", "STAGE": "(hidden)"}
    # The operator sees them.
    assert client.get(f"/jobs/{job['job_id']}", headers=AS_OPERATOR).json["env_vars"] == secret_env
    refused = call(client, "POST", f"/jobs/{job['job_id']}/cancel", None, AS_READER)
    assert refused.status_code == 403 and "read-only token" in refused.json["error"]
    assert client.get(f"/jobs/{job['job_id']}", headers=AS_OPERATOR).json["status"] == "pending"


def test_a_node_reads_only_its_own_work(tmp_path):
    client = make("scheduler", tmp_path)
    for path in ("/jobs", "/jobs?status=running", "/jobs/job-1", "/jobs/job-1/events", "/stats", "/stats/history",
                 "/nodes", "/jobs/job-1/logs"):
        assert client.get(path, headers=AS_NODE).status_code == 403, path
    assert client.get(f"/jobs?node_id={NODE}", headers=AS_NODE).status_code == 200


def test_a_node_records_services_of_its_own_jobs_only(tmp_path):
    """The registry takes a node's service record only with the scheduler's grant for
    that job's attempt on that node; another node's record is neither replaced nor
    removed, but for a newer attempt (the job moved)."""
    registry = make("registry", tmp_path)
    as_other = AS_OTHER_NODE
    registry.post("/nodes", json={"node_id": OTHER_NODE, "address": "10.0.0.2"}, headers=as_other)
    mine = dict(SERVICE, job_id="job-9", node_id=OTHER_NODE, address="10.0.0.2",
                grant=CREDENTIALS.service_grant("job-9", 1, OTHER_NODE))
    assert registry.post("/services", json=mine, headers=as_other).status_code == 201
    # NODE overwrites or removes OTHER_NODE's record: refused, even naming itself in the record.
    takeover = dict(mine, node_id=NODE, address="10.6.6.6")
    for grant in (None, "0" * 64, CREDENTIALS.service_grant("job-9", 1, OTHER_NODE),
                  CREDENTIALS.service_grant("job-1", 1, NODE)):
        answer = registry.post("/services", json=dict(takeover, grant=grant), headers=AS_NODE)
        assert answer.status_code in (400, 403), answer.json
    # The same attempt granted to NODE (which the scheduler never hands out) does not replace it either.
    same = dict(takeover, grant=CREDENTIALS.service_grant("job-9", 1, NODE))
    assert registry.post("/services", json=same, headers=AS_NODE).status_code == 409
    assert registry.delete("/services/job-9", headers=AS_NODE, content_type="application/json").status_code == 403
    listed = {s["job_id"]: s for s in registry.get("/services", headers=AS_OPERATOR).json}
    assert (listed["job-9"]["node_id"], listed["job-9"]["address"]) == (OTHER_NODE, "10.0.0.2")
    # The job moved to NODE (attempt 2): its record follows, and the stale attempt cannot take it back.
    moved = dict(takeover, attempt=2, grant=CREDENTIALS.service_grant("job-9", 2, NODE))
    assert registry.post("/services", json=moved, headers=AS_NODE).status_code == 200
    assert registry.post("/services", json=mine, headers=as_other).status_code == 409
    assert registry.delete("/services/job-9", headers=as_other, content_type="application/json").status_code == 403
    assert registry.delete("/services/job-9", headers=AS_NODE, content_type="application/json").status_code == 200


def test_the_scheduler_hands_a_service_grant_to_the_node_only(tmp_path):
    client = make("scheduler", tmp_path)
    for job_id in ("job-1", "job-2"):  # the seeded jobs: out of the way (one slot per node)
        call(client, "POST", f"/jobs/{job_id}/cancel", None, AS_OPERATOR)
    store = client.application.extensions["corral.store"]
    store.nodes.sync_nodes([{"node_id": NODE, "kind": "compute", "slots": 4, "status": "healthy",
                             "address": "10.0.0.1"}], time.time())
    client.post("/jobs", json={"job_type": "service", "command": "sleep 60", "port": 8080}, headers=AS_OPERATOR)
    claimed = client.post(f"/nodes/{NODE}/claim", json={"max": 4, "wait_secs": 0}, headers=AS_NODE).json
    service = [j for j in claimed if j["job_type"] == "service"]
    assert service and service[0]["service_grant"] == CREDENTIALS.service_grant(
        service[0]["job_id"], service[0]["attempt"], NODE)
    shown = client.get(f"/jobs/{service[0]['job_id']}", headers=AS_OPERATOR).json
    assert "service_grant" not in shown


# ---- credentials and settings ---------------------------------------------------------------

def test_a_node_credential_is_the_node_id_and_an_hmac_of_it():
    import hashlib
    import hmac
    mac = hmac.new(AGENT_SECRET.encode(), NODE.encode(), hashlib.sha256).hexdigest()
    assert NODE_TOKEN == f"{NODE}.{mac}"
    assert CREDENTIALS.identify(NODE_TOKEN) == cred.Caller("agent", NODE)
    assert CREDENTIALS.identify(OPERATOR_TOKEN) == cred.Caller("operator")
    for name, token in PRESENTED.items():
        if name not in VALID and token is not None:
            assert CREDENTIALS.identify(token) is None, name
    assert OPERATOR_TOKEN not in repr(CREDENTIALS) and AGENT_SECRET not in repr(CREDENTIALS)


def test_the_previous_secret_keeps_credentials_valid_during_a_rotation():
    new_secret = "auth-test-rotated-secret-9a9a9a9a"
    rotating = cred.Credentials(OPERATOR_TOKEN, new_secret, AGENT_SECRET)
    assert rotating.identify(NODE_TOKEN) == cred.Caller("agent", NODE)  # issued under the old secret
    assert rotating.node_token(NODE) == cred.node_token(new_secret, NODE)
    assert rotating.identify(rotating.node_token(NODE)) == cred.Caller("agent", NODE)
    assert rotating.grant_valid(GRANT, "job-1", 1, NODE)
    done = cred.Credentials(OPERATOR_TOKEN, new_secret)
    assert done.identify(NODE_TOKEN) is None and not done.grant_valid(GRANT, "job-1", 1, NODE)


@pytest.mark.parametrize("env, message", [
    ({"CORRAL_API_TOKEN": OPERATOR_TOKEN}, "CORRAL_API_TOKEN is set but CORRAL_AGENT_TOKEN is not"),
    ({"CORRAL_AGENT_TOKEN": AGENT_SECRET}, "CORRAL_AGENT_TOKEN is set but CORRAL_API_TOKEN is not"),
    ({"CORRAL_AGENT_TOKEN_PREVIOUS": AGENT_SECRET, "CORRAL_API_TOKEN": OPERATOR_TOKEN},
     "CORRAL_API_TOKEN is set but CORRAL_AGENT_TOKEN is not"),
    ({"CORRAL_API_TOKEN": "short", "CORRAL_AGENT_TOKEN": AGENT_SECRET}, "CORRAL_API_TOKEN must be at least 16"),
    ({"CORRAL_API_TOKEN": OPERATOR_TOKEN, "CORRAL_AGENT_TOKEN": "has a space in it, long enough"},
     "CORRAL_AGENT_TOKEN may hold only printable"),
    ({"CORRAL_API_TOKEN": OPERATOR_TOKEN, "CORRAL_AGENT_TOKEN": OPERATOR_TOKEN}, "must differ"),
    ({**TOKEN_ENV, "CORRAL_AGENT_TOKEN_PREVIOUS": OPERATOR_TOKEN}, "must differ"),
    ({"CORRAL_READ_TOKEN": READER_TOKEN}, "CORRAL_READ_TOKEN needs CORRAL_API_TOKEN and CORRAL_AGENT_TOKEN"),
    ({**TOKEN_ENV, "CORRAL_READ_TOKEN": OPERATOR_TOKEN}, "CORRAL_READ_TOKEN must differ"),
    ({**TOKEN_ENV, "CORRAL_READ_TOKEN": AGENT_SECRET}, "CORRAL_READ_TOKEN must differ"),
    ({**TOKEN_ENV, "CORRAL_READ_TOKEN": "short"}, "CORRAL_READ_TOKEN must be at least 16"),
])
def test_a_configuration_that_would_leave_a_role_open_is_a_clear_error(env, message):
    with pytest.raises(SettingError) as caught:
        cred.server_credentials(env)
    assert message in caught.value.message
    for value in env.values():
        assert value not in caught.value.message


@pytest.mark.parametrize("env, message", [
    ({"CORRAL_AGENT_TOKEN": AGENT_SECRET}, "belongs on the registry and the scheduler only"),
    ({"CORRAL_NODE_TOKEN": OTHER_NODE_TOKEN}, f"the credential of node {OTHER_NODE!r}, but NODE_ID is {NODE!r}"),
    ({"CORRAL_NODE_TOKEN": AGENT_SECRET}, "is not a node credential"),
])
def test_an_agent_holds_its_own_node_credential_and_nothing_else(env, message):
    with pytest.raises(SettingError) as caught:
        AgentSettings.from_env({"NODE_ID": NODE, **env})
    assert message in caught.value.message and AGENT_SECRET not in caught.value.message
    assert AgentSettings.from_env({"NODE_ID": NODE, "CORRAL_NODE_TOKEN": NODE_TOKEN}).token == NODE_TOKEN


@pytest.mark.parametrize("bind, local", [
    ("127.0.0.1:9000", True), ("127.3.4.5:9000", True), ("[::1]:9000", True), ("localhost:9000", True),
    ("unix:/run/corral.sock", True), ("fd://3", True), ("tcp://127.0.0.1:9000", True), ("127.0.0.1", True),
    ("0.0.0.0:9000", False), ("10.1.2.3:9000", False), ("[::]:9000", False), (":9000", False),
    ("tcp://0.0.0.0:9000", False), ("no-such-host.invalid:9000", False),
])
def test_only_loopback_binds_are_served_without_tokens(bind, local):
    from corral.server import auth
    refusal = auth.bind_refusal(["127.0.0.1:1", bind])
    assert (refusal is None) is local, refusal
    if not local:
        assert bind in refusal and "--insecure" in refusal


# ---- the console scripts -----------------------------------------------------------------------



def _start(tmp_path, script, argv, **env) -> Proc:
    return Proc(script, [os.path.join(BIN, script), *argv], base_env(str(tmp_path / "state"), **env),
                str(tmp_path / f"{script}.log"))


def _answers(url: str, **kwargs) -> bool:
    return wait_for(lambda: requests.get(url + "/healthz", timeout=2, **kwargs).ok, timeout=30,
                    message=f"{url} to answer")


@pytest.mark.e2e
@pytest.mark.parametrize("script", ["corral-registry", "corral-scheduler"])
def test_a_server_without_tokens_refuses_a_non_loopback_address(tmp_path, script):
    port = free_port()
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(f'bind = ["0.0.0.0:{port}"]\n')
    env = base_env(str(tmp_path / "state"))
    for argv in (["--host", "0.0.0.0", "--port", str(port)], ["--gunicorn-config", str(conf)]):
        result = subprocess.run([os.path.join(BIN, script), *argv], env=env, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 2, result.stderr
        lines = [line for line in result.stderr.splitlines() if "error" in line]
        assert lines == [f"{script}: error: refusing to listen on 0.0.0.0:{port} without CORRAL_API_TOKEN and "
                         "CORRAL_AGENT_TOKEN: anyone who reaches it could submit jobs that run on every node; "
                         "set the tokens (docs/security.md), or pass --insecure (CORRAL_INSECURE=1)"], \
            result.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("script", ["corral-registry", "corral-scheduler"])
@pytest.mark.parametrize("present, missing", [("CORRAL_API_TOKEN", "CORRAL_AGENT_TOKEN"),
                                              ("CORRAL_AGENT_TOKEN", "CORRAL_API_TOKEN")])
def test_a_server_with_one_token_only_refuses_to_start(tmp_path, script, present, missing):
    env = base_env(str(tmp_path / "state"), **{present: TOKEN_ENV[present]})
    result = subprocess.run([os.path.join(BIN, script), "--port", str(free_port())], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: {present} is set but {missing} is not"), lines
    assert TOKEN_ENV[present] not in result.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("script", ["corral-registry", "corral-scheduler"])
def test_node_token_prints_the_credential_a_node_is_accepted_with(tmp_path, script):
    env = base_env(str(tmp_path / "state"), **TOKEN_ENV)
    result = subprocess.run([os.path.join(BIN, script), "node-token", NODE], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == NODE_TOKEN + "\n", result.stderr
    assert CREDENTIALS.identify(result.stdout.strip()) == cred.Caller("agent", NODE)
    for argv, env_used in ((["node-token", "../etc"], env), (["node-token", NODE], base_env(str(tmp_path)))):
        refused = subprocess.run([os.path.join(BIN, script), *argv], env=env_used, capture_output=True,
                                 text=True, timeout=60)
        assert refused.returncode == 2 and refused.stdout == "" and "error" in refused.stderr, refused

@pytest.mark.e2e
@pytest.mark.parametrize("how", ["--insecure", "CORRAL_INSECURE=1", "tokens"])
def test_insecure_or_a_token_lets_a_server_listen_on_every_interface(tmp_path, how):
    port = free_port()
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
    secrets = (OPERATOR_TOKEN, AGENT_SECRET, NODE_TOKEN, WRONG_TOKEN, cli_token)
    c = Cluster(tmp_path)
    api = requests.Session()
    api.headers.update(AS_OPERATOR)
    try:
        debug = dict(TOKEN_ENV, CORRAL_LOG_LEVEL="DEBUG")
        c.start_registry(**debug)
        c.start_scheduler(**debug)
        # The agent's environment also holds another CORRAL_*TOKEN, which jobs must not see either.
        c.start_agent(NODE, CORRAL_NODE_TOKEN=NODE_TOKEN, CORRAL_TOKEN=cli_token, CORRAL_LOG_LEVEL="DEBUG")
        wait_for(lambda: NODE in {n["node_id"] for n in api.get(c.registry_url + "/nodes", timeout=5).json()
                                  if n["status"] == "healthy"}, timeout=30, message="the node to be healthy")
        # An agent with a wrong token is refused, and says so without the token.
        c.start_agent(OTHER_NODE, CORRAL_NODE_TOKEN=f"{OTHER_NODE}.{'0' * 64}")
        wait_for(lambda: "not valid" in c.procs[OTHER_NODE].output(), timeout=30,
                 message="the agent with a wrong token to be refused")
        assert requests.post(c.scheduler_url + "/jobs", json={"command": "env"}, timeout=5).status_code == 401
        job = api.post(c.scheduler_url + "/jobs", json={"command": "env; echo end-of-env"}, timeout=10).json()
        done = wait_for(lambda: (lambda j: j if j["status"] in ("done", "failed") else None)(
            api.get(f"{c.scheduler_url}/jobs/{job['job_id']}", timeout=5).json()), timeout=30,
            message="the job to finish")
        assert done["status"] == "done" and "end-of-env" in done["stdout"], (done["stderr"], done["exit_code"])
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


# ---- a cluster with tokens: nodes over the network ------------------------------------------

@pytest.mark.e2e
def test_a_node_cannot_act_for_another_against_real_servers(tmp_path):
    """Two real agents; node 2's credential, used over HTTP, can neither claim, renew,
    report, heartbeat, register, list nor touch node 1's jobs and service records,
    whatever it names in headers; node 1's own service record is made with its grant."""
    c = Cluster(tmp_path)
    api = requests.Session()
    api.headers.update(AS_OPERATOR)
    as_other = requests.Session()
    as_other.headers.update(dict(AS_OTHER_NODE, **{"X-Corral-Node": NODE}))  # a header proves nothing
    try:
        c.start_registry(**TOKEN_ENV)
        c.start_scheduler(MAX_JOBS_PER_NODE=2, **TOKEN_ENV)
        c.start_agent(NODE, slots=2, CORRAL_NODE_TOKEN=NODE_TOKEN, AGENT_HEALTH_INTERVAL_SECS=0.5)
        c.start_agent(OTHER_NODE, CORRAL_NODE_TOKEN=OTHER_NODE_TOKEN)
        wait_scheduler_sees_healthy(c.scheduler_url, (NODE, OTHER_NODE), 30, OPERATOR_TOKEN)
        port = free_port()
        service = api.post(c.scheduler_url + "/jobs", timeout=10, json={
            "job_type": "service", "instance_id": NODE, "port": port, "name": "auth-web",
            "command": f"exec {PYTHON3} -m http.server --bind 127.0.0.1 {port}"}).json()
        run = api.post(c.scheduler_url + "/jobs", json={"command": "sleep 60", "instance_id": NODE},
                       timeout=10).json()
        listed = wait_for(lambda: [s for s in api.get(c.registry_url + "/services", timeout=5).json()
                                   if s["healthy"]], timeout=30, message="the service to be recorded and healthy")
        assert [(s["job_id"], s["node_id"], s["attempt"]) for s in listed] == [(service["job_id"], NODE, 1)]
        running = wait_for(lambda: (lambda j: j if j["status"] == "running" else None)(
            api.get(f"{c.scheduler_url}/jobs/{run['job_id']}", timeout=5).json()), timeout=30,
            message="the run job to run on node 1")

        report = {"node_id": NODE, "attempt": running["attempt"], "status": "done", "exit_code": 0,
                  "stdout": "forged"}
        refused = [
            as_other.post(f"{c.scheduler_url}/nodes/{NODE}/claim", json={"max": 1, "wait_secs": 0}, timeout=10),
            as_other.post(f"{c.scheduler_url}/nodes/{NODE}/lease", json={}, timeout=10),
            as_other.post(f"{c.scheduler_url}/jobs/{run['job_id']}/status", json=report, timeout=10),
            as_other.post(f"{c.scheduler_url}/jobs/reports", json={"reports": [dict(report, job_id=run["job_id"])]},
                          timeout=10),
            as_other.get(f"{c.scheduler_url}/jobs", params={"node_id": NODE}, timeout=10),
            as_other.get(f"{c.scheduler_url}/jobs/{run['job_id']}", timeout=10),
            as_other.post(f"{c.registry_url}/nodes/{NODE}/heartbeat", json={}, timeout=10),
            as_other.post(f"{c.registry_url}/nodes", json={"node_id": NODE, "address": "10.6.6.6"}, timeout=10),
            as_other.post(f"{c.registry_url}/services", timeout=10, json={
                "job_id": service["job_id"], "name": "auth-web", "node_id": OTHER_NODE, "address": "10.6.6.6",
                "port": port, "attempt": 1}),
            as_other.delete(f"{c.registry_url}/services/{service['job_id']}", json={}, timeout=10),
        ]
        assert [r.status_code for r in refused] == [403] * len(refused), [r.text for r in refused]
        # Reporting as itself about node 1's job: not placed there, refused by the store.
        own = as_other.post(f"{c.scheduler_url}/jobs/{run['job_id']}/status",
                            json=dict(report, node_id=OTHER_NODE), timeout=10)
        assert own.status_code == 409
        after = api.get(f"{c.scheduler_url}/jobs/{run['job_id']}", timeout=5).json()
        assert (after["status"], after["stdout"]) == ("running", running["stdout"])
        record = api.get(c.registry_url + "/services", timeout=5).json()
        assert [(s["node_id"], s["address"]) for s in record] == [(NODE, listed[0]["address"])]
        nodes = {n["node_id"]: n for n in api.get(c.registry_url + "/nodes", timeout=5).json()}
        assert nodes[NODE]["address"] != "10.6.6.6"
        # The service's own node ends it: the record goes.
        api.post(f"{c.scheduler_url}/jobs/{service['job_id']}/cancel", json={}, timeout=10)
        wait_for(lambda: api.get(c.registry_url + "/services", timeout=5).json() == [], timeout=30,
                 message="the record to be removed")
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.stop()


# ---- TLS -------------------------------------------------------------------------------------



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
                         HEARTBEAT_INTERVAL_SECS=0.5, CORRAL_NODE_TOKEN=NODE_TOKEN)
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
    assert OPERATOR_TOKEN not in logs and AGENT_SECRET not in logs and NODE_TOKEN not in logs
