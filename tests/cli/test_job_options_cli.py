"""The job options every command that makes a job shares (`job run`, its --array, and
`schedule add`), --timeout among them; constraints typed `zone==a`; `job list`'s
filters; `job cancel` of several jobs or of the jobs filters match; and messages that
neither repeat the job id nor show Python's None. Against the `responses` mock."""

import pytest
from click.testing import CliRunner
from responses import matchers

from cli_support import SCHED, a_job, body_of, corral, iso, one_line_error
from corral.cli import format as fmt
from corral.cli import job_options, scheduling, selection
from corral.cli.common import names_first
from corral.cli.main import cli
from corral.scheduler.contract import SCHEDULE_NOT_IN_JOB, JobRequest


def corral_with_input(text, *args):
    env = {"CORRAL_ADDR": SCHED, "CORRAL_TOKEN": None, "FORCE_COLOR": None, "NO_COLOR": None}
    return CliRunner().invoke(cli, list(args), env=env, prog_name="corral", input=text)


# ---- one definition of the job options ------------------------------------------------

@pytest.mark.parametrize("text, secs", [("90", 90), ("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400),
                                        ("1.5h", 5400)])
def test_durations_read_with_or_without_a_unit(text, secs):
    assert scheduling.parse_duration(text) == secs


@pytest.mark.parametrize("text", ["0", "-5", "1w", "h", "", "1e3"])
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError):
        scheduling.parse_duration(text)


def test_every_job_field_the_api_takes_has_an_option():
    """A field added to POST /jobs later fails this until the commands take it."""
    fields = {job_options.FIELD_NAMES.get(name, name) for name in job_options.OPTION_NAMES}
    # The command itself (CMD) and what only a submission has (`job run`'s own flags).
    submission_only = set(SCHEDULE_NOT_IN_JOB) | {"command", "on_dependency_failure"}
    assert set(JobRequest.model_fields) - submission_only == fields


def test_job_run_sends_a_timeout(mock):
    mock.post(f"{SCHED}/jobs", json=a_job(timeout_secs=900), status=201)
    result = corral("job", "run", "--timeout", "15m", "--max-processes", "64", "--", "etl")
    assert result.exit_code == 0, result.output
    assert body_of(mock) == {"command": "etl", "timeout_secs": 900, "max_processes": 64}


def test_an_array_takes_the_job_options_too(mock):
    mock.post(f"{SCHED}/jobs", json={"array_id": "array-1", "count": 3, "parallel": 3, "first_job_id": "job-1",
                                     "last_job_id": "job-3"}, status=201)
    result = corral("job", "run", "--array", "3", "--timeout", "1h", "--memory-mb", "256", "--", "etl")
    assert result.exit_code == 0, result.output
    assert body_of(mock) == {"command": "etl", "array": {"count": 3}, "timeout_secs": 3600, "memory_mb": 256}


def test_schedule_add_takes_every_job_option(mock):
    mock.post(f"{SCHED}/schedules", json={"name": "nightly", "enabled": True, "next_run_local": "x",
                                          "next_run_at": iso(-60)}, status=201)
    result = corral("schedule", "add", "nightly", "--every", "3600", "--memory-mb", "256", "--max-retries", "2",
                    "--timeout", "2h", "--name", "etl", "--cpu-percent", "50", "--node", "node-2",
                    "--on-node-lost", "fail", "--env", "A=1", "--constraint", "zone=a", "--", "python", "etl.py")
    assert result.exit_code == 0, result.output
    assert body_of(mock) == {"name": "nightly", "interval_secs": 3600.0, "job": {
        "command": "python etl.py", "memory_mb": 256, "max_retries": 2, "timeout_secs": 7200, "name": "etl",
        "cpu_percent": 50, "instance_id": "node-2", "on_node_lost": "fail", "env_vars": {"A": "1"},
        "constraints": [{"label": "zone", "op": "=", "value": "a"}]}}


def test_schedule_add_names_its_team_on_the_schedule_not_its_job(mock):
    mock.post(f"{SCHED}/schedules", json={"name": "n", "enabled": False, "team": "ml"}, status=201)
    result = corral("schedule", "add", "n", "--every", "60", "--team", "ml", "--disabled", "--", "etl")
    assert result.exit_code == 0, result.output
    assert body_of(mock) == {"name": "n", "interval_secs": 60.0, "team": "ml", "enabled": False,
                             "job": {"command": "etl"}}


