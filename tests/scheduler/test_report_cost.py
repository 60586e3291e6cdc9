"""What a report costs the database does not grow with the jobs running elsewhere: the
jobs it ends are found by id. (SQLite, without statistics, would otherwise read them
through the status index: every running job of the cluster for a report of eight.)"""
import pytest
from scheduler_app import Clock, make_app

from corral.scheduler.models import Job
from corral.scheduler.service import Scheduler

NODES = 50
SLOTS = 40


def cluster(tmp_path, running_elsewhere: int):
    """One node's eight jobs running, and `running_elsewhere` more on other nodes."""
    clock = Clock()
    app = make_app(f"sqlite:///{tmp_path}/corral-{running_elsewhere}.db", clock, max_jobs_per_node=SLOTS)
    store = app.extensions["corral.store"]
    store.nodes.sync_nodes([{"node_id": f"n{i:02d}", "address": "127.0.0.1", "kind": "compute", "slots": SLOTS,
                             "status": "healthy"} for i in range(NODES)], clock())
    scheduler = Scheduler(store)
    scheduler.submit_batch([{"command": "true", "instance_id": "n00"} for _ in range(8)], clock())
    for start in range(0, running_elsewhere, 500):
        scheduler.submit_batch([{"command": "true", "instance_id": f"n{1 + (start + i) % (NODES - 1):02d}"}
                                for i in range(min(500, running_elsewhere - start))], clock())
    Job.update(status="running", running_at=clock()).where(Job.node_id.is_null(False)).execute()
    ours = [j.job_id for j in Job.select(Job.id).where(Job.node_id == "n00")]
    return store, scheduler, clock, ours


def steps_of_report(store, scheduler, clock, job_ids) -> int:
    """SQLite virtual machine steps (in hundreds) of one report that ends the jobs alike."""
    steps = 0

    def count():
        nonlocal steps
        steps += 1
        return 0

    report = {"node_id": "n00", "attempt": 1, "status": "done", "exit_code": 0, "stdout": "", "stderr": "",
              "oom_killed": False, "peak_memory_bytes": None, "cpu_seconds": None}
    connection = store.db.connection()
    connection.set_progress_handler(count, 100)
    try:
        outcomes, _ = scheduler.report_batch([(job_id, dict(report)) for job_id in job_ids], clock())
    finally:
        connection.set_progress_handler(None, 100)
    assert all(o.error is None and o.value.status == "done" for o in outcomes), outcomes
    return steps


@pytest.mark.slow
def test_a_reports_cost_does_not_grow_with_the_jobs_running_on_other_nodes(tmp_path):
    few = steps_of_report(*cluster(tmp_path, 40))
    many = steps_of_report(*cluster(tmp_path, 1900))
    assert many < 1.5 * few + 20, (few, many)
