"""Revoking one node's credential without rotating the agent secret
(control-plane/server/revocations.py): every node route of both services refuses the revoked
credential, the node's next generation works, other nodes are untouched, only
operators revoke, and bad requests change nothing."""

import pytest
from werkzeug.serving import make_server

from helpers import start_serving
from test_auth import (AGENT_SECRET, AS_NODE, AS_OPERATOR, AS_OTHER_NODE, AS_READER, CREDENTIALS, NODE,
                       NODE_TOKEN, OTHER_NODE, ROUTES, bearer, call, seed_registry, seed_scheduler)

from corral.registry.app import create_app as create_registry
from corral.registry.settings import RegistrySettings
from corral.scheduler.app import create_app as create_scheduler
from corral.scheduler.settings import SchedulerSettings
from corral.shared import credentials as cred

# The routes a node credential may use (test_auth.ROUTES' kinds).
NODE_KINDS = ("node", "both", "both-own", "read-both", "read-both-own")
NEXT_TOKEN = cred.node_token(AGENT_SECRET, NODE, 2)


class Cluster:
    """A registry served on a loopback port (the scheduler tells it of revocations)
    and a test client of the service under test."""

    def __init__(self, tmp_path, service: str):
        self.registry_app = create_registry(RegistrySettings(database_url=f"sqlite:///{tmp_path}/registry.db",
                                                             credentials=CREDENTIALS))
        self.server = make_server("127.0.0.1", 0, self.registry_app, threaded=True)
        start_serving(self.server)
        self.registry = self.registry_app.test_client()
        seed_registry(self.registry)
        if service == "registry":
            self.client = self.registry
        else:
            self.client = create_scheduler(SchedulerSettings(
                database_url=f"sqlite:///{tmp_path}/scheduler.db", credentials=CREDENTIALS,
                registry_url=f"http://127.0.0.1:{self.server.server_port}",
                events_stream_max_secs=0.0)).test_client()
            seed_scheduler(self.client)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def cluster(request, tmp_path):
    c = Cluster(tmp_path, request.param)
    try:
        yield c
    finally:
        c.close()


def revoke(client, node_id: str = NODE, body=None, headers=AS_OPERATOR):
    return call(client, "POST", f"/nodes/{node_id}/credential/revoke", body, headers)


def test_a_credential_names_its_generation_and_reads_one_way():
    assert cred.node_token(AGENT_SECRET, NODE, 1) == NODE_TOKEN  # the first keeps the old form
    assert NEXT_TOKEN.startswith(f"{NODE}~2.")
    assert CREDENTIALS.identify(NEXT_TOKEN) == cred.Caller("agent", NODE, 2)
    assert CREDENTIALS.identify(NODE_TOKEN) == cred.Caller("agent", NODE, 1)
    assert cred.token_node(NEXT_TOKEN) == NODE
    mac = NEXT_TOKEN.rpartition(".")[2]
    # Another spelling of a generation, or one moved onto another subject, is no credential.
    for forged in (f"{NODE}~02.{mac}", f"{NODE}~1.{mac}", f"{NODE}~3.{mac}", f"{NODE}.{mac}",
                   f"{NODE}~.{mac}", f"{NODE}~-2.{mac}", f"~2.{mac}", f"{NODE}~2~2.{mac}"):
        assert CREDENTIALS.identify(forged) is None, forged
    with pytest.raises(ValueError):
        cred.node_token(AGENT_SECRET, NODE, 0)


@pytest.mark.parametrize("cluster", ["scheduler", "registry"], indirect=True)
def test_a_revoked_credential_is_refused_on_every_node_route_and_the_next_generation_works(cluster):
    client = cluster.client
    service = "registry" if client is cluster.registry else "scheduler"
    answer = revoke(client)
    assert answer.status_code == 200, answer.json
    assert answer.json["node_id"] == NODE and answer.json["min_generation"] == 2
    failures = []
    for endpoint, (method, path, body, who) in ROUTES[service].items():
        if who not in NODE_KINDS:
            continue
        old = call(client, method, path, body, AS_NODE)
        if old.status_code != 401 or "revoked" not in old.json.get("error", "") \
                or not old.headers.get("WWW-Authenticate", "").startswith("Bearer"):
            failures.append((endpoint, "revoked", old.status_code, old.get_data(as_text=True)[:200]))
        if who in ("both", "read-both"):
            other = call(client, method, path, body, AS_OTHER_NODE)
            if other.status_code in (401, 403):
                failures.append((endpoint, "other node", other.status_code, other.get_data(as_text=True)[:200]))
        new = call(client, method, path, body, bearer(NEXT_TOKEN))
        if new.status_code in (401, 403):
            failures.append((endpoint, "next generation", new.status_code, new.get_data(as_text=True)[:200]))
    assert not failures, "\n".join(map(str, failures))
    # The registry refuses it as well: through the scheduler, one call revokes on both.
    heartbeat = cluster.registry.post(f"/nodes/{NODE}/heartbeat", json={}, headers=AS_NODE)
    assert heartbeat.status_code == 401, heartbeat.json
    assert cluster.registry.post(f"/nodes/{NODE}/heartbeat", json={}, headers=bearer(NEXT_TOKEN)).status_code == 200
    assert cluster.registry.post(f"/nodes/{OTHER_NODE}/heartbeat", json={},
                                 headers=AS_OTHER_NODE).status_code in (200, 404)


