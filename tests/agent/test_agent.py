"""The agent's logic against the real scheduler and real job processes.

The scheduler is its real app on a SQLite file of the test's own, reached by the
agent's HTTP clients through `responses` (scheduler_double.py), with the test's
faults in between; the registry is mocked. Tests drive the agent through its
one-pass methods and wait on conditions with deadlines.
"""
import hashlib
import io
import json
import os
import re
import stat
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler

import pytest
import requests
import responses

from corral.agent import claims as claims_module
from corral.agent import cgroups, launch, reports, runner
from corral.agent.agent import STOPPED_MESSAGE, TIMEOUT_MESSAGE, Agent, AgentStartError, Backoff
from corral.agent.cli import main
from corral.agent.prepare import NO_RUN_SH_MESSAGE
from corral.agent.settings import AgentSettings
from corral.shared.clients import Rejected, RegistryClient, SchedulerClient
from corral.shared.errors import SettingError
from agent_support import SAME_USER
from helpers import process_gone, serve_in_thread, wait_for
from scheduler_double import NODE, REGISTRY, SCHEDULER


class FakeJobCgroup(cgroups.NullJobCgroup):
    """Limits are not applied; OOM counter and usage come from the test."""

    def __init__(self, name, memory_mb, cpu_percent, max_processes, manager):
        super().__init__(name, memory_mb, cpu_percent, max_processes)
        self.manager = manager

    def oom_kills(self):
        return self.manager.oom_kills

    def stats(self):
        return dict(self.manager.stats)

    def remove(self, timeout=2.0):
        self.manager.removed.append(self.name)
        return True


class FakeCgroups(cgroups.Manager):
    """An `enforced` manager for unit tests: the real thing is in test_agent_integration."""
    mode = "fake"
    enforced = True
    limits_processes = True

    def __init__(self):
        super().__init__("fake cgroups for unit tests", "corral-unit")
        self.oom_kills = 0
        self.stats = {"peak_memory_bytes": 12345678, "cpu_seconds": 0.25}
        self.created, self.removed = [], []

    def create(self, name, memory_mb, cpu_percent, max_processes=None):
        cg = FakeJobCgroup(name, memory_mb, cpu_percent, max_processes, self)
        self.created.append(cg)
        return cg


@pytest.fixture
def api(api):
    """conftest's `api`, with the registry's answer to this node's registration."""
    api.add(responses.POST, REGISTRY + "/nodes", json={"node_id": NODE}, status=201)
    return api


def reap_until_ended(agent, timeout=10):
    return wait_for(agent.reap_once, timeout=timeout, message="a job to end")


def bodies(api, url_end):
    return [json.loads(c.request.body) for c in api.calls if c.request.url.endswith(url_end)]


# --- registry --------------------------------------------------------------------------


def test_register_sends_the_node_description(agent, api):
    agent.membership.register()
    (body,) = bodies(api, "/nodes")
    assert body["node_id"] == NODE and body["kind"] == "compute"
    assert body["address"] == "127.0.0.1" and body["slots"] == 2
    assert body["cpus"] == os.cpu_count()
    assert isinstance(body["memory_mb"], int) and body["memory_mb"] > 0
    assert body["labels"] == {"zone": "a"}
    assert (body["max_memory_mb"], body["max_cpu_percent"]) == (4096, 400)


def test_heartbeat_sends_the_running_count(agent, api):
    api.add(responses.POST, f"{REGISTRY}/nodes/{NODE}/heartbeat", json={})
    agent.membership.heartbeat_once()
    assert bodies(api, "/heartbeat") == [{"running": 0}]


def test_heartbeat_404_registers_again(agent, api):
    api.add(responses.POST, f"{REGISTRY}/nodes/{NODE}/heartbeat", json={"error": "unknown node"},
            status=404)
    agent.membership.heartbeat_once()
    urls = [c.request.url for c in api.calls]
    assert urls == [f"{REGISTRY}/nodes/{NODE}/heartbeat", f"{REGISTRY}/nodes"]


def test_heartbeat_other_refusals_are_raised(agent, api):
    api.add(responses.POST, f"{REGISTRY}/nodes/{NODE}/heartbeat", json={"error": "bad"}, status=400)
    with pytest.raises(Rejected):
        agent.membership.heartbeat_once()
    assert not bodies(api, "/nodes")


# --- running jobs ------------------------------------------------------------------------


def test_job_is_reported_running_before_it_starts_then_done(agent, scheduler):
    scheduler.add(command="touch started; echo hello")
    workdir = agent.settings.work_dir("job-1", 1)
    seen = {}

    def on_report(job_id, body):
        if body["status"] == "running":
            seen["workdir_existed"] = os.path.exists(workdir)
            seen["running_locally"] = len(agent.jobs)

    scheduler.on_report = on_report
    assert agent.intake.poll_once() == [("job-1", 1)]
    assert seen == {"workdir_existed": False, "running_locally": 0}
    assert reap_until_ended(agent) == [("job-1", 1, "done")]
    assert scheduler.statuses("job-1") == ["running", "done"]
    assert scheduler.reports[0][1] == {"node_id": NODE, "attempt": 1, "status": "running",
                                       "limits_enforced": False, "limits": None, "private_tmp": False}
    final = scheduler.final("job-1")
    assert final == {"node_id": NODE, "attempt": 1, "status": "done", "exit_code": 0,
                     "stdout": "hello\n", "stderr": "", "oom_killed": False,
                     "peak_memory_bytes": None, "cpu_seconds": None}
    assert not os.path.exists(workdir)  # removed once the run job finished


def test_startup_removes_work_dirs_an_earlier_agent_left(make_agent, tmp_path):
    first = make_agent()
    stale = first.settings.work_dir("job-7", 2)
    os.makedirs(os.path.join(stale, "sub"))
    stale_log = os.path.join(first.settings.log_root, "job-8-1.out")
    open(stale_log, "w").close()
    make_agent()  # the next agent on this node
    assert not os.path.exists(stale) and not os.path.exists(stale_log)
    os.makedirs(stale)
    make_agent(keep_work_dirs=True)
    assert os.path.isdir(stale)


def test_work_dir_is_kept_when_asked(make_agent, scheduler):
    agent = make_agent(keep_work_dirs=True)
    scheduler.add(command="echo kept > out.txt")
    agent.intake.poll_once()
    reap_until_ended(agent)
    path = os.path.join(agent.settings.work_dir("job-1", 1), "out.txt")
    assert path.startswith(os.path.join(agent.settings.state_dir, f"agent-{NODE}", "work", "job-1-1"))
    with open(path) as f:
        assert f.read() == "kept\n"


@pytest.mark.parametrize("status", [409, 404])
def test_refused_running_report_means_the_job_is_not_started(agent, scheduler, status):
    scheduler.add(command="touch started")

    def on_report(job_id, body):
        # Between the agent's poll and its report the job was cancelled (the scheduler
        # refuses the report: 409), or also purged (404).
        if status == 409:
            scheduler.cancel(job_id)
        else:
            scheduler.purge(job_id)

    scheduler.on_report = on_report
    assert agent.intake.poll_once() == []
    assert len(agent.jobs) == 0
    assert not os.path.exists(agent.settings.work_dir("job-1", 1))
    assert scheduler.answers == [("job-1", "running", status)]


def test_unreachable_running_report_starts_nothing(agent, scheduler):
    scheduler.add(job_id="job-1")
    scheduler.add(job_id="job-2")
    scheduler.down_for[("job-1", "running")] = 1
    assert agent.intake.poll_once() == []
    assert len(agent.jobs) == 0
    assert len(scheduler.attempts) == 1  # the scheduler is down: job-2 is not tried either


def test_only_free_slots_are_filled(make_agent, scheduler):
    agent = make_agent(slots=1)
    scheduler.add(job_id="job-1", command="sleep 30")
    scheduler.add(job_id="job-2")
    assert agent.intake.poll_once() == [("job-1", 1)]
    assert agent.intake.poll_once() == []  # no free slot: the scheduler is not even asked
    assert scheduler.statuses("job-2") == []


def test_failing_command_reports_failed_with_its_exit_code(agent, scheduler):
    scheduler.add(command="echo partial; echo oops >&2; exit 3")
    agent.intake.poll_once()
    assert reap_until_ended(agent) == [("job-1", 1, "failed")]
    final = scheduler.final("job-1")
    assert (final["status"], final["exit_code"]) == ("failed", 3)
    assert (final["stdout"], final["stderr"]) == ("partial\n", "oops\n")


