"""The agent's settings, read from environment variables (flags override them in cli.py).

Every variable is parsed and checked here, once, so a bad value stops the agent at
start with one clear SettingError instead of failing later in a loop.

Limits: a job's `memory_mb` / `cpu_percent` (null: the node's default for its job
type) may not exceed AGENT_MAX_MEMORY_MB / AGENT_MAX_CPU_PERCENT. A per-type default
that was left unset is lowered to the maximum on a small node (a 1-CPU node runs
services at 100%, not 200%); one that was set explicitly above the maximum is a
SettingError.
"""
from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from corral.shared.credentials import token_node
from corral.shared.errors import SettingError
from corral.shared.settings import (env_bool, env_file, env_float, env_int, env_str, env_urls, split_urls,
                                    state_dir)
from corral.shared.validate import NAME_RE

from .artifacts import Limits as ArtifactLimits
from .jobenv import passthrough_problem
from .uids import parse_range


# The scheduler refuses a report whose stdout or stderr is over 512 KiB characters;
# stay below that with room for the line the agent may append ("job timed out").
MAX_TAIL_BYTES = 512 * 1024
MiB = 1024 * 1024
# The scheduler lets a claim wait at most 25 s (below gunicorn's graceful_timeout).
MAX_LONG_POLL_SECS = 25.0

# The design's per-job-type defaults.
DEFAULT_RUN_MEMORY_MB = 512
DEFAULT_RUN_CPU_PERCENT = 100
DEFAULT_SERVICE_MEMORY_MB = 1024
DEFAULT_SERVICE_CPU_PERCENT = 200
# Jobs' own uids (identity.py, uids.py) and their process limit (pids.max).
DEFAULT_UID_RANGE = (70000, 79999)
DEFAULT_JOB_MAX_PROCESSES = 1024
DEFAULT_MAX_PROCESSES = 32768