@pytest.mark.parametrize("cluster", ["scheduler", "registry"], indirect=True)
def test_only_operators_revoke_and_bad_requests_change_nothing(cluster):
    client = cluster.client
    for headers, status in ((AS_READER, 403), (AS_NODE, 403), (AS_OTHER_NODE, 403), ({}, 401),
                            (bearer("x" * 40), 401)):
        answer = revoke(client, headers=headers)
        assert answer.status_code == status and "error" in answer.json, (headers, answer.json)
    for node_id in ("-x", "x" * 129, "a%20b", "a~2", "%2e%2e"):
        answer = revoke(client, node_id=node_id)
        assert answer.status_code in (400, 404) and "error" in answer.json, (node_id, answer.status_code)
    for body in ({"min_generation": 1}, {"min_generation": 0}, {"min_generation": "3"}, {"min_generation": True},
                 {"min_generation": 2.0}, {"min_generation": 10 ** 12}, {"generation": 3}, [], "x"):
        answer = revoke(client, body=body)
        assert answer.status_code == 400 and "error" in answer.json, (body, answer.json)
    # Nothing was revoked: the node's first credential still works on both services.
    assert cluster.registry.post(f"/nodes/{NODE}/heartbeat", json={}, headers=AS_NODE).status_code == 200
    assert revoke(client).json["min_generation"] == 2


@pytest.mark.parametrize("cluster", ["scheduler", "registry"], indirect=True)
def test_a_named_generation_is_idempotent_and_the_floor_never_goes_down(cluster):
    client = cluster.client
    for body, floor in (({"min_generation": 5}, 5), ({"min_generation": 5}, 5), ({"min_generation": 3}, 5),
                        (None, 6)):
        answer = revoke(client, body=body)
        assert (answer.status_code, answer.json["min_generation"]) == (200, floor), answer.json
    assert cluster.registry.post(f"/nodes/{NODE}/heartbeat", json={},
                                 headers=bearer(cred.node_token(AGENT_SECRET, NODE, 5))).status_code == 401
    assert cluster.registry.post(f"/nodes/{NODE}/heartbeat", json={},
                                 headers=bearer(cred.node_token(AGENT_SECRET, NODE, 6))).status_code == 200
    # A node that is not registered (or was removed) can be revoked too: its credential exists anyway.
    assert revoke(client, node_id="never-registered").json["min_generation"] == 2


def test_the_scheduler_changes_nothing_when_the_registry_cannot_be_told(tmp_path):
    from helpers import free_port
    client = create_scheduler(SchedulerSettings(
        database_url=f"sqlite:///{tmp_path}/scheduler.db", credentials=CREDENTIALS,
        registry_url=f"http://127.0.0.1:{free_port()}", events_stream_max_secs=0.0)).test_client()
    answer = revoke(client)
    assert answer.status_code == 503 and "registry" in answer.json["error"], answer.json
    listed = client.get(f"/jobs?node_id={NODE}&status=running", headers=AS_NODE)
    assert listed.status_code == 200, listed.json


