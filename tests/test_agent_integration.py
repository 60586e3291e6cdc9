"""The agent with everything real on this host: cgroup limits and OOM detection, the
jobs' own uids, killing a whole tree on cancel, deploy artifacts; and `corral-agent`
processes (their CLI, SIGTERM, re-adoption of a service by the next process)
against a small fake control plane served over HTTP on 127.0.0.1.

Needs root and a writable cgroup v1 or v2 hierarchy; CI runs as root.
"""
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import responses

from corral.agent import cgroups, services
from corral.agent.agent import Agent
from corral.agent.settings import AgentSettings
from corral.shared.clients import RegistryClient, SchedulerClient
from helpers import process_gone, wait_for
from test_agent import REGISTRY, SCHEDULER, FakeScheduler, move_reported
from test_agent_services import PYTHON3, FakeRegistry, _skip_reason, free_port, http_server

pytestmark = pytest.mark.root

BIN = os.path.dirname(sys.executable)


@pytest.fixture(autouse=True)
def _requirements():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def node():
    return f"int-{uuid.uuid4().hex[:8]}"


def remove_node_cgroups(node, state_dir):
    """End what the node's agent left (services) and remove its cgroup directories."""
    root_name = AgentSettings(node_id=node, state_dir=state_dir).cgroup_root_name
    manager = cgroups.detect(root_name=root_name)
    manager.remove_job_cgroups()
    assert manager.cleanup(), f"could not remove {manager.roots}"


# --- the Agent class, real cgroups, mocked API ---------------------------------------------------


@pytest.fixture
def scheduler(api, node):
    FakeRegistry(api, node)
    return FakeScheduler(api, node)


@pytest.fixture
def agent(state_dir, node, scheduler):
    settings = AgentSettings(node_id=node, registry_url=REGISTRY, scheduler_url=SCHEDULER,
                             state_dir=state_dir, slots=2, output_tail_bytes=4096, stop_grace=0.2,
                             kill_grace=0.3)
    a = Agent(settings, RegistryClient(REGISTRY), SchedulerClient(SCHEDULER))
    a.startup()
    try:
        yield a
    finally:
        for key in a.running_keys():
            local = a.local_job(*key)
            local.prepared.wait(10)
            if local.process is not None:
                local.process.kill(0)
        remove_node_cgroups(node, state_dir)


def reap_until(agent, timeout=15):
    return wait_for(agent.reap_once, timeout=timeout, message="a job to end")


def test_out_of_memory_is_detected_and_reported(agent, scheduler):
    assert agent.cgroups.enforced
    scheduler.add(command=f"{PYTHON3} -c 'x = b\"x\" * (200 << 20)'", memory_mb=32, cpu_percent=50)
    agent.poll_once()
    assert reap_until(agent) == [("job-1", 1, "failed")]
    running = scheduler.reports[0][1]
    assert (running["limits_enforced"], running["limits"]) == (
        True, {"memory_mb": 32, "cpu_percent": 50, "max_processes": 1024})
    final = scheduler.final("job-1")
    assert final["oom_killed"] is True, final
    assert final["exit_code"] in (-signal.SIGKILL, 128 + signal.SIGKILL)
    assert final["stderr"].splitlines()[-1] == "job killed: out of memory (limit 32 MB)"
    assert 0 < final["peak_memory_bytes"] <= 33 * 1024 * 1024
    assert final["cpu_seconds"] is not None and final["cpu_seconds"] > 0


def test_job_runs_as_its_own_uid_in_its_cgroup_and_both_go(agent, scheduler):
    scheduler.add(command='id -u; grep -c "/job-1-1$" /proc/self/cgroup; echo "$HOME $USER"; '
                          'echo hi > mine.txt && echo wrote')
    agent.poll_once()
    assert reap_until(agent) == [("job-1", 1, "done")]
    final = scheduler.final("job-1")
    uid, in_cgroup, home, wrote = final["stdout"].splitlines()
    assert 70000 <= int(uid) <= 79999 and int(in_cgroup) >= 2 and wrote == "wrote"  # memory, cpu, ...
    assert home == f"{agent.work_dir('job-1', 1)} corral-{uid}"  # no passwd entry: HOME is the work dir
    assert final["oom_killed"] is False and final["peak_memory_bytes"] > 0
    assert agent.cgroups.list_job_cgroups() == []
    assert agent.users.pool.held() == {}  # the uid was given back


