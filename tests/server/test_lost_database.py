"""A lost database is refused at start, never replaced by a new, empty one
(control-plane/server/db_marker.py): a SQLite file deleted with the files beside it kept, a
service's PostgreSQL tables dropped. `--init` (CORRAL_DB_INIT=1) starts fresh on
purpose; a first start needs no flag, on either backend, and `make run` shows
the servers' refusal."""
import contextlib
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys

import psycopg
import pytest
import requests

from corral.registry.migrations import MIGRATIONS as REGISTRY_MIGRATIONS
from corral.scheduler.migrations import MIGRATIONS as SCHEDULER_MIGRATIONS
from corral.server import db as dbmod
from corral.server import migrations
from corral.shared.errors import SettingError

from cluster import base_env, listening_socket
from helpers import free_port, wait_for
from make_run import run_local, stop_local

BIN = os.path.dirname(sys.executable)
START_TIMEOUT = 60  # seconds; generous: the machine may be loaded


class Server:
    """`corral-<service>` under gunicorn on a socket of its own (fd://), one worker."""

    def __init__(self, service: str, env: dict, *flags: str):
        self.service = service
        self.sock = listening_socket()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.proc = subprocess.Popen(
            [os.path.join(BIN, f"corral-{service}"), "--bind", f"fd://{self.sock.fileno()}", "--workers", "1",
             *flags], env=env, pass_fds=(self.sock.fileno(),), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def up(self) -> bool:
        """Wait until it answers /healthz (True) or exits (False)."""
        def answered():
            if self.proc.poll() is not None:
                return "exited"
            with contextlib.suppress(requests.RequestException):
                if requests.get(self.url + "/healthz", timeout=5).status_code == 200:
                    return "up"
            return None
        return wait_for(answered, timeout=START_TIMEOUT, message=f"the {self.service} to start or exit") == "up"

    def refusal(self) -> str:
        """Its exit status must be 2 with one error line on stderr, its last (after the
        log's INFO lines): that line."""
        _, stderr = self.proc.communicate(timeout=START_TIMEOUT)
        assert self.proc.returncode == 2, stderr
        errors = [line for line in stderr.splitlines() if ": error: " in line or " ERROR " in line]
        assert errors == stderr.splitlines()[-1:], stderr
        return errors[0]

    def stop(self) -> None:
        self.sock.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.communicate(timeout=45)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.communicate(timeout=10)


@contextlib.contextmanager
def running(service: str, env: dict, *flags: str):
    server = Server(service, env, *flags)
    try:
        assert server.up(), server.proc.communicate(timeout=10)[1]
        yield server
    finally:
        server.stop()


def refused(service: str, env: dict, *flags: str) -> str:
    server = Server(service, env, *flags)
    try:
        return server.refusal()
    finally:
        server.stop()


def write_something(server: Server) -> None:
    """Something a user would miss: a job, or a node."""
    if server.service == "scheduler":
        answer = requests.post(server.url + "/jobs", json={"command": "true"}, timeout=10)
    else:
        answer = requests.post(server.url + "/nodes", json={"node_id": "node-1", "address": "10.0.0.1", "slots": 1,
                                                             "cpus": 1, "memory_mb": 1000}, timeout=10)
    assert answer.status_code == 201, answer.text


def is_empty(server: Server) -> bool:
    if server.service == "scheduler":
        return requests.get(server.url + "/jobs/job-1", timeout=10).status_code == 404
    return requests.get(server.url + "/nodes", timeout=10).json() == []


@pytest.fixture(params=["scheduler", "registry"])
def service(request) -> str:
    return request.param


def migrate(url: str, migration_set, init: bool = False) -> list[str]:
    """Apply `migration_set` in this process, as a server's master does; the steps applied."""
    db = dbmod.open_database(url)
    try:
        return migrations.apply(db, migration_set, init)
    finally:
        dbmod.close_idle(db)


# ---- SQLite -------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_deleted_sqlite_database_is_refused_and_init_starts_an_empty_one(tmp_path, service):
    env = base_env(str(tmp_path))  # a fresh state dir: the first start needs no flag
    path = tmp_path / f"{service}.db"
    with running(service, env) as server:
        write_something(server)
        assert not is_empty(server)
    beside = sorted(p.name for p in tmp_path.iterdir() if p.name != path.name)
    os.unlink(path)  # the files beside it stay: it existed

    line = refused(service, env)
    assert line.startswith(f"corral-{service}: error: the {service} database {path} is missing")
    assert "--init" in line and "CORRAL_DB_INIT=1" in line
    migrate = subprocess.run([os.path.join(BIN, f"corral-{service}"), "migrate", "--check"], env=env,
                             capture_output=True, text=True, timeout=START_TIMEOUT)
    assert migrate.returncode == 2 and "is missing" in migrate.stderr
    assert not path.exists(), "a refused start made a database"
    assert sorted(p.name for p in tmp_path.iterdir()) == beside

    with running(service, env, "--init") as server:
        assert is_empty(server)
        write_something(server)  # the new database is marked as the old one was
    os.unlink(path)
    with running(service, dict(env, CORRAL_DB_INIT="1")) as server:  # the setting, for units
        assert is_empty(server)


def test_an_empty_file_in_place_of_the_database_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path}/scheduler.db"
    migrate(url, SCHEDULER_MIGRATIONS)
    os.unlink(tmp_path / "scheduler.db")
    sqlite3.connect(tmp_path / "scheduler.db").close()  # what sqlite3 leaves when it opens a missing file
    with pytest.raises(SettingError, match="scheduler.db is empty"):
        migrate(url, SCHEDULER_MIGRATIONS)
    assert migrate(url, SCHEDULER_MIGRATIONS, init=True)


