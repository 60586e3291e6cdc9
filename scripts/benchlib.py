"""What scripts/bench.py and scripts/simulate_fleet.py share: a local cluster with
production timings, API feature probes, /proc readings, statistics and output.

The cluster is tests/cluster.py's `Cluster` (real gunicorn servers on sockets
bound here and passed as fd://N, real agents, teardown by process group), with
the production defaults (docs/settings.md) instead of the tests' short timings, and
extra gunicorn flags (`--threads`) per server. Process trees and /proc/<pid>/stat
parsing come from scripts/run_local.py.

Everything listens on and talks to 127.0.0.1 only.
"""
from __future__ import annotations

import datetime
import http.client
import json
import math
import os
import platform
import shlex
import signal
import statistics
import sys
import tempfile
import time
import urllib.parse

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from cluster import BIN, Cluster, Proc, base_env, world_traversable_dir  # noqa: E402  (tests/cluster.py)
from run_local import _proc_stat, descendants  # noqa: E402  (scripts/run_local.py)

# The documented defaults (docs/settings.md), stated explicitly: tests/cluster.py shortens them for tests.
PRODUCTION_SCHEDULER_ENV = {"TIMEOUT_CHECK_SECS": 10, "NODE_REFRESH_SECS": 2, "DISPATCH_INTERVAL_SECS": 1,
                            "HEARTBEAT_TIMEOUT_SECS": 20, "RETRY_BASE_SECS": 2}
PRODUCTION_AGENT_ENV = {"POLL_INTERVAL_SECS": 3, "HEARTBEAT_INTERVAL_SECS": 5}
# Not measured; only shortens teardown.
AGENT_STOP_ENV = {"AGENT_STOP_GRACE_SECS": 2, "AGENT_KILL_GRACE_SECS": 1}

FINAL = ("done", "failed", "cancelled")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    """Progress goes to stderr; stdout carries only the JSON lines."""
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def emit(record: dict) -> None:
    sys.stdout.write(json.dumps(record, sort_keys=False) + "\n")
    sys.stdout.flush()


# ---- the cluster --------------------------------------------------------------


