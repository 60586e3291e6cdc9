"""The settings' definitions (the `Setting` tables) against docs/settings.md, the
settings dataclasses and what each process really reads."""
import dataclasses
import os
import subprocess

import pytest

from cluster import BIN
from corral.agent import cli as agent_cli
from corral.agent.settings import AgentSettings
from corral.registry.settings import RegistrySettings
from corral.scheduler.settings import SchedulerSettings
import settings_doc
from corral.server import auth, metrics, worker
from corral.shared.credentials import TOKENS, Credentials
from corral.server.db import POOL, DatabaseOptions
from corral.shared.errors import SettingError
from corral.server.settings import INSECURE, METRICS_DIR, REQUEST_READ_TIMEOUT
from corral.shared.settings import LOG_LEVELS, Setting

ALL = [setting for section in settings_doc.sections() for setting in section.settings]
# What each process's from_env reads (the rest of the servers' settings are read where they act).
FROM_ENV = {
    RegistrySettings: settings_doc.read_by("registry"),
    SchedulerSettings: settings_doc.read_by("scheduler"),
    AgentSettings: settings_doc.read_by("agent"),
}
NOT_FROM_ENV = {"CORRAL_LOG_LEVEL", REQUEST_READ_TIMEOUT.name, INSECURE.name, METRICS_DIR.name}
# A valid node id, so that the agent gets past it to the setting under test.
BASE = {AgentSettings: {"NODE_ID": "n1"}}


def test_docs_settings_md_is_generated_from_the_definitions():
    with open(settings_doc.DOC_PATH) as f:
        current = f.read()
    assert current == settings_doc.render(), (
        f"docs/settings.md differs from the settings' definitions: run `{settings_doc.REGENERATE}` and commit it")


def test_the_check_mode_tells_a_stale_file(tmp_path, capsys):
    path = str(tmp_path / "settings.md")
    assert settings_doc.main([path]) == 0 and settings_doc.main(["--check", path]) == 0
    with open(path, "a") as f:
        f.write("edited by hand\n")
    assert settings_doc.main(["--check", path]) == 1
    assert settings_doc.REGENERATE in capsys.readouterr().err


@pytest.mark.parametrize("setting", ALL, ids=lambda s: s.name)
def test_every_setting_has_a_meaning_a_default_and_a_form(setting):
    assert setting.meaning.strip() and "\n" not in setting.meaning and not setting.meaning.endswith(".")
    assert settings_doc.default_cell(setting).strip()
    assert settings_doc.form_cell(setting).strip()
    if setting.kind in ("int", "float") and setting.default is None:
        assert setting.shown, "an unset number must say what it stands for"
    if callable(setting.default):
        assert setting.shown, "a default computed at start must say how"


def test_each_name_is_defined_once_per_process():
    for process in ("registry", "scheduler", "agent"):
        names = [name for setting in settings_doc.read_by(process) for name in setting.names
                 if name not in ("AWS_ENDPOINT_URL",)]  # the fallback of both endpoints
        assert len(names) == len(set(names)), process


