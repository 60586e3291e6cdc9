"""The scheduler's HTTP contract: every request and answer body as a pydantic model.

The requests are checked with these models (validation.py turns them into the
store's columns); the views fill the answers; openapi.py generates the document
from both. An SQS message is a POST /jobs body: the same JobRequest.
"""
import datetime
import time
import typing
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, field_validator, model_validator

from corral.server import principals
from corral.shared import states, wire
from corral.shared.errors import BadRequest
from corral.shared.limits import (DEFAULT_WAIT_SECS, MAX_BATCH, MAX_CPU_PERCENT, MAX_GANG_NODES, MAX_GPU_MEMORY_MB,
                                  MAX_MEMORY_MB,
                                  MAX_NODE_GPUS, MAX_OUTPUT_CHARS, MAX_PROCESSES, MAX_RESOURCE_COUNT, MAX_RESOURCES,
                                  MAX_USED_MEMORY_MB, MAX_WAIT_SECS, MIN_MEMORY_MB, RESERVED_RESOURCE_NAMES,
                                  RESOURCE_NAME_PATTERN)
from corral.shared.contract import (MAP_SAYS, MAX_MAP_ENTRIES, NO_NUL_PATTERN, MapValue, Answer, Name, NodeId,
                                    Request, Says, Text, Timestamp, optional_key, refused)
from corral.shared.validate import ENV_NAME_PATTERN, forbidden_env_var

from . import dependencies, slots, waiting

TeamName = Annotated[str, Field(pattern=principals.TEAM_PATTERN), Says(what="a team name")]

if typing.TYPE_CHECKING:
    JobType = str
    StatusName = str
    EndedBy = str
    ReportedEnd = str
    SignalName = str
    OnNodeLost = str
    OnDependencyFailure = str
else:  # the choices come from shared.wire and shared.states, never a copy
    JobType = Literal[wire.JOB_TYPES]
    StatusName = Literal[states.ALL]
    EndedBy = Literal[wire.ENDED_BY]
    ReportedEnd = Literal[wire.ENDED_BY_REPORTED]
    SignalName = Literal[wire.JOB_SIGNALS]
    OnNodeLost = Literal[wire.ON_NODE_LOST]
    OnDependencyFailure = Literal[wire.ON_DEPENDENCY_FAILURE]

MAX_RETRIES = 20
DEPLOY_SCHEMES = ("http", "https", "s3")
MAX_COMMAND_CHARS = 64 * 1024
SHA256_PATTERN = r"^[0-9a-fA-F]{64}$"
HEALTH_PATH_PATTERN = r"^/[\x21-\x7e]{0,1023}$"  # printable ASCII, no spaces
MAX_DISK_MB = 16 * 1024 * 1024   # 16 TiB
MAX_ATTEMPT = 1_000_000_000
# The jobs one claim may ask for (POST /nodes/{id}/claim); batches: shared/limits.py.
MAX_CLAIM = 1000

JobId = Annotated[str, Field(min_length=1, max_length=1024, pattern=wire.JOB_ID_PATTERN),
                  Says(what="a job id such as job-42")]
Output = Annotated[str | None, Field(max_length=MAX_OUTPUT_CHARS), Says(hint="send its tail")]
EnvName = Annotated[str, Field(pattern=ENV_NAME_PATTERN)]
EnvVars = Annotated[dict[EnvName, MapValue] | None, Field(max_length=MAX_MAP_ENTRIES),
                    Says(what="an environment variable name", every=MAP_SAYS.every)]
ResourceName = Annotated[str, Field(pattern=RESOURCE_NAME_PATTERN)]
ResourceCounts = Annotated[dict[ResourceName, Annotated[int, Field(ge=1, le=MAX_RESOURCE_COUNT)]] | None,
                      Field(max_length=MAX_RESOURCES),
                      Says(what="a resource name (lower-case letters, digits, '_', '.', '-')",
                           every="must be an object of resource names and whole numbers of at least 1")]


# ---- requests --------------------------------------------------------------------

CONSTRAINT_OPS = ("=", "!=", "in", "not_in", "exists", "not_exists")
MAX_CONSTRAINTS = 32
MAX_CONSTRAINT_VALUES = 64
MAX_PRIORITY = 100
MAX_DELAY_SECS = 366 * 86400.0   # run_at and delay_secs: at most a year (and a day) ahead
# A job's own timeout_secs: the model's bound; the cluster's (JOB_TIMEOUT_MAX_SECS) is
# a setting, checked by the store (validation.check_timeout).
MAX_TIMEOUT_SECS = 366 * 86400.0
# A job's own kill_grace_secs: the model's bound; the cluster's is JOB_KILL_GRACE_MAX_SECS.
MAX_KILL_GRACE_SECS = 86400.0
if typing.TYPE_CHECKING:
    ConstraintOp = str
else:
    ConstraintOp = Literal[CONSTRAINT_OPS]
LabelValue = Annotated[str, Field(max_length=1024, pattern=NO_NUL_PATTERN)]


class Constraint(Request):
    """A condition on a node's labels (its agent's AGENT_LABELS). A label the node lacks
    satisfies `!=`, `not_in` and `not_exists` only."""

    label: Name = Field(max_length=128, examples=["zone"])
    op: ConstraintOp
    """`=` and `!=` take a string `value`, `in` and `not_in` a list of strings, `exists` and
    `not_exists` none."""
    value: LabelValue | list[LabelValue] | None = Field(None, examples=["a"])

    @model_validator(mode="after")
    def _value_fits_op(self) -> "Constraint":
        if self.op in ("=", "!="):
            if not isinstance(self.value, str):
                raise refused(f"a constraint with op {self.op!r} needs a string 'value'")
            if self.value.startswith("="):
                # `zone==a` typed for equality arrives as `=` with the value "=a", which no
                # node has: the job would wait forever. Refused rather than guessed at.
                raise refused(f"a constraint's value may not start with '=' (got {self.value!r}): "
                              f"equality is one '=', as in {self.label}={self.value.lstrip('=')}")
        elif self.op in ("in", "not_in"):
            if not isinstance(self.value, list) or not self.value:
                raise refused(f"a constraint with op {self.op!r} needs a 'value' that is a non-empty list of strings")
            if len(self.value) > MAX_CONSTRAINT_VALUES:
                raise refused(f"a constraint's 'value' may list at most {MAX_CONSTRAINT_VALUES} strings")
            if any(value.startswith("=") for value in self.value):
                raise refused(f"a constraint's value may not start with '=' (op {self.op!r} takes the values "
                              f"themselves)")
        elif self.value is not None:
            raise refused(f"a constraint with op {self.op!r} takes no 'value'")
        return self

    def column(self) -> list:
        return [self.label, self.op, self.value]


if typing.TYPE_CHECKING:
    Condition = str
else:
    Condition = Literal[dependencies.CONDITIONS]
MAX_DEPENDENCIES = 100


class Dependency(Request):
    """A job this one waits for, and how it must end: `done` (the default), `failed`, or
    `finished` (any final status, cancelled included)."""

    job_id: JobId | None = None
    index: int | None = Field(None, ge=0, lt=MAX_BATCH)
    """In POST /jobs/batch only: an earlier item of the same batch, instead of `job_id`."""
    condition: Condition | None = "done"

    @model_validator(mode="after")
    def _one_target(self) -> "Dependency":
        if (self.job_id is None) == (self.index is None):
            raise refused("a dependency names a 'job_id' or (in a batch) an earlier item's 'index'")
        return self

    def column(self) -> list:
        target = ["index", self.index] if self.index is not None else ["job", int(self.job_id[4:])]  # type: ignore[index]
        return [*target, self.condition or "done"]


MAX_ARRAY = 10_000
MAX_CONCURRENCY_LIMIT = 100_000


class ArraySpec(Request):
    """N copies of the job, one transaction, at most `parallel` placed or running at once."""

    count: int = Field(ge=1, le=MAX_ARRAY)
    """How many jobs; each gets CORRAL_ARRAY_INDEX (0 to count - 1) and CORRAL_ARRAY_COUNT."""
    parallel: int | None = Field(None, ge=1, le=MAX_ARRAY)
    """At most this many placed or running at once (default: count)."""

    @model_validator(mode="after")
    def _parallel_within_count(self) -> "ArraySpec":
        if self.parallel is not None and self.parallel > self.count:
            raise refused("'parallel' must be at most 'count'")
        return self


def parse_instant(name: str, text: str) -> float:
    """Field `name`'s ISO-8601 time with `Z` or a UTC offset, as epoch seconds."""
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise refused(f"{name!r} must be an ISO-8601 time such as 2026-12-24T02:00:00Z") from None
    if when.tzinfo is None:
        raise refused(f"{name!r} needs a zone: end it with Z or an offset such as +01:00")
    return when.timestamp()


def parse_run_at(text: str, now: float) -> float:
    """run_at as epoch seconds, at most MAX_DELAY_SECS ahead."""
    at = parse_instant("run_at", text)
    if at - now > MAX_DELAY_SECS:
        raise refused("'run_at' must be at most a year ahead")
    return at


Signal = Annotated[SignalName, Says(what=f"a signal name: {', '.join(wire.JOB_SIGNALS)}")]


