"""The PostgreSQL backend (control-plane/server/backends/postgres.py) against a real server the tests
start: sessions, the pool and its bounded wait, start-up refusals, the database's
clock, LISTEN/NOTIFY between replicas, placement under concurrency (the advisory
lock, SKIP LOCKED claims) and the health gauges."""
import contextlib
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import peewee
import psycopg
import pytest

from corral.registry.app import create_app as registry_app
from corral.registry.settings import RegistrySettings
from corral.scheduler.app import create_app
from corral.scheduler.models import Job, JobEvent
from corral.scheduler.settings import SchedulerSettings
from corral.scheduler.validation import status_report
from corral.server import db as dbmod
from corral.server.backends import postgres
from corral.server.changefeed import IntervalFeed
from corral.shared.errors import SettingError
from helpers import free_port, wait_for
from scheduler_app import Clock, set_nodes, submit

pytestmark = pytest.mark.e2e  # starts a PostgreSQL server

BIN = os.path.dirname(sys.executable)


def app_on(url, clock=None, **overrides):
    overrides.setdefault("retry_base_secs", 0.0)
    return create_app(SchedulerSettings(database_url=url, **overrides), clock=clock or Clock())


def test_every_session_has_its_schema_and_timeouts(pg_url):
    db = dbmod.open_database(pg_url, service="registry")
    with db.connection_context():
        settings = {name: db.execute_sql(f"SHOW {name}").fetchone()[0] for name in (
            "search_path", "lock_timeout", "idle_in_transaction_session_timeout", "statement_timeout", "TimeZone")}
    assert settings == {"search_path": "corral_registry", "lock_timeout": "5s",
                        "idle_in_transaction_session_timeout": "5s", "statement_timeout": "30s", "TimeZone": "UTC"}
    dbmod.close_idle(db)


def test_the_urls_own_session_options_are_kept_and_ours_win(pg_url):
    db = dbmod.open_database(pg_url + "?options=-c%20work_mem%3D7MB%20-c%20lock_timeout%3D1", service="scheduler")
    with db.connection_context():
        settings = [db.execute_sql(f"SHOW {name}").fetchone()[0] for name in ("work_mem", "lock_timeout")]
    assert settings == ["7MB", "5s"]
    dbmod.close_idle(db)


def test_a_url_may_name_the_servers_unix_socket_directory(pg_server):
    """postgresql://USER@:PORT/DATABASE?host=/socket/dir: libpq's form, for a server on the
    same host reached without TCP (and from another network namespace)."""
    name = pg_server.create_database()
    try:
        user = urllib.parse.urlsplit(pg_server.url(name)).username
        db = dbmod.open_database(f"postgresql://{user}@:{pg_server.port}/{name}?host={pg_server.base_dir}",
                                 service="scheduler")
        assert db.where["host"] == pg_server.base_dir
        with db.connection_context():
            assert db.execute_sql("SELECT inet_server_addr()").fetchone()[0] is None  # not over TCP
        dbmod.close_idle(db)
    finally:
        pg_server.drop_database(name)


