"""`corral usage`: what the jobs' ended attempts used, per day, week, user or team
(`GET /usage`), as a table in hours like Slurm's `sreport`, as CSV or as JSON; with
`--fair-share`, each team's and user's standing in fair share (`GET
/usage/fair-share`), like Slurm's `sshare`."""
import csv
import sys

import click

from . import format as fmt
from . import scheduling as sched
from .common import Env, echo_json, json_option, note

GROUPS = ("day", "week", "user", "team")
# The figures as shown: (header, the answer's field, the divisor that makes hours).
FIGURES = (("ATTEMPTS", "attempts", None), ("CPU HOURS", "cpu_seconds", 3600),
           ("WALL HOURS", "wall_seconds", 3600), ("MEMORY GB-HOURS", "memory_mb_seconds", 1024 * 3600),
           ("GPU HOURS", "gpu_seconds", 3600), ("CORE HOURS", "core_seconds", 3600))


def figures(row: dict) -> list:
    return [row.get(field) if divisor is None else round((row.get(field) or 0) / divisor, 2)
            for _, field, divisor in FIGURES]


@click.command("usage")
@click.option("--team", type=sched.TEAM, help="Only this team's.")
@click.option("--user", metavar="USER", help="Only this user's.")
@click.option("--from", "first", metavar="DAY", help="The first day, YYYY-MM-DD in UTC (default: 7 days ago).")
@click.option("--to", "end", metavar="DAY", help="The day after the last, YYYY-MM-DD (default: tomorrow).")
@click.option("--group-by", type=click.Choice(GROUPS), default="day", show_default=True,
              help="Sum per day, per week (from its Monday), per user or per team.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV with the figures as the API gives them (seconds).")
@click.option("--fair-share", is_flag=True,
              help="Instead: each team's share, decayed usage and factor, and its users' (the order of turns).")
@json_option()
@click.pass_obj
def usage(env: Env, team, user, first, end, group_by: str, as_csv: bool, fair_share: bool, as_json: bool) -> None:
    """CPU, wall, memory, GPU and reserved core hours of the jobs' ended attempts (a member: their teams')."""
    if fair_share:
        echo_fair_share(env.scheduler.fair_share(), as_json)
        return
    answer = env.scheduler.usage({"team": team, "user": user, "from": first, "to": end, "group_by": group_by})
    rows = answer.get("rows") or []
    if as_json:
        echo_json(answer)
        return
    if as_csv:
        out = csv.writer(sys.stdout, lineterminator="\n")
        out.writerow([group_by, *(field for _, field, _ in FIGURES)])
        out.writerows([row.get("group"), *(row.get(field) for _, field, _ in FIGURES)] for row in rows)
        return
    if not rows:
        note(f"no usage from {answer.get('from_day')} to {answer.get('to_day')}")
        return
    fmt.emit(fmt.table([group_by.upper(), *(header for header, _, _ in FIGURES)],
                       [[row.get("group"), *figures(row)] for row in rows]))
    note(f"from {answer.get('from_day')} to {answer.get('to_day')} (UTC)")


def echo_fair_share(answer: dict, as_json: bool) -> None:
    if as_json:
        echo_json(answer)
        return
    rows = []
    for team in answer.get("teams") or []:
        rows.append([team.get("team"), "", team.get("weight"), *standing(team)])
        rows += [["", u.get("user"), "", *standing(u)] for u in team.get("users") or []]
    fmt.emit(fmt.table(["TEAM", "USER", "WEIGHT", "SHARE", "CORE HOURS", "USAGE", "FACTOR"], rows))
    half_life = fmt.duration(answer.get("half_life_secs"))
    note(f"usage halves every {half_life}; the highest factor goes first" if answer.get("enabled")
         else "fair share is off (FAIR_SHARE_HALF_LIFE_SECS is 0, or only one team exists): queue order only")


def standing(item: dict) -> list:
    """Share and usage part as percentages, decayed core-seconds in hours, the factor."""
    return [f"{100 * (item.get('share') or 0):.1f}%", round((item.get("usage_core_seconds") or 0) / 3600, 2),
            f"{100 * (item.get('usage_part') or 0):.1f}%", f"{item.get('factor') or 0:.3f}"]