@dataclass(frozen=True)
class AgentSettings:
    node_id: str
    # Base URLs, comma-separated when there are several replicas (the clients fail over).
    registry_url: str = "http://127.0.0.1:9000"
    scheduler_url: str = "http://127.0.0.1:9001"
    poll_interval: float = 3.0
    # Long-poll claims: how long each claim may wait on the scheduler for work; 0 turns
    # long-poll off (the agent asks every poll_interval, as the original design did).
    long_poll_secs: float = 20.0
    heartbeat_interval: float = 5.0
    state_dir: str = os.path.abspath("./var")
    slots: int = 1
    address: str = "127.0.0.1"
    labels: dict[str, str] = field(default_factory=dict)
    output_tail_bytes: int = 65536
    # Live output: how often the tails of running jobs' new output go to the scheduler; 0: never.
    output_interval: float = 2.0
    stop_grace: float = 10.0
    keep_work_dirs: bool = False
    token: str | None = field(default=None, repr=False)  # CORRAL_NODE_TOKEN; never logged
    # CA bundle that verifies https:// REGISTRY_URL and SCHEDULER_URL; None: the system's CAs.
    ca_bundle: str | None = None
    kill_grace: float = 5.0
    # Who jobs run as (identity.job_users): None means a uid per job when the agent is root.
    job_user: str | None = None
    run_as_root: bool = False
    # Limits (MB, percent of one CPU) per job type, and the most a job may ask for.
    run_memory_mb: int = DEFAULT_RUN_MEMORY_MB
    run_cpu_percent: int = DEFAULT_RUN_CPU_PERCENT
    service_memory_mb: int = DEFAULT_SERVICE_MEMORY_MB
    service_cpu_percent: int = DEFAULT_SERVICE_CPU_PERCENT
    max_memory_mb: int = field(default_factory=lambda: total_memory_mb() or DEFAULT_SERVICE_MEMORY_MB)
    max_cpu_percent: int = field(default_factory=lambda: (os.cpu_count() or 1) * 100)
    require_cgroups: bool = False
    # Jobs' isolation: a uid per job from this range (when the agent is root and neither
    # job_user nor run_as_root is set), a private /tmp where the kernel allows it, the
    # process limit of jobs that ask for none and the most one may ask for, and the
    # variables of the agent's environment passed to jobs beyond jobenv.FROM_AGENT.
    uid_range: tuple[int, int] = DEFAULT_UID_RANGE
    private_tmp: bool = True
    # Keep one job launch started ahead of the next run job (warm.py).
    warm_start: bool = True
    job_max_processes: int = DEFAULT_JOB_MAX_PROCESSES
    max_processes: int = DEFAULT_MAX_PROCESSES
    job_env_passthrough: tuple[str, ...] = ()
    # Services.
    health_interval: float = 5.0
    health_timeout: float = 2.0
    service_log_max_bytes: int = 64 * MiB
    # deploy_url artifacts (see artifacts.Limits).
    max_artifact_bytes: int = 512 * MiB
    max_unpacked_bytes: int = 2048 * MiB
    max_artifact_entries: int = 10_000
    max_artifact_ratio: float = 100.0
    artifact_connect_timeout: float = 10.0
    artifact_read_timeout: float = 60.0
    artifact_timeout: float | None = 1800.0  # None: no bound on a whole download

    @property
    def agent_dir(self) -> str:
        """This node's own directory under the state dir (several agents may share a host)."""
        return os.path.join(self.state_dir, "agent-" + safe_path_part(self.node_id))

    @property
    def work_root(self) -> str:
        return os.path.join(self.agent_dir, "work")

    @property
    def log_root(self) -> str:
        """Where services' stdout/stderr files live (<job>-<attempt>.out|.err)."""
        return os.path.join(self.agent_dir, "logs")

    @property
    def service_state_root(self) -> str:
        """One JSON file per running service, read by the next agent to re-adopt it."""
        return os.path.join(self.agent_dir, "services")

    @property
    def uid_pool_path(self) -> str:
        """Which uid each job holds (uids.UidPool), for the next agent."""
        return os.path.join(self.agent_dir, "uids.json")

    @property
    def cgroup_root_name(self) -> str:
        """This node's own directory in each cgroup hierarchy. Agents may share a host
        (a test cluster beside a real one, two local clusters): the name carries a
        short digest of the agent's state dir, so two agents of the same node id but
        different state dirs never clean up each other's job cgroups."""
        digest = hashlib.sha256(os.path.abspath(self.agent_dir).encode()).hexdigest()[:8]
        return f"corral-{safe_path_part(self.node_id)[:160]}-{digest}"

    @property
    def artifact_limits(self) -> ArtifactLimits:
        return ArtifactLimits(
            max_download_bytes=self.max_artifact_bytes,
            max_unpacked_bytes=self.max_unpacked_bytes,
            max_entries=self.max_artifact_entries,
            max_ratio=self.max_artifact_ratio,
            connect_timeout=self.artifact_connect_timeout,
            read_timeout=self.artifact_read_timeout,
            download_timeout=self.artifact_timeout,
        )

    def default_limits(self, job_type: str) -> tuple[int, int]:
        """(memory_mb, cpu_percent) for a job of this type that asks for nothing."""
        if job_type == "service":
            return self.service_memory_mb, self.service_cpu_percent
        return self.run_memory_mb, self.run_cpu_percent

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "AgentSettings":
        node_id = env_str(env, "NODE_ID", None) or socket.gethostname()
        if not NAME_RE.match(node_id):
            # The registry would refuse it on every registration attempt; say so now.
            raise SettingError(f"NODE_ID must be 1-128 letters, digits, '.', '_' or '-', "
                               f"starting with a letter or digit; got {node_id!r}")
        job_user = env_str(env, "AGENT_JOB_USER", None)
        run_as_root = env_bool(env, "AGENT_RUN_AS_ROOT", False)
        if run_as_root and job_user is not None:
            raise SettingError(f"AGENT_RUN_AS_ROOT=true and AGENT_JOB_USER={job_user} contradict "
                               "each other; set only one")
        registry_url = env_urls(env, "REGISTRY_URL", cls.registry_url)
        slots = env_int(env, "AGENT_SLOTS", os.cpu_count() or 1, minimum=1)
        uid_range = _uid_range(env, slots, per_job=job_user is None and not run_as_root)
        return cls(
            node_id=node_id,
            registry_url=registry_url,
            scheduler_url=env_urls(env, "SCHEDULER_URL", cls.scheduler_url),
            poll_interval=_positive_float(env, "POLL_INTERVAL_SECS", 3.0),
            long_poll_secs=env_float(env, "AGENT_LONG_POLL_SECS", 20.0, minimum=0, maximum=MAX_LONG_POLL_SECS),
            heartbeat_interval=_positive_float(env, "HEARTBEAT_INTERVAL_SECS", 5.0),
            state_dir=state_dir(env),
            slots=slots,
            address=env_str(env, "AGENT_ADDRESS", None) or route_address(split_urls(registry_url)[0]),
            labels=parse_labels(env_str(env, "AGENT_LABELS", "") or ""),
            output_tail_bytes=env_int(env, "CORRAL_OUTPUT_TAIL_BYTES", 65536, minimum=0,
                                      maximum=MAX_TAIL_BYTES),
            output_interval=env_float(env, "AGENT_OUTPUT_INTERVAL_SECS", 2.0, minimum=0),
            stop_grace=env_float(env, "AGENT_STOP_GRACE_SECS", 10.0, minimum=0),
            keep_work_dirs=env_bool(env, "CORRAL_KEEP_WORK_DIRS", False),
            token=node_credential(env, node_id),
            ca_bundle=env_file(env, "AGENT_CA_BUNDLE"),
            kill_grace=env_float(env, "AGENT_KILL_GRACE_SECS", 5.0, minimum=0),
            job_user=job_user,
            run_as_root=run_as_root,
            require_cgroups=env_bool(env, "AGENT_REQUIRE_CGROUPS", False),
            health_interval=_positive_float(env, "AGENT_HEALTH_INTERVAL_SECS", 5.0),
            health_timeout=_positive_float(env, "AGENT_HEALTH_TIMEOUT_SECS", 2.0),
            service_log_max_bytes=env_int(env, "AGENT_SERVICE_LOG_MAX_BYTES", 64 * MiB, minimum=1),
            max_artifact_bytes=env_int(env, "AGENT_MAX_ARTIFACT_BYTES", 512 * MiB, minimum=1),
            max_unpacked_bytes=env_int(env, "AGENT_MAX_UNPACKED_BYTES", 2048 * MiB, minimum=1),
            max_artifact_entries=env_int(env, "AGENT_MAX_ARTIFACT_ENTRIES", 10_000, minimum=1),
            max_artifact_ratio=_positive_float(env, "AGENT_MAX_ARTIFACT_RATIO", 100.0),
            artifact_connect_timeout=_positive_float(env, "AGENT_ARTIFACT_CONNECT_TIMEOUT_SECS", 10.0),
            artifact_read_timeout=_positive_float(env, "AGENT_ARTIFACT_READ_TIMEOUT_SECS", 60.0),
            # 0 means no bound on a whole download (the read timeout still applies).
            artifact_timeout=env_float(env, "AGENT_ARTIFACT_TIMEOUT_SECS", 1800.0, minimum=0) or None,
            **_limits(env),
            uid_range=uid_range,
            private_tmp=env_bool(env, "AGENT_PRIVATE_TMP", True),
            warm_start=env_bool(env, "AGENT_WARM_START", True),
            job_env_passthrough=_passthrough(env),
            **_process_limits(env),
        )