@contextlib.contextmanager
def held_in_a_thread(enter: Callable[[], contextlib.AbstractContextManager], timeout: float = 10.0):
    """`enter()` entered in a thread of its own (a connection taken, a transaction
    open) and kept so while the block runs; left when it ends."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with enter():
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(timeout), "the thread never got there"
        yield
    finally:
        release.set()
        holder.join(10)


def test_a_request_that_finds_the_pool_taken_answers_503_after_the_wait(pg_url):
    app = create_app(SchedulerSettings(database_url=pg_url, db_options=dbmod.DatabaseOptions(
        pool_size=1, pool_wait_secs=0.3)), clock=Clock())
    db = app.extensions["corral.store"].db
    with held_in_a_thread(db.connection_context, timeout=5):
        started = time.monotonic()
        answer = app.test_client().get("/jobs")
        assert answer.status_code == 503 and "retry" in answer.json["error"]
        assert 0.25 <= time.monotonic() - started < 5
    assert app.test_client().get("/jobs").status_code == 200   # the connection came back


def test_a_database_that_refuses_the_start_is_one_line_naming_host_and_database(pg_server):
    secret = "s3cret-password"
    url = f"postgresql://nobody:{secret}@127.0.0.1:{pg_server.port}/no_such_db"
    db = dbmod.open_database(url)
    with pytest.raises(SettingError) as refused:
        dbmod.check_server(db, processes=1)
    message = refused.value.message
    assert "'no_such_db'" in message and f"127.0.0.1:{pg_server.port}" in message and secret not in message
    assert "\n" not in message
    # The same through the console script: exit 2, one line, no password.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "DATABASE_URL"))}
    done = subprocess.run([os.path.join(BIN, "corral-scheduler"), "--port", "1"], env=dict(env, DATABASE_URL=url),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and secret not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "no_such_db" in done.stderr


@pytest.mark.parametrize("url, says", [
    ("postgresql://u@h:notaport/db", "not a valid postgresql:// URL"),
    ("postgresql://u:pw@h:5432/", "must look like postgresql://"),
    ("mysql://u@h/db", "must start with sqlite:/// or postgresql://"),
])
def test_a_malformed_url_is_refused(url, says):
    with pytest.raises(SettingError, match=says) as refused:
        dbmod.open_database(url)
    assert "pw@" not in refused.value.message


def test_a_pool_too_small_or_too_large_for_the_server_is_refused(pg_url):
    with pytest.raises(SettingError, match="too small"):
        postgres.check_server(dbmod.open_database(pg_url), pool_size=postgres.MIN_POOL_SIZE - 1, processes=1)
    with pytest.raises(SettingError, match="max_connections"):
        postgres.check_server(dbmod.open_database(pg_url), pool_size=400, processes=2)
    postgres.check_server(dbmod.open_database(pg_url), pool_size=16, processes=2)


def test_a_server_older_than_13_is_refused(pg_url, monkeypatch):
    real = psycopg.connect

    def old_server(*args, **kwargs):
        conn = real(*args, **kwargs)
        monkeypatch.setattr(type(conn.info), "server_version", property(lambda self: 120011))
        return conn

    monkeypatch.setattr(postgres.psycopg, "connect", old_server)
    with pytest.raises(SettingError, match="PostgreSQL 12 .* too old"):
        postgres.check_server(dbmod.open_database(pg_url), pool_size=16, processes=1)


def test_a_clock_that_differs_from_the_databases_makes_the_replica_unready(pg_url):
    registry = registry_app(RegistrySettings(database_url=pg_url))   # the real clock: the database's
    client = registry.test_client()
    ready = client.get("/readyz")
    assert ready.status_code == 200 and abs(ready.json["checks"]["clock_skew_secs"]) < 0.5
    skewed = registry_db(registry)
    skewed.clock.local = lambda: time.time() + 5.0       # this host's clock runs 5 s ahead
    skewed.clock.measured_at = None
    unready = client.get("/readyz")
    assert unready.status_code == 503 and "differs from the database's by -5" in unready.json["error"]
    # What decides still goes by the database's clock: a job submitted now is stamped with it.
    scheduler = create_app(SchedulerSettings(database_url=pg_url))
    scheduler_db = scheduler.extensions["corral.store"].db
    scheduler_db.clock.local = lambda: time.time() + 5.0
    scheduler_db.clock.measured_at = None
    job = scheduler.test_client().post("/jobs", json={"command": "true"}).json
    assert abs(Job.get_by_id(int(job["job_id"][4:])).created_at - time.time()) < 1.0


def registry_db(app):
    from corral.registry.models import database
    return database.obj


def test_replicas_wake_each_other_with_one_debounced_notification(pg_url):
    channel = "corral_test_work"
    a = postgres.NotifyFeed(pg_url, channel, recheck=30.0)
    b = postgres.NotifyFeed(pg_url, channel, recheck=30.0)
    try:
        seen_a, seen_b = a.wait_for_change(0, 10), b.wait_for_change(0, 10)   # listening (first look)
        wait_for(lambda: listeners(pg_url, channel) == 2, timeout=10, message="both listeners")
        started = time.monotonic()
        a.ring()
        seen_b2 = b.wait_for_change(seen_b, 10)
        assert seen_b2 > seen_b and time.monotonic() - started < 1.0
        assert a.wait_for_change(seen_a, 0.5) == seen_a      # its own notification is skipped
        before = b.generation
        for _ in range(200):                                  # a burst of commits
            a.ring()
        time.sleep(0.5)  # let every notification of the burst arrive before counting them
        assert 1 <= b.generation - before <= 10
    finally:
        a.stop()
        b.stop()


def test_the_listener_tells_a_notification_from_a_periodic_recheck(pg_url):
    """A re-check (no notification within the period) may be answered from a cheap mark;
    another replica's notification must always be looked at (scheduler/wiring.py)."""
    channel = "corral_test_recheck"
    a = postgres.NotifyFeed(pg_url, channel, recheck=0.2)
    b = postgres.NotifyFeed(pg_url, channel, recheck=30.0)
    seen: list[bool] = []
    a.add_listener(lambda recheck, nodes: seen.append(recheck))
    try:
        a.wait_for_change(0, 10), b.wait_for_change(0, 10)   # both started
        wait_for(lambda: True in seen, timeout=10, message="a periodic re-check")
        wait_for(lambda: listeners(pg_url, channel) == 2, timeout=10, message="both listeners")
        del seen[:]
        b.ring()
        wait_for(lambda: False in seen, timeout=10, message="the other replica's notification")
    finally:
        a.stop()
        b.stop()


