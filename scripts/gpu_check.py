#!/usr/bin/env python3
"""Prove GPU support on a machine with NVIDIA GPUs (`scripts/gpu_check.sh` sets up the
virtualenv and runs this; see docs/agent.md, "Checking a GPU node").

Starts a one-node cluster on free loopback ports with its state in a temporary
directory (a registry, a scheduler and one agent, NODE_ID=gpu-check, with 4 slots),
runs five checks against it and stops it again, whatever happens (Ctrl-C, SIGTERM and
SIGHUP included), ending only the processes it started:

1. discovery: the node in the scheduler's GET /nodes lists as many GPUs as
   `nvidia-smi -L` prints devices (a MIG instance counts as one, its GPU not), with
   their UUIDs and models;
2. a `gpus: 1` job sees one GPU: `nvidia-smi -L` lists one device in it, the one its
   `gpus_assigned` names (also in CUDA_VISIBLE_DEVICES, and as held by the job in
   GET /nodes), and PyTorch counts one;
3. two `gpus: 1` jobs on a node with one GPU (with several, the agent is restarted
   with AGENT_GPUS set to the first) run one after the other;
4. a job without `gpus` sees none: `nvidia-smi -L` fails or lists nothing, PyTorch
   counts none;
5. a `gpus: 1` PyTorch job of large matrix products (--matmul-secs) ends `done`, and
   its team's `gpu_seconds` in GET /usage?group_by=team grows; the job's own
   `gpu_seconds` and `gpu_utilization_percent`, where the scheduler reports them,
   must not be zero.

Each check prints PASS or FAIL (with --skip-torch the PyTorch parts of checks 2, 4
and 5 are skipped, and said to be: check 5 then holds a GPU with `sleep`); at the end
a summary (the GPUs, the date, each result) to paste into docs/benchmarks.md. As root
every job runs under a uid and in a cgroup of its own; without root, as this user
(the summary says which).

Exit status: 0 every check passed (or was skipped), 1 a check failed or the cluster
did not start, 2 this machine cannot run the checks (no nvidia-smi, no GPU, no
PyTorch without --skip-torch), 130 interrupted.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import requests

from run_local import descendants, start_time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
HOST = "127.0.0.1"
NODE_ID = "gpu-check"
SLOTS = 4

EXIT_OK, EXIT_FAILED, EXIT_CANNOT_RUN, EXIT_INTERRUPTED = 0, 1, 2, 130
PASS, FAIL = "PASS", "FAIL"

HTTP_TIMEOUT = 10.0         # every request
START_TIMEOUT = 60.0        # servers answering, the node healthy in the scheduler
JOB_TIMEOUT = 300.0         # a job from submit to its end (PyTorch's first CUDA start may be slow)
SMI_TIMEOUT = 30.0          # nvidia-smi on the host
PROBE_SLEEP_SECS = 4        # a probe job stays running this long after looking, to be seen holding its GPU
SERIAL_SLEEP_SECS = 4       # each of check 3's jobs
# Where a root run keeps its state: jobs run under uids of their own, which must reach
# their work dirs by path, and work dirs under /tmp get no private /tmp (docs/agent.md).
ROOT_STATE_BASE = "/var/lib/corral-gpu-check"

# nvidia-smi ignores CUDA_VISIBLE_DEVICES: what it lists in a job is what the job may open.
SMI_LISTS_ALL = "(nvidia-smi ignores CUDA_VISIBLE_DEVICES: the job may open these devices)"
# `nvidia-smi -L`: a GPU, then its MIG instances indented below it.
_SMI_GPU_RE = re.compile(r"^GPU\s+(\d+):\s+(.+?)\s+\(UUID:\s+(GPU-[^)\s]+)\)\s*$")
_SMI_MIG_RE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s+(MIG-[^)\s]+)\)\s*$")


class CannotRun(Exception):
    """This machine cannot run the checks (exit 2)."""


class Interrupted(BaseException):
    """A signal asked to stop: raised in the main thread by the handler."""


# ---- pure helpers ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Device:
    """A device a job can be given, as `nvidia-smi -L` lists it: a GPU, or a MIG instance."""

    index: str   # "0", or "0:1" for MIG device 1 of GPU 0
    uuid: str
    model: str


def parse_smi_list(text: str) -> list[Device]:
    """The devices of `nvidia-smi -L`: each GPU, or in its place its MIG instances (a GPU
    in MIG mode is used only through them), in order. Other lines are ignored."""
    gpus: list[tuple[str, str, str]] = []
    migs: dict[str, list[Device]] = {}
    for line in text.splitlines():
        gpu = _SMI_GPU_RE.match(line)
        if gpu:
            gpus.append((gpu.group(1), gpu.group(2), gpu.group(3)))
            continue
        mig = _SMI_MIG_RE.match(line)
        if mig and gpus:
            index, model, uuid = gpus[-1]
            migs.setdefault(uuid, []).append(
                Device(f"{index}:{mig.group(2)}", mig.group(3), f"{model} MIG {mig.group(1)}"))
    found: list[Device] = []
    for index, model, uuid in gpus:
        found += migs.get(uuid) or [Device(index, uuid, model)]
    return found


def parse_time(value: str | None) -> float | None:
    """An API timestamp (ISO-8601, `Z` or an offset) as epoch seconds; None for None."""
    if value is None:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two [start, end] intervals share more than an end point."""
    return a[0] < b[1] and b[0] < a[1]