def node_credential(env: Mapping[str, str], node_id: str) -> str | None:
    """CORRAL_NODE_TOKEN: this node's credential (shared/credentials.py), checked to be
    one for NODE_ID. The cluster's agent secret itself must not be on a node: whoever
    holds it can act as every node."""
    if env_str(env, "CORRAL_AGENT_TOKEN", None) is not None:
        raise SettingError("CORRAL_AGENT_TOKEN is the cluster's agent secret and belongs on the registry and "
                           "the scheduler only; give this agent its node credential in CORRAL_NODE_TOKEN "
                           "(`corral-scheduler node-token NODE` prints it)")
    token = env_str(env, "CORRAL_NODE_TOKEN", None)
    if token is None:
        return None
    named = token_node(token)
    if named is None:
        raise SettingError("CORRAL_NODE_TOKEN is not a node credential (NODE.HEX, as `corral-scheduler "
                           "node-token NODE` prints it)")
    if named != node_id:
        raise SettingError(f"CORRAL_NODE_TOKEN is the credential of node {named!r}, but NODE_ID is {node_id!r}")
    return token


def total_memory_mb() -> int | None:
    """This machine's RAM in MB, or None when it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024  # the value is in kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError, AttributeError):
        return None


def _limits(env: Mapping[str, str]) -> dict:
    """The per-type default limits and the node maximums, checked against each other."""
    max_memory = env_int(env, "AGENT_MAX_MEMORY_MB", total_memory_mb() or DEFAULT_SERVICE_MEMORY_MB,
                         minimum=1)
    max_cpu = env_int(env, "AGENT_MAX_CPU_PERCENT", (os.cpu_count() or 1) * 100, minimum=1)
    return {
        "max_memory_mb": max_memory,
        "max_cpu_percent": max_cpu,
        "run_memory_mb": _default_limit(env, "AGENT_RUN_MEMORY_MB", DEFAULT_RUN_MEMORY_MB,
                                        max_memory, "AGENT_MAX_MEMORY_MB"),
        "run_cpu_percent": _default_limit(env, "AGENT_RUN_CPU_PERCENT", DEFAULT_RUN_CPU_PERCENT,
                                          max_cpu, "AGENT_MAX_CPU_PERCENT"),
        "service_memory_mb": _default_limit(env, "AGENT_SERVICE_MEMORY_MB", DEFAULT_SERVICE_MEMORY_MB,
                                            max_memory, "AGENT_MAX_MEMORY_MB"),
        "service_cpu_percent": _default_limit(env, "AGENT_SERVICE_CPU_PERCENT", DEFAULT_SERVICE_CPU_PERCENT,
                                              max_cpu, "AGENT_MAX_CPU_PERCENT"),
    }


def _default_limit(env: Mapping[str, str], name: str, default: int, maximum: int, max_name: str) -> int:
    explicit = env_str(env, name, None) is not None
    value = env_int(env, name, default, minimum=1)
    if value <= maximum:
        return value
    if explicit:
        raise SettingError(f"{name}={value} is more than {max_name}={maximum}; jobs "
                           f"using the default could never run on this node")
    return maximum  # a small node: the design's default does not fit


def _uid_range(env: Mapping[str, str], slots: int, per_job: bool) -> tuple[int, int]:
    """AGENT_UID_RANGE; with a uid per job, it must hold a uid for every slot."""
    raw = env_str(env, "AGENT_UID_RANGE", None)
    try:
        first, last = parse_range(raw) if raw is not None else DEFAULT_UID_RANGE
    except ValueError as exc:
        raise SettingError(f"AGENT_UID_RANGE {exc}") from None
    if per_job and last - first + 1 < slots:
        raise SettingError(f"AGENT_UID_RANGE={first}-{last} holds {last - first + 1} uid(s), fewer than "
                           f"AGENT_SLOTS={slots}: every running job needs a uid of its own")
    return first, last


def _passthrough(env: Mapping[str, str]) -> tuple[str, ...]:
    """AGENT_JOB_ENV_PASSTHROUGH: comma-separated names of the agent's environment."""
    names = tuple(n.strip() for n in (env_str(env, "AGENT_JOB_ENV_PASSTHROUGH", "") or "").split(",")
                  if n.strip())
    for name in names:
        problem = passthrough_problem(name)
        if problem:
            raise SettingError(f"AGENT_JOB_ENV_PASSTHROUGH cannot pass {problem}")
    return names


