"""A PostgreSQL service's URL and names: the parts of a postgresql:// URL, the URL
as it may be shown (no password), and a service's schema."""
from __future__ import annotations

from urllib.parse import parse_qs, unquote, urlsplit

from corral.shared.errors import SettingError


def schema_for(service: str) -> str:
    return f"corral_{service}"


def parse_url(url: str) -> dict:
    """The parts of a postgresql:// URL, or a SettingError (the password is never echoed).
    libpq reads the whole URL; these parts name the server in messages. A `host` in the
    query (a Unix socket's directory: postgresql://USER@/DATABASE?host=/run/postgresql)
    wins over the URL's, as in libpq."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise SettingError(f"DATABASE_URL is not a valid postgresql:// URL ({exc})") from None
    database = unquote(parts.path.lstrip("/"))
    if parts.scheme not in ("postgres", "postgresql") or not database or "/" in database:
        raise SettingError("DATABASE_URL must look like postgresql://USER:PASSWORD@HOST:PORT/DATABASE, "
                           f"got {redact(url)!r}")
    socket_dir = parse_qs(parts.query).get("host")
    return {"host": socket_dir[-1] if socket_dir else parts.hostname or "localhost", "port": port or 5432,
            "database": database, "user": unquote(parts.username) if parts.username else None}


def redact(url: str) -> str:
    """`url` without its password."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
