"""Formatting for people: relative times, durations, colours and tables.

Everything but `emit` is a pure function of its arguments (the current time is
passed in as `now`), so it can be tested without a terminal or a clock.
"""
import datetime
import io
import sys

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from corral.shared import states

FINAL = states.FINAL_STATUSES

STATUS_STYLES = {
    states.PENDING: "yellow", states.RUNNING: "cyan", states.DONE: "green", states.FAILED: "bold red",
    states.CANCELLED: "magenta",
    "healthy": "green", "unhealthy": "bold red",
}

# A table sent to a pipe or a file is never wrapped or cut: it is as wide as its widest row.
PLAIN_WIDTH = 1_000_000


def parse_time(value: str | None) -> float | None:
    """An API time (ISO-8601, `…Z`) as seconds since the epoch; None for None or garbage."""
    if not value:
        return None
    try:
        dt = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    return dt.timestamp()


def _span(seconds: float) -> str:
    """A coarse span: 45s, 3m, 2h, 5d."""
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def relative(value: str | None, now: float) -> str:
    """`3m ago`, `in 20s`, `just now`; `-` when there is no time."""
    ts = parse_time(value)
    if ts is None:
        return "-"
    delta = now - ts
    if abs(delta) < 1:
        return "just now"
    return f"{_span(delta)} ago" if delta > 0 else f"in {_span(-delta)}"


def duration(seconds: float | None) -> str:
    """`850ms`, `4.2s`, `3m05s`, `2h03m`, `3d04h`; `-` for None."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def seconds(secs: float | None) -> str:
    """A span a person asked for in seconds (a warning's lead, a kill grace): `60s`, `1.5s`,
    `600s`; an hour or more as `duration` says it (`2h00m`); `-` for None."""
    if secs is None:
        return "-"
    return f"{secs:g}s" if secs < 3600 else duration(secs)


def job_duration(job: dict, now: float) -> str:
    """How long the job has run: start to end, or start to now while it runs."""
    start = parse_time(job.get("running_at"))
    if start is None:
        return "-"
    end = parse_time(job.get("finished_at"))
    if end is None:
        if job.get("status") in FINAL:
            return "-"
        end = now
    return duration(end - start)


def timestamp(value: str | None) -> str:
    """An API time for a history line: `2026-11-29 10:04:05Z`."""
    ts = parse_time(value)
    if ts is None:
        return "-"
    return datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def text(value) -> str:
    """One table cell: `-` for None, lists and maps written compactly, one line always."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        # A key whose value is null is left out: `skipped=None` says nothing to a person.
        return ",".join(f"{k}={text(v)}" for k, v in value.items() if v is not None) or "-"
    if isinstance(value, (list, tuple)):
        return ",".join(text(v) for v in value) or "-"
    return str(value).replace("\r", "\\r").replace("\n", "\\n").replace("\t", " ")


def styled(value, style: str | None = None) -> Text:
    """A cell as rich Text: never read as markup (a job name like `[bold]` stays itself)."""
    return Text(text(value), style=style or "")


def status_cell(status: str | None) -> Text:
    return styled(status, STATUS_STYLES.get(status or ""))


def table(headers: list[str], rows: list[list], *, wide: tuple[str, ...] = ()) -> Table:
    """An aligned table without borders (clean to read and to cut with awk). On a narrow
    terminal only the columns named in `wide` give way (wrapped at spaces, long words cut
    with an ellipsis); rich shrinks wrappable columns first, so the others keep their width."""
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for header in headers:
        t.add_column(header, no_wrap=header not in wide, overflow="ellipsis", min_width=len(header))
    for row in rows:
        t.add_row(*(cell if isinstance(cell, Text) else styled(cell) for cell in row))
    return t


def key_values(pairs: list[tuple[str, object]]) -> Table:
    """`key  value` lines, the values aligned."""
    t = Table(box=None, show_header=False, show_edge=False, pad_edge=False)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    for key, value in pairs:
        t.add_row(key, value if isinstance(value, Text) else styled(value))
    return t


def plain_box(t: Table) -> Table:
    """The same table for a pipe: the header line without the rule under it."""
    if t.box is not None:
        t.box = None
    return t


def render_plain(renderable) -> str:
    """What a pipe or a file gets: no colour, no wrapping, no trailing blanks."""
    if isinstance(renderable, Table):
        renderable = plain_box(renderable)
    buffer = io.StringIO()
    console = Console(file=buffer, width=PLAIN_WIDTH, color_system=None, force_terminal=False,
                      highlight=False, emoji=False, soft_wrap=False)
    console.print(renderable)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


def stdout_console() -> Console:
    return Console(highlight=False, emoji=False)


def emit(renderable, console: Console | None = None) -> None:
    """Print a table (or text) on stdout: with colour and fitted to a terminal, else plain."""
    console = console or stdout_console()
    if console.is_terminal:
        console.print(renderable)
    else:
        sys.stdout.write(render_plain(renderable))
        sys.stdout.flush()


def is_terminal() -> bool:
    return stdout_console().is_terminal
