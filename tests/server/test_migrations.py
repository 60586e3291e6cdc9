"""Versioned schema migrations (control-plane/server/migrations.py and each service's migrations/):
a fresh database and the databases earlier releases wrote end at the same schema
with every row kept; replicas migrating together apply each step once; a database
newer than the code is refused; `corral-scheduler migrate [--check]`; where the
database URL comes from; and the scripts ship with a non-editable install."""
import contextlib
import fcntl
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import peewee
import psycopg
import pytest
import requests

from corral.registry import app as registry_app
from corral.registry import models as registry_models
from corral.registry.migrations import MIGRATIONS as REGISTRY_MIGRATIONS
from corral.registry.settings import RegistrySettings
from corral.scheduler import app as scheduler_app
from corral.scheduler import models as scheduler_models
from corral.scheduler.migrations import MIGRATIONS as SCHEDULER_MIGRATIONS
from corral.scheduler.service import Scheduler
from corral.scheduler.settings import SchedulerSettings
from corral.server import db as dbmod
from corral.server import migrations
from corral.shared import settings as shared_settings
from corral.shared.errors import SettingError

from helpers import free_port, wait_for
from make_run import run_local, stop_local
from paths import DATA, REPO

BIN = os.path.dirname(sys.executable)
# The commits whose databases tests/data holds (tests/data/make_old_databases.py):
# the last before the node-identity work, and the code when migrations began.
OLD_COMMITS = ("6d050af", "2f6dbbf")


class Service:
    def __init__(self, name, settings_class, app_module, models, migration_set):
        self.name = name
        self.settings_class = settings_class
        self.app = app_module
        self.models = models
        self.migrations = migration_set

    def settings(self, url: str):
        return self.settings_class(database_url=url)

    def open(self, url: str) -> peewee.Database:
        return dbmod.open_database(url, service=self.name)

    @property
    def script(self) -> str:
        return os.path.join(BIN, f"corral-{self.name}")


SCHEDULER = Service("scheduler", SchedulerSettings, scheduler_app, scheduler_models.MODELS, SCHEDULER_MIGRATIONS)
REGISTRY = Service("registry", RegistrySettings, registry_app, registry_models.MODELS, REGISTRY_MIGRATIONS)


@pytest.fixture(params=[SCHEDULER, REGISTRY], ids=lambda s: s.name)
def service(request) -> Service:
    return request.param


def sqlite_url(path) -> str:
    return f"sqlite:///{path}"


def schema_of(db: peewee.Database) -> dict:
    """Every table of the service's schema: its columns (name, declared type, nullable)
    and its indexes (name, columns, unique)."""
    with db.connection_context():
        return {table: ({(c.name, c.data_type.lower(), c.null) for c in db.get_columns(table)},
                        {(i.name, tuple(i.columns), i.unique) for i in db.get_indexes(table)})
                for table in db.get_tables()}


def step_names(service: Service) -> list[str]:
    return service.migrations.names()


def history_rows(db: peewee.Database, service: Service) -> list[str]:
    with db.connection_context():
        cursor = db.execute_sql(f"SELECT name FROM {service.migrations.history_table} ORDER BY name")
        return [row[0] for row in cursor.fetchall()]


def load_dump(dump: str, path) -> None:
    conn = sqlite3.connect(path)
    try:
        with open(dump) as f:
            conn.executescript(f.read())
    finally:
        conn.close()


def command_env(url: str, state_dir) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "DATABASE_URL"))}
    return dict(env, DATABASE_URL=url, CORRAL_STATE_DIR=str(state_dir), CORRAL_LOG_LEVEL="INFO")


