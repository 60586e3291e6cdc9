"""Scheduling end to end: the real registry and scheduler under gunicorn and real
agents with labels and sizes, on both storage backends (SQLite files; one PostgreSQL
database for both services). Constraints and pools, reservations, priorities, run_at
and delay_secs, dependencies, arrays, concurrency limits and the pending reasons a
user sees while a job waits.

One cluster per backend serves every test of the module. Each test sends its jobs to
nodes of its own by their labels and waits until they have ended, so the tests do
not disturb each other. Where timing matters the jobs mark it themselves: each
appends `start <job> <epoch-ns>` and `end <job> <epoch-ns>` to a file of the test,
in a directory every job uid can write to.
"""
import os
import shutil
import signal
from datetime import datetime, timedelta, timezone

import pytest
import requests

from cluster import Cluster, world_traversable_dir
from helpers import wait_for

pytestmark = pytest.mark.e2e

# The nodes: labels, slots and, for "small", a memory size that holds one of test 2's
# jobs but not two. Jobs choose them with these constraints.
NODES = {
    "gpu-1": {"slots": 2, "AGENT_LABELS": "pool=gpu,kind=gpu"},
    "cpu-1": {"slots": 2, "AGENT_LABELS": "kind=cpu"},
    "small": {"slots": 2, "AGENT_LABELS": "role=small", "AGENT_MAX_MEMORY_MB": 256},
    # It polls instead of long-polling, so that a test that stops it (SIGSTOP) leaves no
    # claim waiting on the scheduler that would take a job meanwhile.
    "serial": {"slots": 1, "AGENT_LABELS": "role=serial", "AGENT_LONG_POLL_SECS": 0},
}
KIND = [{"label": "kind", "op": "exists"}]  # gpu-1 and cpu-1: four slots
SERIAL = [{"label": "role", "op": "=", "value": "serial"}]
SMALL = [{"label": "role", "op": "=", "value": "small"}]


def on_kind(kind: str) -> list[dict]:
    return [{"label": "kind", "op": "=", "value": kind}]


class Site:
    """The module's cluster and a directory its jobs write their marks to."""

    def __init__(self, cluster: Cluster, shared: str):
        self.cluster = cluster
        self.shared = shared
        self.url = cluster.scheduler_url

    def marks_file(self, name: str) -> str:
        path = os.path.join(self.shared, name)
        open(path, "w").close()
        os.chmod(path, 0o666)  # every job runs under a uid of its own
        return path

    def release_path(self, name: str) -> str:
        return os.path.join(self.shared, "release-" + name)

    def release(self, name: str) -> None:
        open(self.release_path(name), "w").close()

    def submit(self, **request) -> dict:
        return self.cluster.submit(**request)

    def job(self, job_id: str) -> dict:
        return self.cluster.job(job_id)

    def done(self, job_id: str, timeout: float = 30.0) -> dict:
        job = self.cluster.wait_status(job_id, "done", "failed", "cancelled", timeout=timeout)
        assert job["status"] == "done", job
        return job

    def reason(self, job_id: str, code: str, /, *, timeout: float = 10.0, **details) -> dict:
        """The job's pending_reason once it is `code` with these `details`. A job that
        placement has not offered yet reads as waiting behind the queue; the background
        pass (every DISPATCH_INTERVAL_SECS) gives the reason it finds."""
        seen = []

        def current():
            job = self.job(job_id)
            reason = job["pending_reason"]
            seen[:] = [job["status"], reason]
            if job["status"] != "pending" or not reason or reason["code"] != code:
                return None
            return reason if all(reason.get(k) == v for k, v in details.items()) else None
        try:
            return wait_for(current, timeout=timeout, message=f"{job_id} to wait for reason {code} {details}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it is {seen}") from None

    def listed(self, code: str) -> set[str]:
        response = requests.get(self.url + "/jobs", params={"pending_reason": code, "limit": 1000}, timeout=10)
        response.raise_for_status()
        return {j["job_id"] for j in response.json()}


def stamped(path: str, body: str = "true") -> str:
    return (f"echo start $CORRAL_JOB_ID $(date +%s%N) >> {path}; {body}; "
            f"echo end $CORRAL_JOB_ID $(date +%s%N) >> {path}")


def held(site: Site, name: str) -> str:
    """A command that runs until the test releases `name`."""
    return f"while [ ! -e {site.release_path(name)} ]; do sleep 0.05; done"


def spans(path: str) -> dict[str, tuple[float, float]]:
    """Each job's (start, end) in epoch seconds, from its marks in `path`."""
    starts, ends = {}, {}
    with open(path) as f:
        for line in f:
            what, job, ns = line.split()
            (starts if what == "start" else ends)[job] = int(ns) / 1e9
    assert starts.keys() == ends.keys(), f"jobs that started but never ended: {starts.keys() - ends.keys()}"
    return {job: (starts[job], ends[job]) for job in starts}


