"""Multi-node jobs through the scheduler's API, on each database: a job of `nodes: N` is
placed on N distinct nodes at once or not at all, its members are jobs its agents claim
and report, it runs when every member runs and is done when all are; a member's failure
ends the others and the job retries as one; cancel ends all; members are not cancelled
or retried on their own."""
import pytest

from scheduler_app import submit
from corral.scheduler.service import Scheduler

ADDRESSES = {f"n{i}": f"10.0.0.{i}" for i in range(1, 7)}


def nodes(store, clock, *names, slots=4):
    store.nodes.sync_nodes([{"node_id": name, "address": ADDRESSES[name], "kind": "compute", "slots": slots,
                             "status": "healthy"} for name in names], clock())
    place(store, clock)


def place(store, clock):
    """The background pass: place, then keep the reasons of the jobs that wait."""
    Scheduler(store).place(clock())
    store.placing.explain(clock())


def get(client, job_id):
    answer = client.get(f"/jobs/{job_id}")
    assert answer.status_code == 200, answer.json
    return answer.json


def members(client, job_id, attempt=None):
    listed = get(client, job_id)["members"]
    attempt = attempt or get(client, job_id)["attempt"]
    return [m for m in listed if m["attempt"] == attempt]


def report(client, member, status, exit_code=None, **extra):
    job = get(client, member["job_id"])
    body = {"node_id": job["node_id"], "attempt": job["attempt"], "status": status, **extra}
    if exit_code is not None:
        body["exit_code"] = exit_code
    answer = client.post(f"/jobs/{member['job_id']}/status", json=body)
    assert answer.status_code == 200, answer.json
    return answer


def test_a_gang_is_placed_on_distinct_nodes_and_each_member_knows_its_place(client, store, clock):
    nodes(store, clock, "n1", "n2", "n3", "n4")
    job = submit(client, command="train", nodes=3, memory_mb=256, env_vars={"EPOCHS": "2"})
    place(store, clock)
    found = get(client, job["job_id"])
    assert found["nodes"] == 3 and found["status"] == "pending" and found["node_id"] is None
    assert found["attempt"] == 1
    assert found["pending_reason"]["code"] == "placed", found["pending_reason"]
    listed = found["members"]
    assert [m["rank"] for m in listed] == [0, 1, 2]
    assert len({m["node_id"] for m in listed}) == 3 and all(m["status"] == "pending" for m in listed)

    hosts = [ADDRESSES[m["node_id"]] for m in listed]
    for rank, member in enumerate(listed):
        own = get(client, member["job_id"])
        assert own["command"] == "train" and own["env_vars"] == {"EPOCHS": "2"} and own["memory_mb"] == 256
        assert own["gang"] == {"gang_id": job["job_id"], "size": 3, "rank": rank, "hosts": hosts,
                               "master_addr": hosts[0], "master_port": 29500}
        # The claim carries the place to the member's agent.
        claimed = client.post(f"/nodes/{member['node_id']}/claim", json={"max": 8}).json
        assert [c["gang"] for c in claimed if c["job_id"] == member["job_id"]] == [own["gang"]]


def test_the_job_runs_when_every_member_runs_and_is_done_when_every_member_is(client, store, clock):
    nodes(store, clock, "n1", "n2", "n3")
    job = submit(client, command="train", nodes=3)
    place(store, clock)
    listed = members(client, job["job_id"])
    for member in listed[:2]:
        report(client, member, "running")
    assert get(client, job["job_id"])["status"] == "pending"  # one member not yet started
    report(client, listed[2], "running")
    assert get(client, job["job_id"])["status"] == "running"

    clock.now += 30
    report(client, listed[1], "done", 0, stdout="rank 1 out")
    report(client, listed[0], "done", 0, stdout="rank 0 out")
    assert get(client, job["job_id"])["status"] == "running"
    report(client, listed[2], "done", 0)
    ended = get(client, job["job_id"])
    assert ended["status"] == "done" and ended["exit_code"] == 0 and ended["stdout"] == "rank 0 out"
    assert [m["status"] for m in ended["members"]] == ["done"] * 3
    assert ended["members"][1]["stdout_tail"] == "rank 1 out"


