"""The environment a job runs with, built from an allowlist.

Never from the agent's environment as a whole, which may hold cloud credentials,
tokens and whatever else the operator gave the agent. docs/agent.md ("Environment")
says what a job gets.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from corral.shared.validate import ENV_NAME_RE, forbidden_env_var

FROM_AGENT = ("PATH", "LANG", "TZ")
FROM_AGENT_PREFIXES = ("LC_",)
IDENTITY = ("USER", "LOGNAME", "HOME", "TMPDIR")
# A member of a multi-node job learns its place from these (gang_vars): Corral's names,
# and those torchrun, torch.distributed's env:// and MPI launchers read.
GANG = ("CORRAL_GANG_ID", "CORRAL_GANG_SIZE", "CORRAL_GANG_RANK", "CORRAL_GANG_HOSTS", "MASTER_ADDR", "MASTER_PORT",
        "WORLD_SIZE", "RANK", "NODE_RANK")
FIXED = ("CORRAL_JOB_ID", "CORRAL_NODE_ID", "CORRAL_ATTEMPT", "CORRAL_DEADLINE", "PORT", "TRACEPARENT",
         "TRACESTATE", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", *GANG)
SET_BY_AGENT = IDENTITY + FIXED


class JobEnvError(ValueError):
    """The job's env_vars cannot be used; str() says why (reported as the job's stderr)."""


def is_secret(name: str) -> bool:
    """A variable that must never reach a job, whoever asks: the agent's own token (a job
    holding CORRAL_AGENT_TOKEN could forge reports for other jobs) and any other
    CORRAL_*TOKEN."""
    return name.startswith("CORRAL_") and name.endswith("TOKEN")


def passthrough_problem(name: str) -> str | None:
    """Why AGENT_JOB_ENV_PASSTHROUGH may not list `name`, or None."""
    if not ENV_NAME_RE.match(name):
        return f"{name!r} is not an environment variable name"
    if is_secret(name):
        return f"{name} is a token, which is never passed to jobs"
    if forbidden_env_var([name]):
        return f"{name} would make the dynamic loader run code of its choosing in every program of the job"
    return None


def from_agent(environ: Mapping[str, str], passthrough: Iterable[str] = ()) -> dict[str, str]:
    """The part of the agent's environment jobs get (read once, at start-up)."""
    wanted = set(FROM_AGENT) | set(passthrough)
    return {name: value for name, value in environ.items()
            if (name in wanted or name.startswith(FROM_AGENT_PREFIXES)) and not is_secret(name)}


def job_vars(job: Mapping) -> dict[str, str]:
    """The job's env_vars, checked again here (the scheduler checked them at submit, but
    the agent runs what it is given): names must be shell identifiers, values text, and
    no variable may make the dynamic loader load code of the job's choosing."""
    raw = job.get("env_vars") or {}
    if not isinstance(raw, Mapping):
        raise JobEnvError("the job's env_vars are not an object of strings")
    forbidden = forbidden_env_var(raw)
    if forbidden:
        raise JobEnvError(f"the agent refuses to run a job whose env_vars set {forbidden}: it would "
                          "make the dynamic loader run code of the job's choosing in every program "
                          "the job starts")
    env = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not ENV_NAME_RE.match(name):
            raise JobEnvError(f"the job's env_vars hold {name!r}, which is not an environment variable name")
        value = "" if value is None else str(value)
        if "\x00" in value:
            raise JobEnvError(f"the job's env_vars value of {name} holds a NUL byte")
        env[name] = value
    return env


def gang_vars(place: Mapping | None) -> dict[str, str]:
    """A member's place in its multi-node job (the scheduler's `gang`: its job's id, size,
    rank, every member's address in rank order, rank 0's address and reserved port) as
    its environment; {} for a job of one node. RANK and NODE_RANK are both the member's
    rank: one member runs per node (torchrun, started on each, numbers its own workers)."""
    if not place:
        return {}
    try:
        hosts = [str(host) for host in place["hosts"]]
        rank, size = int(place["rank"]), int(place["size"])
        values = {"CORRAL_GANG_ID": str(place["gang_id"]), "CORRAL_GANG_SIZE": str(size),
                  "CORRAL_GANG_RANK": str(rank), "CORRAL_GANG_HOSTS": ",".join(hosts),
                  "MASTER_ADDR": str(place["master_addr"]), "MASTER_PORT": str(int(place["master_port"])),
                  "WORLD_SIZE": str(size), "RANK": str(rank), "NODE_RANK": str(rank)}
    except (KeyError, TypeError, ValueError) as exc:
        raise JobEnvError(f"the job's place in its gang is not what the agent understands ({exc!r})") from None
    if any("\x00" in value for value in values.values()):
        raise JobEnvError("the job's place in its gang holds a NUL byte")
    return values


def build(job: Mapping, agent_part: Mapping[str, str], identity: Mapping[str, str],
          fixed: Mapping[str, str]) -> dict[str, str]:
    """The complete environment of a job, a later source winning over an earlier one:
    1. `agent_part`: from the agent's environment only FROM_AGENT, names starting with
       FROM_AGENT_PREFIXES and AGENT_JOB_ENV_PASSTHROUGH's (from_agent);
    2. `identity`: who the job is, its home and (without a private /tmp) its TMPDIR;
    3. the job's own `env_vars`, which may replace any of the above;
    4. `fixed`, which no job may replace: its id, node, attempt, port, trace context,
       on a node with GPUs its devices (devices.Access.env), and a member of a multi-node
       job its place in the gang (gang_vars).
    `identity` and `fixed` may hold only names of IDENTITY and FIXED (SET_BY_AGENT
    lists every variable the agent sets; add new ones there). Raises JobEnvError."""
    unknown = (set(identity) - set(IDENTITY)) | (set(fixed) - set(FIXED))
    if unknown:
        raise ValueError(f"not variables the agent sets for jobs (jobenv.SET_BY_AGENT): {sorted(unknown)}")
    return {**agent_part, **identity, **job_vars(job), **fixed}