def signal_name(value: object) -> object:
    """`USR1`, `SIGUSR1` and `usr1` alike are USR1 (as Slurm's --signal takes them)."""
    if isinstance(value, str):
        value = value.strip().upper()
        return value[3:] if value.startswith("SIG") else value
    return value


class SignalBeforeEnd(Request):
    """A warning sent to the job's processes `secs` seconds before its timeout (as Slurm's
    `--signal=USR1@60`)."""

    signal: Signal = Field(examples=["USR1"])
    secs: float = Field(gt=0, le=MAX_TIMEOUT_SECS, examples=[60])

    @field_validator("signal", mode="before")
    @classmethod
    def _name(cls, value: object) -> object:
        return signal_name(value)


class JobRequest(Request):
    """A job to run. `command` or `deploy_url` (non-null) is required; null counts as not
    given for every optional field."""

    # Declared in the order they are checked: the first refusal is about the first bad field.
    command: Text | None = Field(None, max_length=MAX_COMMAND_CHARS, examples=["python etl.py --day 2026-11-29"])
    """Shell command, run in the job's work dir. Must not be blank or contain NUL characters."""
    deploy_url: Text | None = Field(None, max_length=2048, examples=["s3://builds/etl-42.zip"])
    """A zip fetched and unpacked into the work dir before the command runs: http(s)://host/... or s3://bucket/key."""
    job_type: JobType | None = "run"
    """`run` waits for exit; `service` is kept running until cancelled."""
    deploy_sha256: Annotated[str | None, Says(what="64 hexadecimal digits")] = Field(
        None, min_length=1, pattern=SHA256_PATTERN)
    """SHA-256 of the deploy_url zip, checked before unpacking."""
    port: int | None = Field(None, ge=1, le=65535)
    """The port a service listens on."""
    env_vars: EnvVars = Field(None, examples=[{"STAGE": "prod"}])
    """Added to the command's environment. Keys are environment variable names: a letter or '_', then
    letters, digits or '_' (at most 256). Values must not contain NUL characters."""
    instance_id: NodeId | None = Field(None, max_length=1024)
    """Pin the job to this node."""
    name: Name | None = Field(None, max_length=1024)
    """A name for the job; a service is registered under it (default: the job id)."""
    memory_mb: int | None = Field(None, ge=MIN_MEMORY_MB, le=MAX_MEMORY_MB)
    """Memory limit; default 512 for `run`, 1024 for `service` (the node's settings). Refused when no
    known node allows it."""
    cpu_percent: int | None = Field(None, ge=1, le=MAX_CPU_PERCENT)
    """CPU limit in percent of one CPU; default 100 for `run`, 200 for `service`."""
    max_processes: int | None = Field(None, ge=1, le=MAX_PROCESSES)
    """The most processes (and threads) the job may have at once; default the node's
    AGENT_JOB_MAX_PROCESSES (1,024)."""
    disk_mb: int | None = Field(None, ge=1, le=MAX_DISK_MB)
    """The most its work dir may hold, in MB (default JOB_DEFAULT_DISK_MB); past it the agent ends the
    job (`ended_by`: `disk`)."""
    gpus: int | None = Field(None, ge=0, le=MAX_NODE_GPUS, examples=[1])
    """GPUs the job needs on its node (0 or omitted: none). Placement reserves that many of the node's free
    devices (MIG instances count one each) and the job sees only those."""
    gpu_model: Text | None = Field(None, min_length=1, max_length=128, examples=["A100"])
    """Only GPUs whose model contains this, ignoring case (`a100` matches `NVIDIA A100-SXM4-80GB`). Needs `gpus`."""
    gpu_memory_mb: int | None = Field(None, ge=1, le=MAX_GPU_MEMORY_MB, examples=[40960])
    """Only GPUs with at least this much memory each. Needs `gpus`."""
    resources: ResourceCounts = Field(None, examples=[{"fpga": 1}])
    """Other countable resources its node must have free, as the node's agent declares them
    (AGENT_RESOURCES), e.g. `{"fpga": 1}`; reserved like memory until the job ends."""
    nodes: int | None = Field(None, ge=1, le=MAX_GANG_NODES, examples=[4])
    """`run` jobs only: run on this many distinct nodes at once (default 1), each member with the memory,
    CPU, GPUs and resources asked above. All members are placed together or none; each gets its rank and
    the others' addresses (CORRAL_GANG_*, MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, NODE_RANK)."""
    health_path: Annotated[str | None, Says(what="a URL path starting with '/' (printable ASCII, no spaces)")] = Field(
        None, min_length=1, pattern=HEALTH_PATH_PATTERN)
    """For services with a port: checked with HTTP GET (2xx/3xx is healthy) instead of a TCP connect."""
    max_retries: int | None = Field(None, ge=0, le=MAX_RETRIES)
    """How many times a failed attempt is retried (default MAX_JOB_RETRIES)."""
    on_node_lost: OnNodeLost | None = "requeue"
    """When the job's node is lost while it runs: run it again elsewhere (not counted as a retry), or
    fail it (for jobs that must not run twice)."""
    timeout_secs: float | None = Field(None, gt=0, le=MAX_TIMEOUT_SECS, examples=[7200])
    """`run` jobs only: stopped (`kill_signal`, then `kill_grace_secs`, then SIGKILL) and failed once
    running this many seconds (default JOB_TIMEOUT_SECS, or the team's maximum when that is lower; at most
    JOB_TIMEOUT_MAX_SECS and the team's `max_timeout_secs`). A service has no timeout."""
    signal_before_end: Annotated[SignalBeforeEnd | None, Says(
        every="must be an object with 'signal' (such as USR1) and 'secs'")] = Field(
        None, examples=[{"signal": "USR1", "secs": 60}])
    """`run` jobs only: this signal goes to every process of the job `secs` seconds before its timeout,
    to save a checkpoint; `secs` must be less than the timeout."""
    kill_signal: Signal | None = Field(None, examples=["TERM"])
    """The signal every end Corral causes (timeout, cancel, preemption, its node stopping) starts with;
    default TERM."""
    kill_grace_secs: float | None = Field(None, ge=0, le=MAX_KILL_GRACE_SECS, examples=[30])
    """Seconds between `kill_signal` and SIGKILL of whatever is left of the job (default
    JOB_KILL_GRACE_SECS, 10; at most JOB_KILL_GRACE_MAX_SECS)."""
    preemptible: bool | None = Field(None, examples=[False])
    """False: the job runs only within its team's guaranteed quota, never on capacity borrowed from other
    teams, and is never preempted. Default true."""
    constraints: Annotated[list[Constraint] | None, Says(every="must be a list of constraints")] = Field(
        None, max_length=MAX_CONSTRAINTS, examples=[[{"label": "zone", "op": "=", "value": "a"},
                                                     {"label": "gpu", "op": "exists"}]])
    """Conditions on node labels, all of which the job's node must meet. A job no known node meets is
    accepted and waits (nodes may join later)."""
    pool: Name | None = Field(None, max_length=128)
    """Only nodes of this pool (a node's `pool` label; unlabelled nodes are in `default`); none: any."""
    priority: int | None = Field(None, ge=0, le=MAX_PRIORITY)
    """0–100, default 50: among jobs that could be placed, higher first, then older first. A waiting
    job gains a point for every PRIORITY_AGING_SECS it waits."""
    run_at: Text | None = Field(None, max_length=64, examples=["2026-12-24T02:00:00Z"])
    """Not placed before this time (ISO-8601 with Z or a UTC offset, at most a year ahead)."""
    delay_secs: float | None = Field(None, ge=0, le=MAX_DELAY_SECS)
    """Not placed before this many seconds from now (not with run_at)."""
    depends_on: Annotated[list[Dependency] | None, Says(every="must be a list of dependencies")] = Field(
        None, max_length=MAX_DEPENDENCIES, examples=[[{"job_id": "job-7", "condition": "done"}]])
    """Jobs this one waits for; it is placed once every condition holds. Each must exist."""
    on_dependency_failure: OnDependencyFailure | None = "cancel"
    """When a condition can never hold: cancel this job (and its own dependents), or run it anyway."""
    concurrency_key: Name | None = Field(None, max_length=128, examples=["db-migrations"])
    """At most the key's limit (PUT /concurrency/{key}) of the jobs with this key are placed or running at
    once, cluster-wide; a key with no limit set is unlimited."""
    team: TeamName | None = Field(None, examples=["ml"])
    """The team the job belongs to; default the user's default team (or their only one; `default` for the
    bootstrap token). A member may name only a team of theirs."""
    array: Annotated[ArraySpec | None, Says(every="must be an object with 'count' (and 'parallel')")] = None
    """Submit `count` copies at once (POST /jobs only; the answer is the array, not a job)."""

    # Rules across fields that JSON Schema can say (the validators below check them).
    model_config = ConfigDict(json_schema_extra={"anyOf": [
        {"required": ["command"], "properties": {"command": {"type": "string"}}},
        {"required": ["deploy_url"], "properties": {"deploy_url": {"type": "string"}}}]})

    @field_validator("command")
    @classmethod
    def _not_blank(cls, command: str | None) -> str | None:
        if command is not None and not command.strip():
            raise refused("'command' must not be blank")
        return command

    @field_validator("deploy_url")
    @classmethod
    def _deploy_url(cls, url: str | None) -> str | None:
        if url is not None:
            check_deploy_url(url)
        return url

    @field_validator("kill_signal", mode="before")
    @classmethod
    def _kill_signal(cls, value: object) -> object:
        return signal_name(value)

    @field_validator("resources")
    @classmethod
    def _own_fields(cls, resources: dict[str, int] | None) -> dict[str, int] | None:
        taken = sorted(set(resources or ()) & set(RESERVED_RESOURCE_NAMES))
        if taken:
            raise refused(f"'resources' may not name {taken[0]!r}: ask for it with its own field")
        return resources

    @field_validator("env_vars")
    @classmethod
    def _loader_variables(cls, env_vars: dict[str, str] | None) -> dict[str, str] | None:
        refused_name = forbidden_env_var(env_vars or ())
        if refused_name is not None:
            raise refused(f"'env_vars' may not set {refused_name}: it would make the dynamic loader run "
                          f"code of the job's choosing in every program the job starts")
        return env_vars

    @model_validator(mode="after")
    def _together(self) -> "JobRequest":
        if self.command is None and self.deploy_url is None:
            raise refused("a job needs 'command' or 'deploy_url'")
        if self.deploy_sha256 is not None and self.deploy_url is None:
            raise refused("'deploy_sha256' needs 'deploy_url'")
        if self.health_path is not None and ((self.job_type or "run") != "service" or self.port is None):
            raise refused("'health_path' is for service jobs with a 'port'")
        if self.timeout_secs is not None and (self.job_type or "run") == "service":
            raise refused("'timeout_secs' is for run jobs: a service runs until it is cancelled")
        if self.signal_before_end is not None and (self.job_type or "run") == "service":
            raise refused("'signal_before_end' is for run jobs: a service has no timeout to warn of")
        if (self.signal_before_end is not None and self.timeout_secs is not None
                and self.signal_before_end.secs >= self.timeout_secs):
            raise refused("'signal_before_end' must come before the end: its 'secs' must be less than "
                          "'timeout_secs'")
        if (self.nodes or 1) > 1 and (self.job_type or "run") == "service":
            raise refused("'nodes' is for run jobs: a service runs on one node")
        if (self.nodes or 1) > 1 and self.instance_id is not None:
            raise refused("'nodes' asks for that many distinct nodes: it cannot go with 'instance_id', which pins "
                          "a job to one")
        if not self.gpus and (self.gpu_model is not None or self.gpu_memory_mb is not None):
            raise refused("'gpu_model' and 'gpu_memory_mb' choose among the GPUs a job asks for: give 'gpus' too")
        if self.run_at is not None and self.delay_secs is not None:
            raise refused("give 'run_at' or 'delay_secs', not both")
        if self.run_at is not None:
            parse_run_at(self.run_at, time.time())
        return self

    def columns(self) -> dict:
        """The new job's columns (what `request_hash` digests: a repeated submission hashes alike)."""
        return {
            "command": self.command, "deploy_url": self.deploy_url,
            "deploy_sha256": None if self.deploy_sha256 is None else self.deploy_sha256.lower(),
            "job_type": self.job_type or "run", "port": self.port, "env_vars": self.env_vars or {},
            "instance_id": self.instance_id, "name": self.name, "memory_mb": self.memory_mb,
            "cpu_percent": self.cpu_percent, "max_processes": self.max_processes, "disk_mb": self.disk_mb,
            "gpus": self.gpus or None, "gpu_model": self.gpu_model if self.gpus else None,
            "gpu_memory_mb": self.gpu_memory_mb if self.gpus else None, "resources": self.resources or None,
            "nodes": self.nodes if (self.nodes or 1) > 1 else None, "health_path": self.health_path,
            "max_retries": self.max_retries,
            "on_node_lost": self.on_node_lost or "requeue", "timeout_secs": self.timeout_secs,
            "warn_signal": None if self.signal_before_end is None else self.signal_before_end.signal,
            "warn_secs": None if self.signal_before_end is None else self.signal_before_end.secs,
            "kill_signal": self.kill_signal, "kill_grace_secs": self.kill_grace_secs,
            "preemptible": self.preemptible is not False,
            "constraints": [c.column() for c in self.constraints] if self.constraints else None,
            "pool": self.pool, "priority": 50 if self.priority is None else self.priority,
            # When it may start: resolved against the clock when stored (store/new_jobs.py).
            "run_at": None if self.run_at is None else parse_run_at(self.run_at, time.time()),
            "delay_secs": self.delay_secs,
            "depends_on": [d.column() for d in self.depends_on] if self.depends_on else None,
            "on_dependency_failure": self.on_dependency_failure or "cancel",
            "concurrency_key": self.concurrency_key, "team": self.team,
            "array": None if self.array is None else {"count": self.array.count,
                                                      "parallel": self.array.parallel or self.array.count},
        }