def test_a_failing_member_ends_the_others_and_the_job_retries_as_one(client, store, clock):
    nodes(store, clock, "n1", "n2", "n3")
    job = submit(client, command="train", nodes=3, max_retries=1)
    place(store, clock)
    first = members(client, job["job_id"])
    for member in first:
        report(client, member, "running")
    clock.now += 5
    report(client, first[1], "failed", 3, stderr="rank 1 crashed")

    again = get(client, job["job_id"])
    assert again["status"] == "pending" and again["retry_count"] == 1
    assert {m["rank"]: m["status"] for m in again["members"]} == {0: "cancelled", 1: "failed", 2: "cancelled"}
    for member in (first[0], first[2]):
        assert get(client, member["job_id"])["ended_by"] == "cancel"  # stopped with its kill signal and grace
    # Its agent is told to stop a cancelled member: a report of it is refused from then on.
    late = client.post(f"/jobs/{first[0]['job_id']}/status",
                       json={"node_id": first[0]["node_id"], "attempt": 1, "status": "done", "exit_code": 0})
    assert late.status_code == 409

    place(store, clock)  # the retry: new members, the next attempt
    second = members(client, job["job_id"], attempt=2)
    assert len(second) == 3 and {m["job_id"] for m in second}.isdisjoint({m["job_id"] for m in first})
    for member in second:
        report(client, member, "running")
    report(client, second[0], "failed", 1)
    final = get(client, job["job_id"])
    assert final["status"] == "failed" and final["exit_code"] == 1
    assert len(final["members"]) == 6
    assert [m["status"] for m in members(client, job["job_id"], attempt=2)] == ["failed", "cancelled", "cancelled"]


def test_a_member_placed_on_a_lost_node_requeues_the_job_without_spending_a_retry(client, store, clock):
    nodes(store, clock, "n1", "n2", "n3")
    job = submit(client, command="train", nodes=2, max_retries=0)
    place(store, clock)
    placed = members(client, job["job_id"])
    lost = placed[1]["node_id"]
    store.nodes.sync_nodes([{"node_id": n, "address": ADDRESSES[n], "kind": "compute", "slots": 4,
                             "status": "unhealthy" if n == lost else "healthy"} for n in ("n1", "n2", "n3")],
                           clock())
    store.nodes.release_lost(clock())
    requeued = get(client, job["job_id"])
    assert requeued["status"] == "pending" and requeued["node_losses"] == 1 and requeued["retry_count"] == 0
    assert {m["status"] for m in requeued["members"]} == {"failed", "cancelled"}
    place(store, clock)
    again = members(client, job["job_id"], attempt=2)
    assert len(again) == 2 and lost not in {m["node_id"] for m in again}


def test_cancelling_the_job_cancels_every_member(client, store, clock):
    nodes(store, clock, "n1", "n2", "n3")
    job = submit(client, command="train", nodes=3)
    place(store, clock)
    listed = members(client, job["job_id"])
    report(client, listed[0], "running")
    assert client.post(f"/jobs/{job['job_id']}/cancel", json={}).status_code == 200
    ended = get(client, job["job_id"])
    assert ended["status"] == "cancelled"
    assert [m["status"] for m in ended["members"]] == ["cancelled"] * 3
    assert get(client, listed[0]["job_id"])["ended_by"] == "cancel"


def test_a_member_is_neither_cancelled_nor_retried_on_its_own(client, store, clock):
    nodes(store, clock, "n1", "n2")
    job = submit(client, command="train", nodes=2, max_retries=0)
    place(store, clock)
    listed = members(client, job["job_id"])
    refused = client.post(f"/jobs/{listed[0]['job_id']}/cancel", json={})
    assert refused.status_code == 409 and job["job_id"] in refused.json["error"], refused.json
    assert get(client, listed[0]["job_id"])["status"] == "pending"
    report(client, listed[0], "running")
    report(client, listed[0], "failed", 1)
    assert get(client, job["job_id"])["status"] == "failed"
    again = client.post(f"/jobs/{listed[0]['job_id']}/retry", json={})
    assert again.status_code == 409 and get(client, listed[0]["job_id"])["status"] == "failed"
    assert client.post(f"/jobs/{job['job_id']}/retry", json={}).status_code == 200  # the job itself: as one


