"""control-plane/scheduler/lifecycle.py: every decision about a job's state, pure
(a job, an event, the policy and `now` in; a transition out)."""
from dataclasses import dataclass, replace

import pytest

from corral.scheduler import lifecycle
from corral.scheduler.retry import RetryDelay
from corral.shared.errors import Conflict
from corral.shared.states import InvalidTransition

NOW = 1_800_000_000.0
POLICY = lifecycle.Policy(max_node_losses=3, job_timeout_secs=3600, output_tail_bytes=8,
                          backoff=RetryDelay(2.0, 2.0, 300.0))


@dataclass(frozen=True)
class Job:
    status: str = "running"
    attempt: int = 1
    node_id: str | None = "n1"
    job_type: str = "run"
    retry_count: int = 0
    max_retries: int = 1
    node_losses: int = 0
    on_node_lost: str = "requeue"
    running_at: float | None = NOW - 10
    job_id: str = "job-1"


def report(status="done", exit_code=0, **extra):
    return {"node_id": "n1", "attempt": 1, "status": status, "exit_code": exit_code, "stdout": "0123456789",
            "stderr": "", "oom_killed": False, "peak_memory_bytes": 1, "cpu_seconds": 0.5, "requeue": False,
            **extra}


def test_a_claim_or_running_report_starts_the_attempt():
    t = lifecycle.started(Job(status="pending"), NOW, True, {"memory_mb": 512, "cpu_percent": 100}, False,
                          "claimed by the node")
    assert (t.old, t.new, t.reason) == ("pending", "running", "claimed by the node")
    # A new attempt: no stop asked of an earlier one (a drain's deadline, a preemption) holds for it.
    assert t.changes == {"running_at": NOW, "limits_enforced": True,
                         "limits": {"memory_mb": 512, "cpu_percent": 100}, "private_tmp": False,
                         "stop_reason": None, "stop_at": None}
    assert not t.final and not t.notify
    with pytest.raises(InvalidTransition):
        lifecycle.started(Job(status="done"), NOW, None, None, None, "claimed")


def test_exit_0_is_done_with_the_output_tail():
    t = lifecycle.finished(Job(), report(), NOW, POLICY)
    assert (t.new, t.reason, t.final, t.notify) == ("done", "exit code 0", True, True)
    assert t.changes["stdout"] == "23456789" and t.changes["finished_at"] == NOW  # the last 8 characters


def test_a_failure_retries_while_the_budget_lasts_then_fails():
    t = lifecycle.finished(Job(retry_count=0, max_retries=1), report("failed", 2), NOW, POLICY)
    assert t.new == "pending" and t.changes["retry_count"] == 1 and t.changes["node_id"] is None
    assert NOW <= t.changes["next_attempt_at"] <= NOW + 2.0 and t.changes["stdout"] is None
    assert "attempt 1 failed (exit code 2); retrying in" in t.reason
    last = lifecycle.finished(Job(retry_count=1, max_retries=1), report("failed", 2, oom_killed=True), NOW, POLICY)
    assert (last.new, last.reason) == ("failed", "exit code 2, out of memory; no retries left")
    assert last.changes["exit_code"] == 2 and last.notify


def test_a_failure_past_the_timeout_is_final():
    job = Job(running_at=NOW - 4000, max_retries=5)
    t = lifecycle.finished(job, report("failed", -15), NOW, POLICY)
    assert (t.new, t.reason, t.timed_out) == ("failed", "timed out", True)
    service = lifecycle.finished(replace(job, job_type="service"), report("failed", 1), NOW, POLICY)
    assert service.new == "pending"  # services have no timeout


def test_an_attempt_the_node_gave_up_is_a_node_loss_not_a_retry():
    t = lifecycle.finished(Job(max_retries=0), report("failed", -1, requeue=True), NOW, POLICY)
    assert t.new == "pending" and t.changes["node_losses"] == 1 and "retry_count" not in t.changes
    assert t.reason == "node n1 gave the attempt up; requeued"


def test_a_lost_node_requeues_unless_the_job_says_fail_or_lost_too_often():
    t = lifecycle.node_lost(Job(), NOW, "node n1 lost", POLICY)
    assert (t.new, t.changes["node_losses"], t.changes["node_id"]) == ("pending", 1, None)
    fail = lifecycle.node_lost(Job(on_node_lost="fail"), NOW, "node n1 lost", POLICY)
    assert fail.new == "failed" and fail.changes["exit_code"] == -1
    assert fail.changes["stderr"] == "node n1 lost; not requeued (on_node_lost=fail)"
    worn = lifecycle.node_lost(Job(node_losses=3), NOW, "node n1 lost", POLICY)
    assert worn.new == "failed" and "MAX_NODE_LOSSES=3" in worn.changes["stderr"]
    assert worn.reason == "node n1 lost; lost its node 4 times"


def test_the_watcher_fails_a_job_past_its_timeout():
    t = lifecycle.timed_out(Job(), NOW)
    assert (t.new, t.timed_out, t.changes["exit_code"], t.changes["stderr"]) == ("failed", True, -1, "job timed out")