def peak(intervals) -> int:
    """The most intervals that overlap at any instant (an end before a start at the same instant)."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def site(request, tmp_path_factory):
    """The module's cluster on one backend: registry, scheduler and the four NODES."""
    tmp = tmp_path_factory.mktemp(f"scheduling-{request.param}")
    pg_server, database = None, None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp}/corral.db"
    else:
        pg_server = request.getfixturevalue("pg_server")
        database = pg_server.create_database()
        url = pg_server.url(database)
    # Four jobs per node at most, so that the agents' slots and the jobs' reservations,
    # not the scheduler's default of one, bound what each node runs.
    cluster = Cluster(tmp, database_url=url, MAX_JOBS_PER_NODE=4)
    shared = world_traversable_dir("corral-scheduling-", 0o1777)
    failed_before = request.session.testsfailed
    try:
        cluster.start()
        for node_id, spec in NODES.items():
            cluster.start_agent(node_id, **spec)
        cluster.wait_nodes_healthy(*NODES)
        yield Site(cluster, shared)
    finally:
        cluster.stop()
        if request.session.testsfailed > failed_before:
            print(cluster.logs())
        shutil.rmtree(shared, ignore_errors=True)
        if pg_server is not None:
            pg_server.drop_database(database)


def test_a_constrained_job_lands_only_on_a_matching_node(site):
    nodes = requests.get(site.url + "/nodes", timeout=10).json()
    by_id = {n["node_id"]: n for n in nodes}
    assert by_id["gpu-1"]["labels"] == {"pool": "gpu", "kind": "gpu"} and by_id["gpu-1"]["pool"] == "gpu"
    assert by_id["cpu-1"]["pool"] == "default"
    expected = {}
    for _ in range(3):
        expected[site.submit(command="true", pool="gpu")["job_id"]] = "gpu-1"
        expected[site.submit(command="true", constraints=on_kind("cpu"))["job_id"]] = "cpu-1"
        not_gpu = [*KIND, {"label": "kind", "op": "not_in", "value": ["gpu"]}]
        expected[site.submit(command="true", constraints=not_gpu)["job_id"]] = "cpu-1"
        in_gpu = [{"label": "kind", "op": "in", "value": ["gpu", "tpu"]}]
        expected[site.submit(command="true", constraints=in_gpu)["job_id"]] = "gpu-1"
    ran_on = {job_id: site.done(job_id)["node_id"] for job_id in expected}
    assert ran_on == expected


def test_a_job_that_does_not_fit_the_memory_left_waits_then_starts_when_one_ends(site):
    marks = site.marks_file("memory")
    # "small" has two slots but 256 MB: one 160 MB job fits, a second does not.
    first = site.submit(command=stamped(marks, held(site, "memory")), memory_mb=160, constraints=SMALL)
    site.cluster.wait_status(first["job_id"], "running")
    second = site.submit(command=stamped(marks), memory_mb=160, constraints=SMALL)
    site.reason(second["job_id"], "no_capacity", lacking=["memory"], nodes=1)
    assert second["job_id"] in site.listed("no_capacity")
    why = requests.get(f"{site.url}/jobs/{second['job_id']}/why", timeout=10).json()
    lacks = {n["node_id"]: n["lacks"] for n in why["closest_nodes"]}
    assert lacks["small"] == ["needs 160 MB of memory, 96 MB unreserved"], why
    small = next(n for n in requests.get(site.url + "/nodes", timeout=10).json() if n["node_id"] == "small")
    assert small["allocatable"]["memory_mb"] == 256 and small["reserved"]["memory_mb"] == 160
    site.release("memory")
    assert site.done(first["job_id"])["node_id"] == "small"
    assert site.done(second["job_id"])["node_id"] == "small"
    times = spans(marks)
    assert times[second["job_id"]][0] >= times[first["job_id"]][1]


def test_priorities_order_a_backlog(site):
    marks = site.marks_file("priorities")
    blocker = site.submit(command=held(site, "priorities"), constraints=SERIAL)
    site.cluster.wait_status(blocker["job_id"], "running")
    low = site.submit(command=stamped(marks), constraints=SERIAL, priority=10)
    high = site.submit(command=stamped(marks), constraints=SERIAL, priority=90)
    default = site.submit(command=stamped(marks), constraints=SERIAL)
    later_high = site.submit(command=stamped(marks), constraints=SERIAL, priority=90)
    assert default["priority"] == 50
    backlog = [low, high, default, later_high]
    for job in backlog:
        site.reason(job["job_id"], "no_capacity", lacking=["slot"], nodes=1)
    site.release("priorities")
    for job in [blocker, *backlog]:
        site.done(job["job_id"])
    times = spans(marks)
    started = sorted(times, key=lambda job_id: times[job_id][0])
    # Higher first; of equal priority, the older first.
    assert started == [high["job_id"], later_high["job_id"], default["job_id"], low["job_id"]]


