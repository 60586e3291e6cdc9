"""`corral admin team quota …`: what each team is guaranteed of the cluster, may borrow
and lends (docs/scheduling.md, "Quotas")."""
import click

from . import format as fmt
from . import scheduling as sched
from corral.shared.clients import Rejected

from .common import Env, echo_json, json_option
from .scheduling import Checked

RESOURCES = ("cpu_percent", "memory_mb", "gpus", "jobs")
PARTS = ("guaranteed", "borrowing_limit", "lending_limit")


def parse_amounts(text: str) -> dict[str, int]:
    """`cpu_percent=800,memory_mb=16384,jobs=20`: amounts of the resources a quota counts."""
    amounts: dict[str, int] = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep or name not in RESOURCES:
            raise ValueError("give RESOURCE=N[,RESOURCE=N...], RESOURCE one of " + ", ".join(RESOURCES))
        if not value.isdigit():
            raise ValueError(f"{name} must be a whole number, 0 or more")
        amounts[name] = int(value)
    return amounts


AMOUNTS = Checked(parse_amounts, "RESOURCE=N,...")


@click.group()
def quota() -> None:
    """Set, show and remove teams' quotas (setting and removing: cluster admins)."""


@quota.command("set")
@click.argument("name", metavar="TEAM", type=sched.TEAM)
@click.option("--guaranteed", type=AMOUNTS,
              help="What the team may always use, e.g. cpu_percent=800,memory_mb=16384,jobs=20 (left out: 0).")
@click.option("--borrowing-limit", type=AMOUNTS,
              help="How much past its guarantee it may use of what others leave idle (left out: no limit).")
@click.option("--lending-limit", type=AMOUNTS,
              help="How much of its unused guarantee others may borrow (left out: all of it).")
@json_option("Print the quota's JSON.")
@click.pass_obj
def set_quota(env: Env, name: str, guaranteed, borrowing_limit, lending_limit, as_json: bool) -> None:
    """Give TEAM this quota, replacing the one it had."""
    env.subject = name
    body = {part: value for part, value in (("guaranteed", guaranteed), ("borrowing_limit", borrowing_limit),
                                            ("lending_limit", lending_limit)) if value is not None}
    echo_quotas([env.scheduler.set_quota(name, body)], as_json)


@quota.command("show")
@click.argument("names", metavar="[TEAM]...", nargs=-1, type=sched.TEAM)
@json_option("Print the quotas' JSON.")
@click.pass_obj
def show_quota(env: Env, names: tuple[str, ...], as_json: bool) -> None:
    """The quotas of these teams (default: every team you may see) and what their jobs use now."""
    if not names:
        names = tuple(str(t.get("name")) for t in env.scheduler.list_teams())
    shown = []
    for name in names:
        env.subject = name
        try:
            shown.append(env.scheduler.quota(name))
        except Rejected as exc:
            if len(names) == 1 or exc.status != 404:
                raise  # listing every team: another team's quota is not shown to a member
    echo_quotas(shown, as_json)


@quota.command("delete")
@click.argument("name", metavar="TEAM", type=sched.TEAM)
@click.pass_obj
def delete_quota(env: Env, name: str) -> None:
    """Remove TEAM's quota: it runs on what other teams leave idle, as teams without one do."""
    env.subject = name
    env.scheduler.delete_quota(name)
    click.echo(f"{name}: quota removed")


def echo_quotas(answers: list[dict], as_json: bool) -> None:
    if as_json:
        echo_json(answers if len(answers) != 1 else answers[0])
        return
    if not answers:
        click.echo("no teams")
        return
    fmt.emit(quota_table(answers))


def quota_table(answers: list[dict]):
    """A row per team and resource it has a quota of or uses: guarantee, borrowing limit,
    lending limit, what it uses and what of that it borrows."""
    rows = []
    for answer in answers:
        used, borrowed = answer.get("used") or {}, answer.get("borrowed") or {}
        named = [r for r in RESOURCES if any(r in (answer.get(p) or {}) for p in PARTS) or used.get(r)]
        if not named:
            rows.append([answer.get("team"), "-", "-", "-", "-", "-", "-"])
        for resource in named:
            rows.append([answer.get("team"), resource, _amount(answer, "guaranteed", resource, "0"),
                         _amount(answer, "borrowing_limit", resource, "no limit"),
                         _amount(answer, "lending_limit", resource, "all"), used.get(resource, 0),
                         borrowed.get(resource, 0)])
    return fmt.table(["TEAM", "RESOURCE", "GUARANTEED", "BORROWING LIMIT", "LENDING LIMIT", "USED", "BORROWED"],
                     rows)


def _amount(answer: dict, part: str, resource: str, absent: str):
    value = (answer.get(part) or {}).get(resource)
    return absent if value is None else value
