"""Service jobs with real processes, real cgroups, a uid of their own and a private
/tmp: registry record, health checks, log files, cancellation, and re-adoption by a
new Agent on the same state dir (which keeps the service's uid). The agent meets the
real scheduler app, with tokens on, through `responses` (scheduler_double.py) and a
mocked registry; health checks to 127.0.0.1 pass through to the real services. Needs
root and a writable cgroup hierarchy; CI runs as root."""
import json
import os
import re
import signal
import stat
import uuid

import pytest

from corral.agent import cgroups, services
from corral.agent.agent import Agent
from corral.agent.gpus import Gpu
from corral.agent.settings import AgentSettings
from corral.shared.clients import RegistryClient, SchedulerClient
from corral.shared.credentials import Credentials
from agent_support import http_server
from helpers import free_port, process_gone, stop_held_jobs, wait_for
from scheduler_double import REGISTRY, SCHEDULER

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("real_node")]


@pytest.fixture
def node():
    return f"svc-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def scheduler_settings():
    """Tokens on: a service job comes with the scheduler's grant for its record."""
    return {"credentials": Credentials(operator="o" * 32, agent_secret="a" * 32)}


@pytest.fixture
def make_agent(state_dir, node, scheduler, registry):
    agents = []

    def make(**overrides):
        values = dict(node_id=node, registry_url=REGISTRY, scheduler_url=SCHEDULER,
                      state_dir=state_dir, slots=3, poll_interval=0.05, output_tail_bytes=4096,
                      stop_grace=0.2, kill_grace=0.5, health_interval=0.2, health_timeout=0.5,
                      address="10.1.2.3")
        values.update(overrides)
        agent = Agent(AgentSettings(**values), RegistryClient(REGISTRY),
                      SchedulerClient(SCHEDULER, token=scheduler.node_token))
        agents.append(agent)
        return agent

    yield make
    # Nothing outlives the test: every job (services included) and this node's cgroups.
    stop_held_jobs(agents)
    manager = cgroups.detect(root_name=AgentSettings(node_id=node, state_dir=state_dir).cgroup_root_name)
    manager.remove_job_cgroups()
    assert manager.cleanup(), f"could not remove {manager.roots}"


def the_pid(agent, job_id, attempt=1):
    local = wait_for(lambda: agent.jobs.get((job_id, attempt))
                     and agent.jobs.get((job_id, attempt)).process
                     and agent.jobs.get((job_id, attempt)), message=f"{job_id} to start")
    return local.process.pid


def reap_until(agent, timeout=10):
    return wait_for(agent.reap_once, timeout=timeout, message="a job to end")


