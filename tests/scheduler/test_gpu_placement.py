"""GPUs and other countable resources in the pure placement pass: which node, which
devices, the policies counting them, why a job waits, and preemption freeing GPUs."""
import pytest

from corral.scheduler import preemption, quotas
from corral.scheduler.placement import Ask, Gpu, NodeInfo, Planner, cluster_capacity, shortfalls

A100 = "NVIDIA A100-SXM4-80GB"
T4 = "Tesla T4"
LIMITS = {"run": (100, 100), "service": (200, 200)}


def gpus(prefix, count, model=A100, memory=81920):
    return tuple(Gpu(f"GPU-{prefix}{i}", model, memory) for i in range(count))


def node(node_id, devices=(), held=None, free=8, resources=None, resources_held=None, **kw):
    return NodeInfo(node_id, free, max_memory_mb=64_000, max_cpu_percent=6400, default_limits=LIMITS,
                    gpus=tuple(devices), gpus_held=held or {}, resources=resources or {},
                    resources_held=resources_held or {}, **kw)


def plan(asks, nodes, policy="round-robin", ledger=None):
    planner = Planner(nodes, policy, ledger=ledger)
    planner.offer(asks)
    return planner.plan()


def placed(result):
    return {p.job_id: (p.node_id, p.gpus) for p in result.placed}


def test_a_gpu_job_gets_free_devices_of_its_node_and_never_one_held():
    a = node("a", gpus("a", 2), held={"GPU-a0": 99})
    result = plan([Ask(1, gpus=1), Ask(2, gpus=1)], [a])
    assert placed(result) == {1: ("a", ("GPU-a1",))}
    assert result.waiting[2].code == "no_capacity" and result.waiting[2].details["lacking"] == ["gpus"]
    assert "free GPUs" in result.waiting[2].message


def test_two_one_gpu_jobs_on_a_one_gpu_node_go_one_at_a_time():
    result = plan([Ask(1, gpus=1), Ask(2, gpus=1)], [node("a", gpus("a", 1))])
    assert placed(result) == {1: ("a", ("GPU-a0",))}
    assert 2 in result.waiting


def test_a_job_without_gpus_takes_none_and_a_node_without_gpus_takes_no_gpu_job():
    result = plan([Ask(1, gpus=2), Ask(2)], [node("cpu"), node("gpu", gpus("g", 2))])
    assert placed(result)[1] == ("gpu", ("GPU-g0", "GPU-g1"))
    assert placed(result)[2][1] == ()


def test_gpu_model_matches_part_of_the_name_ignoring_case_and_memory_is_a_minimum():
    mixed = node("m", gpus("t", 2, T4, 15360) + gpus("a", 1, A100, 81920))
    result = plan([Ask(1, gpus=1, gpu_model="a100"), Ask(2, gpus=2, gpu_memory_mb=16000),
                   Ask(3, gpus=2, gpu_model="t4")], [mixed])
    assert placed(result)[1] == ("m", ("GPU-a0",))
    assert placed(result)[3] == ("m", ("GPU-t0", "GPU-t1"))
    # Only one device has 16 GB or more: no node has two such, free or not.
    assert result.waiting[2].details["lacking"] == ["gpus"]
    assert "none of the 1 node it may go to has 2 GPUs (16000 MB each)" in result.waiting[2].message


def test_the_smallest_devices_that_fit_are_taken_first_leaving_the_large_ones():
    mig = node("m", (Gpu("MIG-big", A100 + " MIG 3g.40gb", 40960), Gpu("MIG-small", A100 + " MIG 1g.10gb", 10240)))
    result = plan([Ask(1, gpus=1), Ask(2, gpus=1, gpu_memory_mb=20000)], [mig])
    assert placed(result) == {1: ("m", ("MIG-small",)), 2: ("m", ("MIG-big",))}


@pytest.mark.parametrize("policy, expected", [("binpack", "b"), ("spread", "a")])
def test_binpack_fills_the_node_with_fewest_free_gpus_spread_the_one_with_most(policy, expected):
    # a: 4 free GPUs; b: 2 free (2 held). Memory and CPU alike.
    nodes = [node("a", gpus("a", 4)), node("b", gpus("b", 4), held={"GPU-b0": 7, "GPU-b1": 8})]
    assert placed(plan([Ask(1, gpus=1)], nodes, policy))[1][0] == expected


@pytest.mark.parametrize("policy", ["round-robin", "binpack", "spread"])
def test_every_policy_places_gpu_jobs_until_the_devices_run_out(policy):
    nodes = [node("a", gpus("a", 2)), node("b", gpus("b", 1))]
    result = plan([Ask(i, gpus=1) for i in range(1, 5)], nodes, policy)
    taken = [uuid for _, devices in placed(result).values() for uuid in devices]
    assert sorted(taken) == ["GPU-a0", "GPU-a1", "GPU-b0"] and len(set(taken)) == 3
    assert list(result.waiting) == [4]


def test_declared_resources_are_reserved_like_memory():
    fpga = node("f", resources={"fpga": 2}, resources_held={"fpga": 1})
    result = plan([Ask(1, resources=(("fpga", 1),)), Ask(2, resources=(("fpga", 1),)),
                   Ask(3, resources=(("fpga", 3),)), Ask(4, resources=(("tpu", 1),))], [fpga, node("plain")])
    assert placed(result) == {1: ("f", ())}
    assert result.waiting[2].details["lacking"] == ["resources"]
    assert "none of the 2 nodes it may go to has 3 fpga" in result.waiting[3].message
    assert "1 tpu" in result.waiting[4].message


