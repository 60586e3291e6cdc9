"""The `corral` command line: every command's request and output against the `responses`
mock of requests (CliRunner, no servers), the pure formatting helpers, and one run of the
real console script against a real cluster."""
import json
import os
import subprocess
import sys

import pytest
import requests
from click.testing import CliRunner
from responses import matchers

from cli_support import NOW, REG, SCHED, corral, iso, one_line_error
from corral.cli import common, jobs
from corral.cli import format as fmt
from corral.cli.main import cli


def a_job(job_id="job-7", **fields) -> dict:
    job = {"job_id": job_id, "name": None, "node_id": "node-1", "instance_id": None, "command": "echo hi",
           "deploy_url": None, "job_type": "run", "port": None, "env_vars": {}, "status": "pending",
           "attempt": 1, "retry_count": 0, "max_retries": 1, "next_attempt_at": None, "exit_code": None,
           "stdout": None, "stderr": None, "oom_killed": None, "peak_memory_bytes": None, "cpu_seconds": None,
           "limits": None, "created_at": iso(180), "placed_at": iso(180), "running_at": None,
           "finished_at": None}
    job.update(fields)
    return job


DONE = dict(status="done", exit_code=0, stdout="hi\n", stderr="", running_at=iso(65), finished_at=iso(60))


# ---- pure formatting ------------------------------------------------------------------------

def test_relative_times_against_a_fixed_now():
    assert fmt.relative(iso(0.4), NOW) == "just now"
    assert fmt.relative(iso(45), NOW) == "45s ago"
    assert fmt.relative(iso(180), NOW) == "3m ago"
    assert fmt.relative(iso(2 * 3600 + 59), NOW) == "2h ago"
    assert fmt.relative(iso(5 * 86400), NOW) == "5d ago"
    assert fmt.relative(iso(-20), NOW) == "in 20s"
    assert fmt.relative(None, NOW) == "-"
    assert fmt.relative("garbage", NOW) == "-"


def test_durations():
    assert fmt.duration(0.25) == "250ms"
    assert fmt.duration(4.21) == "4.2s"
    assert fmt.duration(185) == "3m05s"
    assert fmt.duration(2 * 3600 + 180) == "2h03m"
    assert fmt.duration(3 * 86400 + 4 * 3600) == "3d04h"
    assert fmt.duration(None) == "-"
    assert fmt.job_duration(a_job(**DONE), NOW) == "5.0s"
    assert fmt.job_duration(a_job(status="running", running_at=iso(90)), NOW) == "1m30s"
    assert fmt.job_duration(a_job(), NOW) == "-"


def test_cells_are_one_line_and_never_markup():
    assert fmt.text(None) == "-" and fmt.text("") == "-"
    assert fmt.text({"zone": "a", "gpu": "1"}) == "zone=a,gpu=1"
    assert fmt.text("a\nb") == "a\\nb"
    assert fmt.text(True) == "yes"
    out = fmt.render_plain(fmt.table(["ID", "NAME"], [["job-1", "[bold]x[/bold]"], ["job-22", None]]))
    assert out.splitlines() == ["ID      NAME", "job-1   [bold]x[/bold]", "job-22  -"]


def test_plain_tables_have_no_colour_no_wrapping_and_no_trailing_blanks():
    long = "echo " + "a" * 300
    out = fmt.render_plain(fmt.table(["ID", "STATUS", "COMMAND"], [["job-1", fmt.status_cell("failed"), long]],
                                     wide=("COMMAND",)))
    assert "\x1b[" not in out
    assert long in out
    assert all(line == line.rstrip() for line in out.splitlines())


def test_exit_status_of_a_final_job():
    assert jobs.exit_status({"status": "done", "exit_code": 0}) == 0
    assert jobs.exit_status({"status": "failed", "exit_code": 3}) == 3
    assert jobs.exit_status({"status": "failed", "exit_code": None}) == 1
    assert jobs.exit_status({"status": "failed", "exit_code": -1}) == 1   # timed out
    assert jobs.exit_status({"status": "cancelled", "exit_code": None}) == 1


# ---- job run --------------------------------------------------------------------------------

