"""The scheduler's Flask app for API tests: a clock the test moves, the app on a
database of the test's choosing, nodes as the registry lists them, and submitting."""
from corral.scheduler.app import create_app
from corral.scheduler.service import Scheduler
from corral.scheduler.settings import SchedulerSettings


class Clock:
    def __init__(self, now=1_800_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


def make_app(database_url, clock, **overrides):
    overrides.setdefault("retry_base_secs", 0.0)  # retries are placed at once unless a test says otherwise
    settings = SchedulerSettings(database_url=database_url, **overrides)
    return create_app(settings, clock=clock)


def set_nodes(store, clock, *nodes, slots=4):
    """Nodes as the registry would list them: a name, or (name, status)."""
    listed = []
    for node in nodes:
        node_id, status = (node, "healthy") if isinstance(node, str) else node
        listed.append({"node_id": node_id, "address": "127.0.0.1", "kind": "compute",
                       "slots": slots, "status": status})
    store.sync_nodes(listed, clock())
    Scheduler(store).place(clock())  # what the background pass does after a refresh


def submit(client, **body):
    response = client.post("/jobs", json=body or {"command": "true"})
    assert response.status_code == 201, response.json
    return response.json


def end_attempt(client, job_id, status="done", exit_code=0):
    """Run the job's current attempt to `status` as its agent would report it."""
    job = client.get(f"/jobs/{job_id}").json
    body = {"node_id": job["node_id"], "attempt": job["attempt"]}
    assert client.post(f"/jobs/{job_id}/status", json=dict(body, status="running")).status_code == 200
    ended = client.post(f"/jobs/{job_id}/status", json=dict(body, status=status, exit_code=exit_code))
    assert ended.status_code == 200, ended.json
