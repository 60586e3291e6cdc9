"""Fast dispatch against real gunicorn: concurrent claims, long-poll wake-ups across
workers, the waiting-room guard, a stopping worker, and agents with and without
long-poll. Every wait is a condition with a deadline; nothing here measures speed
(that is scripts/bench.py's job) beyond "answered long before its deadline"."""
import json
import random
import select
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from cluster import Cluster
from helpers import wait_for

pytestmark = pytest.mark.e2e

WAIT_SECS = 20


def register(cluster, node_ids, slots):
    for node_id in node_ids:
        response = requests.post(cluster.registry_url + "/nodes", timeout=10, json={
            "node_id": node_id, "address": "127.0.0.1", "kind": "compute", "slots": slots})
        assert response.status_code in (200, 201), response.text


def claim(cluster, node_id, max_jobs=1, wait_secs=0.0, session=None):
    """(jobs, the X-Corral-Long-Poll header, seconds it took)."""
    started = time.monotonic()
    response = (session or requests).post(f"{cluster.scheduler_url}/nodes/{node_id}/claim",
                                          json={"max": max_jobs, "wait_secs": wait_secs}, timeout=wait_secs + 15)
    assert response.status_code == 200, response.text
    return response.json(), response.headers.get("X-Corral-Long-Poll"), time.monotonic() - started


def claim_like_an_agent(cluster, node_id, wait_secs, session=None):
    """A claim asked again at once while the answer says "again" (work came after the
    claim had waited a while), as the agent does. (jobs, header, seconds in all)."""
    started = time.monotonic()
    while True:
        jobs, header, _ = claim(cluster, node_id, wait_secs=wait_secs, session=session)
        if header != "again":
            return jobs, header, time.monotonic() - started


def report_done(cluster, jobs):
    reports = [{"job_id": j["job_id"], "node_id": j["node_id"], "attempt": j["attempt"], "status": "done",
                "exit_code": 0} for j in jobs]
    for start in range(0, len(reports), 100):
        response = requests.post(cluster.scheduler_url + "/jobs/reports", json={"reports": reports[start:start + 100]},
                                 timeout=30)
        assert response.status_code == 200, response.text
        assert {r["code"] for r in response.json()["results"]} == {200}, response.text


def submit_batch(cluster, jobs):
    response = requests.post(cluster.scheduler_url + "/jobs/batch", json={"jobs": jobs}, timeout=30)
    assert response.status_code == 201, response.text
    return response.json()


def known_to_scheduler(cluster, node_ids):
    """Wait until the scheduler places on these nodes: one pinned job each, claimed and done."""
    probes = submit_batch(cluster, [{"command": "probe", "instance_id": n} for n in node_ids])
    wait_for(lambda: all(cluster.job(p["job_id"])["node_id"] for p in probes), timeout=20,
             message=f"the scheduler to know {node_ids}")
    claimed = []
    for node_id in node_ids:
        claimed += claim(cluster, node_id)[0]
    assert sorted(j["job_id"] for j in claimed) == sorted(p["job_id"] for p in probes)
    report_done(cluster, claimed)


def wait_in_the_room(cluster, node_id, answer: dict) -> threading.Thread:
    """A claim that waits (WAIT_SECS) in a one-place waiting room: sent again while the
    room is busy (a probe may hold the place for a moment). Its answer goes to answer["first"]."""
    def run():
        while True:
            got = claim_like_an_agent(cluster, node_id, WAIT_SECS)
            if got[1] != "busy":
                answer["first"] = got
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def room_is_full(cluster) -> bool:
    # A probe that waits a little: "busy" once another claim holds the only place.
    return claim(cluster, "probe", wait_secs=0.05)[1] == "busy"


@pytest.fixture
def slow_heartbeats_cluster(tmp_path):
    """Nodes are registered by the test (no agents): a long heartbeat timeout keeps them healthy."""
    def start(workers=2, **scheduler_env):
        c = Cluster(tmp_path, HEARTBEAT_TIMEOUT_SECS=120, **scheduler_env)
        clusters.append(c)
        c.start_registry()
        c.start_scheduler(workers=workers)
        return c

    clusters = []
    try:
        yield start
    finally:
        for c in clusters:
            c.stop()


