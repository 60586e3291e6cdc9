"""docs/settings.md, generated from the settings' definitions (the `Setting` tables).

    python scripts/settings_doc.py [PATH]     # or: make settings-doc

writes the file (PATH: docs/settings.md of this source tree); `--check` only
says whether it is current (exit 1 when not). tests/scripts/test_settings_doc.py fails
while the file and the definitions differ.
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import click

from corral.agent import settings as agent
from corral.cli.main import cli
from corral.registry import settings as registry
from corral.scheduler import oidc
from corral.scheduler import settings as scheduler

from corral.server import settings as server_settings
from corral.shared.settings import COMMON, Setting

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC_PATH = os.path.join(ROOT, "docs", "settings.md")
REGENERATE = "make settings-doc"
UNITS = {"KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3}


@dataclass(frozen=True)
class Section:
    title: str
    intro: str
    settings: Sequence[Setting] = ()
    outro: str = ""


PREAMBLE = f"""\
# Settings

Generated from the settings' definitions by `{REGENERATE}`
(`python scripts/settings_doc.py`); do not edit it by hand.

Every process reads environment variables; flags override some of them. A bad
value stops the process at start with one clear line and exit code 2. An empty
value is the same as an unset one. Booleans take `true`, `yes`, `on`, `1` or
`false`, `no`, `off`, `0`. A name given as "`A`, else `B`" reads `B` while `A`
is unset.
"""

DURABILITY = """\
What each `CORRAL_SQLITE_SYNCHRONOUS` mode keeps through a crash or a power loss, and
what lives beside a SQLite file: [operations.md](operations.md#durability-corral_sqlite_synchronous).
"""

SERVER_FLAGS = """\
## Server flags (`corral-registry`, `corral-scheduler`)

`--host`, `--port`, `--bind`, `--workers`, `--threads`, `--gunicorn-config`,
`--access-log`, `--certfile`, `--keyfile`, `--insecure` (`CORRAL_INSECURE`) and
`--init` (`CORRAL_DB_INIT`):
[operations.md](operations.md#settings-and-server-flags); `PROG --help` lists them too.
"""


def cli_settings() -> tuple[Setting, ...]:
    """The `corral` command's options that an environment variable sets (click's own
    definitions: cli/main.py)."""
    found = []
    for param in cli.params:
        if isinstance(param, click.Option) and isinstance(param.envvar, str):
            meaning = re.sub(r"\s*\[env [A-Z_]+\]\.?$", "", param.help or "").rstrip(".")
            if meaning[1:2].islower():
                meaning = meaning[:1].lower() + meaning[1:]
            default = param.default if isinstance(param.default, str) else None  # click's UNSET: none
            found.append(Setting(param.envvar, param.name or "", "text", default, meaning,
                                 form=f"`{param.metavar}`", flag=param.opts[0]))
    return tuple(found)


def sections() -> tuple[Section, ...]:
    return (
        Section("All processes", "Read by the registry, the scheduler and the agent.", COMMON),
        Section("Registry and scheduler", "Read by both servers; give both the same values unless said "
                "otherwise. The registry reads these, those of all processes and its own below.",
                server_settings.SERVERS, DURABILITY),
        Section("Registry (`corral-registry`)", "Besides those of both servers.", registry.SETTINGS),
        Section("Scheduler (`corral-scheduler`)", "Besides those of both servers.", scheduler.SETTINGS),
        Section("Scheduler: SQS and SNS", "Off while `SQS_URL` and `SNS_TOPIC_ARN` are unset; "
                "[sqs-sns.md](sqs-sns.md) describes both.", scheduler.AWS,
                "Credentials come from boto3's usual chain (environment, `~/.aws`, instance or task role).\n"),
        Section("Scheduler: single sign-on", "Off while `CORRAL_OIDC_ISSUER` is unset; "
                "[security.md](security.md#single-sign-on) describes it.", oidc.OIDC),
        Section("Agent (`corral-agent`)", "Besides `CORRAL_STATE_DIR` and `CORRAL_LOG_LEVEL` (above). "
                "A job's `memory_mb`, `cpu_percent` and `max_processes` may not exceed the node's maximums below.",
                tuple(s for s in agent.SETTINGS if s not in COMMON),
                "`corral-agent --once` registers, takes the jobs waiting for it, runs them to the end, reports "
                "and exits. `corral-agent --check` describes the node ([agent.md](agent.md)).\n"),
        Section("Command line (`corral`)", "Each also a flag of `corral` itself (before the command).",
                cli_settings()),
    )


def read_by(process: str) -> tuple[Setting, ...]:
    """Every setting `process` ("registry", "scheduler" or "agent") reads."""
    servers = COMMON + server_settings.SERVERS
    return {"registry": servers + registry.SETTINGS,
            "scheduler": servers + scheduler.SETTINGS + scheduler.AWS + oidc.OIDC,
            "agent": COMMON + tuple(s for s in agent.SETTINGS if s not in COMMON)}[process]


# ---- rendering ------------------------------------------------------------------------

def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _in_units(setting: Setting, value: float) -> str:
    """A large byte count or period also in a unit a person reads at a glance."""
    if setting.name.endswith("_BYTES") and value >= 1024 and value % 1024 == 0:
        unit = next(unit for unit in ("GiB", "MiB", "KiB") if value % UNITS[unit] == 0)
        return f" ({_number(value // UNITS[unit])} {unit})"
    if setting.name.endswith("_SECS") and value >= 86400 and value % 86400 == 0:
        days = value // 86400
        return f" ({_number(days)} day{'s' if days != 1 else ''})"
    return ""


def default_cell(setting: Setting) -> str:
    if setting.shown is not None:
        return setting.shown
    value = setting.default
    if value is None or value == "":
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (int, float)):
        return f"`{_number(value)}`" + _in_units(setting, value)
    return f"`{value}`"


def _bounds(setting: Setting) -> str:
    low, high = setting.minimum, setting.maximum
    if low is not None and high is not None:
        return f" {_number(low)}–{_number(high)}"
    if low is not None:
        return f" ≥ {_number(low)}"
    if high is not None:
        return f" ≤ {_number(high)}"
    if setting.above is not None:
        return f" > {_number(setting.above)}"
    return ""


def form_cell(setting: Setting) -> str:
    if setting.kind == "int":
        return "integer" + _bounds(setting)
    if setting.kind == "float":
        return ("seconds" if setting.name.endswith("_SECS") else "number") + _bounds(setting)
    if setting.kind == "bool":
        return "boolean"
    if setting.kind == "choice":
        return ", ".join(f"`{choice}`" for choice in setting.choices)
    if setting.kind == "urls":
        return "a URL, or several comma-separated"
    if setting.kind == "file":
        return "a readable file"
    return setting.form or "text"


def name_cell(setting: Setting) -> str:
    cell = ", else ".join(f"`{name}`" for name in setting.names)
    return cell + (f" (`{setting.flag}`)" if setting.flag else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_section(section: Section) -> str:
    lines = [f"## {section.title}", ""]
    if section.intro:
        lines += [section.intro, ""]
    if section.settings:
        lines += ["| name | default | value | meaning |", "|---|---|---|---|"]
        lines += [f"| {name_cell(s)} | {_cell(default_cell(s))} | {_cell(form_cell(s))} | {_cell(s.meaning)} |"
                  for s in section.settings]
        lines.append("")
    if section.outro:
        lines += [section.outro]
    return "\n".join(lines)


def render() -> str:
    return "\n".join([PREAMBLE, *(render_section(section) for section in sections()), SERVER_FLAGS])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    check = "--check" in args
    paths = [arg for arg in args if arg != "--check"]
    path = paths[0] if paths else DOC_PATH
    text = render()
    if check:
        try:
            with open(path) as f:
                current = f.read() == text
        except FileNotFoundError:
            current = False
        if not current:
            print(f"{path} is not what the settings' definitions give; run `{REGENERATE}`", file=sys.stderr)
        return 0 if current else 1
    with open(path, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