def test_cancel_kills_the_whole_tree_through_the_cgroup(agent, scheduler):
    scheduler.add(command="setsid sh -c 'trap \"\" TERM; echo $$ > grandchild.pid; sleep 300' & "
                          "echo $$ > main.pid; sleep 300")
    agent.poll_once()
    workdir = agent.work_dir("job-1", 1)
    pids = wait_for(lambda: [int(open(os.path.join(workdir, n)).read()) for n in
                             ("main.pid", "grandchild.pid")], message="both pids")
    scheduler.running.clear()
    assert agent.reconcile_once() == [("job-1", 1)]
    assert reap_until(agent) == [("job-1", 1, "killed")]
    assert all(process_gone(pid) for pid in pids)
    assert agent.cgroups.list_job_cgroups() == []
    assert scheduler.statuses("job-1") == ["running"]


def test_deploy_artifact_is_owned_by_the_job_user(agent, scheduler, api):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        info = zipfile.ZipInfo("run.sh")
        info.external_attr = 0o100755 << 16
        zf.writestr(info, "#!/bin/sh\nid -u > out.txt && cat out.txt\n")
    api.add(responses.GET, "https://builds.test/app.zip", body=buf.getvalue())
    scheduler.add(command=None, deploy_url="https://builds.test/app.zip")
    agent.poll_once()
    assert reap_until(agent) == [("job-1", 1, "done")], scheduler.final("job-1")
    assert 70000 <= int(scheduler.final("job-1")["stdout"]) <= 79999


# --- corral-agent processes against a fake control plane -------------------------------------------


class ControlPlane:
    """Registry and scheduler on one port: just what a polling agent
    (AGENT_LONG_POLL_SECS=0, the original design's) calls; no claims, report batches
    or live output."""

    def __init__(self, node_id: str):
        self.lock = threading.Lock()
        self.node_id = node_id
        self.pending: list[dict] = []
        self.running: list[dict] = []
        self.reports: list[tuple[str, dict]] = []
        self.services: dict[str, dict] = {}
        self.upserts: list[dict] = []
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self):
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

            def do_GET(self):
                url = urlsplit(self.path)
                if url.path == "/healthz":
                    return self._answer(200, {"status": "ok"})
                if url.path == "/jobs":
                    status = parse_qs(url.query)["status"][0]
                    with plane.lock:
                        return self._answer(200, list(plane.pending if status == "pending"
                                                      else plane.running))
                self._answer(404, {"error": "not here"})

            def do_POST(self):
                body = self._body()
                path = urlsplit(self.path).path
                with plane.lock:
                    if path == "/nodes":
                        return self._answer(201, body)
                    if path.endswith("/heartbeat"):
                        return self._answer(200, {})
                    if path == "/services":
                        plane.upserts.append(body)
                        plane.services[body["job_id"]] = body
                        return self._answer(200, body)
                    match = re.fullmatch(r"/jobs/([^/]+)/status", path)
                    if match:
                        job_id = match.group(1)
                        plane.reports.append((job_id, body))
                        plane.running = move_reported(plane.pending, plane.running, job_id, body["status"])
                        return self._answer(200, body)
                self._answer(404, {"error": "not here"})

            def do_DELETE(self):
                job_id = self.path.rsplit("/", 1)[-1]
                with plane.lock:
                    found = plane.services.pop(job_id, None)
                self._answer(200 if found else 404, found or {"error": "no such service"})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, job_id, **fields):
        with self.lock:
            self.pending.append({"job_id": job_id, "node_id": self.node_id, "attempt": 1,
                                 "job_type": "run", "env_vars": {}, "status": "pending",
                                 "deploy_url": None, **fields})

    def statuses(self, job_id):
        with self.lock:
            return [b["status"] for j, b in self.reports if j == job_id]

    def final(self, job_id):
        with self.lock:
            return [b for j, b in self.reports if j == job_id and b["status"] != "running"][-1]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def plane(node):
    p = ControlPlane(node)
    try:
        yield p
    finally:
        p.close()


