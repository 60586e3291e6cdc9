#!/usr/bin/env python3
"""Simulate a fleet of agents against a real scheduler and registry.

For each fleet size (--sizes 50,200,500) this starts a registry and a scheduler
under gunicorn (temporary state, 127.0.0.1 only) and runs that many simulated
agents in this one process: threads and requests, no extra dependency. Each
simulated agent registers, heartbeats to the registry every
HEARTBEAT_INTERVAL_SECS (5 s, spread over the interval), renews its lease with
the scheduler as the agent does (every heartbeat while it holds a job, else once
a minute; --idle-renew-secs 0 renews every heartbeat, as agents did before),
and takes work: with the long-poll claim (`POST /nodes/{id}/claim`, max 1, wait
20 s, answering its X-Corral-Long-Poll header as the agent does) when the
scheduler has it, else the original way (`GET /jobs?node_id=…&status=pending`
every POLL_INTERVAL_SECS and at once after a job, then a `running` report as the
claim). `--mode polling` forces the original way, `--mode both` runs each size
both ways. A job "runs" at once (or for --job-secs) and is reported `done`.

Measured per size, one JSON line each (after a {"scenario": "meta"} line):
  - the CPU the scheduler (gunicorn master + workers, from /proc/<pid>/stat
    utime+stime) and the registry use, as % of one core, while the fleet is
    idle (no jobs) and under a steady job stream (--rate, 20 jobs/s);
  - dispatch latency p50/p99/max: submit (before the POST) -> the simulated
    agent has the job (claim answered, or its running report accepted);
  - this process's own CPU, to show the load generator was not the limit, and
    how busy the whole machine was;
  - p50/p99/max of lease renewals, heartbeats, done reports and submits in
    each window, and how many renewals took over 5 s (a real agent gives up on
    a renewal after 5 s, and fences itself after 20 s without one).

Threads: one per simulated agent (it blocks in its long-poll), plus a few that
send every agent's heartbeats and lease renewals, plus the submitters. The
scheduler gets `--threads` = agents + 32 per gunicorn worker unless told
otherwise: every waiting long-poll holds a gthread thread, and the kernel does
not spread connections evenly over the workers, so each worker must be able to
hold them all.
"""
from __future__ import annotations

import argparse
import collections
import heapq
import os
import random
import resource
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace

import requests

import benchlib as bl

# Set on an empty claim answer that did not wait: "busy" (the waiting room was full),
# "stopping" (the worker is shutting down), "again" (ask again at once) -- docs/dispatch.md.
LONG_POLL_HEADER = "X-Corral-Long-Poll"
# What a real agent sends with its claims on a node with cgroups (agent/agent.py
# default_limits, agent/settings.py defaults), and with a `true` job's done report.
AGENT_CLAIM_FIELDS = {"limits_enforced": True, "private_tmp": True,
                      "default_limits": {"run": {"memory_mb": 512, "cpu_percent": 100, "max_processes": 1024},
                                         "service": {"memory_mb": 1024, "cpu_percent": 200, "max_processes": 1024}}}
DONE_FIELDS = {"status": "done", "exit_code": 0, "stdout": "", "stderr": "", "oom_killed": False}


def done_report(job: dict, node_id: str) -> dict:
    """A `true` job's done report as a real agent sends it: the peak memory and CPU time
    its cgroup measured, which differ from job to job (the scheduler writes reports
    with values of their own differently from alike ones)."""
    return {"job_id": job["job_id"], "node_id": node_id, "attempt": job["attempt"], **DONE_FIELDS,
            "peak_memory_bytes": (256 + random.randrange(256)) * 4096,
            "cpu_seconds": round(0.001 + random.random() * 0.002, 6)}


@dataclass(frozen=True)
class Config:
    idle_secs: float = 60.0      # a whole IDLE_RENEW_SECS: every idle agent renews once in it
    stream_secs: float = 30.0
    rate: float = 20.0
    settle_secs: float = 5.0
    drain_secs: float = 30.0
    warmup_jobs: int = 10
    long_poll_secs: float = 20.0
    poll_interval: float = 3.0
    heartbeat_interval: float = 5.0
    idle_renew_secs: float | None = None  # None: the agent's own (IDLE_RENEW_SECS); 0: every heartbeat
    job_secs: float = 0.0
    workers: int = 2
    threads: int | None = None      # None: agents + 32 per worker
    repeat: int = 1