def test_job_run_posts_the_request_and_prints_the_job_id(mock):
    submitted = a_job(command="python etl.py --day '2026 11'")
    mock.post(f"{SCHED}/jobs", json=submitted, status=201, match=[
        matchers.json_params_matcher({
            "command": "python etl.py --day '2026 11'", "job_type": "service", "port": 8080,
            "env_vars": {"STAGE": "prod", "EMPTY": "", "EQ": "a=b"}, "deploy_url": "s3://b/k.zip",
            "deploy_sha256": "ab" * 32, "instance_id": "node-7", "name": "etl", "max_retries": 3,
            "memory_mb": 2048, "cpu_percent": 200, "health_path": "/healthz", "on_node_lost": "fail"}),
        matchers.header_matcher({"Idempotency-Key": "etl-1", "Authorization": "Bearer s3cret"})])
    result = corral("job", "run", "--type", "service", "--port", "8080", "--env", "STAGE=prod", "--env", "EMPTY=",
                    "--env", "EQ=a=b", "--deploy-url", "s3://b/k.zip", "--sha256", "ab" * 32, "--node", "node-7",
                    "--name", "etl", "--max-retries", "3", "--memory-mb", "2048", "--cpu-percent", "200",
                    "--health-path", "/healthz", "--on-node-lost", "fail", "--idempotency-key", "etl-1",
                    "--", "python", "etl.py", "--day", "2026 11", token="s3cret")
    assert result.exit_code == 0, result.output
    assert result.stdout == "job-7\n"
    assert "submitted job-7" in result.stderr


def test_job_run_takes_the_words_after_the_command_as_its_own(mock):
    mock.post(f"{SCHED}/jobs", json=a_job(), status=201,
              match=[matchers.json_params_matcher({"command": "ls -la --wait"})])
    assert corral("job", "run", "ls", "-la", "--wait").exit_code == 0


def test_job_run_takes_one_word_as_a_whole_shell_command_line(mock):
    mock.post(f"{SCHED}/jobs", json=a_job(), status=201,
              match=[matchers.json_params_matcher({"command": "make test | tee log"})])
    assert corral("job", "run", "--", "make test | tee log").exit_code == 0


def test_job_run_json_prints_the_api_answer(mock):
    submitted = a_job()
    mock.post(f"{SCHED}/jobs", json=submitted, status=201)
    result = corral("job", "run", "--json", "--", "echo", "hi")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == submitted


@pytest.mark.parametrize("args, message", [
    ([], "give a command"),
    (["--env", "NOEQUALS", "--", "true"], "'NOEQUALS' is not K=V"),
])
def test_job_run_usage_errors_exit_2_without_a_request(mock, args, message):
    result = corral("job", "run", *args)
    assert result.exit_code == 2
    assert message in result.stderr


def wait_for_job(mock, *states: dict, command=("--", "echo", "hi")):
    mock.post(f"{SCHED}/jobs", json=a_job(), status=201)
    for state in states:
        mock.get(f"{SCHED}/jobs/job-7", json=a_job(**state))
    return corral("job", "run", "--wait", *command)


def test_wait_follows_the_job_and_exits_0_when_done(mock):
    result = wait_for_job(mock, dict(status="running", running_at=iso(65)), DONE)
    assert result.exit_code == 0, result.output
    assert result.stdout == "hi\n"
    assert result.stderr.splitlines() == [
        "job-7: pending, placed on node-1",
        "job-7: running on node-1 (attempt 1)",
        "job-7: done (exit code 0, ran 5.0s, on node-1)",
    ]


def test_wait_exits_with_the_jobs_exit_code_and_prints_its_stderr(mock):
    failed = dict(status="failed", exit_code=3, stdout="", stderr="boom\n", running_at=iso(2), finished_at=iso(1))
    result = wait_for_job(mock, dict(status="running"), dict(status="pending", attempt=2, retry_count=1,
                                                             node_id=None), dict(failed, attempt=2))
    assert result.exit_code == 3
    assert "job-7: pending (retry 1 of 1)" in result.stderr
    assert "job-7: failed (exit code 3" in result.stderr
    assert result.stderr.endswith("boom\n")


