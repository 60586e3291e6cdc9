"""`corral admin team quota set|show|delete`: the bodies sent (checked against the
contract's QuotaRequest), the table, and refusals. Against the `responses` mock."""
import json

import pytest

from cli_support import SCHED, corral, one_line_error
from corral.cli import quotas
from corral.scheduler.contract import QuotaRequest


def answer(team="ml", guaranteed=None, borrowing=None, lending=None, used=None, borrowed=None):
    zero = {"cpu_percent": 0, "memory_mb": 0, "gpus": 0, "jobs": 0}
    return {"team": team, "guaranteed": guaranteed or {}, "borrowing_limit": borrowing or {},
            "lending_limit": lending or {}, "used": {**zero, **(used or {})}, "borrowed": {**zero, **(borrowed or {})}}


@pytest.mark.parametrize("text, amounts", [
    ("jobs=4", {"jobs": 4}),
    ("cpu_percent=800,memory_mb=16384", {"cpu_percent": 800, "memory_mb": 16384}),
    (" gpus=0 , jobs=0", {"gpus": 0, "jobs": 0}),
])
def test_amounts_are_read_as_resource_equals_number(text, amounts):
    assert quotas.parse_amounts(text) == amounts


@pytest.mark.parametrize("text", ["", "jobs", "jobs=", "jobs=-1", "jobs=1.5", "cpu=4", "jobs=4,", "jobs=x"])
def test_bad_amounts_are_refused(text):
    with pytest.raises(ValueError):
        quotas.parse_amounts(text)


def test_set_sends_the_whole_quota_and_prints_it(mock):
    mock.put(f"{SCHED}/teams/ml/quota", json=answer(guaranteed={"cpu_percent": 800, "jobs": 4},
                                                     borrowing={"jobs": 2}, lending={"jobs": 0},
                                                     used={"jobs": 5, "cpu_percent": 500}, borrowed={"jobs": 1}))
    result = corral("admin", "team", "quota", "set", "ml", "--guaranteed", "cpu_percent=800,jobs=4",
                    "--borrowing-limit", "jobs=2", "--lending-limit", "jobs=0")
    assert result.exit_code == 0, result.output
    sent = json.loads(mock.calls[0].request.body)
    assert sent == {"guaranteed": {"cpu_percent": 800, "jobs": 4}, "borrowing_limit": {"jobs": 2},
                    "lending_limit": {"jobs": 0}}
    QuotaRequest.check(sent)
    lines = [line.split() for line in result.output.splitlines() if line.strip()]
    assert lines[0] == ["TEAM", "RESOURCE", "GUARANTEED", "BORROWING", "LIMIT", "LENDING", "LIMIT", "USED",
                        "BORROWED"]
    assert ["ml", "cpu_percent", "800", "no", "limit", "all", "500", "0"] in lines
    assert ["ml", "jobs", "4", "2", "0", "5", "1"] in lines


def test_show_without_a_team_shows_every_team_the_caller_may_see(mock):
    mock.get(f"{SCHED}/teams", json=[{"name": "ml"}, {"name": "web"}])
    mock.get(f"{SCHED}/teams/ml/quota", json=answer(guaranteed={"jobs": 4}))
    mock.get(f"{SCHED}/teams/web/quota", json={"error": "no team 'web'"}, status=404)
    result = corral("admin", "team", "quota", "show", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["team"] == "ml"


def test_show_of_a_team_one_may_not_see_says_so_and_delete_says_what_it_did(mock):
    mock.get(f"{SCHED}/teams/web/quota", json={"error": "no team 'web'"}, status=404)
    result = corral("admin", "team", "quota", "show", "web")
    assert "no team 'web'" in one_line_error(result)
    mock.delete(f"{SCHED}/teams/ml/quota", status=204)
    result = corral("admin", "team", "quota", "delete", "ml")
    assert result.exit_code == 0 and result.output.strip() == "ml: quota removed"


def test_a_bad_amount_is_refused_before_anything_is_sent(mock):
    result = corral("admin", "team", "quota", "set", "ml", "--guaranteed", "cores=4")
    assert result.exit_code == 2 and "RESOURCE one of cpu_percent, memory_mb, gpus, jobs" in result.output
    assert not mock.calls


def test_job_why_shows_the_teams_quota_and_fair_share_when_the_job_waits(mock):
    reason = {"code": "quota", "message": "team ml uses 3 running jobs and the job needs 1 running jobs: over its "
              "guarantee of 2 running jobs plus borrowing limit of 1 running jobs", "team": "ml",
              "resource": "jobs", "used": 3, "needs": 1, "guaranteed": 2, "limit": 3}
    mock.get(f"{SCHED}/jobs/job-7/why", json={"job_id": "job-7", "pending_reason": reason, "closest_nodes": [],
                                              "quota": answer(guaranteed={"jobs": 2}, borrowing={"jobs": 1},
                                                              used={"jobs": 3}, borrowed={"jobs": 1}),
                                              "fair_share": {"team": "ml", "weight": 1, "share": 0.5,
                                                             "usage_core_seconds": 7200.0, "usage_part": 0.8,
                                                             "factor": 0.329877, "users": [
                                                                 {"user": "bob", "share": 1.0, "factor": 0.5,
                                                                  "usage_core_seconds": 7200.0, "usage_part": 1.0}]}})
    result = corral("job", "why", "job-7")
    assert result.exit_code == 0, result.output
    assert "job-7: pending: " in result.output and "over its guarantee of 2 running jobs" in result.output
    assert "its team's quota:" in result.output
    assert ["ml", "jobs", "2", "1", "all", "3", "1"] in [line.split() for line in result.output.splitlines()]
    assert ("fair share: team ml factor 0.330 (80.0% of the usage on 50.0% of the shares); its user bob 0.500"
            in result.output)
