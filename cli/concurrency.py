"""`corral concurrency …`: the cluster-wide limits of jobs sharing a concurrency key."""
import click

from . import format as fmt
from . import scheduling as sched
from .common import Env, echo_json, json_option, note
from .scheduling import Checked

KEY = Checked(sched.parse_name, "KEY")


@click.group()
def concurrency() -> None:
    """List, set and remove limits on jobs that share a concurrency key."""


@concurrency.command("list")
@json_option()
@click.pass_obj
def list_limits(env: Env, as_json: bool) -> None:
    """Every key with a limit, and how many of its jobs are placed or running."""
    limits = env.scheduler.list_concurrency()
    if as_json:
        echo_json(limits)
        return
    if not limits:
        note("no concurrency limits")
        return
    fmt.emit(fmt.table(["KEY", "TEAM", "LIMIT", "ACTIVE"],
                       [[c.get("key"), c.get("team", "-"), c.get("limit"), c.get("active")] for c in limits]))


@concurrency.command("set")
@click.argument("key", type=KEY)
@click.argument("limit", type=Checked(sched.parse_count(1, sched.MAX_CONCURRENCY_LIMIT), "N"))
@click.option("--team", type=sched.TEAM, help="The team the limit belongs to, whose jobs alone may use KEY "
                                            "(default: your default team; a limit set before keeps its own).")
@json_option("Print the API's answer.")
@click.pass_obj
def set_limit(env: Env, key: str, limit: int, team: str | None, as_json: bool) -> None:
    """At most N jobs with KEY placed or running at once, cluster-wide."""
    env.subject = key
    answer = env.scheduler.set_concurrency(key, limit, team)
    if as_json:
        echo_json(answer)
    else:
        click.echo(f"{key}: at most {answer.get('limit')} at once ({answer.get('active')} active)")


@concurrency.command("remove")
@click.argument("key", type=KEY)
@click.pass_obj
def remove(env: Env, key: str) -> None:
    """Remove KEY's limit: its jobs are no longer held back."""
    env.subject = key
    env.scheduler.remove_concurrency(key)
    click.echo(f"{key}: no limit")
