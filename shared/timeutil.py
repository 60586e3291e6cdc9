"""Time is stored as float seconds since the epoch and shown as ISO-8601 UTC."""
import datetime


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    dt = datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def epoch(text: str | None) -> float | None:
    """ISO-8601 (as `iso` writes it) → epoch seconds; None for None or a value that is not a time."""
    if not text:
        return None
    try:
        dt = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    return dt.timestamp()
