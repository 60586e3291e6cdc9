"""The SQLite backend (control-plane/server/backends/sqlite.py): its change feed (data_version and
doorbells), the fallback feed, and what it says when its file or disk goes."""
import os
import socket
import sqlite3
import subprocess
import sys

import pytest

from corral.server import db as dbmod
from corral.server.backends import sqlite
from corral.server.changefeed import IntervalFeed
from helpers import wait_for


def test_the_sqlite_feed_sees_commits_of_other_connections(tmp_path):
    path = str(tmp_path / "feed.db")
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=wal")
    writer.execute("CREATE TABLE t (x)")
    feed = sqlite.DataVersionFeed(path, interval=0.01)
    try:
        feed.ensure_started()
        seen = feed.wait_for_change(0, 5)   # the first read counts as a change
        assert feed.wait_for_change(seen, 0.2) == seen   # nothing committed: no change
        writer.execute("INSERT INTO t VALUES (1)")
        assert feed.wait_for_change(seen, 5) > seen
    finally:
        feed.stop()
        writer.close()


RING_FROM_ANOTHER_PROCESS = """
import sqlite3, sys
from corral.server.backends import sqlite
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("INSERT INTO t VALUES (1)")
conn.close()
sqlite.Doorbells(sys.argv[1] + "-wake").ring()
"""


@pytest.mark.slow
def test_a_commit_in_another_process_rings_the_watchers_doorbell(tmp_path):
    path = str(tmp_path / "feed.db")
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=wal")
    writer.execute("CREATE TABLE t (x)")
    writer.close()
    feed = sqlite.DataVersionFeed(path, interval=30.0)  # only the doorbell can wake it in time
    try:
        feed.ensure_started()
        seen = feed.wait_for_change(0, 5)   # the first read counts as a change
        wait_for(lambda: os.path.exists(os.path.join(path + "-wake", f"{os.getpid()}.sock")), timeout=5,
                 message="the watcher's doorbell")
        subprocess.run([sys.executable, "-c", RING_FROM_ANOTHER_PROCESS, path], check=True, timeout=30)
        assert feed.wait_for_change(seen, 10) > seen
    finally:
        feed.stop(timeout=1)
    # A doorbell nobody listens to any more is removed by the next ring.
    stale = os.path.join(path + "-wake", "999999999.sock")
    bell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    bell.bind(stale)
    bell.close()
    sqlite.Doorbells(path + "-wake").ring()
    assert not os.path.exists(stale)


def test_the_fallback_feed_ticks():
    feed = IntervalFeed(interval=0.01)
    try:
        assert feed.wait_for_change(0, 5) > 0
    finally:
        feed.stop()


def test_each_backend_gets_its_own_feed(tmp_path):
    db = dbmod.open_database(f"sqlite:///{tmp_path}/x.db")
    assert isinstance(dbmod.change_feed(db, "scheduler"), sqlite.DataVersionFeed)
    memory = dbmod.open_database("sqlite:///:memory:")
    assert isinstance(dbmod.change_feed(memory, "scheduler"), IntervalFeed)


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_database_file_that_goes_away_is_noticed_and_refuses_writes(tmp_path, how):
    path = tmp_path / "x.db"
    db = dbmod.open_database(f"sqlite:///{path}")
    with db.connection_context():
        db.execute_sql("CREATE TABLE t (x)")
    checks: dict = {}
    with db.connection_context():
        dbmod.check_ready(db, checks)
    assert checks["database"] == "ok"
    os.unlink(path)
    if how == "replaced":
        sqlite3.connect(path).close()
    # No new connection is opened on whatever is at the path now (sqlite3 would create
    # an empty database there), and the pooled one refuses writes.
    with pytest.raises(dbmod.peewee.OperationalError, match="deleted"):
        with db.connection_context():
            pass
    with pytest.raises((RuntimeError, dbmod.peewee.OperationalError), match="deleted"):
        dbmod.check_ready(db, {})
    with pytest.raises(dbmod.peewee.OperationalError, match="deleted"):
        with db.atomic():
            db.execute_sql("INSERT INTO t VALUES (1)")
    dbmod.close_idle(db)


def test_a_full_disk_is_noticed(tmp_path, monkeypatch):
    db = dbmod.open_database(f"sqlite:///{tmp_path}/x.db")
    real = os.statvfs(tmp_path)

    class Full:
        f_bavail, f_frsize = 10, real.f_frsize

    monkeypatch.setattr(sqlite.os, "statvfs", lambda path: Full())
    assert "full" in db.lost()
    with db.connection_context():
        with pytest.raises(dbmod.peewee.OperationalError, match="full"):
            with db.atomic():
                pass
    dbmod.close_idle(db)


