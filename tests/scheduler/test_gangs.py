"""control-plane/scheduler/gangs.py: a multi-node job's state from its members', its
members' places, the rendezvous port and the bounded hold, pure."""
from dataclasses import dataclass, field
from typing import Any

import pytest

from corral.scheduler import gangs, lifecycle
from corral.scheduler.retry import RetryDelay
from corral.shared import wire

NOW = 1_800_000_000.0
POLICY = lifecycle.Policy(max_node_losses=3, job_timeout_secs=3600, output_tail_bytes=8,
                          backoff=RetryDelay(2.0, 2.0, 300.0))


@dataclass(frozen=True)
class Member:
    id: int
    rank: int
    status: str = "pending"
    attempt: int = 1
    node_id: str | None = "n1"
    exit_code: int | None = None
    ended_by: str | None = None
    finished_at: float | None = None
    stdout: str | None = None
    stderr: str | None = None
    oom_killed: bool | None = None
    cpu_seconds: float | None = None
    peak_memory_bytes: int | None = None
    gang_id: int | None = 1
    job_id: str = "job-x"
    job_type: str = "run"
    retry_count: int = 0
    max_retries: int = 0
    node_losses: int = 0
    on_node_lost: str = "fail"
    running_at: float | None = None
    gang: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "gang", {"rank": self.rank})


@dataclass(frozen=True)
class Parent:
    status: str = "pending"
    attempt: int = 1
    node_id: str | None = gangs.GANG_NODE
    job_type: str = "run"
    retry_count: int = 0
    max_retries: int = 1
    node_losses: int = 0
    on_node_lost: str = "requeue"
    running_at: float | None = None
    job_id: str = "job-1"


def three(*statuses, attempt=1, **kw):
    return [Member(id=10 + rank, rank=rank, status=status, attempt=attempt, **kw)
            for rank, status in enumerate(statuses)]


def test_the_job_starts_only_when_every_member_runs():
    assert not gangs.outcome(1, True, three("running", "pending", "running")).started
    found = gangs.outcome(1, True, three("running", "running", "running"))
    assert found.started and not found.done and found.ended_by is None and found.to_cancel == ()
    # A member already done while another only now starts: every member has started.
    assert gangs.outcome(1, True, three("done", "running", "running")).started


def test_the_job_is_done_when_every_member_is_done():
    found = gangs.outcome(1, True, three("done", "done", "done"))
    assert found.done and found.ended_by is None and found.to_cancel == ()
    assert not gangs.outcome(1, True, three("done", "running", "done")).done


def test_one_member_failing_ends_the_attempt_and_the_active_others():
    members = three("running", "failed", "pending")
    found = gangs.outcome(1, True, members)
    assert found.ended_by == members[1]
    assert found.to_cancel == (members[0], members[2])
    assert not found.started and not found.done


def test_the_first_member_to_end_is_the_one_the_attempt_ends_by():
    members = [Member(id=10, rank=0, status="failed", finished_at=NOW + 5, exit_code=1),
               Member(id=11, rank=1, status="failed", finished_at=NOW + 1, exit_code=2,
                      ended_by=wire.ENDED_BY_TIMEOUT),
               Member(id=12, rank=2, status="done", finished_at=NOW)]
    found = gangs.outcome(1, True, members)
    assert found.ended_by == members[1] and found.to_cancel == ()


def test_a_job_no_longer_active_ends_every_active_member():
    members = three("running", "pending", "done")
    found = gangs.outcome(1, False, members)
    assert found.to_cancel == (members[0], members[1])
    assert found.ended_by is None and not found.started and not found.done


def test_an_earlier_attempts_members_still_active_end_and_do_not_count():
    old = three("running", "running", attempt=1)
    new = [Member(id=20 + rank, rank=rank, status="running", attempt=2) for rank in range(2)]
    found = gangs.outcome(2, True, old + new)
    assert found.started and found.to_cancel == tuple(old)
    # The current attempt's members decide: an old attempt's failure ends nothing new.
    failed_old = [Member(id=10, rank=0, status="failed", attempt=1, exit_code=1)]
    assert gangs.outcome(2, True, failed_old + new).ended_by is None


def test_a_member_place_names_every_host_in_rank_order_and_rank_0s_port():
    place = gangs.place_of("job-7", 2, ["10.0.0.1", "10.0.0.2", "10.0.0.3"], 29501)
    assert place == {"gang_id": "job-7", "size": 3, "rank": 2, "hosts": ["10.0.0.1", "10.0.0.2", "10.0.0.3"],
                     "master_addr": "10.0.0.1", "master_port": 29501}


def test_the_port_is_the_lowest_one_of_the_range_no_gang_holds():
    assert gangs.choose_port(set(), 29500, 29999) == 29500
    assert gangs.choose_port({29500, 29501, 29503}, 29500, 29999) == 29502
    assert gangs.choose_port({29500, 29501}, 29500, 29501) is None
    assert gangs.choose_port(set(), 29510, 29500) == 29500  # a range given backwards still counts


