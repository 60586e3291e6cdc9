"""The scheduling flags of `corral job run` (constraints, pool, priority, start time,
dependencies, arrays, concurrency keys, its timeout and the signals of its end) and of
`corral job list` (times):
their syntax, checked before anything is sent, and how the scheduler's reasons for a
job's waiting read for people."""
import datetime
import re
from typing import Callable

import click

from corral.shared import wire
from corral.shared.limits import RESOURCE_NAME_PATTERN

from .common import CliError

NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"  # labels, pools and concurrency keys, as the API takes them
NAME_WHAT = "letters, digits, '.', '_' or '-' (at most 128)"
NAME_RULE = "must be " + NAME_WHAT
CONSTRAINT_SYNTAX = "LABEL=V, LABEL!=V, LABEL:in=A,B, LABEL:not_in=A,B, LABEL:exists or LABEL:not_exists"
# A label has no '=', '!' or ':', so whatever follows it is the operator: `a=b:in=c` is a = "b:in=c".
CONSTRAINT_RE = re.compile(rf"(?P<label>{NAME})(?:(?P<op>!?=)(?P<value>.*)|:(?P<list_op>in|not_in)=(?P<values>.*)"
                           rf"|:(?P<flag_op>exists|not_exists))", re.S)
RELATIVE_RE = re.compile(r"\+([0-9]{1,9})([smhd])")
UNIT_SECS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_DELAY_SECS = 366 * 86400  # the scheduler takes a start at most a year (and a day) ahead
DEPENDENCY_RE = re.compile(r"(job-[1-9][0-9]{0,17})(?::(done|failed|finished))?")
PENDING_REASONS = ("placed", "no_healthy_node", "constraints_unmet", "no_capacity", "pinned_node_unavailable",
                   "scheduled", "backoff", "dependency", "array_throttle", "concurrency_limit", "draining",
                   "node_refusing_work")
MAX_PRIORITY = 100
MAX_ARRAY = 10_000
MAX_CONCURRENCY_LIMIT = 100_000


class Checked(click.ParamType):
    """A flag's value read by `parse`; a ValueError becomes one line, `corral: --flag 'value': why`,
    and exit code 2, before anything is sent."""

    name = "value"

    def __init__(self, parse: Callable[[str], object], metavar: str):
        self.parse, self.metavar = parse, metavar

    def get_metavar(self, param, ctx=None) -> str:
        return self.metavar

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return self.parse(value)
        except ValueError as exc:
            flag = param.opts[0] if isinstance(param, click.Option) else (param.human_readable_name if param else "")
            raise CliError(f"{flag} {value!r}: {exc}", exit_code=2) from None


def usage_error(message: str) -> CliError:
    """A flag that does not fit the others: one line, exit code 2."""
    return CliError(message, exit_code=2)


def parse_constraint(text: str) -> dict:
    m = CONSTRAINT_RE.fullmatch(text)
    if m is None:
        raise ValueError(f"a constraint is {CONSTRAINT_SYNTAX} (LABEL: {NAME_WHAT})")
    label = m["label"]
    if m["op"]:
        if m["value"].startswith("="):
            # `zone==a` would ask for the value "=a", which no node has: the job would wait forever.
            raise ValueError(f"equality is one '=': {label}{m['op']}{m['value'].lstrip('=')}")
        return {"label": label, "op": m["op"], "value": m["value"]}
    if m["list_op"]:
        values = m["values"].split(",")
        if not all(values):
            raise ValueError(f"{m['list_op']} takes values separated by commas, none of them empty")
        if any(value.startswith("=") for value in values):
            raise ValueError(f"a value may not start with '=': {label}:{m['list_op']}=A,B")
        return {"label": label, "op": m["list_op"], "value": values}
    return {"label": label, "op": m["flag_op"]}


def constraint_text(constraint: dict) -> str:
    """A constraint of a job's answer as --constraint takes it."""
    label, op, value = constraint.get("label"), constraint.get("op"), constraint.get("value")
    if op in ("=", "!="):
        return f"{label}{op}{value}"
    if op in ("in", "not_in"):
        return f"{label}:{op}=" + ",".join(str(v) for v in value or [])
    return f"{label}:{op}"


def parse_name(text: str) -> str:
    if not re.fullmatch(NAME, text):
        raise ValueError(NAME_RULE)
    return text


TEAM = Checked(parse_name, "TEAM")  # a team's name is what a label's may be


def parse_resource(text: str) -> tuple[str, int]:
    """--resource: NAME=N, a resource of the node's agent's AGENT_RESOURCES and how many."""
    name, sep, count = text.partition("=")
    if not sep or not re.fullmatch(RESOURCE_NAME_PATTERN, name.strip()) or not re.fullmatch(r"[0-9]{1,13}",
                                                                                              count.strip()):
        raise ValueError("give NAME=N: a lower-case name (letters, digits, '_', '.', '-') and a whole number")
    return name.strip(), int(count)


def parse_priority(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,3}", text.strip()) or int(text) > MAX_PRIORITY:
        raise ValueError(f"the priority is a whole number from 0 to {MAX_PRIORITY}")
    return int(text)


def parse_start(text: str) -> dict:
    """--at: `run_at` (an ISO-8601 time with a zone) or `delay_secs` (`+30s`, `+10m`, `+2h`, `+1d`)."""
    relative = RELATIVE_RE.fullmatch(text)
    if relative:
        secs = int(relative[1]) * UNIT_SECS[relative[2]]
        if secs > MAX_DELAY_SECS:
            raise ValueError("at most a year ahead")
        return {"delay_secs": secs}
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError("give an ISO-8601 time with a zone (2026-12-24T02:00:00Z) "
                         "or a delay (+30s, +10m, +2h, +1d)") from None
    if when.tzinfo is None:
        raise ValueError("the time needs a zone: end it with Z or an offset such as +01:00")
    return {"run_at": text}


