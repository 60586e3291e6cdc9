"""GET /metrics on the registry and the scheduler (docs/operations.md, "Metrics").

The live tests run a real cluster (gunicorn, 2 workers per server, a real agent),
run jobs that end every way, and check that every scrape — whichever worker
answers it — shows exactly what happened. The per-worker files of the
multiprocess directory show that the counted requests really were spread over
both workers, and a killed worker's counts stay in the sums.
"""
import glob
import json
import os
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest
import requests
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from aws import CLIENT_KWARGS
from cluster import Cluster, one_node_cluster
from corral.registry import metrics as registry_metrics
from corral.scheduler import metrics as scheduler_metrics
from corral.server.metrics import DATABASE_GAUGES
from helpers import process_gone, wait_for
from paths import REPO

DASHBOARD = os.path.join(REPO, "infra", "grafana", "corral-dashboard.json")
NODE = "metrics-node-1"
PARKED_NODE = "metrics-absent-node"  # no such node: jobs pinned to it wait until cancelled


# ---- helpers ----------------------------------------------------------------------

def scrape(url: str) -> dict[tuple, float]:
    """GET /metrics on a fresh connection, as {(sample name, sorted labels): value}."""
    response = requests.get(url + "/metrics", timeout=10, headers={"Connection": "close"})
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/plain")
    return parse(response.text)


def parse(text: str) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def counts_per_worker(metrics_dir: str, name: str, **labels) -> dict[int, float]:
    """The value of one counter sample in each process's file of the multiprocess directory."""
    per_pid = {}
    for path in glob.glob(os.path.join(metrics_dir, "counter_*.db")):
        pid = int(re.search(r"_(\d+)\.db$", path).group(1))
        for family in MultiProcessCollector.merge([path], accumulate=False):
            for s in family.samples:
                if s.name == name and s.labels == labels:
                    per_pid[pid] = per_pid.get(pid, 0.0) + s.value
    return per_pid


def metrics_dir_of(cluster: Cluster, name: str) -> str:
    return os.path.join(cluster.state_dir, "metrics", f"corral-{name}-{cluster.procs[name].pid}")


def worker_pids(master: int) -> set[int]:
    pids = set()
    for task in os.listdir(f"/proc/{master}/task"):
        with open(f"/proc/{master}/task/{task}/children") as f:
            pids |= {int(p) for p in f.read().split()}
    return pids


# ---- the live cluster ------------------------------------------------------------------

@pytest.fixture
def metrics_cluster(tmp_path, request):
    def print_logs_if_failed(c):
        failed = getattr(request.node, "rep_call", None)
        if failed is None or failed.failed:
            print(c.logs())

    with one_node_cluster(tmp_path, NODE, slots=4, on_exit=print_logs_if_failed,
                          JOB_TIMEOUT_SECS=2, MAX_JOBS_PER_NODE=4) as c:
        yield c


def submit_parked(cluster: Cluster, count: int) -> list[str]:
    """`count` jobs that wait (pinned to a node that does not exist), each POSTed on
    its own connection and several at once, so that they spread over the workers."""
    def one(_):
        response = requests.post(cluster.scheduler_url + "/jobs", json={"command": "true", "instance_id": PARKED_NODE},
                                 headers={"Connection": "close"}, timeout=10)
        assert response.status_code == 201, response.text
        return response.json()["job_id"]
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(count)))


