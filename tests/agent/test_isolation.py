"""Jobs that attack the node, the agent and each other, with real processes as root:
nothing of a job ever runs as root, a job cannot reach another job, the agent's
files or the agent's environment, each job has a uid and a /tmp of its own, and a
fork bomb stays inside its job.

A shared library whose constructor records getuid()/geteuid() (one file per process
and uid, in a directory every uid may write to) plays the attacker's code: it is
planted through a deploy zip or an earlier job's /tmp and named in LD_PRELOAD or
LD_AUDIT, also past every check above the runner. Needs root, cgroups, util-linux
(unshare, mount, setpriv) and gcc; CI runs as root and installs them.
"""
import json
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import textwrap
import uuid

import pytest
import requests

from corral.agent import artifacts, cgroups, identity, jobenv, launch, runner
from corral.agent.agent import Agent
from corral.agent.gpus import Gpu
from corral.agent.settings import AgentSettings
from corral.shared.timeutil import epoch
from corral.shared.clients import RegistryClient, SchedulerClient
from agent_support import BIN, PYTHON3, only_empty_slots
from cluster import world_traversable_dir
from helpers import serve_in_thread, stop_held_jobs, wait_for
from scheduler_double import REGISTRY, SCHEDULER
from zips import ZipHandler, file_entry, make_zip

pytestmark = pytest.mark.root

GCC = shutil.which("gcc")
# Who drops the job's privileges: the fork server's child itself, or the chain's setpriv,
# or its Python fallback for a node without setpriv.
CHAIN_SETPRIV = pytest.param("setpriv", marks=pytest.mark.chain_launch)
CHAIN_PYTHON = pytest.param("python", marks=pytest.mark.chain_launch)
UID_RANGE = (70000, 79999)
EVIL_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

/* Runs in every program the loader starts with this library preloaded (LD_PRELOAD)
   or as an auditor (LD_AUDIT): records who it ran as, one file per process and uid. */
__attribute__((constructor)) static void record(void) {
    char path[512], line[64];
    snprintf(path, sizeof path, "%s/%d-%d", RECORD_DIR, (int)getpid(), (int)geteuid());
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) return;
    int n = snprintf(line, sizeof line, "%d %d\n", (int)getuid(), (int)geteuid());
    if (write(fd, line, n) < 0) {}
    close(fd);
}

/* What makes the loader accept it as an auditor. */
unsigned int la_version(unsigned int version) { return version; }
"""


@pytest.fixture(autouse=True)
def _requirements():
    if os.geteuid() != 0:
        pytest.skip(f"needs root (euid {os.geteuid()})")
    manager = cgroups.detect(root_name="corral-probe", prepare=False)
    if not manager.enforced:
        pytest.skip(f"needs a writable cgroup hierarchy: {manager.reason}")
    tools = runner.tools()
    if None in (tools.unshare, tools.mount, tools.setpriv):
        pytest.skip("needs util-linux's unshare, mount and setpriv")
    if GCC is None:
        pytest.skip("needs gcc (and libc6-dev) to build the attacker's library")
    if PYTHON3 is None:
        pytest.skip("needs a python3 in /usr/local/bin, /usr/bin or /bin that any user can run")


@pytest.fixture
def records(shared_dir):
    """Where the attacker's library records who it ran as."""
    path = os.path.join(shared_dir, "records")
    os.mkdir(path)
    os.chmod(path, 0o1777)
    return path


@pytest.fixture
def evil_so(records, shared_dir):
    """The attacker's library, readable by every uid."""
    source = os.path.join(shared_dir, "evil.c")
    with open(source, "w") as f:
        f.write(EVIL_C)
    out = os.path.join(shared_dir, "evil.so")
    subprocess.run([GCC, "-shared", "-fPIC", "-O2", f'-DRECORD_DIR="{records}"', "-o", out, source],
                   check=True, capture_output=True, timeout=60)
    os.chmod(out, 0o644)
    return out


def recorded(records) -> list[tuple[int, int]]:
    """(uid, euid) of every process the library ran in."""
    found = []
    for name in os.listdir(records):
        with open(os.path.join(records, name)) as f:
            found += [tuple(int(x) for x in line.split()) for line in f if line.strip()]
    return found


# --- the runner and the preparation, with no check above them ------------------------------------

@pytest.fixture
def node_parts(state_dir):
    """What the agent prepares a job with: a cgroup manager, a uid per job, an fstab."""
    agent_dir = os.path.join(state_dir, "agent-x")
    os.makedirs(os.path.join(agent_dir, "work"), mode=0o711)
    os.chmod(agent_dir, 0o711)
    manager = cgroups.detect(root_name=f"corral-isolation-{uuid.uuid4().hex[:8]}")
    users = identity.job_users(uid_range=UID_RANGE, pool_path=os.path.join(agent_dir, "uids.json"), euid=0)
    fstab = launch.write_fstab(os.path.join(agent_dir, launch.FSTAB_NAME))
    started = []
    parts = {"dir": agent_dir, "manager": manager, "users": users, "fstab": fstab, "started": started}
    try:
        yield parts
    finally:
        for job in started:
            job.kill(0)
        manager.remove_job_cgroups()
        manager.cleanup()
        for key in users.pool.held():
            users.release(key)


def start_job(parts, name, command, env_vars=None, private_tmp=True, setup=None):
    """Prepare and start a job as the agent's Preparer.prepare does, but with `env_vars` put into
    the environment as they are: no check of them happens above the runner."""
    workdir = os.path.join(parts["dir"], "work", name)
    os.mkdir(workdir, 0o700)
    if setup is not None:
        setup(workdir)
    who = parts["users"].acquire(name, workdir)
    identity.prepare_workdir(workdir, who)
    cg = parts["manager"].create(name, 256, 100, 64)
    env = {**jobenv.from_agent(os.environ), **who.env(workdir), **(env_vars or {}),
           "CORRAL_JOB_ID": name, "CORRAL_NODE_ID": "node-x", "CORRAL_ATTEMPT": "1"}
    job = runner.start({"command": command}, workdir, env, 65536, cgroup=cg, user=who.launch_user(),
                       private_tmp=launch.PrivateTmp(parts["fstab"], 64) if private_tmp else None)
    parts["started"].append(job)
    return job, who


