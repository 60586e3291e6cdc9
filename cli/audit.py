"""`corral audit`: who did what through the scheduler's API, newest first, read page by
page (`GET /audit`, its `next_before` cursor) up to --limit events."""
import click

from . import format as fmt
from . import scheduling as sched
from . import selection
from .common import Env, echo_list, json_option, note
from .scheduling import Checked

PAGE = 1000  # the most events GET /audit answers at once
MAX_EVENTS = 100_000
AUDIT_HEADERS = ["TIME", "USER", "TEAM", "ACTION", "TARGET", "STATUS", "ADDRESS"]
WHEN = Checked(sched.parse_since, "WHEN")


def event_row(event: dict) -> list:
    return [fmt.timestamp(event.get("at")), event.get("user"), event.get("team"), event.get("action"),
            event.get("target"), event.get("status"), event.get("address")]


def read_events(env: Env, query: dict, limit: int) -> tuple[list[dict], bool]:
    """Up to `limit` events, following the pages; and whether there are more."""
    events: list[dict] = []
    before = None
    while True:
        page = env.scheduler.audit(dict(query, limit=min(PAGE, limit - len(events)), before=before))
        events.extend(page.get("events") or [])
        following = page.get("next_before")
        if following is None or len(events) >= limit:
            return events[:limit], following is not None
        if following == before:  # a server that repeats its cursor must not loop us forever
            return events, True
        before = following


@click.command("audit")
@click.option("--user", metavar="USER", help="Only what this user did.")
@click.option("--team", type=sched.TEAM, help="Only what was done in this team.")
@click.option("--action", metavar="ACTION", help="Only this action: the route's operation id (cancelJob, "
                                                 "createToken…; docs/api.md).")
@click.option("--since", type=WHEN, help="Since WHEN: a time ago (30m, 2h, 1d) or ISO-8601 with a zone.")
@click.option("--until", type=WHEN, help="Before WHEN: a time ago (30m, 2h, 1d) or ISO-8601 with a zone.")
@click.option("--limit", type=click.IntRange(1, MAX_EVENTS), default=100, show_default=True,
              help="The newest N events (read in pages of up to 1000).")
@json_option("Print the events' JSON (one list, every page's).")
@click.pass_obj
def audit(env: Env, user, team, action, since, until, limit: int, as_json: bool) -> None:
    """What was done through the scheduler's API: when, by whom, in which team, on what,
    and how it was answered; newest first."""
    now = env.now()
    query = {"user": user, "team": team, "action": action, "since": selection.instant(since, now),
             "until": selection.instant(until, now)}
    events, more = read_events(env, query, limit)
    echo_list(events, as_json, "no events",
              lambda events: fmt.table(AUDIT_HEADERS, [event_row(e) for e in events], wide=("TARGET",)))
    if more and events and not as_json:
        note(f"(more events: --limit above {limit})")