def running_interval(job: dict) -> tuple[float, float]:
    """From a finished job's `running_at` to its `finished_at`; ValueError if it lacks one."""
    start, end = parse_time(job.get("running_at")), parse_time(job.get("finished_at"))
    if start is None or end is None:
        raise ValueError(f"{job.get('job_id')} has no running_at/finished_at "
                         f"({job.get('running_at')!r}, {job.get('finished_at')!r})")
    return start, end


def jobs_overlap(a: dict, b: dict) -> bool:
    """Whether two finished jobs ran at the same time."""
    return overlaps(running_interval(a), running_interval(b))


@dataclasses.dataclass
class Probe:
    """What a probe job printed (probe_command)."""

    values: dict[str, str]       # NAME=value lines
    smi_output: str              # what `nvidia-smi -L` printed in the job
    smi_rc: int | None           # its exit status; None: not printed

    @property
    def devices(self) -> list[Device]:
        return parse_smi_list(self.smi_output)

    @property
    def torch_count(self) -> int | None:
        value = self.values.get("torch_device_count")
        return int(value) if value is not None and value.lstrip("-").isdigit() else None


def probe_command(python: str | None, sleep_secs: int) -> str:
    """A job that prints its CUDA environment, what `nvidia-smi -L` lists (each line
    behind `smi| `) and its exit status, and PyTorch's device count (when `python` is
    given), then sleeps `sleep_secs` so that it is seen running."""
    lines = [
        'echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-(unset)}"',
        'echo "NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES-(unset)}"',
        'echo "CUDA_DEVICE_ORDER=${CUDA_DEVICE_ORDER-(unset)}"',
        "smi=$(nvidia-smi -L 2>&1); rc=$?",
        'printf "%s\\n" "$smi" | sed "s/^/smi| /"',
        'echo "smi_rc=$rc"',
    ]
    if python:
        code = "import torch; print('torch_device_count=%d' % torch.cuda.device_count())"
        lines.append(f"{shlex.quote(python)} -c {shlex.quote(code)} || echo torch_device_count=error")
    lines.append(f"sleep {int(sleep_secs)}")
    return "\n".join(lines)


def parse_probe(stdout: str | None) -> Probe:
    values: dict[str, str] = {}
    smi: list[str] = []
    for line in (stdout or "").splitlines():
        if line.startswith("smi| ") or line == "smi|":
            smi.append(line[5:])
        elif "=" in line:
            name, value = line.split("=", 1)
            values[name.strip()] = value.strip()
    rc = values.get("smi_rc")
    return Probe(values, "\n".join(smi), int(rc) if rc is not None and rc.isdigit() else None)


MATMUL_CODE = """\
import sys, time
import torch
seconds, n = float(sys.argv[1]), int(sys.argv[2])
assert torch.cuda.is_available(), "CUDA is not available to PyTorch"
a = torch.randn(n, n, device="cuda")
b = torch.randn(n, n, device="cuda")
torch.cuda.synchronize()
start, products = time.monotonic(), 0
while time.monotonic() - start < seconds:
    for _ in range(8):
        c = a @ b
    torch.cuda.synchronize()
    products += 8
elapsed = time.monotonic() - start
print("device=%s" % torch.cuda.get_device_name(0))
print("products=%d" % products)
print("seconds=%.1f" % elapsed)
print("tflops=%.1f" % (2 * n ** 3 * products / elapsed / 1e12))
print("checksum=%.3e" % float(c[0, 0]))
"""


def matmul_command(python: str, seconds: float, n: int = 8192) -> str:
    """A job that multiplies two n×n float32 matrices on its GPU for `seconds`."""
    return f"{shlex.quote(python)} -c {shlex.quote(MATMUL_CODE)} {seconds:g} {int(n)}"


def key_values(stdout: str | None) -> dict[str, str]:
    return {name.strip(): value.strip() for name, _, value in
            (line.partition("=") for line in (stdout or "").splitlines() if "=" in line)}


def team_gpu_seconds(usage: dict, team: str) -> float:
    """The team's `gpu_seconds` in a GET /usage?group_by=team answer (0 without a row)."""
    return sum(float(row.get("gpu_seconds") or 0) for row in usage.get("rows", []) if row.get("group") == team)


JOB_GPU_FIELDS = ("gpu_seconds", "gpu_utilization_percent")


def job_gpu_fields(job: dict, must_be_positive: Iterable[str] = JOB_GPU_FIELDS) -> tuple[bool, list[str]]:
    """The per-job GPU usage fields of a finished job: (no field present is zero where it
    must not be, what to say of each). Absent (or null) fields are `not reported yet`."""
    ok, said = True, []
    positive = set(must_be_positive)
    for name in JOB_GPU_FIELDS:
        value = job.get(name)
        if value is None:
            said.append(f"{name}: not reported yet")
        elif name in positive and not value:
            ok = False
            said.append(f"{name}: {value} (must be above zero)")
        else:
            said.append(f"{name}: {value}")
    return ok, said


