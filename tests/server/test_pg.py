"""The tests' own PostgreSQL (tests/pg.py and the pg_server/pg_url fixtures): a fresh
database per test that peewee reaches through psycopg 3, and no server left behind."""
import json
import os
import socket
import subprocess
import sys

import psycopg
import pytest
from peewee import CharField, IntegerField, Model
from playhouse.db_url import connect

import pg
from helpers import process_gone
from paths import TESTS

pytestmark = pytest.mark.e2e  # starts a PostgreSQL server

needs_postgres = pytest.mark.skipif(pg.missing() is not None, reason=pg.missing() or "")


class Note(Model):
    body = CharField()
    rank = IntegerField()


def test_pg_url_is_an_empty_database_peewee_reaches_through_psycopg3(pg_url: str) -> None:
    assert pg_url.startswith("postgresql://postgres@127.0.0.1:")
    db = connect(pg_url)
    try:
        db.connect()
        # Not psycopg2: peewee would prefer it if it were installed.
        assert type(db._adapter).__name__ == "Psycopg3Adapter"
        assert db.server_version >= 130000  # major * 10000 + minor: 13 or newer
        assert db.execute_sql("SELECT current_database()").fetchone()[0] == pg_url.rsplit("/", 1)[1]
        assert db.get_tables() == []
    finally:
        db.close()


def test_a_table_can_be_created_and_written(pg_url: str) -> None:
    db = connect(pg_url)
    try:
        with db.bind_ctx([Note]):
            db.create_tables([Note])
            with db.atomic():
                Note.insert_many([{"body": "b", "rank": 2}, {"body": "a", "rank": 1}]).execute()
            assert [(n.body, n.rank) for n in Note.select().order_by(Note.rank)] == [("a", 1), ("b", 2)]
        # Committed: another connection sees the rows.
        with psycopg.connect(pg_url, connect_timeout=10) as other:
            assert other.execute("SELECT count(*) FROM note").fetchone()[0] == 2
    finally:
        db.close()


@needs_postgres
def test_start_takes_the_durability_settings_and_stop_ends_the_server() -> None:
    server = pg.start(fsync=True, synchronous_commit=False)
    try:
        pid = read_pid_file(server.data_dir)
        assert not process_gone(pid)
        with psycopg.connect(server.url("postgres"), connect_timeout=10) as conn:
            assert conn.execute("SHOW fsync").fetchone()[0] == "on"
            assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "off"
            assert conn.execute("SHOW listen_addresses").fetchone()[0] == "127.0.0.1"
    finally:
        server.stop()
    assert_no_server_left(pid, server.base_dir)


# Two tests in a session of their own: the second must not see what the first wrote,
# and once the session is over the server must be gone.
SESSION = '''
import json
import os

from playhouse.db_url import connect


def record(pg_server, pg_url, name):
    with open(os.path.join(pg_server.data_dir, "postmaster.pid")) as f:
        pid = int(f.readline())
    with open(os.environ["PG_RECORD"] + name, "w") as f:
        json.dump({"pid": pid, "base_dir": pg_server.base_dir, "url": pg_url}, f)


def test_first_writes(pg_server, pg_url):
    record(pg_server, pg_url, "first")
    db = connect(pg_url)
    db.execute_sql("CREATE TABLE note (body text)")
    db.execute_sql("INSERT INTO note VALUES ('from the first test')")
    db.close()


def test_second_sees_nothing_of_it(pg_server, pg_url):
    record(pg_server, pg_url, "second")
    db = connect(pg_url)
    assert db.get_tables() == []
    db.close()
'''


@needs_postgres
def test_tests_do_not_see_each_others_data_and_the_server_ends_with_the_session(tmp_path) -> None:
    test_file = tmp_path / "test_session.py"
    test_file.write_text(SESSION)
    record = str(tmp_path / "record-")
    # No third-party plugins (schemathesis, hypothesis...): they would only slow the start.
    env = {**os.environ, "PYTHONPATH": TESTS, "PG_RECORD": record, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           str(test_file)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
    assert "2 passed" in done.stdout, done.stdout + done.stderr
    with open(record + "first") as f:
        first = json.load(f)
    with open(record + "second") as f:
        second = json.load(f)
    # One server for the session, a database of its own for each test.
    assert (first["pid"], first["base_dir"]) == (second["pid"], second["base_dir"])
    assert first["url"] != second["url"]
    assert_no_server_left(first["pid"], first["base_dir"])


@needs_postgres
def test_a_port_taken_before_the_server_binds_it_is_given_up_for_another(monkeypatch) -> None:
    # The port is chosen before postgres binds it: another worker's server may get there first.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        choices = iter([taken])
        choose = pg.free_port
        monkeypatch.setattr(pg, "free_port", lambda: next(choices, None) or choose())
        server = pg.start()
        try:
            assert server.port != taken
            with psycopg.connect(server.url("postgres"), connect_timeout=10) as conn:
                assert conn.execute("SELECT 1").fetchone()[0] == 1
        finally:
            server.stop()


def test_the_skip_reason_names_the_package(monkeypatch) -> None:
    monkeypatch.setattr(pg, "find_bindir", lambda: None)
    reason = pg.missing()
    assert reason is not None and "apt package postgresql" in reason


def read_pid_file(data_dir: str) -> int:
    with open(os.path.join(data_dir, "postmaster.pid")) as f:
        return int(f.readline())


def assert_no_server_left(pid: int, base_dir: str) -> None:
    """The postmaster, every backend (all in its process group) and its directory are gone."""
    assert process_gone(pid)
    assert [p for p in process_group(pid) if not process_gone(p)] == []
    assert not os.path.exists(base_dir)


def process_group(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    members.append(int(entry))
            except ProcessLookupError:
                pass
    return members
