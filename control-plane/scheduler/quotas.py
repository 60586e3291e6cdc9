"""Team quotas: what each team is guaranteed of the cluster, how much past that it may
borrow of what the others leave idle, and how much of its own guarantee it lends
(docs/scheduling.md, "Quotas").

Pure: amounts in, decisions out, no clock. Placement (placement.Planner) asks a `Ledger`
whether a job's team may take what the job would reserve, and tells it what it placed;
the store (store/placing.py) reads the quotas, each team's usage (what its placed and
running jobs reserve) and the cluster's capacity.

The model, resource by resource (CPU percent, memory MB, GPUs, running jobs):

- A team may use up to its guarantee plus its borrowing limit (no borrowing limit: as
  much as is free). A team without a quota has a guarantee of 0 and no borrowing limit:
  it runs on what the others leave idle.
- Using past its guarantee is borrowing. What a team borrows comes from capacity that is
  free, less what the other teams keep: the part of a guarantee that its team does not
  lend (guarantee less lending limit) and does not use now. With no lending limit a team
  lends all of its guarantee it does not use.
- A team within its guarantee is not held back by the quotas at all (the nodes' room
  still is); when others borrowed its capacity, preemption gives it back.
- While a team has jobs waiting, all of its unused guarantee is kept for it
  (`Ledger.want`): what it lends is only what it leaves idle.
- A job that is not preemptible may not borrow: it runs within its team's guarantee.

So a cluster without quotas places as it did without them: every team borrows, and
nothing is kept.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

RESOURCES = ("cpu_percent", "memory_mb", "gpus", "jobs")
QUOTA_PARTS = ("guaranteed", "borrowing_limit", "lending_limit")
# What "no limit" compares as.
UNLIMITED = 1 << 62
UNITS = {"cpu_percent": "% CPU", "memory_mb": " MB of memory", "gpus": " GPUs", "jobs": " running jobs"}

Amounts = Mapping[str, int]
Need = tuple[int, ...]  # amounts in the order of RESOURCES


def say(resource: str, amount: int) -> str:
    """An amount in words: `400% CPU`, `2048 MB of memory`, `3 running jobs`."""
    return f"{amount}{UNITS[resource]}"


@dataclass(frozen=True)
class Quota:
    """One team's quota. A resource it names in neither `guaranteed` nor `borrowing_limit`
    it does not govern: the team uses any of it free (it is not borrowing). A governed
    resource absent from `guaranteed` is guaranteed 0; absent from `borrowing_limit`, it
    may be borrowed without limit; absent from `lending_limit`, all of its guarantee the
    team does not use is lent."""

    guaranteed: Mapping[str, int] = field(default_factory=dict)
    borrowing_limit: Mapping[str, int] = field(default_factory=dict)
    lending_limit: Mapping[str, int] = field(default_factory=dict)

    def guarantee(self, resource: str) -> int:
        return self.guaranteed.get(resource, 0)

    def governs(self, resource: str) -> bool:
        return resource in self.guaranteed or resource in self.borrowing_limit

    def within(self, resource: str) -> int:
        """What the team may use of it without borrowing: its guarantee; UNLIMITED when ungoverned."""
        return self.guarantee(resource) if self.governs(resource) else UNLIMITED

    def cap(self, resource: str) -> int:
        """The most of it the team may use: its guarantee plus its borrowing limit."""
        limit = self.borrowing_limit.get(resource)
        return UNLIMITED if limit is None else self.guarantee(resource) + limit

    def kept(self, resource: str) -> int:
        """The part of its guarantee it never lends."""
        lend = self.lending_limit.get(resource)
        return 0 if lend is None else max(0, self.guarantee(resource) - lend)

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {part: dict(getattr(self, part)) for part in QUOTA_PARTS}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any] | None) -> Quota:
        value = value or {}
        return cls(*({r: int(n) for r, n in (value.get(part) or {}).items() if r in RESOURCES and n is not None}
                     for part in QUOTA_PARTS))


NO_QUOTA = Quota()


def check(quota: Quota) -> str | None:
    """What is wrong with a quota an admin sets (None: nothing): a lending limit over the
    guarantee it lends from."""
    for resource, lend in quota.lending_limit.items():
        if lend > quota.guarantee(resource):
            return (f"lending_limit.{resource} {lend} is over guaranteed.{resource} {quota.guarantee(resource)}: "
                    "a team lends only what it is guaranteed")
    return None


def need_of(memory_mb: int, cpu_percent: int, gpus: int = 0, jobs: int = 1) -> Need:
    """What one job takes of a team's quota, in the order of RESOURCES (a job of many
    nodes: what all its members take, each member counting as a job)."""
    return (cpu_percent, memory_mb, gpus, jobs)


@dataclass(frozen=True)
class Refusal:
    """Why a job's team may not take what the job needs. `keepers`: the teams whose kept
    guarantee the job would take (when that is why); else it is the team's own cap."""

    team: str
    resource: str
    used: int
    need: int
    guaranteed: int
    cap: int | None                       # guarantee plus borrowing limit; None: no borrowing limit
    keepers: tuple[str, ...] = ()
    kept: int = 0                         # what they keep, unused, of the resource
    free: int = 0                         # what is free of it in the cluster
    unborrowable: bool = False            # the job may not borrow (not preemptible) and would


_ZERO = (0,) * len(RESOURCES)
_NO_CAP = (UNLIMITED,) * len(RESOURCES)


