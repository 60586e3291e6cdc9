"""What the agent holds against what the scheduler lists (agent/reconcile.py): pure."""
import pytest

from corral.agent import reconcile


def test_the_keys_of_a_list_and_what_is_not_a_job():
    keys, malformed = reconcile.listed_keys([{"job_id": "a", "attempt": 2}, {"job_id": 7, "retry_count": 1},
                                             {"job_id": "b"}, {"attempt": 1}, "job", {"job_id": "c", "attempt": True}])
    assert keys == {("a", 2), ("7", 1), ("b", 0)}
    assert malformed == [{"attempt": 1}, "job", {"job_id": "c", "attempt": True}]


@pytest.mark.parametrize("attempt", ["1", 1.0, True, [1]])
def test_a_bad_attempt_is_refused(attempt):
    with pytest.raises(ValueError):
        reconcile.job_attempt({"job_id": "a", "attempt": attempt})


def test_what_the_scheduler_no_longer_lists_ended_there():
    assert reconcile.ended_there({("a", 1), ("b", 1), ("a", 2)}, {("a", 2), ("c", 1)}) == [("a", 1), ("b", 1)]


def test_only_jobs_accepted_before_the_request_are_stale():
    held = [(("old", 1), 10.0), (("new", 1), 20.0), (("kept", 1), 5.0)]
    assert reconcile.stale(held, {("kept", 1)}, sent_at=15.0) == [("old", 1)]


def test_a_job_listed_here_but_unknown_is_lost_once_the_claims_that_could_bring_it_were_handled():
    listed = {("x", 1), ("held", 1)}
    # Seen with 3 claims sent, 2 handled: a claim in flight may be bringing it.
    lost, suspects = reconcile.lost_here(listed, {("held", 1)}, {}, claims_sent=3, claims_done=2)
    assert lost == [] and suspects == {("x", 1): 3}
    # Later: more claims sent, but the one that mattered (the third) is handled now.
    lost, suspects = reconcile.lost_here(listed, {("held", 1)}, suspects, claims_sent=5, claims_done=3)
    assert lost == [("x", 1)] and suspects == {}


def test_a_suspect_that_arrived_or_left_the_list_is_forgotten():
    lost, suspects = reconcile.lost_here({("x", 1)}, {("x", 1)}, {("x", 1): 3, ("y", 1): 2}, 4, 0)
    assert lost == [] and suspects == {}
