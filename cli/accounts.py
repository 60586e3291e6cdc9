"""`corral admin user …` and `corral admin team …`: the cluster's users, teams and who is
in which team with which role (docs/security.md, "Users and teams")."""
import click

from . import format as fmt
from . import scheduling as sched
from .common import Env, echo_json, echo_list, json_option, note
from .login import teams_text
from .scheduling import Checked

TEAM_ROLES = ("member", "admin")
CLUSTER_ROLES = ("admin", "reader")


def parse_membership(text: str) -> tuple[str, str]:
    """--team TEAM or TEAM:ROLE (member, the default, or admin): a team's name has no ':'."""
    team, _, role = text.partition(":")
    sched.parse_name(team)
    role = role or "member"
    if role not in TEAM_ROLES:
        raise ValueError("the role after ':' is " + " or ".join(TEAM_ROLES))
    return team, role


def members_text(members: list[dict] | None) -> str:
    """`alice (admin), bob`: a member's role is said when it is not `member`."""
    return ", ".join(m.get("user", "?") + (f" ({m.get('role')})" if m.get("role") != "member" else "")
                     for m in members or []) or "-"


def echo_team(team: dict, as_json: bool) -> None:
    if as_json:
        echo_json(team)
    else:
        click.echo(f"{team.get('name')}: {members_text(team.get('members'))}")


@click.group()
def admin() -> None:
    """Users, teams and personal tokens."""


@admin.group()
def user() -> None:
    """Make, list and remove users (cluster admins)."""


@user.command("create")
@click.argument("name")
@click.option("--team", "teams", multiple=True, type=Checked(parse_membership, "TEAM[:admin]"),
              help="A team of theirs (repeatable): TEAM as a member, TEAM:admin as its admin.")
@click.option("--default-team", type=sched.TEAM, help="The team their jobs go to when they name none.")
@click.option("--cluster-role", type=click.Choice(CLUSTER_ROLES),
              help="admin: everything; reader: sees everything, changes nothing (default: only what their "
                   "teams give).")
@json_option("Print the user's JSON.")
@click.pass_obj
def create_user(env: Env, name: str, teams: tuple[tuple[str, str], ...], default_team, cluster_role,
                as_json: bool) -> None:
    """Make the user NAME; then make them a token (`corral admin token create --user NAME`)."""
    env.subject = name
    body: dict = {"name": name}
    if cluster_role is not None:
        body["cluster_role"] = cluster_role
    if teams:
        body["teams"] = dict(teams)
    if default_team is not None:
        body["default_team"] = default_team
    answer = env.scheduler.create_user(body)
    if as_json:
        echo_json(answer)
        return
    click.echo(f"{answer.get('name')}: teams {teams_text(answer.get('teams'))}, "
               f"default team {answer.get('default_team') or '-'}, cluster role {answer.get('cluster_role') or '-'}")
    note(f"make them a token: corral admin token create --user {name} --name NAME")


@user.command("list")
@json_option()
@click.pass_obj
def list_users(env: Env, as_json: bool) -> None:
    """Every user, their cluster role, teams and default team."""
    now = env.now()
    echo_list(env.scheduler.list_users(), as_json, "no users", lambda users: fmt.table(
        ["NAME", "CLUSTER ROLE", "TEAMS", "DEFAULT TEAM", "CREATED"],
        [[u.get("name"), u.get("cluster_role"), teams_text(u.get("teams")), u.get("default_team"),
          fmt.relative(u.get("created_at"), now)] for u in users], wide=("TEAMS",)))


@user.command("delete")
@click.argument("name")
@click.pass_obj
def delete_user(env: Env, name: str) -> None:
    """Remove the user and revoke their tokens (their jobs stay theirs)."""
    env.subject = name
    env.scheduler.delete_user(name)
    click.echo(f"{name}: deleted, their tokens revoked")


@admin.group()
def team() -> None:
    """Make, list, change and remove teams, and change their members."""


@team.command("create")
@click.argument("name", type=sched.TEAM)
@json_option("Print the team's JSON.")
@click.pass_obj
def create_team(env: Env, name: str, as_json: bool) -> None:
    """Make the team NAME (cluster admins)."""
    env.subject = name
    echo_team(env.scheduler.create_team(name), as_json)