def test_a_notification_names_the_nodes_placed_on_and_the_others_wake_only_those(pg_url):
    """The waiters of another replica learn which nodes got work from the notification
    itself (no grouped query); a burst names all of them together; work placed
    without nodes, or too many names for one notification, says "look"."""
    channel = "corral_test_named"
    a = postgres.NotifyFeed(pg_url, channel, recheck=30.0)
    b = postgres.NotifyFeed(pg_url, channel, recheck=30.0)
    seen: list = []
    b.add_listener(lambda recheck, nodes: seen.append((recheck, nodes)))
    try:
        a.wait_for_change(0, 10), b.wait_for_change(0, 10)
        wait_for(lambda: listeners(pg_url, channel) == 2, timeout=10, message="both listeners")
        del seen[:]
        a.ring({"n1"})
        wait_for(lambda: seen, timeout=10, message="the notification")
        assert seen == [(False, {"n1"})]
        del seen[:]
        a.ring({"n2"}), a.ring({"n3", "n4"}), a.ring({"n2"})
        wait_for(lambda: set().union(*(nodes for _, nodes in seen)) == {"n2", "n3", "n4"} if seen else False,
                 timeout=10, message="the burst's nodes")
        del seen[:]
        a.ring(None)
        wait_for(lambda: seen, timeout=10, message="the notification without nodes")
        assert seen == [(False, None)]
        del seen[:]
        a.ring({f"node-{i:05d}" for i in range(postgres.MAX_PAYLOAD_BYTES // 5)})
        wait_for(lambda: seen, timeout=10, message="the notification with too many nodes")
        assert seen == [(False, None)]
    finally:
        a.stop()
        b.stop()


def test_a_sender_that_cannot_reach_the_database_says_so_once_and_stops_with_its_feed(caplog, pg_url):
    """While the database is away the sender tries once per backoff; one warning says
    so, not one a second, and a stopped feed's sender ends."""
    away = urllib.parse.urlsplit(pg_url)._replace(netloc=f"{urllib.parse.urlsplit(pg_url).username}@127.0.0.1:"
                                                          f"{free_port()}").geturl()
    feed = postgres.NotifyFeed(away, "corral_away")
    try:
        for _ in range(3):
            feed._failed_at = float("-inf")  # as if the backoff had passed
            feed.ring({"n1"})
            wait_for(lambda: feed._failed_at > float("-inf"), timeout=10, message="the failed send")
        warnings = [r for r in caplog.records if "cannot notify" in r.getMessage() and r.levelname == "WARNING"]
        assert len(warnings) == 1
    finally:
        feed.stop()
    wait_for(lambda: not feed._sender.is_alive(), timeout=10, message="the sender to end")


def test_the_first_notification_leaves_from_the_ringing_thread(pg_url, monkeypatch):
    """No hand-over to the sender thread on the dispatch path: ring() returns with the
    notification sent; what rings within the debounce is left to the sender thread
    (here one that sends nothing)."""
    monkeypatch.setattr(postgres.NotifyFeed, "_send_loop", lambda self: None)
    channel = "corral_test_first"
    a = postgres.NotifyFeed(pg_url, channel, recheck=30.0, debounce=30.0)
    with psycopg.connect(pg_url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel}"')
        a.ring({"n1"})
        assert [n.payload for n in listener.notifies(timeout=5, stop_after=1)] == ["n1"]
        a.ring({"n2"})
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []


def test_notifications_name_their_nodes_together():
    assert postgres.named_nodes(["n1", "n2,n3"]) == {"n1", "n2", "n3"}
    assert postgres.named_nodes(["n1", ""]) is None


def listeners(url: str, channel: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE query = %s",
                            (f'LISTEN "{channel}"',)).fetchone()[0]


def test_behind_pgbouncer_replicas_poll_instead(pg_url):
    db = dbmod.open_database(pg_url)
    assert isinstance(dbmod.change_feed(db, "scheduler", dbmod.DatabaseOptions(poll_only=True)), IntervalFeed)
    assert isinstance(dbmod.change_feed(db, "scheduler"), postgres.NotifyFeed)


def test_concurrent_cancels_retries_reports_claims_and_submits_never_deadlock_nor_double_claim(pg_url):
    """The advisory lock is taken before any row lock, so these never wait on each other in
    a cycle (PostgreSQL would abort one with a deadlock: a 503); SKIP LOCKED claims give
    each job to one claim."""
    clock = Clock()
    app = app_on(pg_url, clock, max_jobs_per_node=4, max_job_retries=0)
    set_nodes(app.extensions["corral.store"], clock, "n1", "n2", "n3")
    for _ in range(40):
        assert app.test_client().post("/jobs", json={"command": "true"}).status_code == 201
    answers: list[int] = []
    claimed: list[str] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        client = app.test_client()
        for round_ in range(15):
            node = f"n{1 + (i + round_) % 3}"
            got = client.post(f"/nodes/{node}/claim", json={"max": 2, "wait_secs": 0})
            record = [got.status_code]
            for job in got.json if got.status_code == 200 else []:
                with lock:
                    claimed.append((job["job_id"], job["attempt"]))
                body = {"node_id": node, "attempt": job["attempt"], "status": "failed", "exit_code": 1}
                record.append(client.post(f"/jobs/{job['job_id']}/status", json=body).status_code)
                record.append(client.post(f"/jobs/{job['job_id']}/retry", json={}).status_code)
            victim = f"job-{1 + (i * 7 + round_) % 40}"
            record.append(client.post(f"/jobs/{victim}/cancel", json={}).status_code)
            record.append(client.post("/jobs", json={"command": "true"}).status_code)
            with lock:
                answers.extend(record)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(worker, range(8)))
    assert set(answers) <= {200, 201, 409}, sorted(set(answers))
    assert len(claimed) == len(set(claimed))          # no attempt went to two claims
    # Never more than a node's slots at once: every job running now holds a slot it was given.
    for node in ("n1", "n2", "n3"):
        assert Job.select().where((Job.node_id == node) & Job.status.in_(["pending", "running"])).count() <= 4
    # Each attempt started once.
    starts = {}
    for event in JobEvent.select().where(JobEvent.to_status == "running"):
        key = (event.job_id, event.attempt)
        starts[key] = starts.get(key, 0) + 1
    assert set(starts.values()) <= {1}


def test_the_health_of_the_tables_is_on_metrics(pg_url):
    app = app_on(pg_url)
    client = app.test_client()
    for _ in range(5):
        client.post("/jobs", json={"command": "true"})
    for job_id in ("job-1", "job-2"):
        client.post(f"/jobs/{job_id}/cancel", json={})
    text = client.get("/metrics").get_data(as_text=True)
    assert 'corral_db_dead_tuples{table="job"}' in text and 'corral_db_live_tuples{table="job"}' in text
    assert "corral_db_oldest_transaction_age_seconds " in text and "corral_db_clock_skew_seconds " in text


def test_while_the_database_refuses_connections_writes_answer_503_and_healthz_still_200(pg_url):
    app = app_on(pg_url)
    client = app.test_client()
    assert client.post("/jobs", json={"command": "true"}).status_code == 201
    name = pg_url.rsplit("/", 1)[1]
    admin = pg_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
    try:
        refused = client.post("/jobs", json={"command": "true"})
        assert refused.status_code == 503 and "retry" in refused.json["error"]
        assert client.get("/jobs/job-1").status_code == 503
        assert client.get("/readyz").status_code == 503
        assert client.get("/healthz").status_code == 200      # the process itself is fine
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    # Back by itself: the pool's dead connections are dropped, nothing was lost.
    assert client.post("/jobs", json={"command": "true"}).json["job_id"] == "job-2"
    assert client.get("/jobs/job-1").status_code == 200


def test_twin_submits_with_one_idempotency_key_at_once_create_one_job(pg_url):
    app = app_on(pg_url)
    barrier = threading.Barrier(8)

    def submit(key):
        client = app.test_client()
        barrier.wait(10)
        answer = client.post("/jobs", json={"command": "true"}, headers={"Idempotency-Key": key})
        return answer.status_code, answer.json["job_id"]

    for round_ in range(5):
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(submit, [f"key-{round_}"] * 8))
        assert sorted(code for code, _ in answers) == [200] * 7 + [201]
        assert len({job_id for _, job_id in answers}) == 1
    assert Job.select().count() == 5


def test_the_placement_lock_and_a_placements_own_commit_setting_are_one_statement(pg_url):
    """Placement alone may be lost in a crash and redone: its transaction turns
    synchronous_commit off with the lock, in one round trip; one that also claims keeps it
    on; taking the lock again in the same transaction sends nothing."""
    app = app_on(pg_url)
    store, scheduler = app.extensions["corral.store"], app.extensions["corral.scheduler"]

    def inside(only_places: bool) -> tuple[str, bool]:
        with store.db.connection_context():
            with scheduler.placing(only_places):
                setting = store.db.execute_sql("SHOW synchronous_commit").fetchone()[0]
                dbmod.backend_of(store.db).lock_placement(store.db)  # taken again: nothing is sent, the setting stays
                again = store.db.execute_sql("SHOW synchronous_commit").fetchone()[0]
                with psycopg.connect(pg_url, autocommit=True) as other:
                    locked = not other.execute("SELECT pg_try_advisory_lock(%s)",
                                               (postgres.PLACEMENT_LOCK_KEY,)).fetchone()[0]
            assert again == setting
            return setting, locked

    assert inside(only_places=True) == ("off", True)
    assert inside(only_places=False) == ("on", True)
    with store.db.connection_context():
        assert store.db.execute_sql("SHOW synchronous_commit").fetchone()[0] == "on"  # for that transaction only


def test_placements_on_different_nodes_run_side_by_side_and_one_over_every_node_waits(pg_url):
    """A placement that fills one node's slots (after its agent's reports, in its claim)
    holds the placement lock shared and its node's lock: another node's placement goes
    on meanwhile, one on the same node or over every node waits. A transaction keeps the
    scope it took first: asking a wider one later could wait on others that wait on it."""
    app = app_on(pg_url)
    store, scheduler = app.extensions["corral.store"], app.extensions["corral.scheduler"]

    def free_to(other, sql, *args) -> bool:
        with other.transaction():
            return other.execute(f"SELECT {sql}", args).fetchone()[0]

    with store.db.connection_context(), scheduler.placing(nodes=["n1"]):
        with psycopg.connect(pg_url, autocommit=True) as other:
            node = postgres.NODE_LOCK_CLASS
            assert free_to(other, "pg_try_advisory_xact_lock(%s, %s)", node, postgres.node_lock_key("n2"))
            assert free_to(other, "pg_try_advisory_xact_lock_shared(%s)", postgres.PLACEMENT_LOCK_KEY)
            assert not free_to(other, "pg_try_advisory_xact_lock(%s, %s)", node, postgres.node_lock_key("n1"))
            assert not free_to(other, "pg_try_advisory_xact_lock(%s)", postgres.PLACEMENT_LOCK_KEY)
        store.placing.dispatch(0.0, ["n1"])  # within its scope: nothing more is asked
        store.placing.dispatch(0.0)          # every node it locked
        with pytest.raises(RuntimeError, match="in a transaction that locked n1"):
            store.placing.dispatch(0.0, ["n1", "n2"])
        with pytest.raises(RuntimeError, match="every node in a transaction that locked n1"):
            dbmod.backend_of(store.db).lock_placement(store.db)
    with store.db.connection_context(), scheduler.placing():
        store.placing.dispatch(0.0, ["n1"])  # every node's placement covers each node's
        with psycopg.connect(pg_url, autocommit=True) as other:
            assert not free_to(other, "pg_try_advisory_xact_lock_shared(%s)", postgres.PLACEMENT_LOCK_KEY)


def test_a_placement_on_one_node_does_not_hold_up_one_on_another(pg_url):
    """Each refills the slot its node's finished job freed, while the other's transaction
    is still open: neither the locks nor a row both would write (the round robin's
    cursor, the placement mark) may make the second wait for the first."""
    clock = Clock()
    app = app_on(pg_url, clock, max_jobs_per_node=1)
    store, scheduler, client = app.extensions["corral.store"], app.extensions["corral.scheduler"], app.test_client()
    set_nodes(store, clock, "n1", "n2", slots=1)
    for _ in range(4):
        submit(client)
    for node in ("n1", "n2"):  # each node runs one job and finishes it; the other two wait, unplaced
        [job] = client.post(f"/nodes/{node}/claim", json={"max": 1, "wait_secs": 0}).json
        with store.db.connection_context():
            store.reports.report(job["job_id"], status_report({"node_id": node, "attempt": job["attempt"],
                                                               "status": "done", "exit_code": 0}), clock())
    placed = {}

    @contextlib.contextmanager
    def placing_on(node: str):
        with store.db.connection_context(), scheduler.placing(only_places=True, nodes=[node]):
            placed[node] = store.placing.dispatch(clock(), [node])
            yield

    def place_on(node: str) -> None:
        with placing_on(node):
            pass

    with held_in_a_thread(lambda: placing_on("n1")):
        second = threading.Thread(target=place_on, args=("n2",))
        second.start()
        second.join(3)  # well under the sessions' lock_timeout
        assert not second.is_alive(), "the placement on n2 waited for the one on n1"
    assert placed == {"n1": 1, "n2": 1}


@pytest.mark.parametrize("held_node", ["full", "free"])
def test_a_submit_places_on_the_free_nodes_without_waiting_for_the_others_placements(pg_url, held_node):
    """New work locks the nodes that have a free slot, but for those another placement
    holds (its agent's reports and claim): a placement open on a node, full or not, does
    not hold up a submit placed elsewhere."""
    clock = Clock()
    app = app_on(pg_url, clock, max_jobs_per_node=1)
    store, scheduler, client = app.extensions["corral.store"], app.extensions["corral.scheduler"], app.test_client()
    set_nodes(store, clock, "n1", "n2", slots=1)
    held = submit(client)["node_id"] if held_node == "full" else "n1"

    @contextlib.contextmanager
    def placing_on_held():
        with store.db.connection_context(), scheduler.placing(only_places=True, nodes=[held]):
            store.placing.dispatch(clock(), [held])
            yield

    with held_in_a_thread(placing_on_held):
        started = time.monotonic()
        job = submit(client)
        assert time.monotonic() - started < 3  # well under the sessions' lock_timeout
        assert job["node_id"] not in (None, held)


def test_agents_reporting_and_claiming_at_once_on_many_nodes_overfill_none_and_run_each_job_once(pg_url):
    """The capacity benchmark in small: every node's agent reports its finished jobs with
    its next claim riding on them, all at once. Their placements run side by side, each
    skipping the jobs another is placing: no node gets more jobs than its slots, each
    job starts once, and every job ends done."""
    clock = Clock()
    app = app_on(pg_url, clock, max_jobs_per_node=3)
    store = app.extensions["corral.store"]
    nodes = [f"n{i}" for i in range(6)]
    set_nodes(store, clock, *nodes, slots=3)
    jobs = [{"command": "true"} for _ in range(150)]
    assert app.test_client().post("/jobs/batch", json={"jobs": jobs}).status_code == 201
    answers: set[int] = set()
    overfilled: list[str] = []

    def agent(node: str) -> None:
        client, held, idle_rounds = app.test_client(), [], 0
        while idle_rounds < 20:
            if held:
                answer = client.post("/jobs/reports", json={
                    "reports": [{"job_id": job["job_id"], "node_id": node, "attempt": job["attempt"],
                                 "status": "done", "exit_code": 0} for job in held],
                    "claim": {"node_id": node, "max": 3}})
            else:
                answer = client.post(f"/nodes/{node}/claim", json={"max": 3, "wait_secs": 0})
            answers.add(answer.status_code)
            if answer.status_code != 200:
                break
            held = answer.json["claimed"] if held else answer.json
            if len(held) > 3:
                overfilled.append(node)
            idle_rounds = 0 if held else idle_rounds + 1

    with ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(agent, nodes))
    assert answers == {200} and not overfilled
    with store.db.connection_context():
        assert Job.select().where(Job.status == "done").count() == 150
        starts = [event.job_id for event in JobEvent.select().where(JobEvent.to_status == "running")]
    assert len(starts) == len(set(starts)) == 150