@pytest.mark.parametrize("job, sent, started, kept", [
    # requeued (unplaced, or placed again elsewhere), no later attempt started: kept
    (Job(status="pending", attempt=1, node_id=None), report(), [(1, "n1")], True),
    (Job(status="pending", attempt=2, node_id="n2"), report(), [(1, "n1")], True),
    # a later attempt started (and failed back to pending): refused
    (Job(status="pending", attempt=3, node_id="n2"), report(), [(1, "n1"), (2, "n2")], False),
    # the attempt never started on the reporting node: refused
    (Job(status="pending", attempt=2, node_id="n2"), report(node_id="n3"), [(1, "n1")], False),
    (Job(status="pending", attempt=1, node_id=None), report(), [], False),
    # a failure, a running job, a future attempt, the current placement itself: not late successes
    (Job(status="pending", attempt=2, node_id="n2"), report("failed", 1), [(1, "n1")], False),
    (Job(status="running", attempt=2, node_id="n2"), report(), [(1, "n1")], False),
    (Job(status="pending", attempt=1, node_id=None), report(attempt=2), [(2, "n1")], False),
    (Job(status="pending", attempt=1, node_id="n1"), report(), [(1, "n1")], False),
])
def test_a_late_success_is_kept_only_while_no_later_attempt_started(job, sent, started, kept):
    assert lifecycle.is_late_success(job, sent, started) is kept


def test_a_late_success_records_the_attempt_and_node_that_produced_it():
    t = lifecycle.late_success(Job(status="pending", attempt=2, node_id="n2"), report(), NOW, POLICY)
    assert (t.old, t.new, t.changes["attempt"], t.changes["node_id"]) == ("pending", "done", 1, "n1")
    assert "its result is kept" in t.reason and t.notify


def test_cancel_and_retry():
    assert lifecycle.cancelled(Job(status="pending"), NOW).new == "cancelled"
    assert lifecycle.cancelled(Job(status="running"), NOW).changes == {"finished_at": NOW, "ended_by": "cancel"}
    assert lifecycle.cancelled(Job(status="cancelled"), NOW) is None  # a repeat changes nothing
    for status in ("done", "failed"):
        with pytest.raises(Conflict):
            lifecycle.cancelled(Job(status=status), NOW)
    again = lifecycle.retried(Job(status="failed", retry_count=1), NOW)
    assert again.new == "pending" and again.changes["retry_count"] == 0 and again.changes["exit_code"] is None
    with pytest.raises(Conflict):
        lifecycle.retried(Job(status="done"), NOW)


# ---- why an attempt ended (ended_by) ----------------------------------------------------

@pytest.mark.parametrize("event, ended_by", [
    (lambda: lifecycle.finished(Job(), report(), NOW, POLICY), "exit"),
    (lambda: lifecycle.finished(Job(max_retries=0), report("failed", 3), NOW, POLICY), "exit"),
    (lambda: lifecycle.finished(Job(max_retries=2), report("failed", 3), NOW, POLICY), "exit"),  # retried
    (lambda: lifecycle.finished(Job(max_retries=2), report("failed", -9, oom_killed=True, ended_by="oom"),
                                NOW, POLICY), "oom"),
    (lambda: lifecycle.finished(Job(max_retries=2), report("failed", -1, ended_by="disk"), NOW, POLICY), "disk"),
    # The agent stopped it at its timeout: final, whatever its retries, even if it exited 0 on the signal.
    (lambda: lifecycle.finished(Job(max_retries=2), report("failed", -1, ended_by="timeout"), NOW, POLICY),
     "timeout"),
    (lambda: lifecycle.finished(Job(max_retries=2, running_at=NOW - 4000), report("failed", 1), NOW, POLICY),
     "timeout"),
    (lambda: lifecycle.finished(Job(), report("failed", -1, requeue=True), NOW, POLICY), "node_lost"),
    (lambda: lifecycle.node_lost(Job(), NOW, "node n1 was lost", POLICY), "node_lost"),
    (lambda: lifecycle.node_lost(Job(on_node_lost="fail"), NOW, "node n1 was lost", POLICY), "node_lost"),
    (lambda: lifecycle.timed_out(Job(), NOW), "timeout"),
    (lambda: lifecycle.cancelled(Job(), NOW), "cancel"),
    (lambda: lifecycle.finished(Job(), report("failed", -1, requeue=True, ended_by="drain"), NOW, POLICY), "drain"),
    (lambda: lifecycle.stopped(Job(), NOW, "drain", forced=True), "drain"),
])
def test_every_end_of_an_attempt_says_why(event, ended_by):
    assert event().changes["ended_by"] == ended_by


def test_a_job_cancelled_before_it_ran_has_no_attempt_end_to_tell():
    assert "ended_by" not in lifecycle.cancelled(Job(status="pending", running_at=None), NOW).changes


def test_a_timeout_reported_by_the_agent_is_final_though_retries_are_left():
    t = lifecycle.finished(Job(max_retries=5), report("failed", 0, ended_by="timeout"), NOW, POLICY)
    assert (t.new, t.reason, t.timed_out) == ("failed", "timed out", True)


def test_a_stopped_attempt_is_requeued_spending_nothing():
    t = lifecycle.finished(Job(max_retries=0), report("failed", -1, requeue=True, ended_by="drain"), NOW, POLICY)
    assert (t.new, t.final) == ("pending", False)
    assert "retry_count" not in t.changes and "node_losses" not in t.changes
    assert t.changes["stop_reason"] is None and t.changes["node_id"] is None
    assert t.reason == "the drain of its node reached its deadline; requeued"
    forced = lifecycle.stopped(Job(), NOW, "drain", forced=True)
    assert forced.reason == "the drain of its node reached its deadline; its node did not report the stop in time; " \
                            "requeued"