@pytest.mark.parametrize("variable", ["LD_PRELOAD", "LD_AUDIT"])
@pytest.mark.parametrize("dropper", ["forkserver", CHAIN_SETPRIV, CHAIN_PYTHON])
def test_a_library_from_a_deploy_zip_never_runs_as_root(node_parts, evil_so, records, variable, dropper,
                                                        monkeypatch):
    if dropper == "python":  # the fallback for a node without setpriv
        tools = runner.tools()
        monkeypatch.setattr(runner, "_TOOLS", launch.Tools(None, tools.unshare, tools.mount))
    with open(evil_so, "rb") as f:
        payload = make_zip(file_entry("evil.so", f.read(), 0o755), file_entry("run.sh", b"id -u\n", 0o755))
    server = serve_in_thread(ZipHandler)
    server.files = {"/app.zip": payload}
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/app.zip"
        job, who = start_job(node_parts, "zip-1", "exec /bin/sh ./run.sh", {variable: "./evil.so"},
                             setup=lambda workdir: artifacts.fetch_and_unpack(url, workdir, sha256=None,
                                                                                  limits=artifacts.Limits()))
        result = job.result()
    finally:
        server.shutdown()
        server.server_close()
    assert result.exit_code == 0 and result.stdout == f"{who.uid}\n", result
    ran_as = recorded(records)
    # The library did run, in the job's own processes (so the test can see it), and never as root.
    assert ran_as and set(ran_as) == {(who.uid, who.uid)}, ran_as


def test_a_library_planted_in_an_earlier_jobs_private_tmp_is_not_there(node_parts, evil_so, records):
    name = f"evil-{uuid.uuid4().hex[:8]}.so"
    first, _ = start_job(node_parts, "plant-1",
                         f"cp {evil_so} /tmp/{name} && cp {evil_so} /dev/shm/{name} && "
                         f"cp {evil_so} /var/tmp/{name} && echo planted")
    assert first.result().stdout == "planted\n"
    assert not os.path.exists(f"/tmp/{name}") and not os.path.exists(f"/dev/shm/{name}")
    second, _ = start_job(node_parts, "use-1", f"ls /tmp/{name} /dev/shm/{name} /var/tmp/{name} 2>&1; exit 0",
                          {"LD_PRELOAD": f"/tmp/{name}", "LD_AUDIT": f"/dev/shm/{name}"})
    result = second.result()
    assert result.stdout.count("No such file or directory") == 3, result
    assert recorded(records) == []  # not even visible, so it ran nowhere


def test_a_library_planted_in_a_shared_tmp_runs_only_as_its_job(node_parts, evil_so, records):
    """Without a private /tmp (AGENT_PRIVATE_TMP=false, or a kernel without it), the
    planted file is there, but the environment is applied after the drop."""
    name = f"/tmp/evil-{uuid.uuid4().hex[:8]}.so"
    try:
        first, _ = start_job(node_parts, "plant-2", f"cp {evil_so} {name} && chmod 644 {name}", private_tmp=False)
        assert first.result().exit_code == 0 and os.path.exists(name)
        second, who = start_job(node_parts, "use-2", "true", {"LD_PRELOAD": name}, private_tmp=False)
        assert second.result().exit_code == 0
        ran_as = recorded(records)
        assert ran_as and set(ran_as) == {(who.uid, who.uid)}, ran_as
    finally:
        if os.path.exists(name):
            os.unlink(name)


# --- a real agent ------------------------------------------------------------------------------------

@pytest.fixture
def node():
    return f"iso-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def make_agent(state_dir, node, scheduler, registry):
    """Agents on `state_dir` with real cgroups, uids and private /tmp, against the real
    scheduler app through `responses` and a mocked registry; nothing they started
    outlives the test."""
    agents = []

    def make(**overrides):
        values = dict(node_id=node, registry_url=REGISTRY, scheduler_url=SCHEDULER, state_dir=state_dir,
                      slots=3, poll_interval=0.05, output_tail_bytes=65536, stop_grace=0.2, kill_grace=0.5,
                      health_interval=0.2, health_timeout=0.5)
        values.update(overrides)
        agent = Agent(AgentSettings(**values), RegistryClient(REGISTRY), SchedulerClient(SCHEDULER))
        agent.startup()
        agents.append(agent)
        return agent

    make.scheduler = scheduler
    try:
        yield make
    finally:
        stop_held_jobs(agents)
        manager = cgroups.detect(root_name=AgentSettings(node_id=node, state_dir=state_dir).cgroup_root_name)
        manager.remove_job_cgroups()
        manager.cleanup()


def run_until_done(agent, scheduler, job_id, timeout=20):
    """Reap until the job's final report is in; that report."""
    def ended():
        agent.reap_once()
        return scheduler.statuses(job_id)[-1:] in (["done"], ["failed"]) and scheduler.final(job_id)
    return wait_for(ended, timeout=timeout, message=f"{job_id} to end")


def test_the_agents_preparation_never_runs_a_loader_variable_as_root(make_agent, evil_so, records, monkeypatch):
    """As if the agent's own check were broken: the job reaches the runner with LD_PRELOAD."""
    monkeypatch.setattr(jobenv, "forbidden_env_var", lambda names: None)
    agent = make_agent()
    assert agent.private_tmp, agent.private_tmp_reason
    make_agent.scheduler.add(job_id="job-1", command="id -u")
    # Past the scheduler's own submit check too: the row holds them.
    make_agent.scheduler.set_row("job-1", env_vars={"LD_PRELOAD": evil_so, "LD_AUDIT": evil_so})
    agent.intake.poll_once()
    final = run_until_done(agent, make_agent.scheduler, "job-1")
    uid = int(final["stdout"])
    assert final["status"] == "done" and UID_RANGE[0] <= uid <= UID_RANGE[1]
    ran_as = recorded(records)
    assert ran_as and set(ran_as) == {(uid, uid)}, ran_as


