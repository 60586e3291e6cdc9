"""The pure placement pass: policies, constraints and pools, reservations,
throttles, and the reasons it gives for the jobs it cannot place."""
import pytest

from corral.scheduler.placement import (Ask, NodeInfo, Planner, Throttle, fits_maximum, queue_at, satisfies,
                                        shortfalls)


def plan(asks, nodes, cursor=None, policy="round-robin", throttles=None, fallback=None, explain=False):
    planner = Planner(nodes, policy, cursor, throttles, fallback, explain=explain)
    planner.offer(asks)
    return planner.plan()


def pairs(result):
    return [(p.job_id, p.node_id) for p in result.placed]


def slots(**free):
    return [NodeInfo(node_id, n) for node_id, n in free.items()]


def sized(node_id, memory, cpu=10_000, free=8, **kw):
    """A node with `memory` MB and `cpu` % allocatable, known defaults of 100 MB / 100 %."""
    return NodeInfo(node_id, free, max_memory_mb=memory, max_cpu_percent=cpu,
                    default_limits={"run": (100, 100), "service": (200, 200)}, **kw)


# ---- round robin, pins, maximum limits (the original design's placement) -----------------

def test_round_robin_alternates_between_nodes():
    result = plan([Ask(i) for i in range(1, 5)], slots(a=2, b=2))
    assert pairs(result) == [(1, "a"), (2, "b"), (3, "a"), (4, "b")]
    assert result.cursor == "b"


def test_round_robin_resumes_after_the_cursor():
    result = plan([Ask(1)], slots(a=1, b=1, c=1), "a")
    assert pairs(result) == [(1, "b")] and result.cursor == "b"


def test_cursor_of_a_vanished_node_resumes_at_the_next_one():
    assert pairs(plan([Ask(1)], slots(a=1, c=1), "b")) == [(1, "c")]
    assert pairs(plan([Ask(1)], slots(a=1, c=1), "d")) == [(1, "a")]


def test_full_nodes_are_skipped_and_leftover_jobs_wait():
    result = plan([Ask(i) for i in range(1, 5)], slots(a=0, b=1, c=1))
    assert pairs(result) == [(1, "b"), (2, "c")]
    assert result.exhausted  # every slot taken: jobs 3 and 4 were not even offered
    assert set(result.waiting) == set()


def test_no_nodes_places_nothing_and_says_so():
    result = plan([Ask(1)], [], "a")
    assert pairs(result) == [] and result.cursor == "a"


def test_negative_free_counts_as_full():
    # A node that holds more than its capacity (the limit was lowered) takes nothing.
    result = plan([Ask(1)], slots(a=-2))
    assert pairs(result) == [] and result.cursor is None


def test_pinned_job_goes_only_to_its_node_and_keeps_the_cursor():
    result = plan([Ask(1, pin="b"), Ask(2)], slots(a=1, b=1))
    assert pairs(result) == [(1, "b"), (2, "a")] and result.cursor == "a"


def test_pinned_job_waits_when_its_node_is_full_or_unknown():
    result = plan([Ask(1, pin="b"), Ask(2, pin="zz"), Ask(3)], slots(a=1, b=0))
    assert pairs(result) == [(3, "a")]
    assert result.waiting[1].code == "no_capacity" and result.waiting[1].details["lacking"] == ["slot"]
    assert result.waiting[2].code == "pinned_node_unavailable" and result.waiting[2].details == {"node_id": "zz"}


def test_jobs_go_only_to_nodes_that_allow_their_limits():
    small = NodeInfo("a", 2, max_memory_mb=512, max_cpu_percent=100)
    big = NodeInfo("b", 2, max_memory_mb=4096, max_cpu_percent=400)
    unknown = NodeInfo("c", 2)
    assert fits_maximum(Ask(1, memory_mb=512, cpu_percent=100), small)
    assert not fits_maximum(Ask(1, memory_mb=513), small)
    assert not fits_maximum(Ask(1, cpu_percent=200), small)
    assert fits_maximum(Ask(1, memory_mb=10**6), unknown)
    jobs = [Ask(1, memory_mb=2048), Ask(2, memory_mb=2048), Ask(3), Ask(4, memory_mb=8192)]
    result = plan(jobs, [small, big])
    assert pairs(result) == [(1, "b"), (2, "b"), (3, "a")]
    assert result.waiting[4].code == "no_capacity" and result.waiting[4].details["lacking"] == ["limits"]


