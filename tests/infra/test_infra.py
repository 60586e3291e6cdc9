"""The deployment files in infra/: systemd units, gunicorn config, example env files."""
import ast
import os
import re
import runpy
import shutil
import signal
import socket
import subprocess

import pytest
import requests

from cluster import BIN, Proc, base_env, listening_socket
from helpers import free_port, wait_for
from paths import REPO, TESTS
from make_run import run_local, stop_local

INFRA = os.path.join(REPO, "infra")
UNITS = {name: os.path.join(INFRA, "systemd", f"corral-{name}.service")
         for name in ("registry", "scheduler", "agent")}
GUNICORN_CONF = os.path.join(INFRA, "gunicorn.conf.py")
INSTALL_BIN = "/opt/corral/venv/bin/"

# The source of each process; names read from the environment there must be in infra/env/<name>.env.
PROCESS_SOURCES = {
    "registry": os.path.join(REPO, "control-plane", "registry"),
    "scheduler": os.path.join(REPO, "control-plane", "scheduler"),
    "agent": os.path.join(REPO, "agent"),
}
# The common code the processes call into: shared/ (every process) and the servers' own.
COMMON_SOURCES = [os.path.join(REPO, "shared"), os.path.join(REPO, "control-plane", "server")]
# In the env files but read by the systemd unit (ExecStart=), not by Corral's code.
UNIT_ONLY_VARS = {"registry": {"CORRAL_SERVER_FLAGS"}, "scheduler": {"CORRAL_SERVER_FLAGS"}, "agent": set()}


# ---- helpers -------------------------------------------------------------------

def read_unit(path: str) -> dict[str, dict[str, list[str]]]:
    """A unit file as {section: {key: [values...]}} (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    with open(path) as f:
        for raw in f:
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                current = sections.setdefault(line[1:-1], {})
                continue
            key, _, value = line.partition("=")
            current.setdefault(key.strip(), []).append(value.strip())
    return sections


def service(name: str) -> dict[str, str]:
    """The [Service] section of a unit, last value of each key."""
    return {k: v[-1] for k, v in read_unit(UNITS[name])["Service"].items()}


def seconds(value: str) -> float:
    """A systemd time span such as `45`, `45s`, `1min 30s`."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


# A literal upper-case name read from the environment:
#   f(env, "NAME"  f(os.environ, "NAME"  env.get("NAME"  os.environ.get("NAME"  os.getenv("NAME"  environ["NAME"
ENV_READ_RE = re.compile(
    r"""(?:\(\s*(?:os\.)?(?:environ|env)\s*,\s*|\b(?:environ|env)\.get\(\s*|\bgetenv\(\s*|\benviron\[\s*)"""
    r"""["']([A-Z][A-Z0-9_]*)["']""")
CALL_RE = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def _py_files(directory: str) -> list[str]:
    return sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".py"))


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def shared_function_vars() -> dict[str, set[str]]:
    """For each function defined in shared/ or control-plane/server/, the environment variables
    it reads, directly or through the other such functions it calls."""
    bodies: dict[str, str] = {}
    for path in [p for directory in COMMON_SOURCES for p in _py_files(directory)]:
        source = _read(path)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                bodies[node.name] = bodies.get(node.name, "") + "\n" + ast.get_source_segment(source, node)
    reads = {name: set(ENV_READ_RE.findall(body)) for name, body in bodies.items()}
    calls = {name: set(CALL_RE.findall(body)) & bodies.keys() - {name} for name, body in bodies.items()}
    changed = True
    while changed:
        changed = False
        for name in bodies:
            merged = reads[name].union(*(reads[c] for c in calls[name]))
            if merged != reads[name]:
                reads[name], changed = merged, True
    return {name: names for name, names in reads.items() if names}


def vars_read_by(process: str) -> set[str]:
    """Every environment variable `process` reads: each of its settings' definitions
    (scripts/settings_doc.py; tests/scripts/test_settings_doc.py checks that they are read), and
    any read literally in its own modules or through a shared/ function they call
    (such as run_service)."""
    from settings_doc import read_by

    shared = shared_function_vars()
    names = {name for setting in read_by(process) for name in setting.names}
    for path in _py_files(PROCESS_SOURCES[process]):
        source = _read(path)
        names |= set(ENV_READ_RE.findall(source))
        for called in set(CALL_RE.findall(source)) & shared.keys():
            names |= shared[called]
    return names


def vars_documented_in(process: str) -> set[str]:
    """NAME of every `NAME=value` or `#NAME=value` line of infra/env/<process>.env."""
    text = _read(os.path.join(INFRA, "env", f"{process}.env"))
    return set(re.findall(r"^#?([A-Z][A-Z0-9_]*)=", text, re.MULTILINE))


