"""What fair share reads (fairshare.py decides): each team's and user's core-seconds,
decayed (the ended attempts' totals per day, kept per process for HISTORY_SECS) plus
what their running jobs used so far (from PlacementReads.holding, which a placement
pass reads once for quotas and fair share), and the jobs waiting to be placed, each team's
first in queue order (the job_waiting_by_team index, in one statement)."""
from __future__ import annotations

import functools
import operator
import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any

import peewee

from corral.server.statements import ValueList, param

from .. import fairshare
from ..models import Job, UsageDay
from .columns import QUEUED, QUEUED_TEAM, QUEUED_USER
from .context import StoreContext
from .placement_reads import Held, PlacementReads
from .rows import tuples

# The ended attempts' decayed usage is read again after this long (it moves slowly; what
# running jobs use is read at every pass).
HISTORY_SECS = 2.0

Pair = tuple[str, str]  # (team, user)
TEAM_OF, USER_OF = operator.itemgetter(QUEUED_TEAM), operator.itemgetter(QUEUED_USER)


class FairShare:
    def __init__(self, ctx: StoreContext, reads: PlacementReads, clock: Callable[[], float] = time.monotonic):
        self.ctx = ctx
        self.reads = reads
        self._clock = clock
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._history: dict[Pair, float] = {}

    @property
    def half_life(self) -> float:
        return float(self.ctx.settings.fair_share_half_life_secs)

    def enabled(self) -> bool:
        """Whether placement takes turns between teams: on, and more than one team exists."""
        return self.half_life > 0 and len(self.ctx.teams.shares()) > 1

    # ---- usage ----------------------------------------------------------------------------

    def usage(self, now: float, held: list[Held] | None = None) -> dict[Pair, float]:
        """Each (team, user)'s decayed core-seconds: ended attempts' and running jobs' so far
        (`held`: what the jobs holding slots reserve, when the caller read it)."""
        found = dict(self._ended(now))
        for pair, amount in self._running(now, held).items():
            found[pair] = found.get(pair, 0.0) + amount
        return found

    def _ended(self, now: float) -> dict[Pair, float]:
        if self.half_life <= 0:
            return {}  # fair share off: only what runs now is shown
        with self._lock:
            at = self._clock()
            if self._read_at is None or not 0 <= at - self._read_at < HISTORY_SECS:
                days: dict[Pair, list[tuple[int, float]]] = {}
                for day, team, user, amount in tuples(
                        UsageDay.select(UsageDay.day, UsageDay.team, UsageDay.user, UsageDay.core_seconds).where(
                            UsageDay.day >= fairshare.first_day(now, self.half_life))):
                    days.setdefault((team, user), []).append((day, amount or 0.0))
                self._history = {pair: fairshare.decayed(rows, now, self.half_life) for pair, rows in days.items()}
                self._read_at = at
            return self._history

    def forget(self) -> None:
        with self._lock:
            self._read_at = None

    def _running(self, now: float, held: list[Held] | None) -> dict[Pair, float]:
        """The core-seconds the running jobs used so far, by (team, user), from what the jobs
        holding slots reserve (PlacementReads.holding, read now unless given)."""
        found: dict[Pair, float] = {}
        for one in self.reads.holding() if held is None else held:
            if one.running_cpu:
                found[(one.team, one.user)] = max(0.0, (one.running_cpu * now - one.running_cpu_since) / 100)
        return found

    def standings(self, now: float, waiting: Iterable[Pair] = (), held: list[Held] | None = None
                  ) -> tuple[dict[str, fairshare.Standing], dict[Pair, fairshare.Standing]]:
        """Every team's standing, and that of each user with usage or `waiting` jobs within their team."""
        usage = self.usage(now, held)
        by_team: dict[str, float] = {}
        for (team, _), amount in usage.items():
            by_team[team] = by_team.get(team, 0.0) + amount
        teams = fairshare.standings({name: float(share) for name, share in self.ctx.teams.shares().items()},
                                    by_team)
        return teams, fairshare.user_standings(usage, waiting)

    # ---- the queue, team by team --------------------------------------------------------------

    def waiting(self, open_nodes: ValueList, now: float, teams: Collection[str], limit: int) -> list[tuple]:
        """The first `limit` due jobs of each team (rows of columns.QUEUED) that an open node
        may take, each team's in queue order; one statement."""
        names = sorted(teams)

        def heads() -> Any:
            def head(i: int) -> Any:
                # `status = 'pending'` written out, not bound: only then does SQLite know the
                # partial index job_waiting_by_team serves it.
                query = Job.select(*QUEUED).where(
                    (Job.status == peewee.SQL("'pending'")) & Job.node_id.is_null()
                    & (Job.team == param(f"team{i}")) & (Job.dependencies_left == 0)
                    & (Job.next_attempt_at.is_null() | (Job.next_attempt_at <= param("now")))
                    & (Job.instance_id.is_null() | open_nodes.matches(Job.instance_id))
                ).order_by(Job.queue_at, Job.id).limit(param("limit"))
                # On PostgreSQL each head skips the jobs another placement is placing (as
                # PlacementReads.queue_page does).
                query = self.ctx.backend.skip_locked(query)
                return Job.select(peewee.SQL("*")).from_(query.alias(f"head{i}"))
            return functools.reduce(operator.add, [head(i) for i in range(len(names))])

        return self.ctx.sql.rows(self.ctx.db, ("waiting by team", len(names), open_nodes.size), heads, now=now,
                                 limit=limit, **open_nodes.values, **{f"team{i}": n for i, n in enumerate(names)})
