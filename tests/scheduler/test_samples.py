"""The charts' samples, computed from what the sampler read (samples.py): the window a
sample counts, the latency percentiles, what is kept of each node."""
import pytest

from corral.scheduler import contract, samples
from corral.scheduler.samples import SETTLE_SECS

NOW = 1_800_000_000.0


def node(node_id="n1", used=(512, 40), **overrides):
    fields = {"node_id": node_id, "address": "10.0.0.1", "kind": "compute", "status": "healthy", "drained": False,
              "refusing_work": None, "slots": 4, "capacity": 2, "slots_used": 1, "max_memory_mb": 4096,
              "max_cpu_percent": 400,
              "labels": {}, "pool": "default", "allocatable": {"memory_mb": 3072, "cpu_percent": 300},
              "reserved": {"memory_mb": 1024, "cpu_percent": 100},
              "used": None if used is None else {"memory_mb": used[0], "cpu_percent": used[1]},
              "gpus": [], "resources": {}, "resources_reserved": {}, "gpus_used": None,
              "last_heartbeat": None, "synced_at": "2027-01-15T08:00:00.000Z"}
    return contract.SchedulerNode.model_validate(dict(fields, **overrides))


def test_a_window_begins_where_the_previous_one_ended_and_ends_a_moment_ago():
    first = samples.window(None, NOW, 10.0)
    assert first == (NOW - SETTLE_SECS - 10.0, NOW - SETTLE_SECS)
    second = samples.window(NOW, NOW + 10.0, 10.0)
    assert second == (first[1], NOW + 10.0 - SETTLE_SECS)  # back to back: nothing counted twice or lost
    # After a long pause, the next window covers all of it.
    assert samples.window(NOW, NOW + 3600.0, 10.0) == (NOW - SETTLE_SECS, NOW + 3600.0 - SETTLE_SECS)
    # A clock that went back never makes a window end before it starts.
    start, end = samples.window(NOW, NOW - 5.0, 10.0)
    assert start <= end


@pytest.mark.parametrize("values, q, expected", [
    ([], 0.5, None),
    ([3.0], 0.5, 3.0),
    ([3.0], 0.95, 3.0),
    ([4.0, 1.0, 3.0, 2.0], 0.5, 2.0),          # nearest rank: an observed value, the 2nd of 4
    ([float(i) for i in range(1, 101)], 0.95, 95.0),
    ([float(i) for i in range(1, 101)], 0.5, 50.0),
    ([0.2, 0.1, 9.0], 0.95, 9.0),
])
def test_percentiles_are_nearest_rank(values, q, expected):
    assert samples.percentile(values, q) == expected


def test_a_sample_counts_finished_by_status_pending_running_and_the_latency_of_first_starts():
    data = samples.sample({"done": 7, "failed": 2}, {"pending": 5, "running": 3},
                          [0.5, 0.1, 0.2, 0.3, 2.0], [node("a"), node("b", used=None, drained=True)])
    assert data["finished"] == {"cancelled": 0, "done": 7, "failed": 2}
    assert (data["pending"], data["running"], data["started"]) == (5, 3, 5)
    assert data["dispatch_latency"] == {"p50_secs": 0.3, "p95_secs": 2.0}
    assert [samples.node_usage(row) for row in data["nodes"]] == [
        {"node_id": "a", "status": "healthy", "drained": False, "capacity": 2, "slots_used": 1,
         "allocatable": {"memory_mb": 3072, "cpu_percent": 300}, "reserved": {"memory_mb": 1024, "cpu_percent": 100},
         "used": {"memory_mb": 512, "cpu_percent": 40}},
        {"node_id": "b", "status": "healthy", "drained": True, "capacity": 2, "slots_used": 1,
         "allocatable": {"memory_mb": 3072, "cpu_percent": 300}, "reserved": {"memory_mb": 1024, "cpu_percent": 100},
         "used": None},
    ]
    # It is what the answer's sample is made of.
    contract.StatsSample.model_validate(dict(samples.answer(data), at="2027-01-15T08:00:00.000Z",
                                             since="2027-01-15T07:59:50.000Z"))
    assert samples.answer(data, "b")["nodes"] == [samples.node_usage(data["nodes"][1])]
    assert samples.answer(data, "c")["nodes"] == []


def test_a_quiet_interval_has_zeros_and_no_latency():
    data = samples.sample({}, {}, [], [])
    assert data == {"finished": {"cancelled": 0, "done": 0, "failed": 0}, "pending": 0, "running": 0, "started": 0,
                    "dispatch_latency": {"p50_secs": None, "p95_secs": None}, "nodes": []}


def test_a_wait_below_zero_counts_as_zero():
    """A job's start recorded a hair before its submission (two hosts' clocks) is no negative latency."""
    assert samples.sample({}, {}, [-0.002, 0.004], [])["dispatch_latency"] == {"p50_secs": 0.0, "p95_secs": 0.004}
