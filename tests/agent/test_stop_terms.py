"""How the agent warns and stops a job (agent/stop_terms.py, endings.py): the terms read
from the scheduler's job, pure; then real job processes on the agent against the real
scheduler app, with the agent's clock in the test's hands: the warning signal
`secs` before the timeout, the job's own kill signal and grace on a timeout, a
cancel and a stop the lease answer asks (a drain's deadline: the job is requeued),
and the agent's own grace bounding a stop of its own."""
import signal
import time

import pytest

from corral.agent.stop_terms import StopTerms, signal_number, stop_terms
from corral.scheduler.models import Job
from helpers import wait_for
from scheduler_double import NODE


# --- the terms, pure --------------------------------------------------------------------------

def test_the_terms_are_the_jobs_own():
    terms = stop_terms({"kill_signal": "INT", "kill_grace_secs": 30, "signal_before_end": {"signal": "USR1",
                                                                                           "secs": 60}})
    assert terms == StopTerms(signal.SIGINT, 30.0, signal.SIGUSR1, 60.0)
    assert terms.warn_at(1000.0) == 940.0
    assert terms.grace(False, 5.0) == 30.0


@pytest.mark.parametrize("job", [
    {}, {"kill_signal": None, "kill_grace_secs": None, "signal_before_end": None},
    {"kill_signal": "KILL", "kill_grace_secs": -1, "signal_before_end": {"signal": "STOP", "secs": 5}},
    {"kill_signal": 15, "kill_grace_secs": True, "signal_before_end": {"signal": "USR1", "secs": 0}},
    {"kill_signal": "SIGTERM", "kill_grace_secs": float("nan"), "signal_before_end": "USR1@60"},
    {"signal_before_end": {"signal": "USR1", "secs": "60"}}, {"signal_before_end": {"secs": 60}},
])
def test_what_a_scheduler_sends_wrong_or_not_at_all_is_the_default(job):
    """A scheduler of an older release sends none of it; nothing malformed is obeyed."""
    terms = stop_terms(job)
    assert terms == StopTerms(signal.SIGTERM, None, None, None)
    assert terms.warn_at(1000.0) is None
    assert terms.grace(False, 5.0) == 5.0  # the agent's AGENT_KILL_GRACE_SECS


def test_an_end_the_node_causes_waits_no_longer_than_the_agents_grace():
    assert StopTerms(kill_grace=300.0).grace(True, 5.0) == 5.0
    assert StopTerms(kill_grace=2.0).grace(True, 5.0) == 2.0
    assert StopTerms(kill_grace=300.0).grace(False, 5.0) == 300.0


def test_only_the_signals_a_job_may_ask_for_have_numbers():
    assert signal_number("USR2") == signal.SIGUSR2 and signal_number("TERM") == signal.SIGTERM
    assert [signal_number(name) for name in ("KILL", "STOP", "TSTP", "usr1", "SIGUSR1", "", None)] == [None] * 7


# --- on a real agent ---------------------------------------------------------------------------

# The job records each signal it gets in `marks`, then goes on (or exits on `exits_on`).
def trapping(marks, exits_on: str = "", ignore: str = "") -> str:
    traps = " ".join(
        f"trap 'echo {sig} $(date +%s%N) >> {marks}{'; exit 0' if sig == exits_on else ''}' {sig};"
        for sig in ("USR1", "USR2", "TERM", "INT") if sig != ignore)
    ignored = f"trap '' {ignore};" if ignore else ""
    # `sleep` in the background and `wait`: the shell runs its traps while it waits.
    return f"{traps} {ignored} echo ready >> {marks}; while true; do sleep 0.05 & wait $!; done"


def lines(path) -> list[str]:
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def started(path):
    wait_for(lambda: "ready" in lines(path), timeout=10, message="the job to set its traps")


@pytest.mark.slow
def test_the_warning_comes_secs_before_the_timeout_then_the_kill_signal_ends_it(agent, make_scheduler, clock,
                                                                                 tmp_path):
    scheduler = make_scheduler()
    marks = tmp_path / "marks"
    scheduler.add(command=trapping(marks, exits_on="TERM"), timeout_secs=100,
                  signal_before_end={"signal": "USR1", "secs": 30})
    agent.intake.poll_once()
    started(marks)
    clock.advance(69)
    assert agent.reap_once() == []
    assert lines(marks) == ["ready"]  # not yet: 31 s before its end
    clock.advance(1.5)
    assert agent.reap_once() == []
    wait_for(lambda: "USR1" in lines(marks), timeout=5, message="the warning")
    clock.advance(10)
    assert agent.reap_once() == []
    assert lines(marks) == ["ready", "USR1"]  # once
    clock.advance(20)  # its timeout: TERM, on which it saves and exits
    ended = wait_for(agent.reap_once, timeout=10, message="the job to end")
    assert ended == [("job-1", 1, "failed")]
    assert lines(marks) == ["ready", "USR1", "TERM"]
    final = scheduler.final("job-1")
    assert (final["status"], final["ended_by"], final["exit_code"]) == ("failed", "timeout", -1)