def test_a_gang_without_enough_nodes_waits_and_says_how_many_have_room(client, store, clock):
    nodes(store, clock, "n1", "n2")
    job = submit(client, command="train", nodes=3)
    place(store, clock)
    waiting = get(client, job["job_id"])
    assert waiting["members"] == [] and waiting["node_id"] is None
    reason = waiting["pending_reason"]
    assert reason["code"] == "gang", reason
    assert "needs 3 nodes at once; 2 of the 2 nodes it may go to have room now" in reason["message"]
    why = client.get(f"/jobs/{job['job_id']}/why").json
    assert why["pending_reason"]["code"] == "gang", why


def test_a_gang_short_of_nodes_holds_those_it_has_from_later_jobs_for_a_bounded_time(app, clock):
    client, store = app.test_client(), app.extensions["corral.store"]
    nodes(store, clock, "n1", "n2", "n3", slots=1)
    busy = submit(client, command="long")
    assert busy["node_id"] is not None
    gang = submit(client, command="train", nodes=3)
    small = submit(client, command="small")
    place(store, clock)
    # The gang, first in the queue, holds the two free nodes: the small job waits.
    assert get(client, small["job_id"])["node_id"] is None
    assert get(client, gang["job_id"])["pending_reason"]["code"] == "gang"
    # Past the hold (GANG_HOLD_SECS, 600 s by default), the others may have them as long.
    clock.now += 601
    place(store, clock)
    assert get(client, small["job_id"])["node_id"] is not None
    assert get(client, gang["job_id"])["members"] == []


def test_two_gangs_led_from_one_node_get_different_ports(client, store, clock):
    nodes(store, clock, "n1", "n2", slots=4)
    first = submit(client, command="a", nodes=2)
    second = submit(client, command="b", nodes=2)
    place(store, clock)
    ports = {}
    for job in (first, second):
        lead = members(client, job["job_id"])[0]
        ports[job["job_id"]] = (lead["node_id"], get(client, lead["job_id"])["gang"]["master_port"])
    (node_a, port_a), (node_b, port_b) = ports.values()
    assert node_a == node_b and {port_a, port_b} == {29500, 29501}, ports


@pytest.mark.parametrize("body, says", [
    ({"command": "x", "nodes": 0}, "'nodes'"),
    ({"command": "x", "nodes": 257}, "'nodes'"),
    ({"command": "x", "nodes": True}, "'nodes'"),
    ({"command": "x", "nodes": "2"}, "'nodes'"),
    ({"command": "x", "job_type": "service", "port": 8080, "nodes": 2}, "nodes"),
])
def test_a_bad_nodes_field_is_refused_and_nothing_is_written(client, body, says):
    answer = client.post("/jobs", json=body)
    assert answer.status_code == 400 and says in answer.json["error"], answer.json
    assert client.get("/jobs").json == []


def test_an_array_of_multi_node_jobs_places_each_copy_as_a_gang_within_its_parallel(client, store, clock):
    nodes(store, clock, "n1", "n2", "n3", "n4", "n5", "n6")
    answer = client.post("/jobs", json={"command": "train", "nodes": 2, "array": {"count": 3, "parallel": 2}})
    assert answer.status_code == 201, answer.json
    place(store, clock)
    first = int(answer.json["first_job_id"][4:])
    copies = [get(client, f"job-{n}") for n in range(first, first + 3)]
    placed = [c for c in copies if c["members"]]
    assert len(placed) == 2 and all(c["nodes"] == 2 and len(c["members"]) == 2 for c in placed)
    waiting = next(c for c in copies if not c["members"])
    assert waiting["pending_reason"]["code"] == "array_throttle", waiting["pending_reason"]