def test_schedule_add_takes_a_deploy_url_instead_of_a_command(mock):
    mock.post(f"{SCHED}/schedules", json={"name": "n", "enabled": False}, status=201)
    result = corral("schedule", "add", "n", "--every", "60", "--deploy-url", "s3://b/k.zip", "--disabled")
    assert result.exit_code == 0, result.output
    assert body_of(mock)["job"] == {"deploy_url": "s3://b/k.zip"}


@pytest.mark.parametrize("args", [
    ("job", "run", "--timeout", "0", "--", "etl"),
    ("job", "run", "--timeout", "soon", "--", "etl"),
    ("schedule", "add", "n", "--every", "60", "--timeout", "-1", "--", "etl"),
])
def test_a_bad_timeout_is_one_line_and_nothing_is_sent(mock, args):
    assert "--timeout" in one_line_error(corral(*args), code=2)


@pytest.mark.parametrize("args, says", [
    (("job", "run", "--constraint", "zone==a", "--", "etl"), "equality is one '=': zone=a"),
    (("job", "run", "--constraint", "zone!==a", "--", "etl"), "equality is one '=': zone!=a"),
    (("job", "run", "--constraint", "zone:in==a,b", "--", "etl"), "may not start with '='"),
    (("schedule", "add", "n", "--every", "60", "--constraint", "zone==a", "--", "etl"), "zone=a"),
])
def test_a_double_equals_constraint_is_refused_before_sending(mock, args, says):
    line = one_line_error(corral(*args), code=2)
    assert line.startswith("corral: --constraint 'zone") and says in line


# ---- messages: no repeated id, no None ---------------------------------------------------

def test_an_error_that_names_the_job_first_is_not_prefixed_again(mock):
    message = "job-7 is already done; only pending or running jobs can be cancelled"
    mock.post(f"{SCHED}/jobs/job-7/cancel", json={"error": message}, status=409)
    assert one_line_error(corral("job", "cancel", "job-7")) == f"corral: {message}"
    assert names_first("job-7 is done", "job-7") and names_first("job-7: gone", "job-7")
    assert not names_first("job-77 is done", "job-7") and not names_first("no job 'job-7'", "job-7")


def test_null_values_are_left_out_of_cells_and_reason_details():
    last_run = {"slot": "2026-11-29T12:00:00.000Z", "job_id": "job-3", "status": "done", "skipped": None}
    assert "None" not in fmt.text(last_run) and "skipped" not in fmt.text(last_run)
    assert fmt.text({"memory_mb": 256, "cpu_percent": None}) == "memory_mb=256"
    assert fmt.text({"a": None}) == "-"
    details = scheduling.reason_details({"code": "no_capacity", "message": "m", "nodes": 2, "node_id": None,
                                         "used": {"memory_mb": 3, "cpu_percent": None}})
    assert details == "nodes=2, used=memory_mb=3"


def test_schedule_show_prints_no_none(mock):
    mock.get(f"{SCHED}/schedules/n", json={"name": "n", "cron": None, "last_run": {
        "slot": iso(60), "job_id": "job-3", "status": "done", "skipped": None}, "job": {"command": "etl"}})
    result = corral("schedule", "show", "n")
    assert result.exit_code == 0, result.output
    assert "None" not in result.stdout and "job_id=job-3" in result.stdout


# ---- job list filters ---------------------------------------------------------------------

def test_job_list_filters_by_name_schedule_array_and_time(mock):
    mock.get(f"{SCHED}/jobs", json=[a_job(name="etl")], match=[matchers.query_param_matcher({
        "order": "desc", "limit": "20", "name": "etl", "schedule": "nightly", "array": "array-3",
        "created_after": iso(3600), "created_before": "2026-11-29T11:30:00Z"})])
    result = corral("job", "list", "--name", "etl", "--schedule", "nightly", "--array", "array-3",
                    "--since", "1h", "--until", "2026-11-29T11:30:00Z")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1].split()[:2] == ["job-7", "etl"]