def check_deploy_url(url: str) -> None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- parses the port; raises ValueError when it is not a number
    except ValueError as exc:
        raise refused(f"'deploy_url' is not a valid URL: {exc}") from None
    if parts.scheme not in DEPLOY_SCHEMES:
        raise refused(f"'deploy_url' must start with {', '.join(s + '://' for s in DEPLOY_SCHEMES)}")
    if not parts.netloc:
        raise refused("'deploy_url' has no host (or bucket)")
    if parts.scheme == "s3" and not parts.path.strip("/"):
        raise refused("'deploy_url' must name an object: s3://bucket/key")


# ---- schedules ---------------------------------------------------------------------

SCHEDULE_NOT_IN_JOB = {"run_at": "its runs start at their slots", "delay_secs": "its runs start at their slots",
                       "depends_on": "a run depends on no other job", "array": "a run is one job",
                       "team": "its runs belong to the schedule's team"}
if typing.TYPE_CHECKING:
    Overlap = str
    CatchUp = str
else:  # the choices come from slots.py, never a copy
    Overlap = Literal[slots.OVERLAP]
    CatchUp = Literal[slots.CATCH_UP]


class ScheduleRequest(Request):
    """A job run at every slot of a cron expression or an interval (POST /schedules)."""

    name: Name = Field(max_length=128, examples=["nightly-etl"])
    """Unique; the schedule's address (GET /schedules/{name})."""
    cron: Text | None = Field(None, max_length=256, examples=["30 2 * * *"])
    """Five fields (minute hour day-of-month month day-of-week) or @hourly, @daily, @weekly, @monthly,
    in `time_zone`. Not with `interval_secs`."""
    interval_secs: Annotated[float | None, Says(every="must be a number of seconds from 1 to 31,622,400")] = Field(
        None, ge=1, le=MAX_DELAY_SECS)
    """A slot every this many seconds from `start_at` (default: the schedule's creation). Not with `cron`."""
    start_at: Text | None = Field(None, max_length=64, examples=["2026-12-24T02:00:00Z"])
    """The first slot of an `interval_secs` schedule (ISO-8601 with Z or a UTC offset)."""
    time_zone: Text | None = Field("UTC", max_length=64, examples=["Europe/Berlin"])
    """The IANA zone `cron` is read in (an interval ignores it)."""
    job: Annotated[dict[str, typing.Any], Says(every="must be a job request, as POST /jobs takes it")]
    """What each slot runs: a POST /jobs body, without run_at, delay_secs, depends_on or array."""
    overlap: Overlap | None = "allow"
    """A slot whose previous run is still pending or running: `allow` it, `skip` it, or `cancel_previous`."""
    catch_up: CatchUp | None = "latest"
    """The slots missed while the scheduler was down: the newest only (`latest`), `none`, or `all` (at most
    SCHEDULE_CATCH_UP_MAX)."""
    enabled: bool | None = True
    team: TeamName | None = Field(None, examples=["ml"])
    """The team it belongs to, and its runs with it (default: the caller's default team). Its runs are
    submitted by whoever created it. Making one takes a team admin (or a cluster admin)."""

    @field_validator("job")
    @classmethod
    def _job_template(cls, job: dict) -> dict:
        for name, why in SCHEDULE_NOT_IN_JOB.items():
            if job.get(name) is not None:
                raise refused(f"'job' may not have {name!r}: {why}")
        try:
            JobRequest.check(job)
        except BadRequest as exc:
            raise refused(f"'job' is not a valid job request: {exc.message}") from None
        return job

    @model_validator(mode="after")
    def _when(self) -> "ScheduleRequest":
        if (self.cron is None) == (self.interval_secs is None):
            raise refused("give 'cron' or 'interval_secs' (one of them)")
        try:
            slots.time_zone(self.time_zone or "UTC")
            if self.cron is not None:
                slots.parse_cron(self.cron)
        except slots.SlotError as exc:
            raise refused(str(exc)) from None
        if self.start_at is not None:
            if self.interval_secs is None:
                raise refused("'start_at' anchors an 'interval_secs' schedule; a cron schedule has none")
            parse_instant("start_at", self.start_at)
        return self


