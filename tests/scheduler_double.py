"""The real scheduler as the agent's test double: its Flask app on a SQLite file of
the test's own, reached by the agent's real HTTP clients through `responses`.

Every decision (what is pending for the node, claims, report checks, stale attempts,
requeues, batch results, the claim riding on reports) is the scheduler's own. What
sits between the agent and the app is the test's: faults it injects and what it
records.

- `refuse[(job_id, status)] = http_status`: that report (alone or in a batch) is
  answered with that status and never reaches the scheduler.
- `down_for[(job_id, status)] = n`: the next n requests carrying that report fail
  with a connection error (a batch fails as a whole).
- `claim_refusal` / `batch_refusal`: an HTTP status the claim / report batch route
  answers instead of the scheduler (None: the scheduler answers).
- `on_report(job_id, body)`: called as each report arrives, before any fault.
- `altered[job_id] = {field: value}`: the job as handed to the agent (listed, claimed)
  carries these values instead, for what no scheduler would send (a JSON `true` where
  a number belongs).
- recorded: `claims` (every claim body), `riding_claims` (claims that came with
  reports), `batches` (the reports of every batch that got past `batch_refusal`),
  `attempts` (every report that arrived), `answers` ((job_id, status, HTTP status)
  of each report answered, by the scheduler or a fault) and `reports` (those the
  scheduler accepted).

A claim waits at most CLAIM_WAIT_SECS (the agent's 20 s long poll shortened) so
that a test's stop is not held by a waiting request. The scheduler's settings
default to a failed or given-up attempt being final (MAX_JOB_RETRIES=0,
MAX_NODE_LOSSES=0), as a test expects unless it asks for more, and to a job's
kill grace being the test agents' own 0.3 s (JOB_KILL_GRACE_SECS). Its node list has
the test's node, healthy, with more slots than a test's agent has: the agent's own
count of free slots is what the tests exercise.

With `credentials` in its settings (tokens on), the test's own calls are an
operator's (those it makes as the node, the node's), and the agent must present
`node_token`; a service job then comes with the grant of `grant(job_id, attempt)`.
"""
import contextlib
import json
import re
import time
from urllib.parse import urlsplit

import requests
import responses

from corral.scheduler.app import create_app
from corral.scheduler.models import Job
from corral.scheduler.service import Scheduler
from corral.scheduler.settings import SchedulerSettings
from corral.scheduler.validation import parse_job_id
from corral.shared.credentials import node_token

REGISTRY = "http://registry.test"
SCHEDULER = "http://scheduler.test"
NODE = "node-1"
CLAIM_WAIT_SECS = 0.5
DEFAULTS = {"max_jobs_per_node": 64, "max_job_retries": 0, "max_node_losses": 0, "retry_base_secs": 0.0,
            "long_poll_max_waiters": 16, "job_kill_grace_secs": 0.3}
FORWARDED = ("content-type", "authorization", "idempotency-key", "accept", "x-corral-node", "x-corral-log-offset",
             "x-corral-log-final")


def batch_down(down_for: dict[tuple[str, str], int], items: list[dict]) -> bool:
    """Whether a report batch meets a connection error: one of its reports is in
    `down_for`, whose counts the batch uses up by one."""
    down = [key for key in ((item["job_id"], item["status"]) for item in items) if down_for.get(key, 0) > 0]
    for key in down:
        down_for[key] -= 1
    return bool(down)


@contextlib.contextmanager
def serving(api: responses.RequestsMock, db_path: str, node_id: str, url: str, **settings):
    """A SchedulerDouble, closed afterwards."""
    double = SchedulerDouble(api, db_path, node_id, url, **settings)
    try:
        yield double
    finally:
        double.close()