# ---- systemd units ---------------------------------------------------------------

def test_systemd_analyze_verify_accepts_the_units(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian/Ubuntu package `systemd`); "
                    "it is needed to verify infra/systemd/*.service")
    # `verify` checks that ExecStart= binaries exist: point them at this venv's
    # console scripts instead of the install prefix /opt/corral/venv/bin.
    copies = []
    for name, path in UNITS.items():
        text = _read(path)
        assert INSTALL_BIN + "corral-" + name in text
        copy = tmp_path / os.path.basename(path)
        copy.write_text(text.replace(INSTALL_BIN, BIN + os.sep))
        copies.append(str(copy))
    result = subprocess.run([analyze, "verify", *copies], capture_output=True, text=True, timeout=60)
    output = (result.stdout + result.stderr).splitlines()
    # Anything said about our units (unknown keys, bad values, missing binaries) is a
    # failure; lines about the host's own units are not ours to fix.
    ours = [line for line in output if "corral-" in line or str(tmp_path) in line]
    assert result.returncode == 0, "\n".join(output)
    assert ours == [], "\n".join(ours)


@pytest.mark.parametrize("name", ["registry", "scheduler", "agent"])
def test_units_run_the_console_script_with_optional_env_file(name):
    svc = service(name)
    assert svc["ExecStart"].split()[0] == f"{INSTALL_BIN}corral-{name}"
    assert svc["EnvironmentFile"] == f"-/etc/corral/{name}.env"
    assert f"CORRAL_STATE_DIR=/var/lib/corral/{name}" in read_unit(UNITS[name])["Service"]["Environment"]
    assert svc["StateDirectory"] == f"corral/{name}"
    assert svc["KillSignal"] == "SIGTERM"
    assert read_unit(UNITS[name])["Install"]["WantedBy"] == ["multi-user.target"]
    if name != "agent":
        assert svc["User"] == "corral"
        assert svc["Restart"] == "on-failure"
        assert "--gunicorn-config /etc/corral/gunicorn.conf.py" in svc["ExecStart"]
        assert svc["ProtectSystem"] == "strict"
        assert svc["ReadWritePaths"] == f"/var/lib/corral/{name}"


def test_server_stop_timeout_outlasts_gunicorn_graceful_timeout():
    graceful = runpy.run_path(GUNICORN_CONF)["graceful_timeout"]
    for name in ("registry", "scheduler"):
        assert seconds(service(name)["TimeoutStopSec"]) >= graceful + 10, name


def test_agent_unit_lets_the_agent_end_its_jobs():
    from corral.agent.settings import AgentSettings

    svc = service("agent")
    assert "User" not in svc  # root: cgroups now, per-job users later
    assert svc["Delegate"] == "yes"
    # SIGTERM to the agent alone; it ends its run jobs itself, and services stay
    # running for the next agent to adopt (so systemd must not kill the rest).
    assert svc["KillMode"] == "process"
    assert svc["Restart"] == "always"
    assert svc["OOMPolicy"] == "continue"
    # The agent's stop: stop grace, then kill grace (+5 s to reap), then up to 5 s
    # flushing reports (agent.shutdown()); leave a margin on top.
    defaults = AgentSettings.from_env({"NODE_ID": "n"})
    needed = defaults.stop_grace + defaults.kill_grace + 10
    assert seconds(svc["TimeoutStopSec"]) >= needed + 5
    # Hardening the unit would restrict every job the agent runs.
    for key in ("ProtectSystem", "PrivateTmp", "NoNewPrivileges", "ProtectControlGroups"):
        assert key not in svc, key


# ---- gunicorn config -------------------------------------------------------------

def test_gunicorn_config_uses_only_known_settings():
    from gunicorn.config import Config

    values = {k: v for k, v in runpy.run_path(GUNICORN_CONF).items() if not k.startswith("__")}
    unknown = set(values) - set(Config().settings)
    assert not unknown, f"gunicorn ignores unknown settings silently: {sorted(unknown)}"
    from corral.agent.settings import AgentSettings
    from corral.server.serve import DEFAULTS
    assert values["worker_class"] == DEFAULTS["worker_class"] == "corral.server.worker.BufferingWorker"
    assert values["worker_connections"] == DEFAULTS["worker_connections"] >= 1000  # a thousand idle clients fit
    assert values["graceful_timeout"] == 30
    # An agent speaks every heartbeat interval on a kept-alive connection: a server that
    # closed idle connections after the same time would race it (RemoteDisconnected).
    agent = AgentSettings.from_env({"NODE_ID": "n"})
    assert values["keepalive"] == DEFAULTS["keepalive"] >= 2 * agent.heartbeat_interval
    assert values["control_socket_disable"] is True
    assert "bind" not in values  # shared by both servers: each passes its own address


