"""`corral usage`: the question sent to GET /usage, and its sums as a table in hours, as
CSV in the API's seconds, or as JSON."""
import json

from responses import matchers

from cli_support import SCHED, corral

ANSWER = {"from_day": "2026-11-30", "to_day": "2026-12-07", "group_by": "team", "rows": [
    {"group": "ml", "attempts": 12, "cpu_seconds": 7200.0, "wall_seconds": 5400.0,
     "memory_mb_seconds": 1024 * 3600 * 3.0, "gpu_seconds": 0.0, "core_seconds": 10800.0},
    {"group": "web", "attempts": 1, "cpu_seconds": 36.0, "wall_seconds": 72.0, "memory_mb_seconds": 0.0,
     "gpu_seconds": 0.0, "core_seconds": 72.0}]}


def test_usage_asks_what_was_said_and_prints_hours(mock):
    mock.get(f"{SCHED}/usage", json=ANSWER, match=[matchers.query_param_matcher(
        {"group_by": "team", "from": "2026-11-30", "to": "2026-12-07", "team": "ml"})])
    result = corral("usage", "--group-by", "team", "--from", "2026-11-30", "--to", "2026-12-07", "--team", "ml")
    assert result.exit_code == 0, result.output
    assert [line.split() for line in result.stdout.splitlines()] == [
        ["TEAM", "ATTEMPTS", "CPU", "HOURS", "WALL", "HOURS", "MEMORY", "GB-HOURS", "GPU", "HOURS", "CORE", "HOURS"],
        ["ml", "12", "2.0", "1.5", "3.0", "0.0", "3.0"], ["web", "1", "0.01", "0.02", "0.0", "0.0", "0.02"]]
    assert "from 2026-11-30 to 2026-12-07" in result.stderr


def test_usage_as_csv_keeps_the_seconds_and_as_json_the_answer(mock):
    mock.get(f"{SCHED}/usage", json=ANSWER)
    lines = corral("usage", "--group-by", "team", "--csv").stdout.splitlines()
    assert lines[0] == "team,attempts,cpu_seconds,wall_seconds,memory_mb_seconds,gpu_seconds,core_seconds"
    assert lines[1] == "ml,12,7200.0,5400.0,11059200.0,0.0,10800.0"
    assert json.loads(corral("usage", "--json").stdout) == ANSWER


def test_no_usage_says_so(mock):
    mock.get(f"{SCHED}/usage", json=dict(ANSWER, rows=[]))
    result = corral("usage")
    assert result.exit_code == 0 and result.stdout == "" and "no usage" in result.stderr


FAIR = {"enabled": True, "half_life_secs": 604800.0, "teams": [
    {"team": "web", "weight": 2, "share": 0.666667, "usage_core_seconds": 3600.0, "usage_part": 0.25,
     "factor": 0.771105, "users": [{"user": "carol", "share": 1.0, "usage_core_seconds": 3600.0, "usage_part": 1.0,
                                    "factor": 0.5}]},
    {"team": "ml", "weight": 1, "share": 0.333333, "usage_core_seconds": 10800.0, "usage_part": 0.75,
     "factor": 0.210224, "users": []}]}


def test_fair_share_shows_each_teams_share_usage_and_factor_in_turn_order(mock):
    mock.get(f"{SCHED}/usage/fair-share", json=FAIR)
    result = corral("usage", "--fair-share")
    assert result.exit_code == 0, result.output
    assert [line.split() for line in result.stdout.splitlines()] == [
        ["TEAM", "USER", "WEIGHT", "SHARE", "CORE", "HOURS", "USAGE", "FACTOR"],
        ["web", "-", "2", "66.7%", "1.0", "25.0%", "0.771"], ["-", "carol", "-", "100.0%", "1.0", "100.0%", "0.500"],
        ["ml", "-", "1", "33.3%", "3.0", "75.0%", "0.210"]]
    assert "usage halves every 7d" in result.stderr
    mock.replace("GET", f"{SCHED}/usage/fair-share", json=dict(FAIR, enabled=False))
    assert "fair share is off" in corral("usage", "--fair-share").stderr
    assert json.loads(corral("usage", "--fair-share", "--json").stdout)["enabled"] is False