FULL = Config()
QUICK = Config(idle_secs=3.0, stream_secs=3.0, rate=5.0, settle_secs=1.0, drain_secs=15.0, warmup_jobs=2)


class Fleet:
    """N simulated agents in this process.

    With `scheduler_urls` naming several scheduler replicas, agent i talks to the
    i-th modulo their number. With `slots` > 1, each agent claims as many jobs as it
    has slots and reports their ends as a real agent does when several end at once:
    in one POST /jobs/reports with the claim for its freed slots riding on it (what
    that claim hands out runs next; when it hands out nothing, a long-poll claim
    waits for work)."""

    def __init__(self, scheduler_urls: str | list[str], registry_url: str, size: int, long_poll: bool,
                 cfg: Config, slots: int = 1):
        urls = [scheduler_urls] if isinstance(scheduler_urls, str) else list(scheduler_urls)
        self.scheduler_url = urls[0]  # where the job stream goes
        self.registry_url = registry_url
        self.size = size
        self.long_poll = long_poll
        self.cfg = cfg
        self.slots = slots
        self.node_ids = [f"sim-{i:04d}" for i in range(size)]
        self.scheduler_of = {node_id: urls[i % len(urls)] for i, node_id in enumerate(self.node_ids)}
        self.done_at: dict[str, float] = {}  # job id -> when its done report was accepted
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.claimed_at: dict[str, float] = {}
        self.submitted_at: dict[str, float] = {}
        self.requests = collections.Counter()
        self.phase = "start"   # "idle", "stream": latencies are kept per phase
        self.latency: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
        self.errors = collections.Counter()
        self.last_error: str | None = None
        self.registered = threading.Semaphore(0)
        self.threads: list[threading.Thread] = []
        # As the agent does: renew the lease every heartbeat while holding a job (or
        # when polling: no claim renews it), else every idle_renew_secs.
        self.idle_renew_secs = idle_renew_secs(cfg) if long_poll else 0.0
        self.holding: set[str] = set()         # nodes with a job claimed and not yet reported
        self.renewed_at: dict[str, float] = {}

    # -- bookkeeping --

    def count(self, kind: str, took: float | None = None) -> None:
        with self.lock:
            self.requests[kind] += 1
            if took is not None:
                self.latency[(self.phase, kind)].append(took)

    def error(self, kind: str, what: str) -> None:
        with self.lock:
            self.errors[kind] += 1
            self.last_error = f"{kind}: {what}"

    def http(self, session: requests.Session, method: str, url: str, kind: str, timed: bool = True,
             **kwargs) -> requests.Response | None:
        """One request, counted (and timed, per phase); None when it failed to complete."""
        t0 = time.perf_counter()
        try:
            r = session.request(method, url, **kwargs)
        except requests.RequestException as exc:
            if not self.stop.is_set():
                self.error(kind, repr(exc)[:200])
            return None
        self.count(kind, time.perf_counter() - t0 if timed else None)
        return r

    def begin_phase(self, phase: str) -> collections.Counter:
        """Keep latencies under `phase` from now on; the requests sent so far."""
        with self.lock:
            self.phase = phase
            return collections.Counter(self.requests)

    def requests_since(self, before: collections.Counter) -> dict[str, int]:
        """Requests sent since `before` (begin_phase's answer), by kind."""
        with self.lock:
            return {kind: n - before[kind] for kind, n in self.requests.items() if n - before[kind]}

    def errors_now(self) -> dict[str, int]:
        with self.lock:
            return dict(self.errors)

    def latency_stats(self, phase: str) -> dict:
        """p50/p99/max (ms) of the heartbeat, lease and report calls made during `phase`."""
        out = {}
        with self.lock:
            for kind in ("lease", "heartbeat", "report_done", "report_batch", "submit"):
                values = self.latency.get((phase, kind), [])
                if values:
                    out[f"{phase}_{kind}_p50_ms"] = bl.ms(bl.percentile(values, 50))
                    out[f"{phase}_{kind}_p99_ms"] = bl.ms(bl.percentile(values, 99))
                    out[f"{phase}_{kind}_max_ms"] = bl.ms(max(values))
            # The real agent gives a lease renewal 5 s (membership.LEASE_TIMEOUT) before it
            # counts it as failed; 20 s of failed renewals and it stops its jobs.
            out[f"{phase}_leases_over_5s"] = sum(1 for t in self.latency.get((phase, "lease"), []) if t > 5.0)
        return out

    # -- threads --

    def start(self) -> None:
        beaters = max(2, min(50, self.size // 10))
        for k in range(beaters):
            self._spawn(self._beat_loop, self.node_ids[k::beaters], name=f"beat-{k}")
        for _ in self.node_ids:  # every node registered before anyone asks for work
            if not self.registered.acquire(timeout=120):
                raise RuntimeError("the simulated agents did not all register within 120 s")
        for node_id in self.node_ids:
            self._spawn(self._work_loop, node_id, name=f"work-{node_id}")

    def _spawn(self, target, *args, name: str) -> None:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        t.start()
        self.threads.append(t)

    def _beat_loop(self, node_ids: list[str]) -> None:
        """Register, then heartbeat and renew the lease of these nodes, each every
        heartbeat_interval, spread evenly over the interval."""
        registry, scheduler = requests.Session(), requests.Session()
        interval = self.cfg.heartbeat_interval
        due = []
        for node_id in node_ids:
            self._register(registry, node_id)
            self._renew(scheduler, node_id)
            self.registered.release()
            heapq.heappush(due, (time.monotonic() + random.uniform(0, interval), node_id))
        while due and not self.stop.is_set():
            when, node_id = heapq.heappop(due)
            if self.stop.wait(max(0.0, when - time.monotonic())):
                break
            r = self.http(registry, "POST", f"{self.registry_url}/nodes/{node_id}/heartbeat", "heartbeat",
                          json={"running": 0}, timeout=10)
            if r is not None and r.status_code == 404:
                self._register(registry, node_id)
            elif r is not None and r.status_code != 200:
                self.error("heartbeat", f"{r.status_code} {r.text[:100]}")
            if node_id in self.holding or time.monotonic() - self.renewed_at[node_id] >= self.idle_renew_secs:
                self._renew(scheduler, node_id)
            heapq.heappush(due, (when + interval, node_id))
        registry.close()
        scheduler.close()

    def _register(self, session: requests.Session, node_id: str) -> None:
        # Sized as a real agent with this many slots: room for every slot's job at the
        # defaults it reserves (512 MB and 100% CPU for a `run` job), and those defaults.
        body = {"node_id": node_id, "address": "127.0.0.1", "kind": "compute", "slots": self.slots,
                "cpus": self.slots, "memory_mb": 1024 * self.slots, "max_memory_mb": 1024 * self.slots,
                "max_cpu_percent": 100 * self.slots, "labels": {"sim": "1"},
                "default_limits": AGENT_CLAIM_FIELDS["default_limits"], "reserved_memory_mb": 0,
                "reserved_cpu_percent": 0}
        r = self.http(session, "POST", self.registry_url + "/nodes", "register", json=body, timeout=10)
        if r is not None and r.status_code not in (200, 201):
            self.error("register", f"{r.status_code} {r.text[:100]}")

    def _renew(self, session: requests.Session, node_id: str) -> None:
        self.renewed_at[node_id] = time.monotonic()
        r = self.http(session, "POST", f"{self.scheduler_of[node_id]}/nodes/{node_id}/lease", "lease", json={},
                      timeout=10)
        if r is not None and r.status_code != 200:
            self.error("lease", f"{r.status_code} {r.text[:100]}")

    def _work_loop(self, node_id: str) -> None:
        session = requests.Session()
        if self.long_poll:
            # Agents started at different times do not time out their long-polls
            # together: the first wait is random, later ones are the full wait.
            first_wait = random.uniform(1.0, self.cfg.long_poll_secs)
        elif self.stop.wait(random.uniform(0, self.cfg.poll_interval)):  # spread the polls likewise
            return
        while not self.stop.is_set():
            if self.long_poll:
                self._claim(session, node_id, first_wait or self.cfg.long_poll_secs)
                first_wait = None
            elif not self._poll(session, node_id):
                # Like the real agent: poll again at once when a slot freed.
                self.stop.wait(self.cfg.poll_interval)
        session.close()

    def _claim(self, session: requests.Session, node_id: str, wait: float) -> None:
        started = time.monotonic()
        body = {"max": self.slots, "wait_secs": wait, **(AGENT_CLAIM_FIELDS if self.slots > 1 else {})}
        r = self.http(session, "POST", f"{self.scheduler_of[node_id]}/nodes/{node_id}/claim", "claim", timed=False,
                      json=body, timeout=wait + 30)
        now = time.time()
        if r is None or r.status_code != 200:
            if r is not None:
                self.error("claim", f"{r.status_code} {r.text[:100]}")
            self.stop.wait(1.0)
            return
        jobs = r.json()
        if isinstance(jobs, dict):
            jobs = jobs.get("jobs", [])
        self._claimed(jobs, now)
        if self.slots > 1:
            self._run_batches(session, node_id, jobs)
        for job in jobs if self.slots == 1 else ():
            self.holding.add(node_id)
            try:
                self._run(session, node_id, job)
            finally:
                self.holding.discard(node_id)
        # As the agent does (Claims.claim_once): "again" (work came after the claim had
        # waited a while) asks again at once; "busy" (the waiting room was full),
        # "stopping", or an empty answer well before the wait was over, after
        # POLL_INTERVAL_SECS.
        not_waited = r.headers.get(LONG_POLL_HEADER)
        if not_waited:
            self.count(f"claim_{not_waited}")
        if not_waited == "again":
            return
        if not_waited or (not jobs and time.monotonic() - started < wait / 2):
            self.stop.wait(self.cfg.poll_interval)

    def _claimed(self, jobs: list[dict], when: float) -> None:
        with self.lock:
            for job in jobs:
                self.claimed_at.setdefault(job["job_id"], when)

    def _run_batches(self, session: requests.Session, node_id: str, jobs: list[dict]) -> None:
        """Run `jobs` at once, then report them all with a claim for the freed slots
        riding on the reports; again with what that claim handed out, until it hands
        out nothing."""
        self.holding.add(node_id)
        try:
            while jobs and not self.stop.is_set():
                if self.cfg.job_secs:
                    time.sleep(self.cfg.job_secs)
                reports = [done_report(job, node_id) for job in jobs]
                body = {"reports": reports, "claim": {"node_id": node_id, "max": self.slots, **AGENT_CLAIM_FIELDS}}
                r = self.http(session, "POST", f"{self.scheduler_of[node_id]}/jobs/reports", "report_batch",
                              json=body, timeout=30)
                if r is not None and r.status_code != 200:
                    self.error("report_batch", f"{r.status_code} {r.text[:100]}")
                if r is None or r.status_code >= 500:
                    self.stop.wait(1.0)  # as the agent does: the reports are sent again
                    continue
                if r.status_code != 200:
                    return
                answer, now = r.json(), time.time()
                with self.lock:
                    for report, result in zip(reports, answer["results"]):
                        if result["code"] == 200:
                            self.done_at.setdefault(report["job_id"], now)
                        else:
                            self.errors["report_done"] += 1
                            self.last_error = f"report_done: {result}"
                jobs = answer.get("claimed", [])
                self._claimed(jobs, now)
        finally:
            self.holding.discard(node_id)

    def _poll(self, session: requests.Session, node_id: str) -> bool:
        """One poll; True when a job was taken (and has already finished)."""
        r = self.http(session, "GET", self.scheduler_of[node_id] + "/jobs", "poll",
                      params={"node_id": node_id, "status": "pending"}, timeout=30)
        if r is None or r.status_code != 200:
            if r is not None:
                self.error("poll", f"{r.status_code} {r.text[:100]}")
            self.stop.wait(1.0)
            return False
        took = False
        for job in r.json():
            if self._report(session, node_id, job, "running", limits_enforced=False) is None:
                continue
            with self.lock:
                self.claimed_at.setdefault(job["job_id"], time.time())
            self._run(session, node_id, job)
            took = True
        return took

    def _run(self, session: requests.Session, node_id: str, job: dict) -> None:
        if self.cfg.job_secs:
            time.sleep(self.cfg.job_secs)
        self._report(session, node_id, job, "done", exit_code=0, stdout="", stderr="")

    def _report(self, session: requests.Session, node_id: str, job: dict, status: str, **fields) -> dict | None:
        body = {"node_id": node_id, "attempt": job["attempt"], "status": status, **fields}
        r = self.http(session, "POST", f"{self.scheduler_of[node_id]}/jobs/{job['job_id']}/status",
                      f"report_{status}", json=body, timeout=30)
        if r is None or r.status_code != 200:
            if r is not None:
                self.error(f"report_{status}", f"{r.status_code} {r.text[:100]}")
            return None
        if status == "done":
            with self.lock:
                self.done_at.setdefault(job["job_id"], time.time())
        return r.json()

    # -- the job stream --

    def submit_stream(self, rate: float, seconds: float, clients: int = 8) -> int:
        """Submit `rate` jobs a second for `seconds`, on a fixed schedule shared by
        `clients` threads (a slow answer does not slow the stream down)."""
        total = int(rate * seconds)
        start = time.monotonic()
        counter = iter(range(total))
        lock = threading.Lock()

        def client():
            session = requests.Session()
            while True:
                with lock:
                    i = next(counter, None)
                if i is None or self.stop.is_set():
                    break
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                t0 = time.time()
                r = self.http(session, "POST", self.scheduler_url + "/jobs", "submit", json={"command": "true"},
                              timeout=30)
                if r is None:
                    continue
                if r.status_code != 201:
                    self.error("submit", f"{r.status_code} {r.text[:100]}")
                    continue
                with self.lock:
                    self.submitted_at[r.json()["job_id"]] = t0
            session.close()

        threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 60)
        return total

    def wait_claimed(self, job_ids, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with self.lock:
                if all(j in self.claimed_at for j in job_ids):
                    return True
            time.sleep(0.05)
        return False

    def shutdown(self) -> None:
        self.stop.set()


def idle_renew_secs(cfg: Config) -> float:
    """How often an idle simulated agent renews its lease: --idle-renew-secs, else the
    agent's own IDLE_RENEW_SECS."""
    if cfg.idle_renew_secs is not None:
        return cfg.idle_renew_secs
    from corral.agent.lease import IDLE_RENEW_SECS
    return IDLE_RENEW_SECS


class Skip(Exception):
    """The mode asked for is not available in this scheduler."""


def one_size(size: int, mode: str, cfg: Config, log_root: str) -> dict:
    threads = cfg.threads or size + 32
    folder = os.path.join(log_root, f"fleet-{size}-{len(os.listdir(log_root))}")
    os.makedirs(folder)
    cluster = bl.BenchCluster(folder, server_flags={"scheduler": ["--threads", str(threads)]})
    fleet = None
    try:
        cluster.start_registry()
        cluster.start_scheduler(workers=cfg.workers)
        s_url, r_url = cluster.scheduler_url, cluster.registry_url
        long_poll, why = bl.claim_route(s_url)
        if mode == "long-poll" and not long_poll:
            raise Skip(why)
        if mode == "polling":
            long_poll, why = False, "--mode polling (the original agents' way)"
        bl.log(f"fleet {size}: scheduler --workers {cfg.workers} --threads {threads}; "
               f"{'long-poll claims' if long_poll else 'polling'} ({why})")
        fleet = Fleet(s_url, r_url, size, long_poll, cfg)
        fleet.start()
        bl.log(f"fleet {size}: {size} agents registered; warming up")
        # The scheduler fetches the node list every NODE_REFRESH_SECS; a few jobs
        # through the whole path show it has (and warm every code path).
        warm = []
        with requests.Session() as s:
            for _ in range(cfg.warmup_jobs):
                warm.append(s.post(s_url + "/jobs", json={"command": "true"}, timeout=30).json()["job_id"])
        if not fleet.wait_claimed(warm, 60):
            raise RuntimeError(f"warm-up jobs were not claimed within 60 s ({fleet.last_error})")
        time.sleep(cfg.settle_secs)

        bl.log(f"fleet {size}: idle for {cfg.idle_secs:.0f} s")
        fleet.phase = "idle"
        idle = measure(cluster, fleet, lambda: time.sleep(cfg.idle_secs))
        fleet.phase = "stream"

        bl.log(f"fleet {size}: {cfg.rate:g} jobs/s for {cfg.stream_secs:.0f} s")
        stream = measure(cluster, fleet, lambda: fleet.submit_stream(cfg.rate, cfg.stream_secs))
        with fleet.lock:
            submitted = dict(fleet.submitted_at)
        drained = fleet.wait_claimed(list(submitted), cfg.drain_secs)
        fleet.phase = "drain"
        with fleet.lock:
            latencies = [fleet.claimed_at[j] - t for j, t in submitted.items() if j in fleet.claimed_at]
        memory = [bl.memory_kb(pid) for pid in cluster.pids("scheduler")[1:]]
        result = {
            "agents": size, "mode": "long-poll" if long_poll else "polling",
            "idle_secs": cfg.idle_secs,
            "idle_scheduler_cpu_pct": idle["scheduler"], "idle_registry_cpu_pct": idle["registry"],
            "idle_simulator_cpu_pct": idle["simulator"], "idle_machine_cpu_busy_pct": idle["machine"],
            "idle_requests_per_sec": idle["requests_per_sec"],
            "stream_secs": cfg.stream_secs, "stream_rate_target": cfg.rate,
            # Below the target when submits were slower than the schedule.
            "stream_rate_achieved": round(len(submitted) / max(stream["elapsed"], cfg.stream_secs), 2),
            "stream_scheduler_cpu_pct": stream["scheduler"], "stream_registry_cpu_pct": stream["registry"],
            "stream_simulator_cpu_pct": stream["simulator"], "stream_machine_cpu_busy_pct": stream["machine"],
            "stream_requests_per_sec": stream["requests_per_sec"],
            "jobs": len(submitted), "claimed": len(latencies), "all_claimed": drained,
            "dispatch_p50_ms": bl.ms(bl.percentile(latencies, 50)),
            "dispatch_p99_ms": bl.ms(bl.percentile(latencies, 99)),
            "dispatch_max_ms": bl.ms(max(latencies)) if latencies else None,
            "scheduler_worker_rss_mb_sum": round(sum(m.get("VmRSS", 0) for m in memory) / 1024, 1),
            "scheduler_worker_hwm_mb_max": round(max((m.get("VmHWM", 0) for m in memory), default=0) / 1024, 1),
            **fleet.latency_stats("idle"), **fleet.latency_stats("stream"),
            "errors": sum(fleet.errors.values()), "errors_by_kind": dict(fleet.errors),
            "last_error": fleet.last_error, "simulator_threads": threading.active_count(),
            "loadavg_at_end": bl.loadavg(),
            "idle_requests_by_kind": idle["by_kind"], "stream_requests_by_kind": stream["by_kind"],
        }
        settings = {"scheduler_workers": cfg.workers, "scheduler_threads": threads, "worker_class": "gthread",
                    "claim": f"POST /nodes/{{id}}/claim max=1 wait_secs={cfg.long_poll_secs:g}" if long_poll
                    else f"GET /jobs?node_id=…&status=pending every {cfg.poll_interval:g} s + running report",
                    "claim_route_detail": why, "heartbeat_every_secs": cfg.heartbeat_interval,
                    "lease_renewal": (f"every {cfg.heartbeat_interval:g} s while holding a job, else every "
                                      f"{fleet.idle_renew_secs:g} s" if fleet.idle_renew_secs
                                      else f"every {cfg.heartbeat_interval:g} s"),
                    "agent_slots": 1, "job_secs": cfg.job_secs,
                    "scheduler_env": dict(bl.PRODUCTION_SCHEDULER_ENV, MAX_JOBS_PER_NODE=1)}
        return {"result": result, "settings": settings}
    finally:
        if fleet is not None:
            fleet.shutdown()
        cluster.stop()  # the scheduler first gets a short grace: long-polls may be in flight
        if fleet is not None:  # their servers are gone: every thread ends within a request
            deadline = time.monotonic() + 15
            for t in fleet.threads:
                t.join(timeout=max(0.0, deadline - time.monotonic()))


def measure(cluster: bl.BenchCluster, fleet: Fleet, action) -> dict:
    """CPU of scheduler, registry and this process, and the fleet's requests, over `action`."""
    with fleet.lock:
        before = collections.Counter(fleet.requests)
    meters = {"scheduler": bl.CpuMeter(lambda: cluster.pids("scheduler")),
              "registry": bl.CpuMeter(lambda: cluster.pids("registry")), "simulator": bl.SelfCpuMeter(),
              "machine": bl.MachineCpuMeter()}
    start = time.monotonic()
    action()
    elapsed = time.monotonic() - start
    out = {name: m.percent() for name, m in meters.items()}
    with fleet.lock:
        by_kind = {k: round((v - before[k]) / elapsed, 1) for k, v in fleet.requests.items() if v - before[k]}
    out.update(elapsed=elapsed, by_kind=by_kind, requests_per_sec=round(sum(by_kind.values()), 1))
    return out


def run_size(size: int, mode: str, cfg: Config, log_root: str) -> bool:
    """cfg.repeat runs at one fleet size; prints its line. False when a run failed."""
    runs, settings, ok = [], {}, True
    line = {"scenario": "fleet", "agents": size}
    for r in range(cfg.repeat):
        bl.log(f"fleet {size}: run {r + 1}/{cfg.repeat} ({mode})")
        try:
            one = one_size(size, mode, cfg, log_root)
        except Skip as exc:
            bl.log(f"fleet {size}: skipped: {exc}")
            bl.emit(dict(line, mode=mode, skipped=str(exc)))
            return True
        except Exception as exc:
            ok = False
            bl.log(f"fleet {size}: failed: {exc.__class__.__name__}: {exc}")
            runs.append({"agents": size, "error": f"{exc.__class__.__name__}: {exc}"})
            continue
        runs.append(one["result"])
        settings = one["settings"]
        bl.log(f"fleet {size}: " + ", ".join(f"{k}={v}" for k, v in one["result"].items() if bl.is_number(v)))
    good = [run for run in runs if "error" not in run]
    if good:
        line.update(bl.medians(good))
        line.update(repeat=len(good), settings=settings)
    else:
        line["error"] = runs[-1]["error"]
    if len(runs) > 1 or not good:
        line["runs"] = runs
    bl.emit(line)
    return ok


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="50,200,500", help="fleet sizes, comma-separated (default 50,200,500)")
    parser.add_argument("--quick", action="store_true", help="short windows, for a smoke test")
    parser.add_argument("--mode", choices=("auto", "long-poll", "polling", "both"), default="auto",
                        help="how simulated agents take work: long-poll when the scheduler has it (auto), "
                             "either one, or both one after the other (a line each)")
    parser.add_argument("--repeat", type=int, help="runs per size, medians reported (default 1)")
    parser.add_argument("--rate", type=float, help="jobs per second in the stream (default 20)")
    parser.add_argument("--idle-secs", type=float, help="idle window (default 60: one idle lease renewal per agent)")
    parser.add_argument("--stream-secs", type=float, help="stream window (default 30)")
    parser.add_argument("--job-secs", type=float, help="how long a simulated job 'runs' (default 0)")
    parser.add_argument("--idle-renew-secs", type=float,
                        help="how often an idle agent renews its lease (default: the agent's own, 60 s; "
                             "0: every heartbeat, as agents before it did)")
    parser.add_argument("--workers", type=int, help="scheduler gunicorn workers (default 2)")
    parser.add_argument("--threads", type=int, help="scheduler gunicorn threads per worker (default agents + 32)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the servers' logs")
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error("--sizes takes whole numbers, e.g. 50,200,500")
    if not args.sizes or min(args.sizes) < 1 or max(args.sizes) > 2000:
        parser.error("--sizes must be between 1 and 2000")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = QUICK if args.quick else FULL
    overrides = {"repeat": args.repeat, "rate": args.rate, "idle_secs": args.idle_secs,
                 "stream_secs": args.stream_secs, "job_secs": args.job_secs, "workers": args.workers,
                 "threads": args.threads, "idle_renew_secs": args.idle_renew_secs}
    cfg = replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    if not os.access(os.path.join(bl.BIN, "corral-scheduler"), os.X_OK):
        print("simulate_fleet: run this with the project's virtualenv (.venv/bin/python scripts/simulate_fleet.py)",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Hundreds of connections and threads: raise the open-file limit and keep stacks small.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    threading.stack_size(512 * 1024)
    log_root = bl.make_log_dir("corral-fleet-logs-")
    failed = False
    bl.emit(bl.meta({"mode": "quick" if args.quick else "full", "sizes": args.sizes, "repeat": cfg.repeat,
                     "config": {k: v for k, v in cfg.__dict__.items()}}))
    modes = ("polling", "long-poll") if args.mode == "both" else (args.mode,)
    try:
        for size in args.sizes:
            for mode in modes:
                failed |= not run_size(size, mode, cfg, log_root)
    finally:
        if failed or args.keep_logs:
            bl.log(f"server logs kept in {log_root}")
        else:
            shutil.rmtree(log_root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
