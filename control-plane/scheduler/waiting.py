"""Why a pending job waits: its `pending_reason`, a code with a message and details.

Pure. Placement gives the reasons it finds when it cannot place a job offered, and the
store keeps the last one with the job; the others follow from the job's own fields when
it is read (`current`). docs/scheduling.md ("Why a job waits") lists the codes.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.shared.timeutil import iso

from . import gangs, quotas

CODES = ("placed", "no_healthy_node", "constraints_unmet", "no_capacity", "pinned_node_unavailable",
         "scheduled", "backoff", "dependency", "array_throttle", "concurrency_limit", "draining",
         "node_refusing_work", "quota", "gang")


@dataclass(frozen=True)
class Reason:
    code: str
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """As the API shows it (and the store keeps it): code, message, then the details."""
        return {"code": self.code, "message": self.message, **self.details}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> Reason:
        details = {k: v for k, v in value.items() if k not in ("code", "message")}
        return cls(value["code"], value["message"], details)


def describe(constraint: Sequence[Any]) -> str:
    label, op, value = constraint
    if op in ("exists", "not_exists"):
        return f"{label} {op}"
    if op in ("in", "not_in"):
        return f"{label} {op} [{', '.join(value)}]"
    return f"{label} {op} {value}"


def constraint_dict(constraint: Sequence[Any]) -> dict[str, Any]:
    label, op, value = constraint
    out: dict[str, Any] = {"label": label, "op": op}
    if value is not None:
        out["value"] = list(value) if isinstance(value, (list, tuple)) else value
    return out


# ---- given by placement ---------------------------------------------------------------

def no_healthy_node(known: int) -> Reason:
    return Reason("no_healthy_node", f"no healthy compute node ({known} known)" if known
                  else "no compute node has registered")


def pinned_node_unavailable(node_id: str, status: str) -> Reason:
    return Reason("pinned_node_unavailable", f"its node {node_id} is {status}", {"node_id": node_id})


def constraints_unmet(unmet: Sequence[Sequence[Any]], every: bool = False) -> Reason:
    """`unmet`: the one requirement no healthy node satisfies; `every`: each is met by
    some node, but no node meets them all."""
    if every:
        return Reason("constraints_unmet", "no healthy node satisfies all of "
                      + "; ".join(describe(c) for c in unmet),
                      {"constraints": [constraint_dict(c) for c in unmet]})
    constraint = unmet[0]
    return Reason("constraints_unmet", f"no healthy node satisfies {describe(constraint)}",
                  {"constraint": constraint_dict(constraint)})


def draining(node_ids: Sequence[str]) -> Reason:
    shown = ", ".join(node_ids[:5]) + (f" and {len(node_ids) - 5} more" if len(node_ids) > 5 else "")
    return Reason("draining", f"the nodes it may go to are drained ({shown})", {"node_ids": list(node_ids[:20])})


def refusing_work(refusals: Mapping[str, str]) -> Reason:
    """`refusals`: the nodes it may go to whose agents take no new work, with the reason
    each gives (short of disk space), in node id order."""
    shown = "; ".join(f"{node_id}: {why}" for node_id, why in list(refusals.items())[:3])
    more = f"; and {len(refusals) - 3} more" if len(refusals) > 3 else ""
    return Reason("node_refusing_work", f"the nodes it may go to take no new work ({shown}{more})",
                  {"node_ids": list(refusals)[:20]})


# What a node may be short of for a job, in the order placement looks (Room.lacks).
LACKING = ("slot", "memory", "cpu", "gpus", "resources")


def no_capacity(nodes: int, lacking: Sequence[str], cpu_note: str | None = None) -> Reason:
    """`lacking`: what the `nodes` it may go to lack (LACKING; limits: it asks more than
    they allow). `cpu_note`: why one of them is out of CPU, when a default service fills
    it (placement.service_fill)."""
    if list(lacking) == ["limits"]:
        return Reason("no_capacity", f"it asks for more than the {_nodes(nodes)} it may go to allow",
                      {"nodes": nodes, "lacking": ["limits"]})
    words = {"slot": "a free slot", "memory": "free memory", "cpu": "free CPU" + (f": {cpu_note}" if cpu_note else ""),
             "gpus": "free GPUs", "resources": "free resources it asks for"}
    return Reason("no_capacity", f"no room on the {_nodes(nodes)} it may go to (short of "
                  + " or ".join(words[x] for x in lacking) + ")", {"nodes": nodes, "lacking": list(lacking)})


def devices_wanted(gpus: int, model: str | None, memory_mb: int | None, resources: Mapping[str, int]) -> str:
    """A job's GPUs and other resources in words: "2 GPUs (model a100, 40960 MB each) and 1 fpga"."""
    wanted = []
    if gpus:
        which = [f"model {model}"] if model else []
        which += [f"{memory_mb} MB each"] if memory_mb else []
        wanted.append(f"{gpus} GPU{'s' if gpus != 1 else ''}" + (f" ({', '.join(which)})" if which else ""))
    wanted += [f"{count} {name}" for name, count in sorted(resources.items())]
    return " and ".join(wanted)


