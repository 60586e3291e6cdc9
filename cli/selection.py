"""Choosing jobs by what they are, for `corral job list` and `corral job cancel`: the
filter flags GET /jobs takes (name, schedule, array, creation time), reading every
page of a filtered list, and the confirmation an action on many jobs asks for."""
import sys
from typing import Callable

import click

from corral.shared.timeutil import iso

from . import scheduling as sched
from .common import CliError, Env
from .scheduling import Checked

FILTER_OPTIONS = (
    click.option("--name", "job_name", type=Checked(sched.parse_name, "NAME"), help="Only jobs with this name."),
    click.option("--schedule", type=Checked(sched.parse_name, "NAME"), help="Only the runs of this schedule."),
    click.option("--array", "array_id", metavar="ARRAY", help="Only the jobs of this array (such as array-3)."),
    click.option("--since", type=Checked(sched.parse_since, "TIME"),
                 help="Only jobs created since TIME: a time ago (30m, 2h, 1d) or ISO-8601 with a zone."),
    click.option("--until", type=Checked(sched.parse_since, "TIME"),
                 help="Only jobs created before TIME: a time ago (30m, 2h, 1d) or ISO-8601 with a zone."),
)
FILTER_NAMES = ("job_name", "schedule", "array_id", "since", "until")
# The most jobs `job cancel` with filters reads (pages of PAGE): a filter that matches
# more is refused rather than half-done.
PAGE = 1000
MAX_SELECTED = 10_000


def filter_options(command: Callable) -> Callable:
    for option in reversed(FILTER_OPTIONS):
        command = option(command)
    return command


def instant(bound: dict | None, now: float) -> str | None:
    """A --since or --until value as the API's time: `ago` counted back from `now`."""
    if bound is None:
        return None
    return iso(now - bound["ago"]) if "ago" in bound else bound["at"]


def filter_query(options: dict, now: float) -> dict:
    """Take the filter flags out of a command's keyword arguments: GET /jobs's parameters
    (None for those not given)."""
    given = {name: options.pop(name) for name in FILTER_NAMES}
    return {"name": given["job_name"], "schedule": given["schedule"], "array": given["array_id"],
            "created_after": instant(given["since"], now), "created_before": instant(given["until"], now)}


def every_job(env: Env, query: dict) -> list[dict]:
    """Every job a query matches, oldest first, following the pages (at most MAX_SELECTED)."""
    jobs, next_query = env.scheduler.list_jobs_page(**query, order="asc", limit=PAGE)
    while next_query:
        if len(jobs) >= MAX_SELECTED:
            raise CliError(f"more than {MAX_SELECTED} jobs match: narrow the filters")
        page, following = env.scheduler.list_jobs_page(**next_query)
        jobs.extend(page)
        if following == next_query:  # a server that repeats its cursor must not loop us forever
            break
        next_query = following
    return jobs


def interactive() -> bool:
    """Whether a person can answer a question (a seam for the tests)."""
    return sys.stdin.isatty()


def confirm(question: str, yes: bool) -> None:
    """Go on when --yes was given or the person says yes; refuse (exit 2) where nobody
    can answer, and stop (exit 1) on a no."""
    if yes:
        return
    if not interactive():
        raise CliError(f"{question} Refusing without --yes: stdin is not a terminal", exit_code=2)
    if not click.confirm(question, default=False, err=True):
        raise CliError("nothing was done")