# Between the instant a job comes due and its first mark: the scheduler's background
# pass wakes for the due job (or runs within DISPATCH_INTERVAL_SECS, 0.2 s here), the
# waiting claim of the agent returns it, and the agent launches the shell. Well under a
# second on an idle machine; 3 s leaves room for a loaded two-core one.
DUE_BOUND_SECS = 3.0


def test_run_at_and_delay_secs_are_honoured(site):
    marks = site.marks_file("due")
    run_at = (datetime.now(timezone.utc) + timedelta(seconds=3)).isoformat().replace("+00:00", "Z")
    at = site.submit(command=stamped(marks), constraints=on_kind("gpu"), run_at=run_at)
    delayed = site.submit(command=stamped(marks), constraints=on_kind("cpu"), delay_secs=2)
    for job in (at, delayed):
        assert job["node_id"] is None and job["run_at"]
        reason = site.reason(job["job_id"], "scheduled")
        assert reason["until"] == site.job(job["job_id"])["run_at"]
    assert abs(epoch(at["run_at"]) - epoch(run_at)) < 0.01
    assert site.listed("scheduled") >= {at["job_id"], delayed["job_id"]}
    for job in (at, delayed):
        site.done(job["job_id"])
    times = spans(marks)
    for job in (at, delayed):
        due = epoch(job["run_at"])
        start = times[job["job_id"]][0]
        assert due <= start <= due + DUE_BOUND_SECS, (job["job_id"], start - due)


def test_a_chain_runs_in_order_and_a_failed_head_cancels_the_rest(site):
    marks = site.marks_file("chain")
    a = site.submit(command=stamped(marks, "sleep 0.5"), constraints=KIND)
    b = site.submit(command=stamped(marks, "sleep 0.2"), constraints=KIND, depends_on=[{"job_id": a["job_id"]}])
    c = site.submit(command=stamped(marks), constraints=KIND, depends_on=[{"job_id": b["job_id"]}])
    site.reason(b["job_id"], "dependency", job_id=a["job_id"], condition="done")
    site.reason(c["job_id"], "dependency", job_id=b["job_id"])
    for job in (a, b, c):
        site.done(job["job_id"])
    times = spans(marks)
    assert times[a["job_id"]][1] <= times[b["job_id"]][0]
    assert times[b["job_id"]][1] <= times[c["job_id"]][0]

    failing = site.marks_file("chain-failing")
    head = site.submit(command=stamped(failing, "sleep 0.5") + "; exit 1", constraints=KIND, max_retries=0)
    middle = site.submit(command=stamped(failing), constraints=KIND, depends_on=[{"job_id": head["job_id"]}])
    tail = site.submit(command=stamped(failing), constraints=KIND, depends_on=[{"job_id": middle["job_id"]}])
    assert site.cluster.wait_status(head["job_id"], "failed", "done")["status"] == "failed"
    for job in (middle, tail):
        ended = site.cluster.wait_status(job["job_id"], "cancelled", "done", "failed")
        assert ended["status"] == "cancelled" and ended["running_at"] is None, ended
    assert set(spans(failing)) == {head["job_id"]}


def test_an_array_with_parallel_2_never_runs_a_third(site):
    marks = site.marks_file("array")
    # Four free slots on gpu-1 and cpu-1: only `parallel` holds the array to two.
    response = requests.post(site.url + "/jobs", timeout=10, json={
        "command": stamped(marks, "echo $CORRAL_ARRAY_INDEX/$CORRAL_ARRAY_COUNT; sleep 0.4"),
        "constraints": KIND, "array": {"count": 6, "parallel": 2}})
    assert response.status_code == 201, response.text
    array = response.json()
    first, last = int(array["first_job_id"][4:]), int(array["last_job_id"][4:])
    job_ids = [f"job-{n}" for n in range(first, last + 1)]
    assert len(job_ids) == 6
    throttled = wait_for(lambda: next((site.job(j)["pending_reason"] for j in job_ids
                                       if (site.job(j)["pending_reason"] or {}).get("code") == "array_throttle"),
                                      None), timeout=10, message="a job of the array to wait for its turn")
    assert (throttled["array_id"], throttled["parallel"]) == (array["array_id"], 2)
    outputs = sorted(site.done(j)["stdout"] for j in job_ids)
    assert outputs == [f"{i}/6\n" for i in range(6)]
    summary = requests.get(f"{site.url}/arrays/{array['array_id']}", timeout=10).json()
    assert summary["jobs"] == {"pending": 0, "running": 0, "done": 6, "failed": 0, "cancelled": 0}
    times = spans(marks)
    assert set(times) == set(job_ids)
    assert peak(times.values()) == 2


