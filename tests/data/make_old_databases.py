"""Make the SQL dumps of databases an older Corral wrote: tests/data/scheduler-COMMIT.sql
and tests/data/registry-COMMIT.sql, which tests/server/test_migrations.py upgrades in place.

    .venv/bin/python tests/data/make_old_databases.py 6d050af 2f6dbbf

For each commit: a `git worktree` of it in a temporary directory (outside the
repository, removed afterwards); that commit's own registry, scheduler and two agents
(node-1 and node-2) run from it on loopback with a fresh state dir, and are given
work through their HTTP APIs: jobs that end done, failed (at once and after a retry),
cancelled, a batch, a job with every optional field, a service left running (so the
registry keeps its record), node-2 drained, and pending jobs submitted once both
nodes are drained. Then agents, scheduler and registry stop, and each database is
written out as SQL text (Python's sqlite3 `iterdump`).

The agents run as the unprivileged user `nobody` (setpriv), so that their jobs leave
no cgroups behind and the service they leave running is an ordinary process, which
this script ends by the pid in the agents' state file. Needs root, git and setpriv (util-linux).
"""
import argparse
import glob
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from helpers import process_gone, wait_for  # noqa: E402  (tests/helpers.py)

AGENT_USER = 65534  # nobody
NODES = ("node-1", "node-2")
JSON = {"Content-Type": "application/json"}
SERVER_ENV = {"HEARTBEAT_TIMEOUT_SECS": "3", "NODE_REFRESH_SECS": "0.3", "DISPATCH_INTERVAL_SECS": "0.2",
              "TIMEOUT_CHECK_SECS": "0.5", "RETRY_BASE_SECS": "0.2", "CORRAL_LOG_LEVEL": "WARNING"}
AGENT_ENV = {"POLL_INTERVAL_SECS": "0.2", "HEARTBEAT_INTERVAL_SECS": "0.5", "AGENT_STOP_GRACE_SECS": "2",
             "AGENT_KILL_GRACE_SECS": "1", "AGENT_HEALTH_INTERVAL_SECS": "0.3", "CORRAL_LOG_LEVEL": "WARNING"}


def import_tree(source: str, into: str) -> str:
    """A directory whose corral/ links the commit's folders under their import names
    (control-plane/ is no package), to put first on PYTHONPATH."""
    package = os.path.join(into, "corral")
    os.makedirs(package)
    for name in ("shared", "agent", "cli"):
        os.symlink(os.path.join(source, name), os.path.join(package, name))
    for name in ("registry", "scheduler"):
        os.symlink(os.path.join(source, "control-plane", name), os.path.join(package, name))
    return into


class Process:
    def __init__(self, name: str, argv: list[str], env: dict, log_dir: str, pass_fds=()):
        self.name = name
        self.log_path = os.path.join(log_dir, f"{name}.log")
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                          pass_fds=pass_fds, start_new_session=True, cwd=log_dir)

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()


def serve(name: str, tree: str, state_dir: str, log_dir: str, **env: str) -> tuple[Process, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.set_inheritable(True)
    port = sock.getsockname()[1]
    argv = [sys.executable, "-c", f"from corral.{name}.cli import main; main()", "--bind", f"fd://{sock.fileno()}"]
    full = dict(base_env(tree), CORRAL_STATE_DIR=state_dir, **SERVER_ENV, **env)
    process = Process(name, argv, full, log_dir, pass_fds=(sock.fileno(),))
    sock.close()
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: requests.get(url + "/healthz", timeout=2).ok, timeout=30, message=f"the {name} to answer")
    return process, url


def base_env(tree: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "DATABASE_URL", "PYTHON"))}
    return dict(env, PYTHONPATH=tree)


def post(url: str, body: dict | None = None, headers: dict | None = None) -> dict:
    answer = requests.post(url, json=body, headers={**JSON, **(headers or {})}, timeout=10)
    answer.raise_for_status()
    return answer.json()


def job_status(scheduler: str, job: dict) -> str:
    return requests.get(f"{scheduler}/jobs/{job['job_id']}", timeout=5).json()["status"]


def wait_status(scheduler: str, job: dict, *statuses: str) -> None:
    wait_for(lambda: job_status(scheduler, job) in statuses, timeout=60,
             message=f"{job['job_id']} to be {' or '.join(statuses)}")