class Ledger:
    """The quotas during one placement pass: each team's usage as jobs are placed.

    `quotas`: team -> Quota (teams absent have none); `usage`: team -> what its placed and
    running jobs reserve now (RESOURCES); `capacity`: resource -> what the cluster has of
    it (absent or None: not counted, when a node advertises no capacity).

    Speed: a pass asks it once per job it would place (thousands), so amounts are kept
    as lists in the order of RESOURCES, and a team's kept part is updated only for the
    resources it keeps."""

    def __init__(self, quotas: Mapping[str, Quota], usage: Mapping[str, Amounts],
                 capacity: Mapping[str, int | None]):
        self.quotas = dict(quotas)
        self.usage = {team: [int(amounts.get(r, 0)) for r in RESOURCES] for team, amounts in usage.items()}
        self.capacity = tuple(capacity.get(r) for r in RESOURCES)
        self.total = [sum(u[i] for u in self.usage.values()) for i in range(len(RESOURCES))]
        # What each team may use without borrowing (UNLIMITED: a resource its quota does not govern).
        self.guarantees = {t: tuple(q.within(r) for r in RESOURCES) for t, q in self.quotas.items()}
        self.caps = {t: tuple(q.cap(r) for r in RESOURCES) for t, q in self.quotas.items()}
        # What each team keeps of its guarantee (it does not lend), where it keeps any, and
        # of that what it does not use now: what others may not borrow.
        self.keeps = {t: kept for t, q in self.quotas.items()
                      if any(kept := tuple(q.kept(r) for r in RESOURCES))}
        self.unused_kept = {t: [max(0, k - u) for k, u in zip(kept, self.usage.get(t, _ZERO))]
                            for t, kept in self.keeps.items()}
        self.kept_total = [sum(k[i] for k in self.unused_kept.values()) for i in range(len(RESOURCES))]

    def used(self, team: str) -> dict[str, int]:
        return dict(zip(RESOURCES, self.usage.get(team, _ZERO)))

    def quota(self, team: str) -> Quota:
        return self.quotas.get(team, NO_QUOTA)

    def want(self, teams: Iterable[str]) -> None:
        """These teams have jobs waiting: all of their unused guarantee is kept for them (a
        team lends only what it leaves idle), whatever their lending limits."""
        for team in teams:
            quota = self.quotas.get(team)
            if quota is None:
                continue
            guarantees = tuple(quota.guarantee(r) for r in RESOURCES)
            if self.keeps.get(team) == guarantees or not any(guarantees):
                continue
            self.keeps[team] = guarantees
            before = self.unused_kept.get(team, list(_ZERO))
            after = [max(0, g - u) for g, u in zip(guarantees, self.usage.get(team, _ZERO))]
            for i in range(len(RESOURCES)):
                self.kept_total[i] += after[i] - before[i]
            self.unused_kept[team] = after

    def refuses(self, team: str, need: Need, may_borrow: bool = True) -> Refusal | None:
        """Why `team` may not take `need` now (None: it may). `may_borrow`: False for a job
        that is not preemptible, which may use only what is left of its team's guarantee."""
        kept_total = self.kept_total
        guarantees = self.guarantees.get(team)
        if guarantees is None and not any(kept_total) and may_borrow:
            return None  # no quota of its own, and nothing kept by others: it may borrow anything free
        used = self.usage.get(team, _ZERO)
        caps = self.caps.get(team, _NO_CAP)
        guarantees = guarantees or _ZERO
        own_kept = self.unused_kept.get(team, _ZERO)
        for i, amount in enumerate(need):
            if amount <= 0:
                continue
            after = used[i] + amount
            if after > caps[i]:
                return Refusal(team, RESOURCES[i], used[i], amount, guarantees[i], caps[i])
            if after <= guarantees[i]:
                continue
            if not may_borrow:
                return Refusal(team, RESOURCES[i], used[i], amount, guarantees[i], caps[i], unborrowable=True)
            capacity = self.capacity[i]
            others_kept = kept_total[i] - own_kept[i]
            # Borrowing: what stays free afterwards must still hold what the others keep.
            if capacity is not None and others_kept > 0 and capacity - self.total[i] - amount < others_kept:
                keepers = tuple(sorted(t for t, kept in self.unused_kept.items() if t != team and kept[i] > 0))
                return Refusal(team, RESOURCES[i], used[i], amount, guarantees[i],
                               None if caps[i] >= UNLIMITED else caps[i], keepers, others_kept,
                               max(0, capacity - self.total[i]))
        return None

    def take(self, team: str, need: Need) -> None:
        """`team` was given `need` (a job of it placed)."""
        used = self.usage.get(team)
        if used is None:
            used = self.usage[team] = list(_ZERO)
        total = self.total
        for i, amount in enumerate(need):
            used[i] += amount
            total[i] += amount
        kept = self.keeps.get(team)
        if kept is not None:
            unused = self.unused_kept[team]
            for i, keep in enumerate(kept):
                if keep:
                    now = max(0, keep - used[i])
                    self.kept_total[i] += now - unused[i]
                    unused[i] = now


def capacity_of(counted: Iterable[tuple[int | None, int | None, int, int]]) -> dict[str, int | None]:
    """The cluster's capacity from its nodes' (memory MB, CPU percent, slots, GPUs), memory
    and CPU None when a node does not advertise it (then the cluster's is not counted either)."""
    memory: int | None = 0
    cpu: int | None = 0
    jobs = gpus = 0
    for node_memory, node_cpu, slots, node_gpus in counted:
        memory = None if memory is None or node_memory is None else memory + node_memory
        cpu = None if cpu is None or node_cpu is None else cpu + node_cpu
        jobs += slots
        gpus += node_gpus
    return {"cpu_percent": cpu, "memory_mb": memory, "gpus": gpus, "jobs": jobs}


def borrowed(quota: Quota, used: Amounts) -> dict[str, int]:
    """What a team uses past its guarantee, by resource (none of a resource it does not govern)."""
    return {r: max(0, used.get(r, 0) - quota.within(r)) for r in RESOURCES}
