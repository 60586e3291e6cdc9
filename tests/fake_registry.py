"""The registry as the agent meets it, mocked with `responses`: registration,
heartbeats and the service records (upserts and deletes), kept for the test to read."""
import json
import re

import responses

from scheduler_double import REGISTRY


class FakeRegistry:
    """POST /nodes, heartbeats, and the service records (upsert and delete)."""

    def __init__(self, api: responses.RequestsMock, node_id: str):
        self.records: dict[str, dict] = {}
        self.upserts: list[dict] = []
        self.deletes: list[str] = []
        api.add(responses.POST, REGISTRY + "/nodes", json={"node_id": node_id}, status=201)
        api.add(responses.POST, re.compile(re.escape(REGISTRY) + r"/nodes/[^/]+/heartbeat$"), json={})
        api.add_callback(responses.POST, REGISTRY + "/services", callback=self._upsert)
        api.add_callback(responses.DELETE, re.compile(re.escape(REGISTRY) + r"/services/[^/]+$"),
                         callback=self._delete)

    def _upsert(self, request):
        body = json.loads(request.body)
        self.upserts.append(body)
        self.records[body["job_id"]] = body
        return 200, {}, json.dumps(body)

    def _delete(self, request):
        job_id = request.url.split("?", 1)[0].rsplit("/", 1)[-1]  # ?attempt=N: the record's attempt
        self.deletes.append(job_id)
        if self.records.pop(job_id, None) is None:
            return 404, {}, json.dumps({"error": "no such service"})
        return 200, {}, "{}"

    def healthy(self, job_id):
        return (self.records.get(job_id) or {}).get("healthy")
