"""What fair share reads (fairshare.py decides): each team's and user's core-seconds,
decayed (the ended attempts' totals per day, kept per process for HISTORY_SECS) plus
what their running jobs used so far, and the jobs waiting to be placed, each team's
first in queue order (the job_waiting_by_team index, in one statement)."""
from __future__ import annotations

import functools
import operator
import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any

import peewee
from peewee import fn

from corral.server.statements import ValueList, param

from .. import fairshare
from ..models import Job, UsageDay
from .columns import QUEUED, QUEUED_TEAM, QUEUED_USER
from .context import StoreContext
from .rows import tuples

# The ended attempts' decayed usage is read again after this long (it moves slowly; what
# running jobs use is read at every pass).
HISTORY_SECS = 2.0

Pair = tuple[str, str]  # (team, user)


class FairShare:
    def __init__(self, ctx: StoreContext, clock: Callable[[], float] = time.monotonic):
        self.ctx = ctx
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

    def usage(self, now: float) -> dict[Pair, float]:
        """Each (team, user)'s decayed core-seconds: ended attempts' and running jobs' so far."""
        found = dict(self._ended(now))
        for pair, amount in self._running(now).items():
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

    def _running(self, now: float) -> dict[Pair, float]:
        """The core-seconds the running jobs used so far, by (team, user): one grouped read of
        the running jobs (as many as the cluster's slots)."""
        rows = self.ctx.sql.rows(self.ctx.db, "running core-seconds", lambda: Job.select(
            Job.team, Job.submitted_by, fn.SUM(Job.reserved_cpu_percent),
            fn.SUM(Job.reserved_cpu_percent * Job.running_at)).where(
            (Job.status == "running") & Job.running_at.is_null(False)).group_by(Job.team, Job.submitted_by))
        return {(team, user): max(0.0, ((cpu or 0) * now - (weighted or 0.0)) / 100)
                for team, user, cpu, weighted in rows}

    def standings(self, now: float, waiting: Iterable[Pair] = ()
                  ) -> tuple[dict[str, fairshare.Standing], dict[Pair, fairshare.Standing]]:
        """Every team's standing, and that of each user with usage or `waiting` jobs within their team."""
        usage = self.usage(now)
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

    def in_turns(self, rows: list[tuple], now: float) -> list[tuple]:
        """Queued rows in fair-share order (fairshare.turns)."""
        team_of, user_of = operator.itemgetter(QUEUED_TEAM), operator.itemgetter(QUEUED_USER)
        teams, users = self.standings(now, {(team_of(row), user_of(row)) for row in rows})
        return fairshare.turns(rows, team_of, user_of, teams, users)
