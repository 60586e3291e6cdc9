"""Multi-node jobs (gangs): the pure decisions, no I/O, time passed in.

A job that asks for `nodes: N` is placed all at once on N distinct nodes (placement.py,
Planner._place_gang) and runs as N members: jobs of their own, one per node, which
agents claim, run, report and log like any other (store/gangs.py writes them). The
job itself is never on a node (its `node_id` is GANG_NODE while its members hold
theirs); its status follows its members':

    its members                                   the job
    placed, some not yet running                  pending
    every member running (or done)                running
    every member done                             done
    one member failed, timed out, lost its        the others are cancelled (their kill signal
    node, or was stopped (drain, preemption)      and grace), and the job's attempt ends as
                                                  that member's did (lifecycle.gang_ended):
                                                  retried as one, requeued, or failed

A member never goes back to the queue on its own (lifecycle: a member's attempt that
would be requeued ends instead); its job is placed again, with new members.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from corral.shared.states import ACTIVE, DONE, FINAL_STATUSES

# The node_id of a multi-node job while its members hold nodes: no node has it (a node id
# cannot hold parentheses), so no claim, lease or count of a node's jobs finds the job.
GANG_NODE = "(gang)"


class MemberFacts(Protocol):
    """What a decision reads of a member (a row of the Job model, or a test's stand-in)."""

    @property
    def id(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def node_id(self) -> str | None: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def ended_by(self) -> str | None: ...
    @property
    def finished_at(self) -> float | None: ...
    @property
    def gang(self) -> Any: ...


M = TypeVar("M", bound=MemberFacts)


@dataclass(frozen=True)
class Outcome(Generic[M]):
    """What a gang's members say of its attempt: `started` (every member runs or is
    done), `done` (every member is done), or `ended_by` (the first member that ended
    otherwise); `to_cancel`: the members still placed or running that must end."""

    started: bool = False
    done: bool = False
    ended_by: M | None = None
    to_cancel: tuple[M, ...] = ()


def outcome(attempt: int, job_active: bool, members: Sequence[M]) -> Outcome[M]:
    """The state of the job's attempt `attempt` from its members (any attempt's: only
    that attempt's count; an earlier attempt's still active are cancelled). A job no
    longer active (cancelled, failed, back in the queue for another attempt): every
    member still active ends."""
    stale = tuple(m for m in members if m.status in ACTIVE and m.attempt != attempt)
    current = [m for m in members if m.attempt == attempt]
    if not job_active or not current:
        return Outcome(to_cancel=stale + tuple(m for m in current if m.status in ACTIVE))
    ended = [m for m in current if m.status in FINAL_STATUSES and m.status != DONE]
    if ended:
        first = min(ended, key=lambda m: (m.finished_at or 0.0, rank_of(m)))
        return Outcome(ended_by=first, to_cancel=stale + tuple(m for m in current if m.status in ACTIVE))
    if all(m.status == DONE for m in current):
        return Outcome(done=True, to_cancel=stale)
    started = all(m.status != "pending" for m in current)
    return Outcome(started=started, to_cancel=stale)


def rank_of(member: Any) -> int:
    """A member's rank in its gang (its row's `gang`)."""
    return int((member.gang or {}).get("rank", 0))


def is_member(job: Any) -> bool:
    """A member of a multi-node job (a row read without the column, or a stand-in without
    it, is not): its attempt never goes back to the queue on its own."""
    return getattr(job, "gang_id", None) is not None


def spans_nodes(job: Any) -> bool:
    """A job of many nodes (`nodes` above 1; a row read without the column is not)."""
    return (getattr(job, "nodes", None) or 1) > 1


def place_of(job_id: str, rank: int, hosts: Sequence[str], port: int) -> dict[str, Any]:
    """A member's place in its gang, as its row keeps it and its agent reads it
    (contract.GangPlace): the job's id, the gang's size, the member's rank, every
    member's address in rank order, and the rendezvous point on rank 0's node."""
    return {"gang_id": job_id, "size": len(hosts), "rank": rank, "hosts": list(hosts),
            "master_addr": hosts[0], "master_port": port}


def choose_port(used: Collection[int], first: int, last: int) -> int | None:
    """The lowest port of first..last that no running gang on the node holds; None when all are."""
    low, high = min(first, last), max(first, last)
    taken = set(used)
    return next((port for port in range(low, high + 1) if port not in taken), None)


def may_hold(held_since: float | None, now: float, hold_secs: float) -> bool:
    """Whether a gang waiting for nodes may hold those it found: for `hold_secs` from when
    it first held, then not for as long (the other jobs get the nodes), then again, and
    so on. A hold bounded in time keeps a gang from keeping nodes idle for ever when the
    rest never frees up; holding again in turn keeps small jobs from starving it."""
    if hold_secs <= 0:
        return False
    if held_since is None:
        return True
    return (max(0.0, now - held_since) % (2 * hold_secs)) < hold_secs


def member_summary(member: MemberFacts, tail_chars: int) -> dict[str, Any]:
    """A member as the job's answer lists it (contract.GangMember)."""
    d = getattr(member, "__data__", None)
    get = d.get if d is not None else (lambda name: getattr(member, name, None))
    return {"job_id": f"job-{member.id}", "attempt": member.attempt, "rank": rank_of(member),
            "node_id": member.node_id, "status": member.status, "exit_code": member.exit_code,
            "ended_by": member.ended_by, "stdout_tail": _tail(get("stdout"), tail_chars),
            "stderr_tail": _tail(get("stderr"), tail_chars)}


def _tail(text: str | None, limit: int) -> str | None:
    return None if text is None else text[-limit:]
