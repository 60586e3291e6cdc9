"""`corral admin token …`: personal tokens made (the secret printed once), listed without
their secrets, and revoked (docs/security.md, "Personal tokens")."""
import click

from . import format as fmt
from . import scheduling as sched
from .common import Env, echo_json, echo_list, json_option, note
from .scheduling import Checked

TOKEN_HEADERS = ["TOKEN ID", "USER", "NAME", "SCOPE", "STATE", "CREATED", "EXPIRES", "LAST USED"]


def state(token: dict, now: float) -> str:
    """`revoked`, `expired` or `active`."""
    if token.get("revoked_at"):
        return "revoked"
    expires = fmt.parse_time(token.get("expires_at"))
    return "expired" if expires is not None and expires <= now else "active"


def token_row(token: dict, now: float) -> list:
    return [token.get("token_id"), token.get("user"), token.get("name"), token.get("scope"), state(token, now),
            fmt.relative(token.get("created_at"), now), fmt.relative(token.get("expires_at"), now) if
            token.get("expires_at") else "never", fmt.relative(token.get("last_used_at"), now)]


@click.group()
def token() -> None:
    """Make, list and revoke personal tokens."""


@token.command("create")
@click.option("--name", required=True, type=Checked(sched.parse_name, "NAME"),
              help="What the token is for (laptop, ci), to tell it from the user's others.")
@click.option("--user", metavar="USER", help="Whose token it is (default: yours; others': cluster admins).")
@click.option("--expires-in", "expires_in_secs", type=Checked(sched.parse_duration, "DURATION"),
              help="Refused from this long on: 3600, 12h, 90d (default: never).")
@click.option("--read-only", is_flag=True, help="Reads only: every change is refused (scope `read`).")
@json_option("Print the API's answer (with the secret, `token`).")
@click.pass_obj
def create(env: Env, name: str, user: str | None, expires_in_secs, read_only: bool, as_json: bool) -> None:
    """Make a personal token and print its secret, the one time it is shown (stdout: the
    secret alone, for `corral login --with-token`)."""
    body: dict = {"name": name}
    if read_only:
        body["scope"] = "read"
    if expires_in_secs is not None:
        body["expires_in_secs"] = expires_in_secs
    if user is not None:
        body["user"] = user
    answer = env.scheduler.create_token(body)
    if as_json:
        echo_json(answer)
    else:
        click.echo(answer.get("token"))
    expires = answer.get("expires_at")
    note(f"{answer.get('token_id')} for {answer.get('user')} ({answer.get('scope')}, "
         f"{'expires ' + fmt.timestamp(expires) if expires else 'never expires'}): the secret is shown only "
         f"this once; keep it now")


@token.command("list")
@click.option("--user", metavar="USER", help="Only this user's tokens (default: yours; a cluster admin's: all).")
@json_option()
@click.pass_obj
def list_tokens(env: Env, user: str | None, as_json: bool) -> None:
    """Personal tokens, oldest first, without their secrets."""
    now = env.now()
    echo_list(env.scheduler.list_tokens(user), as_json, "no tokens",
              lambda tokens: fmt.table(TOKEN_HEADERS, [token_row(t, now) for t in tokens], wide=("NAME",)))


@token.command("revoke")
@click.argument("token_id")
@json_option("Print the API's answer (the token, revoked).")
@click.pass_obj
def revoke(env: Env, token_id: str, as_json: bool) -> None:
    """Revoke a token: refused from now on (on every replica within seconds)."""
    env.subject = token_id
    answer = env.scheduler.revoke_token(token_id)
    echo_json(answer) if as_json else click.echo(f"{token_id}: revoked")
