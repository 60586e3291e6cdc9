"""The agent's settings, read from environment variables (flags override them in cli.py).

Every variable is defined once in SETTINGS (docs/settings.md is generated from it) and
checked at start, so a bad value stops the agent with one clear SettingError; the rules
that tie settings together are in from_env.
"""
from __future__ import annotations

import hashlib
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from corral.shared import limits, wire
from corral.shared.credentials import token_node
from corral.shared.errors import SettingError
from corral.shared.settings import STATE_DIR, Setting, by_name, env_str, read_all, split_urls
from corral.shared.validate import NAME_RE

from . import gpus as gpu_devices
from .artifacts import Limits as ArtifactLimits
from .gpus import Gpu
from .jobenv import passthrough_problem
from .uids import parse_range


MiB = 1024 * 1024

# Jobs' own uids (identity.py, uids.py) and their process limit (pids.max).
DEFAULT_UID_RANGE = (70000, 79999)
DEFAULT_JOB_MAX_PROCESSES = 1024
DEFAULT_MAX_PROCESSES = 32768

# AGENT_RESOURCES: the node's other countable resources (fpga=2,scratch_gb=800), in the
# names and bounds the registry takes (shared/limits.py). The reserved names a job asks
# for with fields of their own: declaring them would count the same thing twice.
RESOURCE_NAME_RE = re.compile(limits.RESOURCE_NAME_PATTERN)
RESERVED_WHY = {
    "gpus": "GPUs are discovered (or chosen with AGENT_GPUS) and jobs ask for them with `gpus`",
    "memory_mb": "jobs ask for memory with `memory_mb`; the node's is AGENT_MAX_MEMORY_MB",
    "cpu_percent": "jobs ask for CPU with `cpu_percent`; the node's is AGENT_MAX_CPU_PERCENT",
    "slots": "the jobs a node runs at once are AGENT_SLOTS",
    "jobs": "the jobs a node runs at once are AGENT_SLOTS",
}


