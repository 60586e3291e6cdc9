"""The scheduler's background pass, driven with a fake clock and a fake registry."""
import threading

import pytest

from corral.scheduler import lifecycle, loops
from corral.scheduler.app import create_schema, open_store
from corral.scheduler.loops import Background
from corral.scheduler.models import Job, Node
from corral.scheduler.service import Scheduler
from corral.scheduler.settings import SchedulerSettings
from corral.scheduler.store.nodes import Nodes
from corral.scheduler.validation import claim_request, status_report
from corral.shared.clients import Unreachable
from corral.server import leased, serve as server
from corral.server.leader import Lease, LeaseLost, LoopThread, Tenure

from helpers import wait_for

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


def store_with(database_url, **settings):
    """A scheduler store on a new database (each backend: `database_url`), with these settings."""
    full = SchedulerSettings(database_url=database_url, **settings)
    create_schema(full)
    return open_store(full)


@pytest.fixture
def store(database_url):
    store = store_with(database_url, job_timeout_secs=100, timeout_check_secs=10, node_refresh_secs=2)
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


def test_a_leader_that_lost_its_lease_mid_pass_changes_nothing(store):
    """A leader paused (SIGSTOP, a frozen VM) after taking its lease wakes up after another
    process took over: every write of the rest of its pass is refused by the fence."""
    registry = FakeRegistry([node("n1"), node("n2")])  # n2 keeps a free slot to place on
    old, new = Background(store, registry, "a"), Background(store, registry, "b")
    assert old.tick(T0) is True
    job = running_job(store, old, T0, instance_id="n1")
    overdue = T0 + store.settings.job_timeout_secs + 50
    taken_over = T0 + old.lease_ttl + 1
    assert new.tick(taken_over) is True
    store.leases.renew_lease("n1", overdue)
    waiting, _ = store.submits.submit({"command": "true"}, overdue)  # work for the pass to place
    # The old leader resumes the pass it started with its old token.
    with pytest.raises(LeaseLost):
        old.store.actions.fail_timed_out(overdue)
    with pytest.raises(LeaseLost):
        old.scheduler.place(overdue)
    with pytest.raises(LeaseLost):
        old.store.nodes.sync_nodes([], overdue)
    with pytest.raises(LeaseLost):
        old.one_pass(overdue)                      # the whole pass stops at its first write
    assert Job.get_by_id(job.id).status == "running" and Node.select().count() == 2
    assert Job.get_by_id(waiting.id).node_id is None
    assert new.tick(overdue) is True and Job.get_by_id(job.id).status == "failed"   # the new leader's work
    assert Job.get_by_id(waiting.id).node_id is not None


def test_nodes_are_refreshed_and_waiting_jobs_placed(store):
    registry = FakeRegistry()
    background = Background(store, registry, "a")
    job, _ = store.submits.submit({"command": "true"}, T0)
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
    job, _ = Scheduler(store).submit({"command": "true"}, T0 + 11)
    assert job.node_id == "n1"
    assert background.registry_down_since == T0 + 10
    registry.down = False
    registry.nodes = [node("n1", "unhealthy"), node("n2")]
    background.tick(T0 + 20)
    assert background.registry_down_since is None
    assert Job.get_by_id(job.id).node_id == "n2"


def test_a_node_advertising_more_slots_than_the_cap_is_warned_about_once(database_url, caplog):
    """MAX_JOBS_PER_NODE (1 by default) below what an agent advertises is a surprise
    (`SLOTS 2` and one job at a time): said once per node, when its entry is first read."""
    store = store_with(database_url, node_refresh_secs=2)  # MAX_JOBS_PER_NODE=1
    registry = FakeRegistry([dict(node("n1"), slots=2), dict(node("n2"), slots=1)])
    background = Background(store, registry, "a")
    caplog.set_level("WARNING", logger="corral.scheduler.loops")
    background.tick(T0)
    background.tick(T0 + 2)
    background.tick(T0 + 4)
    warned = [r.getMessage() for r in caplog.records if "MAX_JOBS_PER_NODE" in r.getMessage()]
    assert warned == ["node n1 advertises 2 slots but MAX_JOBS_PER_NODE is 1: it runs at most 1 job at once "
                      "(raise MAX_JOBS_PER_NODE to use them all)"]
    registry.nodes.append(dict(node("n3"), slots=8))
    background.tick(T0 + 6)
    warned = [r.getMessage() for r in caplog.records if "MAX_JOBS_PER_NODE" in r.getMessage()]
    assert len(warned) == 2 and warned[1].startswith("node n3 advertises 8 slots")