def test_a_pinned_job_waits_when_its_node_does_not_allow_its_limits():
    result = plan([Ask(1, pin="a", cpu_percent=800)], [NodeInfo("a", 1, max_cpu_percent=400)])
    assert pairs(result) == [] and result.waiting[1].details["lacking"] == ["limits"]


# ---- constraints and pools ----------------------------------------------------------------

@pytest.mark.parametrize("constraint, labels, expected", [
    (("zone", "=", "a"), {"zone": "a"}, True),
    (("zone", "=", "a"), {"zone": "b"}, False),
    (("zone", "=", "a"), {}, False),
    (("zone", "!=", "a"), {"zone": "b"}, True),
    (("zone", "!=", "a"), {"zone": "a"}, False),
    (("zone", "!=", "a"), {}, True),
    (("zone", "in", ("a", "b")), {"zone": "b"}, True),
    (("zone", "in", ("a", "b")), {"zone": "c"}, False),
    (("zone", "in", ("a", "b")), {}, False),
    (("zone", "not_in", ("a", "b")), {"zone": "c"}, True),
    (("zone", "not_in", ("a", "b")), {"zone": "a"}, False),
    (("zone", "not_in", ("a", "b")), {}, True),
    (("gpu", "exists", None), {"gpu": ""}, True),
    (("gpu", "exists", None), {}, False),
    (("gpu", "not_exists", None), {}, True),
    (("gpu", "not_exists", None), {"gpu": "a100"}, False),
])
def test_each_constraint_operator(constraint, labels, expected):
    assert satisfies(labels, constraint) is expected


def labelled(node_id, free=4, **labels):
    return NodeInfo(node_id, free, labels=labels)


def test_constrained_jobs_go_only_to_matching_nodes():
    nodes = [labelled("a", zone="a"), labelled("b", zone="b", gpu="a100"), labelled("c", zone="a", gpu="t4")]
    asks = [Ask(1, constraints=(("zone", "=", "a"), ("gpu", "exists", None))),
            Ask(2, constraints=(("zone", "=", "a"),)), Ask(3, constraints=(("zone", "=", "a"),)),
            Ask(4, constraints=(("gpu", "not_exists", None),))]
    assert pairs(plan(asks, nodes)) == [(1, "c"), (2, "a"), (3, "c"), (4, "a")]


def test_a_node_s_pool_is_its_pool_label_or_default():
    nodes = [labelled("a"), labelled("b", pool="batch"), labelled("c", pool="gpu")]
    result = plan([Ask(1, pool="default"), Ask(2, pool="gpu"), Ask(3, pool="batch"), Ask(4), Ask(5, pool="nope")],
                  nodes)
    assert pairs(result)[:3] == [(1, "a"), (2, "c"), (3, "b")]
    assert pairs(result)[3][0] == 4  # no pool asked: any pool
    assert result.waiting[5].code == "constraints_unmet"
    assert result.waiting[5].details == {"constraint": {"label": "pool", "op": "=", "value": "nope"}}


def test_the_reason_names_the_constraint_no_healthy_node_meets():
    nodes = [labelled("a", zone="a"), labelled("b", zone="b", gpu="x"),
             NodeInfo("c", 4, status="unhealthy", labels={"zone": "c"})]
    result = plan([Ask(1, constraints=(("zone", "=", "a"), ("zone", "=", "c"))),
                   Ask(2, constraints=(("zone", "=", "a"), ("gpu", "exists", None)))], nodes)
    assert result.waiting[1].code == "constraints_unmet"
    assert result.waiting[1].details == {"constraint": {"label": "zone", "op": "=", "value": "c"}}
    assert "zone = c" in result.waiting[1].message
    # each is met by some node, never both by one
    assert result.waiting[2].details["constraints"] == [{"label": "zone", "op": "=", "value": "a"},
                                                         {"label": "gpu", "op": "exists"}]