@dataclass(frozen=True)
class AgentSettings:
    node_id: str
    # Base URLs, comma-separated when there are several replicas (the clients fail over).
    registry_url: str = "http://127.0.0.1:9000"
    scheduler_url: str = "http://127.0.0.1:9001"
    poll_interval: float = 3.0
    # Long-poll claims: how long each claim may wait on the scheduler for work; 0 turns
    # long-poll off (the agent asks every poll_interval, as the original design did).
    long_poll_secs: float = limits.DEFAULT_WAIT_SECS
    heartbeat_interval: float = 5.0
    state_dir: str = os.path.abspath("./var")
    slots: int = 1
    address: str = "127.0.0.1"
    labels: dict[str, str] = field(default_factory=dict)
    # GPUs (gpus.py): what AGENT_GPUS asks for, and the devices that selects, found once
    # by from_env (built directly, as tests do, a node has none and nothing is run).
    gpus_spec: str = gpu_devices.AUTO
    gpus: tuple[Gpu, ...] = ()
    # Other countable resources (AGENT_RESOURCES), advertised as they are.
    resources: dict[str, int] = field(default_factory=dict)
    # How jobs are held to their own GPUs (devices.py), and where the device nodes are
    # (another directory only in tests, which make nodes of their own).
    device_isolation: str = "auto"
    device_dir: str = "/dev"
    output_tail_bytes: int = 65536
    # Live output: how often the tails of running jobs' new output go to the scheduler; 0: never.
    output_interval: float = 2.0
    stop_grace: float = 10.0
    keep_work_dirs: bool = False
    # Disk (disk.py): no new work while the work dirs' filesystem has less free space
    # than this (MB; 0: no floor); how often that and the jobs' disk limits are checked.
    min_free_disk_mb: int = 1024
    disk_check_interval: float = 2.0
    # A filesystem of its disk_mb per work dir (diskfs.py): auto, fs or watch.
    disk_limit_mode: str = "auto"
    token: str | None = field(default=None, repr=False)  # CORRAL_NODE_TOKEN; never logged
    # CA bundle that verifies https:// REGISTRY_URL and SCHEDULER_URL; None: the system's CAs.
    ca_bundle: str | None = None
    kill_grace: float = 5.0
    # Who jobs run as (identity.job_users): None means a uid per job when the agent is root.
    job_user: str | None = None
    run_as_root: bool = False
    # Limits (MB, percent of one CPU) per job type, and the most a job may ask for.
    run_memory_mb: int = limits.DEFAULT_RUN_MEMORY_MB
    run_cpu_percent: int = limits.DEFAULT_RUN_CPU_PERCENT
    service_memory_mb: int = limits.DEFAULT_SERVICE_MEMORY_MB
    service_cpu_percent: int = limits.DEFAULT_SERVICE_CPU_PERCENT
    max_memory_mb: int = field(default_factory=lambda: total_memory_mb() or limits.DEFAULT_SERVICE_MEMORY_MB)
    max_cpu_percent: int = field(default_factory=lambda: (os.cpu_count() or 1) * 100)
    # Kept for the system: placement counts a node's allocatable capacity as the
    # maximum minus these.
    reserved_memory_mb: int = 0
    reserved_cpu_percent: int = 0
    require_cgroups: bool = False
    # Jobs' isolation: a uid per job from this range (when the agent is root and neither
    # job_user nor run_as_root is set), a private /tmp where the kernel allows it, the
    # process limit of jobs that ask for none and the most one may ask for, and the
    # variables of the agent's environment passed to jobs beyond jobenv.FROM_AGENT.
    uid_range: tuple[int, int] = DEFAULT_UID_RANGE
    private_tmp: bool = True
    # Keep one job launch started ahead of the next run job (warm.py).
    warm_start: bool = True
    fork_server: bool = True
    job_max_processes: int = DEFAULT_JOB_MAX_PROCESSES
    max_processes: int = DEFAULT_MAX_PROCESSES
    job_env_passthrough: tuple[str, ...] = ()
    # Services.
    health_interval: float = 5.0
    health_timeout: float = 2.0
    service_log_max_bytes: int = 64 * MiB
    # Complete logs (log_capture.py): each stream of each attempt kept whole up to this.
    log_max_bytes: int = 10 * MiB
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

    def work_dir(self, job_id: str, attempt: int) -> str:
        """A job attempt's work dir."""
        return os.path.join(self.work_root, f"{safe_path_part(job_id)}-{attempt}")

    @property
    def log_root(self) -> str:
        """Where services' stdout/stderr files live (<job>-<attempt>.out|.err)."""
        return os.path.join(self.agent_dir, "logs")

    @property
    def output_root(self) -> str:
        """The agent's copies of run jobs' output, until shipped (<job>-<attempt>.stdout|.stderr)."""
        return os.path.join(self.agent_dir, "output")

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
        if job_type == wire.JOB_SERVICE:
            return self.service_memory_mb, self.service_cpu_percent
        return self.run_memory_mb, self.run_cpu_percent

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ,
                 discover_gpus: Callable[[], list[Gpu]] | None = None) -> "AgentSettings":
        """Limits: a job's memory_mb / cpu_percent may not exceed AGENT_MAX_MEMORY_MB /
        AGENT_MAX_CPU_PERCENT. A per-type default left unset is lowered to the maximum
        on a small node (a 1-CPU node runs services at 100%, not 200%); one set above
        it is a SettingError. The reserved memory and CPU may not exceed it either.

        The GPUs are found here, once per start (`discover_gpus`, gpus.discover by
        default), and only when AGENT_GPUS needs them found; one it names that is not
        found is a SettingError like any bad value."""
        values = read_all(SETTINGS, env)
        if values["run_as_root"] and values["job_user"] is not None:
            raise SettingError(f"AGENT_RUN_AS_ROOT=true and AGENT_JOB_USER={values['job_user']} contradict "
                               "each other; set only one")
        values["address"] = values["address"] or route_address(split_urls(values["registry_url"])[0])
        values["token"] = node_credential(env, values["token"], values["node_id"])
        # 0 means no bound on a whole download (the read timeout still applies).
        values["artifact_timeout"] = values["artifact_timeout"] or None
        for name, max_name in DEFAULT_LIMITS:
            default, maximum = _SETTING[name], _SETTING[max_name]
            values[default.field] = _fit(env, default, values[default.field], maximum, values[maximum.field])
        for name, max_name in RESERVES:
            _check_reserve(_SETTING[name], values[_SETTING[name].field], _SETTING[max_name],
                           values[_SETTING[max_name].field])
        _check_uid_range(values)
        # Last: every value is checked before anything is run on the node.
        values["gpus"] = tuple(gpu_devices.resolve(values["gpus_spec"], discover_gpus or gpu_devices.discover))
        return cls(**values)