def test_service_is_recorded_health_checked_and_removed_on_cancel(make_agent, scheduler, registry,
                                                                 node):
    agent = make_agent()
    agent.startup()
    port = free_port()
    scheduler.add(job_id="job-1", job_type="service", command=http_server(port), port=port,
                  name="web", health_path="/")
    agent.intake.poll_once()
    pid = the_pid(agent, "job-1")
    local = agent.jobs.get(("job-1", 1))

    # Recorded right after start, health unknown; then healthy. The record names the attempt
    # and carries the scheduler's grant for it (the registry asks for it with tokens).
    first = wait_for(lambda: registry.upserts and registry.upserts[0], message="a service record")
    assert first == {"job_id": "job-1", "name": "web", "node_id": node, "address": "10.1.2.3",
                     "port": port, "attempt": 1, "grant": scheduler.grant("job-1", 1), "healthy": None}
    assert first["grant"] is not None
    wait_for(lambda: registry.healthy("job-1") is True, message="the service to be healthy")

    # Its own cgroup, its own uid, detached from the agent (own session), output to files
    # only the agent may open, a private /tmp.
    assert agent.private_tmp, agent.private_tmp_reason
    with open(f"/proc/{pid}/status") as f:
        assert re.search(rf"^Uid:\s+{local.uid}\s", f.read(), re.M)
    assert 70000 <= local.uid <= 79999
    assert pid in local.cgroup.pids() and os.getsid(pid) == pid
    assert os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
    assert local.log_files[0].startswith(os.path.join(agent.settings.log_root, "job-1-1."))
    for path in local.log_files:
        assert (stat.S_IMODE(os.stat(path).st_mode), os.stat(path).st_uid) == (0o600, 0)
    assert stat.S_IMODE(os.stat(agent.settings.log_root).st_mode) == 0o700
    with open(local.state_path) as f:
        state = json.load(f)
    assert (state["pid"], state["port"], state["name"], state["health_path"]) == (pid, port, "web", "/")
    assert state["start_time"] == services.proc_start_time(pid) and state["uid"] == local.uid
    assert stat.S_IMODE(os.stat(local.state_path).st_mode) == 0o600

    # A stopped server still accepts TCP (the kernel's backlog): only HTTP sees it hang.
    os.kill(pid, signal.SIGSTOP)
    try:
        assert services.check_health(port, None, 0.5) is True
        wait_for(lambda: registry.healthy("job-1") is False, message="the service to be unhealthy")
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: registry.healthy("job-1") is True, message="the service to recover")

    # Cancelled: the scheduler stops listing it. Killed, record removed, not reported.
    scheduler.cancel("job-1")
    assert agent.reconciler.reconcile_once() == [("job-1", 1)]
    assert reap_until(agent) == [("job-1", 1, "killed")]
    assert process_gone(pid)
    wait_for(lambda: "job-1" not in registry.records, message="the record to be removed")
    assert scheduler.statuses("job-1") == ["running"]
    assert not os.path.exists(local.state_path)
    assert not any(os.path.exists(p) for p in local.cgroup.paths())


def test_service_that_exits_is_reported_with_its_log_tails(make_agent, scheduler, registry):
    agent = make_agent(service_log_max_bytes=2000)
    agent.startup()
    # No port: never recorded nor checked; its logs are still trimmed.
    scheduler.add(job_id="job-1", job_type="service",
                  command="head -c 20000 /dev/zero | tr '\\0' x; echo; echo to-err >&2; "
                          "while [ ! -e stop ]; do sleep 0.05; done; echo last-line; exit 3")
    agent.intake.poll_once()
    the_pid(agent, "job-1")
    local = agent.jobs.get(("job-1", 1))
    out_file = local.log_files[0]
    wait_for(lambda: open(out_file).read().startswith("[corral: log truncated after"),
             message="the log to be truncated")
    assert os.path.getsize(out_file) < 2000
    open(os.path.join(local.workdir, "stop"), "w").close()
    assert reap_until(agent) == [("job-1", 1, "failed")]
    final = scheduler.final("job-1")
    assert final["exit_code"] == 3
    assert final["stdout"].startswith("[corral: log truncated after") and final["stdout"].endswith("last-line\n")
    assert final["stderr"] == "to-err\n"
    assert registry.upserts == [] and registry.deletes == []
    assert not os.path.exists(out_file) and not os.path.exists(local.workdir)


def test_a_service_with_a_tcp_check_exits_and_leaves_the_registry(make_agent, scheduler, registry):
    agent = make_agent()
    agent.startup()
    port = free_port()
    scheduler.add(job_id="job-1", job_type="service", command=http_server(port), port=port)
    agent.intake.poll_once()
    pid = the_pid(agent, "job-1")
    wait_for(lambda: registry.healthy("job-1") is True, message="a healthy TCP check")
    assert registry.records["job-1"]["name"] == "job-1"  # no name: the job id
    os.kill(pid, signal.SIGTERM)
    assert reap_until(agent) == [("job-1", 1, "failed")]
    final = scheduler.final("job-1")
    assert final["exit_code"] == -signal.SIGTERM
    assert f"Serving HTTP on 127.0.0.1 port {port}" in final["stdout"]
    wait_for(lambda: "job-1" not in registry.records, message="the record to be removed")


