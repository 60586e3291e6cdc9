"""Quota arithmetic (quotas.py) and placement within quotas (placement.Planner with a
Ledger): pure, no database."""
import pytest

from corral.scheduler import placement, quotas
from corral.scheduler.placement import Ask, NodeInfo, Planner
from corral.scheduler.quotas import Ledger, Quota


def q(guaranteed=None, borrowing=None, lending=None):
    return Quota(guaranteed or {}, borrowing or {}, lending or {})


def job(cpu=100, memory=100):
    return quotas.need_of(memory, cpu)


CAPACITY = {"cpu_percent": 1000, "memory_mb": 10_000, "gpus": 0, "jobs": 10}


# ---- the arithmetic ------------------------------------------------------------------

def test_without_quotas_nothing_is_refused():
    ledger = Ledger({}, {"a": {"cpu_percent": 900, "jobs": 9}}, CAPACITY)
    assert ledger.refuses("a", job()) is None
    assert ledger.refuses("b", job(cpu=5000)) is None  # the nodes' room is placement's, not the quotas'


def test_a_team_may_use_its_guarantee_plus_its_borrowing_limit_and_no_more():
    ledger = Ledger({"a": q({"cpu_percent": 300}, {"cpu_percent": 200})}, {}, CAPACITY)
    for _ in range(5):
        assert ledger.refuses("a", job()) is None
        ledger.take("a", job())
    refusal = ledger.refuses("a", job())
    assert refusal == quotas.Refusal("a", "cpu_percent", 500, 100, 300, 500)
    assert ledger.refuses("b", job()) is None  # another team is not held by a's cap


def test_a_borrowing_limit_of_zero_keeps_a_team_within_its_guarantee_per_resource():
    ledger = Ledger({"a": q({"jobs": 2}, {"jobs": 0})}, {"a": {"jobs": 2, "cpu_percent": 200}}, CAPACITY)
    refusal = ledger.refuses("a", job())
    assert (refusal.resource, refusal.used, refusal.cap) == ("jobs", 2, 2)


def test_borrowing_leaves_free_what_other_teams_keep_of_their_guarantees():
    # b is guaranteed 600% and lends only 200% of it: 400% is kept for b while b does not use it.
    ledger = Ledger({"b": q({"cpu_percent": 600}, lending={"cpu_percent": 200})}, {}, CAPACITY)
    for _ in range(6):  # a has no quota: it borrows, down to what b keeps
        assert ledger.refuses("a", job()) is None
        ledger.take("a", job())
    refusal = ledger.refuses("a", job())
    assert refusal.keepers == ("b",) and (refusal.kept, refusal.free) == (400, 400)
    # b uses its own guarantee; what it uses is no longer kept free for it.
    ledger.take("b", job(cpu=200))
    assert ledger.refuses("a", job()).kept == 200
    ledger.take("b", job(cpu=200))
    assert ledger.refuses("a", job()) is None  # nothing is kept now (the nodes' room is placement's)
    # b within its guarantee is never held back by the quotas.
    assert ledger.refuses("b", job(cpu=200)) is None


def test_a_team_that_lends_all_of_its_guarantee_keeps_nothing_back():
    ledger = Ledger({"b": q({"cpu_percent": 600})}, {"a": {"cpu_percent": 1000}}, CAPACITY)
    assert ledger.refuses("c", job()) is None  # the nodes are full; that is placement's to say


def test_a_resource_the_nodes_do_not_count_is_not_checked_for_borrowing():
    ledger = Ledger({"b": q({"memory_mb": 5000}, lending={"memory_mb": 0})}, {},
                    dict(CAPACITY, memory_mb=None))
    assert ledger.refuses("a", job(memory=9000)) is None


def test_a_lending_limit_over_the_guarantee_is_refused_and_parts_round_trip():
    assert quotas.check(q({"cpu_percent": 100}, lending={"cpu_percent": 200})).startswith(
        "lending_limit.cpu_percent 200 is over guaranteed.cpu_percent 100")
    assert quotas.check(q({"cpu_percent": 100}, {"jobs": 3}, {"cpu_percent": 100})) is None
    quota = q({"cpu_percent": 100, "jobs": 2}, {"jobs": 3}, {"cpu_percent": 50})
    assert Quota.from_dict(quota.as_dict()) == quota
    assert quotas.borrowed(quota, {"cpu_percent": 300, "jobs": 1}) == {
        "cpu_percent": 200, "memory_mb": 0, "gpus": 0, "jobs": 0}


def test_capacity_is_not_counted_where_a_node_does_not_advertise_it():
    assert quotas.capacity_of([(1000, 200, 4, 0), (2000, 400, 2, 8)]) == {
        "cpu_percent": 600, "memory_mb": 3000, "gpus": 8, "jobs": 6}
    assert quotas.capacity_of([(1000, None, 4, 0), (2000, 400, 2, 0)])["cpu_percent"] is None


# ---- placement within quotas -----------------------------------------------------------

def nodes(n=2, slots=4):
    return [NodeInfo(f"n{i}", slots, max_memory_mb=4000, max_cpu_percent=400) for i in range(1, n + 1)]