def test_a_concurrency_key_with_limit_1_never_overlaps_across_two_nodes(site):
    marks = site.marks_file("concurrency")
    put = requests.put(site.url + "/concurrency/migrations", json={"limit": 1}, timeout=10)
    assert put.status_code == 200, put.text
    jobs = [site.submit(command=stamped(marks, "sleep 0.3"), concurrency_key="migrations",
                        constraints=on_kind(kind)) for kind in ("gpu", "cpu", "gpu", "cpu")]
    reason = wait_for(lambda: next((r for r in (site.job(j["job_id"])["pending_reason"] for j in jobs)
                                    if r and r["code"] == "concurrency_limit"), None),
                      timeout=10, message="a job to wait for the concurrency limit")
    assert (reason["key"], reason["limit"], reason["active"]) == ("migrations", 1, 1)
    ran_on = {site.done(j["job_id"])["node_id"] for j in jobs}
    assert ran_on == {"gpu-1", "cpu-1"}
    times = spans(marks)
    assert len(times) == 4 and peak(times.values()) == 1
    wait_for(lambda: requests.get(site.url + "/concurrency", timeout=10).json()
             == [{"key": "migrations", "limit": 1, "active": 0, "team": "default"}], timeout=10,
             message="the key to hold no active job")


def test_each_pending_reason_appears_when_it_should(site):
    # A job placed at once says so until the agent starts it; running, it has no reason.
    # The agent is stopped meanwhile (for less than HEARTBEAT_TIMEOUT_SECS), or it could
    # start the job before the answer to the submit is even written; it polls, so no claim
    # of its is left waiting on the scheduler.
    agent = site.cluster.procs["serial"]
    agent.signal(signal.SIGSTOP)
    try:
        placed = site.submit(command=held(site, "reasons"), constraints=SERIAL)
        expected = {"code": "placed", "message": "placed on serial, waiting for it to start the job",
                    "node_id": "serial"}
        # A submit places on the nodes no other placement holds at that moment (on PostgreSQL
        # the background pass may hold serial's lock); then that pass places the job.
        assert placed["status"] == "pending" and placed["node_id"] in ("serial", None)
        if placed["node_id"]:
            assert placed["pending_reason"] == expected
        assert site.reason(placed["job_id"], "placed", timeout=2, node_id="serial") == expected
        assert placed["job_id"] in site.listed("placed")
    finally:
        agent.signal(signal.SIGCONT)
    assert site.cluster.wait_status(placed["job_id"], "running")["pending_reason"] is None

    waiting = {
        "no_capacity": site.submit(command="true", constraints=SERIAL),
        "dependency": site.submit(command="true", constraints=KIND, depends_on=[{"job_id": placed["job_id"]}]),
        "scheduled": site.submit(command="true", constraints=KIND, delay_secs=3600),
        "constraints_unmet": site.submit(command="true", constraints=[{"label": "role", "op": "=",
                                                                       "value": "nowhere"}]),
    }
    array = site.submit(command=held(site, "reasons"), constraints=KIND, array={"count": 2, "parallel": 1})
    waiting["array_throttle"] = {"job_id": array["last_job_id"]}
    requests.put(site.url + "/concurrency/reasons", json={"limit": 1}, timeout=10).raise_for_status()
    holder = site.submit(command=held(site, "reasons"), constraints=KIND, concurrency_key="reasons")
    waiting["concurrency_limit"] = site.submit(command="true", constraints=KIND, concurrency_key="reasons")

    for code, job in waiting.items():
        reason = site.reason(job["job_id"], code)
        assert reason["message"], reason
        assert job["job_id"] in site.listed(code), code
    site.reason(waiting["constraints_unmet"]["job_id"], "constraints_unmet",
                constraint={"label": "role", "op": "=", "value": "nowhere"})
    site.reason(waiting["dependency"]["job_id"], "dependency", job_id=placed["job_id"])
    site.reason(waiting["no_capacity"]["job_id"], "no_capacity", lacking=["slot"], nodes=1)

    site.release("reasons")
    for job_id in (placed["job_id"], array["first_job_id"], array["last_job_id"], holder["job_id"],
                   waiting["no_capacity"]["job_id"], waiting["dependency"]["job_id"],
                   waiting["concurrency_limit"]["job_id"]):
        assert site.done(job_id)["pending_reason"] is None
    for code in ("scheduled", "constraints_unmet"):
        job_id = waiting[code]["job_id"]
        cancel = requests.post(f"{site.url}/jobs/{job_id}/cancel", json={}, timeout=10)
        assert cancel.status_code == 200, cancel.text
        assert site.cluster.wait_status(job_id, "cancelled")["pending_reason"] is None
