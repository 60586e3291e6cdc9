"""Limits a submit is checked against, and the concurrency limits operators set.

A job's memory and CPU against what the known nodes allow, its own timeout against
JOB_TIMEOUT_MAX_SECS and its team's `max_timeout_secs`, its kill grace and warning;
the concurrency keys' limits, set, removed and listed."""
from typing import Any

from peewee import fn

from corral.server.principals import DEFAULT_TEAM
from corral.shared.errors import BadRequest, NotFound

from .. import liveness, placement
from ..models import ConcurrencyLimit, Job, Node
from ..validation import check_stop, timeout_column
from .context import StoreContext
from .rows import tuples


class Limits:
    def __init__(self, ctx: StoreContext):
        self.ctx = ctx

    @staticmethod
    def concurrency_limits(key: str | None = None, teams: frozenset[str] | None = None
                           ) -> list[tuple[str, int, int, str]]:
        """(key, limit, jobs with the key placed or running, team), of every limit set (or
        of `key`'s; of `teams`' only, unless None)."""
        query = ConcurrencyLimit.select()
        if key is not None:
            query = query.where(ConcurrencyLimit.key == key)
        if teams is not None:
            query = query.where(ConcurrencyLimit.team.in_(sorted(teams)))
        limits = {row.key: (row.limit, row.team) for row in query.order_by(ConcurrencyLimit.key)}
        if not limits:
            return []
        holding = _placed_or_running()
        active = dict(tuples(Job.select(Job.concurrency_key, fn.COUNT(Job.id)).where(
            Job.concurrency_key.in_(sorted(limits)) & holding).group_by(Job.concurrency_key)))
        return [(k, limit, active.get(k, 0), team) for k, (limit, team) in limits.items()]

    @staticmethod
    def owner(key: str) -> str | None:
        """The team whose limit `key` has (None: no limit)."""
        row = ConcurrencyLimit.select(ConcurrencyLimit.team).where(ConcurrencyLimit.key == key).first()
        return None if row is None else row.team

    def set_concurrency_limit(self, key: str, limit: int, team: str) -> None:
        """Set `key`'s limit, which belongs to `team` (a limit's team never changes here)."""
        with self.ctx.tx():
            ConcurrencyLimit.insert(key=key, limit=limit, team=team).on_conflict(
                conflict_target=[ConcurrencyLimit.key], preserve=[ConcurrencyLimit.limit]).execute()

    def remove_concurrency_limit(self, key: str) -> None:
        with self.ctx.tx():
            if ConcurrencyLimit.delete().where(ConcurrencyLimit.key == key).execute() == 0:
                raise NotFound(f"no concurrency limit is set for {key!r}")

    @staticmethod
    def compute_nodes() -> list[Node]:
        """The compute nodes with what check() reads of them (not their labels and
        defaults, JSON parsed for every node)."""
        return list(Node.select(Node.node_id, Node.max_memory_mb, Node.max_cpu_percent)
                    .where(Node.kind == liveness.COMPUTE))

    def check(self, fields: dict, known: list[Node] | None = None) -> dict:
        """Refuse limits no known node allows (a pinned job: its node), while nodes are known.
        `known`: the compute nodes, when the caller already read them. Also a job's own
        timeout_secs above JOB_TIMEOUT_MAX_SECS or its team's maximum, and the rest of how
        it stops (validation.check_stop). Returns the fields to store: a run job that asks
        no timeout gets its team's maximum when that is below JOB_TIMEOUT_SECS."""
        team = fields.get("team") or DEFAULT_TEAM
        team_max = self.ctx.teams.max_timeout(team)
        check_stop(fields, self.ctx.settings, team_max, team)
        timeout = fields.get("timeout_secs")
        if (fields.get("job_type") or "run") == "run" and team_max is not None:
            bounded = timeout_column(timeout, self.ctx.settings.job_timeout_secs, team_max)
            if bounded != timeout:
                fields = dict(fields, timeout_secs=bounded)
        self._check_resources(fields, known)
        return fields

    def _check_resources(self, fields: dict, known: list[Node] | None) -> None:
        if fields.get("memory_mb") is None and fields.get("cpu_percent") is None:
            return
        if known is None:
            known = self.compute_nodes()
        nodes = [n for n in known if not fields.get("instance_id") or n.node_id == fields["instance_id"]]
        job = placement.Ask(0, pin=fields.get("instance_id"), memory_mb=fields.get("memory_mb"),
                            cpu_percent=fields.get("cpu_percent"))
        if nodes and not any(placement.fits_maximum(job, placement.NodeInfo(
                n.node_id, 1, max_memory_mb=n.max_memory_mb, max_cpu_percent=n.max_cpu_percent)) for n in nodes):
            largest = ", ".join(f"{n.node_id}: {_maxima(n)}" for n in nodes[:5])
            raise BadRequest(f"no node allows {_asked(job)} ({largest})")


def _asked(job: placement.Ask) -> str:
    """The limits a job asks, those it gives only (`memory_mb=9000`, not `cpu_percent=None`)."""
    asked = [f"{name}={value}" for name, value in (("memory_mb", job.memory_mb), ("cpu_percent", job.cpu_percent))
             if value is not None]
    return ", ".join(asked)


def _maxima(node: Node) -> str:
    """A node's largest limits; one it does not state is `no maximum`."""
    return ", ".join(f"{name}<={value}" if value is not None else f"{name}: no maximum"
                     for name, value in (("memory_mb", node.max_memory_mb), ("cpu_percent", node.max_cpu_percent)))


def _placed_or_running() -> Any:
    """The jobs that count against an array's `parallel` and a concurrency key's limit."""
    return (Job.status == "running") | ((Job.status == "pending") & Job.node_id.is_null(False))