def test_drained_and_unhealthy_nodes_take_nothing_and_the_reason_says_which():
    nodes = [NodeInfo("a", 4, drained=True, labels={"zone": "a"}), NodeInfo("b", 4, status="unhealthy")]
    result = plan([Ask(1, constraints=(("zone", "=", "a"),)), Ask(2, pin="b"), Ask(3, pin="a")], nodes)
    assert pairs(result) == []
    assert (result.waiting[1].code, result.waiting[1].details) == ("draining", {"node_ids": ["a"]})
    assert result.waiting[2].code == "pinned_node_unavailable"
    assert result.waiting[3].code == "draining"
    assert plan([Ask(1)], [NodeInfo("b", 4, status="unhealthy")]).waiting[1].code == "no_healthy_node"


def test_a_node_refusing_work_takes_nothing_and_the_reason_names_it_and_why():
    low = "only 812 MB free on the filesystem of /w, under AGENT_MIN_FREE_DISK_MB (1024 MB)"
    nodes = [NodeInfo("a", 4, refusing_work=low), NodeInfo("b", 4, drained=True)]
    assert not nodes[0].takes_work
    result = plan([Ask(1), Ask(2, pin="a")], nodes)
    assert pairs(result) == []
    for job in (1, 2):
        reason = result.waiting[job]
        assert (reason.code, reason.details) == ("node_refusing_work", {"node_ids": ["a"]})
        assert reason.message == f"the nodes it may go to take no new work (a: {low})"
    assert pairs(plan([Ask(1)], nodes + [NodeInfo("c", 4)])) == [(1, "c")]
    (found,) = shortfalls(Ask(1), nodes[:1])
    assert found["lacks"] == [f"the node takes no new work: {low}"]


# ---- reservations ---------------------------------------------------------------------------

def test_reservations_never_exceed_allocatable_memory():
    # Four 8 GB jobs and one 16 GB node: two fit; the others wait for memory.
    node = sized("a", 16_384)
    result = plan([Ask(i, memory_mb=8192) for i in range(1, 5)], [node])
    assert pairs(result) == [(1, "a"), (2, "a")]
    assert [p.memory_mb for p in result.placed] == [8192, 8192]
    # No memory is left for any job: the pass ends there, as when no slot is left.
    assert result.exhausted and set(result.waiting) == set()
    explained = plan([Ask(i, memory_mb=8192) for i in range(1, 5)], [node], explain=True)
    assert explained.waiting[3].code == "no_capacity" and explained.waiting[3].details["lacking"] == ["memory"]


def test_a_node_with_less_left_than_any_job_reserves_ends_the_pass():
    # Free slots, but less memory (or CPU) left than the least a job may reserve: full.
    assert plan([Ask(1, memory_mb=4)], [sized("a", 3)]).exhausted
    assert plan([Ask(1, cpu_percent=1)], [sized("a", 1000, cpu=0)]).exhausted
    # With room for the smallest job the jobs are offered, and one that fits is placed
    # past one that does not.
    result = plan([Ask(1, memory_mb=500), Ask(2, memory_mb=4)], [sized("a", 1000, reserved_memory_mb=900)])
    assert pairs(result) == [(2, "a")] and result.waiting[1].details["lacking"] == ["memory"]
    # A node whose default for a type is below the API's least counts that default.
    tiny = NodeInfo("a", 8, max_memory_mb=2, max_cpu_percent=100, default_limits={"run": (1, 1)})
    assert pairs(plan([Ask(1)], [tiny])) == [(1, "a")]


