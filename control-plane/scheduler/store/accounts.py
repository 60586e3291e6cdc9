"""Users, teams, memberships and personal tokens (docs/security.md, "Users and teams").

Team and user names are checked by the caller (corral.server.principals); here are
the rules that need the database: a team or user named twice is a Conflict, a
membership needs both to exist, a user's default team must be one of theirs."""
from __future__ import annotations

from corral.server import principals as p
from corral.server.audit_trail import Entry
from corral.server.principals import Principal
from corral.shared.errors import BadRequest, Conflict, NotFound

from .. import personal_tokens
from ..models import (ApiToken, AuditEvent, ConcurrencyLimit, Job, Membership, OidcSubject, Schedule, Team, User,
                      add_waiting_by_team_index)
from .context import StoreContext


class Accounts:
    def __init__(self, ctx: StoreContext):
        self.ctx = ctx

    # ---- teams --------------------------------------------------------------------------

    def create_team(self, name: str, now: float) -> Team:
        with self.ctx.tx():
            if Team.get_or_none(Team.name == name) is not None:
                raise Conflict(f"team {name!r} exists")
            team = Team.create(name=name, created_at=now)
            add_waiting_by_team_index(self.ctx.db)  # fair share's turns now have two teams
            return team

    @staticmethod
    def teams() -> list[tuple[Team, list[Membership]]]:
        members: dict[str, list[Membership]] = {}
        for row in Membership.select().order_by(Membership.team, Membership.user):
            members.setdefault(row.team, []).append(row)
        return [(team, members.get(team.name, [])) for team in Team.select().order_by(Team.name)]

    @staticmethod
    def team(name: str) -> tuple[Team, list[Membership]]:
        team = Team.get_or_none(Team.name == name)
        if team is None:
            raise NotFound(f"no team {name!r}")
        return team, list(Membership.select().where(Membership.team == name).order_by(Membership.user))

    def update_team(self, name: str, changes: dict) -> tuple[Team, list[Membership]]:
        """`changes`: `max_timeout_secs` (None clears it), `share`."""
        with self.ctx.tx():
            self.team(name)
            if changes:
                Team.update(**changes).where(Team.name == name).execute()
        return self.team(name)

    def delete_team(self, name: str) -> None:
        """Only a team without jobs and members: jobs keep their team for good."""
        with self.ctx.tx():
            self.team(name)
            if name == p.DEFAULT_TEAM:
                raise Conflict(f"team {p.DEFAULT_TEAM!r} is where requests without a team go; it stays")
            if Membership.select().where(Membership.team == name).exists():
                raise Conflict(f"team {name!r} has members: remove them first")
            if Job.select().where(Job.team == name).exists():
                raise Conflict(f"team {name!r} has jobs: they keep their team, so it stays")
            for model, what in ((Schedule, "schedules"), (ConcurrencyLimit, "concurrency limits")):
                if model.select().where(model.team == name).exists():
                    raise Conflict(f"team {name!r} has {what}: remove them first")
            Team.delete().where(Team.name == name).execute()

    # ---- users --------------------------------------------------------------------------

    def create_user(self, name: str, cluster_role: str | None, default_team: str | None,
                    teams: dict[str, str], now: float) -> tuple[User, list[Membership]]:
        if name in p.RESERVED_USERS:
            raise Conflict(f"{name!r} is the name of a bootstrap token's user; pick another")
        with self.ctx.tx():
            if User.get_or_none(User.name == name) is not None:
                raise Conflict(f"user {name!r} exists")
            self.require_teams(teams)
            _check_default(default_team, teams)
            User.create(name=name, cluster_role=cluster_role, default_team=default_team, created_at=now)
            for team, role in teams.items():
                Membership.create(user=name, team=team, role=role)
        return self.user(name)

    @staticmethod
    def users() -> list[tuple[User, list[Membership]]]:
        teams: dict[str, list[Membership]] = {}
        for row in Membership.select().order_by(Membership.user, Membership.team):
            teams.setdefault(row.user, []).append(row)
        return [(user, teams.get(user.name, [])) for user in User.select().order_by(User.name)]

    @staticmethod
    def user(name: str) -> tuple[User, list[Membership]]:
        user = User.get_or_none(User.name == name)
        if user is None:
            raise NotFound(f"no user {name!r}")
        return user, list(Membership.select().where(Membership.user == name).order_by(Membership.team))

    def update_user(self, name: str, changes: dict) -> tuple[User, list[Membership]]:
        """`changes`: `cluster_role` and/or `default_team` (None clears either)."""
        with self.ctx.tx():
            _, memberships = self.user(name)
            if changes.get("default_team") is not None:
                _check_default(changes["default_team"], {m.team: m.role for m in memberships})
            if changes:
                User.update(**changes).where(User.name == name).execute()
        return self.user(name)

    def delete_user(self, name: str, now: float) -> None:
        """The user, their memberships, and every token of theirs revoked (their jobs stay,
        attributed to them)."""
        with self.ctx.tx():
            self.user(name)
            Membership.delete().where(Membership.user == name).execute()
            ApiToken.update(revoked_at=now).where((ApiToken.user == name) & ApiToken.revoked_at.is_null()).execute()
            User.delete().where(User.name == name).execute()

    def set_member(self, team: str, user: str, role: str) -> Membership:
        with self.ctx.tx():
            self.team(team)
            self.user(user)
            Membership.insert(user=user, team=team, role=role).on_conflict(
                conflict_target=[Membership.user, Membership.team], preserve=[Membership.role]).execute()
            return Membership.get((Membership.user == user) & (Membership.team == team))

    def remove_member(self, team: str, user: str) -> None:
        with self.ctx.tx():
            removed = Membership.delete().where((Membership.user == user) & (Membership.team == team)).execute()
            if not removed:
                raise NotFound(f"{user!r} is not a member of team {team!r}")
            User.update(default_team=None).where((User.name == user) & (User.default_team == team)).execute()

    @staticmethod
    def require_teams(teams) -> None:
        """BadRequest naming the first of `teams` that does not exist."""
        known = {t.name for t in Team.select(Team.name).where(Team.name.in_(sorted(teams)))} if teams else set()
        missing = sorted(set(teams) - known)
        if missing:
            raise BadRequest(f"no team {missing[0]!r}: create it first (POST /teams)")

    @staticmethod
    def roles_of(name: str) -> tuple[str | None, dict[str, str]] | None:
        """A user's cluster role and teams (the bootstrap `admin`: a cluster admin of no
        team); None: no such user. A cluster admin may act in any team that exists."""
        if name == p.BOOTSTRAP_ADMIN:
            return p.ADMIN, {}
        user = User.get_or_none(User.name == name)
        if user is None:
            return None
        return user.cluster_role, {m.team: m.role for m in Membership.select().where(Membership.user == name)}

    # ---- personal tokens --------------------------------------------------------------------

    def create_token(self, user: str, name: str, scope: str, expires_at: float | None, created_by: str,
                     now: float) -> tuple[ApiToken, str]:
        """A new token of `user` and its secret (the only time the secret exists outside
        its holder's hands)."""
        secret = personal_tokens.new_secret()
        with self.ctx.tx():
            self.user(user)
            token = ApiToken.create(token_id=personal_tokens.new_token_id(), user=user, name=name,
                                    secret_sha256=personal_tokens.digest(secret), scope=scope, created_at=now,
                                    created_by=created_by, expires_at=expires_at)
        return token, secret

    @staticmethod
    def tokens(user: str | None = None) -> list[ApiToken]:
        query = ApiToken.select()
        if user is not None:
            query = query.where(ApiToken.user == user)
        return list(query.order_by(ApiToken.created_at, ApiToken.token_id))

    @staticmethod
    def token(token_id: str) -> ApiToken:
        token = ApiToken.get_or_none(ApiToken.token_id == token_id)
        if token is None:
            raise NotFound(f"no token {token_id!r}")
        return token

    def revoke_token(self, token_id: str, now: float) -> ApiToken:
        """Revoked from now on (revoking one twice keeps the first time)."""
        with self.ctx.tx():
            ApiToken.update(revoked_at=now).where(
                (ApiToken.token_id == token_id) & ApiToken.revoked_at.is_null()).execute()
            return self.token(token_id)

    def principal_for(self, secret_sha256: str, now: float) -> Principal | None:
        """Who the token with this digest stands for, on a connection of its own (the
        request check runs before the request's connection is taken); None: no such
        token, or it is revoked or expired. Notes its use to the minute."""
        with self.ctx.db.connection_context():
            token = ApiToken.get_or_none(ApiToken.secret_sha256 == secret_sha256)
            if token is None or token.revoked_at is not None or (
                    token.expires_at is not None and token.expires_at <= now):
                return None
            user = User.get_or_none(User.name == token.user)
            if user is None:
                return None
            teams = {m.team: m.role for m in Membership.select().where(Membership.user == user.name)}
            if token.last_used_at is None or now - token.last_used_at >= personal_tokens.LAST_USED_STEP_SECS:
                ApiToken.update(last_used_at=now).where(ApiToken.token_id == token.token_id).execute()
        return Principal(user.name, user.cluster_role, teams, user.default_team,
                         read_only=token.scope == p.READ, token_id=token.token_id)

    def sso_principal(self, given: Principal, login: Entry, now: float) -> Principal:
        """Who a user of single sign-on is: the roles their groups give (`given`), and
        those of a user of the same name in the table. A subject seen for the first time
        is recorded, with `login` in the audit log; a team a group names is made if new."""
        with self.ctx.db.connection_context():
            if OidcSubject.get_or_none(OidcSubject.subject == login.target) is None:
                with self.ctx.tx():
                    OidcSubject.insert(subject=login.target, user=given.user, first_seen_at=now).on_conflict_ignore(
                        ).execute()
                    AuditEvent.insert(**login.row()).execute()
            missing = set(given.teams) - {t.name for t in Team.select(Team.name).where(
                Team.name.in_(sorted(given.teams)))} if given.teams else set()
            if missing:
                with self.ctx.tx():
                    for team in sorted(missing):
                        Team.insert(name=team, created_at=now).on_conflict_ignore().execute()
            user = User.get_or_none(User.name == given.user)
            if user is None:
                return given
            teams = {m.team: m.role for m in Membership.select().where(Membership.user == user.name)}
        for team, team_role in given.teams.items():
            if teams.get(team) != p.TEAM_ADMIN:
                teams[team] = team_role
        cluster_role = p.ADMIN if p.ADMIN in (given.cluster_role, user.cluster_role) else (
            given.cluster_role or user.cluster_role)
        return Principal(given.user, cluster_role, teams, user.default_team)


def _check_default(default_team: str | None, teams: dict[str, str]) -> None:
    if default_team is not None and default_team not in teams:
        raise BadRequest(f"'default_team' must be one of the user's teams; {default_team!r} is not")
