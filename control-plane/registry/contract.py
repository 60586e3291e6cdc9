"""The registry's HTTP contract: every request and answer body as a pydantic model.

The routes (api/) check requests and build answers with these; openapi.py generates
the document from them.
"""
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, ValidatorFunctionWrapHandler, field_validator, model_validator

from corral.shared.contract import (MAP_SAYS, MAX_MAP_ENTRIES, Answer, MapValue, Name, NodeId, Request, Says, Text,
                                    Timestamp, refusal, refused)
from corral.shared.limits import (GPU_INDEX_PATTERN, GPU_UUID_PATTERN, MAX_GPU_MEMORY_MB, MAX_GPU_MODEL_CHARS,
                                  MAX_NODE_GPUS, MAX_RESOURCE_COUNT, MAX_RESOURCES)
from corral.shared.limits import MAX_CPU_PERCENT as MAX_LIMIT_CPU_PERCENT
from corral.shared.limits import MAX_MEMORY_MB as MAX_LIMIT_MEMORY_MB
from corral.shared.limits import MAX_PROCESSES as MAX_LIMIT_PROCESSES
from corral.shared.limits import MIN_MEMORY_MB as MIN_LIMIT_MEMORY_MB
from corral.shared.limits import RESERVED_RESOURCE_NAMES, RESOURCE_NAME_PATTERN
from corral.shared.validate import NAME_PATTERN

KIND_PATTERN = r"^[a-z][a-z0-9-]{0,31}$"
MAX_MEMORY_MB = 1 << 40
MAX_SLOTS = 10_000
MAX_REFUSING_WORK = 1024
RESOURCE_NAME_WHAT = ("a resource name (a lower-case letter, then lower-case letters, digits, '.', '_' or '-'; "
                      "at most 64)")

Labels = Annotated[dict[Annotated[str, Field(pattern=NAME_PATTERN)], MapValue] | None,
                   Field(max_length=MAX_MAP_ENTRIES), Says(what="a name", every=MAP_SAYS.every)]


class Limits(Request):
    """The limits a node gives a job that asks for none."""

    memory_mb: int = Field(ge=MIN_LIMIT_MEMORY_MB, le=MAX_LIMIT_MEMORY_MB)
    cpu_percent: int = Field(ge=1, le=MAX_LIMIT_CPU_PERCENT)
    """Percent of one CPU."""
    max_processes: int | None = Field(None, ge=1, le=MAX_LIMIT_PROCESSES)
    """Its processes and threads at once; null when the node sets no such limit."""


LIMITS_SAYS = Says(every="must be an object with memory_mb and cpu_percent (and max_processes)")


class DefaultLimits(Request):
    """The node's limits for jobs that ask for none, per job type."""

    run: Annotated[Limits, LIMITS_SAYS]
    service: Annotated[Limits, LIMITS_SAYS]

    def columns(self) -> dict:
        return self.model_dump()


class Gpu(Request):
    """One GPU of a node, or one MIG instance of a GPU (each counts as one device)."""

    index: Annotated[str, Says(what="a GPU's index ('0'), or a MIG instance's ('0:1', instance 1 of GPU 0)")] = Field(
        pattern=GPU_INDEX_PATTERN, examples=["0", "0:1"])
    """The device's index as the driver numbers it: `0`, or `0:1` for MIG instance 1 of GPU 0."""
    uuid: Annotated[str, Says(what="a device UUID ('GPU-...' or 'MIG-...')")] = Field(
        pattern=GPU_UUID_PATTERN, examples=["GPU-5fd4c4a2-0e3b-8d7a-1c2f-3b4a5c6d7e8f"])
    """The device's UUID: `GPU-...`, or `MIG-...` for a MIG instance (older drivers: `MIG-GPU-<uuid>/<gi>/<ci>`)."""
    model: Text = Field(max_length=MAX_GPU_MODEL_CHARS, examples=["NVIDIA H100 80GB HBM3"])
    memory_mb: int = Field(ge=0, le=MAX_GPU_MEMORY_MB)
    """The device's memory, in MiB."""