def node_credential(env: Mapping[str, str], token: str | None, node_id: str) -> str | None:
    """CORRAL_NODE_TOKEN (`token`): this node's credential (shared/credentials.py),
    checked to be one for NODE_ID. The cluster's agent secret itself must not be on a
    node: whoever holds it can act as every node."""
    if env_str(env, "CORRAL_AGENT_TOKEN", None) is not None:
        raise SettingError("CORRAL_AGENT_TOKEN is the cluster's agent secret and belongs on the registry and "
                           "the scheduler only; give this agent its node credential in CORRAL_NODE_TOKEN "
                           "(`corral-scheduler node-token NODE` prints it)")
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


def _fit(env: Mapping[str, str], setting: Setting, value: int, max_setting: Setting, maximum: int) -> int:
    """A per-type default limit against the node's maximum: lowered to it when the
    design's default does not fit a small node, an error when set above it."""
    if value <= maximum:
        return value
    if setting.is_set(env):
        raise SettingError(f"{setting.name}={value} is more than {max_setting.name}={maximum}; jobs "
                           f"using the default could never run on this node")
    return maximum


def _check_reserve(setting: Setting, value: int, max_setting: Setting, maximum: int) -> None:
    if value > maximum:
        raise SettingError(f"{setting.name}={value} is more than {max_setting.name}={maximum}; the node "
                           f"cannot keep more for the system than it has")


def _check_uid_range(values: dict) -> None:
    """With a uid per job, AGENT_UID_RANGE must hold a uid for every slot."""
    (first, last), slots = values["uid_range"], values["slots"]
    per_job = values["job_user"] is None and not values["run_as_root"]
    if per_job and last - first + 1 < slots:
        raise SettingError(f"AGENT_UID_RANGE={first}-{last} holds {last - first + 1} uid(s), fewer than "
                           f"AGENT_SLOTS={slots}: every running job needs a uid of its own")


def _uid_range(name: str, value: str) -> tuple[int, int]:
    try:
        return parse_range(value)
    except ValueError as exc:
        raise SettingError(f"{name} {exc}") from None


def _passthrough(name: str, value: str) -> tuple[str, ...]:
    """Comma-separated names of the agent's environment."""
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    for passed in names:
        problem = passthrough_problem(passed)
        if problem:
            raise SettingError(f"{name} cannot pass {problem}")
    return names


def _node_id(name: str, value: str) -> str:
    if not NAME_RE.match(value):
        # The registry would refuse it on every registration attempt; say so now.
        raise SettingError(f"{name} must be 1-128 letters, digits, '.', '_' or '-', "
                           f"starting with a letter or digit; got {value!r}")
    return value


def _cpus() -> int:
    return os.cpu_count() or 1


def _memory_mb() -> int:
    return total_memory_mb() or limits.DEFAULT_SERVICE_MEMORY_MB


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


