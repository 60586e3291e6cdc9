"""`make run` with tokens: each local agent gets its own node credential, and the
banner says how to use the operator token with `corral`."""
import os
import re
import subprocess

import pytest
import requests

from cluster import BIN
from helpers import free_port, wait_for
from make_run import run_local, stop_local

API_TOKEN = "local-operator-token-0123456789"
AGENT_SECRET = "local-agent-secret-0123456789ab"


@pytest.mark.e2e
def test_run_local_with_tokens_runs_a_job_with_the_printed_operator_token(tmp_path):
    registry_port, scheduler_port = free_port(), free_port()
    proc, log = run_local(tmp_path, CORRAL_REGISTRY_PORT=registry_port, CORRAL_SCHEDULER_PORT=scheduler_port,
                          CORRAL_API_TOKEN=API_TOKEN, CORRAL_AGENT_TOKEN=AGENT_SECRET)
    output = lambda: open(log, errors="replace").read()  # noqa: E731
    try:
        wait_for(lambda: "Ctrl-C stops everything" in output() or proc.poll() is not None, timeout=90,
                 message="run_local to report the tokened cluster ready")
        text = output()
        assert proc.poll() is None, text
        # Tokened for real: no credential, no answer.
        scheduler = f"http://127.0.0.1:{scheduler_port}"
        assert requests.get(scheduler + "/jobs", timeout=10).status_code == 401
        # The agents hold node credentials, never the cluster's secret.
        assert "belongs on the registry and the scheduler only" not in text
        assert AGENT_SECRET not in text
        # The banner names no job that may not be the one the example creates.
        assert "jobs/job-1" not in text, text
        # Every `export` line of the banner, as a shell would take it.
        exports = dict(re.findall(r"export (CORRAL_[A-Z_]+)=(\S+)", text))
        assert exports.get("CORRAL_TOKEN") == API_TOKEN, text
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env.update(exports)
        ran = subprocess.run([os.path.join(BIN, "corral"), "job", "run", "--wait", "--", "echo", "hi"],
                             env=env, capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, (ran.stdout, ran.stderr, output())
        assert "hi" in ran.stdout + ran.stderr
        listed = subprocess.run([os.path.join(BIN, "corral"), "node", "list"], env=env, capture_output=True,
                                text=True, timeout=60)
        assert listed.returncode == 0 and "node-1" in listed.stdout and "node-2" in listed.stdout, listed
    finally:
        stop_local(proc)


@pytest.mark.e2e
def test_run_local_with_one_token_only_stops_at_once_saying_which_is_missing(tmp_path):
    proc, log = run_local(tmp_path, CORRAL_REGISTRY_PORT=free_port(), CORRAL_SCHEDULER_PORT=free_port(),
                          CORRAL_API_TOKEN=API_TOKEN)
    try:
        code = proc.wait(60)
    finally:
        stop_local(proc)
    text = open(log, errors="replace").read()
    assert code == 2, text
    assert "CORRAL_AGENT_TOKEN is not" in text and API_TOKEN not in text, text
