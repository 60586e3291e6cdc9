"""The end of a job from the command line: `--signal SIG@DURATION` (a warning before the
timeout), `--kill-signal` and `--kill-grace` on every command that makes a job, the
bodies checked against the contract's JobRequest; and `deadline`, `signal_before_end`,
`kill_signal`, `kill_grace_secs` and `ended_by` in `corral job status` and in the line a
followed job ends with. Against the `responses` mock."""
import json
import re

import pytest

from cli_support import NOW, SCHED, a_job, body_of, corral, iso, one_line_error
from corral.cli import format as fmt
from corral.cli import jobs, scheduling
from corral.scheduler.contract import JobRequest


# ---- reading the flags ----------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("USR1@60", {"signal": "USR1", "secs": 60}),
    ("USR1@60s", {"signal": "USR1", "secs": 60}),
    ("USR1@1m", {"signal": "USR1", "secs": 60}),
    ("SIGUSR2@1.5m", {"signal": "USR2", "secs": 90}),
    ("term@2h", {"signal": "TERM", "secs": 7200}),
    ("usr1@0.5", {"signal": "USR1", "secs": 0.5}),
])
def test_signal_before_end_is_read_as_slurm_writes_it(text, expected):
    assert scheduling.parse_signal_before_end(text) == expected
    JobRequest.check({"command": "x", "signal_before_end": expected})


@pytest.mark.parametrize("text", ["USR1", "USR1@", "@60", "USR1@0", "USR1@-5", "USR1@soon", "KILL@60",
                                  "STOP@60", "SIGNOPE@60", "USR1@60@1", "", "60"])
def test_bad_signals_before_end_are_refused(text):
    with pytest.raises(ValueError):
        scheduling.parse_signal_before_end(text)


@pytest.mark.parametrize("text, name", [("TERM", "TERM"), ("sigint", "INT"), ("SIGUSR1", "USR1"), (" hup ", "HUP")])
def test_kill_signals_are_read_with_or_without_sig(text, name):
    assert scheduling.parse_signal(text) == name


@pytest.mark.parametrize("text, secs", [("0", 0), ("0s", 0), ("30", 30), ("2m", 120), ("2.5", 2.5)])
def test_a_kill_grace_may_be_zero(text, secs):
    assert scheduling.parse_grace(text) == secs


# ---- the request bodies ---------------------------------------------------------------------

def test_job_run_sends_the_signals_of_its_end(mock):
    mock.post(f"{SCHED}/jobs", json=a_job(command="train"), status=201)
    result = corral("job", "run", "--timeout", "2h", "--signal", "USR1@60s", "--kill-signal", "SIGINT",
                    "--kill-grace", "30s", "--", "train")
    assert result.exit_code == 0, result.output
    sent = body_of(mock)
    assert sent == {"command": "train", "timeout_secs": 7200, "signal_before_end": {"signal": "USR1", "secs": 60},
                    "kill_signal": "INT", "kill_grace_secs": 30}
    JobRequest.check(sent)


def test_job_run_sends_a_zero_grace_and_no_signal_fields_unless_asked(mock):
    mock.post(f"{SCHED}/jobs", json=a_job(command="train"), status=201)
    assert corral("job", "run", "--kill-grace", "0", "--", "train").exit_code == 0
    assert body_of(mock) == {"command": "train", "kill_grace_secs": 0}
    assert corral("job", "run", "--", "train").exit_code == 0
    assert body_of(mock, 1) == {"command": "train"}


def test_an_array_takes_the_signals_too(mock):
    mock.post(f"{SCHED}/jobs", json={"array_id": "array-1", "count": 2, "parallel": 2, "first_job_id": "job-1",
                                     "last_job_id": "job-2"}, status=201)
    result = corral("job", "run", "--array", "2", "--signal", "USR2@5m", "--kill-signal", "TERM", "--", "train")
    assert result.exit_code == 0, result.output
    assert body_of(mock) == {"command": "train", "array": {"count": 2},
                             "signal_before_end": {"signal": "USR2", "secs": 300}, "kill_signal": "TERM"}


def test_schedule_add_takes_the_signals_for_its_job(mock):
    mock.post(f"{SCHED}/schedules", json={"name": "n", "enabled": False}, status=201)
    result = corral("schedule", "add", "n", "--every", "3600", "--disabled", "--signal", "USR1@1m",
                    "--kill-grace", "1m", "--", "train")
    assert result.exit_code == 0, result.output
    assert body_of(mock)["job"] == {"command": "train", "signal_before_end": {"signal": "USR1", "secs": 60},
                                    "kill_grace_secs": 60}


@pytest.mark.parametrize("value, says", [
    ("USR1", "give SIG@DURATION"),
    ("USR1@", "after '@', a duration"),
    ("USR1@soon", "after '@', a duration"),
    ("KILL@60", "a signal is one of TERM, INT"),
    ("@60", "a signal is one of"),
])
def test_a_bad_signal_is_one_line_with_exit_code_2_and_nothing_is_sent(mock, value, says):
    line = one_line_error(corral("job", "run", "--signal", value, "--", "train"), code=2)
    assert line.startswith(f"corral: --signal {value!r}: ") and says in line, line