def parse_resources(raw: str) -> dict[str, int]:
    """"fpga=2,scratch_gb=800" -> {"fpga": 2, "scratch_gb": 800}; an empty string means none."""
    resources: dict[str, int] = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, amount = (part.strip() for part in item.partition("="))
        if not sep or not RESOURCE_NAME_RE.match(name):
            raise SettingError(f"AGENT_RESOURCES must look like name=N,name2=N (names: a lower-case letter, then "
                               f"up to 63 lower-case letters, digits, '_', '.', '-'); bad entry {item!r}")
        if name in limits.RESERVED_RESOURCE_NAMES:
            why = RESERVED_WHY.get(name, "jobs ask for it with a field of its own")
            raise SettingError(f"AGENT_RESOURCES cannot declare {name!r}: {why}; bad entry {item!r}")
        if not re.fullmatch(r"[0-9]{1,13}", amount) or int(amount) > limits.MAX_RESOURCE_COUNT:
            raise SettingError(f"AGENT_RESOURCES amounts must be whole numbers 0-{limits.MAX_RESOURCE_COUNT:,}; "
                               f"bad entry {item!r}")
        if name in resources:
            raise SettingError(f"AGENT_RESOURCES declares {name!r} twice; bad entry {item!r}")
        resources[name] = int(amount)
        if len(resources) > limits.MAX_RESOURCES:
            raise SettingError(f"AGENT_RESOURCES declares more than {limits.MAX_RESOURCES} resources; "
                               f"bad entry {item!r}")
    return resources


