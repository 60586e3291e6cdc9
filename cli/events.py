"""`corral events`: the scheduler's event stream (`GET /events`) on the terminal, and
`follow`, the loop that reads it for any command (`job logs -f`): it reopens the
stream with the last event id it saw when the connection drops, the stream ends
(EVENTS_STREAM_MAX_SECS) or a replica goes away, so that nothing is missed or
shown twice, and it gives up only after the scheduler stayed unreachable for
LOST_LIMIT_SECS."""
import json
from collections.abc import Callable

import click
import requests

from corral.shared import sse, wire
from corral.shared.clients import Unreachable

from . import format as fmt
from .common import Env, note
from .polling import LOST_LIMIT_SECS, SIGINT_EXIT

# The pause before reopening a stream that ended or dropped.
REOPEN_SECS = 0.5


def follow(env: Env, params: dict, handle: Callable[[sse.Message], bool], last_event_id: str | None = None,
           on_open: Callable[[], None] | None = None) -> None:
    """Call `handle` with each event of the stream (`params`: its filters) until it
    returns False. `open` and `end` are the stream's own and not passed on; a `missed`
    event is said on stderr and passed on. `on_open` is called each time the stream
    (re)opens: what happened before is then the caller's to read."""
    parser = sse.Parser(last_event_id)
    lost_since: float | None = None
    while True:
        try:
            response = env.scheduler.events(params, parser.last_id)
        except Unreachable as exc:
            now = env.now()
            if lost_since is None:
                lost_since = now
                note(f"corral: cannot reach the scheduler ({exc.reason}); still trying")
            elif now - lost_since > LOST_LIMIT_SECS:
                raise
            env.sleep(REOPEN_SECS)
            continue
        if lost_since is not None:
            note("corral: the scheduler answers again")
            lost_since = None
        try:
            for message in sse.messages(response.iter_content(chunk_size=None), parser):
                if message.event == "open" and on_open is not None:
                    on_open()
                if message.event in ("open", "end"):
                    continue
                if message.event == "missed":
                    note(f"corral: {json.loads(message.data).get('reason')}")
                if not handle(message):
                    return
        except requests.RequestException:
            pass  # the connection dropped: reopen from the last event seen
        finally:
            response.close()
        env.sleep(REOPEN_SECS)


def line(message: sse.Message) -> str:
    """One event as a line: time, type, subject and what happened."""
    event = json.loads(message.data)
    when = fmt.timestamp(event.get("at"))
    if message.event == "job":
        where = f" on {event['node_id']}" if event.get("node_id") else ""
        reason = f" ({event['reason']})" if event.get("reason") else ""
        return (f"{when}  job   {event.get('job_id')}  {event.get('from') or '-'} → {event.get('to')}  "
                f"attempt {event.get('attempt')}{where}{reason}")
    if message.event == "node":
        return f"{when}  node  {event.get('node_id')}  {event.get('change')}"
    if message.event == "log":
        return (f"{when}  log   {event.get('job_id')}  attempt {event.get('attempt')} {event.get('stream')} "
                f"+{event.get('size')} bytes at {event.get('offset')}")
    return f"{when}  {message.event}  {message.data}"


@click.command("events")
@click.option("--job", "job_id", metavar="JOB", help="Only this job's events.")
@click.option("--node", "node_id", metavar="NODE", help="Only this node's events (and its jobs').")
@click.option("--type", "types", multiple=True, type=click.Choice(list(wire.EVENT_TYPES)),
              help="Only events of this type (repeatable).")
@click.option("--since", "last_event_id", metavar="ID",
              help="Start after this event id (an earlier run's last), not now.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line: id, type and the event's fields.")
@click.pass_obj
def events(env: Env, job_id: str | None, node_id: str | None, types: tuple[str, ...],
           last_event_id: str | None, as_json: bool) -> None:
    """Print what happens in the cluster as it happens: job transitions, node changes,
    new output. Runs until interrupted (Ctrl-C)."""
    params = {key: value for key, value in (("job_id", job_id), ("node_id", node_id)) if value}
    if types:
        params["type"] = ",".join(types)

    def show(message: sse.Message) -> bool:
        if as_json:
            click.echo(json.dumps({"id": message.id, "type": message.event, **json.loads(message.data)},
                                  ensure_ascii=False))
        else:
            click.echo(line(message))
        return True

    try:
        follow(env, params, show, last_event_id)
    except KeyboardInterrupt:
        click.get_current_context().exit(SIGINT_EXIT)
