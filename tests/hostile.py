"""What the tests that play the attacker share: both services on real SQLite files
with a little data in them, a valid body for each route that reads one, a snapshot
of everything stored, text of any character, and the rule every answer to hostile
input must follow.

The rule: never a 5xx; any other answer but a 2xx (no redirect either) is JSON
`{"error": "<a string>"}` and changed nothing in the database; a 2xx (the input
was valid after all) may change it.
"""
import sqlite3
from copy import deepcopy
from collections.abc import Callable
from dataclasses import dataclass, field

from flask import Flask
from hypothesis import strategies as st
from werkzeug.serving import make_server
from werkzeug.test import TestResponse

from corral.registry.app import create_app as create_registry
from corral.registry.settings import RegistrySettings
from corral.scheduler.app import create_app as create_scheduler
from corral.scheduler.settings import SchedulerSettings
from helpers import start_serving

NOW = 1_800_000_000.0
# What Hypothesis draws rarely among all of Unicode, and hostile clients send often.
LONE_SURROGATES = ["\ud800", "\udfff", "a\udc00b", "x\udbff", "\udc00\ud800"]
ODD_TEXT = ["\x00", "a\x01b", "\x1b[2J", "\x7f", "\r\n", "\u2028", "\ufeff", "\U0001F600", ""]

# A valid body for each route that reads one, by service and endpoint (the seed data
# makes them meaningful): the tests make them hostile one part at a time.
# Valid bodies the bare test servers check and then refuse, with the status: personal
# tokens mean nothing without the cluster's tokens (409); the path names no team (404).
REFUSED_AFTER_CHECKS = {("scheduler", "create_token"): 409, ("scheduler", "set_member"): 404,
                        ("scheduler", "update_team"): 404, ("scheduler", "set_quota"): 404}
VALID_BODIES = {
    ("registry", "register_node"): {"node_id": "node-2", "address": "10.0.0.2", "kind": "gpu", "slots": 2,
                                    "cpus": 4, "memory_mb": 1024, "labels": {"zone": "b"}},
    ("registry", "heartbeat"): {"running": 1, "refusing_work": "only 812 MB free on the filesystem of /w"},
    ("registry", "revoke_credential"): {"min_generation": 2},
    ("registry", "register_service"): {"job_id": "job-2", "name": "web", "node_id": "node-1",
                                       "address": "10.0.0.1", "port": 8081, "healthy": True},
    ("scheduler", "submit"): {"command": "echo hi", "env_vars": {"A": "b"}, "name": "n", "memory_mb": 64,
                              "max_retries": 2},
    ("scheduler", "submit_batch"): {"jobs": [{"command": "true", "env_vars": {"A": "b"}}]},
    ("scheduler", "report"): {"node_id": "node-1", "attempt": 1, "status": "running"},
    ("scheduler", "report_batch"): {"reports": [{"job_id": "job-1", "node_id": "node-1", "attempt": 1,
                                                 "status": "running", "cpu_seconds": 0.5}],
                                    "claim": {"node_id": "node-1", "max": 1}},
    ("scheduler", "live_output"): {"outputs": [{"job_id": "job-1", "node_id": "node-1", "attempt": 1,
                                                "stdout": "out"}]},
    ("scheduler", "put_log_chunks"): {"chunks": [{"job_id": "job-1", "node_id": "node-1", "attempt": 1,
                                                  "stream": "stdout", "seq": 0, "offset": 0, "data": "aGkK"}]},
    ("scheduler", "set_concurrency"): {"limit": 3},
    ("scheduler", "create_token"): {"name": "laptop"},
    ("scheduler", "update_team"): {"max_timeout_secs": 7200},
    ("scheduler", "set_quota"): {"guaranteed": {"jobs": 4}, "borrowing_limit": {"cpu_percent": 400}},
    ("scheduler", "drain_node"): {"deadline_secs": 600},
    ("scheduler", "create_team"): {"name": "ml"},
    ("scheduler", "create_user"): {"name": "alice"},
    ("scheduler", "set_member"): {"role": "member"},
    ("scheduler", "revoke_credential"): {"min_generation": 2},
    ("scheduler", "create_schedule"): {"name": "nightly", "cron": "30 2 * * *", "time_zone": "Europe/Berlin",
                                       "job": {"command": "true", "env_vars": {"A": "b"}}, "overlap": "skip"},
    ("scheduler", "change_schedule"): {"enabled": False, "catch_up": "all"},
    ("scheduler", "renew_lease"): {"usage": {"memory_mb": 100, "cpu_percent": 50}},
    ("scheduler", "claim"): {"max": 1, "wait_secs": 0, "default_limits": {"run": {"memory_mb": 64,
                                                                                   "cpu_percent": 50}}},
}


@dataclass
class Service:
    name: str
    app: Flask
    db_path: str
    close: Callable[[], None] = lambda: None  # stops what it started (the scheduler's registry)
    # The last snapshot, and the database's data_version when it was taken.
    _reader: sqlite3.Connection | None = field(default=None, repr=False)
    _snapshot: dict[str, list[str]] | None = field(default=None, repr=False)
    _version: int = -1

    @property
    def client(self):
        return self.app.test_client()

    def stored(self) -> dict[str, list[str]]:
        """Every row of every table but the audit log, in a stable order: what 'changed
        nothing' compares (a refusal is recorded in the audit log on purpose).
        Read again only when another connection committed since the last read (SQLite's
        data_version on a connection of our own says): thousands of requests change nothing."""
        if self._reader is None:
            self._reader = sqlite3.connect(self.db_path, check_same_thread=False)
        conn = self._reader
        # Read before the rows: a commit in between is read again next time. fetchall: no statement left open.
        version = conn.execute("PRAGMA data_version").fetchall()[0][0]
        if self._snapshot is None or version != self._version:
            tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                      if row[0] not in RECORDS_OF_REQUESTS]
            self._snapshot = {table: sorted(repr(row) for row in conn.execute(f'SELECT * FROM "{table}"'))
                              for table in tables}
            self._version = version
        return self._snapshot