def _process_limits(env: Mapping[str, str]) -> dict:
    """AGENT_JOB_MAX_PROCESSES (jobs that ask for none) and AGENT_MAX_PROCESSES."""
    maximum = env_int(env, "AGENT_MAX_PROCESSES", DEFAULT_MAX_PROCESSES, minimum=1)
    return {"max_processes": maximum,
            "job_max_processes": _default_limit(env, "AGENT_JOB_MAX_PROCESSES", DEFAULT_JOB_MAX_PROCESSES,
                                                maximum, "AGENT_MAX_PROCESSES")}


def route_address(url: str) -> str:
    """This host's address on the route to `url`'s host: what other machines most
    likely reach it at. Connecting a UDP socket sends nothing; it only picks the
    route. 127.0.0.1 when that fails (no route, or a name that does not resolve)."""
    parts = urlsplit(url)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((parts.hostname or "127.0.0.1", parts.port or 80))
            return probe.getsockname()[0]
    except (OSError, UnicodeError, ValueError):
        return "127.0.0.1"


def parse_labels(raw: str) -> dict[str, str]:
    """"k=v,k2=v2" -> {"k": "v", "k2": "v2"}; an empty string means no labels."""
    labels: dict[str, str] = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not NAME_RE.match(key):
            raise SettingError(f"AGENT_LABELS must look like k=v,k2=v2 (keys: letters, digits, "
                               f"'.', '_', '-'); bad entry {item!r}")
        labels[key] = value
    return labels


def safe_path_part(value: str) -> str:
    """Node and job ids become directory names; keep them from escaping the state dir."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "_" for c in value)
    return cleaned.lstrip(".") or "_"


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    value = env_float(env, name, default)
    if value <= 0:
        raise SettingError(f"{name} must be greater than 0, got {value}")
    return value
