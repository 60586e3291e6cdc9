"""The scheduler's background pass, driven with a fake clock and a fake registry."""
import pytest

from corral.scheduler.app import open_store
from corral.scheduler.loops import Background
from corral.scheduler.models import MODELS, Job
from corral.scheduler.settings import SchedulerSettings
from corral.scheduler.validation import status_report
from corral.shared.clients import Unreachable

T0 = 1_800_000_000.0


class FakeRegistry:
    def __init__(self, nodes=()):
        self.nodes = list(nodes)
        self.down = False
        self.calls = 0

    def list_nodes(self, kind=None, status=None):
        self.calls += 1
        if self.down:
            raise Unreachable("connection refused")
        return self.nodes


def node(node_id, status="healthy"):
    return {"node_id": node_id, "address": "127.0.0.1", "kind": "compute", "slots": 4, "status": status}


@pytest.fixture
def store(tmp_path):
    settings = SchedulerSettings(database_url=f"sqlite:///{tmp_path}/s.db", job_timeout_secs=100,
                                 timeout_check_secs=10, node_refresh_secs=2)
    store = open_store(settings)
    store.db.create_tables(MODELS)
    return store


def test_only_the_lease_holder_works_and_another_takes_over_when_it_stops(store):
    registry = FakeRegistry([node("n1")])
    first, second = Background(store, registry, "a"), Background(store, registry, "b")
    assert first.tick(T0) is True
    assert second.tick(T0 + 1) is False
    assert registry.calls == 1
    assert first.tick(T0 + 5) is True            # renewing keeps it
    assert second.tick(T0 + 5 + first.lease_ttl - 1) is False
    assert second.tick(T0 + 5 + first.lease_ttl + 0.1) is True   # the holder went silent
    assert first.tick(T0 + 5 + first.lease_ttl + 0.2) is False


def test_nodes_are_refreshed_and_waiting_jobs_placed(store):
    registry = FakeRegistry()
    background = Background(store, registry, "a")
    job, _ = store.submit({"command": "true"}, T0)
    background.tick(T0)
    assert Job.get_by_id(job.id).node_id is None
    registry.nodes = [node("n1")]
    background.tick(T0 + 1)              # not yet time to refresh
    assert Job.get_by_id(job.id).node_id is None
    background.tick(T0 + 2)
    assert Job.get_by_id(job.id).node_id == "n1"


def test_a_registry_outage_keeps_the_known_nodes(store):
    registry = FakeRegistry([node("n1")])
    background = Background(store, registry, "a")
    background.tick(T0)
    registry.down = True
    background.tick(T0 + 10)
    job, _ = store.submit({"command": "true"}, T0 + 11)
    assert job.node_id == "n1"
    assert background.registry_down_since == T0 + 10
    registry.down = False
    registry.nodes = [node("n1", "unhealthy"), node("n2")]
    background.tick(T0 + 20)
    assert background.registry_down_since is None
    assert Job.get_by_id(job.id).node_id == "n2"


def test_timeouts_are_checked_on_their_own_interval(store):
    background = Background(store, FakeRegistry([node("n1")]), "a")
    background.tick(T0)
    job, _ = store.submit({"command": "sleep 1000"}, T0)
    store.report(job.job_id, status_report({"node_id": "n1", "attempt": 1, "status": "running"}), T0)
    background.tick(T0 + 95)             # not overdue yet; next check at T0 + 105
    background.tick(T0 + 101)            # overdue, but the check is not due
    assert Job.get_by_id(job.id).status == "running"
    background.tick(T0 + 105)
    failed = Job.get_by_id(job.id)
    assert failed.status == "failed" and failed.exit_code == -1 and failed.stderr == "job timed out"
