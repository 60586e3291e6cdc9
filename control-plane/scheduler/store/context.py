"""What every part of the store shares.

The database, the settings, the compiled statements, and the lease a background loop
writes under (its Fence).

The database's backend (`backend`) answers what differs between the dialects.
One small object handed to each part, so that a part needs no hub to reach them;
`fenced` makes the copy a leased loop's parts are built on."""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import peewee

from corral.server.backends.base import Backend
from corral.server.backends.lookup import backend_of
from corral.server.leader import Fence
from corral.server.statements import Statements

from .. import lifecycle
from ..settings import SchedulerSettings
from .team_settings import TeamSettings


@dataclasses.dataclass
class StoreContext:
    db: peewee.Database
    settings: SchedulerSettings
    # The statements of a job's trip (place, claim, report), compiled once: see control-plane/server/statements.py.
    sql: Statements
    policy: lifecycle.Policy
    # Called after each commit that placed jobs (the waiting room: the claims of those nodes wake at once).
    on_placed: Callable[[set[str]], None] | None = None
    # The lease the background loops write under (fenced()); None for the API's writes.
    fence: Fence | None = None
    # Each team's largest timeout and quota, kept a short while (shared by fenced copies).
    teams: TeamSettings = dataclasses.field(default_factory=TeamSettings)

    @classmethod
    def open(cls, db: peewee.Database, settings: SchedulerSettings,
             on_placed: Callable[[set[str]], None] | None = None) -> StoreContext:
        return cls(db, settings, Statements(), lifecycle.Policy(
            settings.max_node_losses, settings.job_timeout_secs, settings.output_tail_bytes, settings.backoff),
            on_placed)

    @property
    def backend(self) -> Backend:
        """What differs between the databases (control-plane/server/backends/base.py)."""
        return backend_of(self.db)

    @property
    def marks_placements(self) -> bool:
        """Whether every placement changes PLACEMENT_MARK (where every commit wakes the watchers)."""
        return self.backend.wakes_on_every_commit

    def fenced(self, fence: Fence) -> StoreContext:
        """The same context for a background loop holding `fence` (statements stay shared)."""
        return dataclasses.replace(self, fence=fence)

    def check_fence(self) -> None:
        """Inside a write transaction: refuse it (LeaseLost) when a loop lost its lease."""
        if self.fence is not None:
            self.fence.check(self.db)

    def tx(self) -> AbstractContextManager[Any]:
        """A transaction, unless the caller (service.Scheduler) already runs one: then
        no savepoint either (its statements cost time on every submit and report)."""
        return contextlib.nullcontext() if self.db.in_transaction() else self.db.atomic()

    def capacity(self, slots: int | None) -> int:
        """How many jobs a node may hold: MAX_JOBS_PER_NODE, or fewer when its agent
        advertises fewer slots (None: a node the scheduler does not know)."""
        limit: int = self.settings.max_jobs_per_node
        return limit if slots is None else min(limit, slots)