class JobBatch(Request):
    """Up to 1,000 job requests, stored in ONE transaction: all of them or, when any item is invalid, none."""

    jobs: list[JobRequest] = Field(min_length=1, max_length=MAX_BATCH)
    """Each item is a POST /jobs body. A dependency of an item may name an earlier item by its `index`."""

    @model_validator(mode="after")
    def _earlier_items(self) -> "JobBatch":
        for position, job in enumerate(self.jobs):
            if job.array is not None:
                raise refused(f"item {position}: an array cannot be part of a batch; submit it with POST /jobs")
            for dependency in job.depends_on or ():
                if dependency.index is not None and dependency.index >= position:
                    raise refused(f"item {position}: a dependency's 'index' must name an earlier item "
                                  f"(0 to {position - 1})" if position else
                                  "item 0: a dependency's 'index' must name an earlier item; the first has none")
        return self


class Limits(Request):
    """Cgroup limits of a job."""

    memory_mb: int = Field(ge=1, le=MAX_MEMORY_MB)
    cpu_percent: int = Field(ge=1, le=MAX_CPU_PERCENT)
    max_processes: int | None = Field(None, ge=1, le=MAX_PROCESSES)

    def columns(self) -> dict:
        """As stored: max_processes only when the node sets a pids limit."""
        return self.model_dump(exclude_none=True)


LIMITS_SAYS = Says(every="must be an object with memory_mb, cpu_percent and max_processes")


class StatusReport(Request):
    """An agent's report on one attempt of a job placed on its node. `done` and `failed` need
    `exit_code`; `done` needs exit_code 0."""

    status: Literal["running", "done", "failed"]
    node_id: NodeId = Field(max_length=1024)
    """The reporting node."""
    attempt: int = Field(ge=0, le=MAX_ATTEMPT)
    """The attempt the report is about (the job's `attempt` when it was claimed)."""
    exit_code: int | None = Field(None, ge=-255, le=255)
    stdout: Output = None
    """Output tail; the scheduler keeps the last CORRAL_OUTPUT_TAIL_BYTES."""
    stderr: Output = None
    limits_enforced: bool | None = None
    """With `running`: whether the node applies cgroup limits."""
    limits: Annotated[Limits | None, LIMITS_SAYS] = None
    """With `running`: the limits the node applies."""
    private_tmp: bool | None = None
    """With `running`: whether the job gets its own /tmp, /var/tmp and /dev/shm (a private mount namespace)."""
    oom_killed: bool | None = None
    """With `failed`: the kernel killed the job at its memory limit."""
    ended_by: ReportedEnd | None = None
    """With `failed`: why the agent ended the job (`disk`, `timeout`, `oom`; `memory` is read as `oom`);
    null: it exited on its own."""
    peak_memory_bytes: int | None = Field(None, ge=0, le=1 << 62)
    cpu_seconds: Annotated[float | None, Says(every="must be a number of seconds, 0 or more")] = Field(
        None, ge=0, lt=1e12)
    peak_gpu_memory_mb: int | None = Field(None, ge=0, le=MAX_NODE_GPUS * MAX_GPU_MEMORY_MB)
    """With `done` or `failed`: the most memory the job's GPUs held at once, as its node sampled them."""
    gpu_utilization_percent: float | None = Field(None, ge=0, le=100)
    """With `done` or `failed`: the mean utilisation of the job's GPUs over the samples."""
    requeue: bool | None = None
    """With `failed`: the node gave the attempt up (its agent stopped, or its lease lapsed); the job is
    requeued without spending a retry."""

    # Rules across fields that JSON Schema can say (the validator below checks them).
    model_config = ConfigDict(json_schema_extra={"anyOf": [
        {"properties": {"status": {"const": "running"}}},
        {"required": ["exit_code"], "properties": {"status": {"const": "done"}, "exit_code": {"const": 0}}},
        {"required": ["exit_code"], "properties": {"status": {"const": "failed"}, "exit_code": {"type": "integer"}}},
    ]})

    @model_validator(mode="after")
    def _together(self) -> typing.Self:
        if self.requeue and self.status != "failed":
            raise refused("'requeue' goes with a 'failed' report")
        if self.ended_by is not None and self.status != "failed":
            raise refused("'ended_by' goes with a 'failed' report")
        if self.status in ("done", "failed") and self.exit_code is None:
            raise refused(f"a {self.status!r} report needs 'exit_code'")
        if self.status == "done" and self.exit_code != 0:
            raise refused("a 'done' report must have exit_code 0; report 'failed' otherwise")
        return self

    def columns(self) -> dict:
        """The report as the store applies it."""
        return {
            "node_id": self.node_id, "attempt": self.attempt, "status": self.status, "exit_code": self.exit_code,
            "stdout": self.stdout, "stderr": self.stderr, "limits_enforced": self.limits_enforced,
            "limits": None if self.limits is None else self.limits.columns(), "private_tmp": self.private_tmp,
            "oom_killed": self.oom_killed, "peak_memory_bytes": self.peak_memory_bytes,
            "cpu_seconds": self.cpu_seconds, "requeue": bool(self.requeue),
            "peak_gpu_memory_mb": self.peak_gpu_memory_mb, "gpu_utilization_percent": self.gpu_utilization_percent,
            "ended_by": wire.ENDED_BY_OOM if self.ended_by == wire.ENDED_BY_MEMORY else self.ended_by,
        }


class JobRef(Request):
    """The job an item of a batch is about (its other fields are the item's model's)."""

    model_config = ConfigDict(extra="ignore")
    job_id: JobId


class BatchReport(StatusReport):
    """One item of a report batch: a POST /jobs/{job_id}/status body plus the job's id."""

    job_id: JobId


class DefaultLimits(Request):
    """The node's limits for jobs that ask for none, per job type."""

    run: Annotated[Limits | None, LIMITS_SAYS] = None
    service: Annotated[Limits | None, LIMITS_SAYS] = None


class Usage(Request):
    """What the jobs of a node use now, as its agent reads their cgroups."""

    memory_mb: int = Field(ge=0, le=MAX_USED_MEMORY_MB)
    """Their memory, in MB."""
    cpu_percent: int = Field(ge=0, le=MAX_CPU_PERCENT)
    """Their CPU since the agent's previous renewal, in percent of one CPU."""
    gpu_memory_mb: int | None = Field(None, ge=0, le=MAX_NODE_GPUS * MAX_GPU_MEMORY_MB)
    """The memory in use on the node's GPUs, in MB, as NVML reads it (omitted: not read)."""
    gpu_utilization_percent: float | None = Field(None, ge=0, le=100)
    """The mean utilisation of the node's GPUs now (omitted: not read)."""


class LeaseRenewal(Request):
    """A lease renewal. The body may be empty."""

    usage: Annotated[Usage | None, Says(every="must be an object with memory_mb and cpu_percent")] = None
    """What the node's jobs use (GET /nodes shows it)."""


class ClaimRequest(Request):
    """What an agent asks for: up to `max` jobs, waiting up to `wait_secs` for work."""

    wait_secs: Annotated[float | None, Says(every=f"must be a number of seconds from 0 to {MAX_WAIT_SECS:g}")] = Field(
        DEFAULT_WAIT_SECS, ge=0, le=MAX_WAIT_SECS)
    """How long to wait when nothing is claimable; 0 answers at once."""
    default_limits: Annotated[DefaultLimits | None,
                                     Says(every="must be an object with 'run' and 'service' limits")] = None
    max: int = Field(ge=1, le=MAX_CLAIM)
    """The most jobs to take (the agent's free slots); the scheduler never gives more than the node's
    free slots either."""
    limits_enforced: bool | None = None
    """Whether the node applies cgroup limits (recorded on each job)."""
    private_tmp: bool | None = None
    """Whether the node gives each job its own /tmp (recorded on each job)."""

    def columns(self) -> dict:
        defaults = self.default_limits
        return {
            "max": self.max, "wait_secs": DEFAULT_WAIT_SECS if self.wait_secs is None else float(self.wait_secs),
            "limits_enforced": self.limits_enforced, "private_tmp": self.private_tmp,
            "default_limits": {} if defaults is None else {
                job_type: limits.columns() for job_type in wire.JOB_TYPES
                if (limits := getattr(defaults, job_type)) is not None},
        }


class RidingClaim(ClaimRequest):
    """Also claim the node's next jobs, after the reports freed their slots, in the same transaction
    (as POST /nodes/{node_id}/claim with wait_secs 0: a wait_secs given is ignored). The jobs come back
    in `claimed`."""

    node_id: NodeId = Field(max_length=1024)

    def columns(self) -> dict:
        return {**super().columns(), "wait_secs": 0.0}  # a claim riding on reports answers at once


class ReportBatch(Request):
    """Up to 1,000 status reports (agents). Each is applied on its own: a refused one changes nothing
    and does not stop the others."""

    reports: list[BatchReport] = Field(min_length=1, max_length=MAX_BATCH)
    claim: Annotated[RidingClaim | None, Says(
        every="must be an object: node_id, max, limits_enforced, private_tmp, default_limits")] = None


class OutputItem(Request):
    """The tail of one attempt's output so far. A stream left out (or null) stays as stored."""

    job_id: JobId
    node_id: NodeId = Field(max_length=1024)
    attempt: int = Field(ge=0, le=MAX_ATTEMPT)
    stdout: Output = None
    stderr: Output = None

    def columns(self) -> dict:
        return {"node_id": self.node_id, "attempt": self.attempt, "stdout": self.stdout, "stderr": self.stderr}


