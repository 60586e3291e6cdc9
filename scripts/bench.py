#!/usr/bin/env python3
"""Benchmarks of a local Corral cluster (`make bench`).

Starts the registry and the scheduler under gunicorn and real agents (as
`make run` does, with all state in a temporary directory), runs each scenario
and prints one JSON line per scenario and storage backend on stdout, after a
first {"scenario": "meta", ...} line with the machine, the date, the command and
the database servers' settings. Progress goes to stderr. Everything listens on
and talks to 127.0.0.1 only.

Scenarios (see docs/benchmarks.md for what each measures and why):

  submit_single     POST /jobs from 8 concurrent clients into a cluster without agents
  submit_batch      the same jobs through POST /jobs/batch, 500 per request
  dispatch_latency  idle cluster, 2 agents: submit -> the job's first instruction
  throughput        2,000 `true` jobs over 2 agents x 4 slots, first submit -> last done
  baseline          the original design's mode (polling every 3 s, 1 slot) on 100 jobs
  cpu_bound         CPU-bound jobs at 1, 2, 4 slots per agent; no node may be lost
  memory            peak and current RSS of the scheduler, registry and agents after throughput
  dispatch_cross_replica
                    as dispatch_latency, with two schedulers on one database: the agents
                    claim from one, the jobs are submitted to the other
  capacity          control-plane capacity: 20,000 jobs through 200 simulated agents x 8 slots
                    that "run" each job for 0 s and report as a real agent does (a batch of
                    reports with the next claim riding on it); two schedulers on PostgreSQL
  idle_fleet        1,000 simulated idle agents spread over two schedulers: their CPU
  schedules         10 schedules firing every second for 30 s on an otherwise idle cluster with
                    2 agents: each slot's lag to its job's creation and to its start, the CPU
  submit_pending    POST /jobs from 8 clients while every node is full, with 0 and then with
                    100,000 jobs pending (added through SQL): p50/p99 of each and their ratios
  placement         no cluster: one placement pass (placement.Planner) over 10,000 waiting jobs
                    of four shapes and 20 teams on 500 labelled nodes, per policy, in memory,
                    without and with every team's quota counted
  events_load       submit latency (8 clients) and submit-to-done (one job at a time, 2 agents) with no event
                    stream open, then with 100 idle `GET /events` streams open; the scheduler's CPU while
                    they sit idle
  submit_auth       submit_single on a scheduler with tokens: the same submits with the bootstrap token, then
                    with a team member's personal token (looked up, cached, attributed, audited): ratios
  node_floor        no scheduler: how fast this machine starts `true` jobs the way an agent
                    does (private /tmp, cgroup, a uid of its own, the environment from a memfd,
                    sh), from 4 threads: the ceiling of `throughput`

With --repeat N (default 3) every scenario runs N times, interleaved round by
round so that ratios compare runs made minutes apart, not a quarter of an hour;
the line shows the medians and each run. A scenario whose API is missing (no
POST /jobs/batch yet) prints {"skipped": "<reason>"}.

Storage: --backends sqlite,postgresql runs every scenario on each backend,
interleaved within each round (the first backend alternates from round to
round). The servers run on SQLite files by default; on PostgreSQL the bench
starts a throwaway server (fsync=on, synchronous_commit=on), or uses the one
--database-url names, and gives every cluster fresh databases on it.
--postgres is short for --backends postgresql.

With --scheduler-url (and --registry-url) the scenarios that need no control
of the cluster (submit_single, submit_batch) run against a running scheduler;
their jobs are pinned to a node that does not exist and cancelled afterwards.
"""
from __future__ import annotations

import argparse
import collections
import http.client as http_client
import json
import math
import os
import random
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, replace

import requests

import benchdb
import benchlib as bl
import simulate_fleet as sf
from cluster import all_jobs, wait_scheduler_sees_healthy  # tests/cluster.py (benchlib puts tests/ on sys.path)
from corral.shared.timeutil import epoch, iso

SCENARIOS = ("submit_single", "submit_batch", "dispatch_latency", "dispatch_cross_replica", "throughput", "baseline",
             "cpu_bound", "memory", "capacity", "idle_fleet", "schedules", "logs", "submit_pending", "events_load",
             "placement", "node_floor", "submit_auth")
# The cluster tokens of submit_auth's scheduler (loopback only, made up for the run).
AUTH_OPERATOR_TOKEN, AUTH_AGENT_SECRET = "bench-operator-token-4a1f", "bench-agent-secret-9c3e"
PROFILER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profile_requests.py")
# Scenarios that touch no database: run once per round, whatever the backends.
NO_DATABASE = ("placement", "node_floor")
# What a backend's line compares with the first backend's, as ratios of medians.
COMPARED = {"submit_single": ("jobs_per_sec", "scheduler_cpu_ms_per_job"), "submit_batch": ("jobs_per_sec",),
            "dispatch_latency": ("p50_ms", "p99_ms"), "dispatch_cross_replica": ("p50_ms", "p99_ms"),
            "throughput": ("jobs_per_sec", "scheduler_cpu_ms_per_job"), "baseline": ("jobs_per_sec",),
            "memory": ("scheduler_worker_hwm_mb_max",),
            "capacity": ("jobs_per_sec", "scheduler_cpu_ms_per_job", "registry_cpu_ms_per_job"),
            "idle_fleet": ("schedulers_cpu_pct", "registry_cpu_pct"),
            "schedules": ("lag_p50_ms", "lag_p99_ms", "scheduler_cpu_pct"),
            "logs": ("stored_mb_per_sec", "scheduler_cpu_ms_per_mb", "read_mb_per_sec"),
            "submit_auth": ("operator_jobs_per_sec", "personal_jobs_per_sec"),
            "submit_pending": ("pending_p50_ms", "pending_p99_ms")}

# The control plane's targets on a 2-core machine, checked against the medians of a
# full run: (scenario, backend or None for every backend, field, "min" or "max", limit).
TARGETS = (
    ("submit_single", "postgresql", "jobs_per_sec", "min", 1000),
    ("submit_batch", "postgresql", "jobs_per_sec", "min", 10000),
    ("dispatch_latency", None, "p50_ms", "max", 15), ("dispatch_latency", None, "p99_ms", "max", 50),
    ("dispatch_cross_replica", None, "p50_ms", "max", 15), ("dispatch_cross_replica", None, "p99_ms", "max", 50),
    ("capacity", "sqlite", "jobs_per_sec", "min", 1500),
    ("capacity", "postgresql", "jobs_per_sec", "min", 800),
    ("idle_fleet", None, "schedulers_cpu_pct", "max", 20),
    ("schedules", None, "lag_p99_ms", "max", 1000),
    # A submit costs about the same whatever the length of the queue (MAX_PENDING_JOBS's default).
    ("submit_pending", None, "p99_ratio", "max", 2.0),
    ("placement", None, "round_robin_ms", "max", 50), ("placement", None, "binpack_ms", "max", 50),
    ("placement", None, "spread_ms", "max", 50),
    ("placement", None, "round_robin_quotas_ms", "max", 50), ("placement", None, "binpack_quotas_ms", "max", 50),
    ("placement", None, "spread_quotas_ms", "max", 50),
)


def check_targets(lines: list[dict], quick: bool) -> dict:
    """The `targets` line: each target whose scenario ran on its backend, its median and
    whether it is met (a --quick run measures too little to say: checked, never met)."""
    checks = []
    for scenario, backend, field, bound, limit in TARGETS:
        for line in lines:
            value = line.get(field)
            if line.get("scenario") != scenario or (backend and line.get("backend") != backend) \
                    or not bl.is_number(value):
                continue
            met = (value >= limit if bound == "min" else value <= limit) and not quick
            checks.append({"scenario": scenario, "backend": line.get("backend"), "field": field,
                           "target": f"{'>=' if bound == 'min' else '<='} {limit}", "median": value, "met": met})
    return {"scenario": "targets", "quick": quick, "checks": checks,
            "met": sum(c["met"] for c in checks), "missed": sum(not c["met"] for c in checks)}


@dataclass(frozen=True)
class Config:
    repeat: int = 3
    submit_jobs: int = 2000
    submit_clients: int = 8
    submit_secs: float = 60.0
    batch_size: int = 500
    latency_jobs: int = 200
    placement_jobs: int = 10_000
    placement_nodes: int = 500
    latency_secs: float = 90.0        # a polling agent takes ~1.5 s a job: stop at this bound
    latency_job_timeout: float = 15.0
    throughput_jobs: int = 2000
    throughput_secs: float = 240.0
    throughput_slots: int = 4
    agents: int = 2
    baseline_jobs: int = 100
    baseline_secs: float = 240.0
    baseline_poll_secs: float = 3.0
    baseline_latency_jobs: int = 12   # ~3 s each (pause + latency) when polling every 3 s
    cpu_jobs: int = 120               # per setting: 200 would be 100 CPU-s x 3 settings per round
    cpu_job_secs: float = 0.5
    cpu_slots: tuple = (1, 2, 4)
    cpu_secs: float = 180.0
    warmup_jobs: int = 4
    floor_jobs: int = 800
    floor_threads: int = 4
    capacity_jobs: int = 20000
    capacity_agents: int = 200
    capacity_slots: int = 8
    capacity_batch: int = 500
    capacity_submitters: int = 4     # clients submitting batches at once: work waits for every free slot
    capacity_secs: float = 180.0      # in all, submits included: 20,000 jobs take 70-100 s here
    capacity_teams: int = 0           # > 0: the jobs are these many teams', each with a quota (fair share on)
    idle_agents: int = 1000
    idle_secs: float = 60.0           # a whole IDLE_RENEW_SECS: every idle agent renews once in it
    idle_settle_secs: float = 5.0
    schedule_count: int = 10
    schedule_secs: int = 30
    log_jobs: int = 16                # jobs that each write log_mb of output as fast as they can
    log_mb: int = 8
    log_secs: float = 180.0
    pending_fill: int = 100_000       # jobs added to the queue through SQL between the two measures
    pending_submits: int = 1000       # POST /jobs per measure
    event_streams: int = 100          # idle GET /events streams held open (events_load)
    events_submits: int = 1000        # POST /jobs per measure (events_load)
    events_done_jobs: int = 50        # jobs submitted one at a time, each waited for until done
    events_idle_secs: float = 5.0     # the scheduler's CPU measured over this long, idle


FULL = Config()
QUICK = Config(repeat=1, submit_jobs=100, batch_size=50, latency_jobs=5, latency_secs=20.0,
               throughput_jobs=40, throughput_secs=60.0, baseline_jobs=6, baseline_secs=60.0, baseline_latency_jobs=2,
               cpu_jobs=6, cpu_secs=60.0, warmup_jobs=2, floor_jobs=40, capacity_jobs=400, capacity_agents=10,
               capacity_batch=100, capacity_secs=60.0, idle_agents=20, idle_secs=3.0, idle_settle_secs=1.0,
               schedule_count=3, schedule_secs=5, log_jobs=4, log_mb=2, log_secs=60.0,
               pending_fill=2000, pending_submits=50, events_submits=100, events_done_jobs=10,
               events_idle_secs=2.0)


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


class Skip(Exception):
    """This scenario cannot run here; the message says why."""