def test_wait_failed_without_exit_code_exits_1(mock):
    assert wait_for_job(mock, dict(status="failed", exit_code=None)).exit_code == 1


def test_wait_on_a_cancelled_job_exits_1_with_a_message(mock):
    result = wait_for_job(mock, dict(status="cancelled"))
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == "corral: job-7 was cancelled"


def test_wait_rides_out_a_scheduler_that_is_briefly_unreachable(mock):
    mock.post(f"{SCHED}/jobs", json=a_job(), status=201)
    mock.get(f"{SCHED}/jobs/job-7", body=requests.ConnectionError("Connection refused"))
    mock.get(f"{SCHED}/jobs/job-7", json=a_job(**DONE))
    result = corral("job", "run", "--wait", "--", "true")
    assert result.exit_code == 0
    assert "cannot reach the scheduler (connection refused); still trying" in result.stderr


def test_wait_ctrl_c_exits_130_and_leaves_the_job_running(mock, monkeypatch):
    mock.post(f"{SCHED}/jobs", json=a_job(), status=201)

    def interrupt(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(common, "sleep", interrupt)
    result = corral("job", "run", "--wait", "--", "sleep", "100")
    assert result.exit_code == 130
    assert "corral job cancel job-7" in result.stderr


def test_wait_json_prints_the_final_job(mock):
    final = a_job(**DONE)
    mock.post(f"{SCHED}/jobs", json=a_job(), status=201)
    mock.get(f"{SCHED}/jobs/job-7", json=final)
    result = corral("job", "run", "--wait", "--json", "--", "echo", "hi")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == final


# ---- job list / status / events / logs / cancel / retry --------------------------------------

def test_job_list_asks_newest_first_with_the_filters_and_prints_a_table(mock):
    page = [a_job("job-9", status="running", running_at=iso(30), name="etl"), a_job("job-8", **DONE)]
    mock.get(f"{SCHED}/jobs", json=page, match=[matchers.query_param_matcher(
        {"order": "desc", "status": "running", "node_id": "node-1", "job_type": "run", "limit": "5"})])
    result = corral("job", "list", "--status", "running", "--node", "node-1", "--type", "run", "--limit", "5")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATUS", "TYPE", "NODE", "ATTEMPT", "EXIT", "CREATED", "DURATION"]
    assert lines[1].split() == ["job-9", "etl", "running", "run", "node-1", "1", "-", "3m", "ago", "30.0s"]
    assert lines[2].split() == ["job-8", "-", "done", "run", "node-1", "1", "0", "3m", "ago", "5.0s"]
    assert "\x1b[" not in result.stdout  # not a terminal: no colour


def test_job_list_all_follows_the_link_pages(mock):
    first, second = [a_job("job-3"), a_job("job-2")], [a_job("job-1")]
    mock.get(f"{SCHED}/jobs", json=first,
             headers={"Link": '</jobs?order=desc&limit=2&after=job-2>; rel="next"'},
             match=[matchers.query_param_matcher({"order": "desc", "limit": "2"})])
    mock.get(f"{SCHED}/jobs", json=second,
             match=[matchers.query_param_matcher({"order": "desc", "limit": "2", "after": "job-2"})])
    result = corral("job", "list", "--all", "--limit", "2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == first + second


def test_job_list_without_all_says_there_is_more(mock):
    mock.get(f"{SCHED}/jobs", json=[a_job("job-3")], headers={"Link": '</jobs?after=job-3>; rel="next"'})
    result = corral("job", "list", "--limit", "1")
    assert result.exit_code == 0 and "job-3" in result.stdout
    assert "more jobs" in result.stderr
    assert mock.calls[0].request.params == {"order": "desc", "limit": "1"}


def test_job_list_json_is_the_api_answer(mock):
    page = [a_job("job-2"), a_job("job-1")]
    mock.get(f"{SCHED}/jobs", json=page)
    result = corral("job", "list", "--json")
    assert json.loads(result.stdout) == page
    assert mock.calls[0].request.params == {"order": "desc", "limit": "20"}


def test_job_status_shows_fields_and_events(mock):
    job = a_job(**DONE, limits={"memory_mb": 512, "cpu_percent": 100}, peak_memory_bytes=3 * 1024 * 1024)
    events = [{"at": iso(180), "from": None, "to": "pending", "attempt": 0, "node_id": None, "reason": "submitted"},
              {"at": iso(65), "from": "pending", "to": "running", "attempt": 1, "node_id": "node-1",
               "reason": "started on the node"}]
    mock.get(f"{SCHED}/jobs/job-7", json=job)
    mock.get(f"{SCHED}/jobs/job-7/events", json=events)
    result = corral("job", "status", "job-7")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for line in ("job_id             job-7", "status             done", "exit_code          0",
                 "limits             memory_mb=512,cpu_percent=100", "peak_memory_bytes  3.0 MiB",
                 "created_at         2026-11-29 11:57:00Z (3m ago)"):
        assert line in out
    assert "TIME                  CHANGE             ATTEMPT  NODE    REASON" in out
    assert "2026-11-29 11:58:55Z  pending → running  1        node-1  started on the node" in out
    assert out.rstrip().endswith("hi")


def test_job_status_json_is_the_job(mock):
    job = a_job(**DONE)
    mock.get(f"{SCHED}/jobs/job-7", json=job)
    result = corral("job", "status", "job-7", "--json")
    assert json.loads(result.stdout) == job
    assert len(mock.calls) == 1


def test_job_events_json(mock):
    events = [{"at": iso(1), "from": None, "to": "pending", "attempt": 0, "node_id": None, "reason": "submitted"}]
    mock.get(f"{SCHED}/jobs/job-7/events", json=events)
    assert json.loads(corral("job", "events", "job-7", "--json").stdout) == events
    assert "submitted" in corral("job", "events", "job-7").stdout


def test_job_logs_prints_stdout_or_stderr(mock):
    mock.get(f"{SCHED}/jobs/job-7", json=a_job(**dict(DONE, stdout="out\n", stderr="err\n")))
    assert corral("job", "logs", "job-7").stdout == "out\n"
    assert corral("job", "logs", "job-7", "--stderr").stdout == "err\n"


def test_cancel_and_retry_post_and_print_the_new_status(mock):
    mock.post(f"{SCHED}/jobs/job-7/cancel", json=a_job(status="cancelled"))
    mock.post(f"{SCHED}/jobs/job-8/retry", json=a_job("job-8", status="pending", node_id=None))
    assert corral("job", "cancel", "job-7").stdout == "job-7: cancelled\n"
    assert corral("job", "retry", "job-8").stdout == "job-8: pending\n"
    retried = corral("job", "retry", "job-8", "--json")
    assert json.loads(retried.stdout)["job_id"] == "job-8"


# ---- errors ---------------------------------------------------------------------------------

def test_connection_refused_is_one_line(mock):
    mock.get(f"{SCHED}/jobs", body=requests.ConnectionError("[Errno 111] Connection refused"))
    line = one_line_error(corral("job", "list"))
    assert line == f"corral: cannot reach the scheduler at {SCHED}: connection refused"


def test_registry_unreachable_names_the_registry(mock):
    mock.get(f"{REG}/nodes", body=requests.ConnectionError("Connection refused"))
    assert one_line_error(corral("node", "list")) == \
        f"corral: cannot reach the registry at {REG}: connection refused"


def test_a_server_error_is_one_line(mock):
    mock.get(f"{SCHED}/jobs/job-7", json={"error": "internal error"}, status=500)
    assert one_line_error(corral("job", "status", "job-7")) == \
        f"corral: cannot reach the scheduler at {SCHED}: HTTP 500"


# ---- several addresses of a server (replicas) -----------------------------------------------

SCHED_B = "http://sched-b.test"
REG_B = "http://reg-b.test"


def on_replicas(*args):
    env = {"CORRAL_ADDR": f"{SCHED}, sched-b.test", "CORRAL_REGISTRY_ADDR": f"{REG},{REG_B}/", "CORRAL_TOKEN": None}
    return CliRunner().invoke(cli, list(args), env=env, prog_name="corral")


def test_the_first_address_refused_the_command_goes_to_the_next(mock):
    mock.get(f"{SCHED}/jobs", body=requests.ConnectionError("[Errno 111] Connection refused"))
    mock.get(f"{SCHED_B}/jobs", json=[a_job()])
    mock.get(f"{REG}/nodes", body=requests.ConnectionError("[Errno 111] Connection refused"))
    mock.get(f"{REG_B}/nodes", json=[])
    listed = on_replicas("job", "list", "--json")
    assert listed.exit_code == 0, listed.output
    assert [j["job_id"] for j in json.loads(listed.stdout)] == ["job-7"]
    assert on_replicas("node", "list", "--json").stdout.strip() == "[]"


def test_job_run_sends_one_idempotency_key_to_every_address_it_tries(mock):
    mock.post(f"{SCHED}/jobs", body=requests.ReadTimeout("read timed out"))
    mock.post(f"{SCHED_B}/jobs", json=a_job(), status=200)  # the job the first one created
    result = on_replicas("job", "run", "--", "true")
    assert result.exit_code == 0 and result.stdout == "job-7\n", result.output
    first, resent = (call.request.headers["Idempotency-Key"] for call in mock.calls)
    assert first == resent


def test_every_address_down_is_one_line_naming_each(mock):
    mock.get(f"{SCHED}/jobs/job-7", body=requests.ConnectionError("[Errno 111] Connection refused"))
    mock.get(f"{SCHED_B}/jobs/job-7", json={"error": "internal error"}, status=500)
    assert one_line_error(on_replicas("job", "status", "job-7")) == \
        f"corral: cannot reach the scheduler at {SCHED} (connection refused), {SCHED_B} (HTTP 500)"
    mock.get(f"{REG}/nodes", body=requests.ConnectionError("[Errno 111] Connection refused"))
    mock.get(f"{REG_B}/nodes", body=requests.ConnectionError("[Errno 111] Connection refused"))
    assert one_line_error(on_replicas("node", "list")) == \
        f"corral: cannot reach the registry at {REG} (connection refused), {REG_B} (connection refused)"


def test_an_address_list_without_an_address_is_refused():
    result = CliRunner().invoke(cli, ["--addr", " , ", "job", "list"], prog_name="corral")
    assert result.exit_code == 2 and "no address in ' , '" in result.stderr


def test_404_gives_the_apis_error_text(mock):
    mock.get(f"{SCHED}/jobs/job-9", json={"error": "no job 'job-9'"}, status=404)
    assert one_line_error(corral("job", "status", "job-9")) == "corral: job-9: no job 'job-9'"


def test_409_gives_the_apis_error_text(mock):
    message = "job-7 is already done; only pending or running jobs can be cancelled"
    mock.post(f"{SCHED}/jobs/job-7/cancel", json={"error": message}, status=409)
    assert one_line_error(corral("job", "cancel", "job-7")) == f"corral: {message}"  # the id once


def test_a_400_on_submit_is_one_line(mock):
    mock.post(f"{SCHED}/jobs", json={"error": "'memory_mb' must be at most 65536"}, status=400)
    assert one_line_error(corral("job", "run", "--memory-mb", "99999999", "--", "true")) == \
        "corral: 'memory_mb' must be at most 65536"


def test_the_token_goes_to_both_servers(mock):
    mock.get(f"{SCHED}/jobs", json=[], match=[matchers.header_matcher({"Authorization": "Bearer t0k"})])
    mock.get(f"{REG}/nodes", json=[], match=[matchers.header_matcher({"Authorization": "Bearer t0k"})])
    assert corral("job", "list", token="t0k").exit_code == 0
    assert corral("--token", "t0k", "node", "list").exit_code == 0


def test_addresses_from_flags_win_and_may_omit_the_scheme(mock):
    mock.get("http://10.0.0.1:9001/jobs", json=[])
    result = corral("--addr", "10.0.0.1:9001", "job", "list")
    assert result.exit_code == 0 and result.stderr == "no jobs\n"


# ---- nodes and services ---------------------------------------------------------------------

NODES = [{"node_id": "node-1", "address": "10.0.0.5", "kind": "compute", "slots": 4, "running": 1,
          "labels": {"zone": "a"}, "status": "healthy", "last_heartbeat": iso(2), "drained": True},
         {"node_id": "node-2", "address": "10.0.0.6", "kind": "compute", "slots": 2, "running": 0,
          "labels": {}, "status": "unhealthy", "last_heartbeat": iso(600), "drained": False}]


def test_node_list_is_a_table_with_a_drained_column(mock):
    mock.get(f"{REG}/nodes", json=NODES)
    result = corral("node", "list")
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "ADDRESS", "SLOTS", "RUNNING", "LABELS", "HEARTBEAT", "DRAINED"]
    assert lines[1].split() == ["node-1", "healthy", "10.0.0.5", "4", "1", "zone=a", "2s", "ago", "yes"]
    assert lines[2].split() == ["node-2", "unhealthy", "10.0.0.6", "2", "0", "-", "10m", "ago", "no"]


def test_node_list_without_the_drained_field_has_no_drained_column(mock):
    mock.get(f"{REG}/nodes", json=[{k: v for k, v in n.items() if k != "drained"} for n in NODES],
             match=[matchers.query_param_matcher({"status": "healthy"})])
    result = corral("node", "list", "--status", "healthy")
    assert result.exit_code == 0
    assert "DRAINED" not in result.stdout


def test_node_list_shows_a_node_that_takes_no_new_work_and_says_why(mock):
    low = "only 812 MB free on the filesystem of /var/lib/corral/work, under AGENT_MIN_FREE_DISK_MB (1024 MB)"
    mock.get(f"{REG}/nodes", json=[dict(NODES[0], drained=False, refusing_work=low),
                                   dict(NODES[1], refusing_work=None)])
    result = corral("node", "list")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[1].split() == ["node-1", "healthy", "(no", "new", "work)", "10.0.0.5", "4", "1", "zone=a", "2s",
                                "ago", "no"]
    assert lines[2].split()[:2] == ["node-2", "unhealthy"]
    assert f"\nnode-1 takes no new work: {low}\n" in "\n" + result.stderr
    assert "node-2 takes" not in result.stderr


def test_node_list_json(mock):
    mock.get(f"{REG}/nodes", json=NODES)
    assert json.loads(corral("node", "list", "--json").stdout) == NODES


@pytest.mark.parametrize("action, drained, said", [("drain", True, "node-1: drained"),
                                                   ("undrain", False, "node-1: undrained")])
def test_drain_and_undrain(mock, action, drained, said):
    # Through the scheduler, which holds the drain for placement from its answer on.
    mock.post(f"{SCHED}/nodes/node-1/{action}", json={"node_id": "node-1", "drained": drained},
              match=[matchers.header_matcher({"Authorization": "Bearer t"})])
    result = corral("node", action, "node-1", token="t")
    assert result.exit_code == 0 and result.stdout.startswith(said)
    assert json.loads(corral("node", action, "node-1", "--json", token="t").stdout)["drained"] is drained


def test_a_drain_with_a_deadline_says_when_what_the_node_runs_is_stopped(mock):
    mock.post(f"{SCHED}/nodes/node-1/drain", json={"node_id": "node-1", "drained": True, "stopping": 3,
                                                    "deadline": "2026-11-29T12:10:00.000Z"},
              match=[matchers.json_params_matcher({"deadline_secs": 600})])
    result = corral("node", "drain", "node-1", "--deadline", "10m")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("node-1: drained (no new jobs go to it; the 3 it runs are stopped and requeued at")
    assert one_line_error(corral("node", "drain", "node-1", "--deadline", "soon"), code=2).startswith(
        "corral: --deadline 'soon'")


def test_drain_an_unknown_node(mock):
    mock.post(f"{SCHED}/nodes/nope/drain", json={"error": "no node 'nope'"}, status=404)
    assert one_line_error(corral("node", "drain", "nope")) == "corral: nope: no node 'nope'"


def test_service_list(mock):
    services = [{"job_id": "job-7", "name": "web", "node_id": "node-1", "address": "10.0.0.5", "port": 8080,
                 "healthy": True, "checked_at": iso(3), "registered_at": iso(100)}]
    mock.get(f"{REG}/services", json=services, match=[matchers.query_param_matcher({"healthy": "true"})])
    result = corral("service", "list", "--healthy")
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "JOB", "NODE", "ADDRESS", "PORT", "HEALTH", "CHECKED"]
    assert lines[1].split() == ["web", "job-7", "node-1", "10.0.0.5", "8080", "healthy", "3s", "ago"]
    assert json.loads(corral("service", "list", "--healthy", "--json").stdout) == services