def run(argv: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


# ---- the steps ---------------------------------------------------------------


def test_each_service_has_its_first_step_and_a_history_table_of_its_own():
    assert step_names(SCHEDULER)[0] == step_names(REGISTRY)[0] == "0001_initial"
    assert step_names(SCHEDULER) == ["0001_initial", "0002_placement_indexes", "0003_drop_status_node_index",
                                     "0004_scheduling", "0005_job_depends_on", "0006_schedules",
                                     "0007_job_trace", "0008_events", "0010_stats", "0011_log_chunks",
                                     "0012_job_disk", "0016_node_drain_seq", "0017_job_timeout",
                                     "0020_node_credential", "0021_node_refusing_work",
                                     "0022_users_and_teams", "0023_audit_and_owners",
                                     "0024_usage", "0025_job_stop", "0026_team_quota", "0027_fair_share",
                                     "0028_preemption", "0029_waiting_by_team_when_shared",
                                     "0030_gpus_and_resources", "0031_gpu_usage", "0032_gangs"]
    assert step_names(REGISTRY) == ["0001_initial", "0002_node_placement", "0003_node_credential",
                                    "0004_node_refusing_work", "0005_node_gpus"]
    assert SCHEDULER.migrations.history_table == "scheduler_schema_migration"
    assert REGISTRY.migrations.history_table == "registry_schema_migration"
    assert SCHEDULER.migrations.lock_key != REGISTRY.migrations.lock_key


def test_a_fresh_database_gets_every_step_once_and_is_then_up_to_date(database_url, service):
    db = service.open(database_url)
    try:
        assert migrations.pending(db, service.migrations) == step_names(service)
        assert migrations.apply(db, service.migrations) == step_names(service)
        assert migrations.apply(db, service.migrations) == []
        assert migrations.pending(db, service.migrations) == []
        assert migrations.applied(db, service.migrations) == history_rows(db, service) == step_names(service)
    finally:
        dbmod.close_idle(db)


def test_the_steps_make_the_tables_of_the_live_models(database_url, service, tmp_path):
    """A model changed without a migration (or the other way round) fails here: the
    columns, their types and the indexes the steps make are those of the live models."""
    migrated = service.open(database_url)
    if dbmod.is_postgres(database_url):  # another schema of the same database
        live = dbmod.open_database(database_url, service=f"live_{service.name}")
        with live.connection_context():
            live.execute_sql(f'CREATE SCHEMA "{dbmod.schema_for(f"live_{service.name}")}"')
    else:
        live = service.open(sqlite_url(tmp_path / "live.db"))
    try:
        migrations.apply(migrated, service.migrations)
        with live.bind_ctx(service.models), live.connection_context():
            live.create_tables(service.models)
        made = schema_of(migrated)
        del made[service.migrations.history_table]
        assert made == schema_of(live)
    finally:
        dbmod.close_idle(migrated)
        dbmod.close_idle(live)


def test_fair_shares_index_exists_only_where_a_second_team_does(database_url):
    """A cluster of one team pays no upkeep for the index of the jobs waiting by team:
    a fresh database lacks it, the first team created makes it, and step 0029 run again
    keeps it while that team exists and drops it once only `default` is left."""
    from corral.scheduler.models import WAITING_BY_TEAM, Team, add_waiting_by_team_index
    db = SCHEDULER.open(database_url)

    def indexed() -> bool:
        return WAITING_BY_TEAM in {index.name for index in db.get_indexes("job")}

    def step_0029_again() -> None:
        db.execute_sql(f"DELETE FROM {SCHEDULER.migrations.history_table} WHERE name = %s"
                       .replace("%s", db.param), ("0029_waiting_by_team_when_shared",))
        assert migrations.apply(db, SCHEDULER.migrations) == ["0029_waiting_by_team_when_shared"]

    try:
        migrations.apply(db, SCHEDULER.migrations)
        with db.bind_ctx(scheduler_models.MODELS), db.connection_context():
            assert not indexed()
            with db.atomic():
                Team.create(name="ml", created_at=0.0)
                add_waiting_by_team_index(db)
            assert indexed()
            add_waiting_by_team_index(db)  # once only
            step_0029_again()
            assert indexed()
            Team.delete().where(Team.name == "ml").execute()
            step_0029_again()
            assert not indexed()
    finally:
        dbmod.close_idle(db)


def test_a_step_that_fails_is_rolled_back_and_refused_in_one_line(database_url, tmp_path):
    """Each step is one transaction: a failing step leaves nothing of itself, the steps
    before it stay applied, and the error is a SettingError (one line, exit 2)."""
    scripts = tmp_path / "steps"
    scripts.mkdir()
    (scripts / "0001_first.py").write_text(
        "def up(migrator, db):\n    db.execute_sql('CREATE TABLE first_table (id INTEGER PRIMARY KEY)')\n")
    (scripts / "0002_broken.py").write_text(
        "def up(migrator, db):\n    db.execute_sql('CREATE TABLE second_table (id INTEGER PRIMARY KEY)')\n"
        "    db.execute_sql('INSERT INTO no_such_table VALUES (1)')\n")
    steps = migrations.MigrationSet(service="scheduler", directory=str(scripts), lock_key=SCHEDULER.migrations.lock_key)
    db = SCHEDULER.open(database_url)
    try:
        with pytest.raises(SettingError, match="a migration step of the scheduler database failed") as refused:
            migrations.apply(db, steps)
        assert "\n" not in refused.value.message
        assert migrations.applied(db, steps) == ["0001_first"]
        assert migrations.pending(db, steps) == ["0002_broken"]
        with db.connection_context():
            assert db.table_exists("first_table") and not db.table_exists("second_table")
    finally:
        dbmod.close_idle(db)


# ---- databases written before migrations began ---------------------------------


def job_rows(path) -> dict[int, dict]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        jobs = {row["id"]: dict(row) for row in conn.execute("SELECT * FROM job")}
        for job_id, count in conn.execute("SELECT job_id, count(*) FROM job_event GROUP BY job_id"):
            jobs[job_id]["events"] = count
        return jobs
    finally:
        conn.close()


def assert_at_the_schema_of_a_fresh_database(service: Service, path, tmp_path) -> None:
    """The upgraded file's history says every step applied, and its tables, columns and
    indexes are those of a database the steps made from nothing."""
    db = service.open(sqlite_url(path))
    fresh = service.open(sqlite_url(tmp_path / "fresh.db"))
    try:
        assert history_rows(db, service) == step_names(service)
        migrations.apply(fresh, service.migrations)
        assert schema_of(db) == schema_of(fresh)
    finally:
        dbmod.close_idle(db)
        dbmod.close_idle(fresh)


@pytest.mark.parametrize("commit", OLD_COMMITS)
def test_a_scheduler_database_of_an_earlier_release_upgrades_in_place_with_every_job(tmp_path, commit):
    path = tmp_path / "scheduler.db"
    load_dump(os.path.join(DATA, f"scheduler-{commit}.sql"), path)
    before = job_rows(path)
    assert len(before) >= 10 and {"done", "failed", "cancelled", "running", "pending"} <= \
        {job["status"] for job in before.values()}
    settings = SCHEDULER.settings(sqlite_url(path))

    assert scheduler_app.create_schema(settings) == step_names(SCHEDULER)   # the gunicorn master
    app = scheduler_app.create_app(settings)                                # then each worker
    client = app.test_client()
    for job_id, row in before.items():
        answer = client.get(f"/jobs/job-{job_id}")
        assert answer.status_code == 200, answer.json
        job = answer.json
        for field in ("command", "status", "node_id", "name", "exit_code", "stdout", "stderr", "attempt",
                      "retry_count", "max_retries", "memory_mb", "cpu_percent", "port", "job_type"):
            assert job[field] == row[field], (job_id, field)
        assert job["env_vars"] == json.loads(row["env_vars"])
        if commit == "6d050af":  # columns the upgrade added
            assert (job["max_processes"], job["private_tmp"]) == (None, None)
        assert len(client.get(f"/jobs/job-{job_id}/events").json) == row.get("events", 0)
    listed = client.get("/jobs?limit=1000").json
    assert sorted(int(j["job_id"].split("-")[1]) for j in listed) == sorted(before)

    new = client.post("/jobs", json={"command": "echo after the upgrade", "max_processes": 64})
    assert new.status_code == 201, new.json
    assert int(new.json["job_id"].split("-")[1]) > max(before)
    assert client.get(f"/jobs/{new.json['job_id']}").json["max_processes"] == 64

    assert_at_the_schema_of_a_fresh_database(SCHEDULER, path, tmp_path)
    dbmod.close_idle(app.extensions["corral.store"].db)


@pytest.mark.parametrize("commit", OLD_COMMITS)
def test_a_registry_database_of_an_earlier_release_upgrades_in_place_with_every_record(tmp_path, commit):
    path = tmp_path / "registry.db"
    load_dump(os.path.join(DATA, f"registry-{commit}.sql"), path)
    settings = REGISTRY.settings(sqlite_url(path))

    assert registry_app.create_schema(settings) == step_names(REGISTRY)
    client = registry_app.create_app(settings).test_client()
    nodes = {n["node_id"]: n for n in client.get("/nodes").json}
    assert set(nodes) == {"node-1", "node-2"}
    assert (nodes["node-1"]["drained"], nodes["node-2"]["drained"]) == (False, True)
    (record,) = client.get("/services").json
    assert (record["job_id"], record["name"], record["node_id"]) == ("job-9", "web", "node-1")
    assert record["attempt"] == (None if commit == "6d050af" else 1)  # 6d050af recorded no attempts
    answer = client.post("/nodes", json={"node_id": "node-3", "address": "10.0.0.3", "slots": 2})
    assert answer.status_code == 201, answer.json

    assert_at_the_schema_of_a_fresh_database(REGISTRY, path, tmp_path)


def test_an_older_database_gains_the_new_nullable_columns_and_keeps_its_rows(tmp_path):
    """Additive changes made before migrations began: a scheduler and a registry
    database without the job's max_processes/private_tmp and the service's attempt
    (and without a history) are completed at start, their rows intact."""
    scheduler = SCHEDULER.settings(sqlite_url(tmp_path / "scheduler.db"))
    registry = REGISTRY.settings(sqlite_url(tmp_path / "registry.db"))
    scheduler_app.create_schema(scheduler)
    registry_app.create_schema(registry)
    with contextlib.closing(sqlite3.connect(tmp_path / "scheduler.db")) as conn, conn:
        conn.execute("INSERT INTO job (command, job_type, env_vars, status, attempt, retry_count, max_retries, "
                     "on_node_lost, node_losses, created_at) VALUES ('true', 'run', '{}', 'pending', 0, 0, 1, "
                     "'requeue', 0, 1.0)")
        for column in ("max_processes", "private_tmp"):
            conn.execute(f"ALTER TABLE job DROP COLUMN {column}")
        conn.execute("DROP TABLE scheduler_schema_migration")
    with contextlib.closing(sqlite3.connect(tmp_path / "registry.db")) as conn, conn:
        conn.execute("INSERT INTO service (job_id, name, node_id, address, port, registered_at) "
                     "VALUES ('job-1', 'web', 'n1', '10.0.0.1', 80, 1.0)")
        conn.execute("ALTER TABLE service DROP COLUMN attempt")
        conn.execute("DROP TABLE registry_schema_migration")

    assert scheduler_app.create_schema(scheduler) == step_names(SCHEDULER)
    assert registry_app.create_schema(registry) == step_names(REGISTRY)
    assert scheduler_app.create_schema(scheduler) == []  # again: nothing left to do

    with contextlib.closing(sqlite3.connect(tmp_path / "scheduler.db")) as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(job)")}
        assert {"max_processes", "private_tmp"} <= columns
        assert conn.execute("SELECT command, max_processes, private_tmp FROM job").fetchall() == [("true", None, None)]
    with contextlib.closing(sqlite3.connect(tmp_path / "registry.db")) as conn:
        assert conn.execute("SELECT job_id, attempt FROM service").fetchall() == [("job-1", None)]


def test_a_table_too_old_to_complete_is_refused_and_nothing_changes(tmp_path):
    """A column that is not null cannot be added to existing rows: the first step
    refuses, names it, and what it had done already is rolled back."""
    path = tmp_path / "scheduler.db"
    settings = SCHEDULER.settings(sqlite_url(path))
    scheduler_app.create_schema(settings)
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("ALTER TABLE job DROP COLUMN max_processes")    # addable
        conn.execute("ALTER TABLE node DROP COLUMN drained")         # not null: not addable
        conn.execute("DROP TABLE scheduler_schema_migration")

    with pytest.raises(SettingError, match=r"the node table lacks the column\(s\) drained.*too old"):
        scheduler_app.create_schema(settings)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert "max_processes" not in {row[1] for row in conn.execute("PRAGMA table_info(job)")}
        assert conn.execute("SELECT count(*) FROM scheduler_schema_migration").fetchone()[0] == 0


# ---- replicas and the lock ---------------------------------------------------------


@pytest.mark.slow
def test_replicas_migrating_a_fresh_database_together_apply_each_step_once(database_url, service, tmp_path):
    env = command_env(database_url, tmp_path)
    procs = [subprocess.Popen([service.script, "migrate"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        outputs.append(out.splitlines())
    applied = [f"applied: {name}" for name in step_names(service)]
    assert sorted(outputs) == sorted([applied] + [["up to date"]] * 3)
    db = service.open(database_url)
    try:
        assert history_rows(db, service) == step_names(service)
    finally:
        dbmod.close_idle(db)


@contextlib.contextmanager
def holding_the_migration_lock(url: str, service: Service):
    """The lock a migrating process holds (control-plane/server/migrations.py), taken by this test."""
    if dbmod.is_postgres(url):
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (service.migrations.lock_key,))
            yield
    else:
        with open(dbmod.sqlite_path(url) + "-migrate.lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield


@pytest.mark.slow
def test_a_replica_waits_while_another_holds_the_migration_lock(database_url, tmp_path):
    lines: list[str] = []
    with holding_the_migration_lock(database_url, SCHEDULER):
        proc = subprocess.Popen([SCHEDULER.script, "migrate"], env=command_env(database_url, tmp_path),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
            reader.start()
            wait_for(lambda: proc.poll() is not None or any("waiting for the migration lock" in line for line in lines),
                     timeout=30, message="the migration to wait for the lock")
            assert proc.poll() is None, "".join(lines)
            db = SCHEDULER.open(database_url)
            try:
                assert migrations.pending(db, SCHEDULER.migrations) == step_names(SCHEDULER)  # nothing yet
            finally:
                dbmod.close_idle(db)
            assert proc.poll() is None
        except BaseException:
            proc.kill()
            raise
    assert proc.wait(60) == 0
    assert proc.stdout.read().splitlines() == [f"applied: {name}" for name in step_names(SCHEDULER)]


# ---- the migrate command and a database newer than the code ------------------------


@pytest.mark.slow
def test_migrate_check_lists_pending_steps_and_exits_1_until_they_are_applied(tmp_path, service):
    env = command_env(sqlite_url(tmp_path / "db.sqlite"), tmp_path)
    check = run([service.script, "migrate", "--check"], env)
    assert (check.returncode, check.stdout.splitlines()) == (1, [f"pending: {n}" for n in step_names(service)])
    applied = run([service.script, "migrate"], env)
    assert (applied.returncode, applied.stdout.splitlines()) == (0, [f"applied: {n}" for n in step_names(service)])
    for argv in ([service.script, "migrate", "--check"], [service.script, "migrate"]):
        again = run(argv, env)
        assert (again.returncode, again.stdout) == (0, "up to date\n")


@pytest.mark.slow
def test_a_database_newer_than_the_code_refuses_to_start(tmp_path, service):
    url = sqlite_url(tmp_path / "db.sqlite")
    env = command_env(url, tmp_path)
    assert run([service.script, "migrate"], env).returncode == 0
    with contextlib.closing(sqlite3.connect(tmp_path / "db.sqlite")) as conn, conn:
        conn.execute(f"INSERT INTO {service.migrations.history_table} (name, applied) "
                     f"VALUES ('0002_from_a_newer_release', '2030-01-01 00:00:00')")

    for argv in ([service.script, "migrate", "--check"], [service.script, "migrate"],
                 [service.script, "--bind", "127.0.0.1:0"]):  # the server: refused before it binds
        refused = run(argv, env)
        assert refused.returncode == 2, refused.stderr
        (line,) = refused.stderr.splitlines()
        assert line.startswith(f"corral-{service.name}: error: the {service.name} database was migrated by a "
                               f"newer Corral") and "0002_from_a_newer_release" in line
    with pytest.raises(SettingError, match="0002_from_a_newer_release"):
        service.app.create_app(service.settings(url))


# ---- both services in one PostgreSQL database ------------------------------------


@pytest.mark.e2e
def test_registry_and_scheduler_share_one_postgresql_database(pg_url):
    """Both have a `node` table: each keeps its tables in its own schema."""
    registry = registry_app.create_app(REGISTRY.settings(pg_url)).test_client()
    scheduler_flask = scheduler_app.create_app(SCHEDULER.settings(pg_url))
    scheduler = scheduler_flask.test_client()
    store = scheduler_flask.extensions["corral.store"]
    try:
        for n in (1, 2):
            answer = registry.post("/nodes", json={"node_id": f"node-{n}", "address": f"10.0.0.{n}", "slots": 2,
                                                   "cpus": 4, "memory_mb": 8000})
            assert answer.status_code == 201, answer.json
        jobs = [scheduler.post("/jobs", json={"command": f"echo {n}"}).json for n in range(2)]  # a slot each
        now = time.time()
        store.nodes.sync_nodes(registry.get("/nodes").json, now)   # what the scheduler's refresh does
        Scheduler(store).place(now)

        assert {n["node_id"] for n in registry.get("/nodes").json} == {"node-1", "node-2"}
        assert registry.get("/nodes/node-1").json["cpus"] == 4
        assert {n["node_id"] for n in scheduler.get("/nodes").json} == {"node-1", "node-2"}
        placed = [scheduler.get(f"/jobs/{job['job_id']}").json["node_id"] for job in jobs]
        assert set(placed) == {"node-1", "node-2"}

        with psycopg.connect(pg_url, connect_timeout=10) as conn:
            tables = set(conn.execute("SELECT table_schema, table_name FROM information_schema.tables "
                                      "WHERE table_schema LIKE 'corral_%'").fetchall())
            node_columns = {schema: {c for (c,) in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = 'node'",
                (schema,))} for schema in ("corral_registry", "corral_scheduler")}
        assert {("corral_registry", "node"), ("corral_scheduler", "node"), ("corral_scheduler", "job"),
                ("corral_registry", "registry_schema_migration"),
                ("corral_scheduler", "scheduler_schema_migration")} <= tables
        assert "cpus" in node_columns["corral_registry"] and "synced_at" in node_columns["corral_scheduler"]
    finally:
        dbmod.close_idle(store.db)


# ---- where the database URL comes from --------------------------------------------


def test_each_service_reads_its_database_url_and_falls_back_on_corral_database_url(tmp_path):
    state = {"CORRAL_STATE_DIR": str(tmp_path)}
    # Unset: a SQLite file per service under the state dir.
    assert SchedulerSettings.from_env(state).database_url == f"sqlite:///{tmp_path}/scheduler.db"
    assert RegistrySettings.from_env(state).database_url == f"sqlite:///{tmp_path}/registry.db"
    # CORRAL_DATABASE_URL: both services on it.
    shared = dict(state, CORRAL_DATABASE_URL="postgresql://corral@db.example:5432/corral")
    assert SchedulerSettings.from_env(shared).database_url == "postgresql://corral@db.example:5432/corral"
    assert RegistrySettings.from_env(shared).database_url == "postgresql://corral@db.example:5432/corral"
    # A service's own DATABASE_URL wins.
    own = dict(shared, DATABASE_URL="postgresql://other@db2.example/sched")
    assert SchedulerSettings.from_env(own).database_url == "postgresql://other@db2.example/sched"
    assert shared_settings.database_url(dict(shared, DATABASE_URL="  "), "x.db") == shared["CORRAL_DATABASE_URL"]


def test_a_sqlite_corral_database_url_is_refused(tmp_path):
    """One SQLite file cannot hold both services (both have a `node` table)."""
    env = {"CORRAL_STATE_DIR": str(tmp_path), "CORRAL_DATABASE_URL": f"sqlite:///{tmp_path}/both.db"}
    with pytest.raises(SettingError, match="CORRAL_DATABASE_URL .* must be a postgresql:// URL"):
        SchedulerSettings.from_env(env)
    # ...unless each service has its own DATABASE_URL.
    assert RegistrySettings.from_env(dict(env, DATABASE_URL="sqlite:///r.db")).database_url == "sqlite:///r.db"


# ---- packaging -------------------------------------------------------------------------


@pytest.mark.slow
def test_a_non_editable_install_ships_the_migration_scripts(tmp_path):
    """What `pip install .` copies (setuptools' build_py over setup.cfg) holds each
    service's scripts, and the services find them there."""
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("shared", "control-plane", "agent", "cli"):
        shutil.copytree(os.path.join(REPO, name), source / name, ignore=ignore)
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), source / name)
    built = tmp_path / "lib"
    done = subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "build_py",
                           "--build-lib", str(built)], cwd=source, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for service in ("scheduler", "registry"):
        assert (built / "corral" / service / "migrations" / "0001_initial.py").is_file()
    probe = ("import json; from corral.scheduler.migrations import MIGRATIONS as s; "
             "from corral.registry.migrations import MIGRATIONS as r; "
             "print(json.dumps([[m.directory, m.names()] for m in (s, r)]))")
    found = subprocess.run([sys.executable, "-c", probe], env=dict(os.environ, PYTHONPATH=str(built)),
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == [[str(built / "corral" / service.name / "migrations"), step_names(service)]
                                        for service in (SCHEDULER, REGISTRY)]


@pytest.mark.e2e
def test_make_run_brings_the_local_cluster_up_on_corral_database_url(tmp_path, pg_url):
    """`CORRAL_DATABASE_URL=postgresql://... make run`: scripts/run_local.py passes it on,
    and both servers keep their tables in that one database."""
    scheduler_port = free_port()
    proc, log = run_local(tmp_path, CORRAL_REGISTRY_PORT=free_port(), CORRAL_SCHEDULER_PORT=scheduler_port,
                           CORRAL_DATABASE_URL=pg_url)
    try:
        ready = wait_for(lambda: proc.poll() is not None or "Ctrl-C stops everything" in open(log).read(),
                         timeout=60, message="run_local to report the cluster ready")
        assert ready and proc.poll() is None and "use the database of CORRAL_DATABASE_URL" in open(log).read()
        jobs = f"http://127.0.0.1:{scheduler_port}/jobs"
        job_id = requests.post(jobs, json={"command": "echo hi"}, timeout=10).json()["job_id"]
        wait_for(lambda: requests.get(f"{jobs}/{job_id}", timeout=10).json()["status"] == "done", timeout=30,
                 message="the job to be done")
        with psycopg.connect(pg_url, connect_timeout=10) as conn:
            assert conn.execute("SELECT stdout FROM corral_scheduler.job").fetchall() == [("hi\n",)]
            assert {n for (n,) in conn.execute("SELECT node_id FROM corral_registry.node")} == {"node-1", "node-2"}
        assert not list((tmp_path / "state").glob("*.db")), "a SQLite file besides"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, open(log).read()
    finally:
        stop_local(proc)  # the test failed: it and everything it started go