def test_job_environment(agent, scheduler):
    scheduler.add(command='echo "$STAGE $CORRAL_JOB_ID $CORRAL_NODE_ID $CORRAL_ATTEMPT"',
                  env_vars={"STAGE": "prod"}, attempt=4)
    agent.intake.poll_once()
    reap_until_ended(agent)
    assert scheduler.final("job-1")["stdout"] == f"prod job-1 {NODE} 4\n"


def test_each_attempt_runs_with_a_span_of_its_own_in_the_jobs_trace(agent, scheduler):
    job = scheduler.add(command='echo "$TRACEPARENT ${TRACESTATE:-none}"', attempt=2,
                        env_vars={"TRACEPARENT": "00-forged"})  # the agent's value wins
    agent.intake.poll_once()
    reap_until_ended(agent)
    version, trace_id, job_span, flags = job["traceparent"].split("-")
    got, state = scheduler.final(job["job_id"])["stdout"].split()
    got_version, got_trace, got_span, got_flags = got.split("-")
    assert (got_version, got_trace, got_flags, state) == (version, trace_id, flags, "none")
    assert got_span != job_span and len(got_span) == 16 and int(got_span, 16)


@pytest.mark.parametrize("passthrough, foo", [((), "none"), (("FOO",), "foo")])
def test_the_job_environment_holds_none_of_the_agents_own(make_agent, scheduler, monkeypatch, passthrough, foo):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "agent-credentials")
    monkeypatch.setenv("FOO", "foo")
    monkeypatch.setenv("LC_TIME", "C")
    agent = make_agent(job_env_passthrough=passthrough)  # reads its environment at start-up
    scheduler.add(command='echo "${AWS_SECRET_ACCESS_KEY:-none} ${FOO:-none} $LC_TIME $TMPDIR"')
    agent.intake.poll_once()
    reap_until_ended(agent)
    # Without a private /tmp (the work dirs lie under /tmp here), TMPDIR is in the work dir.
    assert scheduler.final("job-1")["stdout"] == f"none {foo} C {agent.settings.work_dir('job-1', 1)}/.tmp\n"


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_AUDIT"])
def test_a_job_setting_a_loader_variable_is_failed_and_nothing_starts(agent, scheduler, tmp_path, name):
    marker = tmp_path / "ran"
    scheduler.add(job_id="job-1", command=f"touch {marker}")
    # The scheduler's API refuses such a job: the row is written straight in its database.
    scheduler.set_row("job-1", env_vars={name: "/tmp/evil.so"})
    assert agent.intake.poll_once() == [("job-1", 1)]
    assert reap_until_ended(agent) == [("job-1", 1, "failed")]
    final = scheduler.final("job-1")
    assert final["exit_code"] == -1 and f"refuses to run a job whose env_vars set {name}" in final["stderr"]
    assert not marker.exists() and not os.path.exists(agent.settings.work_dir("job-1", 1))


def test_start_failure_is_reported_failed(agent, scheduler, monkeypatch):
    monkeypatch.setattr(launch, "SHELL", "/no/such/shell")
    scheduler.add()
    assert agent.intake.poll_once() == [("job-1", 1)]
    assert len(agent.jobs) == 1  # holds its slot while it is prepared
    assert reap_until_ended(agent) == [("job-1", 1, "failed")]
    assert len(agent.jobs) == 0
    assert scheduler.statuses("job-1") == ["running", "failed"]
    final = scheduler.final("job-1")
    assert final["exit_code"] == 127 and "/no/such/shell" in final["stderr"]
    assert not os.path.exists(agent.settings.work_dir("job-1", 1))


def test_runner_file_output_mode(tmp_path):
    out, err = str(tmp_path / "logs" / "j.out"), str(tmp_path / "logs" / "j.err")
    job = {"job_id": "job-1", "command": "echo one; echo two >&2"}
    for _ in range(2):  # appended to, not replaced
        rj = runner.start(job, str(tmp_path), {"PATH": os.environ["PATH"]}, 6, output_files=(out, err))
        result = rj.result()
    assert (result.exit_code, result.stdout, result.stderr) == (0, "e\none\n", "o\ntwo\n")
    assert open(out).read() == "one\none\n"
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600  # the agent's, not the job's to open
    assert runner.truncate_if_over(out, 100) is False
    assert runner.truncate_if_over(out, 5) is True
    assert open(out).read() == "[corral: log truncated after 8 bytes]\n"
    assert runner.read_tail(str(tmp_path / "missing"), 10) == ""


# --- limits and usage ------------------------------------------------------------------------


def test_running_report_carries_the_limits_the_job_will_get(make_agent, scheduler):
    fake = FakeCgroups()
    agent = make_agent(cgroup_manager=fake, slots=3)
    scheduler.add(job_id="job-1")
    scheduler.add(job_id="job-2", memory_mb=64, cpu_percent=50, max_processes=20)
    scheduler.add(job_id="job-3", job_type="service", command="sleep 30", memory_mb=None)
    agent.intake.poll_once()
    running = {jid: body for jid, body in scheduler.reports if body["status"] == "running"}
    assert running["job-1"]["limits_enforced"] is True and running["job-1"]["private_tmp"] is False
    # run default
    assert running["job-1"]["limits"] == {"memory_mb": 512, "cpu_percent": 100, "max_processes": 1024}
    assert running["job-2"]["limits"] == {"memory_mb": 64, "cpu_percent": 50, "max_processes": 20}
    # service default
    assert running["job-3"]["limits"] == {"memory_mb": 1024, "cpu_percent": 200, "max_processes": 1024}
    wait_for(lambda: len(fake.created) == 3, message="three cgroups")
    assert sorted((cg.name, *cg.limits.values()) for cg in fake.created) \
        == [("job-1-1", 512, 100, 1024), ("job-2-1", 64, 50, 20), ("job-3-1", 1024, 200, 1024)]


def test_without_a_pids_controller_no_process_limit_is_claimed(make_agent, scheduler):
    fake = FakeCgroups()
    fake.limits_processes = False
    agent = make_agent(cgroup_manager=fake)
    scheduler.add(job_id="job-1", command="true", max_processes=20)
    agent.intake.poll_once()
    assert scheduler.reports[0][1]["limits"] == {"memory_mb": 512, "cpu_percent": 100, "max_processes": None}
    assert agent.default_limits()["run"]["max_processes"] is None


@pytest.mark.slow
def test_final_report_carries_usage_and_oom(make_agent, scheduler):
    fake = FakeCgroups()
    agent = make_agent(cgroup_manager=fake)
    scheduler.add(job_id="job-1", command="echo fine")
    agent.intake.poll_once()
    reap_until_ended(agent)
    final = scheduler.final("job-1")
    assert (final["status"], final["oom_killed"]) == ("done", False)
    assert (final["peak_memory_bytes"], final["cpu_seconds"]) == (12345678, 0.25)
    assert fake.removed == ["job-1-1"]  # the cgroup is always removed

    fake.oom_kills = 1  # the kernel's counter went up, and the job died of SIGKILL
    scheduler.add(job_id="job-2", command="echo allocating; kill -9 $$", memory_mb=64)
    agent.intake.poll_once()
    reap_until_ended(agent)
    final = scheduler.final("job-2")
    assert (final["status"], final["exit_code"], final["oom_killed"]) == ("failed", -9, True)
    assert final["stderr"] == "job killed: out of memory (limit 64 MB)"
    assert fake.removed == ["job-1-1", "job-2-1"]


def test_sigkill_without_the_oom_counter_is_not_an_oom(make_agent, scheduler):
    agent = make_agent(cgroup_manager=FakeCgroups())
    scheduler.add(command="kill -9 $$")
    agent.intake.poll_once()
    reap_until_ended(agent)
    final = scheduler.final("job-1")
    assert (final["exit_code"], final["oom_killed"], final["stderr"]) == (-9, False, "")