def test_a_new_agent_re_adopts_a_running_service(make_agent, scheduler, registry, node):
    first = make_agent()
    first.startup()
    port = free_port()
    scheduler.add(job_id="job-1", job_type="service", command=http_server(port), port=port,
                  name="web", health_path="/")
    scheduler.add(job_id="job-2", command="sleep 60")  # a run job: ended by the stop
    first.intake.poll_once()
    pid = the_pid(first, "job-1")
    the_pid(first, "job-2")
    popen = first.jobs.get(("job-1", 1)).process
    uid = first.jobs.get(("job-1", 1)).uid
    mount_ns = os.readlink(f"/proc/{pid}/ns/mnt")
    wait_for(lambda: registry.healthy("job-1") is True, message="the service to be healthy")

    first.shutdown(flush_secs=2)  # SIGTERM of the agent
    assert len(first.jobs) == 0
    assert scheduler.final("job-2")["status"] == "failed"
    assert not process_gone(pid) and "job-1" in registry.records  # left running, still recorded
    state_file = services.state_path(first.settings.service_state_root, "job-1", 1)
    assert os.path.exists(state_file)

    # A stray job cgroup of this node (a crashed agent's run job) is cleaned at start-up.
    manager = cgroups.detect(root_name=first.settings.cgroup_root_name)
    stray = manager.create("job-stray-1", 64, 100)
    checks_before = len(registry.upserts)

    second = make_agent()
    assert second.startup() == [("job-1", 1)]
    assert not any(os.path.exists(p) for p in stray.paths())
    adopted = second.jobs.get(("job-1", 1))
    assert adopted.process.pid == pid and adopted.adopted
    assert adopted.cgroup.pids() == [pid]  # no second copy
    # It keeps its uid and its private /tmp; no new job gets that uid while it runs.
    assert adopted.uid == uid and second.users.pool.held() == {"job-1-1": uid}
    assert os.readlink(f"/proc/{pid}/ns/mnt") == mount_ns
    scheduler.add(job_id="job-3", command="id -u")
    second.intake.poll_once()
    wait_for(lambda: ("job-3", 1, "done") in second.reap_once(), message="job-3 to end")
    assert scheduler.final("job-3")["stdout"] != f"{uid}\n"
    assert second.reconciler.reconcile_once() == []  # the scheduler still lists it: nothing to do
    assert second.intake.poll_once() == [] and second.reap_once() == []
    # Still health-checked by the new agent, which records it with the grant it was started with.
    wait_for(lambda: len(registry.upserts) > checks_before and registry.healthy("job-1") is True,
             message="the new agent to record the service")
    assert (registry.upserts[-1]["attempt"], registry.upserts[-1]["grant"]) == (1, scheduler.grant("job-1", 1))
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: registry.healthy("job-1") is False, message="the adopted service unhealthy")
    finally:
        os.kill(pid, signal.SIGCONT)

    # It exits: reported failed (its exit code is unknown), record and state file removed.
    os.kill(pid, signal.SIGTERM)
    assert reap_until(second) == [("job-1", 1, "failed")]
    popen.poll()  # reap the zombie: in this test the first agent's process is its parent
    final = scheduler.final("job-1")
    assert final["exit_code"] == -1
    assert final["stderr"].splitlines()[-1] == services.ADOPTED_MESSAGE
    assert f"Serving HTTP on 127.0.0.1 port {port}" in final["stdout"]
    wait_for(lambda: "job-1" not in registry.records, message="the record to be removed")
    assert not os.path.exists(state_file)
    assert not any(os.path.exists(p) for p in adopted.cgroup.paths())


def test_a_service_that_died_while_no_agent_watched_is_reported_failed(make_agent, scheduler,
                                                                        registry):
    agent = make_agent()
    # Its second attempt runs here as far as the scheduler knows (claimed by this node).
    scheduler.add(job_id="job-1", job_type="service", command="sleep 300", attempt=2)
    assert [j["job_id"] for j in scheduler.claim_unseen()] == ["job-1"]
    state_file = services.state_path(agent.settings.service_state_root, "job-1", 2)
    dead = services.ServiceState("job-1", 2, 999_999_999, 1, "job-1-2", 8080, "web", None,
                                 agent.settings.work_dir("job-1", 2), "/nonexistent.out", "/nonexistent.err")
    dead.write(state_file)
    assert agent.startup() == []
    assert not os.path.exists(state_file)
    agent.reconciler.reconcile_once()
    agent.outbox.flush()
    final = scheduler.final("job-1")
    assert (final["status"], final["attempt"], final["exit_code"]) == ("failed", 2, -1)