@dataclasses.dataclass
class Result:
    number: int
    name: str
    status: str
    detail: str


def summary(machine: str, when: datetime.datetime, results: list[Result], context: Iterable[str] = ()) -> str:
    """The closing summary, Markdown to paste into docs/benchmarks.md: the machine (the CSV
    of `nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv`), the date,
    what else the run says of itself (`context`) and one table row per check."""
    failed = sum(r.status == FAIL for r in results)
    lines = [f"GPU check, {when.astimezone(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
             + "".join(f", {c}" for c in context) + ":", "", "```"]
    lines += [line for line in machine.strip().splitlines() if line.strip()] or ["(nvidia-smi said nothing)"]
    lines += ["```", "", "| check | result | detail |", "|---|---|---|"]
    for r in sorted(results, key=lambda r: r.number):
        detail = r.detail.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.number}. {r.name} | {r.status} | {detail} |")
    lines += ["", f"{len(results) - failed} of {len(results)} checks passed, {failed} failed."]
    return "\n".join(lines)


def blocked_parent(path: str) -> str | None:
    """The first directory on the way to `path` (its real path) that other users may not
    search (no o+x), or None: what a job under a uid of its own cannot get through."""
    current = os.sep
    for part in os.path.realpath(path).split(os.sep)[1:-1]:
        current = os.path.join(current, part)
        try:
            mode = os.stat(current).st_mode
        except OSError:  # not there: the job will say so itself
            return None
        if not mode & stat.S_IXOTH:
            return current
    return None


# ---- the cluster -------------------------------------------------------------------

class Proc:
    """One process of the cluster, in a session of its own, its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict, log_path: str, pass_fds=()):
        self.name = name
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, pass_fds=pass_fds, start_new_session=True)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float) -> None:
        """SIGTERM to the main process (an agent ends its jobs, gunicorn its workers), then
        SIGKILL to what is left of it and of every process it had started."""
        offspring = {(pid, started) for pid in descendants(self.popen.pid)
                     if (started := start_time(pid)) is not None}
        if self.alive():
            _kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                say(f"{self.name} did not stop within {grace:.0f}s; killing it")
        if self.alive():
            _kill(self.popen.pid, signal.SIGKILL, group=True)
        for pid, started in offspring:
            if start_time(pid) == started:
                _kill(pid, signal.SIGKILL)
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            say(f"{self.name} (pid {self.popen.pid}) is still there after SIGKILL")

    def tail(self, lines: int = 25) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _kill(pid: int, sig: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def listening_socket() -> socket.socket:
    """A socket on a free loopback port, passed to gunicorn as fd://N (no race for it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((HOST, 0))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def wait_until(what: str, check: Callable[[], object], timeout: float, interval: float = 0.2,
               alive: Callable[[], None] | None = None):
    """check()'s first truthy value; TimeoutError after `timeout` s (errors count as not yet).
    `alive` raises when a process it watches died meanwhile."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        if alive is not None:
            alive()
        try:
            value = check()
            if value:
                return value
        except (requests.RequestException, ValueError, KeyError) as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}"
                               + (f" (last error: {last_error})" if last_error else ""))
        time.sleep(interval)


class Cluster:
    def __init__(self, state_dir: str):
        self.state_dir = state_dir
        self.log_dir = os.path.join(state_dir, "logs")
        os.makedirs(self.log_dir, exist_ok=True)
        self.procs: dict[str, Proc] = {}
        self.http = requests.Session()
        self.registry_url = self.scheduler_url = ""
        # The environment without the caller's Corral settings (tokens, databases).
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "DATABASE_URL"))}
        self.env.update(CORRAL_STATE_DIR=state_dir, CORRAL_LOG_LEVEL="INFO", PYTHONUNBUFFERED="1",
                        HEARTBEAT_TIMEOUT_SECS="10")

    # HTTP, each call with a timeout.
    def get(self, path: str, **params) -> Any:
        response = self.http.get(self.scheduler_url + path, params=params or None, timeout=HTTP_TIMEOUT)
        response.raise_for_status()
        return response.json()

    def submit(self, **request) -> dict:
        response = self.http.post(self.scheduler_url + "/jobs", json=request, timeout=HTTP_TIMEOUT)
        if response.status_code != 201:
            raise RuntimeError(f"POST /jobs answered {response.status_code}: {response.text[:300]}")
        return response.json()

    def job(self, job_id: str) -> dict:
        return self.get(f"/jobs/{job_id}")

    def node(self) -> dict | None:
        return next((n for n in self.get("/nodes") if n.get("node_id") == NODE_ID), None)

    def _serve(self, name: str, extra: dict) -> str:
        sock = listening_socket()
        url = f"http://{HOST}:{sock.getsockname()[1]}"
        argv = [os.path.join(BIN, f"corral-{name}"), "--bind", f"fd://{sock.fileno()}", "--workers", "2"]
        try:
            self.procs[name] = Proc(name, argv, dict(self.env, **extra), os.path.join(self.log_dir, f"{name}.log"),
                                    pass_fds=(sock.fileno(),))
        finally:
            sock.close()
        wait_until(f"the {name} to answer on {url}",
                   lambda: self.http.get(url + "/healthz", timeout=HTTP_TIMEOUT).ok, START_TIMEOUT,
                   alive=self.check_alive)
        return url

    def start(self) -> None:
        self.registry_url = self._serve("registry", {})
        self.scheduler_url = self._serve("scheduler", {
            "REGISTRY_URL": self.registry_url, "MAX_JOBS_PER_NODE": str(SLOTS), "NODE_REFRESH_SECS": "0.5",
            "DISPATCH_INTERVAL_SECS": "0.2", "JOB_KILL_GRACE_SECS": "2", "RETRY_BASE_SECS": "0.5"})
        self.start_agent("auto")

    def start_agent(self, gpus: str) -> None:
        env = dict(self.env, NODE_ID=NODE_ID, REGISTRY_URL=self.registry_url, SCHEDULER_URL=self.scheduler_url,
                   AGENT_SLOTS=str(SLOTS), AGENT_MAX_CPU_PERCENT=str(100 * SLOTS), AGENT_GPUS=gpus,
                   POLL_INTERVAL_SECS="0.5", HEARTBEAT_INTERVAL_SECS="1", AGENT_STOP_GRACE_SECS="5",
                   AGENT_KILL_GRACE_SECS="2")
        if os.geteuid() != 0:
            # Only root can keep a job to its devices; without, the agent would not start.
            env["AGENT_DEVICE_ISOLATION"] = "none"
        self.procs["agent"] = Proc("agent", [os.path.join(BIN, "corral-agent")], env,
                                   os.path.join(self.log_dir, "agent.log"))

        def ready():
            node = self.node()
            return node if node and node.get("status") == "healthy" else None
        self.ready_node = wait_until(f"{NODE_ID} to be healthy in the scheduler", ready, START_TIMEOUT,
                                     alive=self.check_alive)

    def restart_agent(self, gpus: str) -> None:
        self.procs.pop("agent").stop(grace=20)
        self.start_agent(gpus)

    def check_alive(self) -> None:
        for proc in self.procs.values():
            if not proc.alive():
                raise RuntimeError(f"the {proc.name} exited with status {proc.popen.returncode}; "
                                   f"the end of its log:\n{proc.tail()}")

    def stop(self) -> None:
        """Agent first (it ends its jobs), then scheduler, then registry."""
        for name, grace in (("agent", 20.0), ("scheduler", 40.0), ("registry", 40.0)):
            proc = self.procs.get(name)
            if proc is not None:
                proc.stop(grace)
        self.http.close()


def unmount_under(path: str) -> None:
    """Unmount what is still mounted under `path` (a killed agent's job filesystems), deepest first."""
    try:
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4].replace("\\040", " ") for line in f]
    except OSError:
        return
    prefix = os.path.realpath(path) + os.sep
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=30, check=False)


