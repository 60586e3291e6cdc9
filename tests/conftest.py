import os
import re
import shutil
from collections.abc import Iterator

import pytest
import responses

import pg
from aws import set_aws_env
from cluster import Cluster, started, world_traversable_dir


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and os.environ.get("CORRAL_NO_SKIPS") == "1" and not hasattr(report, "wasxfail"):
        # In CI every test must really run: a skip (no root, a missing package) is a failure.
        report.outcome = "failed"
        report.longrepr = f"skipped, but CORRAL_NO_SKIPS=1 forbids skips: {report.longrepr}"
    setattr(item, "rep_" + report.when, report)
    return report


@pytest.fixture
def cluster(tmp_path, request):
    """A real registry and scheduler under gunicorn; tests start the agents they need."""
    with started(Cluster(tmp_path), request) as c:
        yield c


@pytest.fixture
def backend_cluster(tmp_path, request, database_url):
    """The `cluster` fixture on each storage backend (`database_url`): SQLite files, or
    registry and scheduler on a fresh PostgreSQL database."""
    with started(Cluster(tmp_path, database_url=database_url), request) as c:
        yield c


@pytest.fixture
def state_dir():
    """A state dir with 0755 parents outside /tmp: jobs (each under a uid of its own,
    with a private /tmp) must reach their work dir by its absolute path, which pytest's
    tmp_path does not allow."""
    path = world_traversable_dir("corral-state-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def shared_dir():
    """A directory every user can write to, for files that jobs write and tests read.

    Jobs run as unprivileged uids of their own when the agent is root, with a private
    /tmp, and pytest's tmp_path lies under a directory only its owner may enter.
    """
    path = world_traversable_dir("corral-test-", 0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def api():
    """The `responses` mock of the control plane's HTTP API; real servers on 127.0.0.1
    (artifact servers, services under test) pass through."""
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        mock.add_passthru(re.compile(r"http://127\.0\.0\.1:\d+/"))
        yield mock


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pg.PgServer]:
    """One throwaway PostgreSQL server per test session (per xdist worker), started on
    first use and stopped when the session ends (tests/pg.py). Skips where PostgreSQL
    is not installed or does not start; in CI that skip is a failure."""
    reason = pg.missing()
    if reason:
        pytest.skip(reason)
    try:
        server = pg.start()
    except pg.StartError as exc:
        pytest.skip(f"PostgreSQL ({pg.PACKAGE}) did not start: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server: pg.PgServer) -> Iterator[str]:
    """A fresh, empty database of its own for this test, as a postgresql:// URL;
    dropped afterwards."""
    name = pg_server.create_database()
    try:
        yield pg_server.url(name)
    finally:
        pg_server.drop_database(name)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.e2e)])
def database_url(request, tmp_path) -> str:
    """The same test on each storage backend: a SQLite file of its own, and a fresh
    database on the session's PostgreSQL server (which starts a server: e2e)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/corral.db"
    return request.getfixturevalue("pg_url")


@pytest.fixture(scope="module")
def moto_endpoint():
    """The URL of a moto server (S3, SQS, SNS, ...) listening on 127.0.0.1: one per
    module (and so per xdist worker), stopped when the module's tests are done."""
    from moto.server import ThreadedMotoServer  # moto is slow to import: only where a test needs it

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def aws_env(moto_endpoint, monkeypatch, tmp_path):
    """The environment of one test points boto3 at the module's moto server."""
    set_aws_env(monkeypatch, tmp_path, moto_endpoint)
    return moto_endpoint


@pytest.fixture
def recorded():
    """The spans the test makes, recorded in memory (tests/span_support.py)."""
    from span_support import recording

    with recording() as spans:
        yield spans


@pytest.fixture(autouse=True)
def _migrated_template(request, monkeypatch):
    """Fresh SQLite databases start as a copy of a migrated one (tests/migrated_template.py)."""
    import migrated_template
    if request.path.name not in migrated_template.REAL_MIGRATIONS:
        monkeypatch.setattr("corral.server.migrations.apply", migrated_template.apply)
