"""Per-job cgroups against the real kernel, through the runner and the launch chain
(no agent, no network). Needs root and a writable cgroup v1 or v2 hierarchy; CI runs
as root."""
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid

import pytest

from corral.agent import cgroups, identity, launch, runner
from helpers import process_gone, wait_for

pytestmark = pytest.mark.root

SKIP_REASON = "needs root and a writable cgroup v1 or v2 hierarchy: "
PY = sys.executable


@pytest.fixture(scope="module")
def manager():
    """A manager with a root dir of its own, so parallel runs and a real agent on this
    host never see each other's job cgroups. Everything is removed at the end."""
    if os.geteuid() != 0:
        pytest.skip(SKIP_REASON + f"not root (euid {os.geteuid()})")
    m = cgroups.detect(root_name=f"corral-test-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    if not m.enforced:
        pytest.skip(SKIP_REASON + m.reason)
    try:
        yield m
    finally:
        m.remove_job_cgroups()
        assert m.cleanup(), f"could not remove {m.roots}"
        assert not any(os.path.exists(d) for d in m.roots.values())


@pytest.fixture
def cgroup_factory(manager):
    created, started = [], []

    def make(memory_mb=64, cpu_percent=100, max_processes=None):
        cg = manager.create(f"job-{uuid.uuid4().hex[:8]}-0", memory_mb, cpu_percent, max_processes)
        created.append(cg)
        return cg

    make.started = started
    try:
        yield make
    finally:
        for job in started:
            job.kill(0)
        for cg in created:
            cg.kill()
            assert cg.remove(), f"could not remove {cg}"


@pytest.fixture
def workroot():
    """A 0755 directory (tmp_path's parents are 0700, which `nobody` cannot traverse)."""
    root = tempfile.mkdtemp(prefix="corral-cg-test-", dir="/tmp")
    os.chmod(root, 0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def run(cgroup_factory, workroot, command, cg, user=None):
    workdir = os.path.join(workroot, "work-" + uuid.uuid4().hex[:6])
    os.mkdir(workdir)
    job = {"job_id": "job-7", "command": command}
    rj = runner.start(job, workdir, ENV, 65536, cgroup=cg, user=user)
    cgroup_factory.started.append(rj)
    return rj, workdir


def wait_exit(rj, timeout=20.0):
    wait_for(lambda: rj.poll() is not None, timeout=timeout, interval=0.01, message="job exit")
    return rj.result()


def _has_mount(fstype, option=None):
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            if fields[sep + 1] == fstype and (option is None or option in fields[sep + 3].split(",")):
                return True
    return False


# --- detection ---------------------------------------------------------------------

def test_detect_finds_memory_and_cpu(manager):
    d = manager.describe()
    assert d["mode"] == manager.mode in ("v1", "v2") and d["enforced"] is True
    assert {"memory", "cpu"} <= set(d["controllers"])
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else ["unified"]:
                own[c] = path
    for ctrl, root in d["dirs"].items():
        # Nested under the agent's own cgroup, never at the hierarchy root (on v2 the
        # agent has since moved itself into the <own>/agent leaf).
        path = own[ctrl].removesuffix("/" + cgroups.AGENT_LEAF) if ctrl == "unified" else own[ctrl]
        assert root.endswith(os.path.join(path, manager.root_name).replace("//", "/"))
        assert os.path.isdir(root)
    unified_has_memory = False
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        unified_has_memory = "memory" in open("/sys/fs/cgroup/cgroup.controllers").read().split()
    if _has_mount("cgroup", "memory") and not unified_has_memory:
        assert manager.mode == "v1"  # this machine: separate memory/cpu/cpuacct/freezer mounts
        assert {"cpuacct", "freezer"} <= set(d["controllers"])


def test_not_root_means_no_cgroups():
    m = cgroups.detect(euid=1000)
    assert m.mode == "none" and m.enforced is False and "not root" in m.reason
    cg = m.create("job-1-0", 64, 50, 100)
    assert cg.paths() == [] and cg.kill() and cg.remove() and not cg.oom_killed()
    assert cg.stats() == {"peak_memory_bytes": None, "cpu_seconds": None}
    assert cg.limits == {"memory_mb": 64, "cpu_percent": 50, "max_processes": None}
    assert not m.limits_processes


def test_unusable_hierarchies_mean_no_cgroups(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/agent\n1:cpu,cpuacct:/agent\n0::/agent\n")
    mountinfo = tmp_path / "mountinfo"
    # Only a cpu hierarchy, and its directory for /agent does not exist.
    mountinfo.write_text(f"32 31 0:29 / {tmp_path}/cpu rw - cgroup cgroup rw,cpu,cpuacct\n")
    m = cgroups.detect(str(proc), str(mountinfo), euid=0)
    assert m.mode == "none" and not m.enforced
    assert "memory" in m.reason and "cgroup v2" in m.reason
    # A memory hierarchy whose directory is a regular file: mkdir fails, no exception.
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "agent").mkdir()
    (tmp_path / "memory" / "agent" / "corral").write_text("in the way")
    (tmp_path / "cpu" / "agent").mkdir(parents=True)
    mountinfo.write_text(mountinfo.read_text()
                         + f"35 31 0:30 / {tmp_path}/memory rw - cgroup cgroup rw,memory\n")
    m = cgroups.detect(str(proc), str(mountinfo), euid=0)
    assert m.mode == "none" and "memory" in m.reason, m.reason
    assert cgroups.detect(str(tmp_path / "missing"), str(mountinfo), euid=0).mode == "none"


def fake_v2_tree(tmp_path, controllers: str, procs: str = ""):
    """A cgroup2 mount at <tmp_path>/cg with the agent in /svc, which offers
    `controllers`: (the agent's dir, its /proc/self/cgroup, the mountinfo)."""
    own = tmp_path / "cg" / "svc"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text(controllers + "\n")
    (own / "cgroup.subtree_control").write_text("")
    (own / "cgroup.procs").write_text(procs)
    proc = tmp_path / "cgroup"
    proc.write_text("0::/svc\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"41 31 0:38 / {tmp_path}/cg rw - cgroup2 cgroup2 rw\n")
    return own, proc, mountinfo


def test_v2_setup_on_a_fake_tree(tmp_path):
    """v2 cannot run here for real (no memory controller in this cgroup2); check the
    file writes on a fake tree: agent moved to a leaf first, controllers enabled, limits."""
    own, proc, mountinfo = fake_v2_tree(tmp_path, "cpuset cpu io memory pids", "4242\n")
    m = cgroups.detect(str(proc), str(mountinfo), euid=0)
    assert m.mode == "v2", m.reason
    assert m.limits_processes and m.controllers == ["memory", "cpu", "pids"]
    assert (own / "agent" / "cgroup.procs").read_text() == "4242"
    assert (own / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert (own / "corral" / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    (own / "cgroup.procs").write_text("")  # what the kernel would show after the move
    (own / "cgroup.subtree_control").write_text("memory cpu pids")
    (own / "corral" / "cgroup.subtree_control").write_text("memory cpu pids")
    cg = m.create("job-3-1", 256, 150, 20)
    d = own / "corral" / "job-3-1"
    assert (d / "memory.max").read_text() == str(256 * 1024 * 1024)
    assert (d / "memory.oom.group").read_text() == "1"
    assert (d / "cpu.max").read_text() == "150000 100000"
    assert (d / "pids.max").read_text() == "20"
    assert cg.paths() == [str(d)]
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (d / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    (d / "memory.peak").write_text("1048576\n")
    assert cg.oom_killed() and cg.oom_kills() == 1
    assert cg.stats() == {"peak_memory_bytes": 1048576, "cpu_seconds": 2.5}
    assert m.list_job_cgroups() == ["job-3-1"]
    assert m.adopt("job-3-1").limits == {"memory_mb": 256, "cpu_percent": 150, "max_processes": 20}
    assert m.adopt("job-9-9") is None
    assert (m.create("job-4-1", None, None, None).dir and (own / "corral" / "job-4-1" / "pids.max").read_text()
            == "max")
    # An agent restarted inside <own>/agent keeps using <own>.
    proc.write_text("0::/svc/agent\n")
    assert cgroups.detect(str(proc), str(mountinfo), euid=0, prepare=False).base == str(own)


def test_v2_without_a_pids_controller_sets_no_process_limit(tmp_path):
    own, proc, mountinfo = fake_v2_tree(tmp_path, "cpu memory")
    m = cgroups.detect(str(proc), str(mountinfo), euid=0)
    assert m.mode == "v2" and not m.limits_processes and "no pids controller" in m.reason
    assert (own / "corral" / "cgroup.subtree_control").read_text() == "+memory +cpu"
    (own / "corral" / "cgroup.subtree_control").write_text("memory cpu")
    cg = m.create("job-1-1", 64, 100, 20)
    assert cg.limits["max_processes"] is None
    assert not (own / "corral" / "job-1-1" / "pids.max").exists()


def test_v2_usage_reads_memory_current_and_cpu_stat(tmp_path):
    own, proc, mountinfo = fake_v2_tree(tmp_path, "cpu memory")
    m = cgroups.detect(str(proc), str(mountinfo), euid=0)
    (own / "corral" / "cgroup.subtree_control").write_text("memory cpu")
    cg = m.create("job-1-1", 64, 100)
    d = own / "corral" / "job-1-1"
    assert cg.usage() == {"memory_bytes": None, "cpu_seconds": None}  # nothing written yet
    (d / "memory.current").write_text("5242880\n")
    (d / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n")
    assert cg.usage() == {"memory_bytes": 5242880, "cpu_seconds": 1.5}


def test_v1_usage_reads_usage_in_bytes_and_cpuacct(tmp_path):
    memory, cpuacct = tmp_path / "memory", tmp_path / "cpuacct"
    memory.mkdir()
    cpuacct.mkdir()
    (memory / "memory.usage_in_bytes").write_text("7340032\n")
    (cpuacct / "cpuacct.usage").write_text("2500000000\n")
    cg = cgroups.V1JobCgroup("job-1-1", {"memory": str(memory), "cpuacct": str(cpuacct)}, 64, 100)
    assert cg.usage() == {"memory_bytes": 7340032, "cpu_seconds": 2.5}
    without_cpuacct = cgroups.V1JobCgroup("job-1-1", {"memory": str(memory)}, 64, 100)
    assert without_cpuacct.usage() == {"memory_bytes": 7340032, "cpu_seconds": None}
    assert cgroups.NullJobCgroup("job-1-1").usage() == {"memory_bytes": None, "cpu_seconds": None}


def test_bad_names_and_limits_are_refused(manager):
    for name in ("../x", "", "a/b", ".hidden"):
        with pytest.raises(ValueError):
            manager.create(name, 64, 100)
    with pytest.raises(ValueError):
        manager.create("job-1-0", 0, 100)
    with pytest.raises(ValueError):
        manager.create("job-1-0", 64, 100, 0)


# --- limits, through the runner and the launch chain --------------------------------

TOUCH_200MB = (f"{PY} -c \"b = bytearray(200 * 1024 * 1024)\n"
               f"for i in range(0, len(b), 4096): b[i] = 1\nprint('survived')\"")
TOUCH_20MB = TOUCH_200MB.replace("200", "20")


def test_memory_limit_kills_with_sigkill_and_counts_the_oom(cgroup_factory, workroot):
    cg = cgroup_factory(memory_mb=64)
    rj, _ = run(cgroup_factory, workroot, "exec " + TOUCH_200MB, cg)
    result = wait_exit(rj)
    assert result.exit_code == -signal.SIGKILL, result
    assert "survived" not in result.stdout
    assert cg.oom_killed() and cg.oom_kills() >= 1
    assert cgroups.ended_by_oom(result.exit_code, cg)
    peak = cg.stats()["peak_memory_bytes"]
    assert peak is not None and 32 * 2**20 < peak <= 64 * 2**20, peak


def test_oom_of_a_child_is_reported_by_its_shell_as_137(cgroup_factory, workroot):
    cg = cgroup_factory(memory_mb=64)
    rj, _ = run(cgroup_factory, workroot, TOUCH_200MB + "; exit $?", cg)
    result = wait_exit(rj)
    assert result.exit_code in (137, -signal.SIGKILL), result  # v1 kills the child, v2 the group
    assert cgroups.ended_by_oom(result.exit_code, cg)
    assert not cgroups.ended_by_oom(0, cg)


def test_job_under_the_limit_exits_0(cgroup_factory, workroot):
    cg = cgroup_factory(memory_mb=64)
    rj, _ = run(cgroup_factory, workroot, TOUCH_20MB, cg)
    result = wait_exit(rj)
    assert (result.exit_code, result.stdout) == (0, "survived\n"), result
    assert not cg.oom_killed() and cg.oom_kills() == 0
    assert not cgroups.ended_by_oom(-signal.SIGKILL, cg)  # a SIGKILL alone is no OOM
    peak = cg.stats()["peak_memory_bytes"]
    # 20 MB touched plus the interpreter, well under the limit.
    assert peak is not None and 20 * 2**20 < peak < 64 * 2**20, peak


def test_a_running_jobs_usage_is_read_from_its_cgroup(cgroup_factory, workroot):
    cg = cgroup_factory(memory_mb=64, cpu_percent=100)
    busy = TOUCH_20MB.replace("print('survived')", "import time\nwhile True: pass")
    run(cgroup_factory, workroot, busy, cg)

    def touched_and_busy():
        used = cg.usage()
        return used if (used["memory_bytes"] or 0) > 20 * 2**20 and (used["cpu_seconds"] or 0) > 0.2 else None

    used = wait_for(touched_and_busy, timeout=20, message="the job's memory and CPU in its cgroup")
    assert used["memory_bytes"] < 64 * 2**20, used
    assert cg.kill() and cg.remove()
    assert cg.usage() == {"memory_bytes": None, "cpu_seconds": None}  # gone: unknown, never an error


BUSY = f"{PY} -c \"import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end: pass\""


def _favour(manager):
    """Give the test's root cgroup the largest CPU weight. The quota is an upper bound;
    other processes on a small shared host (measured here: 2 CPUs, neighbours' test
    suites) otherwise push an unthrottled 100% job down to 0.80 of a core."""
    if manager.mode == "v1":
        path, value = os.path.join(manager.roots["cpu"], "cpu.shares"), "262144"
    else:
        path, value = os.path.join(manager.roots["unified"], "cpu.weight"), "10000"
    with open(path) as f:
        old = f.read().strip()
    with open(path, "w") as f:
        f.write(value)
    return path, old


@pytest.mark.parametrize("percent,low,high", [(50, 0.35, 0.65), (100, 0.8, 1.1)])
def test_cpu_quota(manager, cgroup_factory, workroot, percent, low, high):
    path, old = _favour(manager)
    try:
        _check_cpu_quota(cgroup_factory, workroot, percent, low, high)
    finally:
        with open(path, "w") as f:
            f.write(old)


def _check_cpu_quota(cgroup_factory, workroot, percent, low, high):
    cg = cgroup_factory(memory_mb=256, cpu_percent=percent)
    begin = time.monotonic()
    rj, _ = run(cgroup_factory, workroot, BUSY, cg)
    result = wait_exit(rj)
    wall = time.monotonic() - begin
    assert result.exit_code == 0, result
    cpu = cg.stats()["cpu_seconds"]
    assert cpu is not None
    assert low <= cpu / wall <= high, f"cpu {cpu:.3f}s over wall {wall:.3f}s = {cpu / wall:.2f}"
    if cg.mode == "v1" and percent < 100:  # the quota, not contention, held it back
        with open(os.path.join(cg.dirs["cpu"], "cpu.stat")) as f:
            assert int(f.read().split("nr_throttled")[1].split()[0]) > 0


def test_job_is_in_its_cgroup_before_it_runs(cgroup_factory, workroot):
    """The job's shell (the process the set-up stage moved: on v1 through `tasks`, its
    one thread) and a child it forks are in the job's cgroup of every hierarchy."""
    cg = cgroup_factory()
    rj, _ = run(cgroup_factory, workroot, "cat /proc/$$/cgroup; echo --; cat /proc/self/cgroup", cg)
    result = wait_exit(rj)
    assert result.exit_code == 0, result
    for part in result.stdout.split("--\n"):
        lines = part.splitlines()
        if cg.mode == "v1":
            for controller in cg.dirs:
                line = [line for line in lines if controller in line.split(":")[1].split(",")]
                assert line and line[0].endswith(f"/{cg.name}"), (controller, lines)
        else:
            assert any(line.startswith("0::") and line.endswith(f"/{cg.name}") for line in lines), lines


def test_a_failed_cgroup_join_is_exit_125_with_a_message(cgroup_factory, workroot):
    cg = cgroup_factory()
    cg.remove()  # the directory is gone: the set-up stage cannot join it
    rj, _ = run(cgroup_factory, workroot, "echo ran", cg)
    result = wait_exit(rj)
    assert result.exit_code == launch.SETUP_FAILED_EXIT == 125
    assert result.stdout == ""
    assert launch.JOIN_FAILED_MESSAGE in result.stderr, result.stderr
    assert launch.setup_failed(result.exit_code, result.stderr)


# Forks up to {n} sleeping children, stops at the first the kernel refuses, prints how many.
FORK_UNTIL_REFUSED = (f"{PY} -c \"import os, time\nn = 0\nfor _ in range({{n}}):\n"
                      "    try: pid = os.fork()\n    except OSError: break\n"
                      "    if pid == 0: time.sleep(60); os._exit(0)\n    n += 1\nprint(n)\"")


def test_the_pids_limit_bounds_the_jobs_processes(manager, cgroup_factory, workroot):
    if not manager.limits_processes:
        pytest.skip(SKIP_REASON + "no pids controller")
    cg = cgroup_factory(max_processes=20)
    rj, _ = run(cgroup_factory, workroot, FORK_UNTIL_REFUSED.format(n=60), cg)
    result = wait_exit(rj)
    assert result.exit_code == 0, result
    started = int(result.stdout)
    assert 10 <= started < 20, result  # the job's own process counts too
    with open(os.path.join(cg.dirs.get("pids") or cg.dirs["unified"], "pids.max")) as f:
        assert f.read().strip() == "20"
    assert cg.limits["max_processes"] == 20


# --- killing a whole tree --------------------------------------------------------------

TREE = """
echo $$ > main.pid
sh -c '
  echo $$ > child.pid
  setsid sh -c "trap \\"\\" TERM; echo \\$\\$ > grandchild.pid; sleep 300 & echo \\$! > sleeper.pid; wait" &
  sleep 300' &
sleep 300
"""


def _read_pids(workdir):
    names = ("main.pid", "child.pid", "grandchild.pid", "sleeper.pid")
    return [int(open(os.path.join(workdir, n)).read()) for n in names
            if os.path.exists(os.path.join(workdir, n)) and open(os.path.join(workdir, n)).read().strip()]


def _session(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[3])


def test_kill_ends_a_setsid_grandchild_and_remove_deletes_the_dirs(cgroup_factory, workroot):
    cg = cgroup_factory()
    rj, workdir = run(cgroup_factory, workroot, TREE, cg)
    pids = wait_for(lambda: len(_read_pids(workdir)) == 4 and _read_pids(workdir),
                    message="four recorded pids")
    main, _, grandchild, _ = pids
    assert _session(grandchild) != _session(main)  # it really left the job's session
    in_cgroup = wait_for(lambda: set(pids) <= set(cg.pids()) and cg.pids(), message="pids in cgroup")
    assert cg.kill(timeout=5)
    for pid in set(pids) | set(in_cgroup):
        wait_for(lambda: process_gone(pid), timeout=5, message=f"pid {pid} gone")
    assert cg.pids() == []
    assert rj.result().exit_code == -signal.SIGKILL
    assert cg.remove()
    assert not any(os.path.exists(p) for p in cg.paths())


def test_runner_kill_reaches_setsid_processes_through_the_cgroup(cgroup_factory, workroot):
    cg = cgroup_factory()
    rj, workdir = run(cgroup_factory, workroot, TREE, cg)
    pids = wait_for(lambda: len(_read_pids(workdir)) == 4 and _read_pids(workdir),
                    message="four recorded pids")
    rj.kill(0.2)  # TERM is ignored by the grandchild; the cgroup kill still ends it
    for pid in pids:
        wait_for(lambda: process_gone(pid), timeout=5, message=f"pid {pid} gone")
    assert cg.pids() == []


# --- running as a uid of its own ------------------------------------------------------------

@pytest.mark.parametrize("dropper", ["setpriv", "python"])
def test_job_runs_as_its_own_uid_inside_its_cgroup(cgroup_factory, workroot, monkeypatch, dropper, tmp_path):
    tools = runner.tools()
    if dropper == "python":
        monkeypatch.setattr(runner, "_TOOLS", launch.Tools(None, tools.unshare, tools.mount))
    elif tools.setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    users = identity.job_users(uid_range=(70000, 79999), pool_path=str(tmp_path / "uids.json"), euid=0,
                               claims_dir=str(tmp_path / "claims"))
    who = users.acquire("job-8-1", "/unused")
    assert who.uid == who.gid == 70000 and who.switch and who.groups == ()
    locked = os.path.join(workroot, "root-only")
    os.mkdir(locked)
    os.chmod(locked, 0o755)
    cg = cgroup_factory()
    command = (f"id -u; id -G; echo hi > mine.txt && echo wrote-workdir; "
               f"echo no > {locked}/x.txt 2>/dev/null && echo wrote-locked || echo denied; "
               f"echo \"$HOME $USER\"; grep -E '^(Uid|Gid|Groups|CapEff|CapPrm):' /proc/$$/status; "
               f"cat /proc/$$/cgroup")
    workdir = os.path.join(workroot, "work-own-uid")
    os.mkdir(workdir)
    identity.prepare_workdir(workdir, who)
    job = {"job_id": "job-8", "command": command}
    env = {**ENV, **who.env(workdir)}
    rj = runner.start(job, workdir, env, 65536, cgroup=cg, user=who.launch_user())
    cgroup_factory.started.append(rj)
    result = wait_exit(rj)
    assert result.exit_code == 0, result
    lines = result.stdout.splitlines()
    assert lines[0] == "70000"
    assert lines[1].split() == ["70000"]  # its own gid only: no root groups left
    assert lines[2:4] == ["wrote-workdir", "denied"]
    assert lines[4] == f"{workdir} corral-70000"  # no passwd entry: HOME is the work dir
    status = {line.split(":")[0]: line.split(":", 1)[1].split() for line in lines[5:10]}
    # Real, effective, saved and fs ids all switched: no way back to root; no capabilities.
    assert status["Uid"] == ["70000"] * 4 and status["Gid"] == ["70000"] * 4, status
    assert status["Groups"] == []
    assert int(status["CapEff"][0], 16) == 0 and int(status["CapPrm"][0], 16) == 0
    assert any(line.endswith(f"/{cg.name}") for line in lines[10:])
    assert os.stat(os.path.join(workdir, "mine.txt")).st_uid == 70000
    assert not os.path.exists(os.path.join(locked, "x.txt"))


def test_job_runs_as_another_user_without_cgroups(workroot):
    """NoCgroups: no set-up stage, the drop comes first."""
    if os.geteuid() != 0:
        pytest.skip(SKIP_REASON + "not root")
    who = identity.resolve()
    workdir = os.path.join(workroot, "plain")
    os.mkdir(workdir)
    identity.prepare_workdir(workdir, who)
    cg = cgroups.detect(euid=1000).create("job-1-0", None, None)
    job = {"job_id": "job-9", "command": "id -u; touch ok && echo wrote"}
    rj = runner.start(job, workdir, ENV, 4096, cgroup=cg, user=who.launch_user())
    try:
        assert wait_exit(rj).stdout == f"{who.uid}\nwrote\n"
    finally:
        rj.kill(0)


def test_leftover_cgroup_is_replaced_and_adopt_finds_it(manager, workroot):
    name = f"job-left-{uuid.uuid4().hex[:6]}"
    old = manager.create(name, 64, 100, 50)
    workdir = os.path.join(workroot, "left")
    os.mkdir(workdir)
    sleeper = runner.start({"command": "exec sleep 300"}, workdir, ENV, 100, cgroup=old)
    try:
        wait_for(lambda: old.pids() == [sleeper.pid], message="sleeper in cgroup")
        assert name in manager.list_job_cgroups()
        adopted = manager.adopt(name)
        processes = 50 if manager.limits_processes else None
        assert adopted.limits == {"memory_mb": 64, "cpu_percent": 100, "max_processes": processes}
        assert adopted.pids() == [sleeper.pid]
        new = manager.create(name, 128, 50)  # the leftover is killed and removed first
        assert sleeper.result().exit_code == -signal.SIGKILL
        assert new.limits == {"memory_mb": 128, "cpu_percent": 50, "max_processes": None}
        assert new.pids() == []
        assert manager.adopt(name).limits["memory_mb"] == 128
    finally:
        sleeper.kill(0)
        cg = manager.adopt(name)
        if cg is not None:
            cg.kill()
            assert cg.remove()


def test_without_a_hierarchy_there_are_no_job_cgroups(tmp_path, monkeypatch):
    (tmp_path / "not-a-cgroup").mkdir()
    monkeypatch.chdir(tmp_path)  # os.scandir(None) would list this directory
    manager = cgroups.NoCgroups("not root", "corral-none")
    assert manager.list_job_cgroups() == [] and manager.remove_job_cgroups() == []
