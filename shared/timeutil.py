"""Time is stored as float seconds since the epoch and shown as ISO-8601 UTC."""
import datetime


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    dt = datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")
