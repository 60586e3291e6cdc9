"""The agent's lease with the scheduler and its self-fencing, against the mocked API."""
import responses

from helpers import process_gone, wait_for
from scheduler_double import NODE, SCHEDULER


def lease_answer(api, lease_secs=20, status=200):
    api.add(responses.POST, f"{SCHEDULER}/nodes/{NODE}/lease",
            json={"node_id": NODE, "lease_secs": lease_secs, "running": []} if status == 200 else {"error": "x"},
            status=status)


def start_job(agent, scheduler, **fields):
    scheduler.add(**fields)
    (key,) = agent.intake.poll_once()
    local = agent.jobs.get(key)
    assert local.prepared.wait(10) and local.process is not None
    return local


def test_no_fencing_before_the_first_renewal(make_agent, scheduler, clock):
    agent = make_agent()
    start_job(agent, scheduler, command="sleep 30")
    clock.advance(3600)
    assert agent.membership.lapsed() is False and agent.membership.fence_once() == []


def test_run_jobs_stop_when_the_lease_lapses_and_are_given_back(make_agent, scheduler, clock, api, shared_dir):
    agent = make_agent()
    lease_answer(api, lease_secs=20)
    agent.membership.renew_with(agent.scheduler)
    pid_file = f"{shared_dir}/pid"
    local = start_job(agent, scheduler, command=f"echo $$ > {pid_file}; exec sleep 30")
    pid = int(wait_for(lambda: open(pid_file).read().strip(), timeout=10, message="the job's pid"))
    clock.advance(19)
    assert agent.membership.fence_once() == [] and agent.intake.poll_once() == []
    clock.advance(2)
    assert agent.membership.lapsed() is True
    assert agent.membership.fence_once() == [local.key]
    wait_for(lambda: process_gone(pid), timeout=10, message="the fenced job to be gone")
    ended = wait_for(agent.reap_once, timeout=10, message="the fenced job to be reaped")
    assert ended == [("job-1", 1, "failed")]
    final = scheduler.final("job-1")
    assert final["requeue"] is True and final["exit_code"] == -1
    assert "could not renew its lease" in final["stderr"]
    # While the lease is lapsed the agent takes no new work.
    scheduler.add(job_id="job-2", command="true")
    assert agent.intake.poll_once() == []
    lease_answer(api, lease_secs=20)
    agent.membership.renew_with(agent.scheduler)
    assert agent.membership.lapsed() is False
    assert [k for k in agent.intake.poll_once()] == [("job-2", 1)]


def test_services_are_not_fenced(make_agent, scheduler, clock, api):
    agent = make_agent()
    lease_answer(api, lease_secs=5)
    agent.membership.renew_with(agent.scheduler)
    start_job(agent, scheduler, command="exec sleep 30", job_type="service")
    clock.advance(10)
    assert agent.membership.fence_once() == []


def test_a_failed_renewal_does_not_extend_the_lease(make_agent, clock, api):
    agent = make_agent()
    lease_answer(api, lease_secs=20)
    agent.membership.renew_with(agent.scheduler)
    clock.advance(15)
    lease_answer(api, status=503)
    try:
        agent.membership.renew_with(agent.scheduler)
    except Exception:
        pass
    clock.advance(6)
    assert agent.membership.lapsed() is True


def test_the_lease_answer_ends_attempts_that_are_no_longer_running_here(make_agent, scheduler, clock, api):
    agent = make_agent()
    local = start_job(agent, scheduler, command="exec sleep 30")
    clock.advance(1)
    api.add(responses.POST, f"{SCHEDULER}/nodes/{NODE}/lease",
            json={"node_id": NODE, "lease_secs": 20, "running": [{"job_id": "job-1", "attempt": 1}]})
    agent.membership.renew_with(agent.scheduler)
    assert local.end_reason is None                      # listed: it runs on
    api.add(responses.POST, f"{SCHEDULER}/nodes/{NODE}/lease",
            json={"node_id": NODE, "lease_secs": 20, "running": []})
    agent.membership.renew_with(agent.scheduler)                             # cancelled or moved meanwhile
    assert local.end_reason == "reconciled"
    assert wait_for(agent.reap_once, timeout=10, message="the stale job to end") == [("job-1", 1, "killed")]
    assert scheduler.statuses("job-1") in (["running"], [])  # killed, not reported