@pytest.mark.slow
def test_a_job_that_ignores_its_kill_signal_is_killed_after_its_own_grace(agent, make_scheduler, clock, tmp_path):
    scheduler = make_scheduler()
    marks = tmp_path / "marks"
    scheduler.add(command=trapping(marks, ignore="INT"), timeout_secs=10, kill_signal="INT", kill_grace_secs=1.5)
    agent.intake.poll_once()
    started(marks)
    clock.advance(10.5)
    began = time.monotonic()
    assert agent.reap_once() == []  # INT sent; the job ignores it
    ended = wait_for(agent.reap_once, timeout=10, message="the job to be killed")
    took = time.monotonic() - began
    assert ended == [("job-1", 1, "failed")] and took >= 1.5, took
    assert "TERM" not in lines(marks)  # INT was its kill signal, not TERM
    assert scheduler.final("job-1")["ended_by"] == "timeout"


@pytest.mark.slow
def test_a_cancelled_job_gets_its_kill_signal_and_its_grace_to_save(agent, scheduler, tmp_path):
    marks = tmp_path / "marks"
    saved = tmp_path / "saved"
    scheduler.add(command=f"trap 'sleep 0.5; echo saved > {saved}; exit 0' USR2; echo ready >> {marks}; "
                          f"while true; do sleep 0.05 & wait $!; done", kill_signal="USR2", kill_grace_secs=5)
    agent.intake.poll_once()
    started(marks)
    scheduler.cancel("job-1")
    assert agent.reconciler.reconcile_once() == [("job-1", 1)]
    assert wait_for(agent.reap_once, timeout=10, message="the job to end") == [("job-1", 1, "killed")]
    assert saved.read_text() == "saved\n"  # half a second into its grace, it had not been killed


@pytest.mark.slow
def test_a_stopping_agent_bounds_the_grace_by_its_own(make_agent, scheduler, tmp_path):
    agent = make_agent(clock=time.monotonic, kill_grace=0.3)
    marks = tmp_path / "marks"
    scheduler.add(command=trapping(marks, ignore="TERM"), kill_grace_secs=60)
    agent.intake.poll_once()
    started(marks)
    began = time.monotonic()
    assert agent.shutdown(flush_secs=2) == 0
    assert time.monotonic() - began < 20  # the agent's 0.3 s, not the job's minute
    assert len(agent.jobs) == 0
    final = scheduler.final("job-1")
    assert (final["status"], final.get("requeue")) == ("failed", True)  # given up: it runs again elsewhere


def test_a_stop_the_lease_answer_asks_gets_the_kill_signal_and_requeues_the_job(agent, scheduler, clock, tmp_path):
    marks = tmp_path / "marks"
    job_id = scheduler.add(command=trapping(marks, exits_on="TERM"), kill_grace_secs=5)["job_id"]
    agent.intake.poll_once()
    started(marks)
    with scheduler.store.db.connection_context():  # the drain of the node reached its deadline
        Job.update(stop_reason="drain", stop_at=0.0).where(Job.id == int(job_id[4:])).execute()
    lease = scheduler.call("POST", f"/nodes/{NODE}/lease", {})
    assert lease["running"] == [{"job_id": job_id, "attempt": 1, "stop": "drain"}]
    agent.membership.apply_lease(clock(), lease)
    assert wait_for(agent.reap_once, timeout=10, message="the job to stop") == [(job_id, 1, "failed")]
    assert lines(marks) == ["ready", "TERM"]  # its kill signal, to which it exited at once
    final = scheduler.final(job_id)
    assert (final["requeue"], final["ended_by"]) == (True, "drain")
    assert final["stderr"].endswith("job stopped: the drain of its node reached its deadline (it runs again elsewhere)")
    job = scheduler.job(job_id)
    assert (job["status"], job["ended_by"], job["retry_count"], job["node_losses"]) == ("pending", "drain", 0, 0)


def test_a_lease_answer_asking_an_unknown_stop_stops_nothing(agent, scheduler, clock, tmp_path):
    marks = tmp_path / "marks"
    job_id = scheduler.add(command=trapping(marks))["job_id"]
    agent.intake.poll_once()
    started(marks)
    agent.membership.apply_lease(clock(), {"node_id": NODE, "lease_secs": 20, "running": [
        {"job_id": job_id, "attempt": 1, "stop": "because"}, {"job_id": job_id, "attempt": "x", "stop": "drain"}]})
    assert agent.reap_once() == [] and len(agent.jobs) == 1
    assert lines(marks) == ["ready"]
