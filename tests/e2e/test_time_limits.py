"""Per-job time limits end to end, on real agents: a job that traps its warning signal
saves its checkpoint before its timeout stops it, knows its deadline from
CORRAL_DEADLINE, and its answer says it ended by its timeout; a job that asks a
timeout past its team's maximum is refused."""
import pytest
import requests

from cluster import Cluster, started
from corral.shared import wire
from corral.shared.timeutil import epoch
from helpers import wait_for

pytestmark = pytest.mark.e2e

# Saves a "checkpoint" (a line on stdout) on USR1, says when TERM came and exits on it.
CHECKPOINTING = ("echo deadline $CORRAL_DEADLINE; "
                 "trap 'echo checkpoint $(date +%s.%N)' USR1; "
                 "trap 'echo stopped $(date +%s.%N); exit 0' TERM; "
                 "while true; do sleep 0.05 & wait $!; done")


def said(job: dict) -> dict[str, float]:
    pairs = [line.split() for line in job["stdout"].splitlines()]
    assert all(len(pair) == 2 for pair in pairs), job["stdout"]
    return {word: float(value) for word, value in pairs}


def test_a_job_saves_its_checkpoint_on_the_warning_before_its_timeout_stops_it(tmp_path, request):
    with started(Cluster(tmp_path), request) as c:
        c.start_agent("limits-n1", slots=1)
        c.wait_nodes_healthy("limits-n1")
        job = c.submit(command=CHECKPOINTING, timeout_secs=6, signal_before_end={"signal": "USR1", "secs": 3},
                       kill_grace_secs=5, max_retries=2)
        running = c.wait_status(job["job_id"], "running", timeout=30)
        assert running["deadline"] is not None
        ended = c.wait_status(job["job_id"], "done", "failed", timeout=60)
        assert (ended["status"], ended["ended_by"], ended["exit_code"], ended["retry_count"]) == (
            "failed", "timeout", -1, 0), ended
        # Once each: the signal reaches every process of the job (its group, and its cgroup's
        # that left the group), the shell that traps it once.
        assert [line.split()[0] for line in ended["stdout"].splitlines()] == ["deadline", "checkpoint", "stopped"]
        times = said(ended)
        deadline = times["deadline"]
        # CORRAL_DEADLINE is the scheduler's deadline, to the second (the agent counts from its claim).
        assert abs(deadline - epoch(running["deadline"])) <= 2, (deadline, running["deadline"])
        # The warning came about 3 s before the end, the stop at the end; each within a poll of the agent.
        assert deadline - 3 - 1.5 <= times["checkpoint"] <= deadline - 3 + 1.5, times
        assert times["checkpoint"] < times["stopped"]
        assert deadline - 1.5 <= times["stopped"] <= deadline + 1.5, times


def test_a_teams_maximum_bounds_its_jobs_timeouts(tmp_path, request):
    with started(Cluster(tmp_path), request) as c:
        url = c.scheduler_url
        assert requests.post(f"{url}/teams", json={"name": "ml"}, timeout=10).status_code == 201
        assert requests.patch(f"{url}/teams/ml", json={"max_timeout_secs": 60}, timeout=10).status_code == 200
        # Each worker reads the teams' maxima again at most every 2 s: the bound holds once
        # the worker that answers has read it.

        def refused():
            answer = requests.post(f"{url}/jobs", json={"command": "true", "team": "ml", "timeout_secs": 61},
                                   timeout=10)
            return answer.json() if answer.status_code == 400 else None

        assert "max_timeout_secs" in wait_for(refused, timeout=10, message="a refusal")["error"]
        wait_for(lambda: c.submit(command="true", team="ml")["timeout_secs"] == 60, timeout=10,
                 message="a job given the team's maximum")


# The first attempt saves on TERM and exits; a later one finishes at once.
STOPPED_THEN_DONE = ("if [ \"$CORRAL_ATTEMPT\" = 1 ]; then trap 'echo saved; exit 0' TERM; echo first; "
                     "while true; do sleep 0.05 & wait $!; done; else echo second; fi")


def test_a_drain_with_a_deadline_stops_the_job_and_it_runs_again_elsewhere(tmp_path, request):
    with started(Cluster(tmp_path), request) as c:
        c.start_agent("drain-n1", slots=1)
        c.wait_nodes_healthy("drain-n1")
        job = c.submit(command=STOPPED_THEN_DONE, max_retries=0, kill_grace_secs=5)
        assert c.wait_status(job["job_id"], "running", timeout=30)["node_id"] == "drain-n1"
        c.start_agent("drain-n2", slots=1)
        c.wait_nodes_healthy("drain-n2")
        drained = requests.post(f"{c.scheduler_url}/nodes/drain-n1/drain", json={"deadline_secs": 1}, timeout=10)
        assert drained.status_code == 200 and drained.json()["stopping"] == 1, drained.text
        done = c.wait_status(job["job_id"], "done", "failed", timeout=60)
        assert (done["status"], done["node_id"], done["attempt"], done["retry_count"], done["stdout"]) == (
            "done", "drain-n2", 2, 0, "second\n"), done
        # The first attempt had its kill signal and the time to save (its complete log, which its
        # node ships on its own time).
        def first_log():
            answer = requests.get(f"{c.scheduler_url}/jobs/{job['job_id']}/logs",
                                  params={"attempt": 1, "stream": "stdout"}, timeout=10)
            return answer.text if answer.headers.get(wire.LOG_COMPLETE_HEADER) == "true" else None
        assert wait_for(first_log, timeout=30, message="the first attempt's complete log") == "first\nsaved\n"
        events = requests.get(f"{c.scheduler_url}/jobs/{job['job_id']}/events", timeout=10).json()
        assert any("drain of its node reached its deadline; requeued" in e["reason"] for e in events), events
