"""Fair share: whose turn it is when several teams, or several users of one team, have
jobs waiting (docs/scheduling.md, "Fair share").

Pure: usage and shares in, factors and an order out; the time is passed in.

Usage is core-seconds: the cores a job reserved (cpu_percent / 100) times the time it
ran, so that reserving cores and leaving them idle is not cheap. What ended attempts
used counts less as it ages, by half every half-life (FAIR_SHARE_HALF_LIFE_SECS);
what running jobs have used so far counts in full. A team's factor is Slurm's classic
2 ** -(its part of the usage / its part of the shares): 1 for a team that used
nothing, 0.5 for one that used exactly its share, towards 0 the more it used past
it. Users within a team have equal shares. Placement offers the waiting jobs team
by team, the highest factor first, and within a team user by user, the highest
factor first; a user's own jobs keep their queue order (priority, aging, age).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

DAY_SECS = 86400
# A team's weight until a cluster admin sets another.
DEFAULT_SHARE = 1
# Usage older than this many half-lives is left out (it counts for less than 1/1024 of itself).
HALF_LIVES_KEPT = 10

T = TypeVar("T")


def decayed(days: Iterable[tuple[int, float]], now: float, half_life: float) -> float:
    """Core-seconds of (UTC day, core-seconds) totals, each halved for every half-life
    between the middle of its day and `now` (a day not over yet counts in full)."""
    total = 0.0
    for day, amount in days:
        age = max(0.0, now - (day + 0.5) * DAY_SECS)
        total += amount * math.pow(0.5, age / half_life)
    return total


def first_day(now: float, half_life: float) -> int:
    """The oldest UTC day whose usage still counts."""
    return int((now - HALF_LIVES_KEPT * half_life) // DAY_SECS)


@dataclass(frozen=True)
class Standing:
    """One team's (or one user's, within a team) place in fair share."""

    share: float       # its part of the shares, 0..1
    usage: float       # its decayed core-seconds
    usage_part: float  # its part of the usage, 0..1 (0 while nobody used anything)
    factor: float      # 2 ** -(usage_part / share): 1 used nothing, 0.5 used its share

    def as_dict(self) -> dict[str, float]:
        return {"share": round(self.share, 6), "usage_core_seconds": round(self.usage, 3),
                "usage_part": round(self.usage_part, 6), "factor": round(self.factor, 6)}


def standings(shares: Mapping[str, float], usage: Mapping[str, float]) -> dict[str, Standing]:
    """Each of `shares` (name -> weight; a weight of 0 has no share) with its factor;
    `usage`: name -> decayed core-seconds (absent: none). Usage of names without a share
    counts in the total, so that a team removed still weighs on the others' parts."""
    total_share = sum(max(0.0, weight) for weight in shares.values())
    total_usage = sum(max(0.0, amount) for amount in usage.values())
    found = {}
    for name, weight in shares.items():
        share = max(0.0, weight) / total_share if total_share > 0 else 0.0
        used = max(0.0, usage.get(name, 0.0))
        part = used / total_usage if total_usage > 0 else 0.0
        factor = math.pow(2.0, -part / share) if share > 0 else 0.0
        found[name] = Standing(share, used, part, factor)
    return found


def _first(standing: Standing | None) -> float:
    """A sort key: the highest factor first (one without a standing used nothing)."""
    return -(standing.factor if standing else 1.0)


def team_order(names: Iterable[str], teams: Mapping[str, Standing]) -> list[str]:
    """Teams in turn order: the highest factor first, then by name."""
    return sorted(names, key=lambda team: (_first(teams.get(team)), team))


def turns(rows: Sequence[T], team_of: Callable[[T], str], user_of: Callable[[T], str],
          teams: Mapping[str, Standing], users: Mapping[tuple[str, str], Standing]) -> list[T]:
    """`rows` (each team's waiting jobs, in queue order within each team) in fair-share
    order: team by team, the highest factor first (then by name), and within a team user
    by user, the highest factor first (then by name); each user's jobs in the order given.
    A user without a standing counts as one that used nothing."""
    def key(row: T) -> tuple:
        team, user = team_of(row), user_of(row)
        return (_first(teams.get(team)), team, _first(users.get((team, user))), user)
    return sorted(rows, key=key)  # stable: each user's jobs keep their queue order


def user_standings(usage: Mapping[tuple[str, str], float], waiting: Iterable[tuple[str, str]]
                   ) -> dict[tuple[str, str], Standing]:
    """Each (team, user) that has usage or waiting jobs, with its factor among its team's
    users (equal shares)."""
    by_team: dict[str, set[str]] = {}
    for team, user in list(usage) + list(waiting):
        by_team.setdefault(team, set()).add(user)
    found: dict[tuple[str, str], Standing] = {}
    for team, names in by_team.items():
        ranked = standings(dict.fromkeys(names, 1.0), {user: usage.get((team, user), 0.0) for user in names})
        found.update({(team, user): standing for user, standing in ranked.items()})
    return found