def workload(scheduler: str, registry: str) -> None:
    """Give the cluster its work."""
    done = post(f"{scheduler}/jobs", {"command": "echo hi"})
    failed = post(f"{scheduler}/jobs", {"command": "echo oops >&2; exit 3", "max_retries": 0})
    retried = post(f"{scheduler}/jobs", {"command": "exit 1", "max_retries": 1})
    full = post(f"{scheduler}/jobs", {"command": "echo $GREETING", "name": "every-field",
                                      "env_vars": {"GREETING": "hello"}, "memory_mb": 64, "cpu_percent": 50,
                                      "max_retries": 2, "on_node_lost": "fail"},
                headers={"Idempotency-Key": "make-old-databases-1"})
    batch = post(f"{scheduler}/jobs/batch", {"jobs": [{"command": f"echo batch {n}"} for n in range(3)]})
    for job in [done, failed, retried, full, *batch]:
        wait_status(scheduler, job, "done", "failed")
    slow = post(f"{scheduler}/jobs", {"command": "sleep 300"})
    wait_status(scheduler, slow, "running")
    post(f"{scheduler}/jobs/{slow['job_id']}/cancel")
    wait_status(scheduler, slow, "cancelled")

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    service = post(f"{scheduler}/jobs", {"command": "exec python3 -m http.server --bind 127.0.0.1 $PORT",
                                         "job_type": "service", "port": port, "name": "web", "health_path": "/"})
    wait_for(lambda: [s for s in requests.get(f"{registry}/services", timeout=5).json() if s.get("healthy")],
             timeout=60, message="the service to be healthy")
    wait_status(scheduler, service, "running")

    for node in NODES:
        post(f"{registry}/nodes/{node}/drain")
    wait_for(lambda: all(n["drained"] for n in requests.get(f"{scheduler}/nodes", timeout=5).json()), timeout=30,
             message="the scheduler to see both nodes drained")
    post(f"{scheduler}/jobs", {"command": "echo never placed"})
    post(f"{scheduler}/jobs/batch", {"jobs": [{"command": "true"}, {"command": "false"}]})
    post(f"{registry}/nodes/node-1/undrain")


def service_pids(agents_state: str) -> list[int]:
    """The services the stopped agents left running, from the state files they keep for
    the next agent (agent/services.py)."""
    pids = []
    for path in glob.glob(os.path.join(agents_state, "**", "services", "*.json"), recursive=True):
        with open(path) as f:
            pids.append(int(json.load(f)["pid"]))
    return pids


def dump(path: str, out: str, header: list[str]) -> None:
    conn = sqlite3.connect(path)
    try:
        lines = list(conn.iterdump())
    finally:
        conn.close()
    with open(out, "w") as f:
        f.write("".join(f"-- {line}\n" if line else "--\n" for line in header))
        f.write("\n".join(lines) + "\n")


def make(commit: str, out_dir: str) -> None:
    full = subprocess.run(["git", "-C", REPO, "rev-parse", commit], check=True, capture_output=True,
                          text=True).stdout.strip()
    short = commit[:7]
    work = tempfile.mkdtemp(prefix=f"corral-{short}-")
    os.chmod(work, 0o755)  # the agents' user reaches its state dir through it
    source = os.path.join(work, "src")
    subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", source, full], check=True,
                   capture_output=True)
    processes: list[Process] = []
    agents_state = os.path.join(work, "agents")
    try:
        tree = import_tree(source, os.path.join(work, "import"))
        state = os.path.join(work, "state")
        for path in (state, agents_state):
            os.makedirs(path)
        os.chown(agents_state, AGENT_USER, AGENT_USER)
        registry_process, registry = serve("registry", tree, state, work)
        processes.append(registry_process)
        scheduler_process, scheduler = serve("scheduler", tree, state, work, REGISTRY_URL=registry)
        processes.append(scheduler_process)
        agents = []
        for node in NODES:
            env = dict(base_env(tree), NODE_ID=node, REGISTRY_URL=registry, SCHEDULER_URL=scheduler,
                       CORRAL_STATE_DIR=agents_state, HOME=agents_state, **AGENT_ENV)
            argv = ["setpriv", f"--reuid={AGENT_USER}", f"--regid={AGENT_USER}", "--clear-groups",
                    sys.executable, "-c", "from corral.agent.cli import main; main()"]
            agents.append(Process(node, argv, env, work))
        processes[:0] = agents  # stopped first
        wait_for(lambda: len(requests.get(f"{scheduler}/nodes", timeout=5).json()) == len(NODES), timeout=60,
                 message="the scheduler to know both nodes")
        post(f"{registry}/nodes/node-2/drain")
        wait_for(lambda: [n for n in requests.get(f"{scheduler}/nodes", timeout=5).json() if n["drained"]],
                 timeout=30, message="the scheduler to see node-2 drained")
        workload(scheduler, registry)
        for process in processes:
            process.stop()
        when = subprocess.run(["git", "-C", REPO, "show", "-s", "--format=%cs", full], check=True,
                              capture_output=True, text=True).stdout.strip()
        for name in ("scheduler", "registry"):
            dump(os.path.join(state, f"{name}.db"), os.path.join(out_dir, f"{name}-{short}.sql"), [
                f"The {name} database written by Corral at commit {full} ({when}).",
                "Made by tests/data/make_old_databases.py: that commit's own registry, scheduler and",
                "two agents ran from a git worktree of it and were given jobs, a service and drained",
                "nodes through their HTTP APIs; the file is Python's sqlite3 iterdump of the result.",
                "tests/server/test_migrations.py loads it into a new file and upgrades it in place.",
                ""])
    except BaseException:
        for process in processes:
            print(f"--- {process.name}\n{process.log()[-3000:]}", file=sys.stderr)
        raise
    finally:
        for process in processes:
            process.stop()
        for pid in service_pids(agents_state):
            if not process_gone(pid):
                os.kill(pid, signal.SIGKILL)
                wait_for(lambda: process_gone(pid), timeout=10, message=f"the service (pid {pid}) to end")
        subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", source], check=False)
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("commits", nargs="+")
    parser.add_argument("--out", default=HERE, help="where the dumps go (default: this folder)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run as root: the agents run as the user nobody")
    for commit in args.commits:
        started = time.monotonic()
        make(commit, args.out)
        print(f"{commit}: done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
