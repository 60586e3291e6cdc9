"""The command line's tests' shared fixtures: a fixed now with polls that do not wait, and
the `responses` mock of requests."""
import pytest
import responses

from cli_support import NOW
from corral.cli import common


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch):
    """A fixed now, and polls that do not wait."""
    monkeypatch.setattr(common, "clock", lambda: NOW)
    monkeypatch.setattr(common, "sleep", lambda seconds: None)


@pytest.fixture
def mock():
    with responses.RequestsMock() as rsps:
        yield rsps