def test_concurrent_claims_take_every_job_exactly_once(slow_heartbeats_cluster):
    cap, nodes, per_node_threads = 40, [f"n{i}" for i in range(1, 5)], 5
    cluster = slow_heartbeats_cluster(MAX_JOBS_PER_NODE=cap)
    register(cluster, nodes, slots=cap)
    known_to_scheduler(cluster, nodes)
    jobs = submit_batch(cluster, [{"command": f"echo {i}"} for i in range(250)])
    wanted = {j["job_id"] for j in jobs}

    def placed():
        pending = requests.get(cluster.scheduler_url + "/jobs", params={"status": "pending", "limit": 1000},
                               timeout=10).json()
        return sum(1 for j in pending if j["node_id"]) == cap * len(nodes)

    wait_for(placed, timeout=20, message="the first jobs to fill every node")

    claimed: dict[str, list[dict]] = {n: [] for n in nodes}
    lock = threading.Lock()

    def claimer(node_id, seed, wait_secs):
        rng = random.Random(seed)
        session = requests.Session()
        empty = 0
        while empty < 2:
            got, _, _ = claim(cluster, node_id, max_jobs=rng.randint(1, 9), wait_secs=wait_secs, session=session)
            assert len(got) <= cap and all(j["node_id"] == node_id and j["status"] == "running" for j in got)
            empty = 0 if got else empty + 1
            with lock:
                claimed[node_id].extend(got)

    def run_round(wait_secs):
        barrier_threads = [(n, k) for n in nodes for k in range(per_node_threads)]
        with ThreadPoolExecutor(len(barrier_threads)) as pool:
            for future in [pool.submit(claimer, n, hash((n, k, wait_secs)), wait_secs) for n, k in barrier_threads]:
                future.result()

    # Round 1: every node's slots fill; each node gets exactly its limit, nothing twice.
    run_round(0.0)
    for node_id in nodes:
        assert len(claimed[node_id]) == cap, (node_id, len(claimed[node_id]))
    ids = [j["job_id"] for js in claimed.values() for j in js]
    assert len(ids) == len(set(ids)) == cap * len(nodes)

    # Round 2: finishing them places the other 90, which the claimers (now long-polling) take.
    report_done(cluster, [j for js in claimed.values() for j in js])
    run_round(0.5)
    ids = [j["job_id"] for js in claimed.values() for j in js]
    assert len(ids) == len(set(ids)) == 250 and set(ids) == wanted
    # The database agrees: one pending -> running transition per job, for attempt 1.
    for job_id in random.Random(7).sample(sorted(wanted), 40):
        starts = [e for e in cluster.events(job_id) if (e["from"], e["to"]) == ("pending", "running")]
        assert len(starts) == 1 and starts[0]["attempt"] == 1, (job_id, starts)


def test_a_waiting_claim_is_woken_by_a_submit_in_any_worker(slow_heartbeats_cluster):
    cluster = slow_heartbeats_cluster(workers=2)
    nodes = [f"w{i}" for i in range(1, 7)]
    register(cluster, nodes, slots=1)
    known_to_scheduler(cluster, nodes)
    answers, sent = {}, threading.Event()
    sent_count = []

    def wait_for_work(node_id):
        session = requests.Session()
        sent_count.append(node_id)
        if len(sent_count) == len(nodes):
            sent.set()
        answers[node_id] = claim_like_an_agent(cluster, node_id, WAIT_SECS, session=session)

    threads = [threading.Thread(target=wait_for_work, args=(n,), daemon=True) for n in nodes]
    for thread in threads:
        thread.start()
    assert sent.wait(10)
    # Give the six requests a moment to reach the two workers and start waiting. (Were
    # a submit faster, its claim would take the job at once: the assertions still hold.)
    time.sleep(0.5)
    # Separate submits: each lands in one of the two workers; claims in the other
    # worker learn of it through the database (PRAGMA data_version), not a local poke.
    for node_id in nodes:
        response = requests.post(cluster.scheduler_url + "/jobs", json={"command": "x", "instance_id": node_id},
                                 timeout=10)
        assert response.status_code == 201
    for thread in threads:
        thread.join(WAIT_SECS + 20)
    for node_id in nodes:
        jobs, header, elapsed = answers[node_id]
        assert [j["node_id"] for j in jobs] == [node_id] and header is None
        assert elapsed < WAIT_SECS / 2, f"{node_id}'s claim was not woken: it took {elapsed:.1f}s"