@team.command("list")
@json_option()
@click.pass_obj
def list_teams(env: Env, as_json: bool) -> None:
    """Every team, its largest job timeout and its members."""
    now = env.now()
    echo_list(env.scheduler.list_teams(), as_json, "no teams", lambda teams: team_table(teams, now))


def team_table(teams: list[dict], now: float):
    """MAX TIMEOUT when the teams say it (a scheduler before team limits does not)."""
    limits = any("max_timeout_secs" in t for t in teams)
    headers = ["NAME", "MAX TIMEOUT", "MEMBERS", "CREATED"] if limits else ["NAME", "MEMBERS", "CREATED"]
    rows = [[t.get("name"), *([max_timeout_text(t.get("max_timeout_secs"))] if limits else []),
             members_text(t.get("members")), fmt.relative(t.get("created_at"), now)] for t in teams]
    return fmt.table(headers, rows, wide=("MEMBERS",))


def max_timeout_text(secs: float | None) -> str:
    return "-" if secs is None else fmt.duration(secs)


@team.command("set")
@click.argument("name", metavar="TEAM", type=sched.TEAM)
@click.option("--max-timeout", "max_timeout_secs", type=Checked(sched.parse_duration, "DURATION"),
              help="The largest --timeout its jobs may ask for: 90, 90s, 15m, 2h, 1d (a job that asks none "
                   "gets it when it is below the scheduler's JOB_TIMEOUT_SECS).")
@click.option("--no-max-timeout", "clear_max_timeout", is_flag=True,
              help="Take its maximum away: only the scheduler's JOB_TIMEOUT_MAX_SECS holds.")
@click.option("--share", type=click.IntRange(1, 10_000),
              help="Its weight in fair share (every team's is 1 unless set).")
@json_option("Print the team's JSON.")
@click.pass_obj
def set_team(env: Env, name: str, max_timeout_secs, clear_max_timeout: bool, share: int | None,
             as_json: bool) -> None:
    """Change TEAM's limits and fair-share weight (cluster admins)."""
    if max_timeout_secs is not None and clear_max_timeout:
        raise sched.usage_error("give --max-timeout DURATION or --no-max-timeout, not both")
    if max_timeout_secs is None and not clear_max_timeout and share is None:
        raise click.UsageError("give what to change: --max-timeout DURATION, --no-max-timeout or --share N")
    env.subject = name
    changes: dict = {} if share is None else {"share": share}
    if max_timeout_secs is not None or clear_max_timeout:
        changes["max_timeout_secs"] = max_timeout_secs
    answer = env.scheduler.change_team(name, changes)
    if as_json:
        echo_json(answer)
        return
    secs = answer.get("max_timeout_secs")
    click.echo(f"{answer.get('name')}: max timeout " + ("none (the scheduler's JOB_TIMEOUT_MAX_SECS)"
                                                       if secs is None else fmt.duration(secs))
               + (f", share {answer.get('share')}" if "share" in answer else ""))


@team.command("delete")
@click.argument("name", type=sched.TEAM)
@click.pass_obj
def delete_team(env: Env, name: str) -> None:
    """Remove a team that has no members and no jobs (cluster admins)."""
    env.subject = name
    env.scheduler.delete_team(name)
    click.echo(f"{name}: deleted")


@team.command("add-member")
@click.argument("team_name", metavar="TEAM", type=sched.TEAM)
@click.argument("user_name", metavar="USER")
@click.option("--admin", "as_admin", is_flag=True, help="As the team's admin (default: a member).")
@json_option("Print the team's JSON.")
@click.pass_obj
def add_member(env: Env, team_name: str, user_name: str, as_admin: bool, as_json: bool) -> None:
    """Put USER in TEAM, or change their role in it (cluster admins, the team's admins)."""
    env.subject = team_name
    echo_team(env.scheduler.set_member(team_name, user_name, "admin" if as_admin else "member"), as_json)


@team.command("remove-member")
@click.argument("team_name", metavar="TEAM", type=sched.TEAM)
@click.argument("user_name", metavar="USER")
@click.pass_obj
def remove_member(env: Env, team_name: str, user_name: str) -> None:
    """Take USER out of TEAM (cluster admins, the team's admins)."""
    env.subject = team_name
    env.scheduler.remove_member(team_name, user_name)
    click.echo(f"{team_name}: {user_name} removed")