def test_timeouts_are_checked_on_their_own_interval(store):
    background = Background(store, FakeRegistry([node("n1")]), "a")
    background.tick(T0)
    job, _ = Scheduler(store).submit({"command": "sleep 1000"}, T0)
    store.reports.report(job.job_id, status_report({"node_id": "n1", "attempt": 1, "status": "running"}), T0)
    # Overdue for the watcher: past the timeout, the kill grace and its slack (100 + 10 + 5 s).
    late = store.settings.job_kill_grace_secs + lifecycle.WATCHER_SLACK_SECS
    for now in (T0 + 95 + late, T0 + 101 + late):  # not overdue, then overdue but the check is not due
        store.leases.renew_lease("n1", now)
        background.tick(now)
    assert Job.get_by_id(job.id).status == "running"
    store.leases.renew_lease("n1", T0 + 105 + late)
    background.tick(T0 + 105 + late)
    failed = Job.get_by_id(job.id)
    assert failed.status == "failed" and failed.exit_code == -1 and failed.stderr == "job timed out"


def running_job(store, background, now, node_id="n1", **fields):
    job, _ = Scheduler(store).submit({"command": "sleep 1000", **fields}, now)
    job = Job.get_by_id(job.id)
    store.reports.report(job.job_id, status_report({"node_id": job.node_id, "attempt": job.attempt,
                                                    "status": "running"}), now)
    return Job.get_by_id(job.id)


def test_running_jobs_of_a_node_whose_lease_lapsed_are_requeued_after_the_grace(database_url):
    store = store_with(database_url, heartbeat_timeout_secs=20, node_lost_grace_secs=15, max_jobs_per_node=4)
    registry = FakeRegistry([node("n1"), node("n2")])
    background = Background(store, registry, "a")
    background.tick(T0)
    keep = running_job(store, background, T0, instance_id="n1")
    fail = running_job(store, background, T0, instance_id="n1", on_node_lost="fail")
    other = running_job(store, background, T0, instance_id="n2")
    store.leases.renew_lease("n1", T0 + 1)
    for t in range(2, 40, 2):           # n2 keeps renewing; n1 went silent at T0 + 1
        store.leases.renew_lease("n2", T0 + t)
        background.tick(T0 + t)
        if t < 36:
            assert Job.get_by_id(keep.id).status == "running", t
    requeued, failed = Job.get_by_id(keep.id), Job.get_by_id(fail.id)
    assert requeued.status == "pending" and requeued.node_losses == 1 and requeued.retry_count == 0
    assert failed.status == "failed" and failed.exit_code == -1 and "on_node_lost=fail" in failed.stderr
    assert Job.get_by_id(other.id).status == "running"


def test_a_new_leader_gives_every_node_a_full_lease_period(database_url):
    store = store_with(database_url, heartbeat_timeout_secs=20, node_lost_grace_secs=15)
    background = Background(store, FakeRegistry([node("n1")]), "a")
    background.tick(T0)
    job = running_job(store, background, T0)
    store.leases.renew_lease("n1", T0)
    # The scheduler was down for a minute; the node renews again soon after it is back.
    restarted = Background(store, FakeRegistry([node("n1")]), "b")
    restarted.tick(T0 + 60)             # the old holder's lease row expired long ago
    assert restarted.tenure.since == T0 + 60
    restarted.tick(T0 + 70)
    assert Job.get_by_id(job.id).status == "running"
    store.leases.renew_lease("n1", T0 + 72)
    restarted.tick(T0 + 100)
    assert Job.get_by_id(job.id).status == "running"


def test_a_job_that_keeps_losing_its_node_fails(database_url):
    store = store_with(database_url, heartbeat_timeout_secs=1, node_lost_grace_secs=1, max_node_losses=1,
                       retry_base_secs=0)
    background = Background(store, FakeRegistry([node("n1")]), "a")
    background.tick(T0)
    job = running_job(store, background, T0)
    for t in range(1, 6):  # a pass a second, as the loop runs
        background.tick(T0 + t)
    job = Job.get_by_id(job.id)
    assert job.status == "pending" and job.node_id == "n1" and job.node_losses == 1
    store.reports.report(job.job_id, status_report({"node_id": "n1", "attempt": job.attempt, "status": "running"}),
                         T0 + 6)
    for t in range(6, 11):
        background.tick(T0 + t)
    job = Job.get_by_id(job.id)
    assert job.status == "failed" and "MAX_NODE_LOSSES" in job.stderr


@pytest.mark.slow
def test_a_leader_that_did_not_run_for_a_lease_gives_every_node_a_full_lease_period(database_url):
    """A scheduler stopped (SIGSTOP, a suspended host) keeps its lease row when nobody
    took over, but the agents' renewals could not land while it was away: it must
    not count their nodes lost the moment it runs again."""
    store = store_with(database_url, heartbeat_timeout_secs=20, node_lost_grace_secs=15)
    background = Background(store, FakeRegistry([node("n1")]), "a")
    background.tick(T0)
    job = running_job(store, background, T0)
    store.leases.renew_lease("n1", T0)
    background.tick(T0 + 1)
    background.tick(T0 + 60)           # stopped for a minute, then running again
    assert background.tenure.since == T0 + 60
    assert Job.get_by_id(job.id).status == "running"
    for t in range(61, 100, 2):        # the agent's renewals land again soon after
        if t > 61:
            store.leases.renew_lease("n1", T0 + t)
        background.tick(T0 + t)
        assert Job.get_by_id(job.id).status == "running", t
    # A node that does stay silent is still lost, a lease period and the grace later.
    for t in range(100, 140, 2):
        background.tick(T0 + t)
    assert Job.get_by_id(job.id).status == "pending"