@pytest.mark.parametrize("args", [
    ("schedule", "add", "n", "--every", "60", "--signal", "USR1-60", "--", "train"),
    ("job", "run", "--kill-signal", "KILL", "--", "train"),
    ("job", "run", "--kill-signal", "9", "--", "train"),
    ("job", "run", "--kill-grace", "-1", "--", "train"),
    ("job", "run", "--kill-grace", "soon", "--", "train"),
])
def test_bad_end_flags_anywhere_are_refused_before_sending(mock, args):
    flag = next(a for a in args if a.startswith("--") and a not in ("--every", "--"))
    assert one_line_error(corral(*args), code=2).startswith(f"corral: {flag} ")


def test_a_signal_not_before_the_timeout_is_refused_before_sending(mock):
    line = one_line_error(corral("job", "run", "--timeout", "1m", "--signal", "USR1@60", "--", "train"), code=2)
    assert line == "corral: --signal USR1@60s: it must come before the end, less than --timeout (60s)"


# ---- what `job status` and a followed job say -----------------------------------------------

def running_job(**fields) -> dict:
    return a_job(**{"status": "running", "running_at": iso(600), "timeout_secs": 3600, "deadline": iso(-3000),
                    "signal_before_end": {"signal": "USR1", "secs": 60}, "kill_signal": "TERM",
                    "kill_grace_secs": 10, "ended_by": None, "stdout": "", "stderr": "", **fields})


def test_job_status_shows_the_deadline_and_the_signals_of_its_end(mock):
    mock.get(f"{SCHED}/jobs/job-7", json=running_job())
    mock.get(f"{SCHED}/jobs/job-7/events", json=[])
    result = corral("job", "status", "job-7")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for line in (r"timeout_secs +1h00m", r"deadline +2026-11-29 12:50:00Z \(in 50m\)",
                 r"signal_before_end +USR1 60s before the end", r"kill_signal +TERM", r"kill_grace_secs +10s",
                 r"ended_by +-"):
        assert re.search(f"^{line}$", out, re.M), (line, out)


def test_job_status_of_a_finished_job_says_what_ended_it(mock):
    mock.get(f"{SCHED}/jobs/job-7", json=running_job(status="failed", deadline=None, signal_before_end=None,
                                                     kill_signal="INT", kill_grace_secs=0, exit_code=-1,
                                                     finished_at=iso(0), ended_by="timeout"))
    mock.get(f"{SCHED}/jobs/job-7/events", json=[])
    out = corral("job", "status", "job-7").stdout
    for line in (r"deadline +-", r"signal_before_end +-", r"kill_signal +INT", r"kill_grace_secs +0s",
                 r"ended_by +timeout"):
        assert re.search(f"^{line}$", out, re.M), (line, out)


@pytest.mark.parametrize("ended_by, words", [
    ("timeout", "timed out after 1h00m"), ("preemption", "preempted"), ("node_lost", "its node was lost"),
    ("oom", "out of memory"), ("exit", None), (None, None),
])
def test_a_followed_job_ends_with_what_ended_it(ended_by, words):
    line = jobs.progress(running_job(status="failed", exit_code=-1, finished_at=iso(0), ended_by=ended_by), NOW)
    if words:
        assert f"exit code -1, {words}, ran 10m00s" in line
    else:
        assert line == "job-7: failed (exit code -1, ran 10m00s, on node-1)"


def test_out_of_memory_is_said_once():
    line = jobs.progress(running_job(status="failed", exit_code=137, finished_at=iso(0), ended_by="oom",
                                     oom_killed=True), NOW)
    assert line.count("out of memory") == 1


def test_short_spans_read_in_seconds_long_ones_as_durations():
    assert [fmt.seconds(s) for s in (60, 1.5, 600, 7200, None)] == ["60s", "1.5s", "600s", "2h00m", "-"]


def test_job_run_not_preemptible_says_so_in_the_request_and_status_shows_preemptions(mock):
    mock.post(f"{SCHED}/jobs", json=a_job(command="train"), status=201)
    result = corral("job", "run", "--not-preemptible", "--", "train")
    assert result.exit_code == 0, result.output
    sent = body_of(mock)
    assert sent == {"command": "train", "preemptible": False}
    JobRequest.check(sent)
    mock.post(f"{SCHED}/jobs", json=a_job(command="etl"), status=201)
    corral("job", "run", "--", "etl")
    assert "preemptible" not in json.loads(mock.calls[-1].request.body)
    mock.get(f"{SCHED}/jobs/job-7", json=a_job(preemptible=True, preemptions=2, ended_by="preemption"))
    mock.get(f"{SCHED}/jobs/job-7/events", json=[])
    shown = corral("job", "status", "job-7").stdout
    assert re.search(r"preemptions\s+2", shown) and re.search(r"ended_by\s+preemption", shown), shown
