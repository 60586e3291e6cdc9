"""The one retry delay helper (shared/backoff.py)."""
from corral.shared.backoff import Backoff


def test_delays_double_up_to_the_cap_and_start_again_after_a_success():
    backoff = Backoff(0.5, 3.0)
    assert [backoff.next() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    backoff.reset()
    assert backoff.next() == 0.5


def test_a_first_delay_over_the_cap_is_the_cap():
    assert Backoff(10.0, 2.0).next() == 2.0