@pytest.mark.e2e
def test_metrics_count_what_happened_across_workers(metrics_cluster):
    c = metrics_cluster
    sched_dir = metrics_dir_of(c, "scheduler")
    assert os.path.isdir(sched_dir), "the scheduler makes a private metrics directory under its state dir"

    # Jobs that wait, submitted until both workers have counted some.
    parked: list[str] = []

    def spread():
        parked.extend(submit_parked(c, 8))
        counted = counts_per_worker(sched_dir, "corral_jobs_submitted_total", source="api")
        return len([n for n in counted.values() if n > 0]) >= 2
    wait_for(spread, timeout=30, interval=0.1, message="submissions to land on both scheduler workers")

    # Jobs that end every way.
    done = [c.submit(command="echo ok")["job_id"] for _ in range(3)]
    batch = requests.post(c.scheduler_url + "/jobs/batch", timeout=10,
                          json={"jobs": [{"command": "true"}, {"command": "echo two"}]})
    assert batch.status_code == 201, batch.text
    done += [j["job_id"] for j in batch.json()]
    retried = c.submit(command='[ "$CORRAL_ATTEMPT" -ge 2 ]', max_retries=1)["job_id"]
    failed = c.submit(command="exit 3", max_retries=0)["job_id"]
    timed_out = c.submit(command="sleep 60", max_retries=0)["job_id"]
    for job_id in done + [retried]:
        assert c.wait_status(job_id, "done", "failed", timeout=30)["status"] == "done", c.job(job_id)
    assert c.wait_status(failed, "done", "failed", timeout=30)["status"] == "failed"
    out = c.wait_status(timed_out, "done", "failed", timeout=30)
    assert out["status"] == "failed" and "timed out" in (out["stderr"] or ""), out
    assert c.job(retried)["retry_count"] == 1
    for job_id in parked:
        cancelled = requests.post(f"{c.scheduler_url}/jobs/{job_id}/cancel", json={}, timeout=10)
        assert cancelled.json()["status"] == "cancelled"

    finished = {"done": len(done) + 1, "failed": 2, "cancelled": len(parked)}
    expected = {
        ("corral_jobs_submitted_total", (("source", "api"),)): len(parked) + 3 + 3,
        ("corral_jobs_submitted_total", (("source", "batch"),)): 2,
        ("corral_jobs_submitted_total", (("source", "sqs"),)): 0,
        **{("corral_jobs_finished_total", (("status", s),)): n for s, n in finished.items()},
        **{("corral_jobs", (("status", s),)): n for s, n in finished.items()},
        ("corral_jobs", (("status", "pending"),)): 0,
        ("corral_jobs", (("status", "running"),)): 0,
        ("corral_job_retries_total", (("trigger", "failure"),)): 1,
        ("corral_job_retries_total", (("trigger", "operator"),)): 0,
        ("corral_job_timeouts_total", ()): 1,
        ("corral_job_node_loss_requeues_total", ()): 0,
        # Every job that ran was observed once at its first start (not the retried one's second).
        ("corral_job_dispatch_latency_seconds_count", ()): len(done) + 3,
        # The last attempt of every job that ran; the parked jobs never ran.
        ("corral_job_run_duration_seconds_count", (("status", "done"),)): len(done) + 1,
        ("corral_job_run_duration_seconds_count", (("status", "failed"),)): 2,
        ("corral_job_run_duration_seconds_count", (("status", "cancelled"),)): 0,
        ("corral_scheduler_nodes", (("kind", "compute"), ("status", "healthy"))): 1,
    }

    def matches():
        samples = scrape(c.scheduler_url)
        return {key: samples.get(key) for key in expected} == expected or None
    wait_for(matches, timeout=10, message="the scheduler's metrics to match what happened")
    # Whichever worker answers, the numbers are the same (each scrape is a new connection).
    for _ in range(6):
        samples = scrape(c.scheduler_url)
        assert {key: samples.get(key) for key in expected} == expected
    # The histograms are consistent: the +Inf bucket is the count, sums are positive.
    assert value(samples, "corral_job_dispatch_latency_seconds_bucket", le="+Inf") == len(done) + 3
    assert value(samples, "corral_job_dispatch_latency_seconds_sum") > 0
    assert value(samples, "corral_job_run_duration_seconds_sum", status="failed") >= 2  # the timeout ran 2 s
    assert 0 <= value(samples, "corral_scheduler_node_list_age_seconds") < 30
    # Only names the module declares (dashboards rely on them); SNS gauges need SNS_TOPIC_ARN.
    names = {name for name, _ in samples}
    assert names <= scheduler_metrics.exported_names()
    # (The database's health gauges are PostgreSQL's: tests/server/test_postgres_backend.py.)
    assert scheduler_metrics.exported_names() - names == {"corral_sns_pending", "corral_sns_oldest_pending_age_seconds",
                                                          *DATABASE_GAUGES}

    registry = scrape(c.registry_url)
    assert value(registry, "corral_registry_registrations_total", outcome="created") == 1
    assert value(registry, "corral_registry_heartbeats_total") > 0
    assert value(registry, "corral_registry_nodes", kind="compute", status="healthy") == 1
    assert value(registry, "corral_registry_nodes", kind="compute", status="unhealthy") == 0
    assert value(registry, "corral_registry_services", healthy="unknown") == 0
    assert {name for name, _ in registry} == registry_metrics.exported_names() - set(DATABASE_GAUGES)
    beats = value(registry, "corral_registry_heartbeats_total")
    wait_for(lambda: value(scrape(c.registry_url), "corral_registry_heartbeats_total") > beats, timeout=10,
             message="heartbeats to keep being counted")

    # A worker killed outright: the master replaces it and its counts stay in the sums.
    master = c.procs["scheduler"].pid
    per_worker = counts_per_worker(sched_dir, "corral_jobs_submitted_total", source="api")
    workers = worker_pids(master)
    victim = next(pid for pid in workers if per_worker.get(pid, 0) > 0)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: process_gone(victim) and len(worker_pids(master) - {victim}) == 2, timeout=30,
             message="gunicorn to replace the killed worker")
    wait_for(lambda: requests.get(c.scheduler_url + "/healthz", timeout=5).ok, timeout=30,
             message="the scheduler to answer again")
    for _ in range(4):
        samples = scrape(c.scheduler_url)
        assert {key: samples.get(key) for key in expected} == expected


