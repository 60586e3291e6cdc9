"""Placement orchestration: the stage between the pure planner and the database.

It reads a snapshot (placement_reads.py), lets the planner (placement.py) choose, and
writes the outcome (placement_writes.py). Policy that decides who goes first (quotas,
fair share) belongs here and in the planner, nowhere else.
"""
import os
from collections.abc import Collection

from corral.server.statements import ValueList
from corral.shared.errors import Conflict

from .. import fairshare, placement, quotas
from ..models import Job
from .columns import QUEUED, QUEUED_ARRAY, QUEUED_KEY, QUEUED_TEAM
from .context import StoreContext
from .fair_share import TEAM_OF, USER_OF, FairShare
from .gangs import Gangs
from .jobs import Jobs
from .marks import PLACEMENT_MARK
from .placement_reads import RR_CURSOR, Held, PlacementReads
from .placement_writes import PlacementWrites
from .rows import FALLBACK_LIMITS, ask

# A placement pass reads the queue in pages of this many jobs after the first (as many
# as there are free slots) while it has room. The background pass looks at most
# PLACEMENT_SCAN_MAX jobs down the queue; a placement on the way of a submit, a report
# or a claim one page past the first read: when the jobs ahead fit nowhere (nodes full
# by their reservations, constraints no free node meets) it does not read thousands of
# rows on every request, and what is deeper is placed by the next background pass.
QUEUE_PAGE = 500
PLACEMENT_SCAN_MAX = 10_000
# What any job takes of its team's quota at the least: a team refused that is refused every job.
LEAST_NEED = quotas.need_of(0, 0)
# The background pass gives this many jobs at the head of the queue their reasons.
EXPLAIN_MAX = 1000


