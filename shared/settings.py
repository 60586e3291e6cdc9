"""Reading settings from the environment, with one clear error per bad value.

Each process has its own settings dataclass (registry/settings.py, ...) built
from these helpers, so that every variable is parsed and checked in one place.
"""
import os
from collections.abc import Mapping, Sequence

from .errors import SettingError

DEV_STATE_DIR = "./var"
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")


def env_str(env: Mapping[str, str], name: str, default: str | None) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return default
    return value.strip()


def env_int(env: Mapping[str, str], name: str, default: int, minimum: int | None = None,
            maximum: int | None = None) -> int:
    raw = env_str(env, name, None)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingError(f"{name} must be a whole number, got {raw!r}") from None
    _check_range(name, value, minimum, maximum)
    return value


def env_float(env: Mapping[str, str], name: str, default: float, minimum: float | None = None,
              maximum: float | None = None) -> float:
    raw = env_str(env, name, None)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(f"{name} must be a number, got {raw!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise SettingError(f"{name} must be a finite number, got {raw!r}")
    _check_range(name, value, minimum, maximum)
    return value


def env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env_str(env, name, None)
    if raw is None:
        return default
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise SettingError(f"{name} must be true or false, got {raw!r}")


def env_choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = env_str(env, name, None)
    if raw is None:
        return default
    if raw.upper() not in choices:
        raise SettingError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return raw.upper()


def env_file(env: Mapping[str, str], name: str) -> str | None:
    """The absolute path of a readable file (a CA bundle, say), or None when unset."""
    raw = env_str(env, name, None)
    if raw is None:
        return None
    path = os.path.abspath(raw)
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise SettingError(f"{name} must be a readable file, got {raw!r}")
    return path


def split_urls(value: str | Sequence[str]) -> list[str]:
    """A service's base URLs from `http://a:9001,http://b:9001` (or a list of them),
    in order, without trailing slashes. ValueError when there is none."""
    items = value.split(",") if isinstance(value, str) else list(value)
    urls = [item.strip().rstrip("/") for item in items if item.strip().rstrip("/")]
    if not urls:
        raise ValueError(f"no URL in {value!r}")
    return urls


def env_urls(env: Mapping[str, str], name: str, default: str) -> str:
    """One http(s):// base URL, or several of replicas of one service, comma-separated
    (each checked); given back comma-joined without trailing slashes, as the clients
    (shared/clients.py) take it."""
    raw = env_str(env, name, default) or default
    problem = f"{name} must be an http:// or https:// URL, or several comma-separated; got {raw!r}"
    try:
        urls = split_urls(raw)
    except ValueError:
        raise SettingError(problem) from None
    if not all(url.startswith(("http://", "https://")) for url in urls):
        raise SettingError(problem)
    return ",".join(urls)


def _check_range(name, value, minimum, maximum):
    if minimum is not None and value < minimum:
        raise SettingError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise SettingError(f"{name} must be at most {maximum}, got {value}")


def state_dir(env: Mapping[str, str]) -> str:
    return os.path.abspath(env_str(env, "CORRAL_STATE_DIR", DEV_STATE_DIR))


def database_url(env: Mapping[str, str], filename: str) -> str:
    """The service's own DATABASE_URL; else CORRAL_DATABASE_URL, which both services
    fall back on (one PostgreSQL database, each service in a schema of its own); else
    a SQLite file named `filename` under the state dir (a file per service)."""
    url = env_str(env, "DATABASE_URL", None)
    if url:
        return url
    shared = env_str(env, "CORRAL_DATABASE_URL", None)
    if shared:
        if shared.startswith("sqlite"):
            # Both services have a `node` table: in one SQLite file they would collide.
            raise SettingError("CORRAL_DATABASE_URL is shared by the registry and the scheduler, so it must be a "
                               "postgresql:// URL; for SQLite leave it unset (a file per service under "
                               "CORRAL_STATE_DIR) or give each service its own DATABASE_URL")
        return shared
    return "sqlite:///" + os.path.join(state_dir(env), filename)


def sqlite_synchronous(env: Mapping[str, str]) -> str:
    return env_choice(env, "CORRAL_SQLITE_SYNCHRONOUS", "NORMAL", SYNCHRONOUS_MODES)
