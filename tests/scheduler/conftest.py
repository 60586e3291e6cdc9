"""The scheduler's API tests' shared fixtures (test_scheduler_api, test_dispatch_api): its
app on each backend (`database_url`) with a clock the test moves, its test client and store."""
import pytest

from scheduler_app import Clock, make_app


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def app(database_url, clock):
    return make_app(database_url, clock, max_jobs_per_node=4)


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def store(app):
    return app.extensions["corral.store"]
