"""The scheduler's copy of the registry's node list: its refresh (with the node events
of what changed), operators' drains through the scheduler, and the release of jobs
placed on nodes that can no longer take them.

A refresh writes only the node rows that changed (every NODE_REFRESH_SECS, with
thousands of nodes, rewriting every row was most of its cost); when the list was
last refreshed is one scheduler_state value, shown as each node's `synced_at`."""
from peewee import fn

from corral.shared import wire
from corral.shared.errors import Conflict
from corral.shared.timeutil import epoch

from .. import gangs, lifecycle, liveness, placement
from ..event_log import EventLog
from ..events import node_changes
from ..models import Job, Node, NodeLease, SchedulerState
from .columns import INSERT_CHUNK
from .context import StoreContext
from .rows import json_value, tuples
from .placement_reads import PlacementReads
from .stats import Stats
from .status_writer import StatusWriter
from .transitions import Transitions

# Counts the drains and undrains through the scheduler (set_drained); a node list
# fetched before the count moved keeps those nodes' drains (sync_nodes).
DRAINS_COUNTER = "node_drains"
# When the node list was last refreshed from the registry (scheduler_state; seconds since the epoch).
LIST_SYNCED = "node_list_synced_at"
# The columns a refresh sets (besides node_id and synced_at): a row whose values are these already is left alone.
REFRESHED = ("address", "kind", "slots", "status", "max_memory_mb", "max_cpu_percent", "drained", "last_heartbeat",
             "refusing_work", "labels", "default_limits", "reserve_memory_mb", "reserve_cpu_percent", "drain_seq",
             "gpus", "resources")
# The JSON columns of REFRESHED.
JSON_COLUMNS = ("labels", "default_limits", "gpus", "resources")