def test_a_database_of_a_release_before_the_marker_lost_before_its_first_start_is_refused(tmp_path):
    """No `-id` file yet, but its writers' lock says a database was written there."""
    url = f"sqlite:///{tmp_path}/scheduler.db"
    migrate(url, SCHEDULER_MIGRATIONS)
    for name in ("scheduler.db", "scheduler.db-id"):
        os.unlink(tmp_path / name)
    with pytest.raises(SettingError, match=r"scheduler.db is missing, but .*scheduler.db-writers.lock says"):
        migrate(url, SCHEDULER_MIGRATIONS)
    assert not (tmp_path / "scheduler.db").exists()
    assert migrate(url, SCHEDULER_MIGRATIONS, init=True) and (tmp_path / "scheduler.db-id").exists()


def test_a_database_from_before_the_marker_gets_one_and_a_different_file_is_said(tmp_path, caplog):
    url = f"sqlite:///{tmp_path}/registry.db"
    migrate(url, REGISTRY_MIGRATIONS)
    os.unlink(tmp_path / "registry.db-id")  # as a release before markers left it
    assert migrate(url, REGISTRY_MIGRATIONS) == []
    assert (tmp_path / "registry.db-id").exists()

    other = tmp_path / "other"
    other.mkdir()
    migrate(f"sqlite:///{other}/registry.db", REGISTRY_MIGRATIONS)
    shutil.copy(other / "registry.db", tmp_path / "registry.db")  # another database restored here
    with caplog.at_level(logging.WARNING, logger="corral.server.db_marker"):
        assert migrate(url, REGISTRY_MIGRATIONS) == []
    assert "not the database this server last used" in caplog.text
    assert (tmp_path / "registry.db-id").read_text() == (other / "registry.db-id").read_text()


@pytest.mark.e2e
def test_make_run_shows_the_refusal_of_a_lost_database(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    env = base_env(str(state))
    for service in ("registry", "scheduler"):
        done = subprocess.run([os.path.join(BIN, f"corral-{service}"), "migrate"], env=env, capture_output=True,
                              text=True, timeout=START_TIMEOUT)
        assert done.returncode == 0, done.stderr
    os.unlink(state / "registry.db")
    proc, log = run_local(tmp_path, CORRAL_REGISTRY_PORT=free_port(), CORRAL_SCHEDULER_PORT=free_port())
    try:
        assert proc.wait(START_TIMEOUT) == 1
        output = open(log).read()
        assert f"[registry] corral-registry: error: the registry database {state}/registry.db is missing" in output
        assert "Traceback" not in output
    finally:
        stop_local(proc, grace=0)  # it and everything it started, each in a session of its own


# ---- PostgreSQL -----------------------------------------------------------------------


@pytest.mark.e2e
def test_a_new_postgresql_database_starts_both_and_a_dropped_schema_is_refused(tmp_path, pg_url):
    env = base_env(str(tmp_path), CORRAL_DATABASE_URL=pg_url)
    with running("registry", env) as registry, running("scheduler", env) as scheduler:
        write_something(registry)
        write_something(scheduler)
    with psycopg.connect(pg_url, connect_timeout=10, autocommit=True) as conn:
        conn.execute("DROP SCHEMA corral_scheduler CASCADE")

    line = refused("scheduler", env)
    assert line.startswith("corral-scheduler: error: the scheduler's tables (schema corral_scheduler) are "
                           "missing from postgresql://")
    assert "--init" in line and "CORRAL_DB_INIT=1" in line
    with running("registry", env) as registry:  # its tables are still there
        assert not is_empty(registry)
    with running("scheduler", env, "--init") as scheduler:
        assert is_empty(scheduler)

    with psycopg.connect(pg_url, connect_timeout=10, autocommit=True) as conn:  # the tables, not the schema
        tables = [name for (name,) in conn.execute("SELECT table_name FROM information_schema.tables "
                                                   "WHERE table_schema = 'corral_registry'")]
        conn.execute(", ".join(f'"corral_registry"."{t}"' for t in tables).join(("DROP TABLE ", " CASCADE")))
    assert refused("registry", env).startswith("corral-registry: error: the registry's tables")
