"""What the agent's tests share: what a host needs for real jobs (root, a writable
cgroup hierarchy, a python3 any uid may run), a job user, the `corral-agent` command
and its environment, a node's cgroups removed after a test, and a clock the test moves."""
import os
import shutil
import sys

from corral.agent import cgroups, identity
from corral.agent.settings import AgentSettings
from helpers import unmount_under

SKIP_REASON = "needs root and a writable cgroup v1 or v2 hierarchy: "
# The job's uid must be able to run it: not a python under /root.
PYTHON3 = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
# Jobs run as the test's own user in the unit tests: tmp_path is not reachable by `nobody`.
SAME_USER = identity.resolve(run_as_root=os.geteuid() == 0)
BIN = os.path.dirname(sys.executable)
AGENT_SLOTS = 2


def skip_reason():
    if os.geteuid() != 0:
        return SKIP_REASON + f"not root (euid {os.geteuid()})"
    manager = cgroups.detect(root_name="corral-probe", prepare=False)
    if not manager.enforced:
        return SKIP_REASON + manager.reason
    if PYTHON3 is None:
        return "needs a python3 in /usr/local/bin, /usr/bin or /bin that any user can run"
    return None


def http_server(port: int) -> str:
    return f"exec {PYTHON3} -u -m http.server --bind 127.0.0.1 {port}"


def agent_env(node, state_dir, registry_url, scheduler_url, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "AGENT_"))}
    env.update(NODE_ID=node, REGISTRY_URL=registry_url, SCHEDULER_URL=scheduler_url,
               CORRAL_STATE_DIR=state_dir, POLL_INTERVAL_SECS="0.1", HEARTBEAT_INTERVAL_SECS="0.5",
               AGENT_STOP_GRACE_SECS="0.5", AGENT_KILL_GRACE_SECS="0.5",
               AGENT_HEALTH_INTERVAL_SECS="0.2", AGENT_HEALTH_TIMEOUT_SECS="0.5",
               AGENT_SLOTS=str(AGENT_SLOTS), CORRAL_LOG_LEVEL="INFO", AGENT_OUTPUT_INTERVAL_SECS="0",
               # Alike on every machine: a test that wants GPUs declares them (a JSON file).
               AGENT_GPUS="none")
    # CPU for a default service job (200%) in each slot: the slots, not this machine's
    # CPUs, bound what the node runs at once (placement reserves each job's CPU).
    slots = int(extra.get("AGENT_SLOTS", AGENT_SLOTS))
    env["AGENT_MAX_CPU_PERCENT"] = str(200 * slots)
    env.update(extra)
    return env


def only_empty_slots(manager) -> bool:
    """No job cgroup is left but the kept slots' (slot_cgroups.py), and those are empty."""
    return all(name.startswith("slot-") and not manager.adopt(name).pids() for name in manager.list_job_cgroups())


def remove_node_cgroups(node, state_dir):
    """End what the node's agent left (services) and remove its cgroup directories."""
    root_name = AgentSettings(node_id=node, state_dir=state_dir).cgroup_root_name
    manager = cgroups.detect(root_name=root_name)
    manager.remove_job_cgroups()
    assert manager.cleanup(), f"could not remove {manager.roots}"
    unmount_under(AgentSettings(node_id=node, state_dir=state_dir).agent_dir)  # work dir filesystems left


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, secs: float) -> None:
        self.now += secs
