"""The agent's logic against a mocked HTTP API (responses) and real job processes.

A small in-test fake of the scheduler's job list and status reports answers the
agent's calls; tests drive the agent through its one-pass methods and wait on
conditions with deadlines.
"""
import json
import os
import re
import threading
import time
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import responses

from corral.agent import agent as agent_module
from corral.agent import runner
from corral.agent.agent import DEPLOY_MESSAGE, STOPPED_MESSAGE, TIMEOUT_MESSAGE, Agent
from corral.agent.cli import main
from corral.agent.settings import AgentSettings
from corral.shared.clients import Rejected, RegistryClient, SchedulerClient
from helpers import process_gone, wait_for

REGISTRY = "http://registry.test"
SCHEDULER = "http://scheduler.test"
NODE = "node-1"


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, secs: float) -> None:
        self.now += secs


class FakeScheduler:
    """Just enough of the scheduler API: pending/running lists and status reports."""

    def __init__(self, api: responses.RequestsMock):
        self.pending: list[dict] = []
        self.running: list[dict] = []
        self.reports: list[tuple[str, dict]] = []  # (job_id, body) of accepted reports
        self.attempts: list[tuple[str, dict]] = []  # every report that arrived
        self.refuse: dict[tuple[str, str], int] = {}  # (job_id, status) -> HTTP status
        self.down_for: dict[tuple[str, str], int] = {}  # (job_id, status) -> failures left
        self.on_report = None  # called with (job_id, body) before a report is applied
        api.add_callback(responses.GET, re.compile(re.escape(SCHEDULER) + r"/jobs(\?.*)?$"),
                         callback=self._list)
        api.add_callback(responses.POST, re.compile(re.escape(SCHEDULER) + r"/jobs/([^/]+)/status$"),
                         callback=self._report)

    def add(self, job_id="job-1", command="echo hello", attempt=1, **fields) -> dict:
        job = {"job_id": job_id, "node_id": NODE, "command": command, "deploy_url": None,
               "job_type": "run", "env_vars": {}, "status": "pending", "attempt": attempt,
               "retry_count": 0, "timeout_secs": None, **fields}
        self.pending.append(job)
        return job

    def statuses(self, job_id: str) -> list[str]:
        return [body["status"] for jid, body in self.reports if jid == job_id]

    def final(self, job_id: str) -> dict:
        return [body for jid, body in self.reports if jid == job_id and body["status"] != "running"][-1]

    def _list(self, request):
        query = parse_qs(urlsplit(request.url).query)
        assert query["node_id"] == [NODE]
        jobs = self.pending if query["status"] == ["pending"] else self.running
        return 200, {}, json.dumps(jobs)

    def _report(self, request):
        job_id = request.url.rsplit("/", 2)[-2]
        body = json.loads(request.body)
        self.attempts.append((job_id, body))
        if self.on_report:
            self.on_report(job_id, body)
        key = (job_id, body["status"])
        if self.down_for.get(key, 0) > 0:
            self.down_for[key] -= 1
            return requests.ConnectionError("scheduler is down")
        if key in self.refuse:
            return self.refuse[key], {}, json.dumps({"error": "refused by the test"})
        self.reports.append((job_id, body))
        if body["status"] == "running":
            job = next(j for j in self.pending if j["job_id"] == job_id)
            self.pending.remove(job)
            self.running.append(dict(job, status="running"))
        else:
            self.running = [j for j in self.running if j["job_id"] != job_id]
        return 200, {}, json.dumps({"job_id": job_id, "status": body["status"]})


@pytest.fixture
def api():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        mock.add(responses.POST, REGISTRY + "/nodes", json={"node_id": NODE}, status=201)
        yield mock


@pytest.fixture
def scheduler(api):
    return FakeScheduler(api)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def make_agent(tmp_path, api, clock):
    agents = []

    def make(clock=clock, **overrides):
        values = dict(node_id=NODE, registry_url=REGISTRY, scheduler_url=SCHEDULER,
                      state_dir=str(tmp_path / "state"), slots=2, poll_interval=0.05,
                      heartbeat_interval=0.05, labels={"zone": "a"}, output_tail_bytes=4096,
                      stop_grace=0.2, kill_grace=0.3)
        values.update(overrides)
        agent = Agent(AgentSettings(**values), RegistryClient(REGISTRY), SchedulerClient(SCHEDULER),
                      clock=clock)
        agents.append(agent)
        return agent

    yield make
    for agent in agents:  # no job process outlives its test
        for key in agent.running_keys():
            agent._jobs[key].process.kill(0)