def test_claims_beyond_the_waiter_limit_answer_at_once(slow_heartbeats_cluster):
    cluster = slow_heartbeats_cluster(workers=1, LONG_POLL_MAX_WAITERS=1)
    register(cluster, ["g1"], slots=1)
    known_to_scheduler(cluster, ["g1"])
    answer = {}
    waiting = wait_in_the_room(cluster, "g1", answer)
    # Once the first claim waits, the room (one place) is full: any other claim says so at once.
    wait_for(lambda: room_is_full(cluster), timeout=15, message="the first claim to fill the waiting room")
    for _ in range(3):
        jobs, header, elapsed = claim(cluster, "g3", wait_secs=WAIT_SECS)
        assert jobs == [] and header == "busy" and elapsed < WAIT_SECS / 2
    # Reads and submits still find a thread, and the waiting claim gets its job.
    assert requests.get(cluster.scheduler_url + "/jobs", timeout=10).status_code == 200
    cluster.submit(command="x", instance_id="g1")
    waiting.join(WAIT_SECS + 10)
    jobs, header, elapsed = answer["first"]
    assert [j["node_id"] for j in jobs] == ["g1"] and elapsed < WAIT_SECS


def test_a_stopping_worker_answers_its_waiting_claims_at_once(slow_heartbeats_cluster):
    cluster = slow_heartbeats_cluster(workers=1, LONG_POLL_MAX_WAITERS=1)
    answer = {}
    waiting = wait_in_the_room(cluster, "s1", answer)
    wait_for(lambda: room_is_full(cluster), timeout=15, message="the claim to wait")
    cluster.procs["scheduler"].signal(signal.SIGTERM)
    waiting.join(WAIT_SECS + 10)
    jobs, header, elapsed = answer["first"]
    assert jobs == [] and header == "stopping" and elapsed < WAIT_SECS
    assert cluster.procs["scheduler"].popen.wait(15) == 0


def test_a_claim_whose_client_went_away_claims_nothing(slow_heartbeats_cluster):
    cluster = slow_heartbeats_cluster(workers=1, LONG_POLL_MAX_WAITERS=1)
    register(cluster, ["d1"], slots=1)
    known_to_scheduler(cluster, ["d1"])
    body = json.dumps({"max": 1, "wait_secs": WAIT_SECS}).encode()
    request = (b"POST /nodes/d1/claim HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def readable(sock) -> bool:
        # poll, not select: a test process may hold descriptors numbered past select's 1024
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))

    def raw_claim_waiting():
        """A claim on a socket of our own, sent again while a probe held the room (busy)."""
        sock = socket.create_connection(("127.0.0.1", cluster.scheduler_port))
        sock.sendall(request)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            if readable(sock):  # answered at once: busy
                sock.close()
                return None
            if room_is_full(cluster):
                return sock
        sock.close()
        return None

    sock = wait_for(raw_claim_waiting, timeout=20, message="the claim to wait")
    sock.close()
    # The agent went away (its connection closed): the claim leaves the room without
    # claiming, so work placed afterwards goes to the next claim that is really there.
    wait_for(lambda: not room_is_full(cluster), timeout=15, message="the abandoned claim to leave")
    job = cluster.submit(command="x", instance_id="d1")
    jobs, _, _ = claim(cluster, "d1", wait_secs=5)
    assert [j["job_id"] for j in jobs] == [job["job_id"]]


def test_agents_long_poll_and_an_agent_with_long_poll_off_polls(cluster):
    cluster.start_agent("node-1")
    cluster.start_agent("node-2", AGENT_LONG_POLL_SECS=0)
    cluster.wait_nodes_healthy("node-1", "node-2")
    pinned = {n: cluster.submit(command="echo on $CORRAL_NODE_ID", instance_id=n) for n in ("node-1", "node-2")}
    for node_id, job in pinned.items():
        done = cluster.wait_status(job["job_id"], "done", "failed")
        assert done["status"] == "done" and done["stdout"] == f"on {node_id}\n"
    reasons = {n: [e["reason"] for e in cluster.events(j["job_id"]) if e["to"] == "running"]
               for n, j in pinned.items()}
    assert reasons == {"node-1": ["claimed by the node"], "node-2": ["started on the node"]}
    # A batch spreads over both; every job runs once.
    jobs = submit_batch(cluster, [{"command": f"echo {i}"} for i in range(20)])
    for job in jobs:
        done = cluster.wait_status(job["job_id"], "done", "failed", timeout=60)
        assert done["status"] == "done" and done["attempt"] == 1
    assert {cluster.job(j["job_id"])["node_id"] for j in jobs} == {"node-1", "node-2"}
