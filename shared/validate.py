"""Names and environment variables as every part of Corral checks them: the request
models (shared/contract.py), the agent and the settings. Pure.

Each pattern is written once, as JSON Schema and pydantic read it (`$` is the end of
the text); the compiled form says the same to Python's re (`\\Z`: "node-1\\n" is no name).
"""
import re
from collections.abc import Iterable

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,255}$"


def whole_text(pattern: str) -> re.Pattern:
    """A pattern ending in `$` (the end of the text) compiled for Python's re."""
    return re.compile(pattern.removesuffix("$") + r"\Z")


NAME_RE = whole_text(NAME_PATTERN)
ENV_NAME_RE = whole_text(ENV_NAME_PATTERN)
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