@pytest.mark.e2e
def test_metrics_private_dir_is_removed_when_the_server_stops(tmp_path):
    c = Cluster(tmp_path)
    try:
        c.start_registry()
        path = metrics_dir_of(c, "registry")
        assert glob.glob(os.path.join(path, "counter_*.db")), "the workers write their counters there"
        # A worker killed while creating its file leaves it empty: scrapes still work.
        open(os.path.join(path, "counter_999999999.db"), "wb").close()
        assert ("corral_registry_heartbeats_total", ()) in scrape(c.registry_url)
        registry = c.procs["registry"]
        assert registry.stop() == 0, registry.output()[-4000:]  # -9: it did not stop within the grace
        assert not os.path.exists(path)
    finally:
        c.stop()


@pytest.mark.e2e
def test_metrics_count_sqs_intake_and_sns_outbox(aws_env, tmp_path):
    sqs = boto3.client("sqs", endpoint_url=aws_env, **CLIENT_KWARGS)
    queue = sqs.create_queue(QueueName="metrics-jobs")["QueueUrl"]
    topic = boto3.client("sns", endpoint_url=aws_env, **CLIENT_KWARGS).create_topic(Name="metrics-events")["TopicArn"]
    c = Cluster(tmp_path, SQS_URL=queue, SNS_TOPIC_ARN=topic, SQS_WAIT_TIME_SECS=1, SNS_POLL_INTERVAL_SECS=0.2)
    try:
        c.start()
        for n in range(3):
            sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"command": f"echo {n}",
                                                                      "instance_id": PARKED_NODE}))
        sqs.send_message(QueueUrl=queue, MessageBody="not a job request")

        def intake_counted():
            samples = scrape(c.scheduler_url)
            return (value(samples, "corral_sqs_messages_received_total") == 4
                    and value(samples, "corral_sqs_messages_rejected_total") == 1
                    and value(samples, "corral_jobs_submitted_total", source="sqs") == 3)
        wait_for(intake_counted, timeout=30, message="the intake's counts")
        jobs = requests.get(c.scheduler_url + "/jobs", timeout=10).json()
        assert len(jobs) == 3
        for job in jobs:
            requests.post(f"{c.scheduler_url}/jobs/{job['job_id']}/cancel", json={}, timeout=10).raise_for_status()

        def published():
            samples = scrape(c.scheduler_url)
            return (value(samples, "corral_sns_published_total") == 3 and ("corral_sns_pending", ()) in samples
                    and value(samples, "corral_sns_pending") == 0 and samples)
        samples = wait_for(published, timeout=30, message="the notifications to be published and counted")
        assert value(samples, "corral_sns_oldest_pending_age_seconds") == 0
        assert value(samples, "corral_sns_publish_failures_total") == 0
        assert value(samples, "corral_jobs_finished_total", status="cancelled") == 3
        assert value(samples, "corral_jobs_submitted_total", source="api") == 0
        # No node has been seen (no agent), so the node list has no age yet; no attempt
        # ended (the jobs were cancelled while pending), so no team has used anything.
        assert scheduler_metrics.exported_names() - {name for name, _ in samples} == {
            "corral_scheduler_node_list_age_seconds", *DATABASE_GAUGES, *scheduler_metrics.USAGE_SAMPLES}
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.stop()


# ---- in one process: only committed changes count ------------------------------------------

def local(name: str, **labels) -> float:
    from prometheus_client import REGISTRY
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_metrics_count_only_what_was_committed(tmp_path):
    from corral.scheduler.app import create_app
    from corral.scheduler.settings import SchedulerSettings
    app = create_app(SchedulerSettings(database_url=f"sqlite:///{tmp_path}/s.db"), clock=lambda: 1_800_000_000.0)
    client = app.test_client()
    store = app.extensions["corral.store"]
    batch, cancelled = (local("corral_jobs_submitted_total", source="batch"),
                        local("corral_jobs_finished_total", status="cancelled"))

    class Abort(Exception):
        pass
    with pytest.raises(Abort), store.db.connection_context(), store.db.atomic():
        store.submits.submit_batch([{"command": "true"}, {"command": "true"}], 1_800_000_000.0)
        raise Abort  # the batch is rolled back: nothing was created
    assert local("corral_jobs_submitted_total", source="batch") == batch

    job = client.post("/jobs/batch", json={"jobs": [{"command": "true"}]}).get_json()[0]
    assert local("corral_jobs_submitted_total", source="batch") == batch + 1
    with pytest.raises(Abort), store.db.connection_context(), store.db.atomic():
        store.actions.cancel(job["job_id"], 1_800_000_001.0)
        raise Abort
    assert local("corral_jobs_finished_total", status="cancelled") == cancelled
    assert client.post(f"/jobs/{job['job_id']}/cancel", json={}).status_code == 200
    assert local("corral_jobs_finished_total", status="cancelled") == cancelled + 1

    # Outside gunicorn, /metrics serves this process's counters and the database gauges.
    samples = parse(client.get("/metrics").get_data(as_text=True))
    assert value(samples, "corral_jobs_finished_total", status="cancelled") == cancelled + 1
    assert value(samples, "corral_jobs", status="cancelled") == 1
    assert value(samples, "corral_jobs", status="pending") == 0