# Tables that record requests, refusals included: not what a refusal must leave alone.
RECORDS_OF_REQUESTS = frozenset({"audit_event"})


def registry(tmp_path) -> Service:
    """A registry (no tokens) knowing node-1 and the service of job-1."""
    db_path = f"{tmp_path}/registry.db"
    app = create_registry(RegistrySettings(database_url=f"sqlite:///{db_path}"), clock=lambda: NOW)
    client = app.test_client()
    node = {"node_id": "node-1", "address": "10.0.0.1", "slots": 2, "labels": {"zone": "a"}}
    assert client.post("/nodes", json=node).status_code == 201
    service = {"job_id": "job-1", "name": "web", "node_id": "node-1", "address": "10.0.0.1", "port": 8080}
    assert client.post("/services", json=service).status_code == 201
    return Service("registry", app, db_path)


def scheduler(tmp_path) -> Service:
    """A scheduler (no tokens, no background loops) with a healthy node-1 (so /readyz
    answers without asking a registry), job-1 running there, job-2 pending and the
    schedule x. Claims answer at once, whatever wait they ask for; event streams end
    after their first look (one place each in the waiting room, freed when they end)."""
    db_path = f"{tmp_path}/scheduler.db"
    # A registry of its own for the routes the scheduler passes on (a drain), served on a
    # free loopback port: never the one a local cluster may be listening on.
    registry_dir = tmp_path / "registry"
    registry_dir.mkdir(parents=True, exist_ok=True)
    served = make_server("127.0.0.1", 0, registry(registry_dir).app, threaded=True)
    start_serving(served)
    # No waiting room: a claim that finds nothing answers at once (no test here wants it to wait).
    settings = SchedulerSettings(database_url=f"sqlite:///{db_path}", long_poll_max_waiters=0,
                                 events_stream_max_secs=0.0, registry_url=f"http://127.0.0.1:{served.server_port}")
    app = create_scheduler(settings, clock=lambda: NOW)
    app.extensions["corral.store"].nodes.sync_nodes(
        [{"node_id": "node-1", "address": "10.0.0.1", "kind": "compute", "slots": 1, "status": "healthy"}], NOW)
    client = app.test_client()
    for command in ("sleep 1000", "true"):
        assert client.post("/jobs", json={"command": command}).status_code == 201
    claimed = client.post("/nodes/node-1/claim", json={"max": 1, "wait_secs": 0}).json
    assert [job["job_id"] for job in claimed] == ["job-1"]
    running = {"node_id": "node-1", "attempt": claimed[0]["attempt"], "status": "running"}
    assert client.post("/jobs/job-1/status", json=running).status_code == 200
    # A schedule for the routes that name one (a path segment is filled with "x").
    assert client.post("/schedules", json={"name": "x", "cron": "@daily", "job": {"command": "true"}}
                       ).status_code == 201
    return Service("scheduler", app, db_path, close=served.shutdown)


def problem(response: TestResponse, method: str, before: dict, after: dict) -> str | None:
    """What is wrong with this answer to hostile input, or None."""
    status = response.status_code
    if status >= 500:
        return f"answered {status}: {response.get_data()[:300]!r}"
    if status < 300 or method == "HEAD":
        return None
    body = response.get_json(silent=True)
    if not (isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"]):
        return f"answered {status} without a JSON error: {response.get_data()[:300]!r}"
    if after != before:
        changed = sorted(table for table in after if after[table] != before.get(table))
        return f"answered {status} ({body['error'][:200]}) but changed the tables {changed}"
    return None


def positions(node, path: tuple = ()):
    """("value", path) of every scalar in `node` and ("key", path, key) of every key."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield ("key", path, key)
            yield from positions(value, path + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from positions(value, path + (index,))
    else:
        yield ("value", path)


def replace_at(body, position: tuple, new):
    """A copy of `body` with the value, or the key, at `position` replaced by `new`."""
    copy = deepcopy(body)
    kind, path, *key = position
    target = copy
    for step in path[:-1] if kind == "value" else path:
        target = target[step]
    if kind == "value":
        target[path[-1]] = new
    else:
        target[new] = target.pop(key[0])
    return copy


def any_text(surrogates: bool = True, min_size: int = 0) -> st.SearchStrategy[str]:
    """Text of any character (lone surrogates only if `surrogates`: JSON can carry
    them as escapes, a URL cannot), or one of the few that matter most."""
    if surrogates:
        anything = st.text(st.characters(exclude_categories=()), min_size=min_size, max_size=10)
        return st.one_of(anything, st.sampled_from(LONE_SURROGATES), st.sampled_from(ODD_TEXT))
    anything = st.text(st.characters(exclude_categories=["Cs"]), min_size=min_size, max_size=10)
    return anything | st.sampled_from([text for text in ODD_TEXT if len(text) >= min_size])