def test_a_job_without_limits_reserves_the_node_s_default_for_its_type():
    node = sized("a", 350, cpu=10_000)  # room for three run jobs (100 MB) or one service (200) and one run
    assert len(plan([Ask(i) for i in range(5)], [node]).placed) == 3
    result = plan([Ask(1, job_type="service"), Ask(2), Ask(3)], [node])
    assert pairs(result) == [(1, "a"), (2, "a")] and [p.memory_mb for p in result.placed] == [200, 100]


def test_the_system_reserve_and_the_jobs_held_count_against_allocatable():
    node = sized("a", 1000, reserve_memory_mb=300, reserved_memory_mb=500)  # 200 MB left
    result = plan([Ask(1, memory_mb=200), Ask(2, memory_mb=4)], [node], explain=True)
    assert pairs(result) == [(1, "a")]
    assert result.waiting[2].details["lacking"] == ["memory"]


def test_cpu_is_reserved_too():
    result = plan([Ask(1, cpu_percent=150), Ask(2, cpu_percent=100)], [sized("a", 10_000, cpu=200)])
    assert pairs(result) == [(1, "a")] and result.waiting[2].details["lacking"] == ["cpu"]


def test_an_exact_fit_is_allowed_and_one_more_megabyte_is_not():
    assert len(plan([Ask(1, memory_mb=1000)], [sized("a", 1000)]).placed) == 1
    assert len(plan([Ask(1, memory_mb=999), Ask(2, memory_mb=2)], [sized("a", 1000)]).placed) == 1


def test_a_node_with_unknown_capacity_is_not_counted():
    result = plan([Ask(i, memory_mb=8192) for i in range(3)], [NodeInfo("a", 3)])
    assert len(result.placed) == 3


def test_the_fallback_limits_count_for_a_node_without_defaults():
    node = NodeInfo("a", 8, max_memory_mb=1000, max_cpu_percent=10_000)
    assert len(plan([Ask(i) for i in range(5)], [node], fallback={"run": (512, 100)}).placed) == 1


# ---- policies ----------------------------------------------------------------------------------

def test_binpack_fills_the_fullest_node_that_fits():
    nodes = [sized("a", 4000), sized("b", 3000), sized("c", 1000)]
    result = plan([Ask(1, memory_mb=1000), Ask(2, memory_mb=1500), Ask(3, memory_mb=1500), Ask(4, memory_mb=500)],
                  nodes, policy="binpack")
    # 1 fits c exactly (0 left); 2 goes to b (1500 left) rather than a; 3 to b (0 left); 4 to a.
    assert pairs(result) == [(1, "c"), (2, "b"), (3, "b"), (4, "a")]


def test_binpack_breaks_memory_ties_by_the_least_free_cpu():
    nodes = [sized("a", 1000, cpu=400), sized("b", 1000, cpu=200)]
    assert pairs(plan([Ask(1, memory_mb=100, cpu_percent=100)], nodes, policy="binpack")) == [(1, "b")]


def test_spread_takes_the_node_with_the_most_free_memory():
    nodes = [sized("a", 4000), sized("b", 3000), sized("c", 1000)]
    result = plan([Ask(i, memory_mb=1000) for i in range(1, 6)], nodes, policy="spread")
    # 1: a (3,000 left against b's 3,000); then a and b alike, the tie to the higher id.
    assert pairs(result) == [(1, "a"), (2, "b"), (3, "a"), (4, "b"), (5, "a")]


def test_binpack_and_spread_skip_nodes_without_a_slot_or_cpu():
    nodes = [sized("a", 500, free=0), sized("b", 600, cpu=50), sized("c", 5000)]
    assert pairs(plan([Ask(1, memory_mb=400, cpu_percent=100)], nodes, policy="binpack")) == [(1, "c")]
    nodes = [sized("a", 9000, free=0), sized("b", 8000, cpu=50), sized("c", 5000)]
    assert pairs(plan([Ask(1, memory_mb=400, cpu_percent=100)], nodes, policy="spread")) == [(1, "c")]


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError):
        Planner([], "random")