# ---- the checks --------------------------------------------------------------------

@dataclasses.dataclass
class Seen:
    """What following a job showed while it was placed or running."""

    job: dict
    gpus_assigned: list[str] | None = None
    held_in_nodes: dict[str, str | None] = dataclasses.field(default_factory=dict)  # uuid -> job_id
    pending_reasons: list[dict] = dataclasses.field(default_factory=list)


def follow(cluster: Cluster, job_ids: list[str], timeout: float = JOB_TIMEOUT) -> dict[str, Seen]:
    """Poll the jobs until each has ended, recording what they showed on the way."""
    seen = {job_id: Seen({}) for job_id in job_ids}
    deadline = time.monotonic() + timeout
    while True:
        cluster.check_alive()
        node_gpus = None
        for job_id, s in seen.items():
            if s.job.get("status") in ("done", "failed", "cancelled"):
                continue
            s.job = job = cluster.job(job_id)
            if job.get("gpus_assigned"):
                s.gpus_assigned = job["gpus_assigned"]
                if job.get("status") == "running":
                    if node_gpus is None:
                        node_gpus = (cluster.node() or {}).get("gpus") or []
                    for gpu in node_gpus:
                        if gpu.get("uuid") in job["gpus_assigned"]:
                            s.held_in_nodes[gpu["uuid"]] = gpu.get("job_id")
            if job.get("pending_reason") and job["pending_reason"] not in s.pending_reasons:
                s.pending_reasons.append(job["pending_reason"])
        if all(s.job.get("status") in ("done", "failed", "cancelled") for s in seen.values()):
            return seen
        if time.monotonic() >= deadline:
            late = [f"{job_id} ({s.job.get('status')})" for job_id, s in seen.items()
                    if s.job.get("status") not in ("done", "failed", "cancelled")]
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {', '.join(late)} to end")
        time.sleep(0.2)


def ended_badly(job: dict) -> str | None:
    if job.get("status") == "done":
        return None
    stderr = (job.get("stderr") or "").strip().splitlines()
    return (f"{job.get('job_id')} ended {job.get('status')} (exit code {job.get('exit_code')}, "
            f"ended_by {job.get('ended_by')}){': ' + stderr[-1] if stderr else ''}")


