#!/usr/bin/env python3
"""Run a whole Corral cluster on this machine for development (`make run`).

Starts, from the virtualenv this script runs in:

- corral-registry on 127.0.0.1:$CORRAL_REGISTRY_PORT (default 9000),
- corral-scheduler on 127.0.0.1:$CORRAL_SCHEDULER_PORT (default 9001),
- two agents, NODE_ID=node-1 and node-2,

with their state under $CORRAL_STATE_DIR (default ./var of the repository). Every
other setting comes from the environment as usual (MAX_JOBS_PER_NODE=3 make run);
with CORRAL_DATABASE_URL=postgresql://... the registry and the scheduler keep their
tables in that PostgreSQL database (each in its own schema) instead of SQLite files.
Output of each process is shown prefixed with its name. When both servers answer
and both nodes are healthy, it prints how to submit a job.

With CORRAL_API_TOKEN and CORRAL_AGENT_TOKEN set, the servers take both, and each
agent gets its own node credential (CORRAL_NODE_TOKEN, derived here from the agent
secret) instead of the secret itself, which never leaves the servers; the banner
then shows how to give `corral` the operator token.

Ctrl-C or SIGTERM stops everything (agents first, then scheduler, then registry;
SIGTERM, then SIGKILL after a timeout or a second Ctrl-C) and exits 0. If a process dies on its own,
the rest are stopped and the exit status is 1.
"""
from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
HOST = "127.0.0.1"
NODES = ("node-1", "node-2")
READY_TIMEOUT = 60.0
SERVER_STOP_TIMEOUT = 40.0  # gunicorn's graceful_timeout is 30 s

_print_lock = threading.Lock()


class Flags:
    """Set by the signal handlers. Plain attributes, no locks: a handler runs in the
    main thread between any two bytecodes, and taking a lock the main thread holds at
    that moment (threading.Event.set, print) would deadlock it."""

    def __init__(self):
        self.stop = False    # first SIGINT/SIGTERM: stop everything in order
        self.hurry = False   # second one: SIGKILL what is left now
        self.received: list[str] = []

    def on_signal(self, signum, _frame) -> None:
        self.received.append(signal.Signals(signum).name)
        if self.stop:
            self.hurry = True
        self.stop = True


def sleep_unless(flag: Callable[[], bool], seconds: float) -> bool:
    """Sleep up to `seconds`, returning early (True) once flag() is true."""
    deadline = time.monotonic() + seconds
    while not flag():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(0.05, left))
    return True


def say(message: str, name: str = "run_local") -> None:
    with _print_lock:
        sys.stdout.write(f"[{name}] {message}\n")
        sys.stdout.flush()