def test_colour_only_on_a_terminal(mock, monkeypatch):
    mock.get(f"{REG}/nodes", json=NODES)
    monkeypatch.setattr(fmt, "stdout_console", lambda: fmt.Console(force_terminal=True, color_system="standard",
                                                                   width=200, highlight=False))
    result = corral("node", "list")
    assert "\x1b[" in result.stdout


# ---- the real console script against a real cluster -----------------------------------------

@pytest.mark.e2e
def test_the_console_script_runs_a_job_on_a_real_cluster(cluster):
    cluster.start_agent("node-1")
    cluster.wait_nodes_healthy("node-1")
    corral_bin = os.path.join(os.path.dirname(sys.executable), "corral")
    env = dict(os.environ, CORRAL_ADDR=cluster.scheduler_url, CORRAL_REGISTRY_ADDR=cluster.registry_url)
    run = subprocess.run([corral_bin, "job", "run", "--wait", "--", "echo", "hi"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "hi\n"
    assert "job-1: done (exit code 0" in run.stderr
    failing = subprocess.run([corral_bin, "job", "run", "--wait", "--max-retries", "0", "--", "sh", "-c", "exit 3"],
                             env=env, capture_output=True, text=True, timeout=30)
    assert failing.returncode == 3, failing.stderr
    listed = subprocess.run([corral_bin, "job", "list", "--json"], env=env, capture_output=True, text=True,
                            timeout=30)
    assert [j["job_id"] for j in json.loads(listed.stdout)] == ["job-2", "job-1"]
    nodes = subprocess.run([corral_bin, "node", "list"], env=env, capture_output=True, text=True, timeout=30)
    assert "node-1" in nodes.stdout and "healthy" in nodes.stdout


# ---- the client calls the CLI added to shared/clients.py ------------------------------------

def test_client_additions(mock):
    from corral.shared.clients import Rejected, SchedulerClient, Unreachable
    client = SchedulerClient(SCHED, token="t")
    mock.get(f"{SCHED}/jobs/a%2F..%2Fb", json={"error": "no job 'a/../b'"}, status=404)
    with pytest.raises(Rejected):
        client.get_job("a/../b")  # an id stays one path segment
    mock.get(f"{SCHED}/jobs", json=[a_job()])
    assert client.list_jobs_page(limit=5) == ([a_job()], None)  # no Link: the last page
    mock.get(f"{SCHED}/jobs/job-1/events", body=requests.ConnectionError("Connection refused"))
    with pytest.raises(Unreachable) as err:
        client.job_events("job-1")
    assert (err.value.base_url, err.value.reason) == (SCHED, "connection refused")
    assert str(err.value) == f"GET {SCHED}/jobs/job-1/events: connection refused"
    mock.post(f"{SCHED}/jobs", json=a_job(), status=201)
    client.submit({"command": "true"})
    key = mock.calls[-1].request.headers["Idempotency-Key"]  # one of its own: safe to resend
    client.submit({"command": "true"})
    assert mock.calls[-1].request.headers["Idempotency-Key"] != key  # another submit, another key
    assert mock.calls[-1].request.headers["Authorization"] == "Bearer t"


# ---- every command through click's runner against a real, token-protected cluster -----------

OPERATOR = "cli-test-operator-token-0123456789"
AGENT = "cli-test-agent-token-9876543210"


@pytest.mark.e2e
def test_every_command_against_a_real_scheduler_with_tokens(tmp_path, monkeypatch):
    import time

    from cluster import Cluster
    from helpers import wait_for

    from corral.shared.credentials import node_token
    monkeypatch.setattr(common, "clock", time.time)   # real time: the jobs really run
    monkeypatch.setattr(common, "sleep", time.sleep)
    tokens = {"CORRAL_API_TOKEN": OPERATOR, "CORRAL_AGENT_TOKEN": AGENT}
    c = Cluster(tmp_path)
    try:
        c.start_registry(**tokens)
        c.start_scheduler(**tokens)
        c.start_agent("cli-node", slots=2, CORRAL_NODE_TOKEN=node_token(AGENT, "cli-node"))

        def run(*args, token=OPERATOR):
            env = {"CORRAL_ADDR": c.scheduler_url, "CORRAL_REGISTRY_ADDR": c.registry_url, "CORRAL_TOKEN": token,
                   "FORCE_COLOR": None, "NO_COLOR": None, "TTY_COMPATIBLE": None}
            return CliRunner().invoke(cli, list(args), env=env, prog_name="corral")

        def as_json(*args):
            args = list(args)
            at = args.index("--") if "--" in args else len(args)  # options go before the command
            result = run(*args[:at], "--json", *args[at:])
            assert result.exit_code == 0, result.output
            return json.loads(result.stdout)

        wait_for(lambda: any(n["node_id"] == "cli-node" and n["status"] == "healthy" for n in as_json("node", "list")),
                 timeout=30, message="the node to be healthy")
        assert "token is not valid" in one_line_error(run("job", "list", token="not-the-token"))
        done = run("job", "run", "--wait", "--env", "WHO=cli", "--", "sh", "-c", "echo hello $WHO")
        assert done.exit_code == 0 and done.stdout == "hello cli\n", done.output
        assert run("job", "run", "--wait", "--max-retries", "0", "--", "sh", "-c", "exit 4").exit_code == 4
        listed = as_json("job", "list")
        assert [(j["job_id"], j["status"]) for j in listed] == [("job-2", "failed"), ("job-1", "done")]
        assert [j["job_id"] for j in as_json("job", "list", "--status", "failed")] == ["job-2"]
        status = as_json("job", "status", "job-1")
        assert (status["node_id"], status["exit_code"], status["env_vars"]) == ("cli-node", 0, {"WHO": "cli"})
        assert run("job", "logs", "job-1").stdout == "hello cli\n"
        table = run("job", "status", "job-2")
        assert table.exit_code == 0 and "failed" in table.stdout and "exit code 4" in table.stdout
        # retry the failed one (it fails again: a fresh attempt), cancel a long one
        assert as_json("job", "retry", "job-2")["status"] in ("pending", "running")  # a waiting claim is quick
        wait_for(lambda: as_json("job", "status", "job-2")["status"] == "failed", timeout=30,
                 message="the retried job to fail again")
        assert as_json("job", "status", "job-2")["attempt"] == 2
        long = as_json("job", "run", "--", "sleep", "60")
        wait_for(lambda: run("job", "list", "--json", "--status", "running").stdout.count(long["job_id"]) == 1,
                 timeout=30, message="the long job to run")
        assert run("job", "cancel", long["job_id"]).exit_code == 0
        wait_for(lambda: long["job_id"] in run("job", "list", "--json", "--status", "cancelled").stdout,
                 timeout=30, message="the job to be cancelled")
        # drain: no new work for the node; undrain: work again
        assert run("node", "drain", "cli-node").exit_code == 0
        assert any(n["node_id"] == "cli-node" and n["drained"] for n in as_json("node", "list"))
        operator = {"Authorization": f"Bearer {OPERATOR}"}
        wait_for(lambda: all(n["drained"] for n in requests.get(c.scheduler_url + "/nodes", headers=operator,
                                                                timeout=5).json()),
                 timeout=30, message="the scheduler to see the drain")
        parked = as_json("job", "run", "--", "true")
        assert as_json("job", "status", parked["job_id"])["node_id"] is None  # nowhere to go while drained
        assert run("node", "undrain", "cli-node").exit_code == 0
        wait_for(lambda: as_json("job", "status", parked["job_id"])["status"] == "done", timeout=30,
                 message="the parked job to run once the node is undrained")
        assert as_json("service", "list") == []
    finally:
        c.stop()