def one_gpu_verdict(probe: Probe, assigned: list[str], held_by: str | None, job_id: str, isolated: bool,
                    torch: bool) -> tuple[list[str], list[str]]:
    """Check 2's problems and notes: a `gpus: 1` job given `assigned` (its gpus_assigned
    while it ran; `held_by`: the job GET /nodes showed holding it) printed `probe`.
    Without device isolation (`isolated` false) nvidia-smi lists every GPU: the assigned
    one must be among them, and CUDA_VISIBLE_DEVICES is what keeps the job to it."""
    problems, notes = [], []
    if len(assigned) != 1:
        return [f"gpus_assigned was {assigned or None} while it ran, not one UUID"], notes
    uuid, devices = assigned[0], probe.devices
    listed = f"{len(devices)} device(s) [{', '.join(d.uuid for d in devices)}] (exit {probe.smi_rc})"
    if isolated and len(devices) != 1:
        problems.append(f"nvidia-smi -L in the job listed {listed}, not one"
                        + (f" {SMI_LISTS_ALL}" if len(devices) > 1 else ""))
    elif isolated and devices[0].uuid != uuid:
        problems.append(f"the job sees {devices[0].uuid}, its gpus_assigned is {uuid}")
    elif not isolated and uuid not in {d.uuid for d in devices}:
        problems.append(f"nvidia-smi -L in the job listed {listed}, not its {uuid}")
    elif isolated:
        notes.append(f"nvidia-smi -L lists only {uuid}, its gpus_assigned")
    else:
        notes.append(f"nvidia-smi -L lists {len(devices)} device(s): no device isolation without root")
    visible = probe.values.get("CUDA_VISIBLE_DEVICES")
    if visible != uuid:
        problems.append(f"CUDA_VISIBLE_DEVICES is {visible!r}, not its gpus_assigned {uuid}")
    if held_by != job_id:
        problems.append(f"GET /nodes showed {uuid} held by {held_by}, not {job_id}")
    torch_verdict(probe, torch, 1, problems, notes)
    notes.append(f"CUDA_DEVICE_ORDER={probe.values.get('CUDA_DEVICE_ORDER')}, "
                 f"NVIDIA_VISIBLE_DEVICES={probe.values.get('NVIDIA_VISIBLE_DEVICES')}")
    return problems, notes


def torch_verdict(probe: Probe, torch: bool, expected: int, problems: list[str], notes: list[str]) -> None:
    """Whether PyTorch in the job counted `expected` devices (skipped without PyTorch)."""
    if not torch:
        notes.append("PyTorch check skipped")
    elif probe.torch_count != expected:
        problems.append(f"PyTorch counted {probe.values.get('torch_device_count', 'nothing')} device(s), "
                        f"not {expected}")
    else:
        notes.append(f"PyTorch counts {expected}")


def no_gpu_verdict(probe: Probe, isolated: bool, torch: bool) -> tuple[list[str], list[str]]:
    """Check 4's problems and notes: a job without `gpus` printed `probe`. With device
    isolation nvidia-smi must fail or list nothing; without, CUDA_VISIBLE_DEVICES must be
    set and empty (CUDA sees nothing) instead."""
    problems, notes = [], []
    visible = probe.values.get("CUDA_VISIBLE_DEVICES")
    if probe.smi_rc is None:
        problems.append("the job printed no nvidia-smi status")
    elif isolated and probe.smi_rc == 0 and probe.devices:
        problems.append(f"nvidia-smi -L in the job listed {len(probe.devices)} device(s) "
                        f"[{', '.join(d.uuid for d in probe.devices)}] {SMI_LISTS_ALL}")
    else:
        notes.append(f"nvidia-smi -L exit {probe.smi_rc}, {len(probe.devices)} device(s)"
                     + ("" if isolated else ": no device isolation without root"))
    if not isolated and visible != "":
        problems.append(f"CUDA_VISIBLE_DEVICES is {visible!r}, not set and empty")
    torch_verdict(probe, torch, 0, problems, notes)
    notes.append(f"CUDA_VISIBLE_DEVICES={visible}, NVIDIA_VISIBLE_DEVICES={probe.values.get('NVIDIA_VISIBLE_DEVICES')}")
    return problems, notes


def verdict(job: dict, problems: list[str], notes: list[str]) -> tuple[str, str]:
    """PASS or FAIL and what to say, a job that did not end `done` failing too."""
    if (bad := ended_badly(job)) is not None:
        problems = [bad, *problems]
    if problems:
        return FAIL, "; ".join(problems) + f" ({job.get('job_id')}: {'; '.join(notes)})"
    return PASS, f"{job.get('job_id')}: {'; '.join(notes)}"


