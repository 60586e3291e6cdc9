"""Real processes for end-to-end tests: gunicorn-served registry and scheduler (or
several scheduler replicas), on SQLite files or one PostgreSQL database, and agent
processes, each started through its console script.

Servers get a socket bound to 127.0.0.1:0 by the test and passed down as
`--bind fd://N`, so there is no race for a free port. Every process runs in its
own session and is ended at teardown by a SIGTERM to its main process, then a
SIGKILL to what is left of its process group.
"""
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import requests

from helpers import unmount_under, wait_for

BIN = os.path.dirname(sys.executable)


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict, log_path: str, pass_fds=()):
        self.name = name
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=self.log,
                                      stderr=subprocess.STDOUT, pass_fds=pass_fds, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.popen.pid, sig)

    def freeze(self, timeout: float = 10.0) -> None:
        """SIGSTOP to the process group, returning once every thread of every process in
        it has stopped. A stop reaches a process's threads one after the other, as each is
        scheduled: a thread woken meanwhile (an answer arriving on its socket) may run on
        for a while on a loaded host, which a test that stages a pause cannot allow."""
        self.signal(signal.SIGSTOP)
        wait_for(lambda: group_stopped(self.popen.pid), timeout=timeout, message=f"{self.name} to stop")

    def stop(self, grace: float = 10.0) -> int | None:
        try:
            if self.alive():
                # SIGTERM to the main process only, as the systemd units' KillMode does: a
                # gunicorn worker that got it too may exit before the master acts on it, and
                # the worker the master forks in its place can miss the master's own SIGTERM
                # (it arrives before the worker sets its handlers), so the stop would wait
                # out graceful_timeout.
                _signal(self.popen.pid, signal.SIGTERM)
                _signal_group(self.popen.pid, signal.SIGCONT)  # a process a test stopped handles it too
                try:
                    self.popen.wait(grace)
                except subprocess.TimeoutExpired:
                    pass
            _signal_group(self.popen.pid, signal.SIGKILL)  # whatever of the group is left
            self.popen.wait(5)
        finally:
            self.log.close()
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL the whole process group, as a crash would."""
        if self.alive():
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)

    def output(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # it is gone already
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # it is gone already
        pass


# Where tests keep directories that jobs must reach by path. A root agent gives each
# job a private /tmp (agent/launch.py), in which the host's /tmp is not visible, and
# runs it as a uid of its own, which cannot enter pytest's tmp_path.
JOB_VISIBLE_BASE = "/var/lib/corral-test"


def world_traversable_dir(prefix: str, mode: int = 0o755) -> str:
    """A temporary directory that jobs can reach (see JOB_VISIBLE_BASE; outside /tmp
    when root); the caller removes it. mode 0o1777: jobs can write to it too."""
    base = None
    if os.geteuid() == 0:
        os.makedirs(JOB_VISIBLE_BASE, mode=0o755, exist_ok=True)
        base = JOB_VISIBLE_BASE
    path = tempfile.mkdtemp(prefix=prefix, dir=base)
    os.chmod(path, mode)
    return path


def kill_leftover_jobs(node_id: str, state_dir: str) -> None:
    """End what an agent left running (its services): by cgroup, else by process group."""
    from corral.agent import cgroups, services
    from corral.agent.settings import AgentSettings

    settings = AgentSettings(node_id=node_id, state_dir=state_dir)
    cgroups.detect(root_name=settings.cgroup_root_name, prepare=False).remove_job_cgroups()
    state_root = settings.service_state_root
    for path in services.state_files(state_root):
        try:
            with open(path) as f:
                os.killpg(int(json.load(f)["pid"]), signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            pass
    unmount_under(settings.agent_dir)  # the work dirs' filesystems (agent/diskfs.py) it left mounted


def base_env(state_dir: str, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "DATABASE_URL"))}
    env.update({"CORRAL_STATE_DIR": state_dir, "CORRAL_LOG_LEVEL": "INFO"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


def bound_socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


class Cluster:
    """A registry, one or more schedulers (replicas on one database) and any number of
    agents, all real processes.

    `database_url` is where the servers keep their tables: unset, each its SQLite file
    in the state dir; a `sqlite:///` URL, the scheduler's file (the registry keeps its
    own: both services have a `node` table); a `postgresql://` URL, both services on
    that database, each in its own schema (as with CORRAL_DATABASE_URL)."""

    def __init__(self, tmp_path, *, database_url: str | None = None, **scheduler_env):
        self.dir = str(tmp_path)
        self.state_dir = world_traversable_dir("corral-state-")
        self.procs: dict[str, Proc] = {}
        self.ports: dict[str, int] = {}  # server name -> its port, kept across restarts
        self.scheduler_names: list[str] = []  # the schedulers started, in order ("scheduler" first)
        self.database_url = database_url
        # A job's kill grace is the agents' own (AGENT_KILL_GRACE_SECS, 1 s here) unless a test asks.
        self.scheduler_env = {"TIMEOUT_CHECK_SECS": 0.5, "NODE_REFRESH_SECS": 0.3,
                              "DISPATCH_INTERVAL_SECS": 0.2, "HEARTBEAT_TIMEOUT_SECS": 3,
                              "RETRY_BASE_SECS": 0.2, "JOB_KILL_GRACE_SECS": 1}
        self.scheduler_env.update(scheduler_env)

    def database_env(self, service: str) -> dict:
        """The DATABASE_URL of `service` ("scheduler" or "registry"), if not its default."""
        url = self.database_url
        if url is None or (service == "registry" and url.startswith("sqlite")):
            return {}
        return {"DATABASE_URL": url}

    # ---- servers -------------------------------------------------------------

    def _serve(self, name: str, script: str, env: dict, port: int | None, workers: int = 2) -> int:
        sock = listening_socket()
        if port is not None:  # a restart on the same port
            sock.close()
            sock = wait_for(lambda: bound_socket(port), timeout=10,
                            message=f"port {port} to be free again (the old workers to exit)")
        port = sock.getsockname()[1]
        argv = [os.path.join(BIN, script), "--bind", f"fd://{sock.fileno()}", "--workers", str(workers),
                *self.server_flags(name)]
        self.procs[name] = Proc(name, argv, env, os.path.join(self.dir, f"{name}.log"), pass_fds=(sock.fileno(),))
        sock.close()
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: requests.get(url + "/healthz", timeout=2).ok, timeout=self.serve_timeout,
                 message=f"{name} to answer on {url}")
        return port

    # Subclasses (scripts/benchlib.py) add gunicorn flags per server and wait longer.
    serve_timeout = 30.0

    def server_flags(self, name: str) -> list[str]:
        return []

    def start_registry(self, **env) -> str:
        full = base_env(self.state_dir, **{**self.database_env("registry"),
                                           "HEARTBEAT_TIMEOUT_SECS": self.scheduler_env["HEARTBEAT_TIMEOUT_SECS"],
                                           **env})
        self.ports["registry"] = self._serve("registry", "corral-registry", full, self.ports.get("registry"))
        return self.registry_url

    def start_scheduler(self, workers: int = 2, name: str = "scheduler", **env) -> str:
        """Start (or restart, on its port) the scheduler `name`; another name is another
        replica on the same database, a gunicorn master of its own on a port of its own."""
        merged = {**self.database_env("scheduler"), **self.scheduler_env, "REGISTRY_URL": self.registry_url, **env}
        self.ports[name] = self._serve(name, "corral-scheduler", base_env(self.state_dir, **merged),
                                       self.ports.get(name), workers)
        if name not in self.scheduler_names:
            self.scheduler_names.append(name)
        return self.url_of(name)

    def url_of(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports.get(name)}"

    @property
    def registry_port(self) -> int | None:
        return self.ports.get("registry")

    @property
    def scheduler_port(self) -> int | None:
        return self.ports.get("scheduler")

    @property
    def registry_url(self) -> str:
        return self.url_of("registry")

    @property
    def scheduler_url(self) -> str:
        return self.url_of("scheduler")

    @property
    def scheduler_urls(self) -> list[str]:
        """Every scheduler replica's URL, the first started first."""
        return [self.url_of(name) for name in self.scheduler_names]

    def is_server(self, name: str) -> bool:
        return name == "registry" or name in self.scheduler_names

    def start(self) -> "Cluster":
        self.start_registry()
        self.start_scheduler()
        return self

    # ---- agents --------------------------------------------------------------

    def start_agent(self, node_id: str, slots: int = 1, **env) -> Proc:
        """`env` adds to the agent's environment or overrides it (SCHEDULER_URL too: by
        default every scheduler replica's URL, comma-separated). The agent advertises
        CPU for a default service job (200%) in each slot, so that its slots, not this
        machine's CPUs, bound what it runs at once (placement reserves each job's CPU)."""
        full = base_env(self.state_dir, **{
            "NODE_ID": node_id, "REGISTRY_URL": self.registry_url, "SCHEDULER_URL": ",".join(self.scheduler_urls),
            "AGENT_SLOTS": slots, "AGENT_MAX_CPU_PERCENT": 200 * slots,
            "POLL_INTERVAL_SECS": 0.2, "HEARTBEAT_INTERVAL_SECS": 0.5,
            "AGENT_STOP_GRACE_SECS": 2, "AGENT_KILL_GRACE_SECS": 1, **env})
        proc = Proc(node_id, [os.path.join(BIN, "corral-agent")], full, os.path.join(self.dir, f"{node_id}.log"))
        self.procs[node_id] = proc
        return proc

    def wait_nodes_healthy(self, *node_ids: str, timeout: float = 20.0) -> None:
        """Healthy in the registry, and in the scheduler's own copy of the node list
        (refreshed every NODE_REFRESH_SECS), which is what placement goes by."""
        def ready():
            nodes = requests.get(self.registry_url + "/nodes", params={"status": "healthy"}, timeout=5).json()
            return set(node_ids) <= {n["node_id"] for n in nodes}
        wait_for(ready, timeout=timeout, message=f"nodes {node_ids} to be healthy")
        # The replicas share the node list (a table): any one that runs shows it.
        running = [name for name in self.scheduler_names if self.procs[name].alive()]
        if running:
            wait_scheduler_sees_healthy(self.url_of(running[0]), node_ids, timeout,
                                        self.scheduler_env.get("CORRAL_API_TOKEN"))

    # ---- jobs ----------------------------------------------------------------

    def submit(self, **request) -> dict:
        response = requests.post(self.scheduler_url + "/jobs", json=request, timeout=10)
        assert response.status_code == 201, response.text
        return response.json()

    def job(self, job_id: str) -> dict:
        response = requests.get(f"{self.scheduler_url}/jobs/{job_id}", timeout=10)
        response.raise_for_status()
        return response.json()

    def wait_status(self, job_id: str, *statuses: str, timeout: float = 20.0) -> dict:
        return wait_for(lambda: (lambda j: j if j["status"] in statuses else None)(self.job(job_id)),
                        timeout=timeout, message=f"{job_id} to reach {statuses}")

    def events(self, job_id: str) -> list[dict]:
        return requests.get(f"{self.scheduler_url}/jobs/{job_id}/events", timeout=10).json()

    # ---- teardown ------------------------------------------------------------

    def stop(self) -> None:
        """Stop every process, also when stopping one of them fails (that error is raised
        once all were tried)."""
        errors = []
        # Agents first, so they do not spin against servers that are gone.
        for name in sorted(self.procs, key=self.is_server):
            try:
                self.procs[name].stop()
            except Exception as exc:
                errors.append(exc)
        # Services outlive a stopped agent by design (the next agent adopts them).
        for name in self.procs:
            if not self.is_server(name):
                kill_leftover_jobs(name, self.state_dir)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        if errors:
            raise errors[0]

    def logs(self) -> str:
        return "\n".join(f"===== {name} =====\n{p.output()[-6000:]}" for name, p in self.procs.items())


