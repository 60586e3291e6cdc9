"""The small fake control plane (registry and scheduler on one port, just what a
polling agent calls) that test_isolation still runs `corral-agent` processes against
(its `plane` fixture, through the agent tests' `start_agent`).
test_agent_integration's own tests run agents against the real services instead.
"""
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from fake_scheduler import move_reported


class ControlPlane:
    """Registry and scheduler on one port: just what a polling agent
    (AGENT_LONG_POLL_SECS=0, the original design's) calls; no claims, report batches
    or live output."""

    def __init__(self, node_id: str):
        self.lock = threading.Lock()
        self.node_id = node_id
        self.pending: list[dict] = []
        self.running: list[dict] = []
        self.reports: list[tuple[str, dict]] = []
        self.services: dict[str, dict] = {}
        self.upserts: list[dict] = []
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self):
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

            def do_GET(self):
                url = urlsplit(self.path)
                if url.path == "/healthz":
                    return self._answer(200, {"status": "ok"})
                if url.path == "/jobs":
                    status = parse_qs(url.query)["status"][0]
                    with plane.lock:
                        return self._answer(200, list(plane.pending if status == "pending"
                                                      else plane.running))
                self._answer(404, {"error": "not here"})

            def do_POST(self):
                body = self._body()
                path = urlsplit(self.path).path
                with plane.lock:
                    if path == "/nodes":
                        return self._answer(201, body)
                    if path.endswith("/heartbeat"):
                        return self._answer(200, {})
                    if path == "/services":
                        plane.upserts.append(body)
                        plane.services[body["job_id"]] = body
                        return self._answer(200, body)
                    match = re.fullmatch(r"/jobs/([^/]+)/status", path)
                    if match:
                        job_id = match.group(1)
                        plane.reports.append((job_id, body))
                        plane.running = move_reported(plane.pending, plane.running, job_id, body["status"])
                        return self._answer(200, body)
                self._answer(404, {"error": "not here"})

            def do_DELETE(self):
                job_id = self.path.rsplit("/", 1)[-1]
                with plane.lock:
                    found = plane.services.pop(job_id, None)
                self._answer(200 if found else 404, found or {"error": "no such service"})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, job_id, **fields):
        with self.lock:
            self.pending.append({"job_id": job_id, "node_id": self.node_id, "attempt": 1,
                                 "job_type": "run", "env_vars": {}, "status": "pending",
                                 "deploy_url": None, **fields})

    def statuses(self, job_id):
        with self.lock:
            return [b["status"] for j, b in self.reports if j == job_id]

    def final(self, job_id):
        with self.lock:
            return [b for j, b in self.reports if j == job_id and b["status"] != "running"][-1]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