def test_a_replica_stopped_inside_a_placing_transaction_frees_the_placement_lock(pg_url):
    """As if a replica were stopped (SIGSTOP) right after recording events under the placement
    lock: the server ends its idle session, so the other replicas can place again. (psycopg's
    executemany once left sessions without that timeout.)"""
    app = app_on(pg_url)
    store = app.extensions["corral.store"]
    job, _ = store.submits.submit({"command": "true"}, 0.0)
    db = store.db
    with pytest.raises((peewee.OperationalError, peewee.InterfaceError)):
        with db.connection_context(), db.atomic():
            db.lock_placement()
            store.transitions.writer.events([{"job": job.id, "at": 1.0, "old": "pending", "new": "pending",
                                              "attempt": 0, "node_id": None, "reason": "a test"}] * 3)
            time.sleep(postgres.IDLE_IN_TRANSACTION_TIMEOUT_MS / 1000 + 1)   # stopped for longer than the timeout
            with psycopg.connect(pg_url, autocommit=True) as other:       # another replica
                assert other.execute("SELECT pg_try_advisory_lock(%s)", (postgres.PLACEMENT_LOCK_KEY,)).fetchone()[0]
            db.execute_sql("SELECT 1")                                     # the stopped one's session is gone


def test_a_placement_that_fails_after_its_write_committed_keeps_the_write_and_its_answer(pg_url, monkeypatch):
    """Batches and reports commit before their placement (the lock covers placement
    only): when that placement fails, the client still learns what was stored, and the
    background pass places it later."""
    from corral.scheduler.service import Scheduler
    from corral.scheduler.store.placing import Placing

    clock = Clock()
    app = app_on(pg_url, clock, max_jobs_per_node=2)
    store = app.extensions["corral.store"]
    client = app.test_client()
    set_nodes(store, clock, "n1")
    placing = Placing.dispatch

    def broken(self, *args, **kwargs):
        raise peewee.OperationalError("the server went away")

    monkeypatch.setattr(Placing, "dispatch", broken)
    batch = client.post("/jobs/batch", json={"jobs": [{"command": "a"}, {"command": "b"}]})
    assert batch.status_code == 201, batch.json
    assert [(j["status"], j["node_id"]) for j in batch.json] == [("pending", None)] * 2
    monkeypatch.setattr(Placing, "dispatch", placing)
    assert Scheduler(store).place(clock()) == 2  # the background pass
    claimed = client.post("/nodes/n1/claim", json={"max": 2, "wait_secs": 0}).json
    assert sorted(j["job_id"] for j in claimed) == sorted(j["job_id"] for j in batch.json)

    monkeypatch.setattr(Placing, "dispatch", broken)
    reports = client.post("/jobs/reports", json={
        "reports": [{"job_id": j["job_id"], "node_id": "n1", "attempt": 1, "status": "done", "exit_code": 0}
                    for j in claimed], "claim": {"node_id": "n1", "max": 2}})
    assert reports.status_code == 200, reports.json
    assert [r["code"] for r in reports.json["results"]] == [200, 200] and reports.json["claimed"] == []
    assert {client.get(f"/jobs/{j['job_id']}").json["status"] for j in claimed} == {"done"}
    dbmod.close_idle(store.db)


