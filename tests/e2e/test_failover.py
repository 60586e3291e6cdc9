"""Several URLs of one service: the settings that take URL lists, `corral-agent --check`
at every URL, and, with real processes, two schedulers on one database with an agent,
a submit and the CLI moving from a replica that is gone, or that never answers, to the
other. (The clients' failover rules themselves: tests/shared/test_clients.py.)"""
import json
import os
import socket
import subprocess
import threading

import pytest
import requests
import responses

from cluster import BIN, base_env, wait_scheduler_sees_healthy
from helpers import HoldingProxy, QuietHandler, wait_for

from corral.agent import cgroups
from corral.agent import settings as agent_settings
from corral.agent.cli import main as agent_main
from corral.agent.settings import AgentSettings
from corral.scheduler.settings import SchedulerSettings
from corral.shared.clients import SchedulerClient
from corral.shared.errors import SettingError

A, B = "http://a.test:9001", "http://b.test:9001"
REG_A, REG_B = "http://a.test:9000", "http://b.test:9000"


# ---- settings -------------------------------------------------------------------------------

def test_the_agents_urls_take_a_comma_separated_list(monkeypatch):
    routed = []
    monkeypatch.setattr(agent_settings, "route_address", lambda url: routed.append(url) or "10.0.0.7")
    s = AgentSettings.from_env({"NODE_ID": "n1", "SCHEDULER_URL": f" {A}/ , {B}",
                                "REGISTRY_URL": f"{REG_A},{REG_B}/"})
    assert (s.scheduler_url, s.registry_url) == (f"{A},{B}", f"{REG_A},{REG_B}")
    assert s.address == "10.0.0.7" and routed == [REG_A]  # AGENT_ADDRESS: the route to the first registry
    one = AgentSettings.from_env({"NODE_ID": "n1", "SCHEDULER_URL": A + "/"})
    assert one.scheduler_url == A


@pytest.mark.parametrize("value", [f"{A},ftp://b.test", f"{A},b.test:9001", " , "])
def test_every_url_of_a_list_is_checked(value):
    with pytest.raises(SettingError) as err:
        AgentSettings.from_env({"NODE_ID": "n1", "SCHEDULER_URL": value})
    assert err.value.message == ("SCHEDULER_URL must be an http:// or https:// URL, or several "
                                 f"comma-separated; got {value.strip()!r}")
    with pytest.raises(SettingError):
        SchedulerSettings.from_env({"REGISTRY_URL": value})


def test_the_schedulers_registry_url_takes_a_list():
    assert SchedulerSettings.from_env({"REGISTRY_URL": f"{REG_A}/,{REG_B}"}).registry_url == f"{REG_A},{REG_B}"


# ---- corral-agent --check -------------------------------------------------------------------

