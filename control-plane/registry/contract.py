"""The registry's HTTP contract: every request and answer body as a pydantic model.

app.py checks requests and builds answers with these; openapi.py generates the
document from them.
"""
from typing import Annotated, Literal

from pydantic import Field

from corral.shared.contract import (MAP_SAYS, MAX_MAP_ENTRIES, Answer, MapValue, Name, NodeId, Request, Says, Text,
                                    Timestamp)
from corral.shared.validate import NAME_PATTERN

KIND_PATTERN = r"^[a-z][a-z0-9-]{0,31}$"
MAX_MEMORY_MB = 1 << 40
MAX_SLOTS = 10_000

Labels = Annotated[dict[Annotated[str, Field(pattern=NAME_PATTERN)], MapValue] | None,
                   Field(max_length=MAX_MAP_ENTRIES), Says(what="a name", every=MAP_SAYS.every)]


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
    node_id: Name = Field(max_length=1024)  # last: a refusal names the node's other fields first
    """Letters, digits, '.', '_' or '-', at most 128 characters."""

    def columns(self) -> dict:
        """What the node's row records of it (all but its id)."""
        return {"address": self.address, "kind": self.kind or "compute", "slots": self.slots or 1,
                "cpus": self.cpus, "memory_mb": self.memory_mb, "max_memory_mb": self.max_memory_mb,
                "max_cpu_percent": self.max_cpu_percent, "labels": self.labels or {}}


class Heartbeat(Request):
    """An optional heartbeat body. An empty body is a heartbeat too."""

    running: int | None = Field(None, ge=0, le=1_000_000)
    """Jobs the node runs now; omitted or null clears it."""


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
    running: int | None = Field(ge=0)
    """Jobs running, as last reported by the node's heartbeat."""
    drained: bool
    """A drained node gets no new work; it finishes what it runs."""
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
    whatever the last check said."""
    node_healthy: bool
    """Whether the service's node is healthy."""
    checked_at: Timestamp | None
    """When `healthy` was last reported."""
    registered_at: Timestamp