def safe_path_part(value: str) -> str:
    """Node and job ids become directory names; keep them from escaping the state dir."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "_" for c in value)
    return cleaned.lstrip(".") or "_"


def _labels(name: str, value: str) -> dict[str, str]:
    return parse_labels(value)


def _resources(name: str, value: str) -> dict[str, int]:
    return parse_resources(value)


def _gpus_spec(name: str, value: str) -> str:
    """Only the form is checked here: what it names is checked against what is found."""
    return gpu_devices.check_spec(value)


# Every variable the agent reads, in the order docs/settings.md lists them (the first
# bad one is the error). CORRAL_STATE_DIR is every process's (shared/settings.py).
SETTINGS = (
    Setting("NODE_ID", "node_id", "text", socket.gethostname,
            "this node's id: 1-128 letters, digits, `.`, `_`, `-`, starting with a letter or digit",
            parse=_node_id, form="a name", shown="the host name", flag="--node-id"),
    Setting("REGISTRY_URL", "registry_url", "urls", "http://127.0.0.1:9000",
            "the registry; several URLs: its replicas, tried in order", flag="--registry-url"),
    Setting("SCHEDULER_URL", "scheduler_url", "urls", "http://127.0.0.1:9001",
            "the scheduler; several URLs: its replicas, tried in order", flag="--scheduler-url"),
    Setting("AGENT_CA_BUNDLE", "ca_bundle", "file", None,
            "CA certificates that verify `https://` `REGISTRY_URL` and `SCHEDULER_URL`", shown="the system's CAs"),
    Setting("CORRAL_NODE_TOKEN", "token", "text", None,
            "this node's credential (`corral-scheduler node-token NODE` prints it), sent to the registry and "
            "the scheduler, never passed to jobs; `CORRAL_AGENT_TOKEN` (the cluster's secret) set on a node "
            "stops the agent", form="NODE.HEX"),
    STATE_DIR,
    Setting("AGENT_LONG_POLL_SECS", "long_poll_secs", "float", limits.DEFAULT_WAIT_SECS,
            "how long a claim may wait on the scheduler; `0`: poll instead", minimum=0, maximum=limits.MAX_WAIT_SECS),
    Setting("POLL_INTERVAL_SECS", "poll_interval", "float", 3.0,
            "how often to ask for work when not long-polling (with long-poll: how often an agent holding jobs "
            "reconciles them with the scheduler)", above=0),
    Setting("HEARTBEAT_INTERVAL_SECS", "heartbeat_interval", "float", 5.0,
            "how often to heartbeat, and to renew the lease while holding jobs (once a minute when idle); keep "
            "it well under `HEARTBEAT_TIMEOUT_SECS`", above=0),
    Setting("AGENT_SLOTS", "slots", "int", _cpus, "jobs run at once; advertised to the scheduler",
            minimum=1, shown="the number of CPUs", flag="--slots"),
    Setting("AGENT_ADDRESS", "address", "text", None, "the address registered for this node (and its services)",
            form="a host name or address",
            shown="this host's address on the route to (the first) `REGISTRY_URL`"),
    Setting("AGENT_LABELS", "labels", "text", "", "labels recorded with the node", parse=_labels,
            form="`k=v,k2=v2`", shown="none"),
    Setting("AGENT_GPUS", "gpus_spec", "text", gpu_devices.AUTO,
            "the NVIDIA GPUs advertised (found at start by NVML, else `nvidia-smi`; a MIG instance is a device of "
            "its own): `auto` all found, `none` none, indexes and UUIDs (`0,1`, `0:1` a MIG instance, "
            "`GPU-…`, `MIG-…`) those only (one not found stops the agent), a path starting with `/` the devices "
            "a JSON file declares instead (a list of `index`, `uuid`, `model`, `memory_mb`, optional `minor`)",
            parse=_gpus_spec, form="`auto`, `none`, IDs comma-separated, or a JSON file's path"),
    Setting("AGENT_RESOURCES", "resources", "text", "",
            "other countable resources of the node, advertised at registration: names of a lower-case letter "
            "then up to 63 lower-case letters, digits, `_`, `.`, `-` (not "
            + ", ".join(f"`{name}`" for name in limits.RESERVED_RESOURCE_NAMES)
            + f": jobs ask for those with fields of their own), amounts 0–{limits.MAX_RESOURCE_COUNT:,}, "
            f"at most {limits.MAX_RESOURCES}",
            parse=_resources, form="`name=N,name2=N`", shown="none"),
    Setting("AGENT_DEVICE_ISOLATION", "device_isolation", "choice", "auto",
            "on a node with GPUs, how each job is kept to its own: `cgroup` cgroup v1's devices controller (every "
            "other device refused), `mount` a /dev of the job's own holding only its devices (cgroup v2 nodes), "
            "`auto` the first of those this node allows, `none` no isolation (every job may open every GPU). "
            "The agent does not start where the one asked for, or with `auto` neither, is possible",
            choices=("auto", "cgroup", "mount", "none")),
    Setting("AGENT_UID_RANGE", "uid_range", "text", "%d-%d" % DEFAULT_UID_RANGE,
            "uids (and gids) jobs run as when the agent is root, one per running job; must hold at least "
            "`AGENT_SLOTS` uids (one more for the warm launch) and no id of a user or group of the node",
            parse=_uid_range, form="FIRST-LAST"),
    Setting("AGENT_JOB_USER", "job_user", "text", None,
            "one existing user every job runs as instead, when the agent is root", form="a user name",
            shown="unset: a uid per job"),
    Setting("AGENT_RUN_AS_ROOT", "run_as_root", "bool", False,
            "run jobs as root instead (an explicit choice; an error together with `AGENT_JOB_USER`)"),
    Setting("AGENT_PRIVATE_TMP", "private_tmp", "bool", True,
            "give each job its own `/tmp`, `/var/tmp`, `/dev/shm` and IPC namespace where the node allows it "
            "(else `TMPDIR` in its work dir)"),
    Setting("AGENT_FORK_SERVER", "fork_server", "bool", True,
            "start jobs through a fork server made at the agent's start: each job's process is cloned and set up "
            "with system calls and execs its shell once (false: a chain of programs, `unshare`, a root shell, "
            "`setpriv`, each exec'ing the next; also where the machine's system calls are unknown)"),
    Setting("AGENT_WARM_START", "warm_start", "bool", True,
            "with the chain of programs (`AGENT_FORK_SERVER=false`), keep one job launch started ahead (cgroup, "
            "private /tmp, uid), so that the next `run` job with the same limits starts in about the time of its "
            "own shell"),
    Setting("AGENT_JOB_ENV_PASSTHROUGH", "job_env_passthrough", "text", "",
            "names of the agent's environment variables jobs get too, beyond `PATH`, `LANG`, `LC_*`, `TZ`; "
            "never a `CORRAL_*TOKEN`, `LD_PRELOAD` or `LD_AUDIT`", parse=_passthrough,
            form="names, comma-separated", shown="none"),
    Setting("AGENT_RUN_MEMORY_MB", "run_memory_mb", "int", limits.DEFAULT_RUN_MEMORY_MB,
            "memory limit of `run` jobs that ask for none (lowered to `AGENT_MAX_MEMORY_MB` when unset and "
            "above it)", minimum=limits.MIN_MEMORY_MB, maximum=limits.MAX_MEMORY_MB),
    Setting("AGENT_RUN_CPU_PERCENT", "run_cpu_percent", "int", limits.DEFAULT_RUN_CPU_PERCENT,
            "CPU limit (percent of one CPU) of `run` jobs that ask for none (lowered to `AGENT_MAX_CPU_PERCENT` "
            "when unset and above it)", minimum=1, maximum=limits.MAX_CPU_PERCENT),
    Setting("AGENT_SERVICE_MEMORY_MB", "service_memory_mb", "int", limits.DEFAULT_SERVICE_MEMORY_MB,
            "memory limit of `service` jobs that ask for none (lowered like `AGENT_RUN_MEMORY_MB`)",
            minimum=limits.MIN_MEMORY_MB, maximum=limits.MAX_MEMORY_MB),
    Setting("AGENT_SERVICE_CPU_PERCENT", "service_cpu_percent", "int", limits.DEFAULT_SERVICE_CPU_PERCENT,
            "CPU limit of `service` jobs that ask for none (lowered like `AGENT_RUN_CPU_PERCENT`)", minimum=1,
            maximum=limits.MAX_CPU_PERCENT),
    Setting("AGENT_MAX_MEMORY_MB", "max_memory_mb", "int", _memory_mb,
            "the most memory a job may ask for here (advertised to the scheduler)", minimum=limits.MIN_MEMORY_MB,
            shown="the node's memory"),
    Setting("AGENT_MAX_CPU_PERCENT", "max_cpu_percent", "int", lambda: _cpus() * 100,
            "the most CPU a job may ask for here (advertised to the scheduler)", minimum=1, shown="100 per CPU"),
    Setting("AGENT_RESERVED_MEMORY_MB", "reserved_memory_mb", "int", 0,
            "memory kept for the system: placement counts the node's allocatable memory as "
            "`AGENT_MAX_MEMORY_MB` minus this (at most `AGENT_MAX_MEMORY_MB`)", minimum=0,
            maximum=limits.MAX_MEMORY_MB),
    Setting("AGENT_RESERVED_CPU_PERCENT", "reserved_cpu_percent", "int", 0,
            "CPU (percent of one CPU) kept for the system: placement counts the node's allocatable CPU as "
            "`AGENT_MAX_CPU_PERCENT` minus this (at most `AGENT_MAX_CPU_PERCENT`)", minimum=0,
            maximum=limits.MAX_CPU_PERCENT),
    Setting("AGENT_JOB_MAX_PROCESSES", "job_max_processes", "int", DEFAULT_JOB_MAX_PROCESSES,
            "processes and threads a job may run at once (`pids.max`) when it asks for no `max_processes` "
            "(lowered to `AGENT_MAX_PROCESSES` when unset and above it)", minimum=1, maximum=limits.MAX_PROCESSES),
    Setting("AGENT_MAX_PROCESSES", "max_processes", "int", DEFAULT_MAX_PROCESSES,
            "the most `max_processes` a job may ask for here", minimum=1),
    Setting("AGENT_REQUIRE_CGROUPS", "require_cgroups", "bool", False,
            "refuse to start when limits cannot be enforced"),
    Setting("AGENT_HEALTH_INTERVAL_SECS", "health_interval", "float", 5.0, "how often services' health is checked",
            above=0),
    Setting("AGENT_HEALTH_TIMEOUT_SECS", "health_timeout", "float", 2.0, "how long a service's health check may take",
            above=0),
    Setting("AGENT_SERVICE_LOG_MAX_BYTES", "service_log_max_bytes", "int", 64 * MiB,
            "a service's log file is emptied past this size", minimum=1),
    Setting("AGENT_MAX_ARTIFACT_BYTES", "max_artifact_bytes", "int", 512 * MiB, "largest `deploy_url` download",
            minimum=1),
    Setting("AGENT_MAX_UNPACKED_BYTES", "max_unpacked_bytes", "int", 2048 * MiB, "largest unpacked tree",
            minimum=1),
    Setting("AGENT_MAX_ARTIFACT_ENTRIES", "max_artifact_entries", "int", 10_000, "most entries in a zip",
            minimum=1),
    Setting("AGENT_MAX_ARTIFACT_RATIO", "max_artifact_ratio", "float", 100.0,
            "highest compression ratio of an entry over 1 MB (zip bombs)", above=0),
    Setting("AGENT_ARTIFACT_CONNECT_TIMEOUT_SECS", "artifact_connect_timeout", "float", 10.0,
            "download connect timeout", above=0),
    Setting("AGENT_ARTIFACT_READ_TIMEOUT_SECS", "artifact_read_timeout", "float", 60.0,
            "download timeout between bytes", above=0),
    Setting("AGENT_ARTIFACT_TIMEOUT_SECS", "artifact_timeout", "float", 1800.0,
            "timeout of a whole download; `0`: none", minimum=0),
    Setting("CORRAL_OUTPUT_TAIL_BYTES", "output_tail_bytes", "int", 65536,
            # At most what the scheduler takes of a report's stdout or stderr.
            "how much of the end of stdout and stderr is kept and reported", minimum=0,
            maximum=limits.MAX_OUTPUT_CHARS),
    Setting("CORRAL_LOG_MAX_BYTES", "log_max_bytes", "int", 10 * MiB,
            "each stream of each attempt is shipped whole up to this many bytes; past it, the first and last "
            "halves and a line saying how much was dropped (give the scheduler the same)", minimum=64 * 1024,
            maximum=1024 ** 4),
    Setting("AGENT_OUTPUT_INTERVAL_SECS", "output_interval", "float", 2.0,
            "live output: how often running jobs' new output (its tail, and the whole of it in chunks) goes to "
            "the scheduler; `0`: only at the end", minimum=0),
    Setting("AGENT_KILL_GRACE_SECS", "kill_grace", "float", 5.0,
            "a job being killed gets SIGTERM, then SIGKILL after this", minimum=0),
    Setting("AGENT_STOP_GRACE_SECS", "stop_grace", "float", 10.0,
            "on SIGTERM, how long `run` jobs may finish before they are killed", minimum=0),
    Setting("CORRAL_KEEP_WORK_DIRS", "keep_work_dirs", "bool", False,
            "keep finished jobs' work dirs and logs (for debugging)"),
    Setting("AGENT_MIN_FREE_DISK_MB", "min_free_disk_mb", "int", 1024,
            "while the filesystem of the work dirs has less free space than this (MB), the agent takes no new "
            "work and logs why; what runs goes on. `0`: no floor", minimum=0),
    Setting("AGENT_DISK_CHECK_SECS", "disk_check_interval", "float", 2.0,
            "how often the free space and each running job's work dir (against its `disk_mb`) are measured; a "
            "job past its limit is ended (`ended_by: disk`)", above=0),
    Setting("AGENT_DISK_LIMIT_MODE", "disk_limit_mode", "choice", "auto",
            "how a job's `disk_mb` is held: `fs` a loop-mounted filesystem of that size on its work dir (writes "
            "past it fail with ENOSPC; the agent refuses to start where it cannot), `watch` the measuring "
            "thread alone, `auto` a filesystem where this node allows it (root, loop devices, mkfs.ext4), "
            "else the watch", choices=("auto", "fs", "watch")),
)
_SETTING = by_name(SETTINGS)
# Each per-type default limit and the node maximum it must fit under.
DEFAULT_LIMITS = (("AGENT_RUN_MEMORY_MB", "AGENT_MAX_MEMORY_MB"), ("AGENT_RUN_CPU_PERCENT", "AGENT_MAX_CPU_PERCENT"),
                  ("AGENT_SERVICE_MEMORY_MB", "AGENT_MAX_MEMORY_MB"),
                  ("AGENT_SERVICE_CPU_PERCENT", "AGENT_MAX_CPU_PERCENT"),
                  ("AGENT_JOB_MAX_PROCESSES", "AGENT_MAX_PROCESSES"))
# Each system reserve and the node maximum it is kept out of.
RESERVES = (("AGENT_RESERVED_MEMORY_MB", "AGENT_MAX_MEMORY_MB"),
            ("AGENT_RESERVED_CPU_PERCENT", "AGENT_MAX_CPU_PERCENT"))