class BenchCluster(Cluster):
    """tests/cluster.py's Cluster with production timings, per-server gunicorn flags
    and agents started with the documented defaults unless told otherwise.

    `backend` (scripts/benchdb.py) gives the scheduler and the registry each a fresh
    database of their own (their tables share names), dropped after stop(); without
    one, each uses its default SQLite file under the state dir. start_replica() adds
    another scheduler on the same database (the same file, for SQLite)."""

    serve_timeout = 60.0

    def __init__(self, log_dir: str, server_flags: dict[str, list[str]] | None = None, backend=None,
                 **scheduler_env):
        super().__init__(log_dir, **dict(PRODUCTION_SCHEDULER_ENV, **scheduler_env))
        self.extra_flags = server_flags or {}
        self.agent_env: dict[str, dict] = {}
        self.replicas: dict[str, tuple[Proc, int]] = {}  # name -> (gunicorn master, port)
        self.backend = backend
        self.databases: dict[str, str | None] = {}
        if backend is not None:
            for server in ("scheduler", "registry"):
                self.databases[server] = backend.new_database()
            if self.databases["scheduler"]:
                self.scheduler_env["DATABASE_URL"] = self.databases["scheduler"]

    def server_flags(self, name: str) -> list[str]:
        return self.extra_flags.get(name.split("-")[0], [])  # replicas take the scheduler's flags

    def start_registry(self, **env) -> str:
        if self.databases.get("registry"):
            env = dict(env, DATABASE_URL=self.databases["registry"])
        return super().start_registry(**env)

    def start_replica(self, workers: int = 2, **env) -> str:
        """Another scheduler on this cluster's database; returns its URL."""
        name = f"scheduler-{len(self.replicas) + 2}"
        merged = dict(self.scheduler_env, REGISTRY_URL=self.registry_url, **env)
        try:
            port = self._serve(name, "corral-scheduler", base_env(self.state_dir, **merged), None, workers)
        finally:  # a server, not one of the agents Cluster.stop ends first
            proc = self.procs.pop(name, None)
        self.replicas[name] = (proc, port)
        return f"http://127.0.0.1:{port}"

    @property
    def scheduler_urls(self) -> list[str]:
        """Every scheduler of the cluster, the first one first."""
        return [self.scheduler_url, *(f"http://127.0.0.1:{port}" for _, port in self.replicas.values())]

    def start_agent(self, node_id: str, slots: int = 1, **env) -> Proc:
        settings = dict(PRODUCTION_AGENT_ENV, **AGENT_STOP_ENV)
        # A default run job's CPU (100%) in each slot: placement reserves each job's CPU,
        # and the scenarios measure what the slots allow, as before reservations.
        settings["AGENT_MAX_CPU_PERCENT"] = 100 * slots
        settings.update(env)
        full = base_env(self.state_dir, NODE_ID=node_id, REGISTRY_URL=self.registry_url,
                        SCHEDULER_URL=self.scheduler_url, AGENT_SLOTS=slots, **settings)
        proc = Proc(node_id, [os.path.join(BIN, "corral-agent")], full, os.path.join(self.dir, f"{node_id}.log"))
        self.procs[node_id] = proc
        self.agent_env[node_id] = dict(settings, AGENT_SLOTS=slots)
        return proc

    def stop(self) -> None:
        """Cluster.stop, quicker: every agent gets its SIGTERM at once (each drains on
        its own), and the schedulers do not wait out long-polls still in flight. Then
        the cluster's databases are dropped."""
        try:
            for name, proc in self.procs.items():
                if name not in ("registry", "scheduler") and proc.alive():
                    try:
                        os.kill(proc.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
            for name, proc in self.procs.items():
                if name not in ("registry", "scheduler"):
                    proc.stop()
            for proc, _ in self.replicas.values():
                proc.stop(grace=3.0)
            self.stop_server_fast("scheduler")
            super().stop()
        finally:
            for url in self.databases.values():
                self.backend.drop_database(url)

    def stop_server_fast(self, name: str, grace: float = 3.0) -> None:
        """Stop one server without waiting gunicorn's graceful_timeout for long-polls in flight."""
        if name in self.procs:
            self.procs[name].stop(grace=grace)

    def pids(self, name: str) -> list[int]:
        """The process and, for a gunicorn master, its workers (an agent's jobs excluded).
        "schedulers": every scheduler replica's."""
        if name == "schedulers":
            return [pid for server in ("scheduler", *self.replicas) for pid in self.pids(server)]
        proc = self.replicas[name][0] if name in self.replicas else self.procs[name]
        if not proc.alive():
            return []
        if name in ("registry", "scheduler") or name in self.replicas:
            return [proc.pid, *descendants(proc.pid)]
        return [proc.pid]


def make_log_dir(prefix: str) -> str:
    return tempfile.mkdtemp(prefix=prefix)


def shared_dir(prefix: str) -> str:
    """A directory jobs (each under a uid of its own, with a private /tmp, under a root
    agent) can write to."""
    return world_traversable_dir(prefix, 0o1777)


# ---- what the scheduler offers --------------------------------------------------


def openapi_paths(scheduler_url: str) -> set[str]:
    try:
        return set(requests.get(scheduler_url + "/openapi.json", timeout=10).json().get("paths", {}))
    except (requests.RequestException, ValueError, AttributeError):
        return set()


def claim_route(scheduler_url: str, probe: bool = True) -> tuple[bool, str]:
    """Is `POST /nodes/{id}/claim` (the long-poll claim) served? (answer, why).
    Without `probe` only /openapi.json is read (a probe claim renews a lease for a
    node that does not exist: fine in a throwaway cluster, not in someone else's)."""
    if any(p.endswith("/claim") for p in openapi_paths(scheduler_url)):
        return True, "listed in /openapi.json"
    if not probe:
        return False, "not listed in /openapi.json"
    try:
        r = requests.post(scheduler_url + "/nodes/bench-probe-node/claim", json={"max": 1, "wait_secs": 0},
                          timeout=10)
    except requests.RequestException as exc:
        return False, f"probe failed: {exc.__class__.__name__}"
    if r.status_code == 405 or (r.status_code == 404 and _error(r) in ("no such resource", "")):
        return False, f"POST /nodes/{{id}}/claim answered {r.status_code}: not in this scheduler yet"
    return True, f"probe answered {r.status_code}"


def agent_long_poll_supported() -> bool:
    """Does the installed agent know AGENT_LONG_POLL_SECS (else it only polls)?"""
    import corral.agent as agent_pkg
    folder = os.path.dirname(agent_pkg.__file__)
    for name in os.listdir(folder):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                if "AGENT_LONG_POLL_SECS" in f.read():
                    return True
    return False


def agent_default(name: str):
    """A default of the installed agent's settings (None when it has no such setting)."""
    from corral.agent.settings import AgentSettings
    return getattr(AgentSettings, name, None)


def _error(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    return body.get("error", "") if isinstance(body, dict) else ""


class LightClient:
    """One keep-alive connection through http.client, for load generators that share
    the CPUs with the servers they measure: a call costs this process about 0.2 ms
    of CPU, against 0.75 ms through a requests.Session (measured on the bench
    machine), CPU the servers would otherwise not have. No retry: a failed call is
    an error, and the next call opens a new connection."""

    def __init__(self, base_url: str, timeout: float = 30.0):
        parts = urllib.parse.urlsplit(base_url)
        self._connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self._host, self._port, self._prefix = parts.hostname, parts.port, parts.path.rstrip("/")
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def post_json(self, path: str, body, headers: dict | None = None) -> tuple[int, bytes]:
        """POST `body` as JSON (with `headers` too); the status and the body of the answer."""
        if self._conn is None:
            self._conn = self._connection_class(self._host, self._port, timeout=self.timeout)
        try:
            self._conn.request("POST", self._prefix + path, body=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json", **(headers or {})})
            response = self._conn.getresponse()
            return response.status, response.read()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class Refused(RuntimeError):
    """The scheduler answered a request with an error status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class BatchSubmitter:
    """POST /jobs/batch, with whichever body the scheduler takes: a JSON array,
    else {"jobs": [...]}. `available` is None until probed, then True/False."""

    def __init__(self):
        self.available: bool | None = None
        self.reason = ""
        self.wrap = False

    def probe(self, session: requests.Session, scheduler_url: str, request: dict) -> bool:
        """Submit one job through the batch route to learn whether and how it works."""
        for wrap in (False, True):
            body = {"jobs": [request]} if wrap else [request]
            r = session.post(scheduler_url + "/jobs/batch", json=body, timeout=30)
            if r.status_code in (404, 405):
                self.available = False
                self.reason = f"POST /jobs/batch answered {r.status_code}: not in this scheduler yet"
                return False
            if r.status_code in (200, 201):
                self.available, self.wrap = True, wrap
                self.reason = "body: {\"jobs\": [...]}" if wrap else "body: JSON array"
                return True
        self.available = False
        self.reason = f"POST /jobs/batch refused both body forms: {r.status_code} {_error(r) or r.text[:200]}"
        return False

    def submit(self, session: requests.Session, scheduler_url: str, requests_: list[dict]) -> list[dict]:
        body = {"jobs": requests_} if self.wrap else requests_
        r = session.post(scheduler_url + "/jobs/batch", json=body, timeout=120)
        if r.status_code not in (200, 201):
            raise Refused(r.status_code, f"POST /jobs/batch: {r.status_code} {r.text[:300]}")
        jobs = r.json()
        if isinstance(jobs, dict):
            jobs = jobs.get("jobs", [])
        return jobs


def last_job_number(scheduler_url: str) -> int:
    jobs = requests.get(scheduler_url + "/jobs", params={"order": "desc", "limit": 1}, timeout=10).json()
    return int(jobs[0]["job_id"].split("-")[1]) if jobs else 0


def jobs_after(scheduler_url: str, number: int, session: requests.Session | None = None) -> list[dict]:
    """Every job with a number above `number`, oldest first (keyset pages of 1,000)."""
    http = session or requests
    found: list[dict] = []
    after = f"job-{number}" if number else None
    while True:
        params = {"limit": 1000, **({"after": after} if after else {})}
        page = http.get(scheduler_url + "/jobs", params=params, timeout=30).json()
        found += page
        if len(page) < 1000:
            return found
        after = page[-1]["job_id"]


def active_count(scheduler_url: str) -> int:
    """Jobs pending or running (GET /stats)."""
    counts = requests.get(scheduler_url + "/stats", timeout=10).json()["jobs"]
    return counts.get("pending", 0) + counts.get("running", 0)


def epoch(iso_time: str | None) -> float | None:
    if not iso_time:
        return None
    return datetime.datetime.fromisoformat(iso_time.replace("Z", "+00:00")).timestamp()


# ---- /proc ----------------------------------------------------------------------


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes (their own threads, not their children)."""
    total = 0
    for pid in pids:
        fields = _proc_stat(pid)
        if fields and len(fields) > 12:
            total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def tree_cpu_seconds(root: int) -> float:
    """utime + stime of `root` and every live descendant, plus what each of them
    reaped of its children (cutime + cstime): PostgreSQL starts a backend per
    connection and the postmaster reaps it when it closes, so backends that ended
    within a window count too."""
    total = 0
    for pid in [root, *descendants(root)]:
        fields = _proc_stat(pid)
        if fields and len(fields) > 14:
            total += sum(int(fields[i]) for i in (11, 12, 13, 14))
    return total / CLK_TCK


def parent_pid(pid: int) -> int | None:
    """The parent of a process on this machine (None when it is not here)."""
    fields = _proc_stat(pid)
    return int(fields[1]) if fields and len(fields) > 1 else None


def memory_kb(pid: int) -> dict[str, int]:
    """VmHWM (peak RSS) and VmRSS of a process, in kB."""
    found = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmRSS"):
                    found[key] = int(value.split()[0])
    except OSError:
        pass
    return found


class CpuMeter:
    """CPU used by a set of processes over a window, as % of one core. The pid list
    is taken at start and again at the end (a worker that died in between is lost)."""

    def __init__(self, pid_source):
        self.pid_source = pid_source
        self.pids = pid_source()
        self.start_cpu = cpu_seconds(self.pids)
        self.start = time.monotonic()

    def seconds(self) -> float:
        """CPU seconds used since the start."""
        return cpu_seconds(self.pids) - self.start_cpu

    def percent(self) -> float:
        elapsed = time.monotonic() - self.start
        return round(100.0 * self.seconds() / elapsed, 2) if elapsed > 0 else 0.0


class MachineCpuMeter:
    """How busy the whole machine was over a window, as % of ALL its CPUs (/proc/stat)."""

    def __init__(self):
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            values = [int(x) for x in f.readline().split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        return sum(values[:8]) - idle, sum(values[:8])

    def percent(self) -> float:
        busy, total = self._read()
        d_total = total - self.start[1]
        return round(100.0 * (busy - self.start[0]) / d_total, 1) if d_total > 0 else 0.0


class SelfCpuMeter:
    def __init__(self):
        t = os.times()
        self.start_cpu, self.start = t.user + t.system, time.monotonic()

    def seconds(self) -> float:
        t = os.times()
        return t.user + t.system - self.start_cpu

    def percent(self) -> float:
        elapsed = time.monotonic() - self.start
        return round(100.0 * self.seconds() / elapsed, 2) if elapsed > 0 else 0.0


# ---- the machine --------------------------------------------------------------


def machine() -> dict:
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_kb = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_kb = int(line.split()[1])
    except OSError:
        pass
    load = loadavg()
    return {"nproc": len(os.sched_getaffinity(0)), "ram_gib": round(mem_kb / 1048576, 1) if mem_kb else None,
            "cpu_model": model, "kernel": platform.release(), "python": platform.python_version(),
            "loadavg_at_start": load}


def loadavg() -> list[float] | None:
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


def git_head() -> str | None:
    """The commit measured, read from .git without running git."""
    try:
        with open(os.path.join(ROOT, ".git", "HEAD")) as f:
            head = f.read().strip()
        if head.startswith("ref: "):
            ref = head[5:]
            path = os.path.join(ROOT, ".git", ref)
            if os.path.exists(path):
                with open(path) as f:
                    return f.read().strip()
            with open(os.path.join(ROOT, ".git", "packed-refs")) as f:
                for line in f:
                    if line.rstrip().endswith(" " + ref):
                        return line.split()[0]
            return None
        return head
    except OSError:
        return None


def meta(extra: dict | None = None, started: dict | None = None) -> dict:
    """The first line of every output. `started` is what started_now() said when the
    run began (when the line is printed at the end of the run)."""
    started = started or started_now()
    head = git_head()
    # The servers run the checkout as it is when each starts: a commit landing during a
    # long run is measured from then on.
    moved = {"git_head_at_end": head} if head != started["git_head"] else {}
    return {"scenario": "meta", "date": started["date"],
            "command": " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
            "git_head": started["git_head"], **moved, "machine": started["machine"], **(extra or {})}


def started_now() -> dict:
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(), "git_head": git_head()}


# ---- statistics -----------------------------------------------------------------


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[rank - 1]


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 2)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def medians(runs: list[dict]) -> dict:
    """Field by field, in the first run's order: the median of numeric fields over
    the runs that have them, the first run's value for the rest."""
    merged: dict = {}
    for run in runs:
        for key, value in run.items():
            if key in merged:
                continue
            values = [r[key] for r in runs if is_number(r.get(key))]
            merged[key] = round(statistics.median(values), 3) if is_number(value) else value
    return merged


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if is_number(a) and is_number(b) and b else None