def asks(team, count, start=1, cpu=100):
    return [Ask(i, cpu_percent=cpu, memory_mb=100, team=team) for i in range(start, start + count)]


def test_placement_stops_a_team_at_its_cap_and_places_the_others_jobs_behind_it():
    infos = nodes()
    ledger = Ledger({"a": q({"jobs": 2}, {"jobs": 1})}, {}, placement.cluster_capacity(infos))
    planner = Planner(infos, "binpack", fallback={}, ledger=ledger)
    planner.offer(asks("a", 5) + asks("b", 3, start=10))
    plan = planner.plan()
    assert sorted(p.job_id for p in plan.placed) == [1, 2, 3, 10, 11, 12]
    assert set(plan.waiting) == {4, 5}
    reason = plan.waiting[4]
    assert reason.code == "quota" and reason.details["team"] == "a" and reason.details["resource"] == "jobs"
    assert reason.message == ("team a uses 3 running jobs and the job needs 1 running jobs: over its guarantee "
                              "of 2 running jobs plus borrowing limit of 1 running jobs")


def test_placement_counts_what_a_job_reserves_on_its_node_when_it_asks_nothing():
    infos = [NodeInfo("n1", 8, max_memory_mb=4000, max_cpu_percent=800,
                      default_limits={"run": (512, 100)})]
    ledger = Ledger({"a": q({"memory_mb": 1024}, {"memory_mb": 0})}, {}, placement.cluster_capacity(infos))
    planner = Planner(infos, "binpack", fallback={}, ledger=ledger)
    planner.offer([Ask(i, team="a") for i in range(1, 5)])
    assert [p.job_id for p in planner.plan().placed] == [1, 2]
    assert planner.plan().waiting[3].details["resource"] == "memory_mb"


def test_a_teams_jobs_wait_for_what_another_team_keeps_and_that_team_places_its_own():
    infos = nodes(2, slots=4)  # 8 slots, 800% CPU
    ledger = Ledger({"b": q({"jobs": 4}, lending={"jobs": 0})}, {}, placement.cluster_capacity(infos))
    planner = Planner(infos, "spread", fallback={}, ledger=ledger)
    planner.offer(asks("a", 6) + asks("b", 4, start=10))
    plan = planner.plan()
    assert sorted(p.job_id for p in plan.placed) == [1, 2, 3, 4, 10, 11, 12, 13]
    assert plan.waiting[5].details["kept_by"] == ["b"]


def test_a_job_that_may_not_borrow_turned_away_leaves_its_teams_borrowing_jobs_placed():
    """Refusals are kept for the rest of the pass, but a job that is not preemptible is
    refused where its team's preemptible jobs of the same shape may still borrow."""
    infos = nodes(2, slots=4)
    ledger = Ledger({"a": q({"jobs": 2})}, {}, placement.cluster_capacity(infos))
    planner = Planner(infos, "binpack", fallback={}, ledger=ledger)
    firm = [Ask(i, cpu_percent=100, memory_mb=100, team="a", preemptible=False) for i in (3, 4)]
    planner.offer(asks("a", 2) + firm + asks("a", 2, start=5))
    plan = planner.plan()
    assert sorted(p.job_id for p in plan.placed) == [1, 2, 5, 6]
    assert plan.waiting[3].details["resource"] == "jobs" and set(plan.waiting) == {3, 4}


def test_a_team_refused_a_running_job_waits_in_every_shape_and_the_others_go_on():
    """Every job counts one running job: a team refused one is refused for all its jobs,
    whatever they ask, and the pass goes on placing the other teams'."""
    infos = nodes(2, slots=4)
    ledger = Ledger({"a": q({"jobs": 1}, {"jobs": 1})}, {}, placement.cluster_capacity(infos))
    planner = Planner(infos, "binpack", fallback={}, ledger=ledger)
    odd = [Ask(10 + i, cpu_percent=10 * i, memory_mb=100, team="a") for i in range(1, 4)]
    planner.offer(asks("a", 2) + odd + asks("b", 2, start=20))
    plan = planner.plan()
    assert sorted(p.job_id for p in plan.placed) == [1, 2, 20, 21]
    assert {plan.waiting[j].details["resource"] for j in (11, 12, 13)} == {"jobs"}


def test_placement_with_a_ledger_and_no_quota_refuses_nothing():
    infos = nodes()
    planner = Planner(infos, "round-robin", fallback={},
                      ledger=Ledger({"x": q({"jobs": 1})}, {}, placement.cluster_capacity(infos)))
    planner.offer(asks("a", 8))
    assert len(planner.plan().placed) == 8


@pytest.mark.parametrize("held", [0, 3])
def test_cluster_capacity_counts_what_jobs_hold_on_nodes_that_take_no_work(held):
    working = NodeInfo("n1", 2, max_memory_mb=1000, max_cpu_percent=200, held=2)
    drained = NodeInfo("n2", 0, drained=True, max_memory_mb=1000, max_cpu_percent=200, held=held,
                       reserved_memory_mb=100 * held, reserved_cpu_percent=50 * held)
    assert placement.cluster_capacity([working, drained]) == {
        "cpu_percent": 200 + 50 * held, "memory_mb": 1000 + 100 * held, "gpus": 0, "jobs": 4 + held}
