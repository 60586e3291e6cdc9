"""Which nodes get new work is decided in one place (liveness.takes_new_work), and every
query that picks nodes by it agrees with it for every state a node can be in: the
placement snapshot, the claim that asks placement to fill a slot, and the release of
jobs placed on a node that stopped taking work."""
import itertools

import pytest

from corral.scheduler import liveness
from corral.scheduler.models import Job, Node

STATES = list(itertools.product(("healthy", "unhealthy"), (False, True), (None, "disk 97% full"),
                                ("compute", "service")))


def node_id(status, drained, refusing, kind):
    return f"{kind}-{status}-{'drained' if drained else 'open'}-{'refusing' if refusing else 'taking'}"


def listing():
    return [{"node_id": node_id(*state), "address": "10.0.0.1", "kind": state[3], "slots": 4, "status": state[0],
             "drained": state[1], "refusing_work": state[2], "last_heartbeat": "2027-01-15T08:00:00.000Z"}
            for state in STATES]


def test_takes_new_work_only_when_healthy_undrained_not_refusing_and_compute():
    taking = [state for state in STATES if liveness.takes_new_work(*state)]
    assert taking == [("healthy", False, None, "compute")]
    assert all(liveness.why_no_new_work(*state) for state in STATES if state not in taking)
    assert liveness.why_no_new_work("healthy", False, None) == ""


@pytest.mark.parametrize("status, drained", list(itertools.product(("healthy", "unhealthy"), (False, True))))
def test_the_node_list_status_keeps_the_registry_status_and_the_drain(status, drained):
    assert liveness.as_registry(liveness.listed(status, drained)) == (status, drained and status == "healthy")
    for again in (False, True):
        assert liveness.redrained(liveness.listed(status, drained), again) == liveness.listed(status, again)


def test_every_query_agrees_with_the_decision(store, clock):
    expected = {node_id(*state) for state in STATES if liveness.takes_new_work(*state)}
    store.nodes.sync_nodes(listing(), clock())

    in_sql = {n.node_id for n in Node.select(Node.node_id).where(liveness.taking_new_work(Node))}
    assert in_sql == expected
    snapshot = {n.node_id for n in store.snapshot.nodes(include_others=True) if n.takes_work}
    assert snapshot == expected
    assert set(store.snapshot.open_nodes()) == expected

    # A claim asks placement to fill a slot only on a node that takes new work.
    store.submits.submit({"command": "true"}, clock())
    asked = {n for n in (node_id(*state) for state in STATES)
             if store.claims.claim_room(n, {"max": 1}, clock())[1]}
    assert asked == expected


def test_jobs_placed_on_a_node_that_stopped_taking_work_are_released(store, clock):
    store.nodes.sync_nodes(listing(), clock())
    ids = [node_id(*state) for state in STATES]
    for n in ids:
        job, _ = store.submits.submit({"command": "true"}, clock())
        Job.update(node_id=n, placed_at=clock()).where(Job.id == job.id).execute()
    released = store.nodes.release_lost(clock())
    kept = {j.node_id for j in Job.select(Job.node_id).where(Job.node_id.is_null(False))}
    assert kept == {n for n, state in zip(ids, STATES) if liveness.takes_new_work(*state)}
    assert released == len(ids) - len(kept)