class Nodes:
    def __init__(self, ctx: StoreContext, stats: Stats, writer: StatusWriter, reads: PlacementReads,
                 transitions: Transitions):
        self.ctx = ctx
        self.stats = stats
        self.writer = writer
        self.reads = reads
        self.transitions = transitions

    def sync_nodes(self, nodes: list[dict], now: float, seen_drains: int | None = None) -> None:
        """Make the cached node list the registry's (its rows that changed written, those
        of nodes gone deleted), then move work off lost nodes.

        `seen_drains`: the `node_drains` count read before the list was fetched. A node
        drained or undrained through the scheduler since (set_drained) keeps that state:
        the list may predate the registry's write, and must not undo a drain that has
        already answered. None: the list is the newest word on every node."""
        db = self.ctx.db
        rows = [{
            "node_id": n["node_id"], "address": n.get("address") or "", "kind": n.get("kind") or liveness.COMPUTE,
            "slots": int(n.get("slots") or 1), "synced_at": now,
            "status": liveness.listed(n.get("status") or liveness.UNHEALTHY, bool(n.get("drained"))),
            "max_memory_mb": n.get("max_memory_mb"), "max_cpu_percent": n.get("max_cpu_percent"),
            "drained": bool(n.get("drained")), "last_heartbeat": epoch(n.get("last_heartbeat")),
            # A registry of the previous release lists none: the node takes work.
            "refusing_work": n.get("refusing_work") or None,
            # Compared as values (JSON text is made only for the rows written: _write_changed).
            "labels": n.get("labels") or {}, "default_limits": n.get("default_limits"),
            "reserve_memory_mb": n.get("reserved_memory_mb") or 0,
            "reserve_cpu_percent": n.get("reserved_cpu_percent") or 0,
            # A registry of the previous release lists neither: none (null, as stored).
            "gpus": n.get("gpus") or None, "resources": n.get("resources") or None,
        } for n in nodes]
        with db.atomic():
            self.ctx.check_fence()
            # Each node's row as stored: the columns of REFRESHED, by name, JSON parsed.
            current = {row[0]: _as_values(dict(zip(REFRESHED, row[1:]))) for row in self.ctx.sql.rows(
                db, "node rows now", lambda: Node.select(Node.node_id, *(getattr(Node, name) for name in REFRESHED)))}
            before = {node_id: (row["status"], bool(row["drained"])) for node_id, row in current.items()}
            for row in rows:
                stored = current.get(row["node_id"])
                drained, seq = (bool(stored["drained"]), stored["drain_seq"]) if stored else (False, None)
                row["drain_seq"] = seq
                if seen_drains is not None and seq is not None and seq > seen_drains:
                    row["drained"], row["status"] = drained, liveness.redrained(row["status"], drained)
            after = {row["node_id"]: (row["status"], row["drained"]) for row in rows}
            changed = self._write_changed(current, rows)
            SchedulerState.insert(key=LIST_SYNCED, value=repr(now)).on_conflict(
                conflict_target=[SchedulerState.key], preserve=[SchedulerState.value]).execute()
            # What changed since the last list, for the event stream (events.node_changes).
            EventLog(db).record({"at": now, "type": "node", "job_id": None, "node_id": node_id,
                                 "data": {"change": change, **data}}
                                for node_id, change, data in node_changes(before, after))
            self.release_lost(now)
        if changed:
            self.reads.forget_capacity()

    def _write_changed(self, current: dict[str, dict], rows: list[dict]) -> bool:
        """Delete the rows of nodes gone from the list and of those that changed, and
        insert the changed and new ones; whether there were any."""
        listed = {row["node_id"] for row in rows}
        changed = [row for row in rows if current.get(row["node_id"]) != {name: row[name] for name in REFRESHED}]
        stale = sorted((set(current) - listed) | {row["node_id"] for row in changed if row["node_id"] in current})
        for start in range(0, len(stale), INSERT_CHUNK):
            Node.delete().where(Node.node_id.in_(stale[start:start + INSERT_CHUNK])).execute()
        # As the columns store them (insert_rows): JSON as text.
        self.ctx.sql.insert_rows(self.ctx.db, "node rows", Node, [
            dict(row, **{name: getattr(Node, name).db_value(row[name]) for name in JSON_COLUMNS}) for row in changed])
        return bool(changed or stale)

    def list_synced_at(self) -> float | None:
        """When the node list was last refreshed from the registry; None while it lists no node."""
        newest_row = Node.select(fn.MAX(Node.synced_at)).scalar()
        if newest_row is None:
            return None
        state = SchedulerState.get_or_none(SchedulerState.key == LIST_SYNCED)
        # No value yet: rows a release before this one wrote, each with its refresh's time.
        return float(state.value) if state is not None and state.value else float(newest_row)

    def drain_count(self) -> int:
        """How many drains and undrains went through the scheduler (sync_nodes' `seen_drains`)."""
        return self.stats.counters().get(DRAINS_COUNTER, 0)

    def set_drained(self, node_id: str, drained: bool, now: float, stop_at: float | None = None) -> int | None:
        """The operator's drain (or undrain) of a node, in force from this commit on:
        it waits for the placements on the node under way (the node's placement lock),
        so every placement after it reads the node drained, on every worker and replica;
        the jobs placed there but not yet claimed go back to the queue. `stop_at`: the
        drain's deadline, when the jobs running there are asked to stop (an undrain
        takes back the stops a drain asked). Returns how many running jobs are to stop;
        None when the node list has no such node yet (its next refresh brings the
        registry's flag)."""
        with self.ctx.tx():
            self.ctx.backend.lock_placement(self.ctx.db, nodes=[node_id])
            node = Node.get_or_none(Node.node_id == node_id)
            if node is None:
                return None
            on_node = (Job.node_id == node_id) & (Job.status == "running")
            if drained and stop_at is not None:
                # A job asked to stop earlier (a preemption, an earlier deadline) keeps that stop.
                Job.update(stop_reason=wire.ENDED_BY_DRAIN, stop_at=stop_at).where(
                    on_node & (Job.stop_reason.is_null() | ((Job.stop_reason == wire.ENDED_BY_DRAIN)
                                                           & (Job.stop_at > stop_at)))).execute()
            elif not drained:
                Job.update(stop_reason=None, stop_at=None).where(
                    on_node & (Job.stop_reason == wire.ENDED_BY_DRAIN)).execute()
            stopping = Job.select().where(on_node & (Job.stop_reason == wire.ENDED_BY_DRAIN)).count() \
                if drained else 0
            self.stats.bump(**{DRAINS_COUNTER: 1})
            status = liveness.redrained(node.status, drained)
            Node.update(drained=drained, status=status, drain_seq=self.drain_count()).where(
                Node.node_id == node_id).execute()
            EventLog(self.ctx.db).record({"at": now, "type": "node", "job_id": None, "node_id": node_id,
                                          "data": {"change": change, **data}} for _, change, data in node_changes(
                                              {node_id: (node.status, node.drained)}, {node_id: (status, drained)}))
            if drained:
                self.release_lost(now)
        self.reads.forget_capacity()
        return stopping

    def release_lost(self, now: float) -> int:
        """Unplace pending jobs whose node is unhealthy, drained, refusing work or gone, so
        they go elsewhere.

        Each write is conditional on the job being as it was read: still pending on that
        node at that attempt. On PostgreSQL a claim in another process can take the job
        between the read and the write, and an unconditional write then left a running
        job with no node, which nothing would ever finish or requeue."""
        stranded = self._stranded()
        if not stranded:
            return 0
        states = {node_id: liveness.why_no_new_work(*liveness.as_registry(status), refusing, kind)
                  for node_id, status, refusing, kind in tuples(Node.select(
                      Node.node_id, Node.status, Node.refusing_work, Node.kind))}
        released = 0
        for job in stranded:
            if gangs.is_member(job):
                # A member is not placed again on its own: its attempt ends, and its job
                # is placed again as one (gangs.py).
                why = states.get(job.node_id, "is gone from the registry")
                try:
                    self.transitions.apply(job, lifecycle.node_lost(
                        job, now, f"node {job.node_id} {why} before the member started", self.ctx.policy), now)
                except Conflict:
                    continue  # claimed or ended meanwhile
                released += 1
                continue
            unplaced = Job.update(node_id=None, placed_at=None).where(
                (Job.id == job.id) & (Job.status == "pending") & (Job.node_id == job.node_id)
                & (Job.attempt == job.attempt)).execute()
            if unplaced:
                why = states.get(job.node_id, "is gone from the registry")
                self.writer.event(job, "pending", "pending", now, f"node {job.node_id} {why}; unplaced")
                released += 1
        return released

    def _stranded(self) -> list[Job]:
        """Pending jobs placed on a node that is not a healthy compute node taking work (any more)."""
        taking = Node.select(Node.node_id).where(liveness.taking_new_work(Node))
        return list(Job.select().where((Job.status == "pending") & Job.node_id.is_null(False)
                                       & Job.node_id.not_in(taking) & (Job.node_id != gangs.GANG_NODE)))

    def nodes_and_slots(self) -> list[tuple[Node, int, placement.NodeInfo,
                                            tuple[int | None, int | None, int | None, float | None] | None]]:
        """The cached node list, each node with its capacity, what its jobs hold (as
        placement sees it) and what they use (as its agent last said; None: never)."""
        infos = {info.node_id: info for info in self.reads.nodes(include_others=True)}
        used = {node_id: (memory, cpu, gpu_memory, gpu) for node_id, memory, cpu, gpu_memory, gpu in tuples(
            NodeLease.select(NodeLease.node_id, NodeLease.used_memory_mb, NodeLease.used_cpu_percent,
                             NodeLease.used_gpu_memory_mb, NodeLease.used_gpu_percent))}
        synced = self.list_synced_at()
        # Two reads: a node the registry sync added or removed between them is left out
        # (it shows on the next read), not an error.
        listed = [n for n in Node.select().order_by(Node.node_id) if n.node_id in infos]
        if synced is not None:
            for n in listed:  # as of the list's last refresh, which found it as it is
                n.synced_at = synced
        return [(n, self.ctx.capacity(n.slots), infos[n.node_id], used.get(n.node_id)) for n in listed]


def _as_values(row: dict) -> dict:
    """A node row as read (JSON as text, booleans as the database gives them) as the
    refresh's values compare with it: JSON parsed (once per text: rows.json_value)."""
    for name in JSON_COLUMNS:
        row[name] = json_value(row[name])
    return row