class Checks:
    def __init__(self, cluster: Cluster, host_devices: list[Device], python: str | None, matmul_secs: float,
                 isolated: bool):
        self.cluster = cluster
        self.host_devices = host_devices
        self.python = python          # None: the PyTorch checks are skipped
        self.isolated = isolated      # whether the agent keeps jobs to their devices (root only)
        self.matmul_secs = matmul_secs
        self.results: list[Result] = []
        allocatable = (cluster.ready_node.get("allocatable") or {}).get("memory_mb")
        # PyTorch's CUDA start takes a GB or two of host memory, more than the 512 MB default.
        self.torch_memory_mb = min(8192, allocatable) if allocatable else 8192

    def record(self, number: int, name: str, status: str, detail: str) -> None:
        result = Result(number, name, status, detail)
        self.results.append(result)
        print(f"{status} {number}. {name}: {detail}", flush=True)

    def run(self, number: int, name: str, check: Callable[[], tuple[str, str]]) -> None:
        try:
            status, detail = check()
        except Interrupted:
            raise
        except Exception as exc:  # a timeout, a refused request: this check fails, the next ones run
            status, detail = FAIL, f"{type(exc).__name__}: {exc}"
        self.record(number, name, status, detail)

    def probe_job(self, gpus: int) -> dict:
        request: dict = {"command": probe_command(self.python, PROBE_SLEEP_SECS), "name": f"gpu-check-probe-{gpus}",
                         "timeout_secs": JOB_TIMEOUT, "max_retries": 0}
        if gpus:
            request["gpus"] = gpus
        if self.python:
            request.update(memory_mb=self.torch_memory_mb, env_vars={"OMP_NUM_THREADS": "1"})
        return self.cluster.submit(**request)

    # 1
    def discovery(self) -> tuple[str, str]:
        node = self.cluster.node() or {}
        listed = node.get("gpus") or []
        problems = []
        if len(listed) != len(self.host_devices):
            problems.append(f"the node lists {len(listed)} GPU(s), nvidia-smi -L {len(self.host_devices)}")
        missing = {d.uuid for d in self.host_devices} - {g.get("uuid") for g in listed}
        if missing and listed:
            problems.append(f"not listed: {', '.join(sorted(missing))}")
        unnamed = [g.get("uuid") for g in listed if not (g.get("model") or "").strip()]
        if unnamed:
            problems.append(f"without a model: {', '.join(map(str, unnamed))}")
        models = ", ".join(f"{g.get('index')}: {g.get('model')} ({g.get('memory_mb')} MB)" for g in listed)
        detail = f"{len(listed)} GPU(s) in GET /nodes, as nvidia-smi -L lists [{models or 'none'}]"
        return (FAIL, "; ".join(problems) + f" ({detail})") if problems else (PASS, detail)

    # 2
    def one_gpu_job(self) -> tuple[str, str]:
        submitted = self.probe_job(gpus=1)
        seen = follow(self.cluster, [submitted["job_id"]])[submitted["job_id"]]
        assigned = seen.gpus_assigned or []
        problems, notes = one_gpu_verdict(parse_probe(seen.job.get("stdout")), assigned,
                                          seen.held_in_nodes.get(assigned[0]) if assigned else None,
                                          seen.job["job_id"], self.isolated, self.python is not None)
        return verdict(seen.job, problems, notes)

    # 3
    def one_at_a_time(self) -> tuple[str, str]:
        node = self.cluster.node() or {}
        gpus = node.get("gpus") or []
        note = ""
        if len(gpus) > 1:
            first = gpus[0]["index"]
            say(f"the node has {len(gpus)} GPUs: restarting the agent with AGENT_GPUS={first} for check 3")
            self.cluster.restart_agent(first)
            wait_until(f"{NODE_ID} to list one GPU",
                       lambda: len((self.cluster.node() or {}).get("gpus") or []) == 1, START_TIMEOUT)
            node = self.cluster.node() or {}
            note = f" (agent restarted with AGENT_GPUS={first})"
        elif not gpus:
            return FAIL, "the node lists no GPU"
        if (node.get("capacity") or 0) < 2:
            return FAIL, f"the node holds {node.get('capacity')} job(s) at once: nothing to prove with two jobs"
        ids = [self.cluster.submit(command=f"sleep {SERIAL_SLEEP_SECS}", gpus=1, name=f"gpu-check-serial-{n}",
                                   timeout_secs=JOB_TIMEOUT, max_retries=0)["job_id"] for n in (1, 2)]
        seen = follow(self.cluster, ids)
        jobs = [seen[job_id].job for job_id in ids]
        bad = [b for j in jobs if (b := ended_badly(j)) is not None]
        if bad:
            return FAIL, "; ".join(bad)
        (a0, a1), (b0, b1) = running_interval(jobs[0]), running_interval(jobs[1])
        spans = (f"{ids[0]} ran {_clock(a0)}–{_clock(a1)}, {ids[1]} {_clock(b0)}–{_clock(b1)}, on a node of "
                 f"capacity {node.get('capacity')} with one GPU{note}")
        if overlaps((a0, a1), (b0, b1)):
            return FAIL, "they overlapped: " + spans
        waited_for_gpu = any("gpus" in (r.get("lacking") or []) for s in seen.values() for r in s.pending_reasons)
        return PASS, spans + ("; the second waited for a GPU (no_capacity: gpus)" if waited_for_gpu else "")

    # 4
    def no_gpu_job(self) -> tuple[str, str]:
        submitted = self.probe_job(gpus=0)
        job = follow(self.cluster, [submitted["job_id"]])[submitted["job_id"]].job
        problems, notes = no_gpu_verdict(parse_probe(job.get("stdout")), self.isolated, self.python is not None)
        return verdict(job, problems, notes)

    # 5
    def gpu_usage(self) -> tuple[str, str]:
        if self.python:
            request = {"command": matmul_command(self.python, self.matmul_secs), "name": "gpu-check-matmul",
                       "memory_mb": self.torch_memory_mb, "env_vars": {"OMP_NUM_THREADS": "1"}}
        else:
            request = {"command": f"sleep {SERIAL_SLEEP_SECS}", "name": "gpu-check-gpu-seconds"}
        usage_before = self.cluster.get("/usage", group_by="team")
        submitted = self.cluster.submit(gpus=1, timeout_secs=JOB_TIMEOUT + self.matmul_secs, max_retries=0,
                                        **request)
        team = submitted["team"]
        job = follow(self.cluster, [submitted["job_id"]], JOB_TIMEOUT + self.matmul_secs)[submitted["job_id"]].job
        problems, notes = [], []
        if self.python:
            out = key_values(job.get("stdout"))
            if "tflops" in out:
                notes.append(f"{out.get('products')} products of 8192² float32 in {out.get('seconds')} s, "
                             f"{out.get('tflops')} TFLOP/s on {out.get('device')}")
            elif job.get("status") == "done":
                problems.append("the job printed no result")
        else:
            notes.append("PyTorch skipped: a `sleep` job held the GPU instead")
        # An attempt's usage is added in the transaction that ends it: there by now.
        before = team_gpu_seconds(usage_before, team)
        after = team_gpu_seconds(self.cluster.get("/usage", group_by="team"), team)
        said_usage = f"team {team}'s gpu_seconds in GET /usage {before:.1f} → {after:.1f}"
        if after > before:  # so above zero too
            notes.append(said_usage)
        else:
            problems.append(said_usage + ": it did not grow")
        ok, said = job_gpu_fields(job, JOB_GPU_FIELDS if self.python else ("gpu_seconds",))
        if not ok:
            problems.append("; ".join(s for s in said if "must be" in s))
        notes.append("job " + ", ".join(said))
        return verdict(job, problems, notes)


