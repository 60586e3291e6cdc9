"""Raw rows as placement reads them.

JSON columns parsed (once per distinct text), a queued job as a placement.Ask, a node's
advertised default limits.

Placement reads tuples, not model instances (a pass reads thousands of rows), so
these conversions are the ones peewee's fields would otherwise make."""
import functools
import json
from typing import Any

from corral.shared import wire
from corral.shared.limits import (DEFAULT_RUN_CPU_PERCENT, DEFAULT_RUN_MEMORY_MB, DEFAULT_SERVICE_CPU_PERCENT,
                                  DEFAULT_SERVICE_MEMORY_MB)

from .. import gangs, placement

# The default limits per job type (shared/limits.py), for a claim whose agent sent no defaults of its own.
DESIGN_LIMITS = {wire.JOB_RUN: {"memory_mb": DEFAULT_RUN_MEMORY_MB, "cpu_percent": DEFAULT_RUN_CPU_PERCENT},
                 wire.JOB_SERVICE: {"memory_mb": DEFAULT_SERVICE_MEMORY_MB, "cpu_percent": DEFAULT_SERVICE_CPU_PERCENT}}
FALLBACK_LIMITS = {job_type: (limits["memory_mb"], limits["cpu_percent"])
                   for job_type, limits in DESIGN_LIMITS.items()}


def json_value(value: Any) -> Any:
    """A JSON column's value as a SELECT of raw rows gives it (text), parsed. The same
    texts come back on every placement (a node's labels and defaults, the jobs' few
    constraint sets): they are parsed once. The result is shared: never change it."""
    return _parsed(value) if isinstance(value, str) else value


@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> Any:
    return json.loads(text)


def limits_by_type(defaults: dict | None) -> dict[str, placement.Limits]:
    """A node's default limits per job type, as its agent advertised them."""
    return {job_type: (limits["memory_mb"], limits["cpu_percent"]) for job_type, limits in (defaults or {}).items()
            if isinstance(limits, dict) and "memory_mb" in limits and "cpu_percent" in limits}


def ask(row: tuple, now: float = 0.0, hold_secs: float = 0.0) -> placement.Ask:
    """A queued job (a row of columns.QUEUED) as placement reads it; a job of many nodes
    may hold the nodes it finds (gangs.may_hold) when `hold_secs` is given."""
    (job_id, _, job_type, pin, memory, cpu, constraints, pool, array_id, key, team, _, preemptible, priority,
     gpus, gpu_model, gpu_memory, resources, nodes, held_since) = row[:20]
    members = nodes or 1
    return placement.Ask(job_id, job_type, pin, memory, cpu,
                         () if constraints is None else tuple(
                             (label, op, tuple(value) if isinstance(value, list) else value)
                             for label, op, value in (json_value(constraints) or ())),
                         pool, array_id, key, team, preemptible is None or bool(preemptible),
                         placement.DEFAULT_PRIORITY if priority is None else priority,
                         gpus or 0, None if gpu_model is None else gpu_model.lower(), gpu_memory,
                         () if resources is None else tuple(sorted((json_value(resources) or {}).items())),
                         members, members > 1 and gangs.may_hold(held_since, now, hold_secs))


def gpus_of(advertised: Any) -> tuple[placement.Gpu, ...]:
    """A node's GPUs as its row keeps them (JSON: the registry's list), for placement."""
    return tuple(placement.Gpu(str(d["uuid"]), str(d.get("model") or ""), int(d.get("memory_mb") or 0))
                 for d in (json_value(advertised) or ()) if isinstance(d, dict) and d.get("uuid"))


def tuples(query: Any) -> Any:
    """A query's rows as tuples (peewee's stubs type them as model instances: untyped here)."""
    return query.tuples()