@pytest.mark.parametrize("held_since, now, holds", [
    (None, NOW, True),                # not holding yet: it may start
    (NOW, NOW + 599, True),           # within the bound
    (NOW, NOW + 600, False),          # the bound reached: the others get the nodes
    (NOW, NOW + 1199, False),
    (NOW, NOW + 1200, True),          # as long again later: its turn again
    (NOW, NOW - 5, True),             # a clock stepped back counts as no time passed
])
def test_a_gang_holds_nodes_for_a_bounded_time_then_lets_others_have_them_as_long(held_since, now, holds):
    assert gangs.may_hold(held_since, now, 600) is holds


def test_a_hold_of_zero_never_holds():
    assert not gangs.may_hold(None, NOW, 0)


def test_a_member_summary_has_its_rank_node_status_and_the_end_of_its_output():
    member = Member(id=12, rank=2, status="failed", attempt=3, node_id="n3", exit_code=1, ended_by="exit",
                    stdout="x" * 10 + "tail", stderr=None)
    assert gangs.member_summary(member, 4) == {
        "job_id": "job-12", "attempt": 3, "rank": 2, "node_id": "n3", "status": "failed", "exit_code": 1,
        "ended_by": "exit", "stdout_tail": "tail", "stderr_tail": None}


# ---- the job's transitions from its members' (lifecycle) ---------------------------------

def test_every_member_running_starts_the_job():
    t = lifecycle.gang_started(Parent(), NOW)
    assert (t.old, t.new) == ("pending", "running") and t.changes["running_at"] == NOW


def test_every_member_done_ends_the_job_done_with_rank_0s_output_and_all_they_used():
    members = [Member(id=11, rank=1, status="done", stdout="one", cpu_seconds=2.0, peak_memory_bytes=10),
               Member(id=10, rank=0, status="done", stdout="zero", cpu_seconds=1.5, peak_memory_bytes=30)]
    t = lifecycle.gang_done(Parent(status="running"), members, NOW)
    assert t.new == "done" and t.final
    assert t.changes["stdout"] == "zero" and t.changes["exit_code"] == 0
    assert t.changes["cpu_seconds"] == 3.5 and t.changes["peak_memory_bytes"] == 30


def test_a_failed_member_spends_a_retry_of_the_job_then_fails_it():
    member = Member(id=11, rank=1, status="failed", exit_code=3, ended_by="exit", stderr="boom")
    again = lifecycle.gang_ended(Parent(status="running"), member, NOW, POLICY)
    assert again.new == "pending" and again.changes["retry_count"] == 1 and again.changes["node_id"] is None
    assert "member 1 (job-11 on n1) failed (exit code 3)" in again.reason
    final = lifecycle.gang_ended(Parent(status="running", retry_count=1), member, NOW, POLICY)
    assert final.new == "failed" and final.changes["exit_code"] == 3 and final.changes["stderr"] == "boom"


def test_a_timed_out_member_fails_the_job_for_good():
    member = Member(id=11, rank=1, status="failed", exit_code=-1, ended_by=wire.ENDED_BY_TIMEOUT)
    t = lifecycle.gang_ended(Parent(status="running"), member, NOW, POLICY)
    assert t.new == "failed" and t.timed_out


def test_a_member_whose_node_was_lost_requeues_the_job_without_spending_a_retry():
    member = Member(id=11, rank=1, status="failed", exit_code=-1, ended_by=wire.ENDED_BY_NODE_LOST)
    t = lifecycle.gang_ended(Parent(status="running"), member, NOW, POLICY)
    assert t.new == "pending" and t.changes["node_losses"] == 1 and "retry_count" not in t.changes


def test_a_preempted_or_drained_member_requeues_the_job():
    member = Member(id=11, rank=1, status="failed", exit_code=-1, ended_by=wire.ENDED_BY_DRAIN)
    t = lifecycle.gang_ended(Parent(status="running"), member, NOW, POLICY)
    assert t.new == "pending" and t.changes["ended_by"] == wire.ENDED_BY_DRAIN


def test_a_member_never_goes_back_to_the_queue_on_its_own():
    member = Member(id=11, rank=1, status="running", running_at=NOW - 5)
    assert lifecycle.node_lost(member, NOW, "node n1 is gone", POLICY).new == "failed"
    stopped = lifecycle.stopped(member, NOW, wire.ENDED_BY_PREEMPTION)
    assert stopped.new == "failed" and stopped.changes["ended_by"] == wire.ENDED_BY_PREEMPTION
    placed = Member(id=12, rank=2, status="pending")
    assert lifecycle.node_lost(placed, NOW, "node n1 is gone", POLICY).new == "failed"


def test_a_member_ended_by_its_job_is_cancelled_and_a_running_one_stopped_as_a_cancel():
    running = lifecycle.gang_cancelled(Member(id=11, rank=1, status="running"), NOW, "member 0 failed")
    assert running.new == "cancelled" and running.changes["ended_by"] == wire.ENDED_BY_CANCEL
    placed = lifecycle.gang_cancelled(Member(id=12, rank=2, status="pending"), NOW, "member 0 failed")
    assert placed.new == "cancelled" and "ended_by" not in placed.changes
