"""The command line's tests' shared fixtures: a fixed now with polls that do not wait, a
config file of the test's own (never the user's), and the `responses` mock of requests."""
import pytest
import responses

from cli_support import NOW
from corral.cli import common


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch):
    """A fixed now, and polls that do not wait."""
    monkeypatch.setattr(common, "clock", lambda: NOW)
    monkeypatch.setattr(common, "sleep", lambda seconds: None)


@pytest.fixture(autouse=True)
def own_config(tmp_path, monkeypatch):
    """`corral login`'s file in the test's folder: what the person running the tests stored
    is neither read nor changed."""
    path = tmp_path / "config" / "corral" / "config.json"
    monkeypatch.setenv("CORRAL_CONFIG", str(path))
    return path


@pytest.fixture
def mock():
    with responses.RequestsMock() as rsps:
        yield rsps