def test_a_worker_told_to_stop_gives_the_lease_up_and_a_stopping_worker_never_takes_it(database_url, monkeypatch):
    """SIGTERM reaches every worker of a stopping scheduler. The leader ends its loop and
    gives the lease up at once; another worker that is stopping too must not take it over
    (it would hold the lease, and its shutdown, for nothing), not even from a pass that
    had begun before it was told to stop and tries the lease only after the leader gave
    it up."""
    # The node list is fetched every 0.1 s: the third fetch comes soon.
    store = store_with(database_url, job_timeout_secs=100, timeout_check_secs=10, node_refresh_secs=0.1)
    told_to_stop = []
    monkeypatch.setattr(server, "on_stop_signal", told_to_stop.append)
    monkeypatch.setattr(leased.atexit, "register", lambda at_exit: None)
    registry = FakeRegistry([node("n1")])
    leader, other = Background(store, registry, "leader"), Background(store, registry, "other")
    in_pass, leader_gone = threading.Event(), threading.Event()
    acquire = other.fence.acquire

    def late_acquire(*args):
        if registry.calls >= 3:  # the leader has kept the lease a while: hold this pass back
            in_pass.set()
            leader_gone.wait(10)
        return acquire(*args)
    monkeypatch.setattr(other.fence, "acquire", late_acquire)

    def lease():
        with store.db.connection_context():
            return Lease.get_by_id(loops.LEASE_NAME)

    first = leased.run_in_background(store.db, LoopThread("leader", 0.01, leader.tick), leader.fence)
    wait_for(lambda: leader.tenure.token is not None, message="the leader's first pass")
    second = leased.run_in_background(store.db, LoopThread("other", 0.01, other.tick), other.fence)
    assert in_pass.wait(10), "the other worker's pass under way"
    stop_leader, stop_other = told_to_stop
    stop_other()
    stop_leader()
    first.thread.join(5)
    assert not first.thread.is_alive()
    assert lease().expires_at == 0.0  # given up
    leader_gone.set()
    second.thread.join(5)
    assert not second.thread.is_alive()
    held = lease()
    assert (held.holder, held.token, held.expires_at) == ("leader", 1, 0.0)  # never taken over
    assert other.tenure.token is None


def test_a_job_claimed_after_it_was_read_as_stranded_keeps_its_node(store, monkeypatch):
    """Its node turns unhealthy while its agent claims a job placed there. The pass that
    unplaces the node's pending jobs read this one as pending; the claim then made it
    running (on PostgreSQL, committed by another process between that read and the
    write). The write must not take the node off a running job: nothing would ever
    finish or requeue it."""
    registry = FakeRegistry([node("n1")])
    background = Background(store, registry, "a")
    background.tick(T0)
    scheduler = Scheduler(store)
    job, _ = scheduler.submit({"command": "true"}, T0 + 1)
    assert (job.status, job.node_id) == ("pending", "n1")
    read_stranded = Nodes._stranded

    def claimed_right_after_the_read(self):
        stranded = read_stranded(self)
        assert [j.id for j in stranded] == [job.id]
        assert [j.id for j in scheduler.claim("n1", claim_request({"max": 1}), T0 + 2)] == [job.id]
        return stranded

    monkeypatch.setattr(Nodes, "_stranded", claimed_right_after_the_read)
    registry.nodes = [node("n1", "unhealthy")]
    background.tick(T0 + 3)
    row = Job.get_by_id(job.id)
    assert (row.status, row.node_id) == ("running", "n1")
    assert not [e for e in store.jobs.events(job.job_id) if "unplaced" in e.reason]


def test_a_tenure_begins_at_a_new_token_or_after_a_pause_longer_than_its_gap():
    tenure = Tenure(gap=10)
    assert tenure.begin_pass(1, T0) == "taken" and tenure.since == T0
    assert tenure.begin_pass(1, T0 + 10) is None and tenure.since == T0       # a pass exactly a gap later
    assert tenure.begin_pass(1, T0 + 20.5) == "resumed" and tenure.since == T0 + 20.5
    assert tenure.paused == 10.5
    assert tenure.begin_pass(1, T0 + 21) is None and tenure.paused == 0.0
    tenure.lost()                                                          # another process took over
    assert tenure.token is None
    assert tenure.begin_pass(3, T0 + 22) == "taken" and (tenure.token, tenure.since) == (3, T0 + 22)
