"""A real Prometheus (Debian's `prometheus` package) finds what Corral runs through
the registry's HTTP service-discovery documents, reading them with the read-only
token: a running service job becomes a scrape target, with Corral's labels
relabelled onto it, and is dropped once the job is cancelled; the node is a
target at SD_NODE_PORT. Everything is asked of Prometheus' own API
(`/api/v1/targets`)."""
import os
import shutil
import subprocess

import pytest
import requests

from cluster import Cluster, Proc, wait_scheduler_sees_healthy, world_traversable_dir
from corral.shared import credentials as cred
from helpers import free_port, wait_for

pytestmark = pytest.mark.e2e

PROMETHEUS = shutil.which("prometheus")
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None,
                                      reason="needs Prometheus (Debian's prometheus package; .ci/run installs it)")
PYTHON3 = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")

OPERATOR_TOKEN = "prometheus-test-operator-5e1f"
AGENT_SECRET = "prometheus-test-agent-secret-8c2d"
READER_TOKEN = "prometheus-test-reader-4b7a"
TOKENS = {"CORRAL_API_TOKEN": OPERATOR_TOKEN, "CORRAL_AGENT_TOKEN": AGENT_SECRET, "CORRAL_READ_TOKEN": READER_TOKEN}
NODE = "sd-node-1"
NODE_EXPORTER_PORT = 9311  # SD_NODE_PORT: nothing listens there, the target is listed all the same

# `type: Bearer` is spelled out: Prometheus 2.42 (Debian 12's) sends the bare token
# from http_sd_configs without it, which the registry refuses (401).
CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: corral-services
    http_sd_configs:
      - url: {registry}/sd/prometheus/services
        refresh_interval: 1s
        authorization:
          type: Bearer
          credentials: {token}
    relabel_configs:
      - source_labels: [__meta_corral_job_id]
        target_label: corral_job_id
      - source_labels: [__meta_corral_service]
        target_label: service
      - source_labels: [__meta_corral_label_zone]
        target_label: zone
  - job_name: corral-nodes
    http_sd_configs:
      - url: {registry}/sd/prometheus/nodes
        refresh_interval: 1s
        authorization:
          type: Bearer
          credentials: {token}
    relabel_configs:
      - source_labels: [__meta_corral_node_id]
        target_label: node
"""


def active_targets(url: str, job: str) -> list[dict]:
    answer = requests.get(url + "/api/v1/targets", params={"state": "active"}, timeout=5).json()
    return [t for t in answer["data"]["activeTargets"] if t["labels"]["job"] == job]


@needs_prometheus
def test_prometheus_scrapes_a_running_service_job_and_drops_it_when_cancelled(tmp_path):
    c = Cluster(tmp_path)
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {OPERATOR_TOKEN}"
    site = world_traversable_dir("corral-sd-site-")
    prometheus = None
    try:
        c.start_registry(SD_NODE_PORT=NODE_EXPORTER_PORT, **TOKENS)
        c.start_scheduler(**TOKENS)
        c.start_agent(NODE, CORRAL_NODE_TOKEN=cred.node_token(AGENT_SECRET, NODE), AGENT_HEALTH_INTERVAL_SECS=0.5,
                      AGENT_LABELS="zone=eu-1")
        wait_scheduler_sees_healthy(c.scheduler_url, [NODE], 30, OPERATOR_TOKEN)

        # Without a credential the documents are refused; the read-only token reads them.
        assert requests.get(c.registry_url + "/sd/prometheus/nodes", timeout=5).status_code == 401
        as_reader = {"Authorization": f"Bearer {READER_TOKEN}"}
        listed = requests.get(c.registry_url + "/sd/prometheus/nodes", headers=as_reader, timeout=5)
        assert listed.status_code == 200, listed.text

        config = tmp_path / "prometheus.yml"
        config.write_text(CONFIG.format(registry=c.registry_url, token=READER_TOKEN))
        promtool = shutil.which("promtool")  # in the same package
        if promtool:
            checked = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True,
                                     timeout=30)
            assert checked.returncode == 0, checked.stdout + checked.stderr
        port = free_port()
        argv = [PROMETHEUS, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}"]
        prometheus = Proc("prometheus", argv, dict(os.environ), str(tmp_path / "prometheus.log"))
        prom = f"http://127.0.0.1:{port}"
        wait_for(lambda: requests.get(prom + "/-/ready", timeout=2).ok, timeout=30, message="Prometheus to be ready")

        node = wait_for(lambda: active_targets(prom, "corral-nodes"), timeout=30, message="the node as a target")
        assert [(t["labels"]["node"], t["scrapeUrl"]) for t in node] == [
            (NODE, f"http://127.0.0.1:{NODE_EXPORTER_PORT}/metrics")]

        # A service job that serves a metrics page.
        with open(os.path.join(site, "metrics"), "w") as f:
            f.write("corral_sd_test_up 1\n")
        web_port = free_port()
        service = api.post(c.scheduler_url + "/jobs", timeout=10, json={
            "job_type": "service", "name": "sd-web", "port": web_port, "health_path": "/metrics",
            "command": f"exec {PYTHON3} -m http.server --bind 127.0.0.1 --directory {site} {web_port}"}).json()

        def scraped():
            found = [t for t in active_targets(prom, "corral-services")
                     if t["labels"].get("corral_job_id") == service["job_id"]]
            return found if found and found[0]["health"] == "up" else None
        target = wait_for(scraped, timeout=60, interval=0.5, message="Prometheus to scrape the service job")[0]
        assert target["scrapeUrl"] == f"http://127.0.0.1:{web_port}/metrics"
        assert (target["labels"]["service"], target["labels"]["zone"]) == ("sd-web", "eu-1")
        assert target["discoveredLabels"]["__meta_corral_node_id"] == NODE
        query = {"query": f'corral_sd_test_up{{corral_job_id="{service["job_id"]}"}}'}
        wait_for(lambda: requests.get(prom + "/api/v1/query", params=query, timeout=5).json()["data"]["result"],
                 timeout=30, message="the job's own metric in Prometheus, under its job id")

        api.post(f"{c.scheduler_url}/jobs/{service['job_id']}/cancel", json={}, timeout=10).raise_for_status()
        wait_for(lambda: not active_targets(prom, "corral-services"), timeout=30, interval=0.5,
                 message="the cancelled job to leave Prometheus' targets")
        assert [t["labels"]["node"] for t in active_targets(prom, "corral-nodes")] == [NODE]
    except BaseException:
        print(c.logs())
        if prometheus is not None:
            print(prometheus.output()[-4000:])
        raise
    finally:
        if prometheus is not None:
            prometheus.stop()
        c.stop()
        shutil.rmtree(site, ignore_errors=True)