def test_check_asks_every_url_and_says_which_answer(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(cgroups, "detect", lambda **kw: cgroups.NoCgroups("no cgroups in this test"))
    monkeypatch.setenv("CORRAL_STATE_DIR", str(tmp_path))
    argv = ["--check", "--node-id", "n1", "--registry-url", f"{REG_A},{REG_B}", "--scheduler-url", f"{A},{B}"]
    with responses.RequestsMock() as mock:
        for url in (REG_A, REG_B, B):
            mock.get(url + "/healthz", json={"status": "ok"})
        mock.get(A + "/healthz", body=requests.ConnectionError("Connection refused"))
        assert agent_main(argv) == 1
        text = capsys.readouterr().out
        assert agent_main([*argv, "--json"]) == 1
        report = json.loads(capsys.readouterr().out)
    lines = text.splitlines()
    at = lines.index(f"registry:       {REG_A} answers")
    assert lines[at:at + 4] == [f"registry:       {REG_A} answers", f"                {REG_B} answers",
                                f"scheduler:      {A} DOES NOT ANSWER: GET {A}/healthz: connection refused",
                                f"                {B} answers"]
    assert report["registry"]["ok"] is True and report["scheduler"]["ok"] is False
    assert [(u["url"], u["ok"]) for u in report["scheduler"]["urls"]] == [(A, False), (B, True)]
    assert report["problems"] == [f"the scheduler at {A} does not answer: GET {A}/healthz: connection refused"]


# ---- real processes: two schedulers on one SQLite database ----------------------------------

@pytest.fixture
def replica(cluster, request):
    """The URL of a second scheduler on the cluster's database (the same state dir:
    SQLite writers queue on a file lock, so both may write)."""
    env = base_env(cluster.state_dir, **cluster.scheduler_env, REGISTRY_URL=cluster.registry_url)
    port = cluster._serve("scheduler-b", "corral-scheduler", env, None)
    proc = cluster.procs.pop("scheduler-b")  # a server, not one of the agents Cluster.stop ends first
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            print(f"===== scheduler-b =====\n{proc.output()[-6000:]}")


@pytest.fixture
def refused_url():
    """A loopback URL whose connections are refused: its port is bound (so no one else
    takes it) but nothing listens there."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def marks_dir(shared_dir: str) -> str:
    path = os.path.join(shared_dir, "marks")
    os.mkdir(path)
    os.chmod(path, 0o1777)
    return path


def runs_of(marks: str, job_id: str) -> list[str]:
    """The runs a job's command made: one mark file each (JOB-ATTEMPT-PID)."""
    return [name for name in os.listdir(marks) if name.startswith(job_id + "-")]


def jobs_of(url: str) -> dict[str, dict]:
    return {j["job_id"]: j for j in requests.get(url + "/jobs", params={"limit": 1000}, timeout=10).json()}


def final_transitions(url: str, job_id: str) -> list[dict]:
    events = requests.get(f"{url}/jobs/{job_id}/events", timeout=10).json()
    return [e for e in events if e["to"] in ("done", "failed", "cancelled")]


@pytest.mark.e2e
def test_an_agent_moves_to_the_second_scheduler_when_the_first_is_killed(cluster, replica, shared_dir,
                                                                         refused_url):
    """SIGKILL of one scheduler while an agent runs and claims jobs through it: the
    agent's reports, renewals and claims go to the other replica, and every job ends
    done, run once. The registry's first URL refuses connections all along."""
    c, marks = cluster, marks_dir(shared_dir)
    both = f"{c.scheduler_url},{replica}"
    c.start_agent("node-1", slots=2, SCHEDULER_URL=both, REGISTRY_URL=f"{refused_url},{c.registry_url}")
    c.wait_nodes_healthy("node-1")
    wait_scheduler_sees_healthy(replica, ("node-1",))
    client = SchedulerClient(both)
    command = f"touch {marks}/$CORRAL_JOB_ID-$CORRAL_ATTEMPT-$$; sleep 1; echo ran"
    submitted = [client.submit({"command": command, "max_retries": 0})["job_id"] for _ in range(6)]
    wait_for(lambda: any(j["status"] == "running" for j in jobs_of(c.scheduler_url).values()), timeout=20,
             message="a job to run through the first scheduler")
    # SIGKILL, not SIGSTOP: a stopped replica may hold SQLite's writers' lock, which would
    # stop the other replica too (a replica that never answers: the last test below).
    c.procs["scheduler"].kill()
    unfinished = [job_id for job_id, j in jobs_of(replica).items() if j["status"] != "done"]
    assert len(unfinished) >= 3  # most of the work is left for the second replica

    jobs = wait_for(lambda: (lambda js: js if all(js[i]["status"] in ("done", "failed") for i in submitted)
                             else None)(jobs_of(replica)), timeout=60, message="every job to end")
    assert [(i, jobs[i]["status"], jobs[i]["stdout"]) for i in submitted] == [(i, "done", "ran\n") for i in submitted]
    for job_id in submitted:
        assert len(runs_of(marks, job_id)) == 1, (job_id, sorted(os.listdir(marks)))
        assert len(final_transitions(replica, job_id)) == 1

    # The command line with both addresses, the first now refused.
    env = dict(os.environ, CORRAL_ADDR=both, CORRAL_REGISTRY_ADDR=f"{refused_url},{c.registry_url}")
    corral = os.path.join(BIN, "corral")
    run = subprocess.run([corral, "job", "run", "--wait", "--", "echo", "hi"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert (run.returncode, run.stdout) == (0, "hi\n"), run.stderr
    listed = subprocess.run([corral, "node", "list", "--json"], env=env, capture_output=True, text=True, timeout=30)
    assert [n["node_id"] for n in json.loads(listed.stdout)] == ["node-1"], listed.stderr


class AnswerWithheld(HoldingProxy):
    """A proxy in front of one scheduler that passes each request on and keeps the
    answer to itself: the server acts, the client never hears of it."""

    def __init__(self, upstream: str):
        self.answers: list[tuple[int, dict]] = []
        release = threading.Event()
        proxy = self

        class Handler(QuietHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "idempotency-key")}
                answer = requests.post(upstream + self.path, data=body, headers=headers, timeout=10)
                proxy.answers.append((answer.status_code, answer.json()))
                release.wait(60)  # no answer; the connection closes when the test ends

        super().__init__(Handler, release)


@pytest.mark.e2e
def test_a_submit_resent_to_the_other_scheduler_after_a_lost_answer_creates_one_job(cluster, replica):
    proxy = AnswerWithheld(cluster.scheduler_url)
    try:
        client = SchedulerClient([proxy.url, replica], timeout=(3.05, 2.0))
        job = client.submit({"command": "true", "instance_id": "no-such-node"})
        assert [status for status, _ in proxy.answers] == [201]  # the first replica created it
        assert job["job_id"] == proxy.answers[0][1]["job_id"]   # the second answered that job
        assert list(jobs_of(replica)) == [job["job_id"]]
        assert client.base_url == replica
    finally:
        proxy.stop()


@pytest.mark.e2e
def test_an_agent_leaves_a_scheduler_that_accepts_connections_but_never_answers(cluster):
    """The first URL is a socket that listens but is never read (a hung server): the
    agent's calls time out there, a claim's after its whole wait, and move to the
    scheduler, where the job runs once."""
    hung = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)
    try:
        agent = cluster.start_agent("node-1", SCHEDULER_URL=f"http://127.0.0.1:{hung.getsockname()[1]},"
                                                            f"{cluster.scheduler_url}", AGENT_LONG_POLL_SECS=1)
        cluster.wait_nodes_healthy("node-1")
        job = cluster.submit(command="echo ran")
        done = cluster.wait_status(job["job_id"], "done", "failed", timeout=60)
        assert (done["status"], done["stdout"], done["attempt"]) == ("done", "ran\n", 1)
        assert len([e for e in cluster.events(job["job_id"]) if e["to"] == "running"]) == 1
        assert "timed out waiting for the answer" in agent.output()
    finally:
        hung.close()