DURATION_RE = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,3})?)([smhd]?)")


def parse_duration(text: str) -> float:
    """--timeout: seconds, or with a unit: 90, 90s, 15m, 2h, 1d (more than 0)."""
    m = DURATION_RE.fullmatch(text.strip())
    if m is None or float(m[1]) <= 0:
        raise ValueError("a duration more than 0: seconds (90) or with a unit: 90s, 15m, 2h, 1d")
    secs = float(m[1]) * UNIT_SECS[m[2] or "s"]
    return int(secs) if secs == int(secs) else secs


def parse_grace(text: str) -> float:
    """--kill-grace: a duration as --timeout takes it, or 0 (SIGKILL at once)."""
    m = DURATION_RE.fullmatch(text.strip())
    if m is None:
        raise ValueError("a duration: seconds (30) or with a unit: 30s, 2m; 0 for none")
    secs = float(m[1]) * UNIT_SECS[m[2] or "s"]
    return int(secs) if secs == int(secs) else secs


SIGNAL_NAMES = ", ".join(wire.JOB_SIGNALS)


def parse_signal(text: str) -> str:
    """--kill-signal: a signal's name, with or without SIG, in any case: USR1, SIGUSR1, usr1."""
    name = text.strip().upper()
    name = name.removeprefix("SIG")
    if name not in wire.JOB_SIGNALS:
        raise ValueError(f"a signal is one of {SIGNAL_NAMES} (SIG before it may be left out)")
    return name


def parse_signal_before_end(text: str) -> dict:
    """--signal SIG@DURATION (as Slurm's --signal=USR1@60): `signal_before_end`, the signal
    sent DURATION before the job's timeout."""
    name, at, when = text.partition("@")
    if not at:
        raise ValueError("give SIG@DURATION: the signal and how long before the end, such as USR1@60s")
    try:
        secs = parse_duration(when)
    except ValueError:
        raise ValueError("after '@', a duration more than 0: seconds (60) or with a unit: 60s, 5m, 1h") from None
    return {"signal": parse_signal(name), "secs": secs}


def parse_since(text: str) -> dict:
    """--since and --until: a time ago (`30m`, `2h`, `1d`: {"ago": secs}) or an ISO-8601
    time with a zone ({"at": text}); the command turns `ago` into a time with its clock."""
    try:
        return {"ago": parse_duration(text)}
    except ValueError:
        pass
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError("give a time ago (30m, 2h, 1d) or an ISO-8601 time with a zone "
                         "(2026-12-24T02:00:00Z)") from None
    if when.tzinfo is None:
        raise ValueError("the time needs a zone: end it with Z or an offset such as +01:00")
    return {"at": text}


def parse_dependency(text: str) -> dict:
    m = DEPENDENCY_RE.fullmatch(text)
    if m is None:
        raise ValueError("a dependency is JOB or JOB:done, JOB:failed or JOB:finished (JOB such as job-7)")
    return {"job_id": m[1], "condition": m[2] or "done"}


def parse_count(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not re.fullmatch(r"[0-9]{1,9}", text.strip()) or not low <= int(text) <= high:
            raise ValueError(f"a whole number from {low} to {high}")
        return int(text)
    return parse


def choice(*choices: str) -> Checked:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError("one of " + ", ".join(choices))
        return text
    return Checked(parse, "[" + "|".join(choices) + "]")


def scheduling_fields(start: dict | None, after: tuple[dict, ...], on_dependency_failure: str | None,
                      array: int | None, parallel: int | None) -> dict:
    """The request fields of the flags only a submission has (only those given); the
    other scheduling flags are job options (job_options.py)."""
    if parallel is not None and array is None:
        raise usage_error("--parallel goes with --array N")
    if parallel is not None and array is not None and parallel > array:
        raise usage_error(f"--parallel {parallel}: at most the --array count ({array})")
    if on_dependency_failure is not None and not after:
        raise usage_error("--on-dependency-failure goes with --after JOB")
    fields: dict[str, object] = {}
    if after:
        fields["depends_on"] = list(after)
    if array is not None:
        fields["array"] = {"count": array} if parallel is None else {"count": array, "parallel": parallel}
    fields.update(start or {})
    if on_dependency_failure is not None:
        fields["on_dependency_failure"] = on_dependency_failure
    return fields


def reason_text(reason: dict | None) -> str | None:
    """`code: message` of a pending reason; None when the job does not wait."""
    if not reason:
        return None
    return f"{reason.get('code')}: {reason.get('message')}"


def reason_details(reason: dict | None) -> str | None:
    """The reason's other fields (`key=value, …`), None when it has none."""
    # A detail whose value is null is left out, not shown as `key=None`.
    details = {k: v for k, v in (reason or {}).items() if k not in ("code", "message") and v is not None}
    if not details:
        return None
    parts = []
    for key, value in details.items():
        if isinstance(value, list):
            value = ",".join(constraint_text(v) if isinstance(v, dict) and "op" in v else str(v) for v in value)
        elif isinstance(value, dict):
            value = constraint_text(value) if "op" in value else ",".join(f"{k}={v}" for k, v in value.items()
                                                                          if v is not None)
        parts.append(f"{key}={value}")
    return ", ".join(parts)