@pytest.mark.e2e
def test_a_running_scheduler_whose_file_is_deleted_says_so_and_keeps_what_it_acknowledged(tmp_path):
    """Today's trap: SQLite goes on writing to the deleted inode, and everything written is
    gone at the next restart. The server must refuse instead, and say why."""
    import requests

    from cluster import Cluster

    c = Cluster(tmp_path)
    try:
        c.start()
        acknowledged = requests.post(c.scheduler_url + "/jobs", json={"command": "true"}, timeout=10).json()
        path = os.path.join(c.state_dir, "scheduler.db")
        moved = path + ".moved-away"
        os.rename(path, moved)          # as a careless cleanup or a restore would
        refused = requests.post(c.scheduler_url + "/jobs", json={"command": "true"}, timeout=10)
        assert refused.status_code == 503 and refused.headers["Content-Type"] == "application/json"
        ready = requests.get(c.scheduler_url + "/readyz", timeout=10)
        assert ready.status_code == 503 and "was deleted" in ready.json()["error"]
        os.rename(moved, path)          # the file is back where it was: the server goes on
        # Every worker goes on (each request may reach either): ready, and the job readable.
        for _ in range(4):
            wait_for(lambda: requests.get(c.scheduler_url + "/readyz", timeout=10).status_code != 503
                     or None, timeout=20, message="the scheduler to be ready again")
            wait_for(lambda: requests.get(f"{c.scheduler_url}/jobs/{acknowledged['job_id']}",
                                          timeout=10).status_code == 200 or None,
                     timeout=20, message="the acknowledged job to be readable again")
    finally:
        c.stop()


def test_writers_take_their_connection_before_the_writers_lock(tmp_path):
    """More writers than pooled connections, each opening its connection with its
    transaction: none may hold the writers' lock while it waits for a connection (every
    connection held by writers waiting for that lock: all stall until the pool's wait ends)."""
    import threading

    db = dbmod.open_database(f"sqlite:///{tmp_path}/x.db", options=dbmod.DatabaseOptions(pool_size=2,
                                                                                         pool_wait_secs=3))
    with db.connection_context():
        db.execute_sql("CREATE TABLE t (x)")
    errors: list[Exception] = []

    def writer(n: int) -> None:
        for i in range(30):
            try:
                if i % 2:
                    db.execute_sql("SELECT count(*) FROM t")   # a request that reads first holds a connection
                with db.atomic():                     # else the connection is opened here, lazily
                    db.execute_sql("INSERT INTO t VALUES (?)", (n * 100 + i,))
            except Exception as exc:  # noqa: BLE001 -- collected for the assertion
                errors.append(exc)
            finally:
                db.close()                            # back to the pool, as a request's teardown does

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    with db.connection_context():
        assert db.execute_sql("SELECT count(*) FROM t").fetchone()[0] == 240
    dbmod.close_idle(db)


def test_a_worker_never_creates_the_database_file(tmp_path, monkeypatch):
    """A server's worker opens only the file its master made: one moved away while the
    worker boots must not come back empty at its path (and be the worker's from then on)."""
    monkeypatch.setattr(sqlite, "_may_create", False)
    path = tmp_path / "away.db"
    db = dbmod.open_database(f"sqlite:///{path}", service="scheduler")
    with pytest.raises(dbmod.peewee.OperationalError, match="does not exist"):
        db.connect()
    assert not path.exists()
    sqlite3.connect(path).close()  # the file is back
    with db.connection_context():
        assert db.execute_sql("SELECT 1").fetchone() == (1,)
    dbmod.close_idle(db)


def test_the_change_feed_never_creates_the_database_file(tmp_path):
    """The watcher waits for a file that is away (waking the waiters meanwhile) instead
    of creating an empty one at its path."""
    path = tmp_path / "moved-away.db"
    feed = sqlite.DataVersionFeed(str(path), interval=0.01)
    woken = []
    feed.add_listener(lambda recheck, nodes: woken.append(True))
    feed.ensure_started()
    try:
        wait_for(lambda: woken, timeout=10, message="the waiters to be woken while the file is away")
        assert not path.exists()
    finally:
        feed.stop()
