"""Fair-share arithmetic and order (fairshare.py): pure, the time passed in."""
import math

import pytest

from corral.scheduler import fairshare
from corral.scheduler.fairshare import DAY_SECS, Standing

NOW = 20_000 * DAY_SECS + 12 * 3600  # noon of day 20,000
WEEK = 7 * DAY_SECS


def test_usage_halves_every_half_life_and_todays_counts_in_full():
    assert fairshare.decayed([(20_000, 1000.0)], NOW, WEEK) == pytest.approx(1000.0)
    assert fairshare.decayed([(20_000 - 7, 1000.0)], NOW, WEEK) == pytest.approx(500.0)
    assert fairshare.decayed([(20_000 - 14, 1000.0), (20_000 - 7, 1000.0)], NOW, WEEK) == pytest.approx(750.0)
    assert fairshare.decayed([(20_001, 1000.0)], NOW, WEEK) == pytest.approx(1000.0)  # a clock behind: in full
    assert fairshare.first_day(NOW, WEEK) == 20_000 - 70


def test_a_team_that_used_nothing_has_factor_one_and_one_that_used_its_share_one_half():
    found = fairshare.standings({"a": 1.0, "b": 1.0}, {"a": 3600.0})
    assert found["b"] == Standing(0.5, 0.0, 0.0, 1.0)
    assert found["a"].factor == pytest.approx(2 ** -2)  # all of the usage on half of the shares
    even = fairshare.standings({"a": 1.0, "b": 1.0}, {"a": 100.0, "b": 100.0})
    assert even["a"].factor == even["b"].factor == pytest.approx(0.5)


def test_a_larger_share_bears_more_usage_for_the_same_factor():
    found = fairshare.standings({"big": 2.0, "small": 1.0}, {"big": 200.0, "small": 100.0})
    assert found["big"].share == pytest.approx(2 / 3)
    assert found["big"].factor == pytest.approx(found["small"].factor) == pytest.approx(0.5)


def test_nobody_used_anything_every_factor_is_one_and_a_removed_teams_usage_still_weighs():
    assert {s.factor for s in fairshare.standings({"a": 1.0, "b": 1.0}, {}).values()} == {1.0}
    found = fairshare.standings({"a": 1.0}, {"a": 100.0, "gone": 300.0})
    assert found["a"].usage_part == pytest.approx(0.25) and found["a"].factor == pytest.approx(2 ** -0.25)


def test_turns_go_team_by_team_then_user_by_user_each_users_jobs_in_their_order():
    # rows: (job, team, user), each team's in queue order.
    rows = [(1, "a", "ann"), (2, "a", "ann"), (3, "a", "al"), (4, "b", "bo"), (5, "b", "bo"), (6, "a", "al")]
    teams = fairshare.standings({"a": 1.0, "b": 1.0}, {"a": 500.0, "b": 100.0})
    users = fairshare.user_standings({("a", "ann"): 400.0, ("a", "al"): 100.0, ("b", "bo"): 100.0},
                                     [("a", "ann"), ("a", "al"), ("b", "bo")])
    ordered = fairshare.turns(rows, lambda r: r[1], lambda r: r[2], teams, users)
    assert [r[0] for r in ordered] == [4, 5, 3, 6, 1, 2]


def test_users_of_a_team_have_equal_shares_whatever_other_teams_do():
    users = fairshare.user_standings({("a", "ann"): 100.0, ("b", "bo"): 1e9}, [("a", "al")])
    assert users[("a", "al")].factor == 1.0 and users[("a", "ann")].factor == pytest.approx(0.25)
    assert users[("b", "bo")].factor == pytest.approx(0.5)  # alone in b: all of b's usage, all of its share


def test_two_busy_teams_alternate_their_turns_and_get_half_each_over_time():
    """A cluster of 10 one-core slots, both teams always waiting, jobs of 60 s: each slot that
    frees goes to the team with the higher factor. Over a day each gets 50% ± 10% of the
    core-seconds, whoever held the cluster first."""
    step = 60.0
    ended: dict[str, float] = {"a": 0.0, "b": 0.0}
    holding = ["a"] * 10  # a came first and holds every slot
    got = {"a": 0.0, "b": 0.0}
    for minute in range(24 * 60):
        for team in holding:
            ended[team] += step  # the minute's work, decayed as a whole day's would barely be
            got[team] += step
        teams = fairshare.standings({"a": 1.0, "b": 1.0}, ended)
        holding = []
        for _ in range(10):  # every slot frees and goes to the team with the higher factor
            team = max(("a", "b"), key=lambda t: (teams[t].factor, t == "b"))
            holding.append(team)
        if minute == 0:
            assert holding.count("b") == 10  # b used nothing: its turns first
    share = got["a"] / (got["a"] + got["b"])
    assert math.isclose(share, 0.5, abs_tol=0.1), share