@pytest.mark.slow
def test_node_token_prints_the_credential_of_a_generation(tmp_path, monkeypatch, capsys):
    import os
    import subprocess

    from cluster import BIN, base_env
    from corral.scheduler.cli import main
    from test_auth import TOKEN_ENV
    env = base_env(str(tmp_path), **TOKEN_ENV)
    script = os.path.join(BIN, "corral-scheduler")
    printed = subprocess.run([script, "node-token", NODE, "--generation", "2"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert (printed.returncode, printed.stdout.strip()) == (0, NEXT_TOKEN), printed.stderr
    # The installed script works; the other cases run its main() in this process, in the same environment.
    for name, value in TOKEN_ENV.items():
        monkeypatch.setenv(name, value)

    def node_token(*args):
        with pytest.raises(SystemExit) as exited:
            main(["node-token", NODE, *args])
        return subprocess.CompletedProcess(args, exited.value.code, capsys.readouterr().out)
    first = node_token()
    assert first.stdout.strip() == NODE_TOKEN
    for bad in ("0", "-1", "1000000000", "x"):
        refused = node_token("--generation", bad)
        assert refused.returncode == 2 and not refused.stdout, (bad, refused.stdout)


@pytest.mark.parametrize("cluster", ["scheduler"], indirect=True)
def test_corral_node_revoke_credential_revokes_on_both_and_says_how_to_issue_the_next(cluster, tmp_path):
    from click.testing import CliRunner

    from corral.cli.main import cli
    from test_auth import OPERATOR_TOKEN, READER_TOKEN
    app = cluster.client.application
    scheduler = make_server("127.0.0.1", 0, app, threaded=True)
    start_serving(scheduler)
    try:
        addrs = ["--addr", f"http://127.0.0.1:{scheduler.server_port}",
                 "--registry-addr", f"http://127.0.0.1:{cluster.server.server_port}"]
        refused = CliRunner().invoke(cli, addrs + ["--token", READER_TOKEN, "node", "revoke-credential", NODE])
        assert refused.exit_code != 0 and "CORRAL_TOKEN" in refused.output, refused.output
        assert cluster.registry.post(f"/nodes/{NODE}/heartbeat", json={}, headers=AS_NODE).status_code == 200
        done = CliRunner().invoke(cli, addrs + ["--token", OPERATOR_TOKEN, "node", "revoke-credential", NODE])
        assert done.exit_code == 0, done.output
        assert f"corral-scheduler node-token {NODE} --generation 2" in done.output, done.output
        assert cluster.registry.post(f"/nodes/{NODE}/heartbeat", json={}, headers=AS_NODE).status_code == 401
        assert call(cluster.client, "GET", f"/jobs?node_id={NODE}", None, AS_NODE).status_code == 401
        again = CliRunner().invoke(cli, addrs + ["--token", OPERATOR_TOKEN, "node", "revoke-credential", NODE,
                                                 "--min-generation", "2", "--json"])
        assert again.exit_code == 0 and '"min_generation": 2' in again.output, again.output
    finally:
        scheduler.shutdown()
        scheduler.server_close()


@pytest.mark.parametrize("cluster", ["scheduler", "registry"], indirect=True)
def test_past_the_last_generation_a_revocation_is_a_conflict_that_changes_nothing(cluster):
    client = cluster.client
    last = cred.MAX_GENERATION
    assert revoke(client, body={"min_generation": last}).json["min_generation"] == last
    answer = revoke(client)
    assert answer.status_code == 409 and "rotate the agent secret" in answer.json["error"], answer.json
    assert revoke(client, body={"min_generation": last}).json["min_generation"] == last
    last_token = bearer(cred.node_token(AGENT_SECRET, NODE, last))
    assert cluster.registry.post(f"/nodes/{NODE}/heartbeat", json={}, headers=last_token).status_code == 200


def test_revocations_at_once_on_each_database_end_at_the_highest(database_url, tmp_path):
    """PostgreSQL too (each service in its own schema): revocations sent at the same
    time never lower one another, and both services refuse the old credential."""
    from concurrent.futures import ThreadPoolExecutor
    scheduler_url = database_url if database_url.startswith("postgresql") else f"sqlite:///{tmp_path}/sched.db"
    registry_app = create_registry(RegistrySettings(database_url=database_url, credentials=CREDENTIALS))
    server = make_server("127.0.0.1", 0, registry_app, threaded=True)
    start_serving(server)
    try:
        scheduler_app = create_scheduler(SchedulerSettings(
            database_url=scheduler_url, credentials=CREDENTIALS, events_stream_max_secs=0.0,
            registry_url=f"http://127.0.0.1:{server.server_port}"))

        def send(generation: int) -> int:
            answer = revoke(scheduler_app.test_client(), body={"min_generation": generation})
            assert answer.status_code == 200, answer.json
            return answer.json["min_generation"]

        with ThreadPoolExecutor(8) as pool:
            floors = list(pool.map(send, [2, 9, 3, 7, 4, 8, 5, 6]))
        assert max(floors) == 9
        assert revoke(scheduler_app.test_client(), body={"min_generation": 2}).json["min_generation"] == 9
        registry = registry_app.test_client()
        seed_registry_node = registry.post("/nodes", json={"node_id": NODE, "address": "10.0.0.1"},
                                           headers=bearer(cred.node_token(AGENT_SECRET, NODE, 9)))
        assert seed_registry_node.status_code == 201, seed_registry_node.json
        for client, path in ((registry, "/nodes"), (scheduler_app.test_client(), f"/jobs?node_id={NODE}")):
            old = call(client, "GET", path, None, bearer(cred.node_token(AGENT_SECRET, NODE, 8)))
            assert old.status_code == 401, old.json
            assert call(client, "GET", path, None, bearer(cred.node_token(AGENT_SECRET, NODE, 9))).status_code == 200
    finally:
        server.shutdown()
        server.server_close()