def app_with_store_spies(pg_url, monkeypatch, max_jobs_per_node: int, query: str):
    """A test client of an app with one node, n1, and `spy(name, fail=False)`: each call
    of the store part's <name> then appends (name, what `query` answers in its transaction)
    to `seen`; with `fail`, its first call raises instead of running."""
    from corral.scheduler.store.claims import Claims
    from corral.scheduler.store.placing import Placing
    from corral.scheduler.store.reports import Reports
    from corral.scheduler.store.submits import Submits
    parts = {"submit": Submits, "dispatch": Placing, "take_placed": Claims, "apply_reports": Reports}

    clock = Clock()
    app = app_on(pg_url, clock, max_jobs_per_node=max_jobs_per_node)
    set_nodes(app.extensions["corral.store"], clock, "n1")
    seen: list[tuple[str, object]] = []

    def spy(name, fail=False):
        original = getattr(parts[name], name)

        def recorded(self, *args, **kwargs):
            seen.append((name, self.ctx.db.execute_sql(query).fetchone()[0]))
            if fail and sum(1 for called, _ in seen if called == name) == 1:
                raise RuntimeError("a placement bug")
            return original(self, *args, **kwargs)
        monkeypatch.setattr(parts[name], name, recorded)
    return app.test_client(), seen, spy