def all_jobs(scheduler_url: str) -> dict[str, dict]:
    """Every job the scheduler has, by id (GET /jobs, page by page: its Link header)."""
    jobs: dict[str, dict] = {}
    url: str | None = scheduler_url + "/jobs?limit=1000"
    while url is not None:
        response = requests.get(url, timeout=30)
        response.raise_for_status()
        jobs.update((j["job_id"], j) for j in response.json())
        following = response.links.get("next", {}).get("url")
        url = None if following is None else scheduler_url + following
    return jobs


def final_transitions(scheduler_url: str, job_id: str) -> list[dict]:
    """The events of a job that reached a final status (one, for a job that ended once)."""
    events = requests.get(f"{scheduler_url}/jobs/{job_id}/events", timeout=10).json()
    return [e for e in events if e["to"] in ("done", "failed", "cancelled")]


def wait_scheduler_sees_healthy(scheduler_url: str, node_ids, timeout: float = 20.0, token: str | None = None) -> None:
    """Until the scheduler's node list (GET /nodes) has these nodes healthy."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    def ready():
        nodes = requests.get(scheduler_url + "/nodes", headers=headers, timeout=5).json()
        return set(node_ids) <= {n["node_id"] for n in nodes if n["status"] == "healthy"}
    wait_for(ready, timeout=timeout, message=f"the scheduler to see nodes {tuple(node_ids)} healthy")


# ---- which process is which ------------------------------------------------------------

def process_group(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[2])  # state, ppid, pgrp
    except (OSError, ValueError, IndexError):
        return None


def group_stopped(group: int) -> bool:
    """Whether every thread of every process in process group `group` is stopped (state T)."""
    threads = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if process_group(int(pid)) != group:
            continue
        for task in _listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue  # the thread ended
            if state not in ("T", "t", "Z", "X"):
                return False
            threads += 1
    return threads > 0


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []  # the process ended


def replica_of(c: Cluster, pid: int) -> str | None:
    """The scheduler replica a process belongs to (each runs in a process group of its own)."""
    group = process_group(pid)
    return next((name for name in c.scheduler_names if c.procs[name].pid == group), None)


def holder_pid(holder: str) -> int:
    return int(holder.split(":")[1])  # leader.holder_id(): host:pid:random


@contextlib.contextmanager
def one_node_cluster(state_dir, node_id: str, slots: int = 1, on_exit=None, **scheduler_env):
    """A started cluster with one healthy agent `node_id`; stopped on exit. `on_exit(cluster)`
    runs first (for instance to print the logs of a failed test)."""
    cluster = Cluster(state_dir, **scheduler_env)
    try:
        cluster.start()
        cluster.start_agent(node_id, slots=slots)
        cluster.wait_nodes_healthy(node_id)
        yield cluster
    finally:
        if on_exit is not None:
            on_exit(cluster)
        cluster.stop()


@contextlib.contextmanager
def started(c: Cluster, request) -> Iterator[Cluster]:
    """`c` started, stopped afterwards; its logs printed when the test failed."""
    try:
        c.start()
        yield c
    finally:
        c.stop()
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            print(c.logs())
