"""What the agent tells the control plane for placement: its registration (the
default limits of jobs that ask for none, and the system's reserve) reaches the
real registry app, and its lease renewals carry what its jobs use to the real
scheduler app (scheduler_double.py), when jobs run under cgroups."""
import json

import pytest
import responses

from corral.agent import cgroups
from corral.registry.app import create_app as registry_app
from corral.registry.settings import RegistrySettings
from helpers import wait_for
from scheduler_double import NODE, REGISTRY

MiB = 1024 * 1024


@pytest.fixture
def registry_nodes(api, tmp_path):
    """The real registry app on a SQLite file behind `responses`: the agent registers
    there; returns GET /nodes/{node} as the scheduler would read it."""
    client = registry_app(RegistrySettings(database_url=f"sqlite:///{tmp_path / 'registry.db'}")).test_client()

    def forward(request):
        answer = client.post("/nodes", data=request.body, headers={"Content-Type": "application/json"})
        return answer.status_code, {}, answer.get_data()

    api.add_callback(responses.POST, REGISTRY + "/nodes", callback=forward)
    return lambda: client.get(f"/nodes/{NODE}").json


class MeteredJobCgroup(cgroups.NullJobCgroup):
    """No limits applied; what the job uses comes from the test (`Metered.usage`)."""

    def __init__(self, name, memory_mb, cpu_percent, max_processes, manager):
        super().__init__(name, memory_mb, cpu_percent, max_processes)
        self.manager = manager

    def usage(self):
        reading = self.manager.usage.get(self.name)
        if isinstance(reading, Exception):
            raise reading
        return dict(reading or {"memory_bytes": None, "cpu_seconds": None})


class Metered(cgroups.Manager):
    """An `enforced` manager whose jobs use what the test says (the real cgroups are read
    in test_cgroups and test_agent_integration)."""
    mode = "fake"
    enforced = True
    limits_processes = True

    def __init__(self):
        super().__init__("metered cgroups for unit tests", "corral-unit")
        self.usage = {}

    def create(self, name, memory_mb, cpu_percent, max_processes=None):
        return MeteredJobCgroup(name, memory_mb, cpu_percent, max_processes, self)


def lease_bodies(api):
    return [json.loads(call.request.body) for call in api.calls if call.request.url.endswith("/lease")]


def running_in_its_cgroup(agent, scheduler, key=("job-1", 1), command="sleep 30"):
    scheduler.add(job_id=key[0], command=command)
    agent.intake.poll_once()
    return wait_for(lambda: (agent.jobs.get(key) or None) and agent.jobs.get(key).cgroup,
                    message="the job in its cgroup")


# --- the registration ----------------------------------------------------------------


def test_the_registration_carries_the_default_limits_and_the_reserve(make_agent, registry_nodes):
    agent = make_agent(cgroup_manager=Metered(), reserved_memory_mb=512, reserved_cpu_percent=50,
                       run_memory_mb=256, service_cpu_percent=300)
    agent.membership.register()
    node = registry_nodes()
    assert node["default_limits"] == agent.default_limits() == {
        "run": {"memory_mb": 256, "cpu_percent": 100, "max_processes": 1024},
        "service": {"memory_mb": 1024, "cpu_percent": 300, "max_processes": 1024}}
    assert (node["reserved_memory_mb"], node["reserved_cpu_percent"]) == (512, 50)
    assert (node["max_memory_mb"], node["max_cpu_percent"]) == (4096, 400)


def test_without_a_pids_controller_the_registered_defaults_limit_no_processes(make_agent, registry_nodes):
    agent = make_agent()  # no cgroups at all: the defaults are still what placement reserves
    agent.membership.register()
    node = registry_nodes()
    assert node["default_limits"]["run"] == {"memory_mb": 512, "cpu_percent": 100, "max_processes": None}
    assert (node["reserved_memory_mb"], node["reserved_cpu_percent"]) == (0, 0)


def test_a_lease_renewal_carries_what_the_jobs_use(make_agent, scheduler, leases, clock, api):
    fake = Metered()
    agent = make_agent(cgroup_manager=fake)
    cgroup = running_in_its_cgroup(agent, scheduler)
    fake.usage[cgroup.name] = {"memory_bytes": 300 * MiB, "cpu_seconds": 2.0}
    agent.membership.renew_with(agent.scheduler)
    # The first reading has no interval: memory only.
    assert lease_bodies(api)[-1] == {"usage": {"memory_mb": 300, "cpu_percent": 0}}
    assert leases() == (300, 0)
    fake.usage[cgroup.name] = {"memory_bytes": 310 * MiB, "cpu_seconds": 3.5}
    clock.advance(5)
    agent.membership.renew_with(agent.scheduler)
    assert leases() == (310, 30)  # 1.5 s of CPU in 5 s


def test_without_cgroups_a_renewal_carries_no_usage(make_agent, scheduler, leases, api):
    agent = make_agent()  # NoCgroups: limits not enforced, nothing to read
    running_in_its_cgroup(agent, scheduler)
    agent.membership.renew_with(agent.scheduler)
    assert lease_bodies(api) == [{}]
    assert leases() == (None, None)


def test_a_failed_reading_renews_the_lease_without_usage(make_agent, scheduler, leases, clock, api):
    fake = Metered()
    agent = make_agent(cgroup_manager=fake)
    cgroup = running_in_its_cgroup(agent, scheduler)
    fake.usage[cgroup.name] = OSError("the cgroup went away")
    agent.membership.renew_with(agent.scheduler)
    assert lease_bodies(api) == [{}] and leases() == (None, None)
    assert agent.membership.lease.sent_at == clock.now  # renewed all the same