@pytest.mark.parametrize("field, value, message", [
    ("memory_mb", 5000, "job asks for memory_mb=5000 but this node allows at most 4096 "
                        "(AGENT_MAX_MEMORY_MB)"),
    ("cpu_percent", 401, "job asks for cpu_percent=401 but this node allows at most 400 "
                         "(AGENT_MAX_CPU_PERCENT)"),
    ("memory_mb", 0, "job asks for memory_mb=0, which is not a positive whole number"),
    ("max_processes", 40000, "job asks for max_processes=40000 but this node allows at most 32768 "
                             "(AGENT_MAX_PROCESSES)"),
    ("max_processes", True, "job asks for max_processes=True, which is not a positive whole number"),
])
def test_a_job_over_the_node_maximum_fails_clearly(agent, scheduler, field, value, message):
    if field == "max_processes" and value is True:  # no column holds it: the answer is altered
        scheduler.add(job_id="job-1", command="touch ran")
        scheduler.altered["job-1"] = {field: value}
    elif value == 0:  # refused by the scheduler's API: written straight in its database
        scheduler.add(job_id="job-1", command="touch ran")
        scheduler.set_row("job-1", **{field: value})
    else:
        scheduler.add(job_id="job-1", command="touch ran", **{field: value})
    assert agent.intake.poll_once() == [("job-1", 1)]
    assert len(agent.jobs) == 0
    assert scheduler.statuses("job-1") == ["running", "failed"]
    final = scheduler.final("job-1")
    assert (final["exit_code"], final["stderr"]) == (-1, message)
    assert not os.path.exists(agent.settings.work_dir("job-1", 1))


def test_a_job_that_cannot_join_its_cgroup_is_a_node_failure(agent, scheduler):
    scheduler.add(command=f"echo '{launch.JOIN_FAILED_MESSAGE} /sys/x' >&2; exit 125")
    agent.intake.poll_once()
    reap_until_ended(agent)
    final = scheduler.final("job-1")
    assert (final["status"], final["exit_code"]) == ("failed", -1)
    assert "could not set the job up" in final["stderr"].splitlines()[-1]
    assert NODE in final["stderr"]


def test_require_cgroups_refuses_to_start_without_them(tmp_path):
    settings = AgentSettings(node_id=NODE, state_dir=str(tmp_path), require_cgroups=True)
    agent = Agent(settings, RegistryClient(REGISTRY), SchedulerClient(SCHEDULER),
                  cgroup_manager=cgroups.NoCgroups("no hierarchy here"), job_identity=SAME_USER)
    with pytest.raises(AgentStartError, match="no hierarchy here"):
        agent.startup()


# --- deploy_url ------------------------------------------------------------------------------


def zip_of(files: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, (data, mode) in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFREG | mode) << 16
            zf.writestr(info, data)
    return buf.getvalue()


