"""Settings: each environment variable defined once, as a `Setting` (name, fallback
names, field, kind, default, bounds, a one-line meaning), and read with one clear
error per bad value ("MAX_JOB_RETRIES must be at most 20, got 99").

Each process's table sits beside its settings dataclass; `read_all` reads one, and
docs/settings.md is generated from them (scripts/settings_doc.py).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.shared.errors import SettingError

DEV_STATE_DIR = "./var"
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# What a Setting's value is, as the parsers below read it. `text` is the raw string,
# or what the setting's `parse` makes of it.
KINDS = ("int", "float", "bool", "choice", "text", "urls", "file")


# A table of our own rather than pydantic-settings: its parsers give the one-line
# errors operators and tests rely on, where pydantic reports several lines per error,
# would need aliases for the fallback names, and a model beside the frozen dataclasses
# the code builds with keyword arguments; this table is plain data the doc generator prints.
@dataclass(frozen=True)
class Setting:
    """One environment variable: how it is read, checked and documented."""

    name: str
    field: str                     # the settings field it fills
    kind: str                      # one of KINDS
    default: Any                   # the value when unset; a callable is computed at start
    meaning: str                   # one line, for docs/settings.md
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None     # a lower bound the value must exceed (a period that cannot be 0)
    choices: tuple[str, ...] = ()
    fallbacks: tuple[str, ...] = ()  # names read in order while the ones before are unset
    # `text` settings: (name read, value) -> the field's value; raises SettingError.
    # It gets a text default too (`70000-79999` -> (70000, 79999)).
    parse: Callable[[str, str], Any] | None = None
    form: str = ""                 # `text` settings: what a value looks like, for the docs
    shown: str | None = None       # the default as the docs say it, when the value does not
    flag: str | None = None        # the command-line flag that overrides it

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: unknown kind {self.kind!r}")

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.fallbacks)

    def source(self, env: Mapping[str, str]) -> str:
        """The name the value is read from: the first of `names` that is set."""
        return next((name for name in self.names if env_str(env, name, None) is not None), self.name)

    def is_set(self, env: Mapping[str, str]) -> bool:
        return any(env_str(env, name, None) is not None for name in self.names)

    def default_value(self) -> Any:
        """The field's value when no name of this setting is set."""
        default = self.default() if callable(self.default) else self.default
        if self.parse is not None and isinstance(default, str):
            return self.parse(self.name, default)
        return default

    def read(self, env: Mapping[str, str]) -> Any:
        """The field's value from `env`, checked; SettingError names the variable read."""
        name = self.source(env)
        if self.kind in ("int", "float"):
            if env_str(env, name, None) is None:
                return self.default_value()
            parse_number = env_int if self.kind == "int" else env_float
            value = parse_number(env, name, 0, self.minimum, self.maximum)
            if self.above is not None and value <= self.above:
                raise SettingError(f"{name} must be greater than {self.above:g}, got {value}")
            return value
        if self.kind == "bool":
            return env_bool(env, name, self.default_value())
        if self.kind == "choice":
            return env_choice(env, name, self.default_value(), self.choices)
        if self.kind == "urls":
            return env_urls(env, name, self.default_value())
        if self.kind == "file":
            return env_file(env, name)
        raw = env_str(env, name, None)
        if raw is None:
            return self.default_value()
        return self.parse(name, raw) if self.parse is not None else raw


def read_all(settings: Iterable[Setting], env: Mapping[str, str]) -> dict[str, Any]:
    """{field: value} of every setting, read in order (the first bad one raises)."""
    return {setting.field: setting.read(env) for setting in settings}


def by_name(settings: Iterable[Setting]) -> dict[str, Setting]:
    return {setting.name: setting for setting in settings}


def env_str(env: Mapping[str, str], name: str, default: str | None) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return default
    return value.strip()


def env_int(env: Mapping[str, str], name: str, default: int, minimum: float | None = None,
            maximum: float | None = None) -> int:
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
    # Case does not matter; the value is the choice as spelled in `choices`.
    chosen = next((choice for choice in choices if choice.upper() == raw.upper()), None)
    if chosen is None:
        raise SettingError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return chosen


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


def _absolute(name: str, value: str) -> str:
    return os.path.abspath(value)


def _shared_database_url(name: str, value: str) -> str:
    if value.startswith("sqlite"):
        # Both services have a `node` table: in one SQLite file they would collide.
        raise SettingError(f"{name} is shared by the registry and the scheduler, so it must be a "
                           "postgresql:// URL; for SQLite leave it unset (a file per service under "
                           "CORRAL_STATE_DIR) or give each service its own DATABASE_URL")
    return value


# ---- read by every process ----------------------------------------------------------

STATE_DIR = Setting(
    "CORRAL_STATE_DIR", "state_dir", "text", DEV_STATE_DIR,
    "SQLite files, metrics files and the agents' work dirs (under `agent-<node_id>/`); the flag is the "
    "agent's", parse=_absolute, form="a directory", shown="`./var` (the systemd units: `/var/lib/corral`)",
    flag="--state-dir")
# Read by control-plane/server/serve.py and agent/cli.py.
LOG_LEVEL = Setting("CORRAL_LOG_LEVEL", "log_level", "choice", "INFO",
                    "how much the process logs; the flag is the agent's", choices=LOG_LEVELS, flag="--log-level")
COMMON = (STATE_DIR, LOG_LEVEL)

# ---- the registry's and the scheduler's database ---------------------------------------

DATABASE_URL = Setting(
    "DATABASE_URL", "database_url", "text", None,
    "this service's peewee database URL, `sqlite:///PATH` or `postgresql://…` (with SQLite, writers queue "
    "on `<file>-writers.lock` beside it and migrations on `<file>-migrate.lock`; the scheduler's workers "
    "also keep `<file>-wake/`, a socket each to wake waiting claims)",
    form="a database URL",
    shown="`CORRAL_DATABASE_URL`, else `sqlite:///$CORRAL_STATE_DIR/registry.db` (the scheduler: `scheduler.db`)")
SHARED_DATABASE_URL = Setting(
    "CORRAL_DATABASE_URL", "database_url", "text", None,
    "the registry's and the scheduler's database when their own `DATABASE_URL` is unset: one "
    "`postgresql://` database for both, each service in its own schema (`corral_registry`, "
    "`corral_scheduler`); a `sqlite://` URL here is refused (both have a `node` table)",
    parse=_shared_database_url, form="a `postgresql://` URL")
SQLITE_SYNCHRONOUS = Setting(
    "CORRAL_SQLITE_SYNCHRONOUS", "sqlite_synchronous", "choice", "NORMAL",
    "SQLite's `synchronous`: `NORMAL` survives any process crash, `FULL` also a power loss (see "
    "\"Durability\" below)", choices=SYNCHRONOUS_MODES)
DATABASE = (DATABASE_URL, SHARED_DATABASE_URL, SQLITE_SYNCHRONOUS)


def state_dir(env: Mapping[str, str]) -> str:
    return STATE_DIR.read(env)


def database_url(env: Mapping[str, str], filename: str) -> str:
    """The service's own DATABASE_URL; else CORRAL_DATABASE_URL, which both services
    fall back on (one PostgreSQL database, each service in a schema of its own); else
    a SQLite file named `filename` under the state dir (a file per service)."""
    return (DATABASE_URL.read(env) or SHARED_DATABASE_URL.read(env)
            or "sqlite:///" + os.path.join(state_dir(env), filename))


def sqlite_synchronous(env: Mapping[str, str]) -> str:
    return SQLITE_SYNCHRONOUS.read(env)
