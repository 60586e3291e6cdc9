"""The agent's subprocess seam against real processes: output, environment, kill."""
import os
import signal

import pytest

from corral.agent import jobenv, launch, runner
from helpers import process_gone, wait_for


def start(tmp_path, command, tail_bytes=4096, env_vars=None, agent_env=None, **job):
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    job = {"job_id": "job-7", "command": command, "env_vars": env_vars or {}, **job}
    env = jobenv.build(job, jobenv.from_agent(agent_env if agent_env is not None else os.environ),
                       {"HOME": str(workdir)},
                       {"CORRAL_JOB_ID": "job-7", "CORRAL_NODE_ID": "node-1", "CORRAL_ATTEMPT": "2"})
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


def test_environment_and_working_directory(tmp_path):
    agent_env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "LC_TIME": "C", "TZ": "UTC",
                 "FROM_AGENT_ENV": "not for jobs", "AWS_SECRET_ACCESS_KEY": "secret",
                 "CORRAL_AGENT_TOKEN": "secret", "CORRAL_STATE_DIR": "/var/lib/corral"}
    command = ('echo "$STAGE|$CORRAL_JOB_ID|$CORRAL_NODE_ID|$CORRAL_ATTEMPT|${FROM_AGENT_ENV:-none}|'
               '${AWS_SECRET_ACCESS_KEY:-none}|${CORRAL_AGENT_TOKEN:-none}|${CORRAL_STATE_DIR:-none}|'
               '$LANG|$LC_TIME|$TZ|$HOME"; pwd -P')
    result = start(tmp_path, command, env_vars={"STAGE": "prod", "CORRAL_JOB_ID": "spoofed", "HOME": "/h"},
                   agent_env=agent_env).result()
    first, cwd = result.stdout.splitlines()
    # The job's own variables may replace HOME, never the agent's CORRAL_* ones.
    assert first == "prod|job-7|node-1|2|none|none|none|none|C.UTF-8|C|UTC|/h"
    assert cwd == os.path.realpath(tmp_path / "work")


def test_the_job_process_has_exactly_its_environment_and_no_extra_descriptor(tmp_path):
    value = "it's $HOME `id` \\ \"q\"\nsecond line; $(touch pwned)"
    # The shell's descriptors are listed by a plain child: for a pipeline or a redirection
    # the shell itself holds extra descriptors for a moment, which the listing may see.
    command = "cat /proc/$$/environ; echo; ls /proc/$$/fd; echo ---; ls"
    result = start(tmp_path, command, env_vars={"ODD": value, "EMPTY": ""},
                   agent_env={"PATH": os.environ["PATH"]}).result()
    assert result.exit_code == 0, result
    environ, listing = result.stdout.rsplit("\x00", 1)
    assert dict(item.split("=", 1) for item in environ.split("\x00")) == {
        "PATH": os.environ["PATH"], "HOME": str(tmp_path / "work"), "ODD": value, "EMPTY": "",
        "CORRAL_JOB_ID": "job-7", "CORRAL_NODE_ID": "node-1", "CORRAL_ATTEMPT": "2"}
    fds, files = listing.split("---\n", 1)
    assert fds.split() == ["0", "1", "2"]  # the environment's memfd is not inherited
    assert "pwned" not in files  # nothing in a value was evaluated


def test_the_job_process_keeps_its_command_line(tmp_path):
    command = "tr '\\0' '|' < /proc/$$/cmdline"
    assert start(tmp_path, command).result().stdout == f"/bin/sh|-c|{command}|"


def test_stdin_is_empty(tmp_path):
    assert start(tmp_path, "cat; echo end").result().stdout == "end\n"


@pytest.mark.slow
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
    monkeypatch.setattr(launch, "SHELL", str(tmp_path / "no-such-shell"))
    with pytest.raises(runner.StartError) as info:
        runner.start({"job_id": "job-1", "command": "true"}, str(tmp_path), {}, 100)
    assert info.value.exit_code == 127


@pytest.mark.parametrize("env", [{"A=B": "x"}, {"A;touch x": "y"}, {"A": "nul\x00byte"}])
def test_bad_environment_is_a_start_error(tmp_path, env):
    job = {"job_id": "job-1", "command": "true"}
    with pytest.raises(runner.StartError):
        runner.start(job, str(tmp_path), env, 100)
    assert os.listdir(tmp_path) == []