def test_two_jobs_cannot_reach_each_other_nor_the_agents_files(make_agent, shared_dir, state_dir):
    agent = make_agent()
    scheduler = make_agent.scheduler
    s = agent.settings
    secret_db = os.path.join(state_dir, "scheduler.db")  # what a control plane beside the agent keeps
    with open(secret_db, "w") as f:
        f.write("SQLite format 3")
    os.chmod(secret_db, 0o600)
    # A (job-1): a run job with a secret in its environment, a file in its work dir and output.
    scheduler.add(job_id="job-1", env_vars={"A_SECRET": "s3cret-a"},
                  command=f"echo $$ > {shared_dir}/a.pid; echo private > private.txt; echo a-output-s3cret; "
                          f"while [ ! -e {shared_dir}/b.done ]; do sleep 0.05; done; echo finished")
    # C (job-2): a service writing its log file.
    scheduler.add(job_id="job-2", job_type="service", command="echo service-s3cret; exec sleep 300")
    agent.intake.poll_once()
    a_pid = int(wait_for(lambda: open(f"{shared_dir}/a.pid").read().strip(), message="A's pid"))
    c_log = os.path.join(s.log_root, "job-2-1.out")
    wait_for(lambda: os.path.exists(c_log) and "service-s3cret" in open(c_log).read(), message="C's log")
    c_pid = agent.jobs.get(("job-2", 1)).process.pid
    attack = os.path.join(shared_dir, "attack.py")
    with open(attack, "w") as f:
        f.write(ATTACK.format(a_pid=a_pid, c_pid=c_pid, a_work=agent.settings.work_dir("job-1", 1),
                              agent_dir=s.agent_dir,
                              work_root=s.work_root, c_log=c_log, secret_db=secret_db,
                              state_root=s.service_state_root, done=f"{shared_dir}/b.done",
                              a_copy=os.path.join(s.output_root, "job-1-1.stdout")))
    scheduler.add(job_id="job-3", command=f"{PYTHON3} {attack}")
    agent.intake.poll_once()
    b = run_until_done(agent, scheduler, "job-3")
    assert b["status"] == "done", b
    outcome = json.loads(b["stdout"])
    assert outcome.pop("same_uid") is False
    assert outcome == {name: "refused" for name in outcome}, outcome
    assert len(outcome) == 17
    assert "s3cret" not in b["stdout"] + b["stderr"]
    a = run_until_done(agent, scheduler, "job-1")
    assert (a["status"], a["stdout"]) == ("done", "a-output-s3cret\nfinished\n")
    # A's complete log is A's own output, byte for byte: B could neither read nor swap the agent's copy.
    agent.logs.ship_once(agent.scheduler)
    shipped = scheduler.app.test_client().get("/jobs/job-1/logs")
    assert shipped.data == b"a-output-s3cret\nfinished\n"
    assert shipped.headers["X-Corral-Log-Complete"] == "true"


ATTACK = textwrap.dedent('''\
    import ctypes, json, os, signal
    A, refused = {a_pid}, {{}}

    def attempt(name, action):
        try:
            action()
            refused[name] = "ALLOWED"
        except PermissionError:
            refused[name] = "refused"
        except OSError as exc:
            refused[name] = "other error: %s" % exc

    def ptrace():
        libc = ctypes.CDLL(None, use_errno=True)
        libc.ptrace.restype = ctypes.c_long
        if libc.ptrace(16, A, None, None) != 0:  # PTRACE_ATTACH
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))

    attempt("environ", lambda: open("/proc/%d/environ" % A).read())
    attempt("fd list", lambda: os.listdir("/proc/%d/fd" % A))
    attempt("stdout pipe", lambda: open("/proc/%d/fd/1" % A).read(1))
    attempt("mem", lambda: open("/proc/%d/mem" % A, "rb").read(1))
    attempt("ptrace attach", ptrace)
    attempt("kill -9", lambda: os.kill(A, signal.SIGKILL))
    attempt("work dir list", lambda: os.listdir("{a_work}"))
    attempt("work dir file", lambda: open("{a_work}/private.txt").read())
    attempt("agent dir list", lambda: os.listdir("{agent_dir}"))
    attempt("work root list", lambda: os.listdir("{work_root}"))
    attempt("service state list", lambda: os.listdir("{state_root}"))
    attempt("service log", lambda: open("{c_log}").read())
    attempt("service log by its descriptor", lambda: open("/proc/{c_pid}/fd/1").read())
    attempt("database", lambda: open("{secret_db}").read())
    attempt("output copy", lambda: open("{a_copy}", "rb").read())
    attempt("output copy swapped", lambda: os.symlink("/etc/shadow", "{a_copy}.new"))
    attempt("output copy replaced", lambda: os.rename("{a_copy}", "{a_copy}.gone"))
    with open("/proc/%d/status" % A) as f:
        a_uid = [line.split()[1] for line in f if line.startswith("Uid:")][0]
    refused["same_uid"] = a_uid == str(os.getuid())
    print(json.dumps(refused))
    open("{done}", "w").close()
''')


# --- uids ---------------------------------------------------------------------------------------------

def test_concurrent_jobs_get_uids_of_their_own_which_come_back_late(make_agent, shared_dir):
    agent = make_agent()
    scheduler = make_agent.scheduler
    for job_id in ("job-1", "job-2"):
        scheduler.add(job_id=job_id, command=f"id -u; touch {shared_dir}/{job_id}; "
                                             f"while [ ! -e {shared_dir}/go ]; do sleep 0.05; done")
    agent.intake.poll_once()
    wait_for(lambda: all(os.path.exists(f"{shared_dir}/{j}") for j in ("job-1", "job-2")),
             message="both jobs to run at once")
    held = agent.users.pool.held()
    assert set(held) == {"job-1-1", "job-2-1"} and len(set(held.values())) == 2
    open(f"{shared_dir}/go", "w").close()
    uids = {int(run_until_done(agent, scheduler, j)["stdout"]) for j in ("job-1", "job-2")}
    assert uids == set(held.values()) and all(UID_RANGE[0] <= u <= UID_RANGE[1] for u in uids)
    assert agent.users.pool.held() == {}  # given back
    assert not any(os.path.exists(os.path.join(agent.users.pool.claims_dir, str(u))) for u in uids)
    scheduler.add(job_id="job-3", command="id -u")
    agent.intake.poll_once()
    third = int(run_until_done(agent, scheduler, "job-3")["stdout"])
    assert third not in uids  # not the one given back just now: the next after the last given