@pytest.fixture
def agent(make_agent):
    return make_agent()


def reap_until_ended(agent, timeout=10):
    return wait_for(agent.reap_once, timeout=timeout, message="a job to end")


def bodies(api, url_end):
    return [json.loads(c.request.body) for c in api.calls if c.request.url.endswith(url_end)]


# --- registry --------------------------------------------------------------------------


def test_register_sends_the_node_description(agent, api):
    agent.register()
    (body,) = bodies(api, "/nodes")
    assert body["node_id"] == NODE and body["kind"] == "compute"
    assert body["address"] == "127.0.0.1" and body["slots"] == 2
    assert body["cpus"] == os.cpu_count()
    assert isinstance(body["memory_mb"], int) and body["memory_mb"] > 0
    assert body["labels"] == {"zone": "a"}


def test_heartbeat_sends_the_running_count(agent, api):
    api.add(responses.POST, f"{REGISTRY}/nodes/{NODE}/heartbeat", json={})
    agent.heartbeat_once()
    assert bodies(api, "/heartbeat") == [{"running": 0}]


def test_heartbeat_404_registers_again(agent, api):
    api.add(responses.POST, f"{REGISTRY}/nodes/{NODE}/heartbeat", json={"error": "unknown node"},
            status=404)
    agent.heartbeat_once()
    urls = [c.request.url for c in api.calls]
    assert urls == [f"{REGISTRY}/nodes/{NODE}/heartbeat", f"{REGISTRY}/nodes"]


def test_heartbeat_other_refusals_are_raised(agent, api):
    api.add(responses.POST, f"{REGISTRY}/nodes/{NODE}/heartbeat", json={"error": "bad"}, status=400)
    with pytest.raises(Rejected):
        agent.heartbeat_once()
    assert not bodies(api, "/nodes")


# --- running jobs ------------------------------------------------------------------------


def test_job_is_reported_running_before_it_starts_then_done(agent, scheduler):
    scheduler.add(command="touch started; echo hello")
    workdir = agent.work_dir("job-1", 1)
    seen = {}

    def on_report(job_id, body):
        if body["status"] == "running":
            seen["workdir_existed"] = os.path.exists(workdir)
            seen["running_locally"] = agent.running_count()

    scheduler.on_report = on_report
    assert agent.poll_once() == [("job-1", 1)]
    assert seen == {"workdir_existed": False, "running_locally": 0}
    assert reap_until_ended(agent) == [("job-1", 1, "done")]
    assert scheduler.statuses("job-1") == ["running", "done"]
    final = scheduler.final("job-1")
    assert final == {"node_id": NODE, "attempt": 1, "status": "done", "exit_code": 0,
                     "stdout": "hello\n", "stderr": ""}
    assert not os.path.exists(workdir)  # removed once the run job finished


def test_work_dir_is_kept_when_asked(make_agent, scheduler):
    agent = make_agent(keep_work_dirs=True)
    scheduler.add(command="echo kept > out.txt")
    agent.poll_once()
    reap_until_ended(agent)
    path = os.path.join(agent.work_dir("job-1", 1), "out.txt")
    assert path.startswith(os.path.join(agent.settings.state_dir, f"agent-{NODE}", "work", "job-1-1"))
    with open(path) as f:
        assert f.read() == "kept\n"


@pytest.mark.parametrize("status", [409, 404])
def test_refused_running_report_means_the_job_is_not_started(agent, scheduler, status):
    scheduler.add(command="touch started")
    scheduler.refuse[("job-1", "running")] = status
    assert agent.poll_once() == []
    assert agent.running_count() == 0
    assert not os.path.exists(agent.work_dir("job-1", 1))
    assert [body["status"] for _, body in scheduler.attempts] == ["running"]


