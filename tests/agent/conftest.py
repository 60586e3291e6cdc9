"""The agent's tests' shared fixtures: the real scheduler app behind `responses` for the
test's node (a module with real processes gives each test a node of its own) and the
mocked registry beside it (lease renewals reach the app with `leases`), a clock the
test moves and Agents built on them;
`corral-agent` processes against the real registry and scheduler served on loopback."""
import contextlib
import os
import re
import signal
import subprocess

import pytest
import responses

from agent_support import AGENT_SLOTS, BIN, SAME_USER, FakeClock, agent_env, remove_node_cgroups, skip_reason
from cluster import Cluster, started
from corral.agent import cgroups, forkserver, runner, spawner
from corral.agent.agent import Agent
from corral.agent.settings import AgentSettings
from corral.scheduler.models import NodeLease
from corral.shared.clients import RegistryClient, SchedulerClient
from fake_registry import FakeRegistry
from helpers import stop_held_jobs
from scheduler_double import NODE, REGISTRY, SCHEDULER, serving


@pytest.fixture(scope="session")
def fork_server():
    """One fork server for the session's agent tests, where jobs can be started through
    one (root; a known machine): what a corral-agent makes at its start."""
    if os.geteuid() != 0 or not spawner.machine_known():
        yield None
        return
    server = forkserver.ForkServer.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(autouse=True)
def job_launch(request, fork_server):
    """Jobs start as a corral-agent starts them: through the fork server; a test marked
    `chain_launch` through launch.py's chain of programs (AGENT_FORK_SERVER=false)."""
    chain = request.node.get_closest_marker("chain_launch") is not None
    runner.use_fork_server(None if chain else fork_server)
    try:
        yield
    finally:
        runner.use_fork_server(None)


@pytest.fixture
def real_node():
    """Skips the test where agents cannot run jobs for real: not root, no usable cgroups,
    no python3 every user may run (agent_support.skip_reason)."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def node():
    return NODE


@pytest.fixture
def scheduler_settings():
    """The scheduler double's settings beyond its defaults (a module may override it)."""
    return {}


@pytest.fixture
def scheduler(api, tmp_path, node, scheduler_settings):
    with serving(api, str(tmp_path / "scheduler.db"), node, SCHEDULER, **scheduler_settings) as double:
        yield double


@pytest.fixture
def leases(api, scheduler, node):
    """Lease renewals reach the scheduler double's app (its `_forward`: the real route);
    returns a reader of the node's lease row: (used_memory_mb, used_cpu_percent), or
    None before any renewal."""
    api.add_callback(responses.POST, re.compile(re.escape(SCHEDULER) + r"/nodes/[^/]+/lease$"),
                     callback=scheduler._forward)

    def used() -> tuple[int | None, int | None] | None:
        with scheduler.store.db.connection_context():
            row = NodeLease.get_or_none(NodeLease.node_id == node)
        return None if row is None else (row.used_memory_mb, row.used_cpu_percent)

    return used


@pytest.fixture
def registry(api, node):
    return FakeRegistry(api, node)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def make_scheduler(api, tmp_path):
    """The real scheduler with settings of the test's choosing (one per test)."""
    with contextlib.ExitStack() as stack:
        yield lambda **settings: stack.enter_context(
            serving(api, str(tmp_path / "scheduler.db"), NODE, SCHEDULER, **settings))


@pytest.fixture
def agent(make_agent):
    return make_agent()


@pytest.fixture
def make_agent(tmp_path, api, clock):
    agents = []

    def make(clock=clock, cgroup_manager=None, **overrides):
        values = dict(node_id=NODE, registry_url=REGISTRY, scheduler_url=SCHEDULER,
                      state_dir=str(tmp_path / "state"), slots=2, poll_interval=0.05,
                      heartbeat_interval=0.05, labels={"zone": "a"}, output_tail_bytes=4096,
                      stop_grace=0.2, kill_grace=0.3, max_memory_mb=4096, max_cpu_percent=400,
                      disk_limit_mode="watch")  # no loop-mounted work dirs: test_disk_fs_integration.py has them
        values.update(overrides)
        agent = Agent(AgentSettings(**values), RegistryClient(REGISTRY), SchedulerClient(SCHEDULER),
                      clock=clock, job_identity=SAME_USER,
                      cgroup_manager=cgroup_manager or cgroups.NoCgroups("unit tests", "corral-unit"))
        agent.startup()
        agents.append(agent)
        return agent

    yield make
    stop_held_jobs(agents)  # no job process outlives its test


@pytest.fixture
def cluster(tmp_path, request):
    """The real registry and scheduler under gunicorn (tests/conftest.py's `cluster`),
    with room for as many jobs on a node as its agent has slots."""
    with started(Cluster(tmp_path, MAX_JOBS_PER_NODE=AGENT_SLOTS), request) as c:
        yield c


@pytest.fixture
def start_agent(cluster, node, state_dir):
    where = {"registry_url": cluster.registry_url, "scheduler_url": cluster.scheduler_url}
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