def placement_pass(cfg: Config) -> dict:
    """One placement pass in memory (the pure placement.Planner, no database): 500 nodes
    of 8 free slots in three zones, a tenth with a GPU label, a fiftieth in pool
    `batch`, each with some memory already reserved; 10,000 waiting jobs of four
    shapes (six in ten asking nothing, two a zone and 2 GB, one a GPU and 8 GB, one the
    batch pool), of 20 teams in turn. Per policy, the median of 7 passes that place
    until no slot is left, and of 7 that give every job its reason (the background
    pass's explain); then the same with every team's quota counted (`*_quotas_ms`: each
    guaranteed 100 jobs and 1,600% CPU, borrowing up to 150 more jobs, half of them
    lending only 50 of their jobs, so that borrowers stop at what the others keep), and
    the time fair share takes to put the 10,000 jobs in turns (`fair_share_order_ms`),
    and a pass where one job in twenty needs 4 nodes at once (`*_gangs_ms`)."""
    from corral.scheduler import fairshare, quotas
    from corral.scheduler.placement import Ask, NodeInfo, Planner, cluster_capacity

    rnd = random.Random(7)
    nodes = []
    for i in range(cfg.placement_nodes):
        labels = {"zone": "abc"[i % 3], **({"gpu": "a100"} if i % 10 == 0 else {}),
                  **({"pool": "batch"} if i % 50 == 0 else {})}
        nodes.append(NodeInfo(f"node-{i:04d}", 8, labels=labels, max_memory_mb=32_768, max_cpu_percent=800,
                              reserved_memory_mb=rnd.choice([0, 4096, 8192]),
                              default_limits={"run": (512, 100), "service": (1024, 200)}))
    shapes = [lambda i: Ask(i)] * 6 + [
        lambda i: Ask(i, memory_mb=2048, cpu_percent=50, constraints=(("zone", "=", "abc"[i % 3]),))] * 2 + [
        lambda i: Ask(i, memory_mb=8192, constraints=(("gpu", "exists", None),)),
        lambda i: Ask(i, pool="batch", memory_mb=1024)]
    teams = [f"team-{t:02d}" for t in range(20)]
    asks = [replace(shapes[i % 10](i), team=teams[i % 20]) for i in range(cfg.placement_jobs)]
    team_quotas = {team: quotas.Quota({"jobs": 100, "cpu_percent": 1600}, {"jobs": 150},
                                      {"jobs": 50} if t % 2 else {}) for t, team in enumerate(teams)}
    capacity = cluster_capacity(nodes)
    out: dict = {"jobs": len(asks), "nodes": len(nodes), "teams": len(teams)}
    for with_quotas in (False, True):
        for policy in ("round-robin", "binpack", "spread"):
            for explain in (False, True):
                times, placed = [], 0
                for _ in range(7):
                    started = time.perf_counter()
                    ledger = quotas.Ledger(team_quotas, {}, capacity) if with_quotas else None
                    planner = Planner(nodes, policy, explain=explain, ledger=ledger)
                    planner.offer(asks)
                    placed = len(planner.plan().placed)
                    times.append(time.perf_counter() - started)
                name = (policy.replace("-", "_") + ("_explain" if explain else "")
                        + ("_quotas" if with_quotas else ""))
                out[f"{name}_ms"] = round(1000 * statistics.median(times), 2)
                out[f"{name}_placed"] = placed
    # The same pass with one job in twenty a gang of 4 nodes (all members or none).
    gang_asks = [replace(a, members=4) if a.job_id % 20 == 0 else a for a in asks]
    for policy in ("round-robin", "binpack", "spread"):
        times, placed = [], 0
        for _ in range(7):
            started = time.perf_counter()
            planner = Planner(nodes, policy)
            planner.offer(gang_asks)
            placed = len(planner.plan().placed)
            times.append(time.perf_counter() - started)
        out[f"{policy.replace('-', '_')}_gangs_ms"] = round(1000 * statistics.median(times), 2)
        out[f"{policy.replace('-', '_')}_gangs_placed"] = placed
    # Fair share's order of the same jobs (five users per team, usage of every one), before a pass.
    rows = [(a.job_id, a.team, f"user-{a.job_id % 100:02d}") for a in asks]
    usage = {(team, f"user-{u:02d}"): float(rnd.randint(0, 10**6)) for team in teams for u in range(100)
             if u % 20 == teams.index(team)}
    times = []
    for _ in range(7):
        started = time.perf_counter()
        by_team: dict[str, float] = {}
        for (team, _), amount in usage.items():
            by_team[team] = by_team.get(team, 0.0) + amount
        standings = fairshare.standings(dict.fromkeys(teams, 1.0), by_team)
        users = fairshare.user_standings(usage, {(r[1], r[2]) for r in rows})
        fairshare.turns(rows, lambda r: r[1], lambda r: r[2], standings, users)
        times.append(time.perf_counter() - started)
    out["fair_share_order_ms"] = round(1000 * statistics.median(times), 2)
    return out