@pytest.mark.parametrize("args", [("--since", "yesterday"), ("--until", "2026-11-29T11:30:00"),
                                  ("--name", "a b")])
def test_bad_list_filters_are_refused_before_sending(mock, args):
    assert one_line_error(corral("job", "list", *args), code=2).startswith(f"corral: {args[0]} ")


# ---- cancelling many ----------------------------------------------------------------------

def test_cancel_several_ids_reports_each_and_fails_when_one_fails(mock):
    mock.post(f"{SCHED}/jobs/job-1/cancel", json=a_job("job-1", status="cancelled"))
    mock.post(f"{SCHED}/jobs/job-2/cancel", json={"error": "job-2 is already done; only pending or running "
                                                           "jobs can be cancelled"}, status=409)
    mock.post(f"{SCHED}/jobs/job-3/cancel", json=a_job("job-3", status="cancelled"))
    result = corral("job", "cancel", "job-1", "job-2", "job-3")
    assert result.exit_code == 1
    assert result.stdout == "job-1: cancelled\njob-3: cancelled\n"
    assert result.stderr.splitlines() == ["corral: job-2 is already done; only pending or running jobs can be "
                                          "cancelled", "corral: 1 of 3 jobs could not be cancelled"]


def filtered(mock, status, jobs):
    mock.get(f"{SCHED}/jobs", json=jobs, match=[matchers.query_param_matcher({
        "status": status, "name": "etl", "node_id": "node-2", "order": "asc", "limit": "1000"})])


def test_cancel_by_filters_lists_the_jobs_and_cancels_them_with_yes(mock):
    filtered(mock, "pending", [a_job("job-4", name="etl")])
    filtered(mock, "running", [a_job("job-2", name="etl", status="running", running_at=iso(60))])
    for job_id in ("job-2", "job-4"):
        mock.post(f"{SCHED}/jobs/{job_id}/cancel", json=a_job(job_id, status="cancelled"))
    result = corral("job", "cancel", "--name", "etl", "--node", "node-2", "--yes")
    assert result.exit_code == 0, result.output
    assert result.stdout == "job-2: cancelled\njob-4: cancelled\n"
    listed = result.stderr.splitlines()
    assert listed[0].split()[:3] == ["ID", "NAME", "STATUS"]
    assert [line.split()[0] for line in listed[1:3]] == ["job-2", "job-4"]


def test_cancel_by_filters_refuses_without_a_terminal_or_yes(mock):
    filtered(mock, "pending", [a_job("job-4", name="etl")])
    result = corral("job", "cancel", "--status", "pending", "--name", "etl", "--node", "node-2")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.splitlines()[-1] == ("corral: Cancel this job? Refusing without --yes: stdin is not "
                                              "a terminal")


@pytest.mark.parametrize("answer, cancelled", [("y\n", True), ("n\n", False)])
def test_cancel_by_filters_asks_at_a_terminal(mock, monkeypatch, answer, cancelled):
    monkeypatch.setattr(selection, "interactive", lambda: True)
    filtered(mock, "pending", [a_job("job-4", name="etl")])
    if cancelled:
        mock.post(f"{SCHED}/jobs/job-4/cancel", json=a_job("job-4", status="cancelled"))
    result = corral_with_input(answer, "job", "cancel", "--status", "pending", "--name", "etl", "--node", "node-2")
    assert "Cancel this job? [y/N]" in result.stderr
    if cancelled:
        assert result.exit_code == 0 and result.stdout == "job-4: cancelled\n"
    else:
        assert result.exit_code == 1 and result.stdout == ""
        assert result.stderr.splitlines()[-1] == "corral: nothing was done"


def test_cancel_with_no_match_cancels_nothing(mock):
    filtered(mock, "pending", [])
    filtered(mock, "running", [])
    result = corral("job", "cancel", "--name", "etl", "--node", "node-2")
    assert result.exit_code == 0 and result.stdout == ""
    assert result.stderr == "no pending or running job matches\n"


@pytest.mark.parametrize("args", [("job-1", "--status", "pending"), ()])
def test_cancel_needs_ids_or_filters_not_both(mock, args):
    result = corral("job", "cancel", *args)
    assert result.exit_code == 2 and result.stdout == ""
    assert "job ids or filters" in result.stderr or "give the jobs to cancel" in result.stderr