class SchedulerDouble:
    def __init__(self, api: responses.RequestsMock, db_path: str, node_id: str, url: str,
                 slots: int = 64, **settings):
        self.node_id = node_id
        self.settings = SchedulerSettings(database_url=f"sqlite:///{db_path}", **{**DEFAULTS, **settings})
        self.app = create_app(self.settings)
        self.store = self.app.extensions["corral.store"]
        credentials = self.settings.credentials
        self.tokens = {"operator": credentials.operator,
                       "node": node_token(credentials.agent_secret, node_id) if credentials.enabled else None}
        self.reports: list[tuple[str, dict]] = []
        self.attempts: list[tuple[str, dict]] = []
        self.answers: list[tuple[str, str, int]] = []
        self.refuse: dict[tuple[str, str], int] = {}
        self.down_for: dict[tuple[str, str], int] = {}
        self.on_report = None
        self.claim_refusal: int | None = None
        self.batch_refusal: int | None = None
        self.altered: dict[str, dict] = {}
        self.claims: list[dict] = []
        self.riding_claims: list[dict] = []
        self.batches: list[list] = []
        with self.store.db.connection_context():
            self.store.nodes.sync_nodes([{"node_id": node_id, "address": "127.0.0.1", "kind": "compute",
                                          "slots": slots, "status": "healthy"}], time.time())
        base = re.escape(url)
        api.add_callback(responses.GET, re.compile(base + r"/jobs(\?.*)?$"), callback=self._forward)
        api.add_callback(responses.POST, re.compile(base + r"/jobs/output$"), callback=self._forward)
        api.add_callback(responses.POST, re.compile(base + r"/jobs/reports$"), callback=self._report_batch)
        api.add_callback(responses.POST, re.compile(base + r"/jobs/job-[^/]+/status$"), callback=self._report)
        api.add_callback(responses.POST, re.compile(base + r"/nodes/[^/]+/claim$"), callback=self._claim)
        api.add_callback(responses.PUT, re.compile(base + r"/jobs/job-[^/]+/attempts/[^/]+/logs/[^/]+/[^/]+$"),
                         callback=self._forward)  # complete logs
        api.add_callback(responses.POST, re.compile(base + r"/jobs/logs$"), callback=self._forward)

    def close(self) -> None:
        room = self.app.extensions["corral.wait_room"]
        room.close()  # a claim still waiting answers now
        room.feed.stop()
        self.store.db.close()

    # ---- the test's side: the real API, as an operator ---------------------------------

    def call(self, method: str, path: str, body: dict | None = None, expect: int | None = 200,
             caller: str = "operator") -> dict:
        """`caller`: "operator", or "node" (the test's node, as its agent would call)."""
        if body is None and method == "POST":
            body = {}  # a POST is JSON even without a body
        token = self.tokens[caller]
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = self.app.test_client().open(path, method=method, json=body, headers=headers)
        if expect is not None:
            assert response.status_code == expect, (method, path, response.status_code, response.get_data())
        return response.json

    def add(self, job_id: str | None = None, command: str | None = "echo hello", attempt: int = 1,
            **fields) -> dict:
        """Submit a job pinned to the test's node (POST /jobs): placed there, pending.
        `job_id`: the id the test expects the scheduler to give it. `attempt` > 1: the
        earlier attempts fail first (reported straight to the scheduler, as the node),
        each retry placed here again."""
        fields.setdefault("max_retries", 0)
        fields["max_retries"] += attempt - 1
        job = self.call("POST", "/jobs", {"command": command, "instance_id": self.node_id, **fields}, 201)
        assert job_id is None or job["job_id"] == job_id, (job_id, job["job_id"])
        for _ in range(attempt - 1):
            job = self.fail_attempt(job["job_id"])
        # Placed here (a waiting claim of the agent's may have taken it already).
        assert (job["node_id"], job["attempt"]) == (self.node_id, attempt), job
        assert job["status"] in ("pending", "running"), job
        return job

    def fail_attempt(self, job_id: str) -> dict:
        """The job's current attempt runs and fails, reported by its node (not through
        the agent); the scheduler retries it."""
        job = self.job(job_id)
        body = {"node_id": job["node_id"], "attempt": job["attempt"]}
        self.call("POST", f"/jobs/{job_id}/status", {**body, "status": "running"}, caller="node")
        return self.call("POST", f"/jobs/{job_id}/status", {**body, "status": "failed", "exit_code": 1},
                         caller="node")

    def claim_unseen(self, max_jobs: int = 1) -> list[dict]:
        """A claim of the test's node whose answer the agent never sees (lost on the way)."""
        return self.call("POST", f"/nodes/{self.node_id}/claim", {"max": max_jobs, "wait_secs": 0}, caller="node")

    def cancel(self, job_id: str) -> dict:
        return self.call("POST", f"/jobs/{job_id}/cancel")

    def purge(self, job_id: str) -> None:
        """The job ends (cancelled) and the retention purge deletes it, as the background
        pass does once it is old enough. SQLite's newest row is never purged (its id
        would be handed out again): a later job, placed nowhere, is submitted first."""
        self.cancel(job_id)
        self.call("POST", "/jobs", {"command": "true", "instance_id": "nowhere"}, 201)
        with self.store.db.connection_context():
            assert self.store.purge.finished(time.time() + 1, 1000) == 1
        self.call("GET", f"/jobs/{job_id}", expect=404)

    def lose_node(self) -> list[str]:
        """The scheduler gives the node up for lost (no lease renewal it can see), as its
        background pass does once the lease period and grace have passed: running jobs
        are requeued (or failed), then placed again."""
        later = time.time() + self.settings.heartbeat_timeout_secs + self.settings.node_lost_grace_secs + 1
        with self.store.db.connection_context():
            lost = self.store.leases.requeue_lost(later, watching_since=0.0)
            Scheduler(self.store).place(time.time())
        return lost

    def set_row(self, job_id: str, **columns) -> None:
        """Write the job's row straight in the scheduler's database: values its API
        refuses (an older scheduler's rows, or a database written by hand)."""
        with self.store.db.connection_context():
            assert Job.update(**columns).where(Job.id == parse_job_id(job_id)).execute() == 1

    @property
    def node_token(self) -> str | None:
        """The credential the test's agent presents (tokens on)."""
        return self.tokens["node"]

    def grant(self, job_id: str, attempt: int) -> str | None:
        """The grant the scheduler hands out with the attempt of a service job here."""
        return self.settings.credentials.service_grant(job_id, attempt, self.node_id)

    def job(self, job_id: str) -> dict:
        return self.call("GET", f"/jobs/{job_id}")

    def statuses(self, job_id: str) -> list[str]:
        """The statuses of the reports on `job_id` that the scheduler accepted."""
        return [body["status"] for jid, body in self.reports if jid == job_id]

    def final(self, job_id: str) -> dict:
        """The last accepted report on `job_id` that ended an attempt, as the agent sent it."""
        return [body for jid, body in self.reports if jid == job_id and body["status"] != "running"][-1]

    # ---- between the agent and the app ---------------------------------------------------

    def _send(self, request, body: bytes | str | None = None):
        """`request` (body replaced by `body`, when given) answered by the app:
        (status, headers, body) as `responses` takes them."""
        url = urlsplit(request.url)
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED}
        data = request.body if body is None else body
        answer = self.app.test_client().open(url.path, method=request.method, query_string=url.query,
                                             headers=headers, data=data)
        kept = {k: v for k, v in answer.headers.items() if k.lower() != "content-length"}
        return answer.status_code, kept, answer.get_data()

    def _forward(self, request):
        return self._alter(self._send(request))

    def _alter(self, answer):
        """The jobs of a list or claim answer with the test's `altered` values."""
        status, headers, data = answer
        if status != 200 or not self.altered:
            return answer
        body = json.loads(data)
        for job in body if isinstance(body, list) else body.get("claimed") or []:
            job.update(self.altered.get(job["job_id"], {}))
        return status, headers, json.dumps(body)

    def _claim(self, request):
        body = json.loads(request.body)
        self.claims.append(body)
        if self.claim_refusal is not None:
            return self.claim_refusal, {}, json.dumps({"error": "refused by the test"})
        shortened = dict(body, wait_secs=min(body.get("wait_secs", 20), CLAIM_WAIT_SECS))
        return self._alter(self._send(request, json.dumps(shortened)))

    def _arrived(self, job_id: str, body: dict):
        """A report arrived: None to pass it on, else the test's answer (a fault)."""
        self.attempts.append((job_id, body))
        if self.on_report:
            self.on_report(job_id, body)
        key = (job_id, body["status"])
        if self.down_for.get(key, 0) > 0:
            self.down_for[key] -= 1
            return requests.ConnectionError("scheduler is down")
        if key in self.refuse:
            return self.refuse[key], {}, json.dumps({"error": "refused by the test"})
        return None

    def _report(self, request):
        job_id = urlsplit(request.url).path.split("/")[-2]
        body = json.loads(request.body)
        answer = self._arrived(job_id, body) or self._send(request)
        if isinstance(answer, Exception):  # unreachable: no answer
            return answer
        self.answers.append((job_id, body["status"], answer[0]))
        if answer[0] == 200:
            self.reports.append((job_id, body))
        return answer

    def _report_batch(self, request):
        if self.batch_refusal is not None:
            return self.batch_refusal, {}, json.dumps({"error": "refused by the test"})
        body = json.loads(request.body)
        items = body["reports"]
        self.batches.append(items)
        claim = body.get("claim")
        if claim is not None:
            self.riding_claims.append(claim)
        if batch_down(self.down_for, items):
            return requests.ConnectionError("scheduler is down")
        results: list[dict | None] = [None] * len(items)
        passed = []  # (index in the agent's batch, item) of the reports the scheduler gets
        for index, item in enumerate(items):
            fault = self._arrived(item["job_id"], {k: v for k, v in item.items() if k != "job_id"})
            if fault is None:
                passed.append((index, item))
            else:
                results[index] = {"index": index, "job_id": item["job_id"], "code": fault[0],
                                  **json.loads(fault[2])}
        answer: dict = {}
        if passed:
            status, headers, data = self._send(request, json.dumps(
                {**body, "reports": [item for _, item in passed]}))
            if status != 200:
                return status, headers, data
            answer = json.loads(data)
            for result in answer["results"]:
                index, item = passed[result["index"]]
                results[index] = dict(result, index=index)
                if result["code"] == 200:
                    self.reports.append((item["job_id"], {k: v for k, v in item.items() if k != "job_id"}))
        elif claim is not None:  # every report was the test's to refuse: the claim alone
            claimed = self.call("POST", f"/nodes/{claim['node_id']}/claim",
                                {k: v for k, v in claim.items() if k != "node_id"} | {"wait_secs": 0},
                                caller="node")
            answer["claimed"] = claimed
        answer["results"] = results
        self.answers += [(item["job_id"], item["status"], result["code"])
                         for item, result in zip(items, answer["results"])]
        return self._alter((200, {"Content-Type": "application/json"}, json.dumps(answer)))