# ---- the multiprocess directory, in a fresh interpreter ----------------------------------
# (prometheus_client picks its mode once, at import: this test process has already.)

def run_python(code: str, env: dict) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_MULTIPROC_DIR", "CORRAL_STATE_DIR")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=60)


def test_metrics_configured_dir_is_emptied_of_old_values(tmp_path):
    configured = tmp_path / "prom"
    configured.mkdir()
    (configured / "counter_12345.db").write_bytes(b"old")
    (configured / "README").write_text("not ours")
    code = ("import os; from corral.server import metrics; print(metrics.prepare_multiprocess_dir('corral-x')); "
            "print(os.environ['PROMETHEUS_MULTIPROC_DIR']); import prometheus_client.values as v; "
            "print(v.ValueClass._multiprocess)")
    done = run_python(code, {"PROMETHEUS_MULTIPROC_DIR": str(configured)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(configured), str(configured), "True"]
    assert sorted(os.listdir(configured)) == ["README"]


def test_metrics_private_dir_replaces_those_of_dead_servers(tmp_path):
    stale = tmp_path / "metrics" / "corral-x-999999999"
    other = tmp_path / "metrics" / "corral-y-999999999"  # another server's: not ours to judge
    stale.mkdir(parents=True)
    other.mkdir()
    code = "import os; from corral.server import metrics; print(metrics.prepare_multiprocess_dir('corral-x'))"
    done = run_python(code, {"CORRAL_STATE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    made = done.stdout.strip()
    assert os.path.dirname(made) == str(tmp_path / "metrics") and re.fullmatch(r"corral-x-\d+", os.path.basename(made))
    assert not stale.exists() and other.exists()


def test_metrics_refuse_a_prometheus_client_imported_too_early(tmp_path):
    code = "import prometheus_client; from corral.server import metrics; metrics.prepare_multiprocess_dir('corral-x')"
    done = run_python(code, {"CORRAL_STATE_DIR": str(tmp_path)})
    assert done.returncode != 0 and "imported before the metrics directory was set" in done.stderr


def test_metrics_unusable_dir_is_a_one_line_setting_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = ("from corral.server import metrics\n"
            "from corral.shared.errors import SettingError\n"
            "try:\n    metrics.prepare_multiprocess_dir('corral-x')\n"
            "except SettingError as exc:\n    print(exc.message)\n")
    done = run_python(code, {"PROMETHEUS_MULTIPROC_DIR": str(blocker / "sub")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("cannot prepare the metrics directory") and done.stdout.count("\n") == 1


# ---- the Grafana dashboard ---------------------------------------------------------------

def test_metrics_dashboard_uses_only_exported_metrics():
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert len(exprs) >= 8
    exported = scheduler_metrics.exported_names() | registry_metrics.exported_names()
    used = {name for expr in exprs for name in re.findall(r"\bcorral_[a-z0-9_]+", expr)}
    assert used, "the queries use Corral's metrics"
    assert used <= exported, f"the dashboard queries metrics no service exports: {sorted(used - exported)}"
    # Every scheduler family is on the dashboard somewhere (a new metric gets a panel).
    families = {f.name for f in scheduler_metrics.FAMILIES}
    shown = {name for name in families if any(name in expr for expr in exprs)}
    assert shown == families, f"not on the dashboard: {sorted(families - shown)}"


def test_metrics_readme_documents_every_metric():
    with open(os.path.join(REPO, "docs", "operations.md")) as f:
        readme = f.read()
    declared = ({f.name for f in scheduler_metrics.FAMILIES + registry_metrics.FAMILIES}
                | set(scheduler_metrics.SCRAPE_GAUGES) | set(registry_metrics.SCRAPE_GAUGES))
    counters = {f.name for f in scheduler_metrics.FAMILIES + registry_metrics.FAMILIES if f.kind == "counter"}
    missing = {name for name in declared if (name + "_total" if name in counters else name) not in readme}
    assert not missing, f"the Metrics section of docs/operations.md does not list {sorted(missing)}"