def test_agent_job_user_still_runs_every_job_as_that_user(make_agent):
    agent = make_agent(job_user="nobody")
    scheduler = make_agent.scheduler
    scheduler.add(job_id="job-1", command="id -un")
    scheduler.add(job_id="job-2", command="id -un")
    agent.intake.poll_once()
    assert [run_until_done(agent, scheduler, j)["stdout"] for j in ("job-1", "job-2")] == ["nobody\n"] * 2


def test_a_uid_range_smaller_than_the_slots_stops_the_agent(state_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "AGENT_"))}
    env.update(NODE_ID="n1", CORRAL_STATE_DIR=state_dir, AGENT_SLOTS="3", AGENT_UID_RANGE="70000-70001")
    result = subprocess.run([os.path.join(BIN, "corral-agent")], env=env, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2
    assert result.stderr == ("corral-agent: error: AGENT_UID_RANGE=70000-70001 holds 2 uid(s), fewer than "
                             "AGENT_SLOTS=3: every running job needs a uid of its own\n")


# --- limits -----------------------------------------------------------------------------------------

FORK_UNTIL_REFUSED = (f"{PYTHON3} -c \"import os, time\nn = 0\nfor _ in range(60):\n"
                      "    try: pid = os.fork()\n    except OSError: break\n"
                      "    if pid == 0: time.sleep(60); os._exit(0)\n    n += 1\nprint(n)\"")


# The scheduler hands every run job its JOB_TIMEOUT_SECS as the job's timeout_secs.
@pytest.mark.parametrize("scheduler_settings", [{"job_timeout_secs": 10}], ids=["timeout-10s"])
def test_a_fork_bomb_stays_inside_its_job(make_agent):
    agent = make_agent()
    scheduler = make_agent.scheduler
    scheduler.add(job_id="job-1", command=FORK_UNTIL_REFUSED, max_processes=20)
    agent.intake.poll_once()
    first = run_until_done(agent, scheduler, "job-1")
    assert first["status"] == "done" and int(first["stdout"]) < 20, first  # no 20th process, let alone a 50th
    assert scheduler.reports[0][1]["limits"]["max_processes"] == 20
    # The real thing, ended by its timeout: the node and the agent carry on.
    scheduler.add(job_id="job-2", command="bomb() { bomb | bomb & }; bomb; sleep 60", max_processes=50)
    agent.intake.poll_once()
    bomb = run_until_done(agent, scheduler, "job-2", timeout=30)
    assert (bomb["status"], bomb["exit_code"]) == ("failed", -1) and "job timed out" in bomb["stderr"]
    assert only_empty_slots(agent.cgroups)
    scheduler.add(job_id="job-3", command="echo still here")
    agent.intake.poll_once()
    assert run_until_done(agent, scheduler, "job-3")["stdout"] == "still here\n"


# --- private /tmp --------------------------------------------------------------------------------------

def test_a_jobs_tmp_is_its_own_and_goes_with_it(make_agent, shared_dir):
    agent = make_agent()
    scheduler = make_agent.scheduler
    name = f"mine-{uuid.uuid4().hex[:8]}"
    scheduler.add(job_id="job-1", command=f"for d in /tmp /var/tmp /dev/shm; do echo a > $d/{name}; done; "
                                          f"echo $$ > {shared_dir}/a.pid; "
                                          f"while [ ! -e {shared_dir}/go ]; do sleep 0.05; done")
    agent.intake.poll_once()
    a_pid = int(wait_for(lambda: open(f"{shared_dir}/a.pid").read().strip(), message="A's pid"))
    # There, in A's own mount namespace (root may look through /proc/<pid>/root) ...
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        assert open(f"/proc/{a_pid}/root{d}/{name}").read() == "a\n"
        # ... but not on the host,
        assert not os.path.exists(f"{d}/{name}")
    assert os.readlink(f"/proc/{a_pid}/ns/ipc") != os.readlink("/proc/self/ns/ipc")
    # ... nor for another job running beside it,
    check = f"ls /tmp/{name} /var/tmp/{name} /dev/shm/{name} 2>&1; grep -c ' /tmp ' /proc/self/mountinfo"
    scheduler.add(job_id="job-2", command=check)
    agent.intake.poll_once()
    b = run_until_done(agent, scheduler, "job-2")
    assert b["stdout"].count("No such file or directory") == 3 and b["stdout"].endswith("1\n"), b
    # ... and after A ended, no trace: its file systems went with its namespace.
    open(f"{shared_dir}/go", "w").close()
    assert run_until_done(agent, scheduler, "job-1")["status"] == "done"
    scheduler.add(job_id="job-3", command=check)
    agent.intake.poll_once()
    assert run_until_done(agent, scheduler, "job-3")["stdout"].count("No such file or directory") == 3


# --- the warm launch (warm.py) ---------------------------------------------------------------------------

# What a job sees of itself, with what differs between two jobs by design on marked lines.
SELF_VIEW = ("echo pid $$; echo uid $(id -u) $(id -g) $(id -G); echo cwd $(pwd); "
             "echo cgroups $(grep -c -e memory: -e pids: /proc/self/cgroup); "
             "stat -f -c 'tmp %T' /tmp; ls -A /tmp /var/tmp /dev/shm; umask; ulimit -n; "
             "[ -e /proc/self/fd/3 ] && echo fd3; env | sort")


def _normalised(report, agent, job_id):
    """Its lines but pid, uid, cgroups and its own span, with its work dir, id and uid replaced."""
    text = report["stdout"]
    uid = text.split("uid ")[1].split()[0]
    text = text.replace(agent.settings.work_dir(job_id, 1), "WORK").replace(job_id, "JOB").replace(uid, "UID")
    return [line for line in text.splitlines()
            if not line.startswith(("pid ", "uid ", "TRACEPARENT=", "CORRAL_DEADLINE="))
            and not re.match(r"\d+:", line)]


@pytest.mark.chain_launch
def test_a_job_that_takes_the_warm_launch_runs_as_a_cold_started_one(make_agent):
    agent = make_agent()
    scheduler = make_agent.scheduler
    assert agent.private_tmp and agent.cgroups.enforced, agent.private_tmp_reason
    warm = agent.warm.fill_once()
    assert warm is not None and warm.key in agent.users.pool.held()
    scheduler.add(job_id="job-1", command=SELF_VIEW + "; cat /proc/self/cgroup")
    agent.intake.poll_once()
    taken = run_until_done(agent, scheduler, "job-1")
    scheduler.add(job_id="job-2", command=SELF_VIEW + "; cat /proc/self/cgroup")
    agent.intake.poll_once()  # nothing filled the keeper again: this one starts cold
    cold = run_until_done(agent, scheduler, "job-2")
    assert taken["status"] == cold["status"] == "done", (taken, cold)
    # It is the process started ahead, in the cgroup made ahead, under the uid held ahead ...
    assert f"pid {warm.start.pid}\n" in taken["stdout"]
    assert f"/{warm.cgroup.name}\n" in taken["stdout"] and "/job-2-1\n" in cold["stdout"]
    uid = taken["stdout"].split("uid ")[1].split()[0]
    assert UID_RANGE[0] <= int(uid) <= UID_RANGE[1] and f"uid {uid} {uid} {uid}\n" in taken["stdout"]
    assert f"uid {uid} " not in cold["stdout"]
    # ... and sees what a job started cold sees: work dir, environment, private /tmp, limits.
    strip = _normalised(taken, agent, "job-1")
    assert strip == _normalised(cold, agent, "job-2")
    assert "tmp tmpfs" in strip and "cgroups 2" in strip and "fd3" not in strip
    assert not [key for key in agent.users.pool.held() if key.startswith("warm:")]
    assert agent.cgroups.list_job_cgroups() == []


@pytest.mark.chain_launch
def test_a_warm_launch_that_does_not_fit_the_job_goes_and_the_next_fits(make_agent):
    agent = make_agent()
    scheduler = make_agent.scheduler
    first = agent.warm.fill_once()
    scheduler.add(job_id="job-1", command="echo $$", memory_mb=300)
    agent.intake.poll_once()
    big = run_until_done(agent, scheduler, "job-1")
    assert big["status"] == "done" and big["stdout"] != f"{first.start.pid}\n"
    second = agent.warm.fill_once()  # discards the first, makes one for 300 MB
    wait_for(lambda: not os.path.exists(f"/proc/{first.start.pid}"), message="the unused chain to end")
    assert first.cgroup.name not in agent.cgroups.list_job_cgroups()
    assert first.key not in agent.users.pool.held() and second.key in agent.users.pool.held()
    assert second.limits.memory_mb == 300 and second.cgroup.limits["memory_mb"] == 300
    scheduler.add(job_id="job-2", command="echo $$; df -m /tmp | tail -1", memory_mb=300)
    agent.intake.poll_once()
    again = run_until_done(agent, scheduler, "job-2")
    assert again["stdout"].startswith(f"{second.start.pid}\n") and " 300 " in again["stdout"], again


@pytest.mark.chain_launch
def test_an_unused_warm_launch_goes_with_the_agent(make_agent):
    agent = make_agent()
    warm = agent.warm.fill_once()
    assert os.path.exists(f"/proc/{warm.start.pid}") and warm.cgroup.name in agent.cgroups.list_job_cgroups()
    agent.shutdown(flush_secs=0)
    assert not os.path.exists(f"/proc/{warm.start.pid}")
    assert agent.cgroups.list_job_cgroups() == [] and agent.users.pool.held() == {}
    assert agent.warm.fill_once() is None  # a stopped agent starts none


@pytest.mark.chain_launch
def test_a_warm_chain_whose_agent_dies_runs_nothing(state_dir, shared_dir):
    """The agent dies (here: its pipe closes) before or while writing the script: the
    chain exits and no part of the script runs, also when it breaks off just before
    its end."""
    marker = os.path.join(shared_dir, "ran")
    script = launch.warm_script(f"touch {marker}", "/", {"PATH": launch.LAUNCH_PATH})
    fstab = launch.write_fstab(os.path.join(state_dir, "fstab"))
    for cut in (0, len(script) // 2, len(script) - 2):
        chain = launch.warm_argv(runner.tools(), (), launch.User(UID_RANGE[1], UID_RANGE[1]),
                                 launch.PrivateTmp(fstab, 16))
        reader, writer = os.pipe()
        os.fchown(reader, UID_RANGE[1], UID_RANGE[1])
        proc = subprocess.Popen(chain, stdin=reader, env=launch.LAUNCH_ENV, cwd="/", stderr=subprocess.PIPE)
        os.close(reader)
        os.write(writer, script[:cut])
        os.close(writer)
        _, err = proc.communicate(timeout=10)
        # 125 from the missing last line, 2 from the shell (a block cut short)
        assert proc.returncode in (launch.SETUP_FAILED_EXIT, 2), (cut, err)
        assert not os.path.exists(marker)


# --- a corral-agent process ----------------------------------------------------------------------------

def final_report(cluster, job_id, timeout=20):
    return cluster.wait_status(job_id, "done", "failed", timeout=timeout)


def complete_log(cluster, job_id, timeout=20) -> bytes:
    """A job's whole stdout once its agent shipped all of it (GET /jobs/{id}/logs)."""
    def shipped():
        answer = requests.get(f"{cluster.scheduler_url}/jobs/{job_id}/logs", timeout=5)
        return answer.content if answer.headers.get("X-Corral-Log-Complete") == "true" else None
    return wait_for(shipped, timeout=timeout, message=f"the complete log of {job_id}")


def write_env_vars(cluster, job_id, env_vars):
    """The job's row in the scheduler's database given `env_vars`, which its submit check
    refuses (a restored backup, a bug, someone with the file)."""
    database = os.path.join(cluster.state_dir, "scheduler.db")
    with sqlite3.connect(database, timeout=10) as db:
        db.execute("UPDATE job SET env_vars = ? WHERE id = ?", (json.dumps(env_vars), int(job_id[4:])))
    assert cluster.job(job_id)["env_vars"] == env_vars


def test_the_agent_refuses_a_job_that_sets_a_loader_variable(cluster, node, start_agent, evil_so, records,
                                                             shared_dir):
    names = {}
    for name in ("LD_PRELOAD", "LD_AUDIT"):
        # Pinned to a node that is not up yet, so the row is changed before a claim.
        job_id = cluster.submit(command=f"touch {shared_dir}/ran", instance_id=node, max_retries=0)["job_id"]
        write_env_vars(cluster, job_id, {name: evil_so})
        names[job_id] = name
    start_agent()
    for job_id, name in names.items():
        final = final_report(cluster, job_id)
        assert (final["status"], final["exit_code"]) == ("failed", -1)
        assert "the agent could not start the job" not in final["stderr"]
        assert final["stderr"].startswith(f"the agent refuses to run a job whose env_vars set {name}")
    assert not os.path.exists(f"{shared_dir}/ran") and recorded(records) == []  # nothing started


@pytest.mark.parametrize("passthrough", [None, "FOO"])
def test_the_agents_environment_does_not_reach_jobs(cluster, node, start_agent, passthrough):
    extra = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "agent-secret", "FOO": "foo",
             "CORRAL_TOKEN": "operator-token", "GITHUB_TOKEN": "gh-token", "LANG": "C.UTF-8", "TZ": "UTC",
             "PATH": "/usr/local/bin:/usr/bin:/bin"}
    if passthrough:
        extra["AGENT_JOB_ENV_PASSTHROUGH"] = passthrough
    job_id = cluster.submit(command="cat /proc/$$/environ", instance_id=node, env_vars={"STAGE": "prod"})["job_id"]
    start_agent(**extra)
    final = final_report(cluster, job_id)
    assert final["status"] == "done", final
    # NUL-separated: the complete log has the exact bytes (the job record's tail shows U+FFFD for NUL).
    environ = dict(item.split("=", 1) for item in complete_log(cluster, job_id).decode().split("\0") if item)
    work = environ["HOME"]
    user = environ["USER"]
    # When its timeout (JOB_TIMEOUT_SECS here) ends it, epoch seconds, as the scheduler counts it too.
    deadline = int(environ.pop("CORRAL_DEADLINE"))
    assert abs(deadline - (epoch(final["running_at"]) + final["timeout_secs"])) <= 2, (deadline, final)
    # The attempt's span is its own, in the trace the job was submitted in.
    _, trace_id, span_id, _ = environ["TRACEPARENT"].split("-")
    assert trace_id == final["traceparent"].split("-")[1] and span_id != final["traceparent"].split("-")[2]
    expected = {"TRACEPARENT": environ["TRACEPARENT"],
                "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "UTC", "HOME": work,
                "USER": user, "LOGNAME": user, "STAGE": "prod", "CORRAL_JOB_ID": job_id,
                "CORRAL_NODE_ID": node, "CORRAL_ATTEMPT": "1"}
    if passthrough:
        expected["FOO"] = "foo"
    assert environ == expected
    assert work.endswith(f"/work/{job_id}-1") and user.startswith("corral-7")
    # What the agent's running report said, as the scheduler keeps it.
    assert final["private_tmp"] is True  # so no TMPDIR: /tmp is the job's own
    assert final["limits"]["max_processes"] == 1024


def test_a_kept_work_dir_is_roots_once_its_uid_is_given_back(make_agent):
    agent = make_agent(keep_work_dirs=True)
    scheduler = make_agent.scheduler
    scheduler.add(job_id="job-1", command="echo kept > out.txt")
    agent.intake.poll_once()
    assert run_until_done(agent, scheduler, "job-1")["status"] == "done"
    workdir = agent.settings.work_dir("job-1", 1)
    for path in (workdir, os.path.join(workdir, "out.txt")):
        assert (os.stat(path).st_uid, os.stat(path).st_gid) == (0, 0)
    assert oct(os.stat(workdir).st_mode & 0o777) == "0o700"


# What a job does in its work dir (its first line: its pid), and what it must not reach from
# there: the work dirs' directory (traversable, not listable) and the agent's own files.
IN_WORK_DIR = ("echo $$; echo data > mine.txt && cat mine.txt && pwd; ls .. >/dev/null 2>&1 && echo LISTED; "
               "cat ../../uids.json >/dev/null 2>&1 && echo READ; true")


@pytest.mark.chain_launch
def test_jobs_enter_their_work_dir_when_the_state_dirs_parent_is_private(make_agent, node, state_dir):
    """A state dir below a directory only root may enter (0700, as a checkout in a home
    directory or made by `mktemp -d`): the job's uid cannot walk to its work dir by its
    absolute path, yet every kind of launch starts it there."""
    private = os.path.join(state_dir, "private")
    os.mkdir(private, 0o700)
    os.chmod(private, 0o700)
    mine = os.path.join(private, "state")
    agent = None
    try:
        agent = make_agent(state_dir=mine)
        scheduler = make_agent.scheduler
        assert agent.private_tmp and agent.warm is not None, agent.private_tmp_reason
        warm = agent.warm.fill_once()
        assert warm is not None
        scheduler.add(job_id="job-1", command=IN_WORK_DIR)
        agent.intake.poll_once()  # alone: a job of other limits prepared first would discard the warm launch
        run_until_done(agent, scheduler, "job-1", timeout=60)
        scheduler.add(job_id="job-2", command=IN_WORK_DIR, memory_mb=300)  # other limits: cold
        scheduler.add(job_id="job-3", job_type="service", command=IN_WORK_DIR + "; exec sleep 300")
        agent.intake.poll_once()
        for job_id in ("job-1", "job-2"):
            final = run_until_done(agent, scheduler, job_id, timeout=60)
            pid = final["stdout"].split("\n")[0]
            expected = ("done", f"{pid}\ndata\n{agent.settings.work_dir(job_id, 1)}\n")
            assert (final["status"], final["stdout"]) == expected, str(final)
            assert (pid == str(warm.start.pid)) == (job_id == "job-1"), final  # job-1 took the warm launch
        service_log = os.path.join(agent.settings.log_root, "job-3-1.out")
        workdir = agent.settings.work_dir("job-3", 1)
        wait_for(lambda: os.path.exists(service_log) and workdir in open(service_log).read(), timeout=60,
                 message="the service's output")
        assert open(service_log).read().split("\n")[1:] == ["data", workdir, ""]
    finally:
        if agent is not None:
            stop_held_jobs([agent])
        manager = cgroups.detect(root_name=AgentSettings(node_id=node, state_dir=mine).cgroup_root_name)
        manager.remove_job_cgroups()
        manager.cleanup()


# --- no way back to privileges: no_new_privs, an empty capability bounding set --------------------------

SETUID_C = r"""
#include <stdio.h>
#include <unistd.h>
int main(void) { printf("%d %d\n", (int)getuid(), (int)geteuid()); return 0; }
"""
PRIVILEGES = "grep -E '^(CapBnd|NoNewPrivs):' /proc/self/status"
NO_PRIVILEGES = "CapBnd:\t0000000000000000\nNoNewPrivs:\t1\n"


@pytest.fixture
def setuid_root(shared_dir):
    """A program owned by root with the setuid bit, which prints its uid and euid; the test
    is skipped where the file system ignores the bit (nosuid)."""
    source = os.path.join(shared_dir, "who.c")
    with open(source, "w") as f:
        f.write(SETUID_C)
    path = os.path.join(shared_dir, "who")
    subprocess.run([GCC, "-O2", "-o", path, source], check=True, capture_output=True, timeout=60)
    os.chown(path, 0, 0)
    os.chmod(path, 0o4755)
    plain = subprocess.run([runner.tools().setpriv, f"--reuid={UID_RANGE[1]}", f"--regid={UID_RANGE[1]}",
                            "--clear-groups", path], capture_output=True, text=True, timeout=10)
    if plain.stdout != f"{UID_RANGE[1]} 0\n":
        pytest.skip(f"the setuid bit has no effect here: {plain.stdout!r} {plain.stderr!r}")
    return path


@pytest.mark.parametrize("dropper", ["forkserver", CHAIN_SETPRIV, CHAIN_PYTHON])
@pytest.mark.parametrize("private_tmp", [True, False])
def test_a_job_cannot_gain_privileges_through_a_setuid_program(node_parts, setuid_root, dropper, private_tmp,
                                                               monkeypatch):
    if dropper == "python":  # the fallback for a node without setpriv
        tools = runner.tools()
        monkeypatch.setattr(runner, "_TOOLS", launch.Tools(None, tools.unshare, tools.mount))
    name = f"suid-{dropper}-{int(private_tmp)}"
    job, who = start_job(node_parts, name, f"{PRIVILEGES}; {setuid_root}", private_tmp=private_tmp)
    result = job.result()
    assert result.exit_code == 0, result
    assert result.stdout == f"{NO_PRIVILEGES}{who.uid} {who.uid}\n", result


@pytest.mark.chain_launch
def test_warm_launched_jobs_and_services_cannot_gain_privileges(make_agent, setuid_root):
    agent = make_agent()
    scheduler = make_agent.scheduler
    warm = agent.warm.fill_once()
    assert warm is not None
    warm_uid = agent.users.pool.held()[warm.key]
    command = f"{PRIVILEGES}; {setuid_root}; id -u"
    scheduler.add(job_id="job-1", command=command)
    agent.intake.poll_once()  # alone: a service prepared first would discard the warm launch
    final = run_until_done(agent, scheduler, "job-1", timeout=60)
    scheduler.add(job_id="job-2", job_type="service", command=command + "; exec sleep 300")
    agent.intake.poll_once()
    assert final["status"] == "done" and final["stdout"].startswith(NO_PRIVILEGES), final
    uid = final["stdout"].split("\n")[-2]
    assert final["stdout"] == f"{NO_PRIVILEGES}{uid} {uid}\n{uid}\n" and int(uid) == warm_uid, final
    service_log = os.path.join(agent.settings.log_root, "job-2-1.out")
    wait_for(lambda: os.path.exists(service_log) and open(service_log).read().count("\n") == 4, timeout=60,
             message="the service's output")
    lines = open(service_log).read()
    uid = lines.split("\n")[-2]
    assert lines == f"{NO_PRIVILEGES}{uid} {uid}\n{uid}\n", lines


# --- the real scheduler: a job row written directly, past the submit check -------------------------

@pytest.mark.e2e
def test_a_job_row_given_ld_preload_directly_in_the_database_runs_nothing_as_root(cluster, evil_so, records,
                                                                                shared_dir):
    """The submit check refuses LD_PRELOAD; a job row written into the scheduler's database
    holds it anyway (a restored backup, a bug, someone with the file). With the library in
    the job's deploy zip and in an earlier job's /tmp: the agent refuses both jobs, nothing
    of them runs, and the library never runs as root."""
    import requests
    with open(evil_so, "rb") as f:
        payload = make_zip(file_entry("evil.so", f.read(), 0o755), file_entry("run.sh", b"id -u\n", 0o755))
    server = serve_in_thread(ZipHandler)
    server.files = {"/app.zip": payload}
    node = "preload-node"
    try:
        zip_url = f"http://127.0.0.1:{server.server_address[1]}/app.zip"
        # An earlier job of the same node plants the library in its /tmp.
        planted = cluster.submit(command=f"cp {evil_so} /tmp/evil.so && echo planted", instance_id=node)
        # Pinned to a node that is not up yet, so each row can be changed before a claim.
        from_zip = cluster.submit(deploy_url=zip_url, instance_id=node, env_vars={"STAGE": "x"}, max_retries=0)
        from_tmp = cluster.submit(command="id -u", instance_id=node, env_vars={"STAGE": "x"}, max_retries=0)
        for job, value in ((from_zip, "./evil.so"), (from_tmp, "/tmp/evil.so")):
            write_env_vars(cluster, job["job_id"], {"LD_PRELOAD": value, "LD_AUDIT": value})
        cluster.start_agent(node, slots=1)
        assert cluster.wait_status(planted["job_id"], "done", timeout=30)["stdout"] == "planted\n"
        for job in (from_zip, from_tmp):
            final = cluster.wait_status(job["job_id"], "failed", timeout=30)
            assert final["stderr"].startswith("the agent refuses to run a job whose env_vars set LD_"), final
            assert final["stdout"] in ("", None)
        assert recorded(records) == []  # neither as root nor as anyone: nothing of them started
        # And a retry from the operator runs nothing either: the row still holds the variable.
        requests.post(f"{cluster.scheduler_url}/jobs/{from_tmp['job_id']}/retry", json={}, timeout=10)
        final = wait_for(lambda: (lambda j: j if j["status"] == "failed" and j["attempt"] == 2 else None)(
            cluster.job(from_tmp["job_id"])), timeout=30, message="the retried attempt to be refused")
        assert final["stderr"].startswith("the agent refuses") and recorded(records) == []
    finally:
        server.shutdown()
        server.server_close()


# --- GPUs: a job opens its own devices and no other's (devices.py) -----------------------------

GPU_A, GPU_B = "GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"
NVIDIA_MAJOR = 195
# Opens each path read-write and says how that went, with the variables that name its GPUs.
DEVICE_PROBE = r"""
import errno, json, os, sys
said = {}
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        said[path] = "opened"
    except OSError as exc:
        said[path] = errno.errorcode[exc.errno]
try:
    os.mknod("/dev/corral-made", 0o666 | 0o020000, os.makedev(195, 1))
    said["mknod"] = "made"
except OSError as exc:
    said["mknod"] = errno.errorcode[exc.errno]
said["env"] = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
print(json.dumps(said))
"""


@pytest.fixture
def gpu_devices():
    """A device dir jobs can reach, with ordinary nodes and two GPUs' (NVIDIA's major
    number, no driver behind it: opening one that the job may open fails with ENXIO,
    past every permission check)."""
    path = world_traversable_dir("corral-dev-")
    for name, major, minor in (("null", 1, 3), ("zero", 1, 5), ("urandom", 1, 9), ("nvidiactl", NVIDIA_MAJOR, 255),
                               ("nvidia0", NVIDIA_MAJOR, 0), ("nvidia1", NVIDIA_MAJOR, 1)):
        os.mknod(os.path.join(path, name), 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(os.path.join(path, name), 0o666)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def gpu_agent(make_agent, gpu_devices, mode):
    return make_agent(gpus=(Gpu("0", GPU_A, "NVIDIA A100-SXM4-80GB", 81920, minor=0),
                            Gpu("1", GPU_B, "NVIDIA A100-SXM4-80GB", 81920, minor=1)),
                      device_dir=gpu_devices, device_isolation=mode)


def probe_devices(agent, scheduler, shared_dir, job_id, paths, gpus=()):
    """Run DEVICE_PROBE as a job given `gpus` (UUIDs placement reserved for it); what it said."""
    probe = os.path.join(shared_dir, "probe.py")
    with open(probe, "w") as f:
        f.write(DEVICE_PROBE)
    scheduler.add(job_id=job_id, command=" ".join([PYTHON3, probe, *paths]))
    if gpus:  # as placement reserves them on a node with GPUs
        scheduler.set_row(job_id, gpus=len(gpus), gpus_assigned=list(gpus))
    agent.intake.poll_once()
    final = run_until_done(agent, scheduler, job_id)
    assert final["status"] == "done", final
    return json.loads(final["stdout"])


@pytest.mark.parametrize("mode, refused", [("cgroup", "EPERM"), ("mount", "ENOENT")])
def test_a_job_opens_its_own_gpu_and_no_other_and_a_job_without_gpus_none(make_agent, gpu_devices, shared_dir,
                                                                          mode, refused):
    if mode == "cgroup" and cgroups.V1_DEVICES not in cgroups.detect(root_name="corral-probe", prepare=False,
                                                                     devices=True).roots:
        pytest.skip("needs cgroup v1's devices controller")  # the mount case covers cgroup v2 nodes
    agent = gpu_agent(make_agent, gpu_devices, mode)
    assert agent.isolation is not None and agent.isolation.mode == mode
    # Under `cgroup` the job sees the node's /dev (here: the test's); under `mount` its own /dev.
    where = gpu_devices if mode == "cgroup" else "/dev"
    own, other, control = (f"{where}/nvidia0", f"{where}/nvidia1", f"{where}/nvidiactl")
    null = f"{where}/null"
    with_gpu = probe_devices(agent, make_agent.scheduler, shared_dir, "job-1", [own, other, control, null], [GPU_A])
    # ENXIO: let through to the (absent) driver; `refused`: stopped before it.
    assert (with_gpu[own], with_gpu[other], with_gpu[control], with_gpu[null]) == (
        "ENXIO", refused, "ENXIO", "opened"), with_gpu
    assert with_gpu["env"] == {"CUDA_VISIBLE_DEVICES": GPU_A, "NVIDIA_VISIBLE_DEVICES": GPU_A,
                               "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert with_gpu["mknod"] in ("EPERM", "EACCES")  # and it makes no device node of its own

    without = probe_devices(agent, make_agent.scheduler, shared_dir, "job-2", [own, other, control, null])
    assert (without[own], without[other], without[control], without[null]) == (
        refused, refused, refused, "opened"), without
    assert without["env"]["CUDA_VISIBLE_DEVICES"] == "" and without["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_a_gpu_this_node_does_not_have_fails_the_job_before_it_starts(make_agent, gpu_devices, shared_dir, records):
    agent = gpu_agent(make_agent, gpu_devices, "mount")
    scheduler = make_agent.scheduler
    scheduler.add(job_id="job-1", command=f"touch {records}/ran")
    scheduler.set_row("job-1", gpus=1, gpus_assigned=["GPU-99999999-0000"])
    agent.intake.poll_once()
    final = run_until_done(agent, scheduler, "job-1")
    assert final["status"] == "failed" and "GPU GPU-99999999-0000" in final["stderr"], final
    assert "not one of this node's" in final["stderr"] and os.listdir(records) == []