class NodeRegistration(Request):
    """What an agent says of its node. Re-registering replaces every field (an omitted optional
    field goes back to its default) and counts as a heartbeat."""

    address: Text = Field(max_length=255)
    """Where the node can be reached (host name or IP)."""
    kind: Annotated[str | None, Says(what="a lower-case word")] = Field(
        "compute", min_length=1, max_length=1024, pattern=KIND_PATTERN)
    """A lower-case word; the scheduler places jobs on `compute` nodes only."""
    slots: int | None = Field(1, ge=1, le=MAX_SLOTS)
    """Jobs the node can run at once."""
    cpus: int | None = Field(None, ge=1, le=100_000)
    memory_mb: int | None = Field(None, ge=0, le=MAX_MEMORY_MB)
    max_memory_mb: int | None = Field(None, ge=1, le=MAX_MEMORY_MB)
    """The largest memory limit a job may ask for on this node."""
    max_cpu_percent: int | None = Field(None, ge=1, le=10_000_000)
    """The largest CPU limit (percent of one CPU) a job may ask for."""
    labels: Labels = None
    """Free-form string labels. Keys are letters, digits, '.', '_' or '-' (at most 128, starting with a
    letter or digit); values must not contain NUL characters."""
    default_limits: Annotated[DefaultLimits | None,
                              Says(every="must be an object with 'run' and 'service' limits")] = None
    """The limits the node gives jobs that ask for none, per job type (placement reserves them for such
    jobs); null: not said."""
    reserved_memory_mb: int | None = Field(0, ge=0, le=MAX_LIMIT_MEMORY_MB)
    """Memory the node keeps for the system: placement counts its allocatable memory as max_memory_mb
    minus this."""
    reserved_cpu_percent: int | None = Field(0, ge=0, le=MAX_LIMIT_CPU_PERCENT)
    """CPU (percent of one CPU) the node keeps for the system: placement counts its allocatable CPU as
    max_cpu_percent minus this."""
    refusing_work: Text | None = Field(None, max_length=MAX_REFUSING_WORK)
    """Why the node takes no new work now (its agent's own condition, e.g. short of disk space); null or
    omitted: it takes work. Each heartbeat replaces it."""
    gpus: list[Gpu] | None = Field(None, min_length=0, max_length=MAX_NODE_GPUS)
    """The node's GPUs (a MIG instance counts as one), each index and UUID once; null or omitted: none."""
    resources: dict[Annotated[str, Field(pattern=RESOURCE_NAME_PATTERN)],
                    Annotated[int, Field(ge=0, le=MAX_RESOURCE_COUNT)]] | None = Field(
        None, max_length=MAX_RESOURCES, examples=[{"fpga": 2, "licence.matlab": 4}])
    """Countable resources the node has, name -> how many; null or omitted: none. Names are lower-case
    letters, digits, '.', '_' or '-' (at most 64, starting with a letter); `gpus`, `memory_mb`,
    `cpu_percent`, `slots` and `jobs` are not resource names (they have fields of their own)."""
    node_id: Name = Field(max_length=1024)  # last: a refusal names the node's other fields first
    """Letters, digits, '.', '_' or '-', at most 128 characters."""

    @field_validator("gpus", mode="wrap")
    @classmethod
    def _gpus(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> list[Gpu] | None:
        """Each device's refusal names its place in the list; no UUID or index twice."""
        try:
            gpus = handler(value)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            item = errors[0]["loc"][:1]
            if not (item and isinstance(item[0], int)):
                raise  # of the list itself: worded as any field's
            if errors[0]["loc"] == item:
                raise refused(f"'gpus' item {item[0]} must be an object with index, uuid, model and "
                              f"memory_mb") from None
            inside = [dict(e, loc=e["loc"][1:]) for e in errors if e["loc"][:1] == item]
            raise refused(f"'gpus' item {item[0]}: {refusal(Gpu, inside)}") from None
        for key in ("uuid", "index"):
            seen: dict[str, int] = {}
            for position, gpu in enumerate(gpus or ()):
                said = getattr(gpu, key)
                if said in seen:
                    raise refused(f"'gpus' has the {key} {said!r} twice (items {seen[said]} and {position})")
                seen[said] = position
        return gpus

    @field_validator("resources", mode="wrap")
    @classmethod
    def _resources(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> dict[str, int] | None:
        try:
            resources = handler(value)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            loc = error["loc"]
            if len(loc) == 2 and loc[1] == "[key]":
                raise refused(f"'resources' key {loc[0]!r} is not {RESOURCE_NAME_WHAT}") from None
            if len(loc) == 1:
                raise refused(f"'resources' value for {loc[0]!r} must be a whole number between 0 and "
                              f"{MAX_RESOURCE_COUNT}") from None
            if error["type"] == "too_long":
                raise refused(f"'resources' has more than {MAX_RESOURCES} entries") from None
            raise refused("'resources' must be an object of whole numbers") from None
        for name in resources or ():
            if name in RESERVED_RESOURCE_NAMES:
                *others, last = RESERVED_RESOURCE_NAMES
                raise refused(f"'resources' key {name!r} is reserved: {', '.join(others)} and {last} have fields "
                              f"of their own")
        return resources

    @model_validator(mode="after")
    def _reserves(self) -> "NodeRegistration":
        for reserve, maximum in (("reserved_memory_mb", "max_memory_mb"), ("reserved_cpu_percent", "max_cpu_percent")):
            kept, most = getattr(self, reserve), getattr(self, maximum)
            if kept and most is not None and kept > most:
                raise refused(f"'{reserve}' ({kept}) is more than '{maximum}' ({most})")
        return self

    def columns(self) -> dict:
        """What the node's row records of it (all but its id)."""
        return {"address": self.address, "kind": self.kind or "compute", "slots": self.slots or 1,
                "cpus": self.cpus, "memory_mb": self.memory_mb, "max_memory_mb": self.max_memory_mb,
                "max_cpu_percent": self.max_cpu_percent, "labels": self.labels or {},
                "default_limits": None if self.default_limits is None else self.default_limits.columns(),
                "reserved_memory_mb": self.reserved_memory_mb or 0,
                "reserved_cpu_percent": self.reserved_cpu_percent or 0,
                "refusing_work": self.refusing_work,
                "gpus": [gpu.model_dump() for gpu in self.gpus] if self.gpus else None,
                "resources": self.resources or None}


class Heartbeat(Request):
    """An optional heartbeat body. An empty body is a heartbeat too."""

    running: int | None = Field(None, ge=0, le=1_000_000)
    """Jobs the node runs now; omitted or null clears it."""
    refusing_work: Text | None = Field(None, max_length=MAX_REFUSING_WORK)
    """Why the node takes no new work now (e.g. `only 812 MB free on the filesystem of /var/lib/corral/work, under
    AGENT_MIN_FREE_DISK_MB (1024 MB)`); omitted or null: it takes work (an older agent sends none)."""


class ServiceRegistration(Request):
    """A running service job, recorded by the agent that started it. Registering the same job_id
    again replaces the record."""

    job_id: Annotated[str, Says(what="a job id")] = Field(
        min_length=1, max_length=64, pattern=NAME_PATTERN, examples=["job-42"])
    name: Text = Field(max_length=255)
    node_id: NodeId = Field(max_length=1024)
    address: Text = Field(max_length=255)
    port: int = Field(ge=1, le=65535)
    healthy: bool | None = None
    """Result of the last health check; null or omitted when unknown."""
    attempt: int | None = Field(None, ge=0, le=1_000_000_000)
    """The job's attempt the service belongs to; an older attempt never replaces a newer one's record."""
    grant: Text | None = Field(None, max_length=128)
    """With tokens, required of a node: the job's `service_grant` from the scheduler, which proves this
    attempt was handed to this node."""

    def columns(self) -> dict:
        """What the service's row records (all but its job id; `grant` is only checked)."""
        return {"name": self.name, "node_id": self.node_id, "address": self.address, "port": self.port,
                "healthy": self.healthy, "attempt": self.attempt}


class LimitsView(Answer):
    memory_mb: int
    cpu_percent: int
    max_processes: int | None


class DefaultLimitsView(Answer):
    run: LimitsView
    service: LimitsView


class GpuView(Answer):
    index: str = Field(examples=["0"])
    """`0`, or `0:1` for MIG instance 1 of GPU 0."""
    uuid: str
    model: str
    memory_mb: int = Field(ge=0)


class Node(Answer):
    node_id: str
    address: str
    kind: str = Field(examples=["compute"])
    slots: int = Field(ge=1)
    cpus: int | None
    memory_mb: int | None
    max_memory_mb: int | None
    max_cpu_percent: int | None
    labels: dict[str, str]
    default_limits: DefaultLimitsView | None
    """The limits the node gives jobs that ask for none, per job type; null when its agent did not say."""
    reserved_memory_mb: int = Field(ge=0)
    """Memory kept for the system (0: none)."""
    reserved_cpu_percent: int = Field(ge=0)
    """CPU kept for the system, in percent of one CPU (0: none)."""
    running: int | None = Field(ge=0)
    """Jobs running, as last reported by the node's heartbeat."""
    drained: bool
    """A drained node gets no new work; it finishes what it runs."""
    refusing_work: str | None
    """Why the node's agent takes no new work now, as its last heartbeat said (e.g. short of disk space); null:
    it takes work. The scheduler places nothing there meanwhile."""
    gpus: list[GpuView]
    """The node's GPUs (MIG instances one each), as its agent registered them; `[]`: none."""
    resources: dict[str, int]
    """The node's countable resources, name -> how many, as its agent registered them; `{}`: none."""
    status: Literal["healthy", "unhealthy"]
    """`unhealthy` once the last heartbeat is older than HEARTBEAT_TIMEOUT_SECS."""
    registered_at: Timestamp
    last_heartbeat: Timestamp


class Service(Answer):
    job_id: str
    name: str
    node_id: str
    address: str
    port: int = Field(ge=1, le=65535)
    attempt: int | None
    healthy: bool | None
    """The last check passed and the node is healthy; false while the node is unhealthy or unknown,
    whatever the last check said; null when never checked, or last checked more than
    SERVICE_CHECK_MAX_AGE_SECS ago (its agent stopped sending it)."""
    node_healthy: bool
    """Whether the service's node is healthy."""
    checked_at: Timestamp | None
    """When `healthy` was last reported."""
    registered_at: Timestamp


class TargetGroup(Answer):
    """A Prometheus HTTP service-discovery target group."""

    targets: list[str] = Field(examples=[["10.0.0.7:8080"]])
    """host:port to scrape."""
    labels: dict[str, str] = Field(examples=[{"__meta_corral_node_id": "node-7", "__meta_corral_label_zone": "a"}])
    """What Corral knows of the target, as `__meta_corral_*` labels for relabelling."""
