"""Multi-node jobs written: their members placed, and the job's status kept in step with
its members' (the decisions are gangs.py's and lifecycle.py's).

A placed gang: its job's row gets GANG_NODE, the next attempt and no reason; a member row
per node (the job's request, that node's reservation and devices, its place in the gang:
rank, the nodes' addresses, a port on rank 0's node). A member whose status moved, or
a job of many nodes whose status moved: `settle` reads the job (locked: its members'
reports, in other transactions on PostgreSQL, are decided one at a time) and its
members, and says what else moves (Transitions applies it)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from corral.shared.states import ACTIVE

from .. import gangs, lifecycle, placement
from ..models import Job, Node
from .columns import DECIDING
from .rows import json_value, tuples
from .context import StoreContext
from .status_writer import StatusWriter

# What a member copies of its job: everything its agent runs it by, and whose it is.
COPIED = ("command", "deploy_url", "deploy_sha256", "job_type", "env_vars", "name", "memory_mb", "cpu_percent",
          "max_processes", "disk_mb", "gpus", "gpu_model", "gpu_memory_mb", "resources", "timeout_secs",
          "warn_signal", "warn_secs", "kill_signal", "kill_grace_secs", "preemptible", "priority", "pool",
          "constraints", "team", "submitted_by", "traceparent", "tracestate", "queue_at")
# A member's answer lists this much of the end of each of its streams.
MEMBER_TAIL_CHARS = 2000


class Gangs:
    def __init__(self, ctx: StoreContext, writer: StatusWriter):
        self.ctx = ctx
        self.writer = writer

    # ---- placement ---------------------------------------------------------------------

    def place(self, chosen: Mapping[int, Sequence[placement.Placed]], attempts: Mapping[int, int], now: float
              ) -> list[tuple[int, str]]:
        """Place each gang (job row id -> its members' placements, one per node): the job
        moves to its next attempt and its members are written, or (taken meanwhile, or no
        port free on rank 0's node) nothing is. Returns (member row id, node) of each member
        written."""
        if not chosen:
            return []
        nodes = {p.node_id for members in chosen.values() for p in members}
        addresses: dict[str, str] = dict(tuples(Node.select(Node.node_id, Node.address).where(
            Node.node_id.in_(sorted(nodes)))))
        ports: dict[str, set[int]] = {}
        written: list[tuple[int, str]] = []
        events = []
        for job_id, members in chosen.items():
            members = sorted(members, key=lambda p: p.rank)
            head = members[0].node_id
            used = ports.setdefault(head, self._ports_in_use(head))
            port = gangs.choose_port(used, self.ctx.settings.gang_port_first, self.ctx.settings.gang_port_last)
            if port is None:
                continue  # every port of the range is taken on that node: placed again later
            attempt = attempts[job_id] + 1
            if not Job.update(node_id=gangs.GANG_NODE, attempt=attempt, placed_at=now, next_attempt_at=None,
                              pending_reason=None, pending_code=None, gang_held_since=None).where(
                    (Job.id == job_id) & (Job.status == "pending") & Job.node_id.is_null()).execute():
                continue  # placed or cancelled meanwhile
            used.add(port)
            job = Job.get_by_id(job_id)
            hosts = [addresses.get(p.node_id) or p.node_id for p in members]
            for p in members:
                member_id = Job.insert(
                    **{name: getattr(job, name) for name in COPIED},
                    node_id=p.node_id, status="pending", attempt=attempt, max_retries=0, on_node_lost="fail",
                    created_at=now, placed_at=now, reserved_memory_mb=p.memory_mb, reserved_cpu_percent=p.cpu_percent,
                    gpus_assigned=list(p.gpus) if p.gpus else None, gang_id=job_id,
                    gang=gangs.place_of(job.job_id, p.rank, hosts, port)).execute()
                written.append((member_id, p.node_id))
                events.append({"job": member_id, "at": now, "old": None, "new": "pending", "attempt": attempt,
                               "node_id": p.node_id, "reason": f"placed on {p.node_id} as member {p.rank} of "
                                                               f"{job.job_id}"})
            events.append({"job": job_id, "at": now, "old": "pending", "new": "pending", "attempt": attempt,
                           "node_id": None, "reason": f"placed on {len(members)} nodes: "
                                                      f"{', '.join(p.node_id for p in members)} (rank order)"})
        self.writer.events(events)
        return written

    def _ports_in_use(self, node_id: str) -> set[int]:
        """The ports the gangs whose rank 0 is placed or running on the node hold there."""
        rows = tuples(Job.select(Job.gang).where(
            (Job.node_id == node_id) & Job.status.in_(ACTIVE) & Job.gang_id.is_null(False)))
        return {int(place["master_port"]) for (raw,) in rows for place in [json_value(raw)]
                if place and place.get("rank") == 0}

    def keep_held(self, held: Mapping[str, int], now: float) -> None:
        """The gang holding nodes in this pass: since when, unless it held already."""
        for job_id in set(held.values()):
            Job.update(gang_held_since=now).where(
                (Job.id == job_id) & Job.gang_held_since.is_null() & (Job.status == "pending")).execute()

    # ---- status --------------------------------------------------------------------------

    def settle(self, moved: Sequence[Job], now: float) -> list[tuple[Job, lifecycle.Transition]]:
        """What else moves now that these jobs moved (members, or jobs of many nodes): the
        members of a job whose attempt ended are cancelled, and the job follows its members
        (gangs.outcome). Read in the caller's transaction, each job locked first."""
        ids = sorted({job.__data__.get("gang_id") or job.id for job in moved})
        decided: list[tuple[Job, lifecycle.Transition]] = []
        for job_id in ids:
            query = Job.select(*DECIDING).where(Job.id == job_id)
            job = self.ctx.backend.lock_rows(query).first()
            if job is None:
                continue
            # Rows of the Job model, read as gangs.MemberFacts (which mypy cannot match peewee's fields to).
            members: list[Any] = list(Job.select().where((Job.gang_id == job_id) & (
                (Job.attempt == job.attempt) | Job.status.in_(ACTIVE))))
            active = job.status == "running" or (job.status == "pending" and job.node_id == gangs.GANG_NODE)
            found = gangs.outcome(job.attempt, active, members)
            why = self._why(job, found, active)
            decided += [(member, lifecycle.gang_cancelled(member, now, why)) for member in found.to_cancel]
            if found.ended_by is not None:
                decided.append((job, lifecycle.gang_ended(job, found.ended_by, now, self.ctx.policy)))
            elif found.done and job.status in ACTIVE:
                decided.append((job, lifecycle.gang_done(job, [m for m in members if m.attempt == job.attempt], now)))
            elif found.started and job.status == "pending":
                decided.append((job, lifecycle.gang_started(job, now)))
        return decided

    @staticmethod
    def _why(job: Job, found: gangs.Outcome[Any], active: bool) -> str:
        if found.ended_by is not None:
            member = found.ended_by
            return (f"member {gangs.rank_of(member)} of {job.job_id} ended ({member.status}, "
                    f"{member.ended_by or 'exit'}): its attempt {job.attempt} ends")
        if not active:
            return f"{job.job_id} is {job.status}: its attempt ended"
        return f"an earlier attempt of {job.job_id}"

    # ---- reading -------------------------------------------------------------------------

    def members(self, job_id: int) -> list[dict[str, Any]]:
        """Every member of the job's attempts, in attempt then rank order, as its answer lists them."""
        rows: Any = Job.select(Job.id, Job.attempt, Job.node_id, Job.status, Job.exit_code, Job.ended_by, Job.stdout,
                          Job.stderr, Job.gang, Job.finished_at).where(Job.gang_id == job_id)
        found = [gangs.member_summary(m, MEMBER_TAIL_CHARS) for m in rows]
        return sorted(found, key=lambda m: (m["attempt"], m["rank"]))