class Web:
    """A local HTTP server (port 0, own thread) serving `files`; a path in `held`
    is answered only once its event is set."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.held: dict[str, threading.Event] = {}
        web = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                gate = web.held.get(self.path)
                if gate is not None:
                    gate.wait(20)
                data = web.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = serve_in_thread(Handler)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self):
        for gate in self.held.values():
            gate.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def web():
    server = Web()
    try:
        yield server
    finally:
        server.close()


APP_ZIP = zip_of({"run.sh": (b'#!/bin/sh\necho "run.sh in $(basename "$PWD") on port $PORT"\n'
                             b"cat conf/app.conf\n", 0o755),
                  "conf/app.conf": (b"answer=42\n", 0o644)})


def test_deploy_url_job_unpacks_and_runs_run_sh(agent, scheduler, web):
    web.files["/app.zip"] = APP_ZIP
    scheduler.add(command=None, deploy_url=web.url("/app.zip"), port=8123,
                  deploy_sha256=hashlib.sha256(APP_ZIP).hexdigest().upper())
    agent.intake.poll_once()
    assert reap_until_ended(agent) == [("job-1", 1, "done")]
    final = scheduler.final("job-1")
    assert final["stdout"] == "run.sh in job-1-1 on port 8123\nanswer=42\n", final


def test_deploy_url_job_with_a_command_runs_it_in_the_tree(agent, scheduler, web):
    web.files["/app.zip"] = APP_ZIP
    scheduler.add(command="cat conf/app.conf", deploy_url=web.url("/app.zip"))
    agent.intake.poll_once()
    reap_until_ended(agent)
    assert scheduler.final("job-1")["stdout"] == "answer=42\n"


def test_run_sh_without_an_execute_bit_runs_under_sh(agent, scheduler, web):
    web.files["/plain.zip"] = zip_of({"run.sh": (b"echo plain $0\n", 0o644)})
    scheduler.add(command=None, deploy_url=web.url("/plain.zip"))
    agent.intake.poll_once()
    reap_until_ended(agent)
    assert scheduler.final("job-1")["stdout"] == "plain ./run.sh\n"


def test_missing_run_sh_fails_clearly(agent, scheduler, web):
    web.files["/norun.zip"] = zip_of({"app.py": (b"print(1)\n", 0o644)})
    scheduler.add(command=None, deploy_url=web.url("/norun.zip"))
    agent.intake.poll_once()
    assert reap_until_ended(agent) == [("job-1", 1, "failed")]
    final = scheduler.final("job-1")
    assert (final["exit_code"], final["stderr"]) == (-1, NO_RUN_SH_MESSAGE)
    assert not os.path.exists(agent.settings.work_dir("job-1", 1))


def test_bad_checksum_fails_the_attempt(agent, scheduler, web):
    web.files["/app.zip"] = APP_ZIP
    scheduler.add(command=None, deploy_url=web.url("/app.zip"), deploy_sha256="0" * 64)
    agent.intake.poll_once()
    assert reap_until_ended(agent) == [("job-1", 1, "failed")]
    final = scheduler.final("job-1")
    assert final["exit_code"] == -1 and "checksum failed" in final["stderr"]
    assert final["stdout"] == "" and final["oom_killed"] is False
    assert not os.path.exists(agent.settings.work_dir("job-1", 1))


def test_missing_artifact_names_the_http_status(agent, scheduler, web):
    scheduler.add(command="true", deploy_url=web.url("/gone.zip"))
    agent.intake.poll_once()
    reap_until_ended(agent)
    final = scheduler.final("job-1")
    assert final["exit_code"] == -1 and "download failed" in final["stderr"] and "404" in final["stderr"]


def test_slow_download_does_not_block_and_a_cancel_stops_the_start(agent, scheduler, web, tmp_path):
    web.files["/slow.zip"] = zip_of({"run.sh": (f"touch {tmp_path}/started\n".encode(), 0o755)})
    web.held["/slow.zip"] = threading.Event()
    scheduler.add(command=None, deploy_url=web.url("/slow.zip"))
    began = time.monotonic()
    assert agent.intake.poll_once() == [("job-1", 1)]
    assert time.monotonic() - began < 2  # the download happens on a worker thread
    assert len(agent.jobs) == 1
    assert agent.reap_once() == []
    assert agent.reconciler.reconcile_once() == []  # listed as running: it holds its slot, not lost

    scheduler.cancel("job-1")  # cancelled while it downloads
    assert agent.reconciler.reconcile_once() == [("job-1", 1)]
    web.held["/slow.zip"].set()
    assert reap_until_ended(agent) == [("job-1", 1, "killed")]
    assert not os.path.exists(tmp_path / "started")
    assert scheduler.statuses("job-1") == ["running"] and list(agent.outbox) == []


@pytest.mark.slow
def test_stopping_while_a_job_downloads_reports_it_and_never_starts_it(make_agent, scheduler, web,
                                                                       tmp_path):
    agent = make_agent(clock=time.monotonic)
    web.files["/slow.zip"] = zip_of({"run.sh": (f"touch {tmp_path}/started\n".encode(), 0o755)})
    web.held["/slow.zip"] = threading.Event()
    scheduler.add(command=None, deploy_url=web.url("/slow.zip"))
    agent.intake.poll_once()
    local = agent.jobs.get(("job-1", 1))
    assert agent.shutdown(flush_secs=2) == 0
    final = scheduler.final("job-1")
    assert (final["status"], final["exit_code"], final["stderr"]) == ("failed", -1, STOPPED_MESSAGE)
    web.held["/slow.zip"].set()
    assert local.prepared.wait(10) and local.process is None
    assert not os.path.exists(tmp_path / "started")


# --- reports -------------------------------------------------------------------------------


def test_unreachable_final_report_is_kept_and_delivered_later(agent, scheduler, clock):
    scheduler.add(command="echo hello")
    scheduler.down_for[("job-1", "done")] = 2
    agent.intake.poll_once()
    assert reap_until_ended(agent) == [("job-1", 1, "done")]
    assert scheduler.statuses("job-1") == ["running"]
    assert len(list(agent.outbox)) == 1

    agent.reap_once()  # not due yet: no new call
    assert len(scheduler.attempts) == 2
    clock.advance(1.01)
    agent.reap_once()  # due, fails again: the backoff doubles
    assert len(scheduler.attempts) == 3 and len(list(agent.outbox)) == 1
    clock.advance(1.01)
    agent.reap_once()
    assert len(scheduler.attempts) == 3
    clock.advance(1.0)
    agent.reap_once()
    assert scheduler.statuses("job-1") == ["running", "done"]
    assert scheduler.final("job-1")["stdout"] == "hello\n"
    assert list(agent.outbox) == []


def test_refused_final_report_is_dropped(agent, scheduler):
    scheduler.add()
    # Cancelled as it ended: the scheduler refuses its report as stale (409).
    scheduler.on_report = lambda job_id, body: body["status"] == "done" and scheduler.cancel(job_id)
    agent.intake.poll_once()
    reap_until_ended(agent)
    assert list(agent.outbox) == []
    assert scheduler.answers == [("job-1", "running", 200), ("job-1", "done", 409)]


def test_too_large_report_is_sent_again_with_less_output(agent, make_scheduler, monkeypatch):
    scheduler = make_scheduler(max_body_bytes=2048)  # a body with 3000 characters of output is refused
    scheduler.add(command="head -c 3000 /dev/zero | tr '\\0' x")
    calls = []
    scheduler.on_report = lambda job_id, body: calls.append(len(body.get("stdout") or ""))
    monkeypatch.setattr(reports, "SHRUNK_OUTPUT_CHARS", 100)
    agent.intake.poll_once()
    reap_until_ended(agent)
    assert calls == [0, 3000, 100]
    assert [code for _, _, code in scheduler.answers] == [200, 413, 200]
    assert scheduler.statuses("job-1") == ["running", "done"]


# --- timeouts and reconcile -------------------------------------------------------------------


def test_job_past_its_timeout_is_killed_and_reported(agent, make_scheduler, clock, tmp_path):
    scheduler = make_scheduler(job_timeout_secs=5)  # handed to the agent as the job's timeout_secs
    pid_file = tmp_path / "child.pid"
    scheduler.add(job_id="job-1", command=f"sh -c 'echo $$ > {pid_file}; exec sleep 60' & echo begun; wait")
    agent.intake.poll_once()
    child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=5,
                         message="the job's child to start"))
    clock.advance(4.9)
    assert agent.reap_once() == []
    clock.advance(0.2)
    assert reap_until_ended(agent) == [("job-1", 1, "failed")]
    final = scheduler.final("job-1")
    assert final["exit_code"] == -1
    assert final["stderr"].splitlines()[-1] == TIMEOUT_MESSAGE
    assert final["stdout"] == "begun\n"
    assert process_gone(child)


def test_service_jobs_have_no_timeout(agent, make_scheduler, clock):
    scheduler = make_scheduler(job_timeout_secs=1)  # for run jobs only
    scheduler.add(command="sleep 60", job_type="service")
    agent.intake.poll_once()
    clock.advance(100)
    assert agent.reap_once() == []
    assert len(agent.jobs) == 1


@pytest.mark.slow
def test_reconcile_kills_a_job_the_scheduler_no_longer_lists(agent, scheduler, tmp_path):
    pid_file = tmp_path / "child.pid"
    scheduler.add(command=f"sh -c 'trap \"\" TERM; echo $$ > {pid_file}; sleep 60' & wait")
    agent.intake.poll_once()
    child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=5,
                         message="the job's child to start"))
    assert agent.reconciler.reconcile_once() == []  # still listed as running here: left alone

    scheduler.cancel("job-1")  # no longer running here (as when timed out or moved)
    assert agent.reconciler.reconcile_once() == [("job-1", 1)]
    assert reap_until_ended(agent) == [("job-1", 1, "killed")]
    assert process_gone(child)
    assert scheduler.statuses("job-1") == ["running"]  # not reported
    assert scheduler.job("job-1")["status"] == "cancelled"
    assert list(agent.outbox) == []


def test_reconcile_reports_a_job_listed_here_that_the_agent_does_not_run(agent, make_scheduler):
    scheduler = make_scheduler(max_node_losses=3)
    job_id = scheduler.add(command="true", attempt=3)["job_id"]
    assert [j["job_id"] for j in scheduler.claim_unseen()] == [job_id]  # its answer never came
    assert agent.reconciler.reconcile_once() == []
    agent.outbox.flush()
    final = scheduler.final(job_id)
    assert (final["status"], final["attempt"], final["exit_code"]) == ("failed", 3, -1)
    # The node's doing, not the job's (a claim whose answer was lost never started it):
    # the scheduler requeues it without spending a retry.
    assert final["requeue"] is True and "was not running this job" in final["stderr"]
    job = scheduler.job(job_id)
    assert (job["status"], job["retry_count"], job["node_losses"]) == ("pending", 2, 1)


# --- the loops --------------------------------------------------------------------------------


def run_in_thread(agent, stop, once=False):
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(code=agent.run_forever(stop, once=once)),
                              daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.slow
@pytest.mark.parametrize("long_poll_secs", [20.0, 0.0], ids=["long-poll", "polling"])
def test_run_forever_runs_jobs_and_stops_cleanly(make_agent, scheduler, api, long_poll_secs):
    api.add(responses.POST, f"{REGISTRY}/nodes/{NODE}/heartbeat", json={})
    agent = make_agent(clock=time.monotonic, slots=1, long_poll_secs=long_poll_secs)
    scheduler.add(job_id="job-1", command="echo one")
    scheduler.add(job_id="job-2", command="echo two")
    stop = threading.Event()
    thread, outcome = run_in_thread(agent, stop)
    # A claim is the `running` transition: only a polling agent reports `running` itself.
    started = [] if long_poll_secs else ["running"]
    try:
        # One slot: job-2 starts right after job-1 frees it.
        wait_for(lambda: scheduler.statuses("job-2") == started + ["done"], timeout=10,
                 message="both jobs to be done")
        if long_poll_secs:
            assert scheduler.claims and all(claim["max"] == 1 for claim in scheduler.claims)
            assert {claim["wait_secs"] for claim in scheduler.claims} == {20.0}
        else:
            assert scheduler.claims == []
        assert scheduler.final("job-1")["stdout"] == "one\n"
        wait_for(lambda: bodies(api, "/heartbeat"), timeout=5, message="a heartbeat")

        scheduler.add(job_id="job-3", command="trap '' TERM; sleep 60")
        wait_for(lambda: len(agent.jobs) == 1, timeout=5, message="job-3 to start")
    finally:
        stop.set()
        thread.join(15)
    assert not thread.is_alive() and outcome["code"] == 0
    final = scheduler.final("job-3")
    assert (final["status"], final["exit_code"]) == ("failed", -1)
    assert final["stderr"].endswith(STOPPED_MESSAGE)


def test_once_mode_runs_what_one_poll_gave_and_returns(make_agent, scheduler, api):
    api.add(responses.POST, f"{REGISTRY}/nodes/{NODE}/heartbeat", json={})
    agent = make_agent(clock=time.monotonic)
    scheduler.add(job_id="job-1", command="echo one")
    scheduler.add(job_id="job-2", command="exit 4")
    stop = threading.Event()
    thread, outcome = run_in_thread(agent, stop, once=True)
    thread.join(15)
    stop.set()
    assert not thread.is_alive() and outcome["code"] == 0
    assert scheduler.statuses("job-1") == ["running", "done"]
    assert scheduler.statuses("job-2") == ["running", "failed"]


@pytest.mark.slow
def test_loops_survive_an_unreachable_scheduler(make_agent, api):
    api.add(responses.POST, f"{REGISTRY}/nodes/{NODE}/heartbeat", json={})
    api.add(responses.GET, re.compile(re.escape(SCHEDULER) + r"/jobs.*"),
            body=requests.ConnectionError("down"))
    agent = make_agent(clock=time.monotonic)
    agent.membership.unknown_listed = True  # as if a lease answer listed a job it does not know: it must reconcile
    stop = threading.Event()
    thread, outcome = run_in_thread(agent, stop)
    try:
        wait_for(lambda: len([c for c in api.calls if "/jobs" in c.request.url]) >= 2, timeout=10,
                 message="the agent to ask the scheduler again")
        # The claim thread backs off and tries again; it never dies of a network failure.
        wait_for(lambda: len([c for c in api.calls if c.request.url.endswith("/claim")]) >= 2, timeout=10,
                 message="the claim thread to try again")
        assert thread.is_alive() and any(t.name == "claim" for t in threading.enumerate())
    finally:
        stop.set()
        thread.join(10)
    assert outcome["code"] == 0


# --- long-poll claims -------------------------------------------------------------------------


def test_a_claimed_job_runs_without_a_running_report(make_agent, scheduler):
    agent = make_agent(slots=3, cgroup_manager=FakeCgroups())
    scheduler.add(job_id="job-1", command="echo one")
    scheduler.add(job_id="job-2", command="echo two", job_type="service", memory_mb=64)
    keys, pause = agent.claims.claim_once(wait_secs=0)
    assert keys == [("job-1", 1), ("job-2", 1)] and pause is False
    (claim,) = scheduler.claims
    assert claim == {"max": 3, "wait_secs": 0, "limits_enforced": True, "private_tmp": False, "default_limits": {
        "run": {"memory_mb": 512, "cpu_percent": 100, "max_processes": 1024},
        "service": {"memory_mb": 1024, "cpu_percent": 200, "max_processes": 1024}}}
    assert agent.free_slots() == 1 and agent.jobs.claimed_keys() == keys  # queued, holding their slots
    assert agent.intake.take_claimed() == keys and agent.jobs.claimed_keys() == []
    wait_for(lambda: ("job-1", 1, "done") in agent.reap_once(), timeout=10, message="job-1 to end")
    assert scheduler.statuses("job-1") == ["done"]  # the claim was the `running` transition
    assert scheduler.final("job-1")["stdout"] == "one\n"


def test_reports_of_ended_jobs_carry_the_claim_for_the_next_ones(make_agent, scheduler):
    agent = make_agent(slots=2, cgroup_manager=FakeCgroups())
    agent.claims.running = True  # as while the claim thread runs (long-poll)
    scheduler.add(job_id="job-1", command="echo one")
    scheduler.add(job_id="job-2", command="echo two")
    assert agent.claims.claim_once(wait_secs=0)[0] == [("job-1", 1), ("job-2", 1)]
    agent.intake.take_claimed()
    scheduler.add(job_id="job-3", command="echo three")
    wait_for(lambda: all(local.prepared.is_set() and local.process is not None
                         and local.process.poll() is not None for local in agent.jobs.snapshot()),
             timeout=10, message="both jobs to exit")
    assert len(agent.reap_once()) == 2 and not len(agent.jobs)
    # One round trip: the reports of job-1 and job-2 and a claim for the 2 slots they freed.
    assert len(scheduler.claims) == 1 and scheduler.riding_claims == [{
        "node_id": NODE, "max": 2, "limits_enforced": True, "private_tmp": False,
        "default_limits": agent.default_limits()}]
    assert scheduler.statuses("job-1") == scheduler.statuses("job-2") == ["done"]
    assert agent.jobs.claimed_keys() == [("job-3", 1)]  # queued for the work loop, holding a slot
    assert agent.claims.wake.is_set()  # one slot is still free: the claim thread asks for it
    agent.claims.wake.clear()
    agent.intake.take_claimed()
    wait_for(lambda: ("job-3", 1, "done") in agent.reap_once(), timeout=10, message="job-3 to end")
    assert scheduler.statuses("job-3") == ["done"]


def test_no_claim_rides_without_the_claim_thread_or_when_stopping(make_agent, scheduler):
    agent = make_agent(slots=1, cgroup_manager=FakeCgroups())
    scheduler.add(job_id="job-1", command="true")
    agent.claims.claim_once(wait_secs=0)
    agent.intake.take_claimed()
    scheduler.add(job_id="job-2")
    wait_for(lambda: agent.reap_once(), timeout=10, message="job-1 to end")
    assert scheduler.riding_claims == [] and scheduler.statuses("job-1") == ["done"]  # polling agent
    agent.claims.running = True
    agent.stopping.set()
    assert agent.claims.riding() is None


def test_an_idle_agent_reconciles_only_when_its_lease_lists_an_attempt_it_does_not_hold(make_agent, scheduler,
                                                                                         api, clock):
    agent = make_agent()
    lists = lambda: len([c for c in api.calls if c.request.method == "GET" and "/jobs" in c.request.url])  # noqa: E731
    agent.reconciler.reconcile_paced(Backoff())
    assert lists() == 0  # idle, nothing unknown: no request
    # A lease answer lists a job running here (a claim whose answer was lost): look now.
    job_id = scheduler.add(command="true")["job_id"]
    scheduler.claim_unseen()
    lease = scheduler.call("POST", f"/nodes/{NODE}/lease", {})  # the scheduler's answer to a renewal
    assert lease["running"] == [{"job_id": job_id, "attempt": 1}]
    agent.membership.apply_lease(clock(), lease)
    agent.reconciler.reconcile_paced(Backoff())
    assert lists() == 1 and not agent.membership.unknown_listed
    assert [(r.job_id, r.status) for r in list(agent.outbox)] == [(job_id, "failed")]  # lost here
    agent.reconciler.reconcile_paced(Backoff())
    assert lists() == 1  # idle again: no request


def test_claims_ask_only_for_free_slots_and_not_while_jobs_are_held_under_a_lapsed_lease(
        make_agent, scheduler, clock, api):
    agent = make_agent(slots=1)
    scheduler.add(job_id="job-1", command="sleep 60")
    assert agent.claims.claim_once(wait_secs=0)[0] == [("job-1", 1)]
    scheduler.add(job_id="job-2")
    assert agent.claims.claim_once(wait_secs=0) == ([], False)  # no free slot: the scheduler is not asked
    assert len(scheduler.claims) == 1
    agent.intake.take_claimed()
    api.add(responses.POST, f"{SCHEDULER}/nodes/{NODE}/lease", json={"node_id": NODE, "lease_secs": 5})
    busy = make_agent(slots=2)
    busy.membership.renew_with(busy.scheduler)
    assert busy.claims.claim_once(wait_secs=0)[0] == [("job-2", 1)]
    busy.intake.take_claimed()
    scheduler.add(job_id="job-3", command="sleep 60")
    clock.advance(6)
    # It holds a job under a lapsed lease (being fenced): no more work.
    assert busy.membership.lapsed() and busy.claims.claim_once(wait_secs=0) == ([], False)
    assert len(scheduler.claims) == 2


def test_an_idle_agent_claims_whatever_its_lease_and_the_claim_renews_it(make_agent, scheduler, clock, api):
    api.add(responses.POST, f"{SCHEDULER}/nodes/{NODE}/lease", json={"node_id": NODE, "lease_secs": 5})
    agent = make_agent(slots=1)
    agent.membership.renew_with(agent.scheduler)
    clock.advance(60)
    assert agent.membership.lapsed() and not agent.claims_blocked()  # nothing held: nothing to fence
    scheduler.add(job_id="job-1", command="sleep 60")
    assert agent.claims.claim_once(wait_secs=0)[0] == [("job-1", 1)]
    # The claim that handed the job out renewed the lease (counted from when it was sent),
    # so the job starts instead of being given back.
    assert not agent.membership.lapsed()
    assert agent.intake.take_claimed() == [("job-1", 1)]
    clock.advance(6)
    assert agent.membership.lapsed() and agent.claims_blocked()


def test_an_idle_agent_renews_once_a_minute_and_a_busy_one_every_beat(make_agent, scheduler, clock, api):
    renewals = api.add(responses.POST, f"{SCHEDULER}/nodes/{NODE}/lease",
                       json={"node_id": NODE, "lease_secs": 20, "running": []})
    agent = make_agent(slots=1)         # long-poll, as by default
    beats = []
    for _ in range(24):                 # two minutes of 5 s beats, idle
        agent.membership.renew_if_due(agent.scheduler)
        beats.append(renewals.call_count)
        clock.advance(5)
    assert renewals.call_count == 2     # at the start, and a minute later
    scheduler.add(job_id="job-1", command="sleep 60")
    agent.claims.claim_once(wait_secs=0)
    agent.intake.take_claimed()
    before = renewals.call_count
    for _ in range(3):                  # holding a job: every beat
        agent.membership.renew_if_due(agent.scheduler)
        clock.advance(5)
    assert renewals.call_count == before + 3
    # Polling agents (no claims to renew their lease) renew every beat, idle or not.
    poller = make_agent(slots=1, long_poll_secs=0)
    before = renewals.call_count
    for _ in range(3):
        poller.membership.renew_if_due(poller.scheduler)
        clock.advance(5)
    assert renewals.call_count == before + 3


def test_an_empty_answer_that_did_not_wait_means_pause(make_agent, api):
    api.add(responses.POST, f"{SCHEDULER}/nodes/{NODE}/claim", json=[],
            headers={"X-Corral-Long-Poll": "busy"})
    agent = make_agent()
    assert agent.claims.claim_once(wait_secs=20) == ([], True)
    # Without the header, an empty answer long before the deadline is also a reason to pause.
    api.replace(responses.POST, f"{SCHEDULER}/nodes/{NODE}/claim", json=[])
    assert agent.claims.claim_once(wait_secs=20) == ([], True)
    assert agent.claims.claim_once(wait_secs=0) == ([], False)
    # "again": work came while the claim waited; the next claim (at once) takes it.
    api.replace(responses.POST, f"{SCHEDULER}/nodes/{NODE}/claim", json=[],
                headers={"X-Corral-Long-Poll": "again"})
    assert agent.claims.claim_once(wait_secs=20) == ([], False)


def test_long_poll_setting():
    assert AgentSettings.from_env({"NODE_ID": "n1"}).long_poll_secs == 20.0
    assert AgentSettings.from_env({"NODE_ID": "n1", "AGENT_LONG_POLL_SECS": "0"}).long_poll_secs == 0.0
    with pytest.raises(SettingError, match="AGENT_LONG_POLL_SECS must be at most 25"):
        AgentSettings.from_env({"NODE_ID": "n1", "AGENT_LONG_POLL_SECS": "30"})


@pytest.mark.slow
def test_the_claim_thread_asks_again_once_the_work_loop_took_what_it_got(make_agent, scheduler, monkeypatch):
    """Its next request and the start of the jobs it got do not compete for the
    interpreter: the next claim leaves once they are taken (or after HANDOFF_SECS)."""
    monkeypatch.setattr(claims_module, "HANDOFF_SECS", 30.0)
    agent = make_agent(slots=2)
    waits = []

    class Recorded(threading.Event):
        def wait(self, timeout=None):
            waits.append((timeout, len(scheduler.claims)))
            return super().wait(timeout)

    agent.claims.handed_over = Recorded()
    scheduler.add(job_id="job-1", command="true")
    stop = threading.Event()
    thread = threading.Thread(target=agent.claims.loop, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: waits, timeout=10, message="the claim thread to wait for the hand-over")
        assert waits == [(30.0, 1)] and agent.jobs.claimed_keys() == [("job-1", 1)]
        assert agent.intake.take_claimed() == [("job-1", 1)]
        wait_for(lambda: len(scheduler.claims) >= 2, timeout=10, message="the next claim")
    finally:
        stop.set()
        agent.claims.wake.set()
        thread.join(10)
        agent.shutdown(flush_secs=0)


@pytest.mark.slow
def test_a_refused_claim_is_retried_after_a_pause_and_the_agent_never_falls_back_to_polling(
        make_agent, scheduler, api, monkeypatch):
    api.add(responses.POST, f"{REGISTRY}/nodes/{NODE}/heartbeat", json={})
    monkeypatch.setattr(claims_module, "Backoff", lambda first, cap: Backoff(0.05, 0.05))
    scheduler.claim_refusal = 404
    agent = make_agent(clock=time.monotonic, slots=1)
    stop = threading.Event()
    thread, outcome = run_in_thread(agent, stop)
    try:
        wait_for(lambda: len(scheduler.claims) >= 3, timeout=10, message="the claims to be sent again")
        assert agent.membership.long_poll
        scheduler.claim_refusal = None
        scheduler.add(job_id="job-1", command="echo claimed")
        wait_for(lambda: scheduler.statuses("job-1") == ["done"], timeout=10, message="job-1 to run")
        assert not [call for call in api.calls if "status=pending" in call.request.url]  # never polled
    finally:
        stop.set()
        thread.join(15)
    assert outcome["code"] == 0


# Attempt 1 holds on (ignoring SIGTERM); any later attempt says so and ends.
FIRST_ATTEMPT_HOLDS = "if [ \"$CORRAL_ATTEMPT\" = 1 ]; then trap '' TERM; sleep 60; else echo second; fi"


@pytest.mark.slow
def test_a_newer_attempt_waits_until_the_older_one_ended_here(make_agent, make_scheduler, tmp_path):
    scheduler = make_scheduler(max_node_losses=3)
    agent = make_agent(slots=2)
    scheduler.add(job_id="job-1", command=FIRST_ATTEMPT_HOLDS)
    agent.claims.claim_once(wait_secs=0)
    agent.intake.take_claimed()
    wait_for(lambda: agent.jobs.get(("job-1", 1)).prepared.is_set(), timeout=5, message="job-1 to start")
    # The scheduler gave the node up for lost and placed the job here again: attempt 2.
    assert scheduler.lose_node() == ["job-1"]
    assert (scheduler.job("job-1")["attempt"], scheduler.job("job-1")["node_id"]) == (2, NODE)
    agent.claims.claim_once(wait_secs=0)
    assert agent.intake.take_claimed() == [] and agent.jobs.claimed_keys() == [("job-1", 2)]
    assert agent.reconciler.reconcile_once() == [("job-1", 1)]  # attempt 1 is no longer listed: killed
    wait_for(lambda: ("job-1", 1, "killed") in agent.reap_once(), timeout=10, message="attempt 1 to end")
    assert agent.intake.take_claimed() == [("job-1", 2)]
    wait_for(lambda: ("job-1", 2, "done") in agent.reap_once(), timeout=10, message="attempt 2 to end")
    assert scheduler.final("job-1")["stdout"] == "second\n"


def test_reconcile_waits_for_a_claim_on_its_way_before_reporting_a_job_lost(agent, scheduler):
    # The scheduler lists a job here while a claim is still out: its answer may bring it.
    job_id = scheduler.add(command="true", attempt=3)["job_id"]
    scheduler.claim_unseen()
    agent.claims.sent = 1  # a claim sent, not answered yet
    assert agent.reconciler.reconcile_once() == [] and list(agent.outbox) == []
    agent.claims.done = 1  # it came back without the job: the attempt is lost
    agent.reconciler.reconcile_once()
    (report,) = list(agent.outbox)
    assert (report.job_id, report.attempt, report.status) == (job_id, 3, "failed")


@pytest.mark.slow
def test_reconcile_drops_a_claimed_job_the_scheduler_ended_before_it_started(make_agent, make_scheduler):
    scheduler = make_scheduler(max_node_losses=3)
    agent = make_agent(slots=2)
    scheduler.add(job_id="job-1", command=FIRST_ATTEMPT_HOLDS)
    agent.claims.claim_once(wait_secs=0)
    agent.intake.take_claimed()
    scheduler.lose_node()  # moved: placed here again as attempt 2, which waits for attempt 1
    agent.claims.claim_once(wait_secs=0)
    assert agent.intake.take_claimed() == [] and agent.jobs.claimed_keys() == [("job-1", 2)]
    scheduler.cancel("job-1")  # and attempt 2 is cancelled before it could start
    assert agent.reconciler.reconcile_once() == [("job-1", 1)]
    assert agent.jobs.claimed_keys() == []
    wait_for(lambda: ("job-1", 1, "killed") in agent.reap_once(), timeout=10, message="attempt 1 to end")
    assert agent.intake.take_claimed() == [] and len(agent.jobs) == 0
    assert scheduler.reports == []  # nothing reported: the scheduler ended both


def test_stopping_gives_claimed_jobs_that_never_started_back(make_agent, make_scheduler):
    scheduler = make_scheduler(max_node_losses=3)
    agent = make_agent(slots=2)
    scheduler.add(job_id="job-1", command="true")
    agent.claims.claim_once(wait_secs=0)
    assert agent.shutdown(flush_secs=2) == 0
    final = scheduler.final("job-1")
    assert (final["status"], final["requeue"], final["stderr"]) == ("failed", True, STOPPED_MESSAGE)
    job = scheduler.job("job-1")  # to run again, without spending a retry
    assert (job["status"], job["retry_count"], job["node_losses"]) == ("pending", 0, 1)


# --- report batches ----------------------------------------------------------------------------


def finished_jobs(agent, scheduler, *commands, first=1):
    for n, command in enumerate(commands, first):
        scheduler.add(job_id=f"job-{n}", command=command)
    agent.claims.claim_once(wait_secs=0)
    agent.intake.take_claimed()
    agent.outbox.flush = lambda force=False, claim=None: len(list(agent.outbox))  # hold the reports back
    try:
        wait_for(lambda: agent.reap_once() is not None and len(list(agent.outbox)) == len(commands),
                 timeout=10, message="every job to end")
    finally:
        del agent.outbox.flush


def test_due_reports_go_in_one_batch(make_agent, scheduler):
    agent = make_agent(slots=3)
    finished_jobs(agent, scheduler, "echo a", "exit 3", "echo c")
    scheduler.cancel("job-2")  # its report is stale (409) among them
    assert agent.outbox.flush() == 0
    assert sorted(scheduler.answers) == [("job-1", "done", 200), ("job-2", "failed", 409), ("job-3", "done", 200)]
    (batch,) = scheduler.batches
    assert sorted(item["job_id"] for item in batch) == ["job-1", "job-2", "job-3"]
    assert all(item["node_id"] == NODE and item["attempt"] == 1 for item in batch)
    assert scheduler.statuses("job-1") == ["done"] and scheduler.statuses("job-3") == ["done"]
    assert scheduler.statuses("job-2") == []  # refused, dropped, the others delivered


@pytest.mark.slow
@pytest.mark.parametrize("status", [404, 413])
def test_a_refused_batch_goes_one_by_one_and_the_next_is_a_batch_again(make_agent, scheduler, status):
    scheduler.batch_refusal = status
    agent = make_agent(slots=2)
    finished_jobs(agent, scheduler, "echo a", "echo b")
    assert agent.outbox.flush() == 0
    assert scheduler.batches == [] and scheduler.statuses("job-1") == scheduler.statuses("job-2") == ["done"]
    scheduler.batch_refusal = None
    finished_jobs(agent, scheduler, "echo c", "echo d", first=3)
    assert agent.outbox.flush() == 0 and len(scheduler.batches) == 1


def test_an_unreachable_batch_keeps_every_report(make_agent, scheduler, clock):
    agent = make_agent(slots=2)
    finished_jobs(agent, scheduler, "echo a", "echo b")
    scheduler.down_for[("job-1", "done")] = 1
    assert agent.outbox.flush() == 2
    assert all(r.tries == 1 for r in list(agent.outbox))
    clock.advance(1.01)
    assert agent.outbox.flush() == 0 and len(scheduler.batches) == 2


# --- cli ------------------------------------------------------------------------------------


def test_cli_setting_errors_exit_2(capsys, monkeypatch):
    monkeypatch.setenv("POLL_INTERVAL_SECS", "soon")
    assert main(["--node-id", "n1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("corral-agent: error: POLL_INTERVAL_SECS must be a number")


def test_cli_flags_override_environment(monkeypatch, tmp_path):
    from corral.agent.cli import build_parser, settings_from
    env = {"NODE_ID": "from-env", "AGENT_SLOTS": "3", "CORRAL_STATE_DIR": "/nowhere"}
    args = build_parser().parse_args(["--node-id", "from-flag", "--state-dir", str(tmp_path)])
    settings = settings_from(args, env)
    assert (settings.node_id, settings.slots, settings.state_dir) == ("from-flag", 3, str(tmp_path))


def test_cli_refuses_to_start_without_cgroups_when_they_are_required(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(cgroups, "detect", lambda **kw: cgroups.NoCgroups("not root (euid 1000)"))
    monkeypatch.setenv("CORRAL_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("AGENT_REQUIRE_CGROUPS", "true")
    assert main(["--node-id", "n1", "--registry-url", REGISTRY, "--scheduler-url", SCHEDULER]) == 1
    assert capsys.readouterr().err == ("corral-agent: error: AGENT_REQUIRE_CGROUPS is set but job "
                                       "limits cannot be enforced: not root (euid 1000)\n")


def test_check_reports_and_exits_0_when_all_answer(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(cgroups, "detect", lambda **kw: cgroups.NoCgroups("no cgroups in this test"))
    monkeypatch.setenv("CORRAL_STATE_DIR", str(tmp_path))
    with responses.RequestsMock() as mock:
        mock.add(responses.GET, REGISTRY + "/healthz", json={"status": "ok"})
        mock.add(responses.GET, SCHEDULER + "/healthz", json={"status": "ok"})
        code = main(["--check", "--json", "--node-id", "n1", "--registry-url", REGISTRY,
                     "--scheduler-url", SCHEDULER])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"] is True and report["problems"] == []
    assert report["node_id"] == "n1" and report["cgroups"]["mode"] == "none"
    assert report["limits_enforced"] is False and report["limits_reason"] == "no cgroups in this test"
    assert report["default_limits"]["run"] == {"memory_mb": 512, "cpu_percent": 100, "max_processes": 1024}
    assert report["max_limits"]["max_processes"] == 32768
    assert report["registry"]["ok"] and report["scheduler"]["ok"]
    if os.geteuid() == 0:
        assert report["job_user"]["mode"] == "per-job" and report["job_user"]["uid_range"] == "70000-79999"
        # The work dirs would lie under /tmp, which a private /tmp hides.
        assert report["private_tmp"] == {"enabled": False, "reason": report["private_tmp"]["reason"]}
        assert "lie under /tmp" in report["private_tmp"]["reason"]
    else:
        assert report["job_user"]["mode"] == "self"


def test_check_exits_1_when_the_control_plane_does_not_answer(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(cgroups, "detect", lambda **kw: cgroups.NoCgroups("none"))
    monkeypatch.setenv("CORRAL_STATE_DIR", str(tmp_path))
    with responses.RequestsMock() as mock:
        mock.add(responses.GET, REGISTRY + "/healthz", json={"status": "ok"})
        mock.add(responses.GET, SCHEDULER + "/healthz", body=requests.ConnectionError("refused"))
        code = main(["--check", "--node-id", "n1", "--registry-url", REGISTRY,
                     "--scheduler-url", SCHEDULER])
    out = capsys.readouterr().out
    assert code == 1
    assert f"scheduler:      {SCHEDULER} DOES NOT ANSWER" in out
    assert f"registry:       {REGISTRY} answers" in out


def test_check_exits_1_when_cgroups_are_required_but_missing(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(cgroups, "detect", lambda **kw: cgroups.NoCgroups("not root"))
    monkeypatch.setenv("CORRAL_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("AGENT_REQUIRE_CGROUPS", "true")
    with responses.RequestsMock() as mock:
        for url in (REGISTRY, SCHEDULER):
            mock.add(responses.GET, url + "/healthz", json={"status": "ok"})
        code = main(["--check", "--node-id", "n1", "--registry-url", REGISTRY,
                     "--scheduler-url", SCHEDULER])
    assert code == 1
    assert "AGENT_REQUIRE_CGROUPS is set but limits cannot be enforced: not root" in capsys.readouterr().out


# --- settings -----------------------------------------------------------------------------------


def test_new_settings_defaults():
    s = AgentSettings.from_env({"NODE_ID": "n1"})
    assert (s.job_user, s.run_as_root, s.require_cgroups) == (None, False, False)
    assert (s.run_memory_mb, s.run_cpu_percent) == (512, min(100, s.max_cpu_percent))
    assert s.max_cpu_percent == (os.cpu_count() or 1) * 100
    assert s.service_memory_mb == min(1024, s.max_memory_mb)
    assert s.service_cpu_percent == min(200, s.max_cpu_percent)
    assert (s.health_interval, s.health_timeout) == (5.0, 2.0)
    assert s.service_log_max_bytes == 64 * 1024 * 1024
    assert re.fullmatch(r"corral-n1-[0-9a-f]{8}", s.cgroup_root_name)
    # Two agents of one node id with different state dirs get different cgroup roots.
    other = AgentSettings.from_env({"NODE_ID": "n1", "CORRAL_STATE_DIR": "/srv/elsewhere"})
    assert other.cgroup_root_name != s.cgroup_root_name
    limits = s.artifact_limits
    assert (limits.max_download_bytes, limits.max_unpacked_bytes) == (512 << 20, 2048 << 20)
    assert (limits.max_entries, limits.max_ratio) == (10_000, 100)
    assert (limits.connect_timeout, limits.read_timeout, limits.download_timeout) == (10, 60, 1800)
    assert (s.uid_range, s.private_tmp, s.job_env_passthrough) == ((70000, 79999), True, ())
    assert (s.job_max_processes, s.max_processes) == (1024, 32768)


def test_isolation_settings_from_env():
    s = AgentSettings.from_env({"NODE_ID": "n1", "AGENT_UID_RANGE": "200000-200003", "AGENT_SLOTS": "4",
                                "AGENT_PRIVATE_TMP": "false", "AGENT_JOB_ENV_PASSTHROUGH": "FOO, HTTP_PROXY,",
                                "AGENT_JOB_MAX_PROCESSES": "64", "AGENT_MAX_PROCESSES": "100"})
    assert (s.uid_range, s.private_tmp, s.job_env_passthrough) == ((200000, 200003), False, ("FOO", "HTTP_PROXY"))
    assert (s.job_max_processes, s.max_processes) == (64, 100)
    assert s.uid_pool_path == os.path.join(s.agent_dir, "uids.json")
    # A node maximum under the default lowers the default; a fixed job user needs no range.
    assert AgentSettings.from_env({"NODE_ID": "n1", "AGENT_MAX_PROCESSES": "100"}).job_max_processes == 100
    assert AgentSettings.from_env({"NODE_ID": "n1", "AGENT_SLOTS": "4", "AGENT_UID_RANGE": "5-5",
                                   "AGENT_JOB_USER": "nobody"}).uid_range == (5, 5)


def test_a_uid_range_smaller_than_the_slots_stops_the_agent_with_exit_2(capsys, monkeypatch):
    monkeypatch.setenv("AGENT_UID_RANGE", "70000-70002")
    monkeypatch.setenv("AGENT_SLOTS", "4")
    assert main(["--node-id", "n1"]) == 2
    err = capsys.readouterr().err
    assert err == ("corral-agent: error: AGENT_UID_RANGE=70000-70002 holds 3 uid(s), fewer than AGENT_SLOTS=4: "
                   "every running job needs a uid of its own\n")


def test_a_reserve_above_the_nodes_maximum_stops_the_agent_with_exit_2(capsys, monkeypatch):
    monkeypatch.setenv("AGENT_MAX_MEMORY_MB", "800")
    monkeypatch.setenv("AGENT_RESERVED_MEMORY_MB", "900")
    assert main(["--node-id", "n1"]) == 2
    assert capsys.readouterr().err == ("corral-agent: error: AGENT_RESERVED_MEMORY_MB=900 is more than "
                                       "AGENT_MAX_MEMORY_MB=800; the node cannot keep more for the system than it "
                                       "has\n")


def test_settings_from_env():
    s = AgentSettings.from_env({
        "NODE_ID": "n1", "AGENT_JOB_USER": "daemon", "AGENT_MAX_MEMORY_MB": "2048",
        "AGENT_MAX_CPU_PERCENT": "800", "AGENT_SERVICE_CPU_PERCENT": "400",
        "AGENT_ARTIFACT_TIMEOUT_SECS": "0", "AGENT_REQUIRE_CGROUPS": "yes"})
    assert (s.job_user, s.max_memory_mb, s.max_cpu_percent, s.service_cpu_percent) == \
        ("daemon", 2048, 800, 400)
    assert s.require_cgroups and s.artifact_limits.download_timeout is None
    # An unset default that does not fit a small node is lowered to the maximum.
    small = AgentSettings.from_env({"NODE_ID": "n1", "AGENT_MAX_CPU_PERCENT": "100",
                                    "AGENT_MAX_MEMORY_MB": "700"})
    assert (small.service_cpu_percent, small.service_memory_mb, small.run_memory_mb) == (100, 700, 512)
    assert (s.reserved_memory_mb, s.reserved_cpu_percent) == (0, 0)
    reserving = AgentSettings.from_env({"NODE_ID": "n1", "AGENT_MAX_MEMORY_MB": "2048", "AGENT_MAX_CPU_PERCENT": "400",
                                        "AGENT_RESERVED_MEMORY_MB": "2048", "AGENT_RESERVED_CPU_PERCENT": "50"})
    assert (reserving.reserved_memory_mb, reserving.reserved_cpu_percent) == (2048, 50)


@pytest.mark.parametrize("env, message", [
    ({"AGENT_RUN_AS_ROOT": "true", "AGENT_JOB_USER": "daemon"}, "contradict each other"),
    ({"AGENT_RUN_MEMORY_MB": "900", "AGENT_MAX_MEMORY_MB": "800"},
     "AGENT_RUN_MEMORY_MB=900 is more than AGENT_MAX_MEMORY_MB=800"),
    ({"AGENT_SERVICE_CPU_PERCENT": "0"}, "AGENT_SERVICE_CPU_PERCENT must be at least 1"),
    ({"AGENT_HEALTH_INTERVAL_SECS": "0"}, "AGENT_HEALTH_INTERVAL_SECS must be greater than 0"),
    ({"AGENT_MAX_ARTIFACT_RATIO": "x"}, "AGENT_MAX_ARTIFACT_RATIO must be a number"),
    ({"AGENT_RUN_AS_ROOT": "maybe"}, "AGENT_RUN_AS_ROOT must be true or false"),
    ({"AGENT_UID_RANGE": "70000"}, "AGENT_UID_RANGE must look like 70000-79999"),
    ({"AGENT_UID_RANGE": "9-1"}, "AGENT_UID_RANGE must be FIRST-LAST"),
    ({"AGENT_PRIVATE_TMP": "sometimes"}, "AGENT_PRIVATE_TMP must be true or false"),
    ({"AGENT_JOB_ENV_PASSTHROUGH": "FOO,CORRAL_NODE_TOKEN"}, "CORRAL_NODE_TOKEN is a token"),
    ({"AGENT_JOB_ENV_PASSTHROUGH": "LD_PRELOAD"}, "cannot pass LD_PRELOAD"),
    ({"AGENT_JOB_ENV_PASSTHROUGH": "A-B"}, "'A-B' is not an environment variable name"),
    ({"AGENT_JOB_MAX_PROCESSES": "200", "AGENT_MAX_PROCESSES": "100"},
     "AGENT_JOB_MAX_PROCESSES=200 is more than AGENT_MAX_PROCESSES=100"),
    ({"AGENT_MAX_PROCESSES": "0"}, "AGENT_MAX_PROCESSES must be at least 1"),
    ({"AGENT_RESERVED_MEMORY_MB": "900", "AGENT_MAX_MEMORY_MB": "800"},
     "AGENT_RESERVED_MEMORY_MB=900 is more than AGENT_MAX_MEMORY_MB=800"),
    ({"AGENT_RESERVED_CPU_PERCENT": "500", "AGENT_MAX_CPU_PERCENT": "400"},
     "AGENT_RESERVED_CPU_PERCENT=500 is more than AGENT_MAX_CPU_PERCENT=400"),
    ({"AGENT_RESERVED_CPU_PERCENT": "-1"}, "AGENT_RESERVED_CPU_PERCENT must be at least 0"),
    ({"AGENT_RESERVED_MEMORY_MB": "1.5"}, "AGENT_RESERVED_MEMORY_MB must be a whole number"),
    # Defaults the registry and the scheduler would refuse: the node could not register.
    ({"AGENT_RUN_MEMORY_MB": "2"}, "AGENT_RUN_MEMORY_MB must be at least 4"),
    ({"AGENT_SERVICE_CPU_PERCENT": "100001"}, "AGENT_SERVICE_CPU_PERCENT must be at most 100000"),
])
def test_bad_new_settings_are_one_clear_error(env, message):
    with pytest.raises(SettingError, match=re.escape(message)):
        AgentSettings.from_env({"NODE_ID": "n1", **env})


def test_a_job_that_exited_before_the_fence_is_reported_as_it_ended(agent, scheduler):
    """The lease lapses (a stopped scheduler) after the job exited but before the work
    loop, blocked on the scheduler, reaped it: the exit 0 is reported, not a stop."""
    scheduler.add(job_id="job-1", command="echo finished")
    agent.intake.poll_once()
    local = wait_for(lambda: agent.jobs.get(("job-1", 1)) and agent.jobs.get(("job-1", 1)).process
                     and agent.jobs.get(("job-1", 1)), message="the job to start")
    wait_for(lambda: local.process.poll() is not None, message="the job to exit")
    agent.membership.lease.sent_at, agent.membership.lease.secs = agent._clock() - 100, 20.0  # lapsed meanwhile
    assert agent.membership.fence_once() == []
    wait_for(lambda: ("job-1", 1, "done") in agent.reap_once(), message="the job to be reaped")
    final = scheduler.final("job-1")
    assert (final["status"], final["stdout"]) == ("done", "finished\n") and not final.get("requeue")