def _clock(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%H:%M:%S.%f")[:-3]


# ---- main --------------------------------------------------------------------------

def say(message: str) -> None:
    print(f"[gpu_check] {message}", flush=True)


def run_smi(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=SMI_TIMEOUT, check=False)


def host_devices() -> list[Device]:
    """The devices `nvidia-smi -L` lists here; CannotRun without nvidia-smi, a driver or a GPU."""
    if shutil.which("nvidia-smi") is None:
        raise CannotRun("nvidia-smi is not in PATH: this check needs a machine with NVIDIA GPUs and their "
                        "driver (nvidia-smi comes with it)")
    try:
        done = run_smi("-L")
    except subprocess.TimeoutExpired:
        raise CannotRun(f"`nvidia-smi -L` did not answer within {SMI_TIMEOUT:.0f}s") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise CannotRun(f"`nvidia-smi -L` exited {done.returncode} ({said[-1] if said else 'no message'}): "
                        f"is the NVIDIA driver loaded?")
    devices = parse_smi_list(done.stdout)
    if not devices:
        raise CannotRun(f"`nvidia-smi -L` lists no usable GPU:\n{done.stdout.strip()}")
    return devices


def machine_csv() -> str:
    try:
        done = run_smi("--query-gpu=name,driver_version,memory.total", "--format=csv")
    except subprocess.TimeoutExpired:
        return "(nvidia-smi did not answer)"
    return done.stdout.strip() if done.returncode == 0 else f"(nvidia-smi exited {done.returncode})"


def torch_python(python: str) -> str:
    """Where `python`'s torch package is; CannotRun unless it imports torch and PyTorch
    can use CUDA here (the jobs will run it)."""
    code = ("import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available()); "
            "print(torch.__file__)")
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CannotRun(f"{python} cannot tell whether it has PyTorch: {exc}") from None
    said = (done.stdout.strip() if done.returncode == 0 else done.stderr.strip()).splitlines()
    if done.returncode != 0 or len(said) < 2:
        raise CannotRun(f"{python} cannot import torch ({said[-1] if said else 'no message'}): install it "
                        f"(scripts/gpu_check.sh does) or skip the PyTorch checks (--skip-torch)")
    version, location = said[0].split(), said[-1]
    if version[-1:] != ["True"]:
        raise CannotRun(f"PyTorch here cannot use CUDA (torch, CUDA, available: {said[0]}): a build without "
                        f"CUDA, or one that needs a newer driver; install another (GPU_CHECK_TORCH_PIP_ARGS) "
                        f"or --skip-torch")
    say(f"PyTorch here: torch {version[0]}, CUDA {version[1] if len(version) > 2 else '?'}")
    return location


def commit() -> str:
    try:
        done = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


def make_state_dir() -> str:
    base = None
    if os.geteuid() == 0:
        os.makedirs(ROOT_STATE_BASE, mode=0o755, exist_ok=True)
        base = ROOT_STATE_BASE
    path = tempfile.mkdtemp(prefix="state-" if base else "corral-gpu-check-", dir=base)
    os.chmod(path, 0o755)
    return path


def remove_state_dir(path: str) -> None:
    if os.geteuid() == 0:
        unmount_under(path)
    shutil.rmtree(path, ignore_errors=True)
    if os.path.dirname(path) == ROOT_STATE_BASE:
        try:
            os.rmdir(ROOT_STATE_BASE)  # only when no other run's state is there
        except OSError:
            pass


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-torch", action="store_true",
                        default=os.environ.get("GPU_CHECK_SKIP_TORCH", "") not in ("", "0"),
                        help="skip the PyTorch checks (also GPU_CHECK_SKIP_TORCH=1)")
    parser.add_argument("--job-python", default=sys.executable,
                        help="the Python with torch that the jobs run (default: this one)")
    parser.add_argument("--matmul-secs", type=float, default=10.0,
                        help="how long check 5 multiplies matrices (default 10)")
    parser.add_argument("--keep-state", action="store_true",
                        help="keep the state dir and the processes' logs (their path is printed)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        devices = host_devices()
        machine = machine_csv()
        python = None if args.skip_torch else os.path.abspath(args.job_python)
        root = os.geteuid() == 0
        if python is None:
            say("PyTorch checks skipped")
        else:
            torch_location = torch_python(python)
            blocked = root and (blocked_parent(python) or blocked_parent(torch_location))
            if blocked:
                raise CannotRun(f"jobs run under uids of their own and cannot search {blocked} (mode "
                                f"{stat.S_IMODE(os.stat(blocked).st_mode):o}) on the way to {python} or its "
                                f"torch: allow it (chmod o+x), give --job-python one they can reach, or "
                                f"--skip-torch")
        missing = [name for name in ("corral-registry", "corral-scheduler", "corral-agent")
                   if not os.access(os.path.join(BIN, name), os.X_OK)]
        if missing:
            raise CannotRun(f"{', '.join(missing)} not found beside {sys.executable}: run this with the "
                            f"project's virtualenv (scripts/gpu_check.sh makes it)")
    except CannotRun as exc:
        say(f"error: {exc}")
        return EXIT_CANNOT_RUN

    say(f"nvidia-smi -L: {len(devices)} device(s): " + ", ".join(f"{d.index} {d.model} {d.uuid}" for d in devices))
    user = "root: each job runs under a uid and in a cgroup of its own, kept to its own GPUs" if root else (
        f"not root (uid {os.geteuid()}): jobs run as this user, without uids or cgroups of their own, and may "
        f"open every GPU (AGENT_DEVICE_ISOLATION=none): checks 2 and 4 go by CUDA_VISIBLE_DEVICES, not by "
        f"what nvidia-smi lists")
    say(f"running as {user}")

    interrupted: list[str] = []

    def on_signal(signum, _frame):
        interrupted.append(signal.Signals(signum).name)
        if len(interrupted) == 1:
            raise Interrupted()

    state_dir = make_state_dir()
    cluster = Cluster(state_dir)
    checks: Checks | None = None
    started = False
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, on_signal)
        say(f"starting a registry, a scheduler and agent {NODE_ID} ({SLOTS} slots), state in {state_dir}")
        try:
            cluster.start()
            started = True
        except (RuntimeError, TimeoutError) as exc:
            say(f"error: the cluster did not start: {exc}")
            agent = cluster.procs.get("agent")
            if agent is not None:
                say("the end of the agent's log:\n" + agent.tail())
            if not args.keep_state:
                say("--keep-state keeps every process's log")
        if started:
            say(f"up: registry {cluster.registry_url}, scheduler {cluster.scheduler_url}")
            checks = Checks(cluster, devices, python, args.matmul_secs, isolated=root)
            checks.run(1, "discovery", checks.discovery)
            checks.run(2, "a gpus: 1 job sees one GPU", checks.one_gpu_job)
            checks.run(4, "a job without gpus sees none", checks.no_gpu_job)
            checks.run(5, "PyTorch matrix products and GPU seconds" if python else "GPU seconds (PyTorch skipped)",
                       checks.gpu_usage)
            checks.run(3, "two gpus: 1 jobs on one GPU run one after the other", checks.one_at_a_time)
            agent = cluster.procs.get("agent")
            if agent is not None and any(r.status == FAIL for r in checks.results):
                say("the end of the agent's log:\n" + agent.tail())
    except Interrupted:
        pass
    finally:
        # Teardown is not cut short by a second signal; each of its waits is bounded.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda signum, _frame: interrupted.append(signal.Signals(signum).name))
        say("stopping the cluster")
        cluster.stop()
        if args.keep_state:
            say(f"kept {state_dir} (the processes' logs are in {cluster.log_dir})")
        else:
            remove_state_dir(state_dir)
    if interrupted:
        say(f"interrupted ({interrupted[0]})")
        return EXIT_INTERRUPTED
    if checks is None:
        return EXIT_FAILED
    context = [f"commit {commit()}", "as root" if root else "not root",
               "PyTorch checks skipped" if python is None else "with PyTorch"]
    print("\n" + summary(machine, datetime.datetime.now(datetime.timezone.utc), checks.results, context), flush=True)
    return EXIT_FAILED if any(r.status == FAIL for r in checks.results) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
