"""Who a request acts for, and what that lets them see and change (docs/security.md,
"Users and teams"). Pure: no Flask, no database.

A `Principal` is a user with a cluster role (admin, reader or none), the teams they
belong to with their role in each (admin or member), and the scope of the credential
they came with (a read-only personal token changes nothing). The bootstrap tokens
stand for two fixed principals: CORRAL_API_TOKEN is the cluster admin `admin` (also
every request of the tokenless local mode), CORRAL_READ_TOKEN the cluster-wide
reader `reader`. Every job belongs to one team; a cluster that configures no teams
has one, `default`.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from corral.shared.errors import BadRequest, Forbidden

# Cluster roles, and roles in a team.
ADMIN, READER = "admin", "reader"
CLUSTER_ROLES = (ADMIN, READER)
TEAM_ADMIN, MEMBER = "admin", "member"
TEAM_ROLES = (MEMBER, TEAM_ADMIN)
# A personal token's scope: the user's rights, or reads only.
FULL, READ = "full", "read"
SCOPES = (FULL, READ)

DEFAULT_TEAM = "default"
BOOTSTRAP_ADMIN = "admin"    # the user CORRAL_API_TOKEN stands for; jobs older than users were its
BOOTSTRAP_READER = "reader"  # the user CORRAL_READ_TOKEN stands for
RESERVED_USERS = (BOOTSTRAP_ADMIN, BOOTSTRAP_READER)

# Team names as jobs and OIDC groups (`corral:TEAM`) carry them: no ':' (it ends the team
# in a group name). User names as identity providers give them: emails too.
TEAM_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
USER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$"
TEAM_RE = re.compile(TEAM_PATTERN.removesuffix("$") + r"\Z")
USER_RE = re.compile(USER_PATTERN.removesuffix("$") + r"\Z")


@dataclass(frozen=True)
class Principal:
    """A user as one request acts: `teams` maps each of their teams to their role in
    it; `read_only`: the credential's scope allows reads only; `token_id`: the personal
    token it came with (None: a bootstrap token or the local mode)."""

    user: str
    cluster_role: str | None = None
    teams: Mapping[str, str] = field(default_factory=dict)
    default_team: str | None = None
    read_only: bool = False
    token_id: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.cluster_role == ADMIN

    @property
    def sees_every_team(self) -> bool:
        return self.cluster_role in CLUSTER_ROLES

    def visible_teams(self) -> frozenset[str] | None:
        """The teams whose jobs this principal sees; None: every team."""
        return None if self.sees_every_team else frozenset(self.teams)

    def can_see(self, team: str) -> bool:
        return self.sees_every_team or team in self.teams

    def administers(self, team: str) -> bool:
        """A cluster admin, or an admin of `team` (read-only credentials administer nothing)."""
        return not self.read_only and (self.is_admin or self.teams.get(team) == TEAM_ADMIN)

    def can_change_job(self, team: str, submitted_by: str) -> bool:
        """Cancel or retry: its submitter (still in its team), the team's admins, cluster admins."""
        if self.read_only:
            return False
        return self.administers(team) or (team in self.teams and submitted_by == self.user)

    def sees_env(self, team: str, submitted_by: str) -> bool:
        """The values of a job's env vars (often secrets): its submitter, the team's admins and
        cluster admins; everyone else sees the names only."""
        return self.is_admin or self.teams.get(team) == TEAM_ADMIN or submitted_by == self.user

    def team_to_act_in(self, asked: str | None) -> str:
        """The team a new job (or schedule) of this principal belongs to: the one asked
        for, else the user's default team, else their only team, else `default` (cluster
        admins). A team they are not in: Forbidden."""
        if self.read_only:
            raise Forbidden("a read-only token may not change anything")
        if asked is not None:
            check_team_name(asked)
            if self.is_admin or asked in self.teams:
                return asked
            raise Forbidden(f"{self.user!r} is not a member of team {asked!r}")
        if self.default_team is not None and (self.is_admin or self.default_team in self.teams):
            return self.default_team
        if len(self.teams) == 1:
            return next(iter(self.teams))
        if self.is_admin:
            return DEFAULT_TEAM
        if not self.teams:
            raise Forbidden(f"{self.user!r} is in no team: a cluster admin adds them to one")
        raise BadRequest(f"{self.user!r} is in several teams and has no default one: name one with 'team' "
                         f"({', '.join(sorted(self.teams))})")


BOOTSTRAP_ADMIN_PRINCIPAL = Principal(BOOTSTRAP_ADMIN, ADMIN)
BOOTSTRAP_READER_PRINCIPAL = Principal(BOOTSTRAP_READER, READER, read_only=True)


def check_team_name(name: str) -> str:
    if not isinstance(name, str) or not TEAM_RE.match(name):
        raise BadRequest("a team name is letters, digits, '.', '_' or '-' (at most 128), starting with a letter "
                         "or digit")
    return name


def check_user_name(name: str) -> str:
    if not isinstance(name, str) or not USER_RE.match(name):
        raise BadRequest("a user name is letters, digits, '.', '_', '@', '+' or '-' (at most 128), starting with "
                         "a letter or digit")
    return name
