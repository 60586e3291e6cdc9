"""The agent's job table (agent/jobs.py): claimed jobs, held jobs and their states."""
import threading

from corral.agent.jobs import ENDING, NOT_STARTED, PREPARING, RUNNING, JobTable, LocalJob


def local(job_id, attempt=1):
    return LocalJob(job_id, attempt, "run", f"/w/{job_id}", 0.0, None)


def test_a_jobs_state_follows_its_preparation_and_its_end():
    job = local("a")
    assert job.state == PREPARING
    job.end_reason = "stopping"
    assert job.state == ENDING        # ended while still preparing
    job = local("b")
    job.prepared.set()
    assert job.state == NOT_STARTED   # prepared without a process
    job.process = object()
    assert job.state == RUNNING
    job.end_reason = "timeout"
    assert job.state == ENDING


def test_claimed_and_held_jobs_share_the_slots_and_move_without_being_counted_twice():
    table = JobTable()
    table.queue([(("a", 1), {"job_id": "a"}), (("b", 1), {"job_id": "b"})])
    assert table.free(3) == 1 and table.claimed_keys() == [("a", 1), ("b", 1)]
    taken = table.take_claimed(lambda key, job: local(*key) if key[0] == "a" else None)  # b given back
    assert taken == [("a", 1)] and table.keys() == {("a", 1)} and table.claimed_keys() == []
    assert table.free(3) == 2 and table.holds_job("a") and not table.holds_job("b")


def test_a_newer_attempt_waits_in_the_queue_while_an_older_one_is_held():
    table = JobTable()
    table.add(local("a", 1))
    table.queue([(("a", 2), {"job_id": "a"})])
    assert table.take_claimed(lambda key, job: local(*key)) == [] and table.claimed_keys() == [("a", 2)]
    table.remove(("a", 1))
    assert table.take_claimed(lambda key, job: local(*key)) == [("a", 2)]


def test_a_claimed_job_the_scheduler_ended_is_dropped_and_stopping_takes_the_rest():
    table = JobTable()
    table.queue([(("a", 1), {}), (("b", 1), {})])
    assert table.drop_claimed(("a", 1)) and not table.drop_claimed(("a", 1))
    assert table.take_all_claimed() == [(("b", 1), {})] and not table.has_claimed()


def test_readers_on_other_threads_get_snapshots_while_the_table_changes():
    table = JobTable()
    stop = threading.Event()
    seen = []

    def read():
        while not stop.is_set():
            seen.append(len([job.key for job in table.snapshot()]))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(2000):
            table.add(local(f"j{n}"))
            table.remove((f"j{n - 1}", 1))
    finally:
        stop.set()
        reader.join(10)
    assert seen and max(seen) <= 2 and len(table) == 1