def test_a_cancelled_adopted_service_is_killed_through_its_cgroup(make_agent, scheduler, registry):
    first = make_agent()
    first.startup()
    port = free_port()
    # The service forks a child that ignores SIGTERM and leaves its session.
    scheduler.add(job_id="job-1", job_type="service", port=port,
                  command=f"setsid sh -c 'trap \"\" TERM; echo $$ > child.pid; sleep 300' & "
                          f"{http_server(port)}")
    first.intake.poll_once()
    pid = the_pid(first, "job-1")
    popen = first.jobs.get(("job-1", 1)).process
    workdir = first.jobs.get(("job-1", 1)).workdir
    child = int(wait_for(lambda: open(os.path.join(workdir, "child.pid")).read().strip(),
                         message="the child's pid"))
    first.shutdown(flush_secs=1)

    second = make_agent()
    assert second.startup() == [("job-1", 1)]
    scheduler.cancel("job-1")
    assert second.reconciler.reconcile_once() == [("job-1", 1)]
    assert reap_until(second) == [("job-1", 1, "killed")]
    popen.poll()
    assert process_gone(pid) and process_gone(child)
    wait_for(lambda: "job-1" not in registry.records, message="the record to be removed")
    assert scheduler.statuses("job-1") == ["running"]


def test_an_adopted_service_keeps_its_disk_limit(make_agent, scheduler, registry):
    first = make_agent()
    first.startup()
    scheduler.add(job_id="job-1", job_type="service", disk_mb=1,
                  command="touch ready; while [ ! -e grow ]; do sleep 0.1; done; head -c 5242880 /dev/zero > big; "
                          "sleep 300")
    first.intake.poll_once()
    workdir = first.settings.work_dir("job-1", 1)
    wait_for(lambda: os.path.exists(os.path.join(workdir, "ready")), message="the service to start")
    first.shutdown(flush_secs=2)  # it goes on running, left to the next agent

    second = make_agent()
    assert second.startup() == [("job-1", 1)]
    assert second.jobs.get(("job-1", 1)).disk_mb == 1
    open(os.path.join(workdir, "grow"), "w").close()
    assert wait_for(second.disk.check_once, timeout=30, message="the service to outgrow its limit") == [("job-1", 1)]
    assert wait_for(second.reap_once, timeout=30, message="the service to end") == [("job-1", 1, "failed")]
    final = scheduler.final("job-1")
    assert (final["ended_by"], final["stderr"].splitlines()[-1]) == ("disk", "job exceeded its disk limit of 1 MB")


def test_an_adopted_service_keeps_its_gpus(make_agent, scheduler, registry):
    """The next agent knows which GPUs the service holds (its state file), and reads their
    usage as the service's own."""
    gpu = Gpu("0", "GPU-aaaa", "NVIDIA L4", 23034, minor=0)
    first = make_agent(gpus=(gpu,), device_isolation="none")
    first.startup()
    scheduler.add(job_id="job-1", job_type="service", command="touch ready; exec sleep 300")
    scheduler.set_row("job-1", gpus=1, gpus_assigned=["GPU-aaaa"])
    first.intake.poll_once()
    workdir = first.settings.work_dir("job-1", 1)
    wait_for(lambda: os.path.exists(os.path.join(workdir, "ready")), message="the service to start")
    assert first.jobs.get(("job-1", 1)).gpus == ("GPU-aaaa",)
    first.shutdown(flush_secs=2)  # it goes on running, left to the next agent

    second = make_agent(gpus=(gpu,), device_isolation="none")
    assert second.startup() == [("job-1", 1)]
    assert second.jobs.get(("job-1", 1)).gpus == ("GPU-aaaa",)
