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
    store.nodes.sync_nodes(listed, clock())
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


# ---- complete logs: as an agent ships them, as a client reads them ----

def put_log_chunk(client, job_id, data, seq, offset, node="n1", attempt=1, stream="stdout", final=False, **headers):
    headers = {"X-Corral-Node": node, "X-Corral-Log-Offset": str(offset), **headers}
    if final:
        headers["X-Corral-Log-Final"] = "1"
    return client.put(f"/jobs/{job_id}/attempts/{attempt}/logs/{stream}/{seq}", data=data, headers=headers,
                      content_type="application/octet-stream")


def ship_log(client, job_id, data, size, node="n1", attempt=1, stream="stdout"):
    """Ship `data` whole in chunks of `size`, the last one final; the answers."""
    answers = []
    pieces = [data[at:at + size] for at in range(0, len(data), size)] or [b""]
    offset = 0
    for seq, piece in enumerate(pieces):
        answer = put_log_chunk(client, job_id, piece, seq, offset, node, attempt, stream, final=seq == len(pieces) - 1)
        assert answer.status_code == 200, answer.json
        answers.append(answer.json)
        offset += len(piece)
    return answers


def read_log(client, job_id, **query):
    answer = client.get(f"/jobs/{job_id}/logs", query_string=query)
    assert answer.status_code == 200, answer.json
    assert answer.mimetype == "application/octet-stream"
    return answer


def read_log_whole(client, job_id, **query):
    """The whole stream, read as a client would: a range at a time until its end."""
    data, offset = b"", 0
    while True:
        answer = read_log(client, job_id, offset=offset, **query)
        if not answer.data:
            return data, answer
        data += answer.data
        offset += len(answer.data)