def test_done_reports_their_placement_and_the_claim_riding_on_them_are_one_transaction(pg_url, monkeypatch):
    """An agent's batch of done reports frees only its own node's slots, known before it
    is applied: one transaction (one commit) for the reports, the placement and the
    claim; should that transaction fail, the reports still land on their own."""
    client, seen, spy = app_with_store_spies(pg_url, monkeypatch, 1, "SELECT txid_current()")
    for name in ("apply_reports", "dispatch", "take_placed"):
        spy(name)
    first = client.post("/jobs", json={"command": "a"}).json
    client.post("/jobs", json={"command": "b"})                       # waits: n1 has one slot
    claimed = client.post("/nodes/n1/claim", json={"max": 1, "wait_secs": 0}).json
    assert [j["job_id"] for j in claimed] == [first["job_id"]]
    seen.clear()
    answer = client.post("/jobs/reports", json={"reports": [
        {"job_id": first["job_id"], "node_id": "n1", "attempt": 1, "status": "done", "exit_code": 0}],
        "claim": {"node_id": "n1", "max": 1}})
    assert answer.status_code == 200 and [j["command"] for j in answer.json["claimed"]] == ["b"]
    assert [name for name, _ in seen] == ["apply_reports", "dispatch", "take_placed"]
    assert len({txid for _, txid in seen}) == 1                        # one transaction
    # The same, with a placement that fails: the report lands all the same.
    second = answer.json["claimed"][0]
    client.post("/jobs", json={"command": "c"})
    seen.clear()
    spy("dispatch", fail=True)
    answer = client.post("/jobs/reports", json={"reports": [
        {"job_id": second["job_id"], "node_id": "n1", "attempt": second["attempt"], "status": "done",
         "exit_code": 0}], "claim": {"node_id": "n1", "max": 1}})
    assert answer.status_code == 200 and answer.json["results"][0]["code"] == 200
    assert client.get(f"/jobs/{second['job_id']}").json["status"] == "done"