@pytest.mark.e2e
def test_server_starts_with_the_gunicorn_config_and_notifies_systemd(tmp_path):
    # systemd's notify socket, played by the test: Type=notify in the units relies on
    # gunicorn sending READY=1 once it listens.
    notify_path = str(tmp_path / "notify.sock")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    notify.settimeout(30)
    sock = listening_socket()
    port = sock.getsockname()[1]
    env = base_env(str(tmp_path / "state"), NOTIFY_SOCKET=notify_path)
    argv = [os.path.join(BIN, "corral-registry"), "--gunicorn-config", GUNICORN_CONF,
            "--bind", f"fd://{sock.fileno()}"]
    proc = Proc("registry", argv, env, str(tmp_path / "registry.log"), pass_fds=(sock.fileno(),))
    sock.close()
    try:
        assert notify.recv(4096).startswith(b"READY=1"), proc.output()
        response = wait_for(lambda: requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2),
                            timeout=30, message="the registry to answer /healthz")
        assert response.status_code == 200, response.text
        assert "Using worker: corral.server.worker.BufferingWorker" in proc.output()
    finally:
        code = proc.stop(grace=40)
        notify.close()
    assert code == 0, proc.output()


def test_no_test_module_defines_a_test_twice():
    """A second test of the same name replaces the first, which then never runs."""
    twice = []
    for folder, _, files in sorted(os.walk(TESTS)):
        for name in sorted(files):
            if name.startswith("test_") and name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    tree = ast.parse(f.read())
                names = [node.name for node in tree.body
                         if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
                where = os.path.relpath(path, TESTS)
                twice += [f"{where}::{test}" for test in sorted(set(names)) if names.count(test) > 1]
    assert twice == []


# ---- example env files -------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("process", ["registry", "scheduler", "agent"])
def test_every_setting_is_in_the_example_env_file(process):
    read = vars_read_by(process)
    documented = vars_documented_in(process)
    assert "CORRAL_STATE_DIR" in read  # the scan itself works
    missing = read - documented
    assert not missing, f"add {sorted(missing)} to infra/env/{process}.env, with their defaults"
    stale = documented - read - UNIT_ONLY_VARS[process]
    assert not stale, f"infra/env/{process}.env documents {sorted(stale)}, which {process} does not read"


def test_env_read_scan_finds_each_form():
    source = '''
        a = s.env_int(env, "MAX_JOBS_PER_NODE", 1)
        b = env_choice(os.environ, "CORRAL_LOG_LEVEL", "INFO", LEVELS)
        c = os.environ.get("X_ONE")
        d = os.getenv('X_TWO')
        e = os.environ["X_THREE"]
        f = _url(env, "REGISTRY_URL", default)
        g = body.get("env_vars")
    '''
    assert set(ENV_READ_RE.findall(source)) == {
        "MAX_JOBS_PER_NODE", "CORRAL_LOG_LEVEL", "X_ONE", "X_TWO", "X_THREE", "REGISTRY_URL"}


def test_example_env_files_are_valid_environment_files():
    for process in PROCESS_SOURCES:
        for number, line in enumerate(_read(os.path.join(INFRA, "env", f"{process}.env")).splitlines(), 1):
            if line and not line.startswith("#"):
                assert re.match(r"^[A-Z][A-Z0-9_]*=", line), f"{process}.env:{number}: {line!r}"


# ---- scripts/run_local.py (make run) ---------------------------------------------



def _descendants(pid: int) -> list[int]:
    rows = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout.split("\n")
    children: dict[int, list[int]] = {}
    for row in rows:
        if row.split():
            child, parent = map(int, row.split())
            children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.e2e
def test_run_local_runs_a_job_and_stops_cleanly_on_ctrl_c(tmp_path):
    registry_port, scheduler_port = free_port(), free_port()
    proc, log = run_local(tmp_path, CORRAL_REGISTRY_PORT=registry_port, CORRAL_SCHEDULER_PORT=scheduler_port)
    output = lambda: open(log, errors="replace").read()  # noqa: E731
    try:
        wait_for(lambda: "Ctrl-C stops everything" in output() or proc.poll() is not None, timeout=60,
                 message="run_local to report the cluster ready")
        assert proc.poll() is None, output()
        assert f"localhost:{scheduler_port}/jobs" in output()
        url = f"http://127.0.0.1:{scheduler_port}"
        job = requests.post(url + "/jobs", json={"command": "echo hi"}, timeout=10).json()
        done = wait_for(lambda: (lambda j: j if j["status"] in ("done", "failed") else None)(
            requests.get(f"{url}/jobs/{job['job_id']}", timeout=10).json()), timeout=30,
            message="the job to finish")
        assert (done["status"], done["stdout"]) == ("done", "hi\n"), done
        # Output of every process arrives prefixed with its name.
        for name in ("registry", "scheduler", "node-1", "node-2"):
            assert f"[{name}] " in output(), name
        started = _descendants(proc.pid)  # servers, their workers, agents
        assert len(started) >= 4, output()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, output()
        text = output()
        # Agents first, then scheduler, then registry.
        assert text.index("stopping node-1, node-2") < text.index("stopping scheduler") < \
            text.index("stopping registry"), text
        assert not [pid for pid in started if _alive(pid)], f"left running: {started}"
    finally:
        stop_local(proc)


@pytest.mark.e2e
def test_stop_local_leaves_nothing_of_run_local_running(tmp_path):
    """What a failed test's clean-up does (no orderly stop): run_local, its servers, its
    agents and their jobs, a service included, all end; each runs in a session of its own."""
    scheduler_port = free_port()
    proc, log = run_local(tmp_path, CORRAL_REGISTRY_PORT=free_port(), CORRAL_SCHEDULER_PORT=scheduler_port)
    started: list[int] = []
    try:
        wait_for(lambda: "Ctrl-C stops everything" in open(log).read() or proc.poll() is not None, timeout=60,
                 message="run_local to report the cluster ready")
        url = f"http://127.0.0.1:{scheduler_port}"
        job = requests.post(url + "/jobs", json={"command": "exec sleep 300", "job_type": "service"},
                            timeout=10).json()
        wait_for(lambda: requests.get(f"{url}/jobs/{job['job_id']}", timeout=10).json()["status"] == "running",
                 timeout=60, message="the service to run")
        started = _descendants(proc.pid)
        assert len(started) >= 5, open(log).read()  # servers, their workers, agents, the service
    finally:
        stop_local(proc, grace=0)
    assert not [pid for pid in started if _alive(pid)], f"left running: {started}"


@pytest.mark.e2e
def test_run_local_runs_jobs_with_its_state_below_a_private_directory(tmp_path):
    """A checkout in a directory only its owner may enter (a home directory, `mktemp -d`)
    keeps `make run`'s state there: every job still runs in its work dir, though its uid
    cannot walk the path to it (the fork server enters it as root, before the drop)."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    scheduler_port = free_port()
    proc, log = run_local(tmp_path, state_dir=private / "var", CORRAL_REGISTRY_PORT=free_port(),
                          CORRAL_SCHEDULER_PORT=scheduler_port)
    output = lambda: open(log, errors="replace").read()  # noqa: E731
    try:
        wait_for(lambda: "Ctrl-C stops everything" in output() or proc.poll() is not None, timeout=60,
                 message="run_local to report the cluster ready")
        assert proc.poll() is None, output()
        url = f"http://127.0.0.1:{scheduler_port}"
        for n in range(3):
            job = requests.post(url + "/jobs", json={"command": f"echo {n} > mine.txt && cat mine.txt && pwd"},
                                timeout=10).json()
            done = wait_for(lambda: (lambda j: j if j["status"] in ("done", "failed") else None)(
                requests.get(f"{url}/jobs/{job['job_id']}", timeout=10).json()), timeout=60,
                message="the job to finish")
            assert done["status"] == "done", done
            assert done["stdout"].startswith(f"{n}\n{private}/var/agent-node-") and \
                done["stdout"].endswith(f"/work/{job['job_id']}-1\n"), done
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, output()
    finally:
        stop_local(proc)


@pytest.mark.e2e
def test_run_local_says_when_a_port_is_taken(tmp_path):
    sock = listening_socket()
    try:
        port = sock.getsockname()[1]
        proc, log = run_local(tmp_path, CORRAL_REGISTRY_PORT=port, CORRAL_SCHEDULER_PORT=free_port())
        try:
            code = proc.wait(30)
        finally:
            stop_local(proc, grace=0)
        text = open(log, errors="replace").read()
        assert code == 1, text
        assert f"port {port} (registry) is already in use" in text, text
        assert "CORRAL_REGISTRY_PORT" in text
    finally:
        sock.close()
