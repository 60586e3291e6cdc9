"""The agent's subprocess seam against real processes: output, environment, kill."""
import os
import signal

import pytest

from corral.agent import runner
from helpers import process_gone, wait_for


def start(tmp_path, command, tail_bytes=4096, env_vars=None, extra=None, **job):
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    job = {"job_id": "job-7", "command": command, "env_vars": env_vars or {}, **job}
    env = runner.build_environment(job, extra or {"CORRAL_NODE_ID": "node-1", "CORRAL_ATTEMPT": "2"})
    return runner.start(job, str(workdir), env, tail_bytes)


@pytest.fixture
def jobs():
    """Every job a test starts is killed at teardown, even when the test fails."""
    started = []
    yield started
    for job in started:
        job.kill(0)


def test_output_and_exit_code(tmp_path):
    job = start(tmp_path, "echo out; echo err >&2; exit 3")
    result = job.result()
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert job.poll() == 3


def test_poll_is_none_while_running(tmp_path, jobs):
    job = start(tmp_path, "read line < /dev/null; sleep 30")
    jobs.append(job)
    assert job.poll() is None
    job.kill(1)
    assert job.poll() is not None


def test_killed_by_signal_is_negative(tmp_path):
    assert start(tmp_path, "kill -9 $$").result().exit_code == -signal.SIGKILL


def test_tail_is_bounded_and_keeps_the_end(tmp_path):
    # 1 MiB on each stream, then a last line: only the last 1000 bytes are kept.
    command = ("head -c 1048576 /dev/zero | tr '\\0' x; echo; echo LAST-OUT; "
               "(head -c 1048576 /dev/zero | tr '\\0' y; echo; echo LAST-ERR) >&2")
    result = start(tmp_path, command, tail_bytes=1000).result()
    assert result.exit_code == 0
    assert len(result.stdout) == 1000 and result.stdout.endswith("x\nLAST-OUT\n")
    assert len(result.stderr) == 1000 and result.stderr.endswith("y\nLAST-ERR\n")


def test_tail_buffer_does_not_start_with_half_a_character():
    tail = runner.TailBuffer(4)
    tail.write("aé€".encode())  # 1 + 2 + 3 bytes: the cut falls inside 'é'
    assert tail.text() == "€"
    small = runner.TailBuffer(10)
    small.write(b"abc")
    small.write(b"def")
    assert small.text() == "abcdef" and not small.truncated


def test_environment_and_working_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("FROM_AGENT_ENV", "inherited")
    monkeypatch.setenv("CORRAL_AGENT_TOKEN", "secret")
    command = ('echo "$STAGE|$CORRAL_JOB_ID|$CORRAL_NODE_ID|$CORRAL_ATTEMPT|$FROM_AGENT_ENV|'
               '${CORRAL_AGENT_TOKEN:-none}"; pwd -P')
    result = start(tmp_path, command, env_vars={"STAGE": "prod", "CORRAL_JOB_ID": "spoofed"}).result()
    first, cwd = result.stdout.splitlines()
    assert first == "prod|job-7|node-1|2|inherited|none"
    assert cwd == os.path.realpath(tmp_path / "work")


def test_stdin_is_empty(tmp_path):
    assert start(tmp_path, "cat; echo end").result().stdout == "end\n"


def test_kill_ends_the_whole_group_even_a_child_ignoring_term(tmp_path, jobs):
    command = "sh -c 'trap \"\" TERM; echo $$ > child.pid; while :; do sleep 1; done' & wait"
    job = start(tmp_path, command)
    jobs.append(job)
    pid_file = tmp_path / "work" / "child.pid"
    child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(),
                         timeout=5, message="the child to write its pid"))
    assert not process_gone(child)
    job.kill(grace=0.3)
    wait_for(lambda: process_gone(child), timeout=5, message="the TERM-ignoring child to die")
    assert job.poll() is not None
    job.kill(grace=0.3)  # already gone: must not raise
    assert job.result().exit_code < 0


def test_result_kills_what_the_job_left_behind(tmp_path):
    # The shell exits at once, leaving a background process holding the pipes.
    job = start(tmp_path, "sleep 60 & echo $! > bg.pid; echo started")
    result = job.result()
    assert (result.exit_code, result.stdout) == (0, "started\n")
    leftover = int((tmp_path / "work" / "bg.pid").read_text())
    wait_for(lambda: process_gone(leftover), timeout=5, message="the background process to die")


def test_missing_work_dir_is_a_start_error(tmp_path):
    job = {"job_id": "job-1", "command": "true"}
    with pytest.raises(runner.StartError) as info:
        runner.start(job, str(tmp_path / "missing"), {}, 100)
    assert info.value.exit_code == -1
    assert "missing" in str(info.value)


def test_missing_shell_is_exit_code_127(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "SHELL", str(tmp_path / "no-such-shell"))
    with pytest.raises(runner.StartError) as info:
        runner.start({"job_id": "job-1", "command": "true"}, str(tmp_path), {}, 100)
    assert info.value.exit_code == 127


def test_bad_environment_is_a_start_error(tmp_path):
    job = {"job_id": "job-1", "command": "true", "env_vars": {"A=B": "x"}}
    with pytest.raises(runner.StartError):
        runner.start(job, str(tmp_path), runner.build_environment(job, {}), 100)


def test_command_argv_leaves_room_for_a_launcher():
    assert runner.command_argv("echo hi") == ["/bin/sh", "-c", "echo hi"]
    assert runner.command_argv("echo hi", ["shim", "--"]) == ["shim", "--", "/bin/sh", "-c", "echo hi"]