def test_why_names_what_each_node_lacks_of_gpus():
    ask = Ask(1, gpus=2, gpu_model="a100")
    near = shortfalls(ask, [node("busy", gpus("b", 2), held={"GPU-b0": 5}), node("t4", gpus("t", 4, T4))], LIMITS)
    by_node = {entry["node_id"]: entry["lacks"] for entry in near}
    assert by_node["busy"] == ["needs 2 free GPUs, 1 free"]
    assert by_node["t4"] == ["2 GPUs (model a100) (the node has 4 GPUs (Tesla T4))"]


def test_quotas_and_capacity_count_gpus():
    nodes = [node("a", gpus("a", 4)), node("b")]
    assert cluster_capacity(nodes)["gpus"] == 4
    quota = quotas.Quota(guaranteed={"gpus": 1}, borrowing_limit={"gpus": 0})
    ledger = quotas.Ledger({"ml": quota}, {}, cluster_capacity(nodes))
    result = plan([Ask(1, gpus=1, team="ml"), Ask(2, gpus=1, team="ml"), Ask(3, team="ml")], nodes, ledger=ledger)
    assert set(placed(result)) == {1, 3}
    assert result.waiting[2].code == "quota" and result.waiting[2].details["resource"] == "gpus"


def test_preemption_stops_a_borrowing_gpu_job_for_a_team_owed_gpus_and_only_then():
    nodes = [node("a", gpus("a", 1), held={"GPU-a0": 10})]
    running = [preemption.Running(10, "a", "other", 50, 100.0, 100, 100, gpus=("GPU-a0",))]
    quota = {"ml": quotas.Quota(guaranteed={"gpus": 1}), "other": quotas.Quota(guaranteed={"gpus": 0})}
    usage = {"other": dict.fromkeys(quotas.RESOURCES, 0) | {"gpus": 1, "cpu_percent": 100, "memory_mb": 100,
                                                           "jobs": 1}}
    ledger = quotas.Ledger(quota, usage, cluster_capacity(nodes))
    found = preemption.plan([Ask(1, gpus=1, team="ml")], nodes, running, ledger, LIMITS)
    assert [(p.for_job, p.victims) for p in found] == [(1, (10,))]
    # Room for memory and CPU is not room for a GPU: a job asking none preempts nothing here.
    ledger = quotas.Ledger(quota, usage, cluster_capacity(nodes))
    assert preemption.plan([Ask(2, team="ml")], nodes, running, ledger, LIMITS) == []


# ---- gangs: a job of several nodes at once, all or none --------------------------------------

def members(result, job_id):
    return sorted((p.rank, p.node_id, p.gpus) for p in result.placed if p.job_id == job_id)


@pytest.mark.parametrize("policy", ["round-robin", "binpack", "spread"])
def test_a_gang_gets_distinct_nodes_each_with_its_gpus_or_nothing(policy):
    nodes = [node("a", gpus("a", 2)), node("b", gpus("b", 2)), node("c", gpus("c", 1))]
    result = plan([Ask(1, gpus=2, members=2), Ask(2, gpus=1, members=2)], nodes, policy)
    placed = members(result, 1)
    assert [rank for rank, _, _ in placed] == [0, 1]
    assert {n for _, n, _ in placed} == {"a", "b"} and all(len(g) == 2 for _, _, g in placed)
    # Only c has a GPU left: the second gang takes nothing at all, and says why.
    assert members(result, 2) == []
    reason = result.waiting[2]
    assert reason.code == "gang" and (reason.details["members"], reason.details["free"]) == (2, 1)
    assert "it needs 2 nodes at once; 1 of the 3 nodes it may go to has room now" == reason.message


def test_a_gang_larger_than_the_cluster_waits_and_says_so():
    result = plan([Ask(1, members=4)], [node("a"), node("b")])
    assert result.placed == [] and result.waiting[1].details == {"nodes": 2, "members": 4, "free": 2}


def test_a_waiting_gang_that_may_hold_keeps_the_nodes_it_found_from_later_jobs():
    nodes = [node("a", free=1), node("b", free=1), node("c", free=0)]
    result = plan([Ask(1, members=3, may_hold=True), Ask(2), Ask(3)], nodes)
    assert result.held == {"a": 1, "b": 1}
    assert result.placed == [] and result.exhausted  # the later jobs wait for capacity
    # Without the right to hold, the small jobs take the nodes.
    result = plan([Ask(1, members=3), Ask(2), Ask(3)], nodes)
    assert result.held == {} and {p.job_id for p in result.placed} == {2, 3}


def test_only_the_first_gang_of_a_pass_holds():
    nodes = [node("a", free=1), node("b", free=1), node("c", free=1), node("d", free=1, labels={"pool": "x"})]
    result = plan([Ask(1, members=4, pool="default", may_hold=True), Ask(2, members=2, may_hold=True), Ask(3)],
                  nodes)
    assert result.held == {"a": 1, "b": 1, "c": 1}
    assert result.waiting[2].code == "gang" and [(p.job_id, p.node_id) for p in result.placed] == [(3, "d")]


def test_a_gang_counts_every_member_against_its_teams_quota():
    nodes = [node("a", gpus("a", 1)), node("b", gpus("b", 1))]
    quota = quotas.Quota(guaranteed={"gpus": 1}, borrowing_limit={"gpus": 0})
    ledger = quotas.Ledger({"ml": quota}, {}, cluster_capacity(nodes))
    result = plan([Ask(1, gpus=1, members=2, team="ml")], nodes, ledger=ledger)
    assert result.placed == [] and result.waiting[1].code == "quota"
