"""`corral login`, `corral logout` and `corral whoami`: a personal token kept in the user's
config file for the scheduler it was checked against, and who a credential stands for."""
import sys

import click

from corral.shared.clients import Rejected

from . import config
from . import format as fmt
from . import selection
from .common import CliError, Env, echo_json, json_option, note

REFUSED = (401, 403)


def read_token(with_token: bool) -> str:
    """The token: stdin whole with --with-token, else asked for without echo on a terminal."""
    if with_token:
        token = sys.stdin.read().strip()
    elif selection.interactive():
        token = click.prompt("Token", hide_input=True, err=True).strip()
    else:
        raise click.UsageError("give --with-token to read the token from stdin")
    if not token:
        raise CliError("no token was read", exit_code=2)
    if not (token.isascii() and token.isprintable()) or any(c.isspace() for c in token):
        raise CliError("a token is one word of printable ASCII", exit_code=2)
    return token


def teams_text(teams: list[dict] | None) -> str:
    """`ml (admin), web (member)`."""
    return ", ".join(f"{t.get('team')} ({t.get('role')})" for t in teams or []) or "-"


def who_fields(who: dict) -> list[tuple[str, object]]:
    return [("user", who.get("user")), ("cluster_role", who.get("cluster_role")),
            ("teams", teams_text(who.get("teams"))), ("default_team", who.get("default_team")),
            ("token_id", who.get("token_id") or "- (a cluster token)"), ("read_only", who.get("read_only"))]


@click.command("login")
@click.option("--with-token", is_flag=True, help="Read the token from stdin (without it, a terminal is asked).")
@click.pass_obj
def login(env: Env, with_token: bool) -> None:
    """Keep a personal token for the scheduler (--addr), checked first (GET /whoami).

    It is stored with the address in the config file ($CORRAL_CONFIG, else
    $XDG_CONFIG_HOME/corral/config.json, else ~/.config/corral/config.json), readable by
    you alone, and sent to that scheduler when neither --token nor CORRAL_TOKEN is given.
    A token the scheduler refuses is not stored."""
    token = read_token(with_token)
    addr = ",".join(env.addrs)
    client = env.scheduler_with(token)
    try:
        who = client.whoami()
    except Rejected as exc:
        if exc.status in REFUSED:
            raise CliError(f"the scheduler at {addr} refused the token ({exc.message}); nothing was stored") from None
        raise
    finally:
        client.close()
    try:
        file = config.store(addr, token, who.get("token_id"), who.get("user"))
    except OSError as exc:
        raise CliError(f"cannot store the token: {exc}") from None
    token_id = who.get("token_id") or "a cluster token"
    note(f"logged in to {addr} as {who.get('user')} ({token_id}); stored in {file}")
    if env.token:
        note("--token / CORRAL_TOKEN is set: it is sent instead of the stored token while it is")


@click.command("logout")
def logout() -> None:
    """Remove the stored token from the config file (it stays valid until revoked:
    `corral admin token revoke TOKEN_ID`)."""
    try:
        forgotten = config.forget()
    except OSError as exc:
        raise CliError(f"cannot change {config.path()}: {exc}") from None
    if forgotten is None:
        note(f"no token stored in {config.path()}")
        return
    which = f"{forgotten.token_id} of {forgotten.user}" if forgotten.token_id else "the token"
    note(f"removed {which} for {forgotten.addr or 'the scheduler'} from {config.path()}")


@click.command("whoami")
@json_option()
@click.pass_obj
def whoami(env: Env, as_json: bool) -> None:
    """Who the token stands for: the user, their cluster role, teams and default team."""
    who = env.scheduler.whoami()
    echo_json(who) if as_json else fmt.emit(fmt.key_values(who_fields(who)))
