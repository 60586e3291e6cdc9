"""control-plane/server/db.py: the per-process connection pool and the writers' queue (an flock
taken before BEGIN IMMEDIATE), on real SQLite files and a real second process."""
import subprocess
import sys
import threading

import peewee
import pytest

from corral.server import db as dbmod
from corral.server.backends import sqlite

HOLD_THE_LOCK = """
import fcntl, sys
fd = open(sys.argv[1], "a+")
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()  # until the test says so
"""


class Row(peewee.Model):
    value = peewee.IntegerField()


@pytest.fixture
def database(tmp_path):
    db = dbmod.open_database(f"sqlite:///{tmp_path}/t.db")
    Row.bind(db)
    with db.connection_context():
        db.create_tables([Row])
    yield db
    dbmod.close_idle(db)


def write(db, value):
    with db.connection_context():
        with db.atomic():
            Row.create(value=value)


def values(db):
    with db.connection_context():
        return sorted(r.value for r in Row.select())


@pytest.mark.slow
def test_a_writer_waits_for_another_process_and_gives_up_after_its_timeout(database, tmp_path):
    assert isinstance(database, sqlite.QueuedWritersSqlite)
    other = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, f"{tmp_path}/t.db-writers.lock"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        database.lock_timeout = 0.3
        with pytest.raises(peewee.OperationalError, match="database is locked"):
            write(database, 1)
        assert values(database) == []          # nothing written, and the lock was given back:
        other.stdin.write("go\n")
        other.stdin.flush()
        assert other.wait(10) == 0
        write(database, 2)                     # the other process is gone: our turn
        assert values(database) == [2]
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()


def test_a_waiting_writer_asks_often_at_first_and_rarely_once_the_wait_is_long():
    schedule, delay, waited = [], sqlite.FLOCK_RETRY_SECS[0], 0.0
    while waited < 0.05:
        schedule.append((waited, delay))
        waited += delay
        delay = sqlite.flock_retry_delay(delay, waited)
    assert [d for _, d in schedule[:4]] == [0.00005, 0.0001, 0.0002, 0.0002]
    # Short transactions: the lock is free again soon, so it asks every 200 µs at most...
    assert max(d for w, d in schedule if w <= sqlite.FLOCK_LONG_WAIT_SECS) == 0.0002
    # ...and behind a long one (a big batch, a purge) every 2 ms.
    assert schedule[-1][1] == 0.002


def test_threads_queue_and_a_failed_transaction_frees_the_line(database):
    with pytest.raises(RuntimeError):
        with database.connection_context():
            with database.atomic():
                Row.create(value=-1)
                raise RuntimeError("rolled back")
    errors = []

    def writer(start):
        try:
            for value in range(start, start + 25):
                write(database, value)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n * 100,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and not any(t.is_alive() for t in threads)
    assert values(database) == sorted(n * 100 + i for n in range(8) for i in range(25))


def test_connections_are_reused_and_closed_before_a_fork(database):
    with database.connection_context():
        first = database.connection()
    with database.connection_context():
        assert database.connection() is first  # from the pool, not a new one
    dbmod.close_idle(database)
    with database.connection_context():
        assert database.connection() is not first


def test_without_a_usable_lock_file_writers_fall_back_to_the_busy_handler(tmp_path, caplog):
    db = dbmod.open_database(f"sqlite:///{tmp_path}/t.db")
    (tmp_path / "t.db-writers.lock").mkdir()  # cannot be opened as a file
    Row.bind(db)
    with db.connection_context():
        db.create_tables([Row])
    write(db, 7)
    assert values(db) == [7] and "busy handler instead" in caplog.text
    dbmod.close_idle(db)