def test_the_job_environment_is_an_allowlist():
    agent = {"PATH": "/bin", "LANG": "C", "LC_ALL": "C", "TZ": "UTC", "HOME": "/root", "USER": "root",
             "AWS_ACCESS_KEY_ID": "AKIA", "FOO": "foo", "CORRAL_AGENT_TOKEN": "t", "CORRAL_NODE_TOKEN": "t",
             "CORRAL_STATE_DIR": "/var/lib/corral", "LD_PRELOAD": "/x.so"}
    assert jobenv.from_agent(agent) == {"PATH": "/bin", "LANG": "C", "LC_ALL": "C", "TZ": "UTC"}
    assert jobenv.from_agent(agent, ["FOO", "CORRAL_NODE_TOKEN"])["FOO"] == "foo"
    assert "CORRAL_NODE_TOKEN" not in jobenv.from_agent(agent, ["CORRAL_NODE_TOKEN"])
    env = jobenv.build({"env_vars": {"PATH": "/mine", "HOME": "/h", "PORT": "1", "CORRAL_NODE_ID": "x"}},
                       jobenv.from_agent(agent), {"HOME": "/w", "USER": "u"},
                       {"CORRAL_JOB_ID": "job-1", "CORRAL_NODE_ID": "n", "PORT": "8080"})
    assert env == {"PATH": "/mine", "LANG": "C", "LC_ALL": "C", "TZ": "UTC", "HOME": "/h", "USER": "u",
                   "CORRAL_JOB_ID": "job-1", "CORRAL_NODE_ID": "n", "PORT": "8080"}
    with pytest.raises(ValueError):  # every variable the agent sets is listed in jobenv
        jobenv.build({}, {}, {"AWS_REGION": "x"}, {})


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_AUDIT"])
def test_loader_variables_in_env_vars_are_refused(name):
    with pytest.raises(jobenv.JobEnvError, match=name):
        jobenv.job_vars({"env_vars": {"A": "1", name: "/tmp/x.so"}})


def test_passthrough_cannot_name_tokens_or_loader_variables():
    assert jobenv.passthrough_problem("FOO") is None
    for name in ("CORRAL_AGENT_TOKEN", "CORRAL_NODE_TOKEN", "LD_PRELOAD", "LD_AUDIT", "A-B"):
        assert jobenv.passthrough_problem(name), name


def test_a_gang_member_is_told_its_place_in_the_names_torchrun_and_mpi_read():
    place = {"gang_id": "job-7", "size": 3, "rank": 1, "hosts": ["10.0.0.1", "10.0.0.2", "10.0.0.3"],
             "master_addr": "10.0.0.1", "master_port": 29501}
    told = jobenv.gang_vars(place)
    assert told == {"CORRAL_GANG_ID": "job-7", "CORRAL_GANG_SIZE": "3", "CORRAL_GANG_RANK": "1",
                    "CORRAL_GANG_HOSTS": "10.0.0.1,10.0.0.2,10.0.0.3", "MASTER_ADDR": "10.0.0.1",
                    "MASTER_PORT": "29501", "WORLD_SIZE": "3", "RANK": "1", "NODE_RANK": "1"}
    # The agent's values win over the job's own env_vars of the same names.
    env = jobenv.build({"env_vars": {"MASTER_PORT": "1", "RANK": "9"}}, {}, {}, told)
    assert (env["MASTER_PORT"], env["RANK"]) == ("29501", "1")
    assert jobenv.gang_vars(None) == {}  # a job of one node is told nothing of gangs
    for broken in ({"rank": 1}, dict(place, master_port="x"), dict(place, hosts=None),
                   dict(place, gang_id="job-7\x00")):
        with pytest.raises(jobenv.JobEnvError):
            jobenv.gang_vars(broken)


def test_a_warm_chain_runs_its_job_in_the_work_dir_below_where_it_waits(tmp_path):
    """The chain waits in the work dirs' directory and enters the job's by a relative
    path (the job's user may not be able to search the directories above)."""
    workdir = tmp_path / "job-1-1"
    workdir.mkdir()
    (workdir / "in.txt").write_text("hello\n")
    warm = runner.start_warm(65536, cwd=str(tmp_path))
    try:
        result = warm.launch("cat in.txt; pwd", str(workdir), {"PATH": launch.LAUNCH_PATH}).result()
    finally:
        warm.discard()
    assert (result.exit_code, result.stdout, result.stderr) == (0, f"hello\n{workdir}\n", "")