class Placing:
    """The snapshot: the nodes with their free capacity, the due queue page by page, the
    arrays' and keys' throttles, the cursor; the outcome: placements, the reasons of the
    jobs left waiting, the cursor and mark.

    Concurrency: on SQLite every `db.atomic()` is BEGIN IMMEDIATE, so transactions that
    place jobs are serialised by the database lock. On PostgreSQL placement is
    serialised by transaction-level advisory locks (`lock_placement`: over every node,
    or per node for a placement that fills only some nodes' slots), which
    service.Scheduler takes before its transaction locks any row; placements skip the
    jobs another placement is placing (FOR UPDATE SKIP LOCKED)."""

    def __init__(self, ctx: StoreContext, reads: PlacementReads, writes: PlacementWrites, jobs: Jobs,
                 fair: FairShare, gangs: Gangs):
        self.ctx = ctx
        self.reads = reads
        self.writes = writes
        self.jobs = jobs
        self.fair = fair
        self.gangs = gangs

    def dispatch(self, now: float, nodes: Collection[str] | None = None, deep: bool = False,
                 first_only: bool = False) -> int:
        """Place waiting jobs on nodes with room (placement.Planner over the snapshot,
        the jobs offered in queue order, page by page, until no slot is left; each
        assignment a conditional update); the number placed. `nodes`: only these may
        take work (the nodes whose slots just freed: new work was offered to every
        node when it came), else every node the transaction locked for placement
        (service.Scheduler: on PostgreSQL, new work locks the nodes that had a free
        slot), and the round robin turns. A pass that may place on every node also
        keeps the reasons of the jobs it could not place (waiting.py). `deep`: look as far
        down the queue as the background pass does (PLACEMENT_SCAN_MAX). `first_only`:
        read no page past the first (as many jobs as there are free slots): the placement
        of new work (a submit), whose cost must not grow with the queue. The jobs ahead
        were offered these slots already (by the placement that freed them, or the
        background pass); when the first ones do not fit (throttled, constrained), the
        background pass, which looks deeper, places what is further down within
        DISPATCH_INTERVAL_SECS."""
        with self.ctx.tx():
            rotate = nodes is None
            if nodes is None:
                nodes = self.ctx.backend.locked_nodes(self.ctx.db)
            every_node = nodes is None
            # One placement at a time on each node across every process (the caller
            # usually took the lock first; taking it again is free). Most calls find
            # no free slot.
            self.ctx.backend.lock_placement(self.ctx.db, nodes=nodes)
            infos = self.reads.nodes(nodes)
            total_free = sum(max(0, n.free_slots) for n in infos if n.takes_work)
            if total_free <= 0:
                return 0
            # The round robin turns in placements of new work; filling the slots a node's
            # own jobs freed is not its turn (and leaves the cursor's row alone, which
            # placements on different nodes would otherwise queue on).
            cursor, cursor_stored = self.reads.cursor() if rotate else (None, False)
            before = cursor
            fair = self.fair.enabled()
            ledger, held = self._ledger_and_held(infos if every_node else None, fair)
            planner = placement.Planner(infos, self.ctx.settings.placement_policy, cursor,
                                        fallback=FALLBACK_LIMITS, ledger=ledger)
            open_ids = sorted(n.node_id for n in infos if n.takes_work and n.free_slots > 0)
            scan = PLACEMENT_SCAN_MAX if deep else total_free if first_only else total_free + QUEUE_PAGE
            candidates = self._offer_queue(planner, open_ids, now, total_free, scan, held if fair else None,
                                           every_node)
            plan = planner.plan()
            cursor = plan.cursor
            attempts = {row[0]: row[1] for row in candidates}
            singles, gangs = _split(plan.placed)
            placed = self.writes.place(singles, attempts, now)
            if gangs or plan.held:
                placed += self.gangs.place(gangs, attempts, now)
                self.gangs.keep_held(plan.held, now)
            if every_node:
                self.writes.keep_reasons(plan.waiting, {row[0]: row[2] for row in candidates})
            state: dict[str, str | None] = {}
            if placed:
                self.writes.wake_after_commit({node_id for _, node_id in placed})
                if self.ctx.marks_placements:
                    state[PLACEMENT_MARK] = os.urandom(8).hex()
            if rotate and (not cursor_stored or cursor != before):
                state[RR_CURSOR] = cursor
            self.writes.set_state(state)
            return len(placed)

    def _offer_queue(self, planner: placement.Planner, open_ids: list[str], now: float, first: int,
                     scan: int, held: list[Held] | None, every_node: bool) -> list[tuple]:
        """Offer the planner the due jobs an open node may take (unpinned, or pinned to
        one of them): in fair-share turns when more than one team exists (`held` given:
        _offer_turns), else in queue order, `first` of them, then pages of QUEUE_PAGE
        while it has room, up to `scan` in all. Returns (id, attempt, stored reason) of each."""
        open_nodes = ValueList(self.ctx.db, "open", open_ids)
        if held is not None:
            return self._offer_turns(planner, open_nodes, now, first, scan, held, every_node)
        seen: list[tuple] = []
        limit, after = first, None
        while not planner.exhausted and len(seen) < scan:
            rows = self.reads.queue_page(open_nodes, now, limit, after)
            self._offer(planner, rows, now)
            seen += [(row[0], row[1], row[-2]) for row in rows]
            if len(rows) < limit:
                break
            limit, after = min(QUEUE_PAGE, scan - len(seen)), (rows[-1][-1], rows[-1][0])
        return seen

    def _offer_turns(self, planner: placement.Planner, open_nodes: ValueList, now: float, first: int,
                     scan: int, held: list[Held], every_node: bool) -> list[tuple]:
        """The due jobs offered in fair-share turns (fairshare.turns): which teams have
        any (each team's first, read together), then team by team, the highest factor
        first, a window of each team's jobs in queue order, user by user within it, until
        no room is left. A team's window: `first` jobs (the free slots) for new work, an
        equal part of `scan` for the background pass, a page shared out otherwise; a
        team's jobs past it wait for the next pass. Most passes fill the free slots from
        the first team's window and read no other; one that places on some nodes only
        skips the teams that the quotas let take no job at all (a pass over every node
        reads them, to keep their jobs' reasons)."""
        teams = self.ctx.teams.shares()
        if scan <= first:
            per_team = first
        elif scan >= PLACEMENT_SCAN_MAX:
            per_team = max(first, scan // len(teams))
        else:
            per_team = first + max(1, QUEUE_PAGE // len(teams))
        heads = self.fair.waiting(open_nodes, now, teams, 1)
        if not heads:
            return []
        # Every team with jobs waiting keeps its unused guarantee, before any job is offered.
        self._want(planner, heads)
        standings, users = self.fair.standings(now, held=held)
        seen: list[tuple] = []
        ledger = planner.ledger
        for team in fairshare.team_order({row[QUEUED_TEAM] for row in heads}, standings):
            if planner.exhausted:
                break
            if ledger is not None and not every_node and ledger.refuses(team, LEAST_NEED) is not None:
                continue  # at its cap, or past its guarantee with nothing it may borrow: no job of it fits
            rows = fairshare.turns(self.fair.waiting(open_nodes, now, [team], per_team), TEAM_OF, USER_OF,
                                   standings, users)
            self._offer(planner, rows, now)
            seen += [(row[0], row[1], row[-2]) for row in rows]
        return seen

    def _offer(self, planner: placement.Planner, rows: list[tuple], now: float) -> None:
        self._want(planner, rows)
        self._add_throttles(planner, rows)
        # Made into asks as the planner takes them: it stops once no room is left.
        planner.offer(ask(row, now, self.ctx.settings.gang_hold_secs) for row in rows)

    def explain(self, now: float, limit: int = EXPLAIN_MAX) -> int:
        """Why the first `limit` due jobs in the queue are not placed, against every
        node (the background pass: the reasons of jobs no placement looks at, such as
        when no node has a free slot or none is healthy). Reads without a lock and
        writes only the reasons that changed; returns how many."""
        rows = self.reads.queue_head(now, limit)
        if not rows:
            return 0
        infos = self.reads.nodes()
        planner = placement.Planner(infos, self.ctx.settings.placement_policy,
                                    fallback=FALLBACK_LIMITS, explain=True, ledger=self.ledger(infos))
        self._offer(planner, rows, now)
        # A job the planner could place waits only for the next placement: it keeps its reason.
        return self.writes.keep_reasons(planner.plan().waiting, {row[0]: row[-2] for row in rows})

    def ledger(self, every_node: list[placement.NodeInfo] | None, lock: bool = False) -> quotas.Ledger | None:
        """The teams' quotas with their usage and the cluster's capacity (`every_node`: the
        nodes, when just read), for a pass to place within; None when no team has a quota.
        `lock`: in a placing transaction, one such placement at a time."""
        return self._ledger_and_held(every_node, False, lock)[0]

    def _ledger_and_held(self, every_node: list[placement.NodeInfo] | None, fair: bool, lock: bool = True
                         ) -> tuple[quotas.Ledger | None, list[Held]]:
        """The ledger (None: no quotas) and what the jobs holding slots reserve, read once
        for both quotas and fair share (`fair`: it is on; neither on: nothing read)."""
        found = self.ctx.teams.quotas()
        if found and lock:
            self.ctx.backend.lock_quotas(self.ctx.db)
        held = self.reads.holding() if found or fair else []
        if not found:
            return None, held
        return quotas.Ledger(found, self.reads.team_usage(held=held), self.reads.capacity(every_node)), held

    def why(self, job_id: str) -> tuple[Job, list[dict]]:
        """A pending job and the nodes that came closest to taking it, each with what it
        lacks (placement.shortfalls); Conflict for a job that does not wait."""
        job = self.jobs.get(job_id)
        if job.status != "pending":
            raise Conflict(f"{job.job_id} is {job.status}: it does not wait")
        if job.node_id is not None:
            return job, []
        return job, placement.shortfalls(ask(tuple(getattr(job, f.name) for f in QUEUED)), self.reads.nodes(),
                                         FALLBACK_LIMITS)

    @staticmethod
    def _want(planner: placement.Planner, rows: list[tuple]) -> None:
        """The teams of these waiting jobs keep their unused guarantee (quotas.Ledger.want)."""
        if planner.ledger is not None:
            planner.ledger.want({row[QUEUED_TEAM] for row in rows})

    def _add_throttles(self, planner: placement.Planner, rows: list[tuple]) -> None:
        """Tell the planner the limits of the arrays and concurrency keys of these queued
        jobs it does not know yet, and how many of their jobs are placed or running."""
        found = self.reads.throttles(set(planner.throttles), {row[QUEUED_ARRAY] for row in rows},
                                     {row[QUEUED_KEY] for row in rows})
        if found:
            planner.add_throttles(found)


def _split(chosen: list[placement.Placed]) -> tuple[list[placement.Placed], dict[int, list[placement.Placed]]]:
    """The placements of jobs of one node, and of each job of many nodes (a gang) its members'."""
    gangs = {p.job_id for p in chosen if p.rank > 0}
    if not gangs:
        return chosen, {}
    members: dict[int, list[placement.Placed]] = {}
    for p in chosen:
        if p.job_id in gangs:
            members.setdefault(p.job_id, []).append(p)
    return [p for p in chosen if p.job_id not in gangs], members
