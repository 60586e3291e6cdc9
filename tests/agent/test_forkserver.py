"""agent/forkserver.py and agent/spawner.py with real processes: a job's process is
cloned by the fork server as this process's child and set up with system calls (its
session, cgroup, namespaces, private /tmp and /dev, the drop to its uid, exactly its
environment, no inherited descriptor), then execs its shell once; a start that cannot
enter its work dir or run its shell fails as Popen's would, a set-up step that fails
ends the job as the chain's stage would."""
import os
import subprocess

import pytest

from corral.agent import cgroups, forkserver, launch, runner, spawner
from helpers import process_gone, wait_for

pytestmark = pytest.mark.root

UID = 70123


@pytest.fixture(scope="module")
def server():
    if os.geteuid() != 0:
        pytest.skip("needs root: the fork server sets up jobs as the agent does")
    started = forkserver.ForkServer.start()
    try:
        yield started
    finally:
        started.close()


def run(server, spec, stdin_data=None):
    """Start `spec`; (exit code, stdout, stderr)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        pid = server.spawn(spec, out_w, err_w)
    finally:
        os.close(out_w)
        os.close(err_w)
    with open(out_r, "rb") as out, open(err_r, "rb") as err:
        stdout, stderr = out.read().decode(), err.read().decode()
    return forkserver.ForkedProcess(pid).wait(timeout=30), stdout, stderr


def spec(command, workdir="/", env=None, **fields):
    return forkserver.Spec(command=command, workdir=workdir, env=env if env is not None else {"PATH": "/usr/bin:/bin"},
                           **fields)


def test_the_job_is_a_child_of_this_process_with_exactly_its_environment(server):
    code, out, _ = run(server, spec('echo "$PPID $A"; env | sort', env={"A": "one two", "PATH": "/usr/bin:/bin"}))
    assert code == 0
    first, *env = out.splitlines()
    assert first == f"{os.getpid()} one two"
    assert {line.split("=", 1)[0] for line in env} <= {"A", "PATH", "PWD", "SHLVL", "_", "OLDPWD"}


def test_the_job_leads_its_own_session_with_empty_stdin_and_no_other_descriptor(server, tmp_path):
    code, out, _ = run(server, spec("ps -o sid=,pgid= -p $$; wc -c < /dev/stdin; ls /proc/self/fd | sort -n",
                                    workdir=str(tmp_path)))
    assert code == 0
    session, size, *fds = out.split("\n")
    sid, pgid = session.split()
    assert sid == pgid  # the shell leads its session and group: a group kill reaches every process
    assert size.strip() == "0"
    assert sorted(int(fd) for fd in fds if fd) == [0, 1, 2, 3]  # 3: ls's own listing of /proc/self/fd


def test_the_job_runs_as_its_uid_with_no_way_back_to_root(server, tmp_path):
    os.chmod(tmp_path, 0o777)
    code, out, _ = run(server, spec("id -u; id -g; id -G; grep -E '^(CapBnd|NoNewPrivs|CapEff)' /proc/self/status",
                                    workdir=str(tmp_path), uid=UID, gid=UID, groups=(UID,)))
    assert code == 0, out
    lines = out.splitlines()
    assert lines[:3] == [str(UID), str(UID), str(UID)]
    status = dict(line.split(":\t") for line in lines[3:])
    assert status == {"CapEff": "0000000000000000", "CapBnd": "0000000000000000", "NoNewPrivs": "1"}


def test_a_private_tmp_and_dev_are_the_jobs_alone(server, tmp_path):
    marker = "/tmp/corral-forkserver-host-marker"
    open(marker, "w").close()
    try:
        code, out, err = run(server, spec(
            "ls -A /tmp; echo mine > /tmp/x && cat /tmp/x; ls /dev; stat -c %a /dev/shm; "
            "grep -c ' /tmp tmpfs ' /proc/self/mounts", uid=UID, gid=UID,
            private_dirs=launch.private_dirs(), tmp_size_mb=8, dev_nodes=("null:1:3:666", "nvidia0:195:0:666")))
        assert code == 0, err
        lines = out.split()
        assert "corral-forkserver-host-marker" not in lines and "mine" in lines
        assert {"null", "nvidia0", "fd", "stdin", "stdout", "stderr", "pts", "shm"} <= set(lines)
        assert "sda" not in lines and "1777" in lines and lines[-1] == "1"
        assert not os.path.exists("/tmp/x")  # the job's /tmp went with it
    finally:
        os.unlink(marker)


def test_the_job_joins_its_cgroup_before_its_first_instruction(server):
    manager = cgroups.detect(root_name=f"corral-forkserver-{os.getpid()}")
    if not manager.enforced:
        pytest.skip(f"needs cgroups: {manager.reason}")
    cg = manager.create("fs-join", 64, 100, 16)
    try:
        code, out, _ = run(server, spec("cat /proc/self/cgroup", join_files=tuple(cg.join_files()),
                                        cgroup_dir=cg.paths()[0] if cg.mode == "v2" else None))
        assert code == 0
        assert all(path.rstrip("/").split("/")[-1] == "fs-join" for path in cg.paths())
        assert "/fs-join" in out
    finally:
        cg.kill()
        cg.remove()
        manager.cleanup()


def test_a_work_dir_that_cannot_be_entered_or_a_missing_shell_fails_the_start(server, tmp_path):
    with pytest.raises(forkserver.SpawnError) as info:
        run(server, spec("true", workdir=str(tmp_path / "missing")))
    assert info.value.stage == spawner.STAGE_WORKDIR
    with pytest.raises(forkserver.SpawnError) as info:
        run(server, spec("true", shell=str(tmp_path / "no-such-shell")))
    assert info.value.stage == spawner.STAGE_EXEC
    assert run(server, spec("exit 4"))[0] == 4  # the server goes on serving


def test_a_cgroup_that_cannot_be_joined_ends_the_job_as_the_chains_stage_would(server, tmp_path):
    code, _, err = run(server, spec("echo ran", join_files=(str(tmp_path / "gone" / "cgroup.procs"),)))
    assert code == launch.SETUP_FAILED_EXIT
    assert launch.setup_failed(code, err) and launch.JOIN_FAILED_MESSAGE in err


def test_the_runner_starts_jobs_through_the_server_and_kills_their_whole_group(server, tmp_path):
    runner.use_fork_server(server)
    try:
        job = runner.start({"command": "sleep 60 & echo started; wait"}, str(tmp_path), {"PATH": "/usr/bin:/bin"},
                           1000)
        wait_for(lambda: job.output_tails()[0] == "started\n", message="the job to start")
        assert job.poll() is None
        job.kill(1.0)
        result = job.result()
        assert result.exit_code < 0 and result.stdout == "started\n"
        group = subprocess.run(["pgrep", "-g", str(job.pgid)], capture_output=True, text=True).stdout.split()
        assert all(process_gone(int(pid)) for pid in group), group  # nothing of the group runs
        with pytest.raises(runner.StartError) as info:
            runner.start({"command": "true"}, str(tmp_path / "missing"), {}, 100)
        assert info.value.exit_code == -1 and "missing" in str(info.value)
    finally:
        runner.use_fork_server(None)