# ---- throttles ----------------------------------------------------------------------------------

def test_an_array_never_has_more_than_parallel_placed_or_running():
    throttles = {("array", 7): Throttle(limit=2, active=1)}
    result = plan([Ask(i, array_id=7) for i in range(1, 4)] + [Ask(9)], slots(a=8), throttles=throttles)
    assert pairs(result) == [(1, "a"), (9, "a")]
    assert result.waiting[2].code == "array_throttle"
    assert result.waiting[2].details == {"array_id": "array-7", "parallel": 2, "active": 2}


def test_a_concurrency_key_limits_across_nodes():
    throttles = {("key", "migrations"): Throttle(limit=1, active=0)}
    result = plan([Ask(1, concurrency_key="migrations"), Ask(2, concurrency_key="migrations"),
                   Ask(3, concurrency_key="other")], slots(a=4, b=4), throttles=throttles)
    assert pairs(result) == [(1, "a"), (3, "b")]
    assert result.waiting[2].code == "concurrency_limit"
    assert result.waiting[2].details == {"key": "migrations", "limit": 1, "active": 1}


# ---- order and aging ------------------------------------------------------------------------------

def test_queue_order_is_priority_with_aging():
    aging = 60.0
    urgent_late = queue_at(1000.0, 100, aging)
    normal_early = queue_at(0.0, 50, aging)
    assert urgent_late < normal_early  # 50 points buy 3,000 s of head start
    # A job of priority 0 is overtaken only by priority-100 jobs that came within 6,000 s of it.
    low = queue_at(0.0, 0, aging)
    assert queue_at(5999.0, 100, aging) < low < queue_at(6001.0, 100, aging)


# ---- why it waits ----------------------------------------------------------------------------------

def test_a_node_filled_by_a_default_service_says_so():
    """A service that asks for no cpu_percent reserves the node's default (200%): on a
    2-CPU node one such service leaves no CPU to anything else, slots or not."""
    full = NodeInfo("n1", 1, max_memory_mb=4096, max_cpu_percent=200, reserved_memory_mb=1024,
                    reserved_cpu_percent=200, default_limits={"run": (512, 100), "service": (1024, 200)})
    result = plan([Ask(1)], [full], explain=True)
    reason = result.waiting[1]
    assert reason.code == "no_capacity" and reason.details["lacking"] == ["cpu"]
    assert reason.message == ("no room on the 1 node it may go to (short of free CPU: a service job that asks "
                              "for no cpu_percent reserves 200% there, all the node allows)")
    assert shortfalls(Ask(1), [full])[0]["lacks"] == [
        "needs 100% CPU, 0% unreserved (its jobs reserve 200% of 200%; a service job that asks for no "
        "cpu_percent reserves 200% here, all the node allows)"]
    # CPU taken by jobs that asked for it: nothing about services.
    busy = NodeInfo("n2", 1, max_memory_mb=4096, max_cpu_percent=400, reserved_cpu_percent=400,
                    default_limits={"run": (512, 100), "service": (1024, 200)})
    assert plan([Ask(1)], [busy], explain=True).waiting[1].message == \
        "no room on the 1 node it may go to (short of free CPU)"


def test_shortfalls_lists_the_closest_nodes_first_with_what_each_lacks():
    nodes = [sized("a", 1000, labels={"zone": "b"}), sized("b", 100, labels={"zone": "a"}),
             NodeInfo("c", 0, status="unhealthy", drained=True, labels={})]
    found = shortfalls(Ask(1, memory_mb=500, constraints=(("zone", "=", "a"),)), nodes)
    assert [f["node_id"] for f in found] == ["a", "b", "c"]
    assert found[0]["lacks"] == ["zone = a (the node has zone=b)"]
    assert found[1]["lacks"] == ["memory_mb 500 is over the node's maximum 100",
                                 "needs 500 MB of memory, 100 MB unreserved"]
    assert "the node is unhealthy" in found[2]["lacks"] and "no free slot" in found[2]["lacks"]
