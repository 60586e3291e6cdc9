"""Usage accounting: what each ended attempt used, added to its user's and team's
totals of its UTC day in the transaction that ends it (status_writer.py), and read
back by day, week, user or team (GET /usage).

An attempt ends when a running job leaves `running` (done, failed, cancelled, sent
back to pending). Its CPU seconds and peak memory are what its node reported (none
when the node did not: a lost node, a cancel); its wall time runs from `running_at`
to the end; memory counts as the peak times the wall time, in MB-seconds; GPU seconds
are the GPUs reserved for it times the wall time (Slurm's allocated GPU time); core-seconds
are the cores it reserved (cpu_percent / 100) times the wall time, what fair share
counts (fairshare.py), so that a job cannot hold cores cheaply by leaving them idle."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from peewee import SQL, fn

from ..models import Job, UsageDay
from .context import StoreContext
from .rows import tuples

DAY_SECS = 86400
COLUMNS = ("day", "team", "user", "attempts", "cpu_seconds", "wall_seconds", "memory_mb_seconds", "gpu_seconds",
           "core_seconds")
SUMMED = COLUMNS[3:]
GROUPS = ("day", "week", "user", "team")


@dataclasses.dataclass(frozen=True)
class Ended:
    """One ended attempt: whose, and what it used."""

    team: str
    user: str
    cpu_seconds: float
    wall_seconds: float
    memory_mb_seconds: float
    core_seconds: float = 0.0
    gpu_seconds: float = 0.0


def ended(job: Job, changes: dict, now: float) -> Ended:
    """What the attempt of `job` (as it was while running) used, ending now with `changes`."""
    wall = max(0.0, now - job.running_at) if job.running_at is not None else 0.0
    peak = changes.get("peak_memory_bytes")
    return Ended(job.team, job.submitted_by, float(changes.get("cpu_seconds") or 0.0), wall,
                 (peak / (1024 * 1024)) * wall if peak else 0.0, (job.reserved_cpu_percent or 0) / 100 * wall,
                 (job.gpus or 0) * wall)


def day_of(ts: float) -> int:
    return int(ts // DAY_SECS)


class Usage:
    def __init__(self, ctx: StoreContext):
        self.ctx = ctx
        self._sql: str | None = None

    def add(self, attempts: Iterable[Ended], now: float) -> None:
        """Add ended attempts to today's totals of their users and teams: one statement per
        user and team, in the caller's transaction."""
        totals: dict[tuple[str, str], list[float]] = {}
        for one in attempts:
            sums = totals.setdefault((one.team, one.user), [0, 0.0, 0.0, 0.0, 0.0, 0.0])
            sums[0] += 1
            sums[1] += one.cpu_seconds
            sums[2] += one.wall_seconds
            sums[3] += one.memory_mb_seconds
            sums[4] += one.core_seconds
            sums[5] += one.gpu_seconds
        day = day_of(now)
        for (team, user), (count, cpu, wall, memory, cores, gpus) in totals.items():
            self.ctx.db.execute_sql(self._upsert(), [day, team, user, count, cpu, wall, memory, gpus, cores])

    def _upsert(self) -> str:
        """One statement, written once (both databases take ON CONFLICT ... excluded)."""
        if self._sql is None:
            names = ", ".join(f'"{name}"' for name in COLUMNS)
            params = ", ".join(self.ctx.db.param for _ in COLUMNS)
            adds = ", ".join(f'"{name}" = "usage_day"."{name}" + excluded."{name}"' for name in SUMMED)
            self._sql = (f'INSERT INTO "usage_day" ({names}) VALUES ({params}) '
                         f'ON CONFLICT ("day", "team", "user") DO UPDATE SET {adds}')
        return self._sql

    @staticmethod
    def attributed(jobs: list[Job]) -> dict[int, tuple[str, str]]:
        """The team and submitter of jobs read without those columns."""
        if not jobs:
            return {}
        query = Job.select(Job.id, Job.team, Job.submitted_by).where(Job.id.in_([job.id for job in jobs]))
        return {job_id: (team, user) for job_id, team, user in tuples(query)}

    @staticmethod
    def totals(group_by: str, first_day: int, last_day: int, team: str | None = None, user: str | None = None,
               teams: frozenset[str] | None = None) -> list[dict]:
        """The sums of the days first_day..last_day, grouped by `group_by` (GROUPS): one
        dict per group, in its order, with `attempts` and the seconds."""
        key = {"day": UsageDay.day, "week": ((UsageDay.day + 3) / 7).cast("INTEGER"),  # weeks from a Monday
               "user": UsageDay.user, "team": UsageDay.team}[group_by]
        query = UsageDay.select(key.alias("key"), *[fn.SUM(getattr(UsageDay, name)).alias(name) for name in SUMMED]
                                ).where(UsageDay.day.between(first_day, last_day))
        for field, value in ((UsageDay.team, team), (UsageDay.user, user)):
            if value is not None:
                query = query.where(field == value)
        if teams is not None:
            query = query.where(UsageDay.team.in_(sorted(teams)))
        first_column = SQL("1")  # the group's key, as selected (an expression for weeks)
        rows: list[tuple] = list(tuples(query.group_by(first_column).order_by(first_column)))
        return [{"key": row[0], **{name: value or 0 for name, value in zip(SUMMED, row[1:])}} for row in rows]