class Recording(dict):
    """An environment that notes every name looked up."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.looked_up: set[str] = set()

    def get(self, key, default=None):
        self.looked_up.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.looked_up.add(key)
        return super().__getitem__(key)


@pytest.mark.parametrize("cls", FROM_ENV, ids=lambda c: c.__name__)
def test_from_env_reads_every_variable_of_its_table_and_no_other(cls):
    env = Recording(BASE.get(cls, {}))
    cls.from_env(env)
    table = {name for setting in FROM_ENV[cls] for name in setting.names} - NOT_FROM_ENV
    assert table - env.looked_up == set()
    defined = {name for setting in ALL for name in setting.names}
    assert env.looked_up - defined == set()


def _beyond(setting: Setting) -> list[str]:
    """Values of `setting` that its bounds or kind refuse."""
    values = []
    if setting.kind in ("int", "float", "bool"):
        values.append("x")
    if setting.kind == "choice":
        values.append("nope")
    if setting.minimum is not None:
        values.append(settings_doc._number(setting.minimum - 1))
    if setting.maximum is not None:
        values.append(settings_doc._number(setting.maximum + 1))
    if setting.above is not None:
        values.append(str(setting.above))
    return values


CASES = [(cls, setting, value) for cls, table in FROM_ENV.items() for setting in table
         if setting.name not in NOT_FROM_ENV for value in _beyond(setting)]


@pytest.mark.parametrize("cls, setting, value", CASES,
                         ids=[f"{c.__name__}-{s.name}={v}" for c, s, v in CASES])
def test_a_value_out_of_bounds_is_one_error_naming_the_setting(cls, setting, value):
    with pytest.raises(SettingError) as refused:
        cls.from_env({**BASE.get(cls, {}), setting.name: value})
    assert refused.value.message.startswith(setting.name + " must be ")
    assert "\n" not in refused.value.message


def _field_defaults(cls) -> dict:
    found = {}
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            found[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            found[field.name] = field.default_factory()
    return found


# Computed from another setting at start; the dataclass's own default serves tests.
COMPUTED = {"AGENT_ADDRESS"}


@pytest.mark.parametrize("cls, table", [
    (RegistrySettings, settings_doc.read_by("registry")), (SchedulerSettings, settings_doc.read_by("scheduler")),
    (AgentSettings, settings_doc.read_by("agent")), (DatabaseOptions, POOL), (Credentials, TOKENS),
], ids=lambda x: getattr(x, "__name__", ""))
def test_the_dataclasses_defaults_are_the_definitions(cls, table):
    defaults = _field_defaults(cls)
    compared = 0
    for setting in table:
        if setting.field in defaults and not callable(setting.default) and setting.name not in COMPUTED:
            assert defaults[setting.field] == setting.default_value(), setting.name
            compared += 1
    assert compared


def _refusal(read, env) -> str:
    with pytest.raises(SettingError) as refused:
        read(env)
    return refused.value.message


def test_the_settings_read_outside_from_env_match_their_definitions():
    assert worker.read_timeout_secs({}) == REQUEST_READ_TIMEOUT.default
    for value in _beyond(REQUEST_READ_TIMEOUT):
        env = {REQUEST_READ_TIMEOUT.name: value}
        assert _refusal(worker.read_timeout_secs, env) == _refusal(REQUEST_READ_TIMEOUT.read, env)
    for value in ("1", "no", ""):
        env = {INSECURE.name: value}
        assert auth.insecure_allowed(env) == INSECURE.read(env)
    assert metrics.MULTIPROC_ENV == METRICS_DIR.name
    assert tuple(agent_cli.LOG_LEVELS) == LOG_LEVELS


def test_the_agents_flags_are_those_of_its_settings():
    flags = {setting.name: setting.flag for setting in settings_doc.read_by("agent") if setting.flag}
    assert {name: "--" + dest.replace("_", "-") for dest, name in agent_cli.FLAG_ENV.items()} == \
        {name: flag for name, flag in flags.items() if name != "CORRAL_LOG_LEVEL"}


@pytest.mark.parametrize("program, env, line", [
    ("corral-scheduler", {"MAX_JOB_RETRIES": "99"}, "MAX_JOB_RETRIES must be at most 20, got 99"),
    ("corral-registry", {"CORRAL_DB_POOL_SIZE": "0"}, "CORRAL_DB_POOL_SIZE must be at least 1, got 0"),
    ("corral-agent", {"NODE_ID": "n1", "AGENT_SLOTS": "zero"}, "AGENT_SLOTS must be a whole number, got 'zero'"),
    ("corral-registry", {"CORRAL_LOG_LEVEL": "loud"},
     "CORRAL_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got 'loud'"),
    ("corral-agent", {"NODE_ID": "n1", "CORRAL_LOG_LEVEL": "loud"},
     "CORRAL_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got 'loud'"),
])
@pytest.mark.slow
def test_a_bad_setting_stops_the_process_with_one_line_and_exit_2(tmp_path, program, env, line):
    full = {"PATH": os.environ.get("PATH", ""), "CORRAL_STATE_DIR": str(tmp_path), **env}
    done = subprocess.run([os.path.join(BIN, program)], env=full, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert (done.returncode, done.stderr) == (2, f"{program}: error: {line}\n")
