from corral.scheduler.placement import NodeSlots, Unplaced, fits, next_node, plan


def nodes(**free):
    return [NodeSlots(node_id, n) for node_id, n in free.items()]


def test_round_robin_alternates_between_nodes():
    assignments, cursor = plan([Unplaced(i) for i in range(1, 5)], nodes(a=2, b=2), None)
    assert assignments == [(1, "a"), (2, "b"), (3, "a"), (4, "b")]
    assert cursor == "b"


def test_round_robin_resumes_after_the_cursor():
    assignments, cursor = plan([Unplaced(1)], nodes(a=1, b=1, c=1), "a")
    assert assignments == [(1, "b")]
    assert cursor == "b"


def test_cursor_of_a_vanished_node_resumes_at_the_next_one():
    assert next_node(["a", "c"], {"a": 1, "c": 1}, "b") == "c"
    assert next_node(["a", "c"], {"a": 1, "c": 1}, "d") == "a"


def test_full_nodes_are_skipped_and_leftover_jobs_wait():
    assignments, _ = plan([Unplaced(i) for i in range(1, 5)], nodes(a=0, b=1, c=1), None)
    assert assignments == [(1, "b"), (2, "c")]


def test_no_nodes_places_nothing():
    assert plan([Unplaced(1)], [], "a") == ([], "a")


def test_negative_free_counts_as_full():
    # A node that holds more than its capacity (the limit was lowered) takes nothing.
    assert plan([Unplaced(1)], nodes(a=-2), None) == ([], None)


def test_pinned_job_goes_only_to_its_node_and_keeps_the_cursor():
    assignments, cursor = plan([Unplaced(1, "b"), Unplaced(2)], nodes(a=1, b=1), None)
    assert assignments == [(1, "b"), (2, "a")]
    assert cursor == "a"


def test_pinned_job_waits_when_its_node_is_full_or_unknown():
    assignments, _ = plan([Unplaced(1, "b"), Unplaced(2, "zz"), Unplaced(3)], nodes(a=1, b=0), None)
    assert assignments == [(3, "a")]


def test_jobs_go_only_to_nodes_that_allow_their_limits():
    small = NodeSlots("a", 2, max_memory_mb=512, max_cpu_percent=100)
    big = NodeSlots("b", 2, max_memory_mb=4096, max_cpu_percent=400)
    unknown = NodeSlots("c", 2)
    assert fits(Unplaced(1, memory_mb=512, cpu_percent=100), small)
    assert not fits(Unplaced(1, memory_mb=513), small)
    assert not fits(Unplaced(1, cpu_percent=200), small)
    assert fits(Unplaced(1, memory_mb=10**6), unknown)
    jobs = [Unplaced(1, memory_mb=2048), Unplaced(2, memory_mb=2048), Unplaced(3), Unplaced(4, memory_mb=8192)]
    assignments, _ = plan(jobs, [small, big], None)
    assert assignments == [(1, "b"), (2, "b"), (3, "a")]


def test_a_pinned_job_waits_when_its_node_does_not_allow_its_limits():
    assert plan([Unplaced(1, "a", cpu_percent=800)], [NodeSlots("a", 1, max_cpu_percent=400)], None)[0] == []
