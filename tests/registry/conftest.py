"""The registry's API tests' shared fixtures: its app on each backend (`database_url`)
with a clock the test moves, and its test client."""
import pytest

from corral.registry.app import create_app
from corral.registry.settings import RegistrySettings


class Clock:
    now = 1_800_000_000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def client(database_url, clock):
    settings = RegistrySettings(database_url=database_url, heartbeat_timeout_secs=20)
    return create_app(settings, clock=clock).test_client()