def test_unreachable_running_report_starts_nothing(agent, scheduler):
    scheduler.add(job_id="job-1")
    scheduler.add(job_id="job-2")
    scheduler.down_for[("job-1", "running")] = 1
    assert agent.poll_once() == []
    assert agent.running_count() == 0
    assert len(scheduler.attempts) == 1  # the scheduler is down: job-2 is not tried either


def test_only_free_slots_are_filled(make_agent, scheduler):
    agent = make_agent(slots=1)
    scheduler.add(job_id="job-1", command="sleep 30")
    scheduler.add(job_id="job-2")
    assert agent.poll_once() == [("job-1", 1)]
    assert agent.poll_once() == []  # no free slot: the scheduler is not even asked
    assert scheduler.statuses("job-2") == []


def test_failing_command_reports_failed_with_its_exit_code(agent, scheduler):
    scheduler.add(command="echo partial; echo oops >&2; exit 3")
    agent.poll_once()
    assert reap_until_ended(agent) == [("job-1", 1, "failed")]
    final = scheduler.final("job-1")
    assert (final["status"], final["exit_code"]) == ("failed", 3)
    assert (final["stdout"], final["stderr"]) == ("partial\n", "oops\n")


def test_job_environment(agent, scheduler):
    scheduler.add(command='echo "$STAGE $CORRAL_JOB_ID $CORRAL_NODE_ID $CORRAL_ATTEMPT"',
                  env_vars={"STAGE": "prod"}, attempt=4)
    agent.poll_once()
    reap_until_ended(agent)
    assert scheduler.final("job-1")["stdout"] == f"prod job-1 {NODE} 4\n"


def test_start_failure_is_reported_failed(agent, scheduler, monkeypatch):
    monkeypatch.setattr(runner, "SHELL", "/no/such/shell")
    scheduler.add()
    assert agent.poll_once() == [("job-1", 1)]
    assert agent.running_count() == 0
    assert scheduler.statuses("job-1") == ["running", "failed"]
    final = scheduler.final("job-1")
    assert final["exit_code"] == 127 and "/no/such/shell" in final["stderr"]


def test_deploy_url_jobs_fail_with_a_clear_message(agent, scheduler):
    scheduler.add(command=None, deploy_url="s3://builds/etl-42.zip")
    agent.poll_once()
    assert agent.running_count() == 0
    assert scheduler.statuses("job-1") == ["running", "failed"]
    final = scheduler.final("job-1")
    assert (final["exit_code"], final["stderr"]) == (-1, DEPLOY_MESSAGE)
    assert not os.path.exists(agent.work_dir("job-1", 1))


# --- reports -------------------------------------------------------------------------------


def test_unreachable_final_report_is_kept_and_delivered_later(agent, scheduler, clock):
    scheduler.add(command="echo hello")
    scheduler.down_for[("job-1", "done")] = 2
    agent.poll_once()
    assert reap_until_ended(agent) == [("job-1", 1, "done")]
    assert scheduler.statuses("job-1") == ["running"]
    assert len(agent.pending_reports()) == 1

    agent.reap_once()  # not due yet: no new call
    assert len(scheduler.attempts) == 2
    clock.advance(1.01)
    agent.reap_once()  # due, fails again: the backoff doubles
    assert len(scheduler.attempts) == 3 and len(agent.pending_reports()) == 1
    clock.advance(1.01)
    agent.reap_once()
    assert len(scheduler.attempts) == 3
    clock.advance(1.0)
    agent.reap_once()
    assert scheduler.statuses("job-1") == ["running", "done"]
    assert scheduler.final("job-1")["stdout"] == "hello\n"
    assert agent.pending_reports() == []


def test_refused_final_report_is_dropped(agent, scheduler):
    scheduler.add()
    scheduler.refuse[("job-1", "done")] = 409
    agent.poll_once()
    reap_until_ended(agent)
    assert agent.pending_reports() == []
    assert [body["status"] for _, body in scheduler.attempts] == ["running", "done"]


