"""Small checks for JSON request bodies. Each raises BadRequest naming the field.

JSON `null` counts as "not given" for optional fields. Booleans are not
accepted where a number is expected (in Python `True` is an int).
"""
import re
from collections.abc import Iterable

from .errors import BadRequest

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}\Z")
# Variables a job may not set: they make the dynamic loader run code of the job's
# choosing inside every program started with them. Nothing privileged runs with a
# job's environment, so this is defence in depth; LD_LIBRARY_PATH stays allowed
# (CUDA and conda jobs need it). Refused at submit and again by the agent.
FORBIDDEN_ENV_VARS = ("LD_PRELOAD", "LD_AUDIT")


def forbidden_env_var(names: Iterable[str]) -> str | None:
    """The first name in `names` a job may not set (FORBIDDEN_ENV_VARS), or None."""
    for name in names:
        if name in FORBIDDEN_ENV_VARS:
            return name
    return None


def reject_unknown(body: dict, allowed: Iterable[str]) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}; allowed fields: {', '.join(sorted(allowed))}")


def opt_str(body: dict, name: str, max_len: int = 1024, pattern: re.Pattern | None = None,
            what: str = "") -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{name!r} must be a string")
    if value == "":
        raise BadRequest(f"{name!r} must not be empty")
    if len(value) > max_len:
        raise BadRequest(f"{name!r} is longer than {max_len} characters")
    if "\x00" in value:
        raise BadRequest(f"{name!r} must not contain NUL characters")
    if pattern is not None and not pattern.match(value):
        raise BadRequest(f"{name!r} must be {what or 'of the form ' + pattern.pattern}")
    return value


def req_str(body: dict, name: str, **kwargs) -> str:
    value = opt_str(body, name, **kwargs)
    if value is None:
        raise BadRequest(f"{name!r} is required")
    return value


def opt_int(body: dict, name: str, minimum: int, maximum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name!r} must be a whole number")
    if not minimum <= value <= maximum:
        raise BadRequest(f"{name!r} must be between {minimum} and {maximum}")
    return value


def req_int(body: dict, name: str, minimum: int, maximum: int) -> int:
    value = opt_int(body, name, minimum, maximum)
    if value is None:
        raise BadRequest(f"{name!r} is required")
    return value


def opt_bool(body: dict, name: str) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f"{name!r} must be true or false")
    return value


def str_map(body: dict, name: str, key_re: re.Pattern = NAME_RE, max_items: int = 256,
            max_value_len: int = 32 * 1024, key_what: str = "a name") -> dict[str, str]:
    """An optional JSON object of string to string (labels, env_vars)."""
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{name!r} must be an object of strings")
    if len(value) > max_items:
        raise BadRequest(f"{name!r} has more than {max_items} entries")
    for key, item in value.items():
        if not key_re.match(key):
            raise BadRequest(f"{name!r} key {key!r} is not {key_what}")
        if not isinstance(item, str):
            raise BadRequest(f"{name!r} value for {key!r} must be a string")
        if len(item) > max_value_len or "\x00" in item:
            raise BadRequest(f"{name!r} value for {key!r} is too long or contains NUL")
    return dict(value)
