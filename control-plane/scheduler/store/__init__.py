"""Everything the scheduler reads and writes, as parts with one concern each.

Each write is one short transaction. `Store` builds the parts over one shared context
(context.py) and exposes them; callers call the part (`store.submits.submit`,
`store.placing.dispatch`, ...).

Functions take `now` (seconds since the epoch) instead of reading the clock, so
tests drive them with fixed times. Every status change goes through
transitions.py (status_writer.py writes it), which checks it against shared.states
and records an event. Placement is its own stage (placing.py); its concurrency is
described there.
"""
from __future__ import annotations

from collections.abc import Callable

import peewee

from corral.server.leader import Fence

from .. import admission
from ..settings import SchedulerSettings
from .accounts import Accounts
from .actions import Actions
from .audit import AuditLog
from .claims import Claims
from .context import StoreContext
from .dependents import Dependents
from .fair_share import FairShare
from .gangs import Gangs
from .jobs import Jobs
from .leases import Leases
from .limits import Limits
from .links import Links
from .live_output import LiveOutput
from .marks import Marks
from .new_jobs import NewJobs
from .nodes import Nodes
from .outbox import Outbox
from .placement_reads import PlacementReads
from .placement_writes import PlacementWrites
from .placing import Placing
from .preemptions import Preemptions
from .purge import Purge
from .reports import Reports
from .stats import Stats
from .status_writer import StatusWriter
from .submits import Submits
from .team_quotas import TeamQuotas
from .transitions import Transitions
from .usage import Usage

__all__ = ["Store", "StoreContext"]


class Store:
    """The parts of the store, built over one context. The parts that need each other
    get each other through their constructors, here, in an order without cycles."""

    def __init__(self, db: peewee.Database, settings: SchedulerSettings,
                 on_placed: Callable[[set[str]], None] | None = None,
                 _context: StoreContext | None = None, _gate: admission.PendingGate | None = None):
        """`on_placed(node_ids)` is called after each commit that placed jobs (the
        waiting room: the claims of those nodes wake at once)."""
        ctx = self.context = _context or StoreContext.open(db, settings, on_placed)
        self.db, self.settings = ctx.db, ctx.settings
        self.stats = Stats(ctx)
        # MAX_PENDING_JOBS: one per process, shared by its fenced copies (admission.py).
        self.admission = _gate or admission.PendingGate(
            settings.max_pending_jobs, self.stats.count_pending, self.stats.count_pending_apart)
        self.jobs = Jobs(ctx)
        self.marks = Marks(ctx)
        self.limits = Limits(ctx)
        self.outbox = Outbox(ctx, self.stats)
        self.purge = Purge(ctx)
        writer = StatusWriter(ctx)
        self.dependents = Dependents(ctx, writer)
        self.gangs = Gangs(ctx, writer)
        self.transitions = Transitions(writer, self.dependents, self.gangs)
        self.submits = Submits(ctx, self.limits, Links(self.transitions), NewJobs(ctx), self.transitions,
                               self.admission)
        self.actions = Actions(ctx, self.jobs, self.transitions)
        self.reports = Reports(ctx, self.jobs, self.transitions)
        self.output = LiveOutput(ctx)
        self.leases = Leases(ctx, self.transitions)
        self.claims = Claims(ctx, self.transitions, self.leases)
        self.snapshot = PlacementReads(ctx)
        self.nodes = Nodes(ctx, self.stats, writer, self.snapshot, self.transitions)
        self.fair_share = FairShare(ctx, self.snapshot)
        self.placing = Placing(ctx, self.snapshot, PlacementWrites(ctx, writer), self.jobs, self.fair_share,
                               self.gangs)
        self.preemptions = Preemptions(ctx, self.snapshot, self.placing, self.fair_share, writer)
        self.accounts = Accounts(ctx)
        self.quotas = TeamQuotas(ctx, self.snapshot)
        self.audit = AuditLog(ctx)
        self.usage = Usage(ctx)

    def fenced(self, fence: Fence) -> Store:
        """This store for a background loop: each of its write transactions first checks
        that the loop still holds its lease (control-plane/server/leader.py Fence)."""
        return Store(self.db, self.settings, _context=self.context.fenced(fence), _gate=self.admission)

    def check_fence(self) -> None:
        """Inside a write transaction: refuse it (LeaseLost) when a loop lost its lease."""
        self.context.check_fence()
