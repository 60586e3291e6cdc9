"""The in-test fake of the scheduler that test_agent_services and test_isolation
still use: pending/running lists, claims and reports
applied by its own rules. test_agent and test_agent_integration run against the real
scheduler instead (scheduler_double.py); these modules are to follow.
"""
import json
import re
import threading
from urllib.parse import parse_qs, urlsplit

import requests
import responses

from scheduler_double import NODE, SCHEDULER, batch_down


def move_reported(pending: list[dict], running: list[dict], job_id: str, status: str) -> list[dict]:
    """A fake scheduler's lists after a report: `running` moves the job from `pending`
    (changed in place) to running; any other status ends it. Returns the running list."""
    if status == "running":
        job = next(j for j in pending if j["job_id"] == job_id)
        pending.remove(job)
        return [*running, dict(job, status="running")]
    return [j for j in running if j["job_id"] != job_id]


class FakeScheduler:
    """Just enough of the scheduler API: pending/running lists, claims and status reports.

    `claim_refusal` / `batch_refusal`: an HTTP status the claim route / the report batch
    route answer instead (None: they work). A claim waits (at most FAKE_WAIT_SECS) for a
    job to be added, as a long poll does.
    """

    FAKE_WAIT_SECS = 0.5

    def __init__(self, api: responses.RequestsMock, node_id: str = NODE):
        self.node_id = node_id
        self.pending: list[dict] = []
        self.running: list[dict] = []
        self.reports: list[tuple[str, dict]] = []  # (job_id, body) of accepted reports
        self.attempts: list[tuple[str, dict]] = []  # every report that arrived
        self.refuse: dict[tuple[str, str], int] = {}  # (job_id, status) -> HTTP status
        self.down_for: dict[tuple[str, str], int] = {}  # (job_id, status) -> failures left
        self.on_report = None  # called with (job_id, body) before a report is applied
        self.claim_refusal: int | None = None
        self.batch_refusal: int | None = None
        self.claims: list[dict] = []     # every claim body that arrived
        self.riding_claims: list[dict] = []  # claims that came with reports (POST /jobs/reports)
        self.batches: list[list] = []    # every report batch that arrived
        self.changed = threading.Condition(threading.RLock())
        api.add_callback(responses.GET, re.compile(re.escape(SCHEDULER) + r"/jobs(\?.*)?$"),
                         callback=self._list)
        api.add_callback(responses.POST, re.compile(re.escape(SCHEDULER) + r"/jobs/reports$"),
                         callback=self._report_batch)
        api.add_callback(responses.POST, re.compile(re.escape(SCHEDULER) + r"/jobs/(job-[^/]+)/status$"),
                         callback=self._report)
        api.add_callback(responses.POST, re.compile(re.escape(SCHEDULER) + r"/nodes/([^/]+)/claim$"),
                         callback=self._claim)

    def add(self, job_id="job-1", command="echo hello", attempt=1, **fields) -> dict:
        job = {"job_id": job_id, "node_id": self.node_id, "command": command, "deploy_url": None,
               "job_type": "run", "env_vars": {}, "status": "pending", "attempt": attempt,
               "retry_count": 0, "timeout_secs": None, **fields}
        with self.changed:
            self.pending.append(job)
            self.changed.notify_all()
        return job

    def statuses(self, job_id: str) -> list[str]:
        return [body["status"] for jid, body in self.reports if jid == job_id]

    def final(self, job_id: str) -> dict:
        return [body for jid, body in self.reports if jid == job_id and body["status"] != "running"][-1]

    def _list(self, request):
        query = parse_qs(urlsplit(request.url).query)
        assert query["node_id"] == [self.node_id]
        with self.changed:
            jobs = list(self.pending if query["status"] == ["pending"] else self.running)
        return 200, {}, json.dumps(jobs)

    def _claim(self, request):
        body = json.loads(request.body)
        self.claims.append(body)
        if self.claim_refusal is not None:
            return self.claim_refusal, {}, json.dumps({"error": "refused"})
        assert request.url.endswith(f"/nodes/{self.node_id}/claim")
        with self.changed:
            self.changed.wait_for(lambda: self.pending, min(body.get("wait_secs", 20), self.FAKE_WAIT_SECS))
            claimed = self._take(body["max"])
        return 200, {}, json.dumps(claimed)

    def _take(self, count: int) -> list[dict]:
        """Claim up to `count` pending jobs (they become running); call holding `changed`."""
        taken = self.pending[:count]
        del self.pending[:len(taken)]
        claimed = [dict(job, status="running") for job in taken]
        self.running += claimed
        return claimed

    def _report(self, request):
        job_id = request.url.rsplit("/", 2)[-2]
        return self._apply(job_id, json.loads(request.body))

    def _apply(self, job_id, body):
        self.attempts.append((job_id, body))
        if self.on_report:
            self.on_report(job_id, body)
        key = (job_id, body["status"])
        if self.down_for.get(key, 0) > 0:
            self.down_for[key] -= 1
            return requests.ConnectionError("scheduler is down")
        if key in self.refuse:
            return self.refuse[key], {}, json.dumps({"error": "refused by the test"})
        with self.changed:
            self.reports.append((job_id, body))
            self.running = move_reported(self.pending, self.running, job_id, body["status"])
        return 200, {}, json.dumps({"job_id": job_id, "status": body["status"]})

    def _report_batch(self, request):
        if self.batch_refusal is not None:
            return self.batch_refusal, {}, json.dumps({"error": "refused"})
        body = json.loads(request.body)
        items = body["reports"]
        self.batches.append(items)
        claim = body.get("claim")
        if claim is not None:
            self.riding_claims.append(claim)
        if batch_down(self.down_for, items):
            return requests.ConnectionError("scheduler is down")
        results = []
        for index, item in enumerate(items):
            body = {k: v for k, v in item.items() if k != "job_id"}
            status, _, answer = self._apply(item["job_id"], body)
            result = {"index": index, "job_id": item["job_id"], "code": status}
            result.update({"job_status": body["status"]} if status == 200 else json.loads(answer))
            results.append(result)
        if claim is None:
            return 200, {}, json.dumps({"results": results})
        with self.changed:  # the claim riding on the reports: taken after them, never waits
            claimed = self._take(claim["max"])
        return 200, {}, json.dumps({"results": results, "claimed": claimed})