def test_too_large_report_is_sent_again_with_less_output(agent, scheduler, monkeypatch):
    scheduler.add(command="head -c 3000 /dev/zero | tr '\\0' x")
    calls = []

    def on_report(job_id, body):
        calls.append(len(body.get("stdout") or ""))
        if body["status"] == "done" and len(calls) == 2:
            scheduler.refuse[("job-1", "done")] = 413
        else:
            scheduler.refuse.pop(("job-1", "done"), None)

    scheduler.on_report = on_report
    monkeypatch.setattr(agent_module, "SHRUNK_OUTPUT_CHARS", 100)
    agent.poll_once()
    reap_until_ended(agent)
    assert calls == [0, 3000, 100]
    assert scheduler.statuses("job-1") == ["running", "done"]


# --- timeouts and reconcile -------------------------------------------------------------------


def test_job_past_its_timeout_is_killed_and_reported(agent, scheduler, clock, tmp_path):
    pid_file = tmp_path / "child.pid"
    scheduler.add(command=f"sh -c 'echo $$ > {pid_file}; exec sleep 60' & echo begun; wait",
                  timeout_secs=5)
    agent.poll_once()
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


def test_service_jobs_have_no_timeout(agent, scheduler, clock):
    scheduler.add(command="sleep 60", job_type="service", timeout_secs=1)
    agent.poll_once()
    clock.advance(100)
    assert agent.reap_once() == []
    assert agent.running_count() == 1


def test_reconcile_kills_a_job_the_scheduler_no_longer_lists(agent, scheduler, tmp_path):
    pid_file = tmp_path / "child.pid"
    scheduler.add(command=f"sh -c 'trap \"\" TERM; echo $$ > {pid_file}; sleep 60' & wait")
    agent.poll_once()
    child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=5,
                         message="the job's child to start"))
    assert agent.reconcile_once() == []  # still listed as running here: left alone

    scheduler.running.clear()  # the scheduler timed it out or moved it
    assert agent.reconcile_once() == [("job-1", 1)]
    assert reap_until_ended(agent) == [("job-1", 1, "killed")]
    assert process_gone(child)
    assert scheduler.statuses("job-1") == ["running"]  # not reported
    assert agent.pending_reports() == []


def test_reconcile_reports_a_job_listed_here_that_the_agent_does_not_run(agent, scheduler):
    scheduler.running.append({"job_id": "job-9", "node_id": NODE, "status": "running",
                              "attempt": 3, "command": "true"})
    assert agent.reconcile_once() == []
    agent.flush_reports()
    final = scheduler.final("job-9")
    assert (final["status"], final["attempt"], final["exit_code"]) == ("failed", 3, -1)


# --- the loops --------------------------------------------------------------------------------


def run_in_thread(agent, stop, once=False):
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(code=agent.run_forever(stop, once=once)),
                              daemon=True)
    thread.start()
    return thread, outcome


def test_run_forever_runs_jobs_and_stops_cleanly(make_agent, scheduler, api):
    api.add(responses.POST, f"{REGISTRY}/nodes/{NODE}/heartbeat", json={})
    agent = make_agent(clock=time.monotonic, slots=1)
    scheduler.add(job_id="job-1", command="echo one")
    scheduler.add(job_id="job-2", command="echo two")
    stop = threading.Event()
    thread, outcome = run_in_thread(agent, stop)
    try:
        # One slot: job-2 starts right after job-1 frees it.
        wait_for(lambda: scheduler.statuses("job-2") == ["running", "done"], timeout=10,
                 message="both jobs to be done")
        assert scheduler.final("job-1")["stdout"] == "one\n"
        wait_for(lambda: bodies(api, "/heartbeat"), timeout=5, message="a heartbeat")

        scheduler.add(job_id="job-3", command="trap '' TERM; sleep 60")
        wait_for(lambda: agent.running_count() == 1, timeout=5, message="job-3 to start")
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


def test_loops_survive_an_unreachable_scheduler(make_agent, api):
    api.add(responses.POST, f"{REGISTRY}/nodes/{NODE}/heartbeat", json={})
    api.add(responses.GET, re.compile(re.escape(SCHEDULER) + r"/jobs.*"),
            body=requests.ConnectionError("down"))
    agent = make_agent(clock=time.monotonic)
    stop = threading.Event()
    thread, outcome = run_in_thread(agent, stop)
    try:
        wait_for(lambda: len([c for c in api.calls if "/jobs" in c.request.url]) >= 2, timeout=10,
                 message="the agent to ask the scheduler again")
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(10)
    assert outcome["code"] == 0


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
