"""The teams of jobs on the command line: `job run --team` (arrays too), `job list --team`
and `--mine`, the TEAM and SUBMITTED BY columns, and `job status`'s team and submitter."""
from responses import matchers

from cli_support import SCHED, corral, iso, one_line_error


def body(expected: dict):
    return [matchers.json_params_matcher(expected, strict_match=True)]


def a_job(job_id="job-7", **fields) -> dict:
    job = {"job_id": job_id, "name": None, "node_id": "node-1", "command": "true", "job_type": "run",
           "status": "pending", "attempt": 1, "exit_code": None, "created_at": iso(180), "running_at": None,
           "finished_at": None, "team": "ml", "submitted_by": "alice"}
    job.update(fields)
    return job


def test_job_run_sends_the_team(mock):
    mock.post(f"{SCHED}/jobs", json=a_job(), status=201,
              match=body({"command": "true", "team": "ml"}))
    assert corral("job", "run", "--team", "ml", "--", "true").stdout == "job-7\n"


def test_an_array_goes_to_the_team_too(mock):
    mock.post(f"{SCHED}/jobs", json={"array_id": "array-1", "count": 3, "parallel": 3, "first_job_id": "job-1",
                                     "last_job_id": "job-3"}, status=201,
              match=body({"command": "true", "team": "web", "array": {"count": 3}}))
    assert corral("job", "run", "--team", "web", "--array", "3", "--", "true").stdout == "array-1\n"


def test_a_bad_team_name_is_refused_before_anything_is_sent(mock):
    assert one_line_error(corral("job", "run", "--team", "a:b", "--", "true"), code=2).startswith(
        "corral: --team 'a:b': must be")


def test_job_list_shows_team_and_submitter_and_filters_by_team(mock):
    mock.get(f"{SCHED}/jobs", json=[a_job(), a_job("job-6", team="web", submitted_by="bob")],
             match=[matchers.query_param_matcher({"order": "desc", "limit": "20", "team": "ml"})])
    result = corral("job", "list", "--team", "ml")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATUS", "TYPE", "NODE", "ATTEMPT", "EXIT", "CREATED", "DURATION",
                                "TEAM", "SUBMITTED", "BY"]
    assert lines[1].split()[-2:] == ["ml", "alice"]
    assert lines[2].split()[-2:] == ["web", "bob"]


def test_job_list_mine_asks_who_i_am_first(mock):
    mock.get(f"{SCHED}/whoami", json={"user": "alice", "cluster_role": None, "teams": [], "default_team": None,
                                      "token_id": "tok-1", "read_only": False})
    mock.get(f"{SCHED}/jobs", json=[a_job()], match=[matchers.query_param_matcher(
        {"order": "desc", "limit": "20", "submitted_by": "alice", "status": "pending"})])
    result = corral("job", "list", "--mine", "--status", "pending")
    assert result.exit_code == 0, result.output
    assert "job-7" in result.stdout


def test_job_list_with_pending_reasons_keeps_waiting_last(mock):
    reason = {"code": "no_capacity", "message": "no room"}
    mock.get(f"{SCHED}/jobs", json=[a_job(pending_reason=reason)])
    lines = corral("job", "list").stdout.splitlines()
    assert lines[0].split()[-3:] == ["SUBMITTED", "BY", "WAITING"]
    assert lines[1].split()[-5:] == ["ml", "alice", "no_capacity:", "no", "room"]


def test_job_status_shows_the_team_and_submitter(mock):
    mock.get(f"{SCHED}/jobs/job-7", json=a_job())
    mock.get(f"{SCHED}/jobs/job-7/events", json=[])
    out = corral("job", "status", "job-7").stdout
    assert "team          ml" in out and "submitted_by  alice" in out
