"""The agent's lease (agent/lease.py): pure state, time passed in."""
import pytest

from corral.agent.lease import IDLE_RENEW_SECS, Lease


def test_a_lease_never_renewed_is_not_lapsed_and_one_lapses_a_period_after_it_was_sent():
    lease = Lease()
    assert not lease.lapsed(1e9)
    assert lease.renewed(100.0, {"lease_secs": 20, "running": [{"job_id": "j", "attempt": 1}]}) == [
        {"job_id": "j", "attempt": 1}]
    assert not lease.lapsed(120.0) and lease.lapsed(120.01)


def test_the_latest_evidence_counts_whichever_answer_came_first():
    lease = Lease()
    lease.renewed(100.0, {"lease_secs": 20})
    lease.evidence(130.0)   # a claim that handed out jobs
    lease.evidence(110.0)   # a renewal sent earlier, answered later
    assert lease.sent_at == 130.0 and not lease.lapsed(150.0) and lease.lapsed(150.5)


@pytest.mark.parametrize("answer", [None, [], {}, {"lease_secs": 0}, {"lease_secs": -1}, {"lease_secs": True},
                                    {"lease_secs": "20"}])
def test_an_answer_without_a_usable_period_raises_and_changes_nothing(answer):
    lease = Lease()
    with pytest.raises(ValueError):
        lease.renewed(100.0, answer)
    assert lease.sent_at is None and lease.secs is None


def test_renewals_are_due_every_beat_while_busy_else_seldom_and_at_once_after_a_lost_claim():
    lease = Lease()
    assert lease.due(0.0, every_beat=False)   # never tried
    lease.tried(0.0)
    assert lease.due(5.0, every_beat=True) and not lease.due(5.0, every_beat=False)
    assert lease.due(IDLE_RENEW_SECS, every_beat=False)
    lease.renew_soon()
    assert lease.due(6.0, every_beat=False)