def agent_env(plane, node, state_dir, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "AGENT_"))}
    env.update(NODE_ID=node, REGISTRY_URL=plane.url, SCHEDULER_URL=plane.url,
               CORRAL_STATE_DIR=state_dir, POLL_INTERVAL_SECS="0.1", HEARTBEAT_INTERVAL_SECS="0.5",
               AGENT_STOP_GRACE_SECS="0.5", AGENT_KILL_GRACE_SECS="0.5",
               AGENT_HEALTH_INTERVAL_SECS="0.2", AGENT_HEALTH_TIMEOUT_SECS="0.5",
               AGENT_SLOTS="2", CORRAL_LOG_LEVEL="INFO", AGENT_LONG_POLL_SECS="0",
               AGENT_OUTPUT_INTERVAL_SECS="0")
    env.update(extra)
    return env


@pytest.fixture
def start_agent(plane, node, state_dir):
    procs = []

    def start(**extra):
        log = open(os.path.join(state_dir, f"agent-{len(procs)}.log"), "wb")
        proc = subprocess.Popen([os.path.join(BIN, "corral-agent")],
                                env=agent_env(plane, node, state_dir, **extra),
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        log.close()
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        remove_node_cgroups(node, state_dir)  # also ends any service left running


def agent_log(state_dir, n):
    with open(os.path.join(state_dir, f"agent-{n}.log")) as f:
        return f.read()


def test_check_against_a_live_control_plane(plane, node, state_dir):
    result = subprocess.run([os.path.join(BIN, "corral-agent"), "--check", "--json"],
                            env=agent_env(plane, node, state_dir), capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["limits_enforced"] and report["cgroups"]["mode"] in ("v1", "v2")
    assert report["job_user"]["mode"] == "per-job" and report["job_user"]["uid_range"] == "70000-79999"
    assert report["private_tmp"] == {"enabled": True, "reason": None}
    assert report["registry"]["ok"] and report["scheduler"]["ok"]
    # --check only looks: it created no cgroup directory for this node.
    assert not any(os.path.exists(d) for d in report["cgroups"]["dirs"].values())


def test_agent_restart_leaves_services_running_and_the_next_agent_adopts_them(
        plane, node, state_dir, start_agent):
    port = free_port()
    plane.add("job-1", job_type="service", command=http_server(port), port=port, name="web",
              health_path="/")
    plane.add("job-2", command="sleep 300")
    first = start_agent()
    wait_for(lambda: plane.services.get("job-1", {}).get("healthy") is True, timeout=15,
             message="the service to be healthy")
    wait_for(lambda: plane.statuses("job-2") == ["running"], message="the run job to start")
    state_file = services.state_path(os.path.join(state_dir, f"agent-{node}", "services"), "job-1", 1)
    with open(state_file) as f:
        pid = json.load(f)["pid"]

    first.send_signal(signal.SIGTERM)
    assert first.wait(20) == 0, agent_log(state_dir, 0)
    assert plane.final("job-2")["stderr"].endswith("agent stopped before the job finished")
    assert not process_gone(pid)
    assert "job-1" in plane.services and plane.statuses("job-1") == ["running"]
    upserts = len(plane.upserts)

    second = start_agent()
    wait_for(lambda: "re-adopted service job job-1 attempt 1" in agent_log(state_dir, 1),
             message="the second agent to adopt the service")
    wait_for(lambda: len(plane.upserts) > upserts and plane.services["job-1"]["healthy"] is True,
             message="the second agent to record the service")
    assert plane.statuses("job-1") == ["running"]  # not started again, not reported
    assert requests.get(f"http://127.0.0.1:{port}/", timeout=5).ok

    with plane.lock:  # cancelled
        plane.running = [j for j in plane.running if j["job_id"] != "job-1"]
    wait_for(lambda: process_gone(pid), message="the service to be killed")
    wait_for(lambda: "job-1" not in plane.services, message="the record to be removed")
    wait_for(lambda: not os.path.exists(state_file), message="the state file to be removed")
    assert plane.statuses("job-1") == ["running"]

    second.send_signal(signal.SIGTERM)
    assert second.wait(20) == 0, agent_log(state_dir, 1)
    # Nothing left: the node's cgroup directories went with the last job.
    root_name = AgentSettings(node_id=node, state_dir=state_dir).cgroup_root_name
    assert cgroups.detect(root_name=root_name, prepare=False).list_job_cgroups() == []
