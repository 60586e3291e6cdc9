"""A drain holds from its answer on: submits race a drain on real servers (a
two-worker scheduler on SQLite; two scheduler replicas on PostgreSQL, submits going
to both), and no job sent after the drain's answer is placed on the drained node,
although the scheduler refreshes its node list from the registry meanwhile."""
import threading
import time

import pytest
import requests

from cluster import Cluster, all_jobs, started, wait_scheduler_sees_healthy

pytestmark = pytest.mark.e2e

SUBMITTERS = 4
RACE_SECS = 3.0  # submits run this long, the drain answered about halfway


def register(registry_url: str, node_id: str) -> None:
    body = {"node_id": node_id, "address": "127.0.0.1", "kind": "compute", "slots": 1000}
    assert requests.post(f"{registry_url}/nodes", json=body, timeout=10).status_code in (200, 201)


def test_no_job_sent_after_a_drains_answer_goes_to_the_drained_node(tmp_path, request, database_url):
    # Nodes without agents: placed jobs stay placed (pending on their node), which is
    # what the test reads; a long heartbeat timeout keeps them healthy without heartbeats.
    c = Cluster(tmp_path, database_url=database_url, MAX_JOBS_PER_NODE=1000, HEARTBEAT_TIMEOUT_SECS=120)
    with started(c, request):
        if database_url.startswith("postgresql"):
            c.start_scheduler(name="scheduler-b")
        for node_id in ("n1", "n2"):
            register(c.registry_url, node_id)
        for url in c.scheduler_urls:
            wait_scheduler_sees_healthy(url, ["n1", "n2"])

        sent: list[tuple[float, str, str | None]] = []   # (when sent, job id, node in the answer)
        stop = time.monotonic() + RACE_SECS
        lock = threading.Lock()

        def submit(i: int) -> None:
            session = requests.Session()
            n = 0
            while time.monotonic() < stop:
                url = c.scheduler_urls[(i + n) % len(c.scheduler_urls)]
                n += 1
                at = time.monotonic()
                answer = session.post(f"{url}/jobs", json={"command": "true"}, timeout=30)
                assert answer.status_code == 201, answer.text
                with lock:
                    sent.append((at, answer.json()["job_id"], answer.json()["node_id"]))

        threads = [threading.Thread(target=submit, args=(i,), daemon=True) for i in range(SUBMITTERS)]
        for t in threads:
            t.start()
        time.sleep(RACE_SECS / 2)   # let submits spread over both nodes first
        drained = requests.post(f"{c.scheduler_url}/nodes/n1/drain", json={}, timeout=30)
        answered = time.monotonic()
        assert drained.status_code == 200 and drained.json()["drained"] is True
        for t in threads:
            t.join(timeout=60)

        jobs = all_jobs(c.scheduler_url)
        assert "n1" in {node for at, _, node in sent if at < answered}, "no job went to n1 before the drain"
        after = [(node, jobs[job_id]["node_id"]) for at, job_id, node in sent if at > answered]
        assert after, "no job was sent after the drain's answer"
        on_n1 = [pair for pair in after if "n1" in pair]
        assert not on_n1, f"{len(on_n1)} of {len(after)} jobs sent after the drain went to n1"
        # The jobs placed on n1 before the drain and not yet claimed went back to the queue.
        assert not [job for job in jobs.values() if job["node_id"] == "n1"]
