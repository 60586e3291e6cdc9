"""Team quotas as admins set and read them (docs/scheduling.md, "Quotas"): each team's
quota, kept with the team, and what its jobs use now. Placement reads the quotas
through the context's TeamSettings; quotas.py is the arithmetic."""
from __future__ import annotations

from corral.shared.errors import BadRequest, NotFound

from .. import quotas
from ..models import Team
from .context import StoreContext
from .placement_reads import PlacementReads
from .rows import json_value


class TeamQuotas:
    def __init__(self, ctx: StoreContext, reads: PlacementReads):
        self.ctx = ctx
        self.reads = reads

    def get(self, team: str) -> tuple[quotas.Quota | None, dict[str, int]]:
        """The team's quota (None: it has none) and what its placed and running jobs reserve."""
        row = Team.select(Team.quota).where(Team.name == team).tuples().first()
        if row is None:
            raise NotFound(f"no team {team!r}")
        quota = None if row[0] is None else quotas.Quota.from_dict(json_value(row[0]))
        used = self.reads.team_usage(team).get(team) or dict.fromkeys(quotas.RESOURCES, 0)
        return quota, used

    def set(self, team: str, quota: quotas.Quota) -> None:
        wrong = quotas.check(quota)
        if wrong:
            raise BadRequest(wrong)
        with self.ctx.tx():
            if Team.update(quota=quota.as_dict()).where(Team.name == team).execute() == 0:
                raise NotFound(f"no team {team!r}")
        self.ctx.teams.forget()

    def remove(self, team: str) -> None:
        """NotFound for a team without a quota (or no such team)."""
        with self.ctx.tx():
            if Team.update(quota=None).where((Team.name == team) & Team.quota.is_null(False)).execute() == 0:
                raise NotFound(f"team {team!r} has no quota" if Team.get_or_none(Team.name == team)
                               else f"no team {team!r}")
        self.ctx.teams.forget()