class OutputBatch(Request):
    """Live output (agents): the current tails of running jobs' output, up to 1,000 items. Each is
    applied on its own: a refused one changes nothing and does not stop the others."""

    outputs: list[OutputItem] = Field(min_length=1, max_length=MAX_BATCH)


class LogChunkItem(Request):
    """One chunk of an attempt's output, as PUT /jobs/{id}/attempts/{n}/logs/{stream}/{seq}
    takes it, with its bytes in base64 (`data`): for the small ones, many in one request."""

    job_id: JobId
    node_id: NodeId = Field(max_length=1024)
    attempt: int = Field(ge=1, le=MAX_ATTEMPT)
    stream: Literal["stdout", "stderr"]
    seq: int = Field(ge=0, le=MAX_ATTEMPT)
    offset: int = Field(ge=0, le=2 ** 53)
    final: bool = False
    data: str = Field(max_length=4 * (wire.LOG_CHUNK_MAX_BYTES // 3 + 1), pattern=r"^[A-Za-z0-9+/]*={0,2}$")
    """The chunk's bytes, base64 (standard alphabet, padded); empty only on a final chunk."""


class LogChunkBatch(Request):
    """Small chunks of attempts' output (agents), up to 1,000: each stored on its own, as
    the PUT stores one; a refused one changes nothing and does not stop the others."""

    chunks: list[LogChunkItem] = Field(min_length=1, max_length=MAX_BATCH)


# ---- answers ---------------------------------------------------------------------

class Resources(Answer):
    memory_mb: int | None
    cpu_percent: int | None


class JobConstraint(Answer):
    label: str
    op: ConstraintOp
    value: str | list[str] = optional_key()


if typing.TYPE_CHECKING:
    ReasonCode = str
else:
    ReasonCode = Literal[waiting.CODES]


class PendingReason(Answer):
    """Why a pending job waits: a code, a sentence, and the details of its code."""

    code: ReasonCode
    message: str
    node_id: str = optional_key()
    """placed, pinned_node_unavailable: the node."""
    node_ids: list[str] = optional_key()
    """draining: the drained nodes it may go to; node_refusing_work: those whose agents take no new work."""
    until: str = optional_key(examples=["2026-12-24T02:00:00.000Z"])
    """scheduled, backoff: when it may start (ISO-8601 UTC)."""
    job_id: str = optional_key()
    """dependency: the job it waits for."""
    condition: str = optional_key()
    """dependency: how that job must end."""
    constraint: JobConstraint = optional_key()
    """constraints_unmet: the one no healthy node meets."""
    constraints: list[JobConstraint] = optional_key()
    """constraints_unmet: all of them, when each is met by some node but no node meets them all."""
    nodes: int = optional_key()
    """no_capacity: how many nodes it may go to."""
    lacking: list[Literal["slot", "memory", "cpu", "gpus", "resources", "limits"]] = optional_key()
    """no_capacity: what they lack (limits: it asks more than they allow; gpus, resources: none has enough
    free, or none has as many at all)."""
    array_id: str = optional_key()
    parallel: int = optional_key()
    key: str = optional_key()
    """concurrency_limit: the key."""
    limit: int = optional_key()
    """concurrency_limit: the key's limit; quota: the team's guarantee plus borrowing limit (absent: no
    borrowing limit)."""
    active: int = optional_key()
    """array_throttle, concurrency_limit: its group's jobs placed or running."""
    team: str = optional_key()
    """quota: the job's team."""
    resource: Literal["cpu_percent", "memory_mb", "gpus", "jobs"] = optional_key()
    """quota: the resource the team may not take more of."""
    used: int = optional_key()
    """quota: what the team's placed and running jobs reserve of it."""
    needs: int = optional_key()
    """quota: what the job would reserve of it."""
    guaranteed: int = optional_key()
    """quota: the team's guarantee of it."""
    kept_by: list[str] = optional_key()
    """quota: the teams whose unused guarantee, not lent, the job would take."""
    kept: int = optional_key()
    """quota: what those teams keep of it."""
    free: int = optional_key()
    """quota: what is free of it in the cluster; gang: the nodes that have room for a member now."""
    members: int = optional_key()
    """gang: the nodes it needs at once."""


class JobDependsOn(Answer):
    """A job another waits for, and how it must end."""

    job_id: str = Field(pattern=r"^job-[1-9][0-9]*$", examples=["job-7"])
    condition: Condition


class SignalBeforeEndAnswer(Answer):
    signal: str = Field(examples=["USR1"])
    secs: float


class GangPlace(Answer):
    """Where a member of a multi-node job runs in its gang (what its environment says)."""

    gang_id: str = Field(pattern=r"^job-[1-9][0-9]*$", examples=["job-42"])
    """The multi-node job it is a member of (CORRAL_GANG_ID)."""
    size: int = Field(ge=2)
    rank: int = Field(ge=0)
    hosts: list[str]
    """Every member's node address, in rank order (CORRAL_GANG_HOSTS)."""
    master_addr: str
    """Rank 0's node address (MASTER_ADDR)."""
    master_port: int = Field(ge=1, le=65535)
    """The port reserved for the gang on rank 0's node (MASTER_PORT)."""


class GangMember(Answer):
    """One member of a multi-node job's attempt."""

    job_id: str = Field(pattern=r"^job-[1-9][0-9]*$", examples=["job-43"])
    """The member's own id: its history and complete logs (GET /jobs/{job_id}/logs)."""
    attempt: int = Field(ge=1)
    """The attempt of the multi-node job it belongs to."""
    rank: int = Field(ge=0)
    node_id: str
    status: StatusName
    exit_code: int | None = Field(ge=-255, le=255)
    ended_by: EndedBy | None
    stdout_tail: str | None
    """The end of its output (the complete logs hold all of it)."""
    stderr_tail: str | None


class Job(Answer):
    job_id: str = Field(pattern=r"^job-[1-9][0-9]*$", examples=["job-42"])
    name: str | None
    node_id: str | None
    """The node it is placed on, if any."""
    instance_id: str | None
    """The node it is pinned to, if any."""
    command: str | None
    deploy_url: str | None
    deploy_sha256: str | None
    job_type: JobType
    port: int | None = Field(ge=1, le=65535)
    health_path: str | None
    env_vars: dict[str, str]
    memory_mb: int | None
    """Requested; null: the node's default."""
    cpu_percent: int | None
    """Requested; null: the node's default."""
    max_processes: int | None
    """Requested; null: the node's default."""
    disk_mb: int | None
    """The most its work dir may hold, in MB: requested, else JOB_DEFAULT_DISK_MB; null: no limit."""
    gpus: int = Field(ge=0)
    """GPUs asked for (0: none)."""
    gpu_model: str | None
    gpu_memory_mb: int | None
    resources: dict[str, int]
    """Other countable resources asked for ({} when none)."""
    nodes: int = Field(ge=1)
    """The distinct nodes it runs on at once (1 unless the request asked for more)."""
    members: list[GangMember] = optional_key()
    """A multi-node job's members, every attempt's, in attempt then rank order (GET /jobs/{id} only). The job
    is `running` once every member of its attempt runs."""
    gang: GangPlace | None = optional_key()
    """On a member of a multi-node job: its place in the gang."""
    gpus_assigned: list[str] | None
    """While it is placed or running: the UUIDs of the GPUs reserved for it on its node, which it alone may
    open (`CUDA_VISIBLE_DEVICES` names them); null when it holds none."""
    gpu_seconds: float | None
    """Its GPUs times the wall time of its attempt (so far, while it runs); null for a job without GPUs or
    that has not run."""
    peak_gpu_memory_mb: int | None
    """The most memory its last attempt's GPUs held at once, as its node sampled them (null: not read)."""
    gpu_utilization_percent: float | None
    """The mean utilisation of its last attempt's GPUs over the node's samples (null: not read)."""
    status: StatusName
    """`failed` is final: retries are exhausted."""
    attempt: int = Field(ge=0)
    """Incremented each time the job is placed; reports must carry it."""
    retry_count: int = Field(ge=0)
    max_retries: int = Field(ge=0)
    """The job's retry budget (MAX_JOB_RETRIES unless the request set it)."""
    next_attempt_at: Timestamp | None
    """A retry waiting out its backoff is not placed before this."""
    on_node_lost: OnNodeLost
    node_losses: int = Field(ge=0)
    """How often the job was requeued because its node was lost."""
    exit_code: int | None = Field(ge=-255, le=255)
    """Null until finished; -1 when the job timed out."""
    stdout: str | None
    stderr: str | None
    oom_killed: bool | None
    peak_memory_bytes: int | None
    cpu_seconds: float | None
    ended_by: EndedBy | None
    """Why the last attempt ended: `exit` (on its own), `timeout`, `cancel`, `preemption`, `node_lost` (its
    node was lost or gave it up), `oom` (killed at its memory limit) or `disk` (its work dir outgrew
    `disk_mb`); null: no attempt has ended."""
    limits_enforced: bool | None
    """False when the node could not apply cgroup limits."""
    limits: Limits | None
    """The limits the node applied."""
    private_tmp: bool | None
    """Whether the node gave the job its own /tmp, /var/tmp and /dev/shm; false: TMPDIR points into its work dir."""
    timeout_secs: float | None
    """For `run` jobs, the request's `timeout_secs`, else JOB_TIMEOUT_SECS (or the team's lower maximum);
    null for `service` jobs."""
    deadline: Timestamp | None
    """While a `run` job runs: when its timeout ends it (its CORRAL_DEADLINE)."""
    signal_before_end: SignalBeforeEndAnswer | None
    """The warning it gets before its timeout, as asked."""
    kill_signal: str = Field(examples=["TERM"])
    """What an end Corral causes starts with."""
    kill_grace_secs: float = Field(ge=0)
    """Seconds from `kill_signal` to SIGKILL (the request's, else JOB_KILL_GRACE_SECS)."""
    preemptible: bool
    """False: it runs only within its team's guarantee, and is never preempted."""
    preemptions: int = Field(ge=0)
    """How many of its attempts were preempted (each requeued without spending a retry)."""
    stop_reason: str | None
    """While running: why the scheduler stops it at `stop_at` (`drain`: its node's drain deadline;
    `preemption`: another team's job reclaims its guarantee, or a job of much higher priority), or null."""
    stop_at: Timestamp | None
    """When that stop begins."""
    created_at: Timestamp
    placed_at: Timestamp | None
    """When the current attempt was placed on a node."""
    running_at: Timestamp | None
    """When the current attempt started."""
    finished_at: Timestamp | None
    """When the job reached done or failed."""
    priority: int = Field(ge=0, le=MAX_PRIORITY)
    constraints: list[JobConstraint] | None
    pool: str | None
    run_at: Timestamp | None
    """Not placed before this time (as asked with run_at or delay_secs)."""
    depends_on: list[JobDependsOn] | None
    """The jobs it waits for and how each must end, as asked (an earlier item of a batch by its job id)."""
    on_dependency_failure: OnDependencyFailure
    array_id: str | None = Field(pattern=r"^array-[1-9][0-9]*$", examples=["array-7"])
    """The array it belongs to (GET /arrays/{id})."""
    array_index: int | None = Field(ge=0)
    """Its place in the array (CORRAL_ARRAY_INDEX in its environment)."""
    concurrency_key: str | None
    team: str = Field(examples=["ml"])
    """The team it belongs to."""
    submitted_by: str = Field(examples=["alice"])
    """The user who submitted it (`admin`: the bootstrap token; a schedule's run: the schedule's)."""
    schedule: str | None
    """The schedule whose run it is (GET /schedules/{name})."""
    slot: Timestamp | None
    """The slot of that schedule it ran for."""
    traceparent: str | None = Field(None, examples=["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"])
    """Its W3C trace context: the span of its submit, in the trace of the request's `traceparent` header
    (or a new one). Each attempt runs with TRACEPARENT naming a span of its own under it."""
    tracestate: str | None = None
    """The request's `tracestate`, passed on to each attempt as TRACESTATE."""
    reserved: Resources | None
    """What it reserves on its node while placed or running (null: not placed)."""
    pending_reason: PendingReason | None
    """Why it waits (pending jobs only)."""
    service_grant: str = optional_key(pattern=r"^[0-9a-f]{64}$")
    """Only in what a node's agent gets for a service job placed on it (with tokens): the proof the
    registry asks for to record the job's service (POST /services `grant`)."""


class NodeShortfall(Answer):
    node_id: str
    lacks: list[str]
    """What keeps the job off this node, in words (empty: nothing now; it goes at the next placement)."""


class FairShareStanding(Answer):
    """A team's or user's place in fair share (docs/scheduling.md, "Fair share")."""

    share: float
    """Its part of the shares, 0 to 1 (a team's weight over all teams' weights; users of a team equal)."""
    usage_core_seconds: float
    """Cores reserved times time run, ended attempts' halved every half-life, running jobs' so far."""
    usage_part: float
    """Its part of the usage, 0 to 1."""
    factor: float
    """2 ** -(usage_part / share): 1 used nothing, 0.5 used exactly its share; the highest goes first."""


class FairShareUser(FairShareStanding):
    user: str


class FairShareTeam(FairShareStanding):
    team: str
    weight: int
    """The team's `share` as set (PATCH /teams/{team})."""
    users: list[FairShareUser]
    """Its users with usage or waiting jobs, the highest factor first."""


class FairShareAnswer(Answer):
    """GET /usage/fair-share."""

    enabled: bool
    """False when FAIR_SHARE_HALF_LIFE_SECS is 0 or only one team exists: jobs go in queue order."""
    half_life_secs: float
    teams: list[FairShareTeam]
    """The highest factor first: the order in which teams take their turns."""


class WhyItWaits(Answer):
    """Why a pending job waits, and the nodes that came closest to taking it."""

    job_id: str
    pending_reason: PendingReason
    closest_nodes: list[NodeShortfall]
    """At most five, fewest shortfalls first."""
    quota: "QuotaAnswer | None" = None
    """When some team has a quota: the job's team's quota (empty when it has none) and its usage now."""
    fair_share: FairShareTeam | None = None
    """When fair share is on: the job's team's standing, with its submitter's among the team's users."""


class JobEvent(Answer):
    """One status change or placement in a job's history."""

    at: Timestamp
    from_: StatusName | None = Field(alias="from")
    """Null for the submission."""
    to: StatusName
    attempt: int = Field(ge=0)
    node_id: str | None
    reason: str = Field(examples=["placed on node-7"])


# The longest a drain may give its node's jobs before they are stopped (30 days).
MAX_DRAIN_DEADLINE_SECS = 30 * 86400.0


class DrainRequest(Request):
    """POST /nodes/{node_id}/drain (the body is optional)."""

    deadline_secs: float | None = Field(None, ge=0, le=MAX_DRAIN_DEADLINE_SECS, examples=[600])
    """What the node runs then may run this many seconds more; after that each job is stopped (its
    `kill_signal`, `kill_grace_secs`, SIGKILL) and goes back to the queue without spending a retry
    (`ended_by: drain`). None: what it runs finishes."""


class NodeDrain(Answer):
    """A node's drain as the scheduler holds it from this answer on."""

    node_id: str
    drained: bool
    """True: no placement from now on puts new work on the node; what it runs finishes, or is stopped at
    `deadline`."""
    deadline: Timestamp | None = None
    """With a drain's `deadline_secs`: when the node's jobs are stopped."""
    stopping: int = 0
    """How many running jobs of the node are to be stopped at `deadline`."""


class NodeGpu(Answer):
    """One of a node's GPUs (a MIG instance is one), and the job it is reserved for."""

    index: str = Field(examples=["0", "0:1"])
    """Its index on the node; `GPU:INSTANCE` for a MIG instance."""
    uuid: str = Field(examples=["GPU-5a3c1b2e-0f4d-4c1a-9b7e-2d8f6a1c3e90"])
    model: str = Field(examples=["NVIDIA A100-SXM4-80GB"])
    memory_mb: int = Field(ge=0)
    job_id: str | None
    """The job it is reserved for (placed or running there); null: free."""


class NodeGpuUse(Answer):
    memory_mb: int
    """Memory in use on its GPUs, in MB."""
    utilization_percent: float | None
    """Their mean utilisation (null: NVML gives none, as for MIG instances)."""


class SchedulerNode(Answer):
    """A node as the scheduler sees it: its copy of the registry's node list (refreshed every
    NODE_REFRESH_SECS) and the slots the node's jobs hold."""

    node_id: str
    address: str
    kind: str = Field(examples=["compute"])
    status: Literal["healthy", "unhealthy"]
    """Health as of the last refresh of the node list."""
    drained: bool
    """A drained node gets no new work."""
    refusing_work: str | None
    """Why the node's agent takes no new work now, as its last heartbeat said (e.g. `only 812 MB free on the
    filesystem of /var/lib/corral/work, under AGENT_MIN_FREE_DISK_MB (1024 MB)`); null: it takes work. Placement
    treats such a node like a drained one until the reason is gone."""
    slots: int = Field(ge=0)
    """The slots the agent advertises."""
    capacity: int = Field(ge=0)
    """Jobs the node may hold at once: min(MAX_JOBS_PER_NODE, slots)."""
    slots_used: int = Field(ge=0)
    """Its jobs that hold a slot: placed and pending, or running."""
    max_memory_mb: int | None
    max_cpu_percent: int | None
    labels: dict[str, str]
    """As its agent advertises them (AGENT_LABELS); its pool is its `pool` label, else `default`."""
    pool: str
    allocatable: Resources
    """What jobs may reserve there: its maximum less the agent's system reserve (null: unknown)."""
    reserved: Resources
    """What its jobs (placed or running) reserve: what each asked for, else the node's default for its type."""
    used: Resources | None
    """What its jobs use, as its agent last said with its lease renewal (null: not said)."""
    gpus: list[NodeGpu]
    """Its GPUs as its agent found them, each with the job it is reserved for ([] when none)."""
    resources: dict[str, int]
    """The countable resources its agent declares (AGENT_RESOURCES; {} when none)."""
    resources_reserved: dict[str, int]
    """What its jobs (placed or running) reserve of them."""
    gpus_used: NodeGpuUse | None
    """What its GPUs hold and how busy they are, as its agent last read them through NVML (null: not read)."""
    last_heartbeat: Timestamp | None
    """The node's last heartbeat, as the registry last reported it."""
    synced_at: Timestamp


class JobCounts(Answer):
    """How many jobs are in each status."""

    pending: int = Field(ge=0)
    running: int = Field(ge=0)
    done: int = Field(ge=0)
    failed: int = Field(ge=0)
    cancelled: int = Field(ge=0)


class SqsStats(Answer):
    """The SQS intake (SQS_URL). Messages are counted each time they are received."""

    enabled: bool
    """SQS_URL is set."""
    dead_letter_queue: bool
    """SQS_DLQ_URL is set."""
    received: int = Field(ge=0)
    """Messages received."""
    jobs_created: int = Field(ge=0)
    """Jobs created from messages."""
    duplicates: int = Field(ge=0)
    """Messages whose job already existed (a redelivery, or a re-send with the same idempotency key)."""
    rejected: int = Field(ge=0)
    """Messages that are not a valid job request."""
    dead_lettered: int = Field(ge=0)
    """Rejected messages moved to SQS_DLQ_URL."""
    dropped: int = Field(ge=0)
    """Rejected messages deleted because no SQS_DLQ_URL is set."""
    requeued: int = Field(ge=0)
    """Messages made visible again after a database error."""


class SnsStats(Answer):
    """The SNS notification outbox (SNS_TOPIC_ARN)."""

    enabled: bool
    """SNS_TOPIC_ARN is set."""
    pending: int = Field(ge=0)
    """Notifications committed but not yet published."""
    oldest_pending_age_secs: float | None = Field(ge=0)
    """Age of the oldest pending notification; null when none is pending."""
    published: int = Field(ge=0)
    """Notifications published."""
    publish_failures: int = Field(ge=0)
    """Failed publishes of a notification (each is retried)."""


class Stats(Answer):
    """Counts for dashboards and alerts. Counters are totals since the database was created."""

    jobs: JobCounts
    sqs: SqsStats
    sns: SnsStats


class FinishedCounts(Answer):
    """Jobs that reached each final status in a sample's interval."""

    done: int = Field(ge=0)
    failed: int = Field(ge=0)
    cancelled: int = Field(ge=0)


class DispatchLatency(Answer):
    """Seconds from submission to the start of the first attempt (as the histogram
    corral_job_dispatch_latency_seconds observes it), over the jobs that started in a
    sample's interval; null when none did."""

    p50_secs: float | None = Field(ge=0)
    p95_secs: float | None = Field(ge=0)


class NodeSample(Answer):
    """A node as GET /nodes showed it when the sample was taken."""

    node_id: str
    status: Literal["healthy", "unhealthy"]
    drained: bool
    capacity: int = Field(ge=0)
    """Jobs the node may hold at once."""
    slots_used: int = Field(ge=0)
    allocatable: Resources
    reserved: Resources
    """What its jobs (placed or running) reserved."""
    used: Resources | None
    """What its jobs used, as its agent last said (null: not said)."""


class StatsSample(Answer):
    """One sample: what finished and started since the previous sample, and how the
    cluster stood when it was taken."""

    at: Timestamp
    """When it was taken."""
    since: Timestamp
    """When the previous sample was taken (one interval before `at` for the first): `finished`,
    `started` and `dispatch_latency` are about the jobs that finished or started in between."""
    finished: FinishedCounts
    pending: int = Field(ge=0)
    """Jobs pending at `at` (waiting, or placed and not yet running)."""
    running: int = Field(ge=0)
    started: int = Field(ge=0)
    """First attempts that started in the interval (those `dispatch_latency` is about)."""
    dispatch_latency: DispatchLatency
    nodes: list[NodeSample]


class StatsHistory(Answer):
    """The samples the scheduler keeps (STATS_INTERVAL_SECS apart, for STATS_RETENTION_SECS), oldest first."""

    interval_secs: float
    retention_secs: float
    samples: list[StatsSample]


class RunningAttempt(Answer):
    job_id: str
    attempt: int
    stop: str = optional_key(examples=["drain"])
    """Only when the scheduler asks the agent to stop the attempt now (`drain`, `preemption`): it gets its
    kill signal and grace, and is reported `failed` with `requeue` and `ended_by` saying this reason."""


class Lease(Answer):
    """A renewed lease and the attempts the scheduler has running on the node."""

    node_id: str
    lease_secs: float
    running: list[RunningAttempt]


class ItemResult(Answer):
    index: int = Field(ge=0)
    job_id: str
    """As sent (empty when it was missing)."""
    error: str = optional_key()
    """With any other code than 200: why it was refused."""


class ReportResult(ItemResult):
    code: Literal[200, 400, 404, 409]
    """What POST /jobs/{job_id}/status would have answered."""
    job_status: StatusName = optional_key()
    """With code 200: the job's status after the report."""
    attempt: int = optional_key(ge=0)
    """With code 200."""


class ReportResults(Answer):
    results: list[ReportResult]
    """One result per report, in the order sent."""
    claimed: list[Job] = optional_key()
    """Only when the request had a `claim`: the jobs it took, now `running` on the node."""


class OutputResult(ItemResult):
    code: Literal[200, 400, 404, 409]
    """200: stored; 400: the item is invalid; 404: no such job; 409: the job is not running on that node
    for that attempt (another node, a stale attempt, or it already ended)."""


class OutputResults(Answer):
    results: list[OutputResult]
    """One result per item, in the order sent."""


class LogChunkStored(Answer):
    """What PUT /jobs/{id}/attempts/{n}/logs/{stream}/{seq} answers (job_logs.py)."""

    stored: bool
    """False: this chunk was stored before (a repeat), and nothing changed."""
    size: int = Field(ge=0)
    """The stream's bytes stored so far."""
    complete: bool
    """The stream's final chunk is stored."""
    next_seq: int = Field(ge=0)
    """The seq the stream's next chunk takes (its offset is `size`)."""


class LogChunkResult(ItemResult):
    code: Literal[200, 400, 404, 409, 413, 503]
    """200: stored (or stored before); 400: the item is invalid; 404: no such job; 409: not the next
    chunk (`expected_seq`, `expected_offset`) or not an attempt this node ran; 413: past
    CORRAL_LOG_MAX_BYTES; 503: the log store (S3) did not answer."""
    stored: bool = optional_key()
    """With 200: as PUT answers (`size`, `complete`, `next_seq` too)."""
    size: int = optional_key(ge=0)
    complete: bool = optional_key()
    next_seq: int = optional_key(ge=0)
    expected_seq: int = optional_key(ge=0)
    """With a 409 about the order: where the stream goes on (`expected_offset`, `complete` too)."""
    expected_offset: int = optional_key(ge=0)


class LogChunkResults(Answer):
    results: list[LogChunkResult]
    """One result per chunk, in the order sent."""


class LogChunkRefused(Answer):
    """A chunk that is not the next one of its stream (409): where to go on from."""

    error: str
    expected_seq: int = Field(ge=0)
    expected_offset: int = Field(ge=0)
    complete: bool
    """The stream's final chunk is stored: nothing more is taken."""


if tuple(JobCounts.model_fields) != states.ALL:  # a new status must be counted (and documented)
    raise AssertionError(f"JobCounts has {tuple(JobCounts.model_fields)}, the statuses are {states.ALL}")


class ArrayCreated(Answer):
    """What POST /jobs answers for an array."""

    array_id: str = Field(examples=["array-7"])
    count: int
    parallel: int
    first_job_id: str
    last_job_id: str


class ArraySummary(ArrayCreated):
    created_at: Timestamp
    jobs: JobCounts
    """Its jobs by status."""


class ConcurrencyLimitAnswer(Answer):
    key: str
    limit: int
    active: int
    """Jobs with the key placed or running now."""
    team: str = Field(examples=["ml"])
    """The team whose admins may change it; only its jobs (and cluster admins') may use the key."""


class ScheduleChange(Request):
    """PATCH /schedules/{name}: the fields to replace (not the name); the schedule they
    make is checked as POST /schedules checks one."""

    cron: Text | None = None
    interval_secs: float | None = None
    start_at: Text | None = None
    time_zone: Text | None = None
    job: dict[str, typing.Any] | None = None
    overlap: Overlap | None = None
    catch_up: CatchUp | None = None
    enabled: bool | None = None


class ScheduleRunAnswer(Answer):
    """A slot of a schedule: the job it created, or why none."""

    slot: Timestamp
    job_id: str | None
    status: StatusName | None
    """The job's status now (null: no job, or retention deleted it)."""
    skipped: str | None
    """Why no job: missed while the scheduler was down (catch_up), overlap, or not run (the template)."""


class ScheduleAnswer(Answer):
    """A schedule: its definition, and when it runs next."""

    name: str
    cron: str | None
    interval_secs: float | None
    start_at: Timestamp | None
    """An interval schedule's anchor: its slots are start_at + k × interval_secs (default: its creation)."""
    time_zone: str
    job: dict[str, typing.Any]
    """The job template, as POST /jobs takes it."""
    overlap: Overlap
    catch_up: CatchUp
    enabled: bool
    next_run_at: Timestamp | None
    """Its next slot in UTC (null while disabled)."""
    next_run_local: str | None = Field(examples=["2026-12-24T02:30:00+01:00"])
    """The same instant in the schedule's zone, with its offset."""
    last_job_id: str | None
    """The job of its last run."""
    last_run: ScheduleRunAnswer | None
    """Its latest slot (by time): the job and its status now, or why it made none (null: no slot yet)."""
    team: str = Field(examples=["ml"])
    """The team it and its runs belong to."""
    created_by: str = Field(examples=["alice"])
    """Who made it: its runs' `submitted_by`."""
    created_at: Timestamp
    updated_at: Timestamp


class ConcurrencyLimitRequest(Request):
    limit: int = Field(ge=1, le=MAX_CONCURRENCY_LIMIT)
    """At most this many jobs with the key placed or running at once."""
    team: TeamName | None = Field(None, examples=["ml"])
    """The team it belongs to (default: the caller's default team; a limit set before keeps its own)."""


# ---- users and personal tokens --------------------------------------------------------

MAX_TOKEN_LIFE_SECS = 10 * 366 * 86400.0
if typing.TYPE_CHECKING:
    Scope = str
else:  # the choices come from corral.server.principals, never a copy
    Scope = Literal[principals.SCOPES]
UserName = Annotated[str, Field(pattern=principals.USER_PATTERN), Says(what="a user name")]


class TokenRequest(Request):
    """POST /tokens: a new personal token."""

    name: Name = Field(max_length=128, examples=["laptop"])
    """What the token is for, to tell it from the user's others."""
    scope: Scope | None = principals.FULL
    """`full`: everything the user may do; `read`: reads only."""
    expires_in_secs: float | None = Field(None, gt=0, le=MAX_TOKEN_LIFE_SECS)
    """Refused from this many seconds on; default: never (revoke it with DELETE /tokens/{token_id})."""
    user: UserName | None = None
    """Whose token it is; default the caller. Only cluster admins make tokens for others."""


class TokenAnswer(Answer):
    """A personal token without its secret."""

    token_id: str = Field(examples=["tok-3f9a0c1b2d4e5f60"])
    user: str
    name: str
    scope: Scope
    created_at: Timestamp
    created_by: str
    """The user who made it (`admin`: the bootstrap token)."""
    expires_at: Timestamp | None
    revoked_at: Timestamp | None
    last_used_at: Timestamp | None
    """Its last use, to the minute."""


class NewToken(TokenAnswer):
    token: str = Field(examples=["corral_pat_..."])
    """The secret, shown this once: Corral keeps only its SHA-256."""


class TeamRole(Answer):
    team: str
    role: str = Field(examples=["member"])
    """`member` or `admin`."""


class WhoAmI(Answer):
    """Who the request's credential stands for."""

    user: str
    """`admin`: the bootstrap token (CORRAL_API_TOKEN, or no tokens at all); `reader`: CORRAL_READ_TOKEN."""
    cluster_role: str | None = Field(examples=["admin"])
    """`admin`, `reader`, or null: only what their teams give them."""
    teams: list[TeamRole]
    default_team: str | None
    token_id: str | None
    """The personal token the request came with (null: a bootstrap token)."""
    read_only: bool


class TeamRequest(Request):
    """POST /teams."""

    name: TeamName = Field(examples=["ml"])


MAX_SHARE = 10_000


class TeamChange(Request):
    """PATCH /teams/{team}: the fields given change, null clears one."""

    max_timeout_secs: float | None = Field(None, gt=0, le=MAX_TIMEOUT_SECS, examples=[86400])
    """The largest `timeout_secs` the team's jobs may ask for; a job that asks none gets this when it is
    below JOB_TIMEOUT_SECS. Null: only the cluster's JOB_TIMEOUT_MAX_SECS."""
    share: int = Field(1, ge=1, le=MAX_SHARE, examples=[2])
    """Its weight in fair share (every team's is 1 unless set): a team of share 2 gets twice the turns of a
    team of share 1 for the same usage."""


# The largest amounts a quota may name (far past any cluster Corral is built for).
MAX_QUOTA = {"cpu_percent": 100_000_000, "memory_mb": 1 << 40, "gpus": 1_000_000, "jobs": 100_000_000}


class QuotaAmounts(Request):
    """Amounts of each resource a quota counts; a resource left out is not set."""

    cpu_percent: int | None = Field(None, ge=0, le=MAX_QUOTA["cpu_percent"], examples=[1600])
    """CPU in percent of one core, as jobs ask for it (1600: sixteen cores)."""
    memory_mb: int | None = Field(None, ge=0, le=MAX_QUOTA["memory_mb"], examples=[65536])
    gpus: int | None = Field(None, ge=0, le=MAX_QUOTA["gpus"], examples=[0])
    jobs: int | None = Field(None, ge=0, le=MAX_QUOTA["jobs"], examples=[20])
    """Jobs placed or running at once."""


class QuotaRequest(Request):
    """PUT /teams/{team}/quota: the whole quota (what is left out is not set)."""

    guaranteed: QuotaAmounts | None = None
    """What the team may always use. When others borrowed it, preemption gives it back. A resource named
    neither here nor in `borrowing_limit` is not governed by the quota."""
    borrowing_limit: QuotaAmounts | None = None
    """How much past its guarantee it may use of what the others leave idle (a resource left out: no limit)."""
    lending_limit: QuotaAmounts | None = None
    """How much of its unused guarantee others may borrow (a resource left out: all of it); at most the
    guarantee."""


class QuotaAnswer(Answer):
    """A team's quota and what its jobs use now."""

    team: str
    guaranteed: dict[str, int]
    """As set: a resource absent here and from `borrowing_limit` is not governed."""
    borrowing_limit: dict[str, int]
    """As set: a resource absent may be borrowed without limit."""
    lending_limit: dict[str, int]
    """As set: a resource absent is lent in full."""
    used: dict[str, int]
    """What the team's placed and running jobs reserve now, of each resource (cpu_percent, memory_mb, gpus,
    jobs)."""
    borrowed: dict[str, int]
    """The part of `used` past the guarantee (0 of a resource the quota does not govern)."""


class TeamAnswer(Answer):
    name: str
    created_at: Timestamp
    max_timeout_secs: float | None
    """The largest `timeout_secs` its jobs may ask for (null: the cluster's JOB_TIMEOUT_MAX_SECS)."""
    share: int
    """Its weight in fair share."""
    members: list["Member"]


class Member(Answer):
    user: str
    role: str = Field(examples=["member"])
    """`member` or `admin`."""


if typing.TYPE_CHECKING:
    TeamRoleName = str
    ClusterRole = str
else:
    TeamRoleName = Literal[principals.TEAM_ROLES]
    ClusterRole = Literal[principals.CLUSTER_ROLES]


class UserRequest(Request):
    """POST /users."""

    name: UserName = Field(examples=["alice"])
    cluster_role: ClusterRole | None = None
    """`admin` (everything), `reader` (sees everything, changes nothing), or null: only what their teams give."""
    teams: dict[TeamName, TeamRoleName] | None = Field(None, examples=[{"ml": "admin"}])
    """Their teams and their role in each (`member` or `admin`)."""
    default_team: TeamName | None = None
    """The team their requests that name none act in (one of `teams`)."""


class MemberRequest(Request):
    """PUT /teams/{team}/members/{user}."""

    role: TeamRoleName | None = principals.MEMBER


class UserAnswer(Answer):
    name: str
    cluster_role: str | None
    default_team: str | None
    teams: list[TeamRole]
    created_at: Timestamp


class AuditEntry(Answer):
    """One state-changing request of a user (docs/security.md, "Audit log")."""

    id: int
    at: Timestamp
    user: str
    """Who: `admin` for the bootstrap token (or a cluster without tokens)."""
    team: str | None
    """The team it acted in, where it concerns one."""
    action: str = Field(examples=["cancelJob"])
    """The route's operationId in the OpenAPI document."""
    target: str | None = Field(examples=["job-42"])
    """What it acted on: the path's names (a job id, a team and user), or what a submit made."""
    method: str
    path: str
    address: str | None
    """The client's address as the server saw it (a proxy's, behind one)."""
    status: int
    """The answer's HTTP status (a refusal is recorded too)."""
    token_id: str | None
    """The personal token it came with (null: a bootstrap token or an OIDC token)."""


class AuditPage(Answer):
    """GET /audit: newest first."""

    events: list[AuditEntry]
    next_before: int | None
    """Pass as `before` for the next (older) page; null: no more."""


class UsageRow(Answer):
    group: str = Field(examples=["2026-12-01"])
    """The day, the Monday a week starts on (YYYY-MM-DD, UTC), the user or the team."""
    attempts: int
    """Attempts that ended (a retried job counts each of its attempts)."""
    cpu_seconds: float
    """CPU time the nodes measured (none where a node reported none: a lost node, a cancel)."""
    wall_seconds: float
    """From each attempt's start to its end."""
    memory_mb_seconds: float
    """Each attempt's peak memory times its wall time."""
    gpu_seconds: float
    core_seconds: float
    """The cores each attempt reserved (cpu_percent / 100) times its wall time: what fair share counts."""


class UsageAnswer(Answer):
    """GET /usage."""

    from_day: str = Field(examples=["2026-11-30"])
    """The first day summed (UTC)."""
    to_day: str = Field(examples=["2026-12-07"])
    """The day after the last one summed."""
    group_by: str
    rows: list[UsageRow]


TeamAnswer.model_rebuild()
WhyItWaits.model_rebuild()