def test_only_a_transaction_that_only_places_commits_without_waiting_for_the_disk(pg_url, monkeypatch):
    """A submit's job, a report and a claim commit durably (synchronous_commit as the
    server has it); the placement that follows a submit or a failed report (it may
    requeue its job) does not wait for the disk (a crash may undo it, and the next
    pass places again)."""
    client, seen, spy = app_with_store_spies(pg_url, monkeypatch, 2, "SHOW synchronous_commit")
    for name in ("submit", "dispatch", "take_placed", "apply_reports"):
        spy(name)
    job = client.post("/jobs", json={"command": "a", "max_retries": 0}).json
    assert job["node_id"] == "n1"
    assert seen == [("submit", "on"), ("dispatch", "off")]
    seen.clear()
    claimed = client.post("/nodes/n1/claim", json={"max": 2, "wait_secs": 0}).json
    assert [j["job_id"] for j in claimed] == [job["job_id"]]
    assert seen == [("take_placed", "on")]
    seen.clear()
    client.post("/jobs", json={"command": "b"})
    seen.clear()
    # A failed report (it might have sent its job back to pending): the freed slot's
    # placement follows in a transaction of its own, which only places.
    answer = client.post("/jobs/reports", json={"reports": [
        {"job_id": job["job_id"], "node_id": "n1", "attempt": 1, "status": "failed", "exit_code": 3}]})
    assert answer.status_code == 200, answer.json
    assert seen[0] == ("apply_reports", "on") and set(seen[1:]) <= {("dispatch", "off")}
    # Reports that carry a claim: that placement hands out work, and waits for the disk.
    seen.clear()
    running = client.post("/nodes/n1/claim", json={"max": 2, "wait_secs": 0}).json
    seen.clear()
    client.post("/jobs/reports", json={"reports": [
        {"job_id": running[0]["job_id"], "node_id": "n1", "attempt": 1, "status": "done", "exit_code": 0}],
        "claim": {"node_id": "n1", "max": 2}})
    assert seen[0] == ("apply_reports", "on") and ("take_placed", "on") in seen
    assert ("dispatch", "off") not in seen
    dbmod.close_idle(client.application.extensions["corral.store"].db)