def no_devices(nodes: int, gpus: int, model: str | None, memory_mb: int | None,
               resources: Mapping[str, int]) -> Reason:
    """None of the `nodes` it may go to has the GPUs or resources the job asks for, even free."""
    return Reason("no_capacity", f"none of the {_nodes(nodes)} it may go to has "
                  + devices_wanted(gpus, model, memory_mb, resources),
                  {"nodes": nodes, "lacking": ["gpus" if gpus else "resources"]})


def gang(members: int, free: int, nodes: int) -> Reason:
    """A job of `members` nodes at once: `free` of the `nodes` it may go to have room now."""
    return Reason("gang", f"it needs {members} nodes at once; {free} of the {_nodes(nodes)} it may go to "
                  f"{'has' if free == 1 else 'have'} room now", {"nodes": nodes, "members": members, "free": free})


def array_throttle(array_id: int, parallel: int, active: int) -> Reason:
    return Reason("array_throttle", f"{active} of its array's jobs are placed or running (parallel {parallel})",
                  {"array_id": f"array-{array_id}", "parallel": parallel, "active": active})


def concurrency_limit(key: str, limit: int, active: int) -> Reason:
    jobs = "1 job with" if active == 1 else f"{active} jobs with"
    return Reason("concurrency_limit", f"{jobs} concurrency key {key!r} placed or running (limit {limit})",
                  {"key": key, "limit": limit, "active": active})


def quota(refusal: quotas.Refusal) -> Reason:
    """The job's team may not take what the job would reserve: past its guarantee plus
    borrowing limit, or borrowing what other teams keep for their guarantees."""
    r = refusal
    details = {"team": r.team, "resource": r.resource, "used": r.used, "needs": r.need,
               "guaranteed": r.guaranteed, **({} if r.cap is None else {"limit": r.cap})}
    uses = f"team {r.team} uses {quotas.say(r.resource, r.used)} and the job needs {quotas.say(r.resource, r.need)}"
    if r.unborrowable:
        return Reason("quota", f"{uses}: over its guarantee of {quotas.say(r.resource, r.guaranteed)}, and the "
                      "job is not preemptible, so it does not run on borrowed capacity", details)
    if not r.keepers:
        return Reason("quota", f"{uses}: over its guarantee of {quotas.say(r.resource, r.guaranteed)} plus "
                      f"borrowing limit of {quotas.say(r.resource, (r.cap or 0) - r.guaranteed)}", details)
    keepers = ", ".join(r.keepers[:3]) + (f" and {len(r.keepers) - 3} more" if len(r.keepers) > 3 else "")
    return Reason("quota", f"{uses}, past its guarantee of {quotas.say(r.resource, r.guaranteed)}: of the "
                  f"{quotas.say(r.resource, r.free)} free, {quotas.say(r.resource, r.kept)} is kept for the "
                  f"guarantees of {keepers}", {**details, "kept_by": list(r.keepers[:20]), "kept": r.kept,
                                               "free": r.free})


def _nodes(n: int) -> str:
    return "1 node" if n == 1 else f"{n} nodes"


# ---- derived from the job ---------------------------------------------------------------

def placed(node_id: str) -> Reason:
    if node_id == gangs.GANG_NODE:  # its members are placed, each on its node
        return Reason("placed", "its members are placed, waiting for every one of them to start")
    return Reason("placed", f"placed on {node_id}, waiting for it to start the job", {"node_id": node_id})


def scheduled(until: float) -> Reason:
    return Reason("scheduled", f"not before {iso(until)}", {"until": iso(until)})


def backoff(until: float, attempt: int) -> Reason:
    return Reason("backoff", f"attempt {attempt} failed; the next waits until {iso(until)}", {"until": iso(until)})


def dependency(job_id: str, condition: str) -> Reason:
    return Reason("dependency", f"waiting for {job_id} to be {condition}", {"job_id": job_id,
                                                                            "condition": condition})


# What a job no placement has looked at yet waits for (most answers to a submit say it):
# one value, so that the API builds its answer once.
WAITING_FOR_CAPACITY = Reason("no_capacity", "the jobs ahead of it in the queue took every free slot",
                              {"lacking": ["slot"]})


def waiting_for_capacity() -> Reason:
    return WAITING_FOR_CAPACITY


def current(*, node_id: str | None, next_attempt_at: float | None, attempt: int, retry_count: int,
            stored: Mapping[str, Any] | None, now: float, waits_on_dependency: bool = False) -> Reason:
    """A pending job's reason at `now`, from its fields: placed, then a dependency it
    waits on (the stored reason names it), then a time it may not start before, then
    what placement last said."""
    if node_id is not None:
        return placed(node_id)
    if waits_on_dependency and stored and stored.get("code") == "dependency":
        return Reason.from_dict(stored)
    if next_attempt_at is not None and next_attempt_at > now:
        if retry_count > 0 or attempt > 0:
            return backoff(next_attempt_at, attempt)
        return scheduled(next_attempt_at)
    if stored:
        return Reason.from_dict(stored)
    return waiting_for_capacity()
