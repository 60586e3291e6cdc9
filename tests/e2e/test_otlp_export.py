"""End to end: the real scheduler (two gunicorn workers) and a real agent export their
spans over OTLP/HTTP to a receiver the test runs on loopback; a job submitted in a trace
shows up there as submit > place, and submit > attempt > report, the attempt being the
span the job's TRACEPARENT names."""
import gzip
import threading
import zlib
from collections.abc import Iterator

import pytest
import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)

from cluster import Cluster, started
from helpers import QuietHandler, serve_in_thread, wait_for

pytestmark = pytest.mark.e2e

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


class Receiver:
    """An OTLP/HTTP trace receiver (POST /v1/traces, protobuf): the spans it was sent,
    each as a dict of its service, name, ids (hex) and attributes."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver.add(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = serve_in_thread(Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, request: ExportTraceServiceRequest) -> None:
        got = []
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    got.append({"service": resource.get("service.name"), "name": span.name,
                                "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex() or None, "status": span.status.code,
                                "attributes": {a.key: getattr(a.value, a.value.WhichOneof("value"))
                                               for a in span.attributes}})
        with self.lock:
            self.spans += got

    def named(self, name: str, trace_id: str) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["name"] == name and s["trace_id"] == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    try:
        yield server
    finally:
        server.close()


def test_a_jobs_spans_reach_an_otlp_receiver_from_the_scheduler_and_the_agent(tmp_path, request, receiver):
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": 100}
    with started(Cluster(tmp_path, **otel), request) as cluster:
        cluster.start_agent("node-1", **otel)
        cluster.wait_nodes_healthy("node-1")
        answer = requests.post(cluster.scheduler_url + "/jobs", json={"command": 'echo "$TRACEPARENT"'},
                               headers={"traceparent": f"00-{TRACE}-{CALLER_SPAN}-01"}, timeout=10)
        assert answer.status_code == 201, answer.text
        job = answer.json()
        done = cluster.wait_status(job["job_id"], "done", "failed")
        assert done["status"] == "done", done
        _, _, submit_id, _ = job["traceparent"].split("-")
        _, attempt_trace, attempt_id, _ = done["stdout"].strip().split("-")
        assert attempt_trace == TRACE

        def all_four():
            found = {name: receiver.named(name, TRACE)
                     for name in ("corral.submit", "corral.place", "corral.attempt", "corral.report")}
            return found if all(found.values()) else None
        found = wait_for(all_four, timeout=20, message="the four spans at the receiver")
    (submit,), (place,), (attempt,), (report,) = found.values()
    assert (submit["service"], submit["span_id"], submit["parent"]) == ("corral-scheduler", submit_id, CALLER_SPAN)
    assert (place["service"], place["parent"]) == ("corral-scheduler", submit_id)
    assert place["attributes"] == {"corral.job_id": job["job_id"], "corral.node_id": "node-1", "corral.attempt": 1}
    assert (attempt["service"], attempt["span_id"], attempt["parent"]) == ("corral-agent", attempt_id, submit_id)
    assert attempt["attributes"]["process.exit.code"] == 0
    assert (report["service"], report["parent"]) == ("corral-agent", attempt_id)