class Child:
    """One process of the cluster, in a session of its own (a Ctrl-C at the terminal
    reaches only this script, which then stops the children in order)."""

    def __init__(self, name: str, argv: list[str], env: dict, pass_fds=(), stop_timeout: float = 30.0):
        self.name = name
        self.stop_timeout = stop_timeout
        self.popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, pass_fds=pass_fds, start_new_session=True)
        # Processes this child started (gunicorn workers, an agent's jobs, which run
        # in sessions of their own), as (pid, start time) so a reused pid is never
        # mistaken for one of them. Refreshed while the child runs.
        self.offspring: set[tuple[int, int]] = set()
        self.reader = threading.Thread(target=self._relay, name=f"output-{name}", daemon=True)
        self.reader.start()

    def _relay(self) -> None:
        prefix = f"[{self.name}] "
        for raw in iter(self.popen.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\r\n")
            with _print_lock:
                sys.stdout.write(prefix + line + "\n")
                sys.stdout.flush()
        self.popen.stdout.close()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def remember_offspring(self, tree: dict[int, list[int]] | None = None) -> None:
        if self.alive():
            self.offspring |= {(pid, started) for pid in descendants(self.popen.pid, tree)
                               if (started := start_time(pid)) is not None}

    def terminate(self) -> None:
        """SIGTERM to the main process only, as systemd's KillMode=mixed does: gunicorn's
        master stops its workers gracefully, an agent ends its jobs itself."""
        self.remember_offspring()
        if self.alive():
            try:
                os.kill(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def kill_leftovers(self) -> None:
        """SIGKILL the child if it still runs, and every process it started that is
        still there (what systemd does to a unit's cgroup once its main process exited)."""
        self.remember_offspring()
        if self.alive():
            _kill(lambda: os.killpg(self.popen.pid, signal.SIGKILL))  # the leader lives: the group is its own
            _kill(lambda: os.kill(self.popen.pid, signal.SIGKILL))
        for pid, started in self.offspring:
            if start_time(pid) == started:
                _kill(lambda pid=pid: os.kill(pid, signal.SIGKILL))

    def wait(self, timeout: float, flags: Flags) -> bool:
        """Wait up to `timeout` for the child to exit; give up early on a second signal."""
        sleep_unless(lambda: not self.alive() or flags.hurry, timeout)
        return not self.alive()


def _kill(send) -> None:
    try:
        send()
    except (ProcessLookupError, PermissionError):
        pass


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (field 3 onwards), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().decode(errors="replace").rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    fields = _proc_stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def process_tree() -> dict[int, list[int]]:
    """parent pid -> child pids of every process, from /proc (empty without /proc)."""
    children: dict[int, list[int]] = {}
    try:
        entries = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return children
    for entry in entries:
        fields = _proc_stat(entry)
        if fields and len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(entry)
    return children


def descendants(pid: int, tree: dict[int, list[int]] | None = None) -> list[int]:
    """Every live descendant of `pid`."""
    children = process_tree() if tree is None else tree
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop_all(children: list[Child], flags: Flags) -> None:
    """Agents first (they end and report their jobs), then scheduler, then registry.
    Each gets SIGTERM, then SIGKILL after its timeout or at a second Ctrl-C."""
    agents = [c for c in children if c.name not in ("scheduler", "registry")]
    groups = [agents] + [[c] for name in ("scheduler", "registry") for c in children if c.name == name]
    for group in groups:
        running = [c for c in group if c.alive()]
        if running:
            say("stopping " + ", ".join(c.name for c in running))
        for c in running:
            c.terminate()
        deadline = time.monotonic() + max((c.stop_timeout for c in running), default=0.0)
        for c in running:
            if not c.wait(max(0.0, deadline - time.monotonic()), flags):
                say(f"{c.name} did not stop {'yet' if flags.hurry else 'in time'}; killing it")
        for c in group:
            c.kill_leftovers()
            try:
                c.popen.wait(5)
            except subprocess.TimeoutExpired:
                say(f"{c.name} (pid {c.popen.pid}) is still there after SIGKILL")
    for c in children:
        c.reader.join(timeout=2)


def port_from_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        port = int(raw)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        say(f"error: {name} must be a port number between 1 and 65535, got {raw!r}")
        sys.exit(2)
    return port


def bind(port: int, what: str, env_name: str) -> socket.socket:
    """The listening socket for a server, made here so a busy port is one clear
    message (and passed to gunicorn as fd://N, so there is no race for it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            say(f"error: port {port} ({what}) is already in use on {HOST}; stop whatever "
                f"listens there (is another `make run` running?) or choose another port "
                f"with {env_name}=...")
        else:
            say(f"error: cannot listen on {HOST}:{port} for the {what}: {exc.strerror or exc}")
        sys.exit(1)
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def get_json(url: str, token: str | None = None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2) as response:
        return json.load(response)


# The servers' secrets: an agent gets its node's credential instead, and no operator token.
SERVER_ONLY = ("CORRAL_API_TOKEN", "CORRAL_AGENT_TOKEN", "CORRAL_AGENT_TOKEN_PREVIOUS", "CORRAL_READ_TOKEN")


def node_credentials(env: dict) -> dict[str, str] | None:
    """Each local node's credential (CORRAL_NODE_TOKEN) when the tokens are set, None
    without tokens; exits 2 with the servers' own message for a half-set configuration."""
    from corral.shared.credentials import server_credentials
    from corral.shared.errors import SettingError
    try:
        credentials = server_credentials(env)
    except SettingError as exc:
        say(f"error: {exc.message}")
        sys.exit(2)
    if not credentials.enabled:
        return None
    return {node: credentials.node_token(node) for node in NODES}


def answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.status == 200


def main() -> int:
    registry_port = port_from_env("CORRAL_REGISTRY_PORT", 9000)
    scheduler_port = port_from_env("CORRAL_SCHEDULER_PORT", 9001)
    if registry_port == scheduler_port:
        say("error: CORRAL_REGISTRY_PORT and CORRAL_SCHEDULER_PORT must differ")
        return 2
    scripts = {name: os.path.join(BIN, name) for name in ("corral-registry", "corral-scheduler", "corral-agent")}
    missing = [path for path in scripts.values() if not os.access(path, os.X_OK)]
    if missing:
        say(f"error: {', '.join(missing)} not found; run this script with the project's "
            f"virtualenv Python (.venv/bin/python scripts/run_local.py) after `pip install -e .`")
        return 2

    registry_url = f"http://{HOST}:{registry_port}"
    scheduler_url = f"http://{HOST}:{scheduler_port}"
    env = dict(os.environ)
    node_tokens = node_credentials(env)
    operator_token = env["CORRAL_API_TOKEN"] if node_tokens else None
    if not env.get("CORRAL_STATE_DIR", "").strip():
        env["CORRAL_STATE_DIR"] = os.path.join(ROOT, "var")
    env["CORRAL_STATE_DIR"] = os.path.abspath(env["CORRAL_STATE_DIR"].strip())
    env["PYTHONUNBUFFERED"] = "1"

    flags = Flags()
    signal.signal(signal.SIGINT, flags.on_signal)
    signal.signal(signal.SIGTERM, flags.on_signal)

    registry_sock = bind(registry_port, "registry", "CORRAL_REGISTRY_PORT")
    scheduler_sock = bind(scheduler_port, "scheduler", "CORRAL_SCHEDULER_PORT")
    if env.get("DATABASE_URL", "").strip():
        say(f"warning: DATABASE_URL is set, so the registry and the scheduler both use {env['DATABASE_URL']}")
    elif env.get("CORRAL_DATABASE_URL", "").strip():
        # Passed on to both servers with the rest of the environment: their fallback database.
        say("the registry and the scheduler use the database of CORRAL_DATABASE_URL, each in its own schema")
    os.makedirs(env["CORRAL_STATE_DIR"], exist_ok=True)
    children: list[Child] = []
    failed = False
    try:
        for name, sock, extra in (("registry", registry_sock, {}),
                                  ("scheduler", scheduler_sock, {"REGISTRY_URL": registry_url})):
            argv = [scripts[f"corral-{name}"], "--bind", f"fd://{sock.fileno()}"]
            children.append(Child(name, argv, dict(env, **extra), pass_fds=(sock.fileno(),),
                                  stop_timeout=SERVER_STOP_TIMEOUT))
            sock.close()
        agent_env = {k: v for k, v in env.items() if k not in SERVER_ONLY and k != "CORRAL_NODE_TOKEN"}
        agent_env.update(REGISTRY_URL=registry_url, SCHEDULER_URL=scheduler_url)
        grace = _float(env, "AGENT_STOP_GRACE_SECS", 10.0) + _float(env, "AGENT_KILL_GRACE_SECS", 5.0)
        for node in NODES:
            own = {"CORRAL_NODE_TOKEN": node_tokens[node]} if node_tokens else {}
            children.append(Child(node, [scripts["corral-agent"]], dict(agent_env, NODE_ID=node, **own),
                                  stop_timeout=grace + 15.0))

        if not wait_ready(children, flags, registry_url, scheduler_url, operator_token):
            failed = not flags.stop
        else:
            print_banner(registry_url, scheduler_url, env["CORRAL_STATE_DIR"], operator_token)
            while not sleep_unless(lambda: flags.stop, 0.5):
                tree = process_tree()
                for c in children:
                    c.remember_offspring(tree)
                dead = [c for c in children if not c.alive()]
                if dead:
                    for c in dead:
                        say(f"error: {c.name} exited unexpectedly with status {c.popen.returncode}; "
                            f"stopping the rest")
                    failed = True
                    break
        if flags.received:
            say(f"received {flags.received[0]}")
    finally:
        if children:
            say("a second Ctrl-C kills what is left at once")
        stop_all(children, flags)
        registry_sock.close()
        scheduler_sock.close()
    say("stopped" + (" after a failure" if failed else ""))
    return 1 if failed else 0


def _float(env: dict, name: str, default: float) -> float:
    try:
        return float(env.get(name) or default)
    except ValueError:
        return default  # the agent itself reports the bad value


def wait_ready(children: list[Child], flags: Flags, registry_url: str, scheduler_url: str,
               token: str | None = None) -> bool:
    """Wait for both servers' /healthz and both nodes healthy in the registry.
    False when a child died, a signal arrived or it took too long (said why)."""
    checks = [
        ("the registry to answer /healthz", lambda: answers(registry_url + "/healthz")),
        ("the scheduler to answer /healthz", lambda: answers(scheduler_url + "/healthz")),
        (f"{' and '.join(NODES)} to be healthy in the registry",
         lambda: set(NODES) <= {n.get("node_id") for n in get_json(registry_url + "/nodes?status=healthy", token)}),
    ]
    deadline = time.monotonic() + READY_TIMEOUT
    for what, check in checks:
        while True:
            if flags.stop:
                return False
            dead = [c for c in children if not c.alive()]
            if dead:
                for c in dead:
                    say(f"error: {c.name} exited with status {c.popen.returncode} while starting up")
                return False
            try:
                if check():
                    break
            except (OSError, ValueError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                say(f"error: timed out after {READY_TIMEOUT:.0f}s waiting for {what}")
                return False
            sleep_unless(lambda: flags.stop, 0.2)
    return True


def print_banner(registry_url: str, scheduler_url: str, state_dir: str, token: str | None = None) -> None:
    """How to use the cluster. Job ids go on from whatever the state dir holds, so the
    examples read back the id the submit printed rather than naming one."""
    s_port = scheduler_url.rsplit(":", 1)[1]
    r_port = registry_url.rsplit(":", 1)[1]
    auth = ' -H "Authorization: Bearer $CORRAL_TOKEN"' if token else ""
    lines = [
        "",
        "Corral is running" + (" with tokens:" if token else ":"),
        f"  registry   {registry_url}",
        f"  scheduler  {scheduler_url}",
        f"  agents     {', '.join(NODES)}" + (" (each with its own node credential)" if token else ""),
        f"  state      {state_dir}",
        "",
        f"Use it with corral ({os.path.join(BIN, 'corral')}):",
        f"  export CORRAL_ADDR={scheduler_url}",
        f"  export CORRAL_REGISTRY_ADDR={registry_url}",
    ]
    if token:
        lines.append(f"  export CORRAL_TOKEN={shlex.quote(token)}   # the operator token (CORRAL_API_TOKEN)")
    lines += [
        "  corral job run -- echo hi     # prints the new job's id",
        "  corral job status JOB_ID      # JOB_ID: the id it printed",
        "  corral node list",
        "",
        "or with curl (JOB_ID: the job_id the first command prints):",
        f"  curl -s -XPOST localhost:{s_port}/jobs -H 'content-type: application/json'{auth} "
        f"-d '{{\"command\":\"echo hi\"}}'",
        f"  curl -s{auth} localhost:{s_port}/jobs/JOB_ID",
        f"  curl -s{auth} localhost:{r_port}/nodes",
        "",
        "Ctrl-C stops everything.",
        "",
    ]
    with _print_lock:
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
