"""The agent's tests' shared fixtures: the real scheduler app behind `responses`, a clock
the test moves and Agents built on them (test_agent, test_agent_lease); `corral-agent`
processes against the real services or test_isolation's fake control plane
(test_agent_integration, test_isolation)."""
import os
import signal
import subprocess

import pytest

from agent_support import BIN, SAME_USER, FakeClock, agent_env, remove_node_cgroups
from corral.agent import cgroups
from corral.agent.agent import Agent
from corral.agent.settings import AgentSettings
from corral.shared.clients import RegistryClient, SchedulerClient
from helpers import stop_held_jobs
from scheduler_double import NODE, REGISTRY, SCHEDULER, serving


@pytest.fixture
def scheduler(api, tmp_path):
    with serving(api, str(tmp_path / "scheduler.db"), NODE, SCHEDULER) as double:
        yield double


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def make_agent(tmp_path, api, clock):
    agents = []

    def make(clock=clock, cgroup_manager=None, **overrides):
        values = dict(node_id=NODE, registry_url=REGISTRY, scheduler_url=SCHEDULER,
                      state_dir=str(tmp_path / "state"), slots=2, poll_interval=0.05,
                      heartbeat_interval=0.05, labels={"zone": "a"}, output_tail_bytes=4096,
                      stop_grace=0.2, kill_grace=0.3, max_memory_mb=4096, max_cpu_percent=400)
        values.update(overrides)
        agent = Agent(AgentSettings(**values), RegistryClient(REGISTRY), SchedulerClient(SCHEDULER),
                      clock=clock, job_identity=SAME_USER,
                      cgroup_manager=cgroup_manager or cgroups.NoCgroups("unit tests", "corral-unit"))
        agent.startup()
        agents.append(agent)
        return agent

    yield make
    stop_held_jobs(agents)  # no job process outlives its test


def control_plane_env(request) -> dict:
    """Where a test's agents find the registry and the scheduler: the real services
    (`cluster`), or test_isolation's fake control plane (`plane`), which answers
    polling agents only."""
    if "plane" in request.fixturenames:
        fake = request.getfixturevalue("plane")
        return {"registry_url": fake.url, "scheduler_url": fake.url, "AGENT_LONG_POLL_SECS": "0"}
    real = request.getfixturevalue("cluster")
    return {"registry_url": real.registry_url, "scheduler_url": real.scheduler_url}


@pytest.fixture
def start_agent(request, node, state_dir):
    where = control_plane_env(request)
    procs = []

    def start(**extra):
        log = open(os.path.join(state_dir, f"agent-{len(procs)}.log"), "wb")
        proc = subprocess.Popen([os.path.join(BIN, "corral-agent")],
                                env=agent_env(node, state_dir, **{**where, **extra}),
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        log.close()
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        remove_node_cgroups(node, state_dir)  # also ends any service left running