def node_floor(cfg: Config) -> dict:
    """Start `cfg.floor_jobs` `true` jobs exactly as an agent does (agent/cgroups.py,
    uids.py, launch.py, runner.py: a cgroup with the default limits, a uid of its own,
    the launch chain with a private /tmp where this machine allows it, the environment
    from a memfd, /bin/sh -c), `cfg.floor_threads` at a time, with no scheduler, no
    HTTP and no agent loop. Jobs/s and CPU per job, of this process and of the jobs'
    processes (kernel time included): what `throughput` can never exceed here.

    The first figures start each job through launch.py's chain of programs
    (AGENT_FORK_SERVER=false); `fork_server_*` through the fork server, as the agent
    does by default (`fork_server_vs_chain`: the ratio of their jobs/s, same run).
    `reused_cgroup_*` keeps one cgroup per thread (slot) instead of making and
    removing one per job, and `reused_cgroup_no_drop_*` also runs the job as this
    user (no `setpriv` exec). `fork_server_reused_cgroup_*` starts each job as the
    agent does on cgroup v1: through the fork server, with a uid of its own, in a kept
    cgroup set up again for it (slot_cgroups.py)."""
    import tempfile

    from corral.agent import cgroups, forkserver, launch, runner, uids
    from corral.agent.settings import DEFAULT_UID_RANGE
    from corral.agent.slot_cgroups import SlotCgroups
    manager = cgroups.detect(root_name=f"corral-bench-floor-{os.getpid()}")
    if not manager.enforced:
        raise Skip(f"needs cgroups like a real agent: {manager.reason}")
    agent_dir = tempfile.mkdtemp(prefix="corral-bench-agent-")
    fstab = launch.write_fstab(os.path.join(agent_dir, launch.FSTAB_NAME))
    private_tmp = launch.private_tmp_problem(runner.tools(), "/", fstab) is None
    pool = uids.UidPool(*DEFAULT_UID_RANGE, os.path.join(agent_dir, "uids.json"))
    env = {"PATH": "/usr/bin:/bin"}

    def start(cg, user) -> None:
        runner.start({"command": "true"}, "/", env, 65536, cgroup=cg, user=user,
                     private_tmp=launch.PrivateTmp(fstab, 512) if private_tmp else None).result()

    def fresh(slot: int, i: int) -> None:
        cg = manager.create(f"floor-{i}", 512, 100, 1024)
        uid = pool.acquire(f"floor-{i}")
        try:
            start(cg, launch.User(uid, uid))
        finally:
            cg.kill()
            cg.remove()
            pool.release(f"floor-{i}")

    def measure(one) -> tuple[float, float, float]:
        def worker(k: int) -> None:
            for i in range(k, cfg.floor_jobs, cfg.floor_threads):
                one(k, i)
        own0, children0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(cfg.floor_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
        own1, children1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)

        def ms_per_job(before, after):
            return round((after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
                         / cfg.floor_jobs * 1000, 3)
        return round(cfg.floor_jobs / elapsed, 1), ms_per_job(own0, own1), ms_per_job(children0, children1)

    slots = []
    try:
        rate, own, children = measure(fresh)
        slots = [manager.create(f"floor-slot-{k}", 512, 100, 1024) for k in range(cfg.floor_threads)]
        reused = measure(lambda k, i: start(slots[k], launch.User(DEFAULT_UID_RANGE[0] + k, DEFAULT_UID_RANGE[0] + k)))
        no_drop = measure(lambda k, i: start(slots[k], None))
        # The same jobs through the fork server (AGENT_FORK_SERVER, the agent's default):
        # one clone and one exec each; the server's own CPU counted with the starter's.
        server = forkserver.ForkServer.start()
        runner.use_fork_server(server)
        try:
            spent = bl.cpu_seconds([server.pid])
            forked = measure(fresh)
            forked_cpu = (bl.cpu_seconds([server.pid]) - spent) / cfg.floor_jobs * 1000
            spent = bl.cpu_seconds([server.pid])
            kept = SlotCgroups(manager, cfg.floor_threads)

            def in_a_slot(k: int, i: int) -> None:  # as the agent does: a uid per job, a kept cgroup
                cg = kept.take(512, 100, 1024)
                uid = pool.acquire(f"floor-{i}")
                try:
                    start(cg, launch.User(uid, uid))
                    cg.stats()
                finally:
                    kept.give_back(cg)
                    pool.release(f"floor-{i}")
            try:
                forked_reused = measure(in_a_slot)
            finally:
                kept.close()
            forked_reused_cpu = (bl.cpu_seconds([server.pid]) - spent) / cfg.floor_jobs * 1000
        finally:
            runner.use_fork_server(None)
            server.close()
    finally:
        for cg in slots:
            cg.kill()
            cg.remove()
        manager.cleanup()
        shutil.rmtree(agent_dir, ignore_errors=True)
    return {"jobs_per_sec": rate, "jobs": cfg.floor_jobs, "threads": cfg.floor_threads,
            "starter_cpu_ms_per_job": own, "job_processes_cpu_ms_per_job": children,
            "reused_cgroup_jobs_per_sec": reused[0], "reused_cgroup_starter_cpu_ms_per_job": reused[1],
            "reused_cgroup_job_processes_cpu_ms_per_job": reused[2],
            "fork_server_jobs_per_sec": forked[0],
            "fork_server_starter_cpu_ms_per_job": round(forked[1] + forked_cpu, 3),
            "fork_server_job_processes_cpu_ms_per_job": forked[2],
            "fork_server_reused_cgroup_jobs_per_sec": forked_reused[0],
            "fork_server_reused_cgroup_starter_cpu_ms_per_job": round(forked_reused[1] + forked_reused_cpu, 3),
            "fork_server_vs_chain": round(forked[0] / rate, 2) if rate else None,
            "reused_cgroup_no_drop_jobs_per_sec": no_drop[0],
            "reused_cgroup_no_drop_job_processes_cpu_ms_per_job": no_drop[2],
            "cgroups": manager.mode, "job_user": f"a uid per job from {DEFAULT_UID_RANGE[0]}",
            "private_tmp": private_tmp}


# ---- submitting -----------------------------------------------------------------


def submit_concurrently(url: str, request: dict, total: int, clients: int, time_limit: float,
                        headers: dict | None = None) -> dict:
    """POST /jobs `total` times from `clients` threads (a keep-alive connection each,
    bl.LightClient, sending `headers` too), or until `time_limit`. Returns counts,
    elapsed wall time and per-request latencies."""
    lock = threading.Lock()
    state = {"next": 0, "ok": 0, "errors": 0, "last_error": None}
    latencies: list[float] = []
    job_ids: list[str] = []
    start = time.monotonic()
    deadline = start + time_limit

    def client():
        http = bl.LightClient(url)
        try:
            while True:
                with lock:
                    if state["next"] >= total or time.monotonic() > deadline:
                        return
                    state["next"] += 1
                t0 = time.perf_counter()
                try:
                    status, body = http.post_json("/jobs", request, headers)
                    ok = status == 201
                    error = None if ok else f"{status} {body[:200]!r}"
                except (OSError, http_client.HTTPException) as exc:
                    ok, error = False, f"{exc.__class__.__name__}: {exc}"
                took = time.perf_counter() - t0
                with lock:
                    if ok:
                        state["ok"] += 1
                        latencies.append(took)
                        job_ids.append(json.loads(body)["job_id"])
                    else:
                        state["errors"] += 1
                        state["last_error"] = error
        finally:
            http.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(time_limit + 60)
    elapsed = time.monotonic() - start
    return {"ok": state["ok"], "errors": state["errors"], "last_error": state["last_error"],
            "elapsed": elapsed, "latencies": latencies, "job_ids": job_ids}


def open_streams(url: str, count: int) -> tuple[list[socket.socket], int]:
    """`count` GET /events streams, each a connection whose answer's head was read and
    that is then left open (idle: nothing is read from it). The open ones, and how many
    were refused."""
    host, port = urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port
    opened, refused = [], 0
    for _ in range(count):
        sock = socket.create_connection((host, port), timeout=30)
        sock.sendall(f"GET /events HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
        if head.startswith(b"HTTP/1.1 200"):
            opened.append(sock)
        else:
            refused += 1
            sock.close()
    return opened, refused


def submit_to_done(url: str, jobs: int, time_limit: float) -> list[float]:
    """Seconds from POST /jobs to GET /jobs/{id} saying done, one `true` job at a time."""
    took: list[float] = []
    deadline = time.monotonic() + time_limit
    with requests.Session() as s:
        for _ in range(jobs):
            if time.monotonic() > deadline:
                break
            t0 = time.monotonic()
            r = s.post(f"{url}/jobs", json={"command": "true"}, timeout=30)
            if r.status_code != 201:
                raise RuntimeError(f"POST /jobs: {r.status_code} {r.text[:200]}")
            job_id = r.json()["job_id"]
            while time.monotonic() < deadline:
                if s.get(f"{url}/jobs/{job_id}", timeout=30).json().get("status") == "done":
                    took.append(time.monotonic() - t0)
                    break
                time.sleep(0.005)
    if not took:
        raise RuntimeError("no job was done in time")
    return took


def submit_batches(url: str, batcher: bl.BatchSubmitter, request: dict, total: int, size: int,
                   time_limit: float) -> dict:
    session = requests.Session()
    start = time.monotonic()
    ok, latencies, job_ids = 0, [], []
    try:
        while ok < total and time.monotonic() - start < time_limit:
            n = min(size, total - ok)
            t0 = time.perf_counter()
            jobs = batcher.submit(session, url, [request] * n)
            latencies.append(time.perf_counter() - t0)
            ok += len(jobs)
            job_ids += [j["job_id"] for j in jobs]
    finally:
        session.close()
    return {"ok": ok, "elapsed": time.monotonic() - start, "latencies": latencies, "job_ids": job_ids}


def submit_all(url: str, batcher: bl.BatchSubmitter, request: dict, total: int, cfg: Config) -> str:
    """Submit `total` jobs as fast as possible: batches if the scheduler has them."""
    if batcher.available:
        result = submit_batches(url, batcher, request, total, cfg.batch_size, cfg.submit_secs * 4)
        how = f"POST /jobs/batch x{cfg.batch_size}"
    else:
        result = submit_concurrently(url, request, total, cfg.submit_clients, cfg.submit_secs * 4)
        how = f"POST /jobs from {cfg.submit_clients} clients"
    if result["ok"] != total:
        raise RuntimeError(f"submitted {result['ok']} of {total} jobs ({how}): {result.get('last_error')}")
    return how


def job_story(url: str, job_id: str) -> dict:
    """A job's row and its events as the API gives them (for a job that did not finish)."""
    try:
        job = requests.get(f"{url}/jobs/{job_id}", timeout=30).json()
        events = requests.get(f"{url}/jobs/{job_id}/events", timeout=30).json()
    except (requests.RequestException, ValueError) as exc:
        return {"job_id": job_id, "error": str(exc)}
    keep = ("job_id", "status", "node_id", "attempt", "created_at", "placed_at", "started_at", "finished_at")
    return {**{k: job.get(k) for k in keep},
            "events": [{k: e.get(k) for k in ("at", "from_status", "to_status", "attempt", "node_id", "reason")}
                       for e in events] if isinstance(events, list) else events}


def job_counts(url: str) -> dict:
    """GET /stats's job counts, or {} when the scheduler cannot answer (an overloaded
    one answers 503)."""
    try:
        r = requests.get(url + "/stats", timeout=30)
        return r.json()["jobs"] if r.status_code == 200 else {}
    except (requests.RequestException, ValueError, KeyError):
        return {}


def wait_done(fleet: sf.Fleet, job_ids: list[str], time_limit: float) -> bool:
    """Wait until the simulated agents have reported every one of these jobs done."""
    deadline = time.monotonic() + time_limit
    left = set(job_ids)
    while time.monotonic() < deadline:
        with fleet.lock:
            left = {j for j in left if j not in fleet.done_at}
        if not left:
            return True
        time.sleep(0.05)
    return False


def wait_idle(url: str, time_limit: float) -> bool:
    """Wait until the scheduler has no pending or running job (or time runs out).
    Used on clusters that only run the bench's own jobs."""
    deadline = time.monotonic() + time_limit
    while time.monotonic() < deadline:
        if bl.active_count(url) == 0:
            return True
        time.sleep(0.1)
    return False


# ---- the bench ------------------------------------------------------------------


class Bench:
    def __init__(self, args, cfg: Config):
        self.args = args
        self.cfg = cfg
        self.local = args.scheduler_url is None
        self.selected = [s for s in SCENARIOS if s in args.scenarios]
        self.backends: dict[str, benchdb.Sqlite | benchdb.Postgres] = {}
        self.backend: str | None = None  # the one the scenarios now run on (None: NO_DATABASE)
        self.runs_by: dict[str | None, dict[str, list[dict]]] = {}
        self.settings_by: dict[str | None, dict[str, dict]] = {}
        self.skipped: dict[str, str] = {}
        self.log_dir = bl.make_log_dir("corral-bench-logs-")
        self.failures = 0
        self.features: dict = {}
        self.batcher: bl.BatchSubmitter | None = None
        self.cpu_command: str | None = None
        self.cpu_calibration: dict = {}
        self.marker = uuid.uuid4().hex[:8]
        self.started = bl.started_now()

    # -- helpers --

    @property
    def runs(self) -> dict[str, list[dict]]:
        """The runs of every scenario on the current backend."""
        return self.runs_by.setdefault(self.backend, {s: [] for s in self.selected})

    @property
    def settings(self) -> dict[str, dict]:
        return self.settings_by.setdefault(self.backend, {})

    def database_cpu(self) -> float | None:
        """CPU seconds the current backend's server used so far (None: it runs inside
        the servers, as SQLite does, or elsewhere)."""
        backend = self.backends.get(self.backend) if self.local else None
        return backend.cpu_seconds() if backend is not None else None

    def want(self, scenario: str) -> bool:
        return scenario in self.selected and scenario not in self.skipped

    def record(self, scenario: str, fn, *args) -> dict | None:
        """Run one scenario once; a Skip marks it skipped, any other error is recorded."""
        if not self.want(scenario):
            return None
        on = f" on {self.backend}" if self.backend else ""
        bl.log(f"{scenario}{on}: run {len(self.runs[scenario]) + 1}/{self.cfg.repeat}")
        try:
            result = fn(*args)
        except Skip as exc:
            self.skipped[scenario] = str(exc)
            bl.log(f"{scenario}: skipped: {exc}")
            return None
        except Exception as exc:  # a failed run is reported, the others still run
            self.failures += 1
            bl.log(f"{scenario}: failed: {exc.__class__.__name__}: {exc}")
            result = {"error": f"{exc.__class__.__name__}: {exc}"}
        self.runs[scenario].append(result)
        bl.log(f"{scenario}: " + ", ".join(f"{k}={v}" for k, v in result.items()
                                           if bl.is_number(v) or k == "error"))
        return result

    def cluster(self, name: str, agents: int = 0, slots: int = 1, agent_env: dict | None = None,
                server_flags: dict | None = None, replicas: int = 1, **scheduler_env) -> bl.BenchCluster:
        """A cluster on the current backend: `replicas` schedulers on its database,
        `agents` real agents claiming from the first one."""
        label = f"{name}-{self.backend}-{len(os.listdir(self.log_dir))}"
        folder = os.path.join(self.log_dir, label)
        os.makedirs(folder)
        if self.args.profile:  # the schedulers' request threads profiled (scripts/profile_requests.py)
            server_flags = dict(server_flags or {})
            server_flags["scheduler"] = [*server_flags.get("scheduler", []), "--gunicorn-config", PROFILER]
            scheduler_env["BENCH_PROFILE_DIR"] = os.path.join(self.args.profile, label)
            os.makedirs(scheduler_env["BENCH_PROFILE_DIR"])
        c = bl.BenchCluster(folder, server_flags=server_flags, backend=self.backends[self.backend], **scheduler_env)
        try:
            c.start()
            for _ in range(replicas - 1):
                c.start_replica()
            for i in range(agents):
                c.start_agent(f"node-{i + 1}", slots=slots, **(agent_env or {}))
            if agents:
                c.wait_nodes_healthy(*[f"node-{i + 1}" for i in range(agents)], timeout=60)
        except BaseException:
            c.stop()
            raise
        self.detect(c.scheduler_url)
        return c

    def detect(self, url: str) -> None:
        if self.features:
            return
        claim, why = bl.claim_route(url, probe=self.local)
        self.features = {"claim_route": claim, "claim_route_detail": why,
                         "agent_long_poll": self.local and bl.agent_long_poll_supported(),
                         "batch_route": None}
        self.batcher = bl.BatchSubmitter()

    def probe_batch(self, url: str, request: dict) -> None:
        if self.batcher.available is None:
            with requests.Session() as s:
                self.batcher.probe(s, url, request)
            self.features["batch_route"] = self.batcher.available
            self.features["batch_route_detail"] = self.batcher.reason
            bl.log(f"POST /jobs/batch: {self.batcher.reason}")

    def agent_mode(self, env: dict) -> str:
        if self.features.get("claim_route") and self.features.get("agent_long_poll") \
                and str(env.get("AGENT_LONG_POLL_SECS", "")) != "0":
            secs = env.get("AGENT_LONG_POLL_SECS", bl.agent_default("long_poll_secs"))
            return f"long-poll (AGENT_LONG_POLL_SECS={secs:g})"
        return f"polling every {env.get('POLL_INTERVAL_SECS')} s (and at once when a slot frees)"

    def warmup(self, c: bl.BenchCluster, n: int) -> None:
        """A few jobs through the whole path: the scheduler has then fetched the node
        list and every code path is imported and warm."""
        for _ in range(n):
            c.submit(command="true")
        if not wait_idle(c.scheduler_url, 60):
            raise RuntimeError("warm-up jobs did not finish within 60 s")

    # -- scenarios --

    def run(self) -> int:
        extra = {"mode": "quick" if self.args.quick else "full", "repeat": self.cfg.repeat,
                 "target": "local cluster" if self.local else {"scheduler_url": self.args.scheduler_url,
                                                                "registry_url": self.args.registry_url},
                 "scenarios": self.selected}
        try:
            if self.local:
                try:
                    self.backends = benchdb.choose(self.args.backends, self.args.database_url)
                    extra["backends"] = {name: b.describe() for name, b in self.backends.items()}
                except Exception as exc:  # PostgreSQL missing, not starting, or refusing us
                    self.failures += 1
                    bl.log(f"cannot use the database backends {self.args.backends}: {exc.__class__.__name__}: {exc}")
                    return 1
            else:
                self.backends = {"external": benchdb.Sqlite()}  # never used: no cluster is made
                extra["backends"] = {"external": "whatever the running scheduler uses"}
            names = list(self.backends)
            for r in range(self.cfg.repeat):
                bl.log(f"=== round {r + 1}/{self.cfg.repeat}")
                for self.backend in names if r % 2 == 0 else names[::-1]:
                    self.round(self.backend)
                self.backend = None
                self.record("placement", placement_pass, self.cfg)
                if self.local:
                    self.record("node_floor", node_floor, self.cfg)
        finally:
            self.backend = None
            self.report(extra)
            for backend in self.backends.values():
                backend.stop()
            if self.failures or self.args.keep_logs:
                bl.log(f"server and agent logs kept in {self.log_dir}")
            else:
                shutil.rmtree(self.log_dir, ignore_errors=True)
        return 1 if self.failures else 0

    def round(self, backend: str) -> None:
        """One run of every scenario that has a database, on `backend`."""
        if len(self.backends) > 1:
            bl.log(f"--- {backend}")
        self.guarded(self.round_submit, "submit_single", "submit_batch")
        if not self.local:
            for s in SCENARIOS[2:]:
                if s in self.selected:
                    self.skipped[s] = "needs a local cluster (--scheduler-url targets a running one)"
            return
        self.guarded(self.round_agents, "dispatch_latency", "throughput", "memory")
        self.guarded(self.round_cross_replica, "dispatch_cross_replica")
        self.guarded(self.round_baseline, "baseline")
        self.guarded(self.round_cpu_bound, "cpu_bound")
        self.guarded(self.round_capacity, "capacity")
        self.guarded(self.round_idle_fleet, "idle_fleet")
        self.guarded(self.round_schedules, "schedules")
        self.guarded(self.round_logs, "logs")
        self.guarded(self.round_submit_pending, "submit_pending")
        self.guarded(self.round_events_load, "events_load")
        self.guarded(self.round_submit_auth, "submit_auth")

    def guarded(self, round_fn, *scenarios: str) -> None:
        """Run one round of a group of scenarios; when its cluster cannot even be
        set up, record the error for each scenario of the group still to run."""
        before = {name: len(self.runs[name]) for name in scenarios if name in self.runs}
        try:
            round_fn()
        except Exception as exc:
            self.failures += 1
            bl.log(f"{', '.join(scenarios)}: failed: {exc.__class__.__name__}: {exc}")
            for name, count in before.items():
                if self.want(name) and len(self.runs[name]) == count:
                    self.runs[name].append({"error": f"{exc.__class__.__name__}: {exc}"})

    def round_submit(self) -> None:
        if not (self.want("submit_single") or self.want("submit_batch")):
            return
        if self.local:
            c = self.cluster("submit")
            url, request = c.scheduler_url, {"command": "true"}
            where = "local cluster without agents: jobs stay pending, unplaced"
        else:
            c, url = None, self.args.scheduler_url.rstrip("/")
            self.detect(url)
            request = {"command": "true", "instance_id": f"bench-no-such-node-{self.marker}"}
            where = f"running scheduler; jobs pinned to {request['instance_id']} (no such node) and cancelled after"
        first = bl.last_job_number(url)
        try:
            self.probe_batch(url, request)
            single = self.record("submit_single", self.submit_single, url, request, where, c)
            self.record("submit_batch", self.submit_batch, url, request, where, single)
        finally:
            if c is not None:
                c.stop()
            else:
                self.cancel_after(url, first)

    def round_submit_auth(self) -> None:
        if not self.want("submit_auth"):
            return
        c = self.cluster("submit-auth", CORRAL_API_TOKEN=AUTH_OPERATOR_TOKEN, CORRAL_AGENT_TOKEN=AUTH_AGENT_SECRET)
        try:
            self.record("submit_auth", self.submit_auth, c)
        finally:
            c.stop()

    def submit_auth(self, c: bl.BenchCluster) -> dict:
        """The single submits of submit_single with the bootstrap token, then with a personal
        token of a team's member: what finding who a token stands for costs a submit."""
        cfg, url = self.cfg, c.scheduler_url
        admin = {"Authorization": f"Bearer {AUTH_OPERATOR_TOKEN}"}
        for path, body in (("/teams", {"name": "bench"}), ("/users", {"name": "bench-user",
                                                                      "teams": {"bench": "member"}})):
            requests.post(url + path, json=body, headers=admin, timeout=10).raise_for_status()
        made = requests.post(url + "/tokens", json={"name": "bench", "user": "bench-user"}, headers=admin,
                             timeout=10)
        made.raise_for_status()
        callers = {"operator": admin, "personal": {"Authorization": f"Bearer {made.json()['token']}"}}
        request, out, pids = {"command": "true"}, {}, c.pids("scheduler")
        for name, headers in callers.items():
            submit_concurrently(url, request, max(cfg.submit_clients, cfg.submit_jobs // 10), cfg.submit_clients,
                                cfg.submit_secs, headers)  # warm-up, not counted
            before = bl.cpu_seconds(pids)
            res = submit_concurrently(url, request, cfg.submit_jobs, cfg.submit_clients, cfg.submit_secs, headers)
            if res["ok"] == 0:
                raise RuntimeError(f"no job was accepted with the {name} token: {res['last_error']}")
            out[f"{name}_jobs_per_sec"] = round(res["ok"] / res["elapsed"], 1)
            out[f"{name}_request_p50_ms"] = bl.ms(bl.percentile(res["latencies"], 50))
            out[f"{name}_request_p99_ms"] = bl.ms(bl.percentile(res["latencies"], 99))
            out[f"{name}_scheduler_cpu_ms_per_job"] = round(1000 * (bl.cpu_seconds(pids) - before) / res["ok"], 3)
        out["personal_to_operator_jobs_per_sec"] = bl.ratio(out["personal_jobs_per_sec"],
                                                           out["operator_jobs_per_sec"])
        out["personal_to_operator_cpu_per_job"] = bl.ratio(out["personal_scheduler_cpu_ms_per_job"],
                                                          out["operator_scheduler_cpu_ms_per_job"])
        self.settings["submit_auth"] = {"clients": cfg.submit_clients, "jobs": cfg.submit_jobs,
                                        "cluster": "local cluster with tokens, without agents", "request": request}
        return out

    def submit_single(self, url: str, request: dict, where: str, c: bl.BenchCluster | None) -> dict:
        cfg = self.cfg
        # Warm up first (every worker thread started, statements compiled, pages cached),
        # as the other scenarios do: a tenth of the jobs, not counted.
        submit_concurrently(url, request, max(cfg.submit_clients, cfg.submit_jobs // 10), cfg.submit_clients,
                            cfg.submit_secs)
        pids = c.pids("scheduler") if c is not None else []
        server_before, client_before, db_before = bl.cpu_seconds(pids), time.process_time(), self.database_cpu()
        res = submit_concurrently(url, request, cfg.submit_jobs, cfg.submit_clients, cfg.submit_secs)
        if res["ok"] == 0:
            raise RuntimeError(f"no job was accepted: {res['last_error']}")
        lat = res["latencies"]
        self.settings["submit_single"] = {"clients": cfg.submit_clients, "jobs": cfg.submit_jobs,
                                          "time_limit_secs": cfg.submit_secs, "cluster": where,
                                          "request": request, "client": "http.client, one keep-alive connection each"}
        out = {"jobs_per_sec": round(res["ok"] / res["elapsed"], 1), "jobs": res["ok"], "errors": res["errors"],
               "elapsed_secs": round(res["elapsed"], 3), "request_p50_ms": bl.ms(bl.percentile(lat, 50)),
               "request_p99_ms": bl.ms(bl.percentile(lat, 99)),
               # CPU per accepted job: the clients run on the same machine as the scheduler.
               "client_cpu_ms_per_job": round(1000 * (time.process_time() - client_before) / res["ok"], 3)}
        if pids:
            out["scheduler_cpu_ms_per_job"] = round(1000 * (bl.cpu_seconds(pids) - server_before) / res["ok"], 3)
        if db_before is not None:
            out["database_cpu_ms_per_job"] = round(1000 * (self.database_cpu() - db_before) / res["ok"], 3)
        return out

    def submit_batch(self, url: str, request: dict, where: str, single: dict | None) -> dict:
        if not self.batcher.available:
            raise Skip(self.batcher.reason)
        cfg = self.cfg
        res = submit_batches(url, self.batcher, request, cfg.submit_jobs, cfg.batch_size, cfg.submit_secs)
        self.settings["submit_batch"] = {"clients": 1, "batch_size": cfg.batch_size, "jobs": cfg.submit_jobs,
                                         "cluster": where, "body": self.batcher.reason}
        rate = round(res["ok"] / res["elapsed"], 1)
        out = {"jobs_per_sec": rate, "jobs": res["ok"], "elapsed_secs": round(res["elapsed"], 3),
               "request_p50_ms": bl.ms(bl.percentile(res["latencies"], 50)),
               "request_max_ms": bl.ms(max(res["latencies"]))}
        if single and bl.is_number(single.get("jobs_per_sec")):
            out["ratio_to_submit_single"] = bl.ratio(rate, single["jobs_per_sec"])
        return out

    def cancel_after(self, url: str, first: int) -> None:
        """Cancel what the bench submitted to a running scheduler (external mode)."""
        mine = [j for j in bl.jobs_after(url, first)
                if j.get("instance_id") == f"bench-no-such-node-{self.marker}" and j["status"] == "pending"]
        bl.log(f"cancelling the {len(mine)} jobs submitted to {url}")
        with requests.Session() as s:
            for j in mine:
                s.post(f"{url}/jobs/{j['job_id']}/cancel", json={}, timeout=10)

    def round_agents(self) -> None:
        if not any(self.want(s) for s in ("dispatch_latency", "throughput", "memory")):
            return
        cfg = self.cfg
        c = self.cluster("agents", agents=cfg.agents, slots=cfg.throughput_slots,
                         MAX_JOBS_PER_NODE=cfg.throughput_slots)
        try:
            self.probe_batch(c.scheduler_url, {"command": "true"})
            self.warmup(c, cfg.warmup_jobs)
            self.record("dispatch_latency", self.dispatch_latency, c)
            ran = self.record("throughput", self.throughput, c)
            if ran is None or "error" in ran:
                if self.want("memory") and "throughput" not in self.skipped:
                    self.runs["memory"].append({"error": "the throughput run failed"})
            else:
                self.record("memory", self.memory, c)
        finally:
            c.stop()

    def dispatch_latency(self, c: bl.BenchCluster) -> dict:
        cfg = self.cfg
        out = self.measure_dispatch(c, cfg.latency_jobs, cfg.latency_secs)
        env = c.agent_env["node-1"]
        self.settings["dispatch_latency"] = {
            "agents": cfg.agents, "slots": cfg.throughput_slots, "agent_mode": self.agent_mode(env),
            "measured": "submit (client clock, before POST) -> `date +%s.%N` written by the job",
            "one_at_a_time": True, "job_limit": cfg.latency_jobs, "time_limit_secs": cfg.latency_secs}
        return dict(out, agent_mode=self.agent_mode(env))

    def measure_dispatch(self, c: bl.BenchCluster, jobs: int, time_limit: float, gap: float = 0.0,
                         submit_url: str | None = None) -> dict:
        """Submit jobs one at a time (to `submit_url`, else the first scheduler), each
        after the previous one started; the latency is submit -> the job's first
        instruction (it writes `date +%s.%N` to a file).

        With `gap`, wait a random 0..gap s before each submit: a polling agent polls
        again right after its job ends, so back-to-back submits would always land
        just after a poll and wait the whole interval instead of half on average."""
        pause = random.Random(1234)
        folder = bl.shared_dir("corral-bench-stamps-")
        latencies, submit_rtts, missed = [], [], 0
        start = time.monotonic()
        try:
            with requests.Session() as s:
                for _ in range(jobs):
                    if time.monotonic() - start > time_limit:
                        break
                    if gap:
                        time.sleep(pause.uniform(0, gap))
                    stamp = f"{folder}/$CORRAL_JOB_ID"
                    command = f"date +%s.%N > {stamp}.tmp && mv {stamp}.tmp {stamp}"
                    t0 = time.time()
                    r = s.post((submit_url or c.scheduler_url) + "/jobs", json={"command": command}, timeout=30)
                    submit_rtts.append(time.time() - t0)
                    if r.status_code != 201:
                        raise RuntimeError(f"POST /jobs: {r.status_code} {r.text[:200]}")
                    path = os.path.join(folder, r.json()["job_id"])
                    deadline = time.monotonic() + self.cfg.latency_job_timeout
                    while not os.path.exists(path) and time.monotonic() < deadline:
                        time.sleep(0.002)
                    try:
                        with open(path) as f:
                            latencies.append(float(f.read()) - t0)
                    except (OSError, ValueError):
                        missed += 1
            # Leave the cluster idle for what comes next.
            wait_idle(c.scheduler_url, 30)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if not latencies:
            raise RuntimeError("no job started")
        return {"jobs": len(latencies), "missed": missed,
                "p50_ms": bl.ms(bl.percentile(latencies, 50)), "p99_ms": bl.ms(bl.percentile(latencies, 99)),
                "max_ms": bl.ms(max(latencies)), "mean_ms": bl.ms(sum(latencies) / len(latencies)),
                "submit_rtt_p50_ms": bl.ms(bl.percentile(submit_rtts, 50))}

    def run_jobs(self, c: bl.BenchCluster, command: str, total: int, time_limit: float) -> dict:
        """Submit `total` jobs up front, wait for all to finish, and measure from the
        API's timestamps: first submit -> last finished_at, and per job."""
        url = c.scheduler_url
        before = bl.last_job_number(url)
        agents = [n for n in c.procs if n not in ("registry", "scheduler")]
        sched_cpu = bl.CpuMeter(lambda: c.pids("scheduler"))
        machine_cpu = bl.MachineCpuMeter()
        agent_cpu0, db0 = bl.cpu_seconds([c.procs[a].pid for a in agents]), self.database_cpu()
        t0 = time.time()
        how = submit_all(url, self.batcher, {"command": command}, total, self.cfg)
        submitted = time.time()
        complete = wait_idle(url, time_limit)
        sched_pct = sched_cpu.percent()
        machine_pct = machine_cpu.percent()
        sched_secs = bl.cpu_seconds(sched_cpu.pids) - sched_cpu.start_cpu
        agent_secs = bl.cpu_seconds([c.procs[a].pid for a in agents]) - agent_cpu0
        db_secs = self.database_cpu() - db0 if db0 is not None else None
        jobs = bl.jobs_after(url, before)
        done = [j for j in jobs if j["status"] == "done"]
        finished = [j for j in jobs if j["status"] in bl.FINAL]
        if not finished:
            raise RuntimeError(f"none of the {total} jobs finished within {time_limit:.0f} s")
        end = max(bl.epoch(j["finished_at"]) for j in finished)
        per_job = [bl.epoch(j["finished_at"]) - bl.epoch(j["created_at"]) for j in done]
        to_start = [bl.epoch(j["running_at"]) - bl.epoch(j["created_at"]) for j in done if j["running_at"]]
        not_done = [{"job_id": j["job_id"], "status": j["status"], "exit_code": j["exit_code"],
                     "stderr": (j.get("stderr") or "")[-300:]} for j in jobs if j["status"] != "done"][:3]
        return {"jobs": total, "done": len(done), "failed": len(jobs) - len(done), "complete": complete,
                **({"not_done_examples": not_done} if not_done else {}),
                "jobs_per_sec": round(len(finished) / (end - t0), 2), "elapsed_secs": round(end - t0, 2),
                "submit_secs": round(submitted - t0, 2),
                "latency_p50_ms": bl.ms(bl.percentile(per_job, 50)),
                "latency_p99_ms": bl.ms(bl.percentile(per_job, 99)),
                "to_running_p50_ms": bl.ms(bl.percentile(to_start, 50)),
                "to_running_p99_ms": bl.ms(bl.percentile(to_start, 99)),
                "scheduler_cpu_pct": sched_pct, "machine_cpu_busy_pct": machine_pct,
                "scheduler_cpu_ms_per_job": round(1000 * sched_secs / total, 2),
                "agent_cpu_ms_per_job": round(1000 * agent_secs / total, 2),
                **({"database_cpu_ms_per_job": round(1000 * db_secs / total, 2)} if db_secs is not None else {}),
                "submitted_with": how, "_jobs": jobs}

    def throughput(self, c: bl.BenchCluster) -> dict:
        cfg = self.cfg
        out = self.run_jobs(c, "true", cfg.throughput_jobs, cfg.throughput_secs)
        out.pop("_jobs")
        env = c.agent_env["node-1"]
        self.settings["throughput"] = {"agents": cfg.agents, "AGENT_SLOTS": cfg.throughput_slots,
                                       "MAX_JOBS_PER_NODE": cfg.throughput_slots, "command": "true",
                                       "agent_mode": self.agent_mode(env), "time_limit_secs": cfg.throughput_secs,
                                       "latency": "created_at -> finished_at from the API (ms precision)"}
        out["agent_mode"] = self.agent_mode(env)
        return out

    def memory(self, c: bl.BenchCluster) -> dict:
        out = {}
        for server in ("scheduler", "registry"):
            master, *workers = c.pids(server)
            m = bl.memory_kb(master)
            out[f"{server}_master_hwm_mb"] = round(m.get("VmHWM", 0) / 1024, 1)
            out[f"{server}_master_rss_mb"] = round(m.get("VmRSS", 0) / 1024, 1)
            ws = [bl.memory_kb(w) for w in workers]
            out[f"{server}_workers"] = len(ws)
            out[f"{server}_worker_hwm_mb_max"] = round(max((w.get("VmHWM", 0) for w in ws), default=0) / 1024, 1)
            out[f"{server}_worker_rss_mb_sum"] = round(sum(w.get("VmRSS", 0) for w in ws) / 1024, 1)
        agents = [bl.memory_kb(c.procs[n].pid) for n in c.procs if n not in ("registry", "scheduler")]
        out["agent_hwm_mb_max"] = round(max(a.get("VmHWM", 0) for a in agents) / 1024, 1)
        out["agent_rss_mb_max"] = round(max(a.get("VmRSS", 0) for a in agents) / 1024, 1)
        self.settings["memory"] = {"when": "right after the throughput run, on its cluster",
                                   "source": "/proc/<pid>/status VmHWM (peak RSS) and VmRSS"}
        return out

    def round_cross_replica(self) -> None:
        if not self.want("dispatch_cross_replica"):
            return
        cfg = self.cfg
        c = self.cluster("cross", agents=cfg.agents, slots=cfg.throughput_slots, replicas=2,
                         MAX_JOBS_PER_NODE=cfg.throughput_slots)
        try:
            other = c.scheduler_urls[1]
            wait_scheduler_sees_healthy(other, [f"node-{i + 1}" for i in range(cfg.agents)], timeout=60)
            self.warmup(c, cfg.warmup_jobs)
            self.record("dispatch_cross_replica", self.dispatch_cross_replica, c, other)
        finally:
            c.stop()

    def dispatch_cross_replica(self, c: bl.BenchCluster, other: str) -> dict:
        cfg = self.cfg
        # Warm the other replica's workers too: its first requests import and compile.
        with requests.Session() as s:
            for _ in range(cfg.warmup_jobs):
                s.post(other + "/jobs", json={"command": "true"}, timeout=30).raise_for_status()
        wait_idle(c.scheduler_url, 60)
        out = self.measure_dispatch(c, cfg.latency_jobs, cfg.latency_secs, submit_url=other)
        env = c.agent_env["node-1"]
        self.settings["dispatch_cross_replica"] = {
            "schedulers": 2, "agents": cfg.agents, "slots": cfg.throughput_slots, "agent_mode": self.agent_mode(env),
            "agents_claim_from": "the first scheduler", "jobs_submitted_to": "the second scheduler",
            "measured": "submit (client clock, before POST) -> `date +%s.%N` written by the job",
            "one_at_a_time": True, "job_limit": cfg.latency_jobs, "time_limit_secs": cfg.latency_secs}
        return dict(out, agent_mode=self.agent_mode(env))

    # -- simulated agents --

    def fleet_cluster(self, name: str, agents: int, replicas: int, slots: int = 1) -> bl.BenchCluster:
        """A cluster for simulated agents: `replicas` schedulers whose workers each have
        a thread for every agent that may keep a claim waiting there (the kernel does
        not spread connections evenly over workers), plus 32."""
        threads = -(-agents // replicas) + 32
        return self.cluster(name, server_flags={"scheduler": ["--threads", str(threads)]}, replicas=replicas,
                            MAX_JOBS_PER_NODE=slots)

    def start_fleet(self, c: bl.BenchCluster, agents: int, slots: int) -> sf.Fleet:
        """Simulated agents spread over the cluster's schedulers, registered, and seen
        healthy by every scheduler (placement goes by the scheduler's node list)."""
        if not self.features.get("claim_route"):
            raise Skip(f"needs the long-poll claim: {self.features.get('claim_route_detail')}")
        fleet = sf.Fleet(c.scheduler_urls, c.registry_url, agents, True, sf.FULL, slots=slots)
        try:
            fleet.start()
            for url in c.scheduler_urls:
                wait_scheduler_sees_healthy(url, fleet.node_ids, timeout=120)
        except BaseException:
            self.stop_fleet(fleet)
            raise
        return fleet

    @staticmethod
    def stop_fleet(fleet: sf.Fleet, c: bl.BenchCluster | None = None) -> None:
        """Stop the simulated agents (and the cluster): with their servers gone, every
        thread ends within a request."""
        fleet.shutdown()
        if c is not None:
            c.stop()
        deadline = time.monotonic() + 15
        for t in fleet.threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    def replicas_for_capacity(self) -> int:
        # Several replicas on one PostgreSQL is what that backend is for; one SQLite
        # file takes one writer at a time, wherever it comes from.
        return 2 if self.backend == "postgresql" else 1

    def round_with_fleet(self, scenario: str, agents: int, replicas: int, slots: int, warm_up, measure) -> None:
        """One run of `scenario` on a fresh cluster of `replicas` schedulers and
        `agents` simulated agents: warm_up(c, fleet), then measure(c, fleet)."""
        if not self.want(scenario):
            return
        c = self.fleet_cluster(scenario, agents, replicas, slots)
        fleet = None
        try:
            fleet = self.start_fleet(c, agents, slots)
            warm_up(c, fleet)
            self.record(scenario, measure, c, fleet)
        except Skip as exc:
            self.skipped[scenario] = str(exc)
            bl.log(f"{scenario}: skipped: {exc}")
        finally:
            if fleet is not None:
                self.stop_fleet(fleet, c)
            else:
                c.stop()

    def round_capacity(self) -> None:
        cfg = self.cfg
        self.round_with_fleet("capacity", cfg.capacity_agents, self.replicas_for_capacity(), cfg.capacity_slots,
                              self.warm_capacity, self.capacity)

    def warm_capacity(self, c: bl.BenchCluster, fleet: sf.Fleet) -> None:
        """A quarter of the slots' worth of jobs through the whole path, in batches."""
        cfg = self.cfg
        self.probe_batch(c.scheduler_url, {"command": "true"})
        if not self.batcher.available:
            raise Skip(f"needs POST /jobs/batch: {self.batcher.reason}")
        self.make_teams(c)
        warm, _, failed = self.submit_spread(c, cfg.capacity_agents * cfg.capacity_slots // 4, 2, 60)
        if failed:
            raise RuntimeError(f"warm-up: {failed}")
        if not wait_done(fleet, warm, 60):
            raise RuntimeError(f"warm-up jobs were not done within 60 s ({fleet.last_error})")

    def make_teams(self, c: bl.BenchCluster) -> None:
        """--capacity-teams N: N teams, each guaranteed an equal part of the slots."""
        cfg = self.cfg
        share = max(1, cfg.capacity_agents * cfg.capacity_slots // max(1, cfg.capacity_teams))
        for t in range(cfg.capacity_teams):
            team = f"bench-{t:02d}"
            made = requests.post(f"{c.scheduler_url}/teams", json={"name": team}, timeout=30)
            quota = requests.put(f"{c.scheduler_url}/teams/{team}/quota", json={"guaranteed": {"jobs": share}},
                                 timeout=30)
            if made.status_code != 201 or quota.status_code != 200:
                raise RuntimeError(f"team {team}: {made.status_code} {made.text[:200]} / {quota.status_code} "
                                   f"{quota.text[:200]}")

    def batch_items(self, i: int, size: int) -> list[dict]:
        """Batch i's jobs: `true`, of team i mod --capacity-teams when teams are asked for."""
        teams = self.cfg.capacity_teams
        return [{"command": "true", **({"team": f"bench-{i % teams:02d}"} if teams else {})}] * size

    def submit_spread(self, c: bl.BenchCluster, total: int, batches: int, time_limit: float
                      ) -> tuple[list[str], int, str | None]:
        """Submit `total` `true` jobs in `batches` batches, to the schedulers in turn,
        from `capacity_submitters` clients at once, for at most `time_limit` seconds. A
        batch answered 503 (the database was busy; nothing was stored) is sent again
        after a second, as a client would. Returns the job ids, how many batches were
        sent again, and why the submitting stopped early (None: it did not)."""
        urls = c.scheduler_urls
        deadline = time.monotonic() + time_limit
        sizes = [total // batches + (1 if i < total % batches else 0) for i in range(batches)]
        ids: dict[int, list[str]] = {}
        retried, stopped = 0, []
        lock = threading.Lock()

        def client(first: int) -> None:
            nonlocal retried
            with requests.Session() as s:
                for i in range(first, batches, self.cfg.capacity_submitters):
                    while not stopped:
                        if time.monotonic() > deadline:
                            stopped.append(f"the time limit ({time_limit:g} s) passed while submitting")
                            return
                        try:
                            jobs = self.batcher.submit(s, urls[i % len(urls)], self.batch_items(i, sizes[i]))
                            break
                        except bl.Refused as exc:
                            if exc.status != 503:
                                stopped.append(str(exc))
                                return
                            with lock:
                                retried += 1
                            time.sleep(1.0)
                    else:
                        return
                    ids[i] = [j["job_id"] for j in jobs]

        threads = [threading.Thread(target=client, args=(k,)) for k in range(self.cfg.capacity_submitters)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return [job_id for i in sorted(ids) for job_id in ids[i]], retried, (stopped[0] if stopped else None)

    def capacity(self, c: bl.BenchCluster, fleet: sf.Fleet) -> dict:
        cfg = self.cfg
        total, batches = cfg.capacity_jobs, -(-cfg.capacity_jobs // cfg.capacity_batch)
        meters = {"scheduler": bl.CpuMeter(lambda: c.pids("schedulers")),
                  "registry": bl.CpuMeter(lambda: c.pids("registry"))}
        own, machine, db0 = bl.SelfCpuMeter(), bl.MachineCpuMeter(), self.database_cpu()
        requests_before = fleet.begin_phase("capacity")
        t0 = time.time()
        ids, retried, stopped = self.submit_spread(c, total, batches, cfg.capacity_secs)
        submitted = time.time()
        complete = wait_done(fleet, ids, max(1.0, cfg.capacity_secs - (submitted - t0)))
        elapsed_cpu = {name: m.seconds() for name, m in meters.items()}
        own_secs, machine_pct = own.seconds(), machine.percent()
        db_secs = self.database_cpu() - db0 if db0 is not None else None
        sent, errors = fleet.requests_since(requests_before), fleet.errors_now()
        with fleet.lock:
            done = [fleet.done_at[j] for j in ids if j in fleet.done_at]
            left = [j for j in ids if j not in fleet.done_at]
        if not done:
            raise RuntimeError(f"none of the {total} jobs was done within {cfg.capacity_secs:.0f} s "
                               f"({fleet.last_error})")
        end = max(done)
        stats = job_counts(c.scheduler_url)
        self.settings["capacity"] = {
            "schedulers": len(c.scheduler_urls), "scheduler_workers": 2,
            "scheduler_threads": int(c.extra_flags["scheduler"][1]), "simulated_agents": cfg.capacity_agents,
            "slots": cfg.capacity_slots, "MAX_JOBS_PER_NODE": cfg.capacity_slots,
            "agents_spread": "agent i talks to scheduler i mod schedulers",
            "jobs": total, "submitted": f"POST /jobs/batch x{cfg.capacity_batch}, to the schedulers in turn, "
                                        f"all up front from {cfg.capacity_submitters} clients at once",
            "agent": "claims max 8 (long poll 20 s, with the agent's limits); a job 'runs' 0 s; the done reports "
                     "of what one answer handed out go in one POST /jobs/reports with a claim for 8 riding on it; "
                     "heartbeats every 5 s, lease renewals every 5 s while holding jobs",
            "measured": "first submit -> the last done report accepted; CPU from /proc over that window",
            "time_limit_secs": cfg.capacity_secs,
            "teams": (f"{cfg.capacity_teams} teams, each guaranteed an equal part of the slots, a batch each in "
                      "turn: quotas and fair share on") if cfg.capacity_teams else "none (one team: no quotas, "
                                                                                     "queue order)"}
        out = {"jobs": total, "submitted": len(ids), "done": len(done), "complete": complete and not stopped,
               "jobs_per_sec": round(len(done) / (end - t0), 1), "elapsed_secs": round(end - t0, 2),
               "submit_secs": round(submitted - t0, 2), "submit_batches_sent_again": retried,
               "scheduler_cpu_ms_per_job": round(1000 * elapsed_cpu["scheduler"] / len(done), 3),
               "registry_cpu_ms_per_job": round(1000 * elapsed_cpu["registry"] / len(done), 3),
               "database_cpu_ms_per_job": round(1000 * db_secs / len(done), 3) if db_secs is not None else None,
               "simulator_cpu_ms_per_job": round(1000 * own_secs / len(done), 3),
               "scheduler_cpu_pct": round(100 * elapsed_cpu["scheduler"] / (end - t0), 1),
               "database_cpu_pct": round(100 * db_secs / (end - t0), 1) if db_secs is not None else None,
               "simulator_cpu_pct": round(100 * own_secs / (end - t0), 1),
               "machine_cpu_busy_pct": machine_pct,
               "jobs_per_report_batch": round(len(done) / sent["report_batch"], 2) if sent.get("report_batch")
               else None,
               **fleet.latency_stats("capacity"),
               "requests": sent, "errors": sum(errors.values()), "errors_by_kind": errors,
               "api_done": stats.get("done"), "api_failed": stats.get("failed"),
               "api_pending_or_running": stats["pending"] + stats["running"] if stats else None}
        if left:  # what became of the jobs no agent reported done: their rows and events, for the log
            out["not_done_examples"] = [job_story(c.scheduler_url, job_id) for job_id in left[:3]]
            bl.log(f"capacity: {len(left)} job(s) not reported done, for example: {out['not_done_examples']}")
        if errors:
            out["last_error"] = fleet.last_error
        if stopped:
            out["submitting_stopped"] = stopped
        return out

    def round_idle_fleet(self) -> None:
        self.round_with_fleet("idle_fleet", self.cfg.idle_agents, 2, 1, self.warm_idle_fleet, self.idle_fleet)

    def warm_idle_fleet(self, c: bl.BenchCluster, fleet: sf.Fleet) -> None:
        """A few jobs through every scheduler (each has then fetched the node list and
        every code path is warm), then a pause for their claims and reports to settle."""
        urls = c.scheduler_urls
        with requests.Session() as s:
            warm = [s.post(urls[i % len(urls)] + "/jobs", json={"command": "true"}, timeout=30).json()["job_id"]
                    for i in range(sf.FULL.warmup_jobs)]
        if not fleet.wait_claimed(warm, 60):
            raise RuntimeError(f"warm-up jobs were not claimed within 60 s ({fleet.last_error})")
        time.sleep(self.cfg.idle_settle_secs)

    def idle_fleet(self, c: bl.BenchCluster, fleet: sf.Fleet) -> dict:
        cfg = self.cfg
        replicas = {name: bl.CpuMeter(lambda name=name: c.pids(name)) for name in ("scheduler", *c.replicas)}
        registry = bl.CpuMeter(lambda: c.pids("registry"))
        own, machine, db0 = bl.SelfCpuMeter(), bl.MachineCpuMeter(), self.database_cpu()
        requests_before = fleet.begin_phase("idle")
        start = time.monotonic()
        time.sleep(cfg.idle_secs)
        elapsed = time.monotonic() - start
        per_replica = [m.percent() for m in replicas.values()]
        db_secs = self.database_cpu() - db0 if db0 is not None else None
        sent = {k: round(v / elapsed, 1) for k, v in fleet.requests_since(requests_before).items()}
        errors = fleet.errors_now()
        self.settings["idle_fleet"] = {
            "schedulers": len(per_replica), "scheduler_workers": 2,
            "scheduler_threads": int(c.extra_flags["scheduler"][1]),
            "simulated_agents": cfg.idle_agents, "agents_spread": "agent i talks to scheduler i mod schedulers",
            "agent": "long-poll claims (max 1, wait 20 s), heartbeats every 5 s, a lease renewal every "
                     f"{fleet.idle_renew_secs:g} s when idle", "window_secs": cfg.idle_secs}
        out = {"agents": cfg.idle_agents, "idle_secs": round(elapsed, 1),
               "schedulers_cpu_pct": round(sum(per_replica), 2), "scheduler_cpu_pct_each": per_replica,
               "registry_cpu_pct": registry.percent(),
               "database_cpu_pct": round(100 * db_secs / elapsed, 2) if db_secs is not None else None,
               "simulator_cpu_pct": own.percent(), "machine_cpu_busy_pct": machine.percent(),
               "requests_per_sec": round(sum(sent.values()), 1), "requests_per_sec_by_kind": sent,
               **fleet.latency_stats("idle"), "errors": sum(errors.values()), "errors_by_kind": errors}
        if errors:
            out["last_error"] = fleet.last_error
        return out

    def round_schedules(self) -> None:
        if not self.want("schedules"):
            return
        cfg = self.cfg
        c = self.cluster("schedules", agents=cfg.agents, slots=cfg.throughput_slots,
                         MAX_JOBS_PER_NODE=cfg.throughput_slots)
        try:
            self.warmup(c, cfg.warmup_jobs)
            self.record("schedules", self.schedules, c)
        finally:
            c.stop()

    def schedules(self, c: bl.BenchCluster) -> dict:
        """`schedule_count` schedules every second, from the same whole second, for
        `schedule_secs`: each slot's lag to its job's creation (the firing pass) and to
        its start (running_at), both on the scheduler's clock, and the scheduler's CPU."""
        cfg = self.cfg
        url = c.scheduler_url
        if requests.get(url + "/schedules", timeout=10).status_code == 404:
            raise Skip("this scheduler has no /schedules")
        first = float(math.ceil(time.time()) + 2)
        names = [f"bench-{i}" for i in range(cfg.schedule_count)]
        for name in names:
            requests.post(url + "/schedules", timeout=10, json={
                "name": name, "interval_secs": 1, "start_at": iso(first), "catch_up": "none",
                "job": {"command": "true"}}).raise_for_status()
        time.sleep(max(0.0, first - time.time()))
        meter, machine = bl.CpuMeter(lambda: c.pids("scheduler")), bl.MachineCpuMeter()
        time.sleep(cfg.schedule_secs - 0.5)   # slots first .. first + schedule_secs - 1 come due
        cpu, busy = meter.percent(), machine.percent()
        for name in names:
            requests.patch(f"{url}/schedules/{name}", json={"enabled": False}, timeout=10).raise_for_status()
        wait_idle(url, 60)
        jobs = [j for j in all_jobs(url).values()
                if j["schedule"] in names and epoch(j["slot"]) < first + cfg.schedule_secs]
        per_slot = collections.Counter((j["schedule"], j["slot"]) for j in jobs)
        created = [1000 * (epoch(j["created_at"]) - epoch(j["slot"])) for j in jobs]
        started = [1000 * (epoch(j["running_at"]) - epoch(j["slot"])) for j in jobs if j["running_at"]]
        self.settings["schedules"] = {
            "schedules": cfg.schedule_count, "interval_secs": 1, "window_secs": cfg.schedule_secs,
            "agents": cfg.agents, "slots": cfg.throughput_slots, "job": "true",
            "measured": "slot -> job created_at (lag) and running_at (start lag), the scheduler's clock"}
        return {"slots": cfg.schedule_count * cfg.schedule_secs, "jobs": len(jobs),
                "slots_with_two_jobs": sum(1 for n in per_slot.values() if n > 1),
                "lag_p50_ms": rounded(bl.percentile(created, 50)), "lag_p99_ms": rounded(bl.percentile(created, 99)),
                "lag_max_ms": rounded(max(created, default=None)),
                "start_lag_p50_ms": rounded(bl.percentile(started, 50)),
                "start_lag_p99_ms": rounded(bl.percentile(started, 99)),
                "scheduler_cpu_pct": cpu, "machine_cpu_busy_pct": busy}

    def round_logs(self) -> None:
        if not self.want("logs"):
            return
        cfg = self.cfg
        c = self.cluster("logs", agents=cfg.agents, slots=cfg.throughput_slots, MAX_JOBS_PER_NODE=cfg.throughput_slots)
        try:
            self.warmup(c, cfg.warmup_jobs)
            self.record("logs", self.logs, c)
        finally:
            c.stop()

    def logs(self, c: bl.BenchCluster) -> dict:
        """`log_jobs` jobs that each write `log_mb` MiB of random bytes to stdout as fast
        as they can: how fast their complete output is stored (from the first submit
        until every stream is complete), the CPU the scheduler and the agents spend on
        each MiB, and how fast one job's output reads back."""
        cfg = self.cfg
        url = c.scheduler_url
        probe = requests.get(url + "/jobs/job-1/logs", timeout=10)  # warmup's job: there on every version
        if probe.status_code == 404 and "no such resource" in probe.text:
            raise Skip("this scheduler has no /jobs/{id}/logs")
        size = cfg.log_mb * 1024 * 1024
        agents = lambda: [c.procs[name].pid for name in c.procs if name.startswith("node-")]  # noqa: E731
        scheduler_cpu, agent_cpu = bl.CpuMeter(lambda: c.pids("scheduler")), bl.CpuMeter(agents)
        began = time.monotonic()
        job_ids = [requests.post(url + "/jobs", json={"command": f"head -c {size} /dev/urandom"}, timeout=30)
                   .json()["job_id"] for _ in range(cfg.log_jobs)]
        pending = set(job_ids)
        while pending and time.monotonic() - began < cfg.log_secs:
            for job_id in list(pending):
                answer = requests.get(f"{url}/jobs/{job_id}/logs", params={"limit": 1}, timeout=30)
                if answer.headers.get("X-Corral-Log-Complete") == "true":
                    pending.discard(job_id)
            time.sleep(0.05)
        elapsed = time.monotonic() - began
        stored = cfg.log_jobs * size / 2 ** 20
        scheduler_secs, agent_secs = scheduler_cpu.seconds(), agent_cpu.seconds()
        read_began, offset = time.monotonic(), 0
        with requests.Session() as s:
            while True:
                piece = s.get(f"{url}/jobs/{job_ids[0]}/logs", params={"offset": offset}, timeout=30).content
                if not piece:
                    break
                offset += len(piece)
        read_secs = time.monotonic() - read_began
        self.settings["logs"] = {"jobs": cfg.log_jobs, "mib_each": cfg.log_mb, "agents": cfg.agents,
                                 "slots": cfg.throughput_slots, "command": f"head -c {size} /dev/urandom",
                                 "storage": "the database (CORRAL_LOG_BUCKET unset)",
                                 "measured": "first submit -> every job's stdout complete (polled every 50 ms); "
                                             "CPU of the scheduler's and the agents' processes over that window; "
                                             "one job's output read back 1 MiB at a time"}
        return {"jobs": cfg.log_jobs, "complete": cfg.log_jobs - len(pending), "mib": round(stored, 1),
                "seconds": round(elapsed, 2), "stored_mb_per_sec": round(stored / elapsed, 1),
                "scheduler_cpu_ms_per_mb": round(1000 * scheduler_secs / stored, 1),
                "agent_cpu_ms_per_mb": round(1000 * agent_secs / stored, 1),
                "read_mb_per_sec": round(offset / 2 ** 20 / read_secs, 1) if read_secs > 0 else None,
                "read_bytes_ok": offset == size}

    def round_submit_pending(self) -> None:
        if not self.want("submit_pending"):
            return
        cfg = self.cfg
        # One slot per node, and a bound on pending jobs well above what the scenario adds.
        c = self.cluster("pending", agents=cfg.agents, slots=1, MAX_JOBS_PER_NODE=1,
                         MAX_PENDING_JOBS=10 * (cfg.pending_fill + 2 * cfg.pending_submits))
        try:
            self.record("submit_pending", self.submit_pending, c)
        finally:
            c.stop()

    def submit_pending(self, c: bl.BenchCluster) -> dict:
        """What a submit costs as the queue grows: every node's slot taken by a long job,
        POST /jobs from `submit_clients` clients with no job pending, then again once
        `pending_fill` pending jobs were added straight into the database (the queue a
        burst of arrays leaves). Each measure follows a warm-up of a tenth of its jobs."""
        cfg = self.cfg
        url = c.scheduler_url
        blockers = [c.submit(command="sleep 600")["job_id"] for _ in range(cfg.agents)]
        deadline = time.monotonic() + 60
        while job_counts(url).get("running") != cfg.agents:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {cfg.agents} long jobs did not all start within 60 s")
            time.sleep(0.1)
        request = {"command": "true"}

        def measure() -> dict:
            submit_concurrently(url, request, max(cfg.submit_clients, cfg.pending_submits // 10), cfg.submit_clients,
                                cfg.submit_secs)
            res = submit_concurrently(url, request, cfg.pending_submits, cfg.submit_clients, cfg.submit_secs)
            if res["ok"] == 0:
                raise RuntimeError(f"no job was accepted: {res['last_error']}")
            return res

        empty = measure()
        started = time.monotonic()
        benchdb.fill_pending(c.databases.get("scheduler"), os.path.join(c.state_dir, "scheduler.db"),
                             cfg.pending_fill, time.time())
        fill_secs = time.monotonic() - started
        full = measure()
        pending = job_counts(url).get("pending")
        for job_id in blockers:
            requests.post(f"{url}/jobs/{job_id}/cancel", json={}, timeout=10)
        self.settings["submit_pending"] = {
            "clients": cfg.submit_clients, "jobs_per_measure": cfg.pending_submits, "added": cfg.pending_fill,
            "agents": cfg.agents, "slots": 1, "request": request,
            "cluster": "every slot held by a `sleep 600` job: every submitted job stays pending, unplaced"}
        p50, p99 = (bl.percentile(empty["latencies"], q) for q in (50, 99))
        full_p50, full_p99 = (bl.percentile(full["latencies"], q) for q in (50, 99))
        return {"empty_p50_ms": bl.ms(p50), "empty_p99_ms": bl.ms(p99),
                "pending_p50_ms": bl.ms(full_p50), "pending_p99_ms": bl.ms(full_p99),
                "p50_ratio": bl.ratio(full_p50, p50), "p99_ratio": bl.ratio(full_p99, p99),
                "pending_jobs": pending, "errors": empty["errors"] + full["errors"], "fill_secs": round(fill_secs, 2)}

    def round_events_load(self) -> None:
        if not self.want("events_load"):
            return
        cfg = self.cfg
        # Caps at the streams opened, so that every stream is open whichever worker takes
        # it (the worst case for their cost); the claims keep 128 - 8 - 100 threads each.
        caps = {"EVENTS_STREAMS_MAX": cfg.event_streams, "EVENTS_STREAMS_PER_CREDENTIAL": cfg.event_streams}
        c = self.cluster("events", agents=cfg.agents, slots=1, MAX_JOBS_PER_NODE=1, **caps)
        try:
            self.warmup(c, cfg.warmup_jobs)
            self.record("events_load", self.events_load, c)
        finally:
            c.stop()

    def events_load(self, c: bl.BenchCluster) -> dict:
        """Submit latency and submit-to-done with no stream open, then with
        `event_streams` idle streams open (each a connection that read its headers and
        is left open); and the scheduler's CPU over `events_idle_secs` of each, idle."""
        cfg = self.cfg
        url = c.scheduler_url
        request = {"command": "true"}

        def measure() -> dict:
            cpu = bl.CpuMeter(lambda: c.pids("scheduler"))
            time.sleep(cfg.events_idle_secs)
            idle_pct = cpu.percent()
            submit_concurrently(url, request, max(cfg.submit_clients, cfg.events_submits // 10), cfg.submit_clients,
                                cfg.submit_secs)
            res = submit_concurrently(url, request, cfg.events_submits, cfg.submit_clients, cfg.submit_secs)
            if res["ok"] == 0:
                raise RuntimeError(f"no job was accepted: {res['last_error']}")
            wait_idle(url, 120)
            done = submit_to_done(url, cfg.events_done_jobs, 60.0)
            return {"p50": bl.percentile(res["latencies"], 50), "p99": bl.percentile(res["latencies"], 99),
                    "done_p50": bl.percentile(done, 50), "done_p99": bl.percentile(done, 99),
                    "idle_cpu_pct": idle_pct, "errors": res["errors"]}

        none = measure()
        streams, refused = open_streams(url, cfg.event_streams)
        try:
            loaded = measure()
        finally:
            for sock in streams:
                sock.close()
        self.settings["events_load"] = {
            "streams": cfg.event_streams, "EVENTS_STREAMS_MAX": cfg.event_streams,
            "EVENTS_STREAMS_PER_CREDENTIAL": cfg.event_streams,
            "clients": cfg.submit_clients, "jobs_per_measure": cfg.events_submits, "agents": cfg.agents,
            "done_jobs": cfg.events_done_jobs, "request": request,
            "done": "POST /jobs -> GET /jobs/{id} says done (polled every 5 ms), one job at a time"}
        return {"streams_open": len(streams), "streams_refused": refused,
                "none_p50_ms": bl.ms(none["p50"]), "none_p99_ms": bl.ms(none["p99"]),
                "streams_p50_ms": bl.ms(loaded["p50"]), "streams_p99_ms": bl.ms(loaded["p99"]),
                "none_done_p50_ms": bl.ms(none["done_p50"]), "none_done_p99_ms": bl.ms(none["done_p99"]),
                "streams_done_p50_ms": bl.ms(loaded["done_p50"]), "streams_done_p99_ms": bl.ms(loaded["done_p99"]),
                "p99_ratio": bl.ratio(loaded["p99"], none["p99"]),
                "none_idle_cpu_pct": round(none["idle_cpu_pct"], 1),
                "streams_idle_cpu_pct": round(loaded["idle_cpu_pct"], 1),
                "errors": none["errors"] + loaded["errors"]}

    def round_baseline(self) -> None:
        if not self.want("baseline"):
            return
        cfg = self.cfg
        env = {"AGENT_LONG_POLL_SECS": 0, "POLL_INTERVAL_SECS": cfg.baseline_poll_secs}
        c = self.cluster("baseline", agents=cfg.agents, slots=1, agent_env=env, MAX_JOBS_PER_NODE=1)
        try:
            self.probe_batch(c.scheduler_url, {"command": "true"})
            self.warmup(c, cfg.warmup_jobs)
            self.record("baseline", self.baseline, c, env)
        finally:
            c.stop()

    def baseline(self, c: bl.BenchCluster, env: dict) -> dict:
        cfg = self.cfg
        out = self.run_jobs(c, "true", cfg.baseline_jobs, cfg.baseline_secs)
        out.pop("_jobs")
        # Dispatch latency in this mode too, measured as dispatch_latency measures it.
        latency = self.measure_dispatch(c, cfg.baseline_latency_jobs, cfg.latency_secs, gap=cfg.baseline_poll_secs)
        out.update({f"dispatch_{k}": v for k, v in latency.items() if k in ("jobs", "p50_ms", "p99_ms", "max_ms")})
        lp = self.runs.get("dispatch_latency", [])
        if lp and bl.is_number(lp[-1].get("p50_ms")):
            out["dispatch_p50_ratio_to_dispatch_latency"] = bl.ratio(out["dispatch_p50_ms"], lp[-1]["p50_ms"])
        self.settings["baseline"] = {"agents": cfg.agents, "AGENT_SLOTS": 1, "MAX_JOBS_PER_NODE": 1,
                                     "AGENT_LONG_POLL_SECS": 0, "POLL_INTERVAL_SECS": cfg.baseline_poll_secs,
                                     "command": "true", "agent_mode": self.agent_mode(c.agent_env["node-1"]),
                                     "dispatch_jobs": f"{cfg.baseline_latency_jobs}, one at a time after the "
                                                      f"throughput run, as in dispatch_latency, each after a random "
                                                      f"0-{cfg.baseline_poll_secs:g} s pause (a random poll phase)"}
        # The same round's throughput run, for a ratio of runs made minutes apart.
        runs = self.runs.get("throughput", [])
        if runs and len(runs) == len(self.runs["baseline"]) + 1:
            out["ratio_throughput_to_baseline"] = bl.ratio(runs[-1].get("jobs_per_sec"), out["jobs_per_sec"])
        return out

    def round_cpu_bound(self) -> None:
        if not self.want("cpu_bound"):
            return
        if self.args.quick and not self.args.with_cpu_bound:
            self.skipped["cpu_bound"] = "--quick (add --with-cpu-bound to run it)"
            return
        cfg = self.cfg
        if self.cpu_command is None:
            self.calibrate()
        result: dict = {}
        try:
            for slots in cfg.cpu_slots:
                c = self.cluster(f"cpu-{slots}", agents=cfg.agents, slots=slots,
                                 MAX_JOBS_PER_NODE=max(cfg.cpu_slots))
                try:
                    self.probe_batch(c.scheduler_url, {"command": "true"})
                    self.warmup(c, 2)
                    result.update(self.cpu_bound(c, slots))
                finally:
                    c.stop()
        except Exception as exc:
            result = {"error": f"{exc.__class__.__name__}: {exc}"}
            self.failures += 1
        base = result.get(f"slots_{cfg.cpu_slots[0]}_jobs_per_sec")
        for slots in cfg.cpu_slots[1:]:
            result[f"slots_{slots}_speedup"] = bl.ratio(result.get(f"slots_{slots}_jobs_per_sec"), base)
        losses = sum(result.get(k, 0) for k in result if k.endswith(("_node_losses", "_lost_events",
                                                                        "_unhealthy_seen")))
        result["false_node_losses"] = losses
        result["no_false_node_loss"] = losses == 0 and "error" not in result
        if losses:  # the assertion of this scenario: saturated CPUs must not look like a lost node
            self.failures += 1
            bl.log(f"cpu_bound: FAILED: {losses} node losses or unhealthy sightings while the CPUs were busy")
        self.runs["cpu_bound"].append(result)
        bl.log("cpu_bound: " + ", ".join(f"{k}={v}" for k, v in result.items()))
        self.settings["cpu_bound"] = {
            "agents": cfg.agents, "jobs_per_setting": cfg.cpu_jobs, "slots": list(cfg.cpu_slots),
            "MAX_JOBS_PER_NODE": max(cfg.cpu_slots), "HEARTBEAT_TIMEOUT_SECS": 20, "HEARTBEAT_INTERVAL_SECS": 5,
            "job": f"{self.cpu_command[:60]}... (chained SHA-256, no sleeps)", **self.cpu_calibration,
            "note": (f"{cfg.cpu_jobs} jobs per setting instead of 200, to keep the whole run bounded "
                     f"({cfg.cpu_jobs * cfg.cpu_job_secs:.0f} CPU-s per setting)"),
            "checked": "no job event mentions a lost or unhealthy node, node_losses == 0 for every job, "
                       "and the registry never showed a node unhealthy (polled every 0.5 s)"}

    def calibrate(self) -> None:
        """Iterations of chained SHA-256 that take cpu_job_secs of CPU here."""
        python = self.args.job_python
        code = "import hashlib;h=b'x';[h:=hashlib.sha256(h).digest() for _ in range({n})]"
        n, rate = 200_000, None
        for _ in range(3):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([python, "-c", code.format(n=n)], check=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            rate = max(rate or 0, n / used)  # the fastest run: the least disturbed by neighbours
        n = int(rate * self.cfg.cpu_job_secs)
        self.cpu_command = f"{python} -c \"{code.format(n=n)}\""
        self.cpu_calibration = {"sha256_iterations": n, "python": python,
                                "calibrated_cpu_secs_per_job": self.cfg.cpu_job_secs}
        bl.log(f"cpu_bound: {n} SHA-256 iterations take about {self.cfg.cpu_job_secs} s of CPU here")

    def cpu_bound(self, c: bl.BenchCluster, slots: int) -> dict:
        cfg = self.cfg
        seen = {"unhealthy": 0, "max_age": 0.0}
        stop = threading.Event()

        def watch():  # the registry's view while the CPUs are saturated
            with requests.Session() as s:
                while not stop.wait(0.5):
                    try:
                        nodes = s.get(c.registry_url + "/nodes", timeout=5).json()
                    except (requests.RequestException, ValueError):
                        continue
                    now = time.time()
                    for n in nodes:
                        seen["unhealthy"] += n["status"] != "healthy"
                        seen["max_age"] = max(seen["max_age"], now - (bl.epoch(n["last_heartbeat"]) or now))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            out = self.run_jobs(c, self.cpu_command, cfg.cpu_jobs, cfg.cpu_secs)
        finally:
            stop.set()
            watcher.join(5)
        jobs = out.pop("_jobs")
        lost_events = 0
        with requests.Session() as s:
            for j in jobs:
                events = s.get(f"{c.scheduler_url}/jobs/{j['job_id']}/events", timeout=10).json()
                lost_events += sum(1 for e in events
                                   if "lost" in (e["reason"] or "") or "not healthy" in (e["reason"] or ""))
        cpu = [j["cpu_seconds"] for j in jobs if bl.is_number(j.get("cpu_seconds"))]
        nproc = len(os.sched_getaffinity(0))
        mean_cpu = sum(cpu) / len(cpu) if cpu else cfg.cpu_job_secs
        p = f"slots_{slots}_"
        return {p + "jobs_per_sec": out["jobs_per_sec"], p + "done": out["done"], p + "failed": out["failed"],
                p + "elapsed_secs": out["elapsed_secs"], p + "latency_p50_ms": out["latency_p50_ms"],
                p + "job_cpu_secs_mean": round(mean_cpu, 3),
                # Share of the machine's CPUs spent in the jobs themselves.
                p + "cpu_efficiency": round(out["jobs_per_sec"] * mean_cpu / nproc, 3),
                p + "node_losses": sum(j.get("node_losses") or 0 for j in jobs),
                p + "lost_events": lost_events, p + "unhealthy_seen": seen["unhealthy"],
                p + "max_heartbeat_age_secs": round(seen["max_age"], 2)}

    # -- output --

    def report(self, extra: dict) -> None:
        """The meta line, then a line per scenario and backend (NO_DATABASE scenarios: one,
        with backend null), in the order of SCENARIOS and of the backends, then the
        `targets` line (check_targets)."""
        bl.emit(bl.meta(dict(extra, features=self.features, loadavg_at_end=bl.loadavg()), self.started))
        lines = []
        for scenario in self.selected:
            for backend in [None] if scenario in NO_DATABASE else list(self.backends) or [None]:
                self.backend = backend
                lines.append(self.line(scenario))
                bl.emit(lines[-1])
        self.backend = None
        targets = check_targets(lines, self.args.quick)
        for check in targets["checks"]:
            bl.log(f"target {check['scenario']} on {check['backend']}: {check['field']} {check['target']}: "
                   f"median {check['median']} -> {'met' if check['met'] else 'MISSED'}")
        bl.emit(targets)

    def line(self, scenario: str) -> dict:
        """The output line of a scenario on the current backend."""
        line: dict = {"scenario": scenario, "backend": self.backend}
        runs = self.runs[scenario]
        good = [r for r in runs if "error" not in r]
        if scenario in self.skipped and not good:
            line["skipped"] = self.skipped[scenario]
        elif not runs:
            line["skipped"] = "not run (interrupted)"
        elif not good:
            line["error"] = runs[-1]["error"]
            line["runs"] = runs
        else:
            line.update(bl.medians(good))
            line["repeat"] = len(good)
            if len(good) < len(runs):
                line["failed_runs"] = len(runs) - len(good)
            self.add_ratios(scenario, line)
            self.add_backend_ratios(scenario, line)
            line["settings"] = self.settings.get(scenario, {})
            line["runs"] = runs
        return line

    def add_backend_ratios(self, scenario: str, line: dict) -> None:
        """On every backend but the first: its medians over the first backend's, for the
        fields of COMPARED (from the same run, rounds interleaved)."""
        names = list(self.backends)
        if self.backend is None or len(names) < 2 or self.backend == names[0]:
            return
        first = [r for r in self.runs_by.get(names[0], {}).get(scenario, []) if "error" not in r]
        if not first:
            return
        theirs = bl.medians(first)
        line[f"ratio_to_{names[0]}"] = {field: bl.ratio(line.get(field), theirs.get(field))
                                        for field in COMPARED.get(scenario, ())}

    def add_ratios(self, scenario: str, line: dict) -> None:
        """Ratios of medians, beside the median of the per-round ratios."""
        def median_of(name, field="jobs_per_sec"):
            good = [r[field] for r in self.runs.get(name, []) if bl.is_number(r.get(field))]
            return statistics.median(good) if good else None
        if scenario == "submit_batch":
            line["ratio_of_medians_to_submit_single"] = bl.ratio(line.get("jobs_per_sec"), median_of("submit_single"))
        if scenario == "baseline":
            line["ratio_of_medians_throughput_to_baseline"] = bl.ratio(median_of("throughput"),
                                                                       line.get("jobs_per_sec"))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small smoke run: few jobs, one repeat, no cpu_bound")
    parser.add_argument("--repeat", type=int, help="runs of each scenario (default 3; --quick: 1)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated subset of {','.join(SCENARIOS)}")
    parser.add_argument("--skip", default="", help="comma-separated scenarios to leave out")
    parser.add_argument("--with-cpu-bound", action="store_true", help="run cpu_bound even with --quick")
    parser.add_argument("--capacity-teams", type=int, default=0, metavar="N",
                        help="capacity: submit the jobs as N teams', batch by batch in turn, each team guaranteed "
                             "an equal part of the slots (borrowing without limit): quotas and fair share on")
    parser.add_argument("--backends", help="comma-separated storage backends to run every scenario on, "
                                           f"interleaved: {','.join(benchdb.BACKENDS)} (default sqlite)")
    parser.add_argument("--postgres", action="store_true",
                        help="short for --backends postgresql: a throwaway PostgreSQL server the bench starts "
                             "(fsync=on, synchronous_commit=on)")
    parser.add_argument("--database-url", metavar="postgresql://USER@HOST:PORT/DB",
                        help="the PostgreSQL server of the postgresql backend instead of a throwaway one (implies "
                             "--backends postgresql unless given); its role must be allowed to create databases: "
                             "every cluster gets fresh ones, dropped after it")
    parser.add_argument("--scheduler-url", help="measure a running scheduler instead (submit scenarios only)")
    parser.add_argument("--registry-url", help="its registry (recorded in the output)")
    parser.add_argument("--job-python", default="/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3",
                        help="interpreter the cpu_bound jobs run (must be usable by the job user)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the servers' and agents' logs")
    parser.add_argument("--profile", metavar="DIR",
                        help="profile the CPU of the schedulers' request threads (scripts/profile_requests.py): "
                             "a pstats file per worker in DIR/<cluster>/; slows them down about twofold")
    args = parser.parse_args(argv)
    wanted = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = [s for s in [*wanted, *skip] if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}")
    args.scenarios = [s for s in wanted if s not in skip]
    if args.postgres and args.backends:
        parser.error("--postgres is short for --backends postgresql: give one of them")
    default = "postgresql" if args.postgres or args.database_url else "sqlite"
    args.backends = [b.strip() for b in (args.backends or default).split(",") if b.strip()]
    if not args.backends or any(b not in benchdb.BACKENDS for b in args.backends) \
            or len(set(args.backends)) < len(args.backends):
        parser.error(f"--backends takes each of {', '.join(benchdb.BACKENDS)} at most once")
    if args.database_url and not benchdb.is_postgres_url(args.database_url):
        parser.error("--database-url must be a postgresql:// URL (SQLite is each cluster's own file)")
    if args.database_url and "postgresql" not in args.backends:
        parser.error("--database-url is the postgresql backend's server: add postgresql to --backends")
    if args.profile:
        args.profile = os.path.abspath(args.profile)
        if os.path.exists(args.profile) and os.listdir(args.profile):
            parser.error(f"--profile {args.profile}: not an empty directory")
    if args.scheduler_url and (args.postgres or args.database_url or args.backends != ["sqlite"]):
        parser.error("--scheduler-url measures a running scheduler on whatever database it has: "
                     "no --backends, --postgres or --database-url with it")
    if args.scheduler_url:
        for name in ("scheduler_url", "registry_url"):
            value = getattr(args, name)
            if value and not value.startswith(("http://127.", "http://localhost")):
                parser.error(f"--{name.replace('_', '-')} must be on this machine (http://127.0.0.1:PORT)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if args.repeat:
        cfg = replace(cfg, repeat=max(1, args.repeat))
    if args.capacity_teams:
        cfg = replace(cfg, capacity_teams=max(0, args.capacity_teams))
    if args.scheduler_url is None and not os.access(os.path.join(bl.BIN, "corral-scheduler"), os.X_OK):
        print("bench: run this with the project's virtualenv (.venv/bin/python scripts/bench.py, or make bench)",
              file=sys.stderr)
        return 2
    # SIGTERM unwinds like Ctrl-C: every cluster is stopped in its `finally`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # idle_fleet holds a connection and a thread per simulated agent, and the servers
    # (which inherit the limit) one per agent too: raise the open-file limit, keep stacks small.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    threading.stack_size(512 * 1024)
    return Bench(args, cfg).run()


if __name__ == "__main__":
    sys.exit(main())
