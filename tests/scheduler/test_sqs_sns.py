"""SQS intake and SNS notifications, against moto in server mode: a real HTTP
endpoint and the real boto3 client (nothing of boto3 is stubbed).

- Pure parts: message -> job request, error classification, DLQ attributes,
  outbox row -> SNS entry, region parsing, settings.
- One-pass functions (`Intake.tick`, `Publisher.tick`) with a fixed clock, a
  real SQLite store and moto.
- End to end: real scheduler and agent processes (tests/cluster.py).

"Down" is real: a port where nothing listens yet (connection refused), which
later forwards to the module's moto server and can be cut again, live
connections and all.
"""
import json
import logging
import random
import socket
import sqlite3
import threading
import types
import uuid

import boto3
import pytest
import requests

from aws import CLIENT_KWARGS, REGION, set_aws_env
from cluster import Cluster, wait_scheduler_sees_healthy
from corral.scheduler import admission, aws_clients, sns_outbox, sqs_intake
from corral.scheduler.notifications import notification
from corral.scheduler.service import Scheduler
from corral.scheduler.app import create_app, create_schema, open_store
from corral.scheduler.models import Job, OutboxEvent
from corral.scheduler.settings import SchedulerSettings
from corral.scheduler.validation import status_report
from corral.shared.errors import BadRequest, Conflict, SettingError, TooManyRequests
from helpers import wait_for

T0 = 1_800_000_000.0
e2e = pytest.mark.e2e


# ---- fixtures ---------------------------------------------------------------------

class Aws:
    """The test's own SQS and SNS clients on the module's moto server."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.sqs = boto3.client("sqs", endpoint_url=endpoint, **CLIENT_KWARGS)
        self.sns = boto3.client("sns", endpoint_url=endpoint, **CLIENT_KWARGS)

    def queue(self, prefix: str) -> str:
        return self.sqs.create_queue(QueueName=f"{prefix}-{uuid.uuid4().hex[:8]}")["QueueUrl"]

    def topic_to_queue(self) -> tuple[str, str]:
        """A topic with a queue subscribed to it (envelopes, not raw delivery)."""
        queue = self.queue("events")
        arn = self.sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        topic = self.sns.create_topic(Name=f"jobs-{uuid.uuid4().hex[:8]}")["TopicArn"]
        self.sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)
        return topic, queue

    def send(self, queue: str, body, key: str | None = None, key_attribute: str = "idempotency_key") -> str:
        attributes = {key_attribute: {"DataType": "String", "StringValue": key}} if key else {}
        text = body if isinstance(body, str) else json.dumps(body)
        return self.sqs.send_message(QueueUrl=queue, MessageBody=text, MessageAttributes=attributes)["MessageId"]

    def depth(self, queue: str) -> int:
        """Messages in the queue, visible or in flight."""
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])

    def take_all(self, queue: str, wait: float = 0) -> list[dict]:
        """Receive and delete every message now in `queue`."""
        taken = []
        while True:
            messages = self.sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=int(wait),
                                                MessageAttributeNames=["All"]).get("Messages", [])
            if not messages:
                return taken
            for message in messages:
                self.sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
            taken += messages
            wait = 0


@pytest.fixture
def aws(moto_endpoint, monkeypatch, tmp_path):
    set_aws_env(monkeypatch, tmp_path, moto_endpoint)  # inherited by the cluster's processes
    return Aws(moto_endpoint)


class LateServer:
    """A fixed port that refuses connections until `start()`, then forwards
    them to the module's moto server; `stop()` closes the port and cuts every
    connection through it, so a client's kept-alive connection cannot carry
    a request past the outage (moto's own server, like any werkzeug server,
    goes on serving the connections it has when it is shut down).

    The port is below the ephemeral range, so no client connection can be
    given it as its own source port while nothing listens there.
    """

    def __init__(self, target: str):
        host, _, port = target.removeprefix("http://").partition(":")
        self.target = (host, int(port))
        for _ in range(100):
            port = random.randint(20000, 32000)
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
            self.port = port
            break
        self.listener: socket.socket | None = None
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), name="late-server", daemon=True).start()

    def stop(self) -> None:
        listener, self.listener = self.listener, None
        if listener is None:
            return
        listener.close()
        with self.lock:
            cut, self.open = self.open, set()
        for sock in cut:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return                                      # stopped
            upstream = socket.create_connection(self.target, timeout=10)
            upstream.settimeout(None)
            with self.lock:
                if self.listener is not listener:           # stopped while connecting
                    client.close()
                    upstream.close()
                    return
                self.open |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):                     # one side ended: end the pair
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture
def late_server(moto_endpoint):
    server = LateServer(moto_endpoint)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def clusters(tmp_path, request):
    """Start clusters with `clusters(**scheduler_env)`; all are stopped at the end."""
    started = []

    def make(agents=(), slots=1, **env) -> Cluster:
        directory = tmp_path / f"cluster-{len(started)}"
        directory.mkdir()
        cluster = Cluster(directory, **env)
        started.append(cluster)
        cluster.start()
        for node_id in agents:
            cluster.start_agent(node_id, slots=slots)
        return cluster

    try:
        yield make
    finally:
        for cluster in started:
            cluster.stop()
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            for cluster in started:
                print(cluster.logs())


def can_bind(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def stats(cluster) -> dict:
    return requests.get(cluster.scheduler_url + "/stats", timeout=10).json()


def jobs(cluster) -> list[dict]:
    return requests.get(cluster.scheduler_url + "/jobs", params={"limit": 1000}, timeout=10).json()


def notifications(messages: list[dict]) -> list[dict]:
    """SNS envelopes (as SQS delivers them) -> (envelope, message) pairs, checked."""
    out = []
    for message in messages:
        envelope = json.loads(message["Body"])
        assert envelope["Type"] == "Notification", envelope
        body = json.loads(envelope["Message"])
        assert envelope["MessageAttributes"]["status"] == {"Type": "String", "Value": body["status"]}
        assert envelope["MessageAttributes"]["event_id"] == {"Type": "String", "Value": body["event_id"]}
        out.append(body)
    return out


def collect(aws: Aws, queue: str, count: int, timeout: float) -> list[dict]:
    """Wait until `count` distinct notifications arrived in `queue`; returns all (duplicates too)."""
    got: list[dict] = []

    def enough():
        got.extend(notifications(aws.take_all(queue, wait=1)))
        return len({n["event_id"] for n in got}) >= count
    wait_for(enough, timeout=timeout, interval=0.1, message=f"{count} notifications")
    return got


# ---- pure: messages -> job requests -------------------------------------------------

def message(body, attributes=None, message_id="m-1", receives=1) -> dict:
    return {"MessageId": message_id, "ReceiptHandle": "r", "Body": body if isinstance(body, str) else json.dumps(body),
            "MessageAttributes": attributes or {}, "Attributes": {"ApproximateReceiveCount": str(receives)}}


def test_a_valid_message_is_a_job_request_keyed_on_the_message_id():
    parsed = sqs_intake.parse_message(message({"command": "echo hi", "env_vars": {"A": "1"}}, message_id="abc"))
    assert parsed == sqs_intake.Accepted(parsed.fields, "sqs:abc")
    assert parsed.fields["command"] == "echo hi" and parsed.fields["env_vars"] == {"A": "1"}
    assert parsed.fields["job_type"] == "run"


def test_a_message_carries_the_scheduling_fields_as_post_jobs_does():
    body = {"command": "x", "priority": 90, "pool": "gpu", "delay_secs": 30, "concurrency_key": "etl",
            "constraints": [{"label": "zone", "op": "in", "value": ["a", "b"]}],
            "depends_on": [{"job_id": "job-7", "condition": "finished"}], "array": {"count": 4, "parallel": 2}}
    fields = sqs_intake.parse_message(message(body)).fields
    assert [fields[k] for k in ("priority", "pool", "delay_secs", "concurrency_key")] == [90, "gpu", 30, "etl"]
    assert fields["constraints"] == [["zone", "in", ["a", "b"]]]
    assert fields["depends_on"] == [["job", 7, "finished"]] and fields["array"] == {"count": 4, "parallel": 2}
    rejected = sqs_intake.parse_message(message({"command": "x", "depends_on": [{"index": 0}]}))
    assert rejected.reason == sqs_intake.INVALID_JOB_REQUEST and "POST /jobs/batch" in rejected.detail


@pytest.mark.parametrize("name", ["idempotency_key", "Idempotency-Key"])
def test_the_producers_key_wins_over_the_message_id(name):
    attributes = {name: {"DataType": "String", "StringValue": "order-42"}}
    assert sqs_intake.parse_message(message({"command": "true"}, attributes)).idempotency_key == "order-42"


@pytest.mark.parametrize("body, attributes, reason", [
    ("", None, sqs_intake.NOT_JSON),
    ("echo hi", None, sqs_intake.NOT_JSON),
    ("{nope", None, sqs_intake.NOT_JSON),
    ("[" * 100_000 + "]" * 100_000, None, sqs_intake.NOT_JSON),
    ("[1, 2]", None, sqs_intake.NOT_AN_OBJECT),
    ('"a string"', None, sqs_intake.NOT_AN_OBJECT),
    ("null", None, sqs_intake.NOT_AN_OBJECT),
    ({"job_type": "run"}, None, sqs_intake.INVALID_JOB_REQUEST),
    ({"command": "x", "port": 0}, None, sqs_intake.INVALID_JOB_REQUEST),
    ({"command": "x", "surprise": 1}, None, sqs_intake.INVALID_JOB_REQUEST),
    ({"command": "x"}, {"idempotency_key": {"DataType": "String", "StringValue": "has space"}},
     sqs_intake.INVALID_IDEMPOTENCY_KEY),
    ({"command": "x"}, {"Idempotency-Key": {"DataType": "Binary", "BinaryValue": b"k"}},
     sqs_intake.INVALID_IDEMPOTENCY_KEY),
    ({"command": "x"}, {"idempotency_key": {"DataType": "String", "StringValue": "schedule:1:2026-12-24T02:00:00Z"}},
     sqs_intake.INVALID_IDEMPOTENCY_KEY),
])
def test_what_is_not_a_job_request_is_rejected_with_a_reason(body, attributes, reason):
    rejected = sqs_intake.parse_message(message(body, attributes))
    assert isinstance(rejected, sqs_intake.Rejected)
    assert rejected.reason == reason and rejected.detail


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_AUDIT"])
def test_a_message_setting_a_loader_variable_is_rejected_naming_it(name):
    rejected = sqs_intake.parse_message(message({"command": "true", "env_vars": {name: "/tmp/x.so"}}))
    assert isinstance(rejected, sqs_intake.Rejected)
    assert rejected.reason == sqs_intake.INVALID_JOB_REQUEST and name in rejected.detail


def test_submit_errors_are_classified():
    import peewee
    assert sqs_intake.classify(BadRequest("no node allows memory_mb=9999")) == "reject"
    assert sqs_intake.classify(Conflict("key used for another request")) == "reject"
    assert sqs_intake.classify(peewee.OperationalError("database is locked")) == "retry"
    assert sqs_intake.classify(peewee.InterfaceError("connection already closed")) == "retry"
    assert sqs_intake.classify(peewee.IntegrityError("NOT NULL constraint failed")) == "unexpected"
    assert sqs_intake.classify(KeyError("x")) == "unexpected"
    assert sqs_intake.classify(TooManyRequests("MAX_PENDING_JOBS", retry_after=5)) == "later"


def test_dead_letter_attributes_say_why_and_keep_the_original_ones():
    own = {f"a{i}": {"DataType": "String", "StringValue": str(i), "StringListValues": []} for i in range(8)}
    attributes = sqs_intake.dead_letter_attributes(
        message("{nope", own, message_id="m-9", receives=3), sqs_intake.Rejected(sqs_intake.NOT_JSON, "x" * 5000))
    assert len(attributes) == 10  # SQS's limit per message
    assert attributes["corral_error"] == {"DataType": "String", "StringValue": "not_json"}
    assert len(attributes["corral_error_detail"]["StringValue"]) == sqs_intake.DETAIL_CHARS
    assert attributes["corral_source_message_id"]["StringValue"] == "m-9"
    assert attributes["corral_receive_count"]["StringValue"] == "3"
    assert attributes["a0"] == {"DataType": "String", "StringValue": "0"}


def test_a_fifo_dead_letter_queue_gets_a_group_and_a_deduplication_id():
    request = sqs_intake.dead_letter_request(message("{nope", message_id="m-3"),
                                             sqs_intake.Rejected(sqs_intake.NOT_JSON, "bad"), fifo=True)
    assert request["MessageBody"] == "{nope"
    assert request["MessageAttributes"]["corral_error"]["StringValue"] == "not_json"
    assert request["MessageGroupId"] == "corral-rejected" and request["MessageDeduplicationId"] == "m-3"
    assert "MessageGroupId" not in sqs_intake.dead_letter_request(message("x"), sqs_intake.Rejected("r", "d"))


def test_a_paced_loop_survives_a_failing_pass_and_waits_what_the_pass_says():
    from corral.server.leased import PacedLoopThread
    calls = []

    def tick(now):
        calls.append(now)
        if len(calls) == 1:
            raise RuntimeError("the database went away")
        if len(calls) == 3:
            loop.stop_event.set()
        return 0.0

    loop = PacedLoopThread("test", 0.01, tick, clock=lambda: T0)
    loop.run()                                  # in this thread: returns once stopped
    assert calls == [T0, T0, T0]


# ---- pure: outbox rows -> SNS entries, settings ---------------------------------------

def test_a_notification_carries_the_final_state_and_a_stable_event_id():
    job = types.SimpleNamespace(job_id="job-7", name="etl", status="failed", exit_code=3, node_id="n1",
                                retry_count=1, attempt=2, finished_at=T0, schedule=None, slot=None)
    body = notification(job, "exit code 3; no retries left")
    assert body == {"event_id": "job-7:2:failed", "job_id": "job-7", "name": "etl", "status": "failed",
                    "exit_code": 3, "node_id": "n1", "retry_count": 1, "attempt": 2,
                    "finished_at": "2027-01-15T08:00:00.000Z", "reason": "exit code 3; no retries left",
                    "schedule": None, "slot": None}
    scheduled = notification(types.SimpleNamespace(**{**vars(job), "schedule": "nightly", "slot": T0 - 60}))
    assert (scheduled["schedule"], scheduled["slot"]) == ("nightly", "2027-01-15T07:59:00.000Z")
    entry = sns_outbox.publish_entry(12, body)
    assert entry["Id"] == "12" and json.loads(entry["Message"]) == body
    assert entry["MessageAttributes"]["status"] == {"DataType": "String", "StringValue": "failed"}
    assert "MessageGroupId" not in entry
    fifo = sns_outbox.publish_entry(12, body, fifo=True)
    assert fifo["MessageGroupId"] == "job-7" and fifo["MessageDeduplicationId"] == "job-7:2:failed"


def test_region_comes_from_aws_urls_and_arns_only():
    assert aws_clients.region_of("https://sqs.eu-west-1.amazonaws.com/123456789012/q") == "eu-west-1"
    assert aws_clients.region_of("https://eu-west-2.queue.amazonaws.com/123456789012/q") == "eu-west-2"
    assert aws_clients.region_of("arn:aws:sns:ap-south-1:123456789012:t") == "ap-south-1"
    assert aws_clients.region_of("http://127.0.0.1:4566/000000000000/q") is None
    assert aws_clients.region_of(None) is None


def test_settings_from_the_environment():
    env = {"SQS_URL": "https://sqs.eu-west-1.amazonaws.com/1/q", "SNS_TOPIC_ARN": "arn:aws:sns:eu-west-1:1:t",
           "AWS_ENDPOINT_URL": "http://moto:5000", "AWS_ENDPOINT_URL_SNS": "http://sns:5000",
           "AWS_DEFAULT_REGION": "us-east-2", "SNS_PUBLISH_BATCH": "5"}
    settings = SchedulerSettings.from_env(env)
    assert settings.sqs_endpoint_url == "http://moto:5000" and settings.sns_endpoint_url == "http://sns:5000"
    assert settings.aws_region == "us-east-2" and settings.sns_publish_batch == 5
    assert settings.sqs_wait_time_secs == 20 and settings.sqs_dlq_url is None
    assert SchedulerSettings.from_env({"AWS_REGION": "a", "AWS_DEFAULT_REGION": "b"}).aws_region == "a"
    for bad in ({"SQS_URL": "my-queue"}, {"SNS_TOPIC_ARN": "topic"}, {"SNS_PUBLISH_BATCH": "11"},
                {"SQS_URL": "https://q/1/a", "SQS_DLQ_URL": "https://q/1/a"}, {"SQS_WAIT_TIME_SECS": "21"}):
        with pytest.raises(SettingError):
            SchedulerSettings.from_env(bad)


# ---- the store: outbox rows in the status change's transaction ------------------------

def make_store(tmp_path, **overrides):
    settings = SchedulerSettings(database_url=f"sqlite:///{tmp_path}/s.db", retry_base_secs=0, **overrides)
    create_schema(settings)
    store = open_store(settings)
    store.nodes.sync_nodes([{"node_id": "n1", "address": "a", "kind": "compute", "slots": 4, "status": "healthy"}], T0)
    return store


def finish(store, job_id, status, exit_code, now):
    job = store.jobs.get(job_id)
    sent = {"node_id": job.node_id, "attempt": job.attempt}
    Scheduler(store).report(job_id, status_report({**sent, "status": "running"}), now)
    return Scheduler(store).report(job_id, status_report({**sent, "status": status, "exit_code": exit_code}), now)


def test_final_states_only_are_written_to_the_outbox(tmp_path):
    store = make_store(tmp_path, sns_topic_arn="arn:aws:sns:us-east-1:123456789012:t")
    done, _ = Scheduler(store).submit({"command": "true"}, T0)
    flaky, _ = Scheduler(store).submit({"command": "false", "max_retries": 1}, T0)
    finish(store, done.job_id, "done", 0, T0 + 1)
    finish(store, flaky.job_id, "failed", 1, T0 + 2)        # retried: not final, no notification
    assert [r.event_id for r in OutboxEvent.select()] == ["job-1:1:done"]
    finish(store, flaky.job_id, "failed", 1, T0 + 3)        # retries exhausted: final
    waiting, _ = Scheduler(store).submit({"command": "true", "instance_id": "elsewhere"}, T0)
    Scheduler(store).cancel(waiting.job_id, T0 + 4)
    rows = list(OutboxEvent.select().order_by(OutboxEvent.id))
    assert [r.event_id for r in rows] == ["job-1:1:done", "job-2:2:failed", "job-3:0:cancelled"]
    assert rows[1].message["retry_count"] == 1 and rows[1].message["exit_code"] == 1
    assert rows[2].message["node_id"] is None and rows[2].message["finished_at"] == "2027-01-15T08:00:04.000Z"
    assert store.outbox.backlog(T0 + 10) == (3, 10 - 1)


def test_a_rolled_back_status_change_leaves_no_notification(tmp_path):
    store = make_store(tmp_path, sns_topic_arn="arn:aws:sns:us-east-1:123456789012:t")
    job, _ = Scheduler(store).submit({"command": "true"}, T0)
    with pytest.raises(RuntimeError):
        with store.db.atomic():
            Scheduler(store).cancel(job.job_id, T0)
            raise RuntimeError("crash before the commit")
    assert Job.get_by_id(job.id).status == "pending" and OutboxEvent.select().count() == 0


def test_without_a_topic_nothing_is_written(tmp_path):
    store = make_store(tmp_path)
    job, _ = Scheduler(store).submit({"command": "true"}, T0)
    Scheduler(store).cancel(job.job_id, T0)
    assert OutboxEvent.select().count() == 0


def test_stats_endpoint_counts_jobs_and_the_outbox(tmp_path):
    settings = SchedulerSettings(database_url=f"sqlite:///{tmp_path}/s.db",
                                 sns_topic_arn="arn:aws:sns:us-east-1:123456789012:t")
    app = create_app(settings, clock=lambda: T0 + 5)
    client = app.test_client()
    for _ in range(2):
        client.post("/jobs", json={"command": "true"})
    client.post("/jobs/job-1/cancel", json={})
    body = client.get("/stats").json
    assert body["jobs"] == {"pending": 1, "running": 0, "done": 0, "failed": 0, "cancelled": 1}
    assert body["sns"] == {"enabled": True, "pending": 1, "oldest_pending_age_secs": 0.0, "published": 0,
                           "publish_failures": 0}
    assert body["sqs"]["enabled"] is False and body["sqs"]["received"] == 0


# ---- one pass of each loop, fixed clock, moto ------------------------------------------

def intake_for(aws, tmp_path, queue, endpoint=None, **overrides):
    store = make_store(tmp_path, sqs_url=queue, aws_region=REGION, sqs_endpoint_url=endpoint or aws.endpoint,
                       sqs_wait_time_secs=0, **overrides)
    intake = sqs_intake.Intake(store, holder="me", clock=lambda: T0)
    # Passes of the intake hold its lease; a test that calls handle() alone takes it first.
    intake.fence.acquire(store.db, intake.lease_ttl, T0)
    return store, intake


@pytest.mark.slow
def test_intake_pass_creates_jobs_drops_bad_messages_and_counts(aws, tmp_path, caplog):
    queue = aws.queue("intake")
    store, intake = intake_for(aws, tmp_path, queue)
    aws.send(queue, {"command": "echo one"})
    aws.send(queue, "not json at all")
    with caplog.at_level(logging.INFO, logger="corral.scheduler.sqs_intake"):
        assert intake.tick(T0) == 0.0
    created = Job.get()
    assert created.command == "echo one" and created.created_at == T0 and created.node_id == "n1"
    assert created.idempotency_key.startswith("sqs:")
    dropped = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(dropped) == 1 and "not_json" in dropped[0].getMessage() and "no SQS_DLQ_URL" in dropped[0].getMessage()
    assert aws.depth(queue) == 0
    assert store.stats.counters() == {"sqs_received": 2, "sqs_jobs_created": 1, "sqs_rejected": 1, "sqs_dropped": 1}


@pytest.mark.slow
def test_messages_jobs_belong_to_sqs_user_and_team_or_a_team_of_that_users(aws, tmp_path):
    queue = aws.queue("teams")
    store, intake = intake_for(aws, tmp_path, queue, sqs_user="etl-bot", sqs_team="data")
    for team in ("data", "ml", "web"):
        store.accounts.create_team(team, T0)
    store.accounts.create_user("etl-bot", None, None, {"data": "member", "ml": "member"}, T0)
    aws.send(queue, {"command": "echo plain"})
    aws.send(queue, {"command": "echo ml", "team": "ml"})
    aws.send(queue, {"command": "echo web", "team": "web"})  # not one of etl-bot's teams
    assert intake.tick(T0) == 0.0
    made = {job.command: (job.team, job.submitted_by) for job in Job.select()}
    assert made == {"echo plain": ("data", "etl-bot"), "echo ml": ("ml", "etl-bot")}
    assert store.stats.counters()["sqs_rejected"] == 1
    # The bootstrap user (the default) may name any team that exists, and no other.
    store2, intake2 = intake_for(aws, tmp_path / "second", aws.queue("admin"))
    store2.accounts.create_team("ml", T0)
    for team in ("ml", "nope"):
        aws.send(intake2.settings.sqs_url, {"command": f"echo {team}", "team": team})
    intake2.tick(T0)
    assert {(job.command, job.team, job.submitted_by) for job in Job.select()} == {("echo ml", "ml", "admin")}


@pytest.mark.slow
def test_a_message_delivered_again_after_the_commit_makes_no_second_job(aws, tmp_path):
    """As if the scheduler died between the commit and the delete: the message comes back."""
    queue = aws.queue("redeliver")
    store, intake = intake_for(aws, tmp_path, queue, sqs_visibility_timeout_secs=1)
    message_id = aws.send(queue, {"command": "echo once"})
    first = intake.receive()
    outcome = intake.handle(first, T0)              # committed; never deleted
    assert outcome.created == 1 and Job.select().count() == 1

    def again():
        intake.tick(T0 + 5)                       # the visibility timeout runs out; SQS delivers it again
        return store.stats.counters().get("sqs_duplicates")
    wait_for(again, timeout=10, message="the redelivery")
    assert Job.select().count() == 1 and Job.get().idempotency_key == f"sqs:{message_id}"
    assert aws.depth(queue) == 0


@pytest.mark.slow
def test_an_unreachable_queue_backs_off_doubling_and_recovers(aws, tmp_path, late_server, monkeypatch):
    monkeypatch.setattr(aws_clients, "MAX_ATTEMPTS", 1)  # the intake's own backoff, not botocore's retries in between
    queue = aws.queue("late")
    store, intake = intake_for(aws, tmp_path, queue, endpoint=late_server.url, sqs_backoff_cap_secs=3)
    aws.send(queue, {"command": "true"})
    assert [intake.tick(T0 + i) for i in range(3)] == [1.0, 2.0, 3.0]   # connection refused, capped
    late_server.start()
    assert intake.tick(T0 + 10) == 0.0 and intake.failures == 0
    assert Job.select().count() == 1


@pytest.mark.slow
def test_a_message_refused_at_max_pending_jobs_stays_in_the_queue_and_makes_its_job_later(aws, tmp_path, monkeypatch):
    monkeypatch.setattr(admission, "RETRY_AFTER_SECS", 1)  # how long the message stays invisible
    queue, dlq = aws.queue("full"), aws.queue("full-dlq")
    store, intake = intake_for(aws, tmp_path, queue, sqs_dlq_url=dlq, max_pending_jobs=1, sqs_backoff_cap_secs=2)
    waiting, _ = Scheduler(store).submit({"command": "true"}, T0)
    aws.send(queue, {"command": "echo later"})
    assert intake.tick(T0) == 1.0  # the cluster is full: the intake backs off
    assert Job.select().count() == 1
    assert aws.depth(queue) == 1 and aws.depth(dlq) == 0  # kept for later, not dead-lettered
    assert store.stats.counters() == {"sqs_received": 1, "sqs_requeued": 1}
    Scheduler(store).cancel(waiting.job_id, T0)
    store.admission.forget()  # (or wait out admission.RECOUNT_SECS)

    def made():
        intake.tick(T0 + 10)  # the message is visible again after admission.RETRY_AFTER_SECS
        return Job.select().where(Job.command == "echo later").count()
    wait_for(made, timeout=30, message="the job of the message kept for later")
    assert aws.depth(queue) == 0 and aws.depth(dlq) == 0 and made() == 1


@pytest.mark.slow
def test_only_the_lease_holder_receives(aws, tmp_path):
    queue = aws.queue("lease")
    store, first = intake_for(aws, tmp_path, queue)
    second = sqs_intake.Intake(store, holder="other", clock=lambda: T0)
    assert first.tick(T0) == 0.0
    aws.send(queue, {"command": "true"})
    assert second.tick(T0 + 1) == 5.0 and second.client is None
    assert aws.depth(queue) == 1
    assert second.tick(T0 + 1 + first.lease_ttl) == 0.0      # the holder went silent: taken over
    assert Job.select().count() == 1


def publisher_for(aws, tmp_path, topic, endpoint=None, **overrides):
    store = make_store(tmp_path, sns_topic_arn=topic, aws_region=REGION,
                       sns_endpoint_url=endpoint or aws.endpoint, **overrides)
    return store, sns_outbox.Publisher(store, holder="me")


@pytest.mark.slow
def test_outbox_pass_publishes_oldest_first_and_marks_them(aws, tmp_path):
    topic, events = aws.topic_to_queue()
    store, publisher = publisher_for(aws, tmp_path, topic, sns_publish_batch=2)
    for _ in range(3):
        job, _ = Scheduler(store).submit({"command": "true", "instance_id": "nowhere"}, T0)
        Scheduler(store).cancel(job.job_id, T0)
    assert publisher.tick(T0 + 1) == 0.0               # a full batch: more may wait
    assert publisher.tick(T0 + 2) == store.settings.sns_poll_interval_secs
    published = [r.published_at for r in OutboxEvent.select().order_by(OutboxEvent.id)]
    assert published == [T0 + 1, T0 + 1, T0 + 2]
    bodies = notifications(aws.take_all(events))
    assert sorted(b["event_id"] for b in bodies) == ["job-1:0:cancelled", "job-2:0:cancelled", "job-3:0:cancelled"]
    assert store.stats.counters()["sns_published"] == 3 and store.outbox.backlog(T0 + 3) == (0, None)


@pytest.mark.slow
def test_an_unreachable_topic_keeps_rows_pending_backs_off_and_warns(aws, tmp_path, late_server, caplog, monkeypatch):
    monkeypatch.setattr(aws_clients, "MAX_ATTEMPTS", 1)  # the outbox's own backoff, not botocore's retries in between
    topic, events = aws.topic_to_queue()
    store, publisher = publisher_for(aws, tmp_path, topic, endpoint=late_server.url, sns_backoff_cap_secs=2,
                                     sns_backlog_warn_secs=60)
    job, _ = Scheduler(store).submit({"command": "true"}, T0)
    finish(store, job.job_id, "done", 0, T0)
    with caplog.at_level(logging.WARNING, logger="corral.scheduler.sns_outbox"):
        assert [publisher.tick(T0 + 1), publisher.tick(T0 + 2), publisher.tick(T0 + 3)] == [1.0, 2.0, 2.0]
        row = OutboxEvent.get()
        assert row.published_at is None and row.publish_attempts == 3 and "EndpointConnectionError" in row.last_error
        caplog.clear()
        publisher.tick(T0 + 100)                       # the backlog check is due, the row is 100 s old
    assert any("backlog: 1 notifications waiting, the oldest for 100s" in r.getMessage() for r in caplog.records)
    late_server.start()
    assert publisher.tick(T0 + 101) == store.settings.sns_poll_interval_secs
    assert [b["event_id"] for b in notifications(aws.take_all(events))] == ["job-1:1:done"]
    assert OutboxEvent.get().published_at == T0 + 101 and publisher.failures == 0


# ---- end to end: real scheduler and agent processes -------------------------------------

@e2e
def test_fifty_queued_job_requests_all_run_and_the_queue_ends_empty(aws, clusters):
    queue = aws.queue("jobs")
    cluster = clusters(agents=("node-1", "node-2"), slots=4, SQS_URL=queue, MAX_JOBS_PER_NODE=4)
    # Both nodes in the scheduler's own node list first: 50 `echo` jobs take one node well under a second.
    wait_scheduler_sees_healthy(cluster.scheduler_url, ("node-1", "node-2"), timeout=30)
    for start in range(0, 50, 10):
        aws.sqs.send_message_batch(QueueUrl=queue, Entries=[
            {"Id": str(n), "MessageBody": json.dumps({"command": f"echo {n}", "name": f"sqs-{n}"})}
            for n in range(start, start + 10)])
    wait_for(lambda: stats(cluster)["jobs"]["done"] == 50, timeout=60, interval=0.25,
             message="50 jobs from the queue to be done")
    listed = jobs(cluster)
    assert len(listed) == 50
    assert {j["name"]: j["stdout"] for j in listed} == {f"sqs-{n}": f"{n}\n" for n in range(50)}
    assert {j["node_id"] for j in listed} == {"node-1", "node-2"}
    wait_for(lambda: aws.depth(queue) == 0, timeout=10, message="the queue to be empty")
    counts = stats(cluster)["sqs"]
    assert counts["received"] == 50 and counts["jobs_created"] == 50 and counts["rejected"] == 0


@e2e
def test_a_message_whose_delete_failed_is_delivered_again_and_yields_one_job(aws, clusters, late_server):
    """The job is committed, then the delete fails (SQS went away meanwhile); the
    message's visibility timeout runs out and SQS delivers it again: still one job."""
    queue = aws.queue("twice")
    late_server.start()                                 # the scheduler's SQS endpoint, up for now
    cluster = clusters(SQS_URL=queue, AWS_ENDPOINT_URL_SQS=late_server.url, SQS_VISIBILITY_TIMEOUT_SECS=1,
                       SQS_BACKOFF_CAP_SECS=1)
    log = cluster.procs["scheduler"].output
    wait_for(lambda: "taking job requests from" in log(), timeout=20, message="the intake to start")
    lock = sqlite3.connect(f"{cluster.state_dir}/scheduler.db", timeout=10, isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")                 # the scheduler's submit now waits for the database
        message_id = aws.send(queue, {"command": "echo once"})
        wait_for(lambda: aws.depth(queue) == 1 and aws.sqs.get_queue_attributes(
            QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"][
            "ApproximateNumberOfMessages"] == "0", timeout=5, interval=0.02, message="the scheduler to receive it")
        late_server.stop()                              # so the delete after the commit is refused
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    wait_for(lambda: "SQS intake from" in log(), timeout=20, message="the delete to fail")
    assert "created job-1" in log() and aws.depth(queue) == 1
    late_server.start()
    wait_for(lambda: stats(cluster)["sqs"]["duplicates"] == 1 and aws.depth(queue) == 0, timeout=20,
             message="the second delivery to be recognised and deleted")
    listed = jobs(cluster)
    assert len(listed) == 1 and listed[0]["command"] == "echo once"
    assert f"SQS message {message_id} (received 2 times): job-1 already exists" in log()
    assert stats(cluster)["sqs"]["jobs_created"] == 1


@e2e
def test_bad_messages_go_to_the_dead_letter_queue_and_create_nothing(aws, clusters):
    queue, dlq = aws.queue("jobs"), aws.queue("dlq")
    cluster = clusters(SQS_URL=queue, SQS_DLQ_URL=dlq)
    aws.send(queue, {"command": "echo keyed"}, key="order-1")
    wait_for(lambda: len(jobs(cluster)) == 1, timeout=30, message="the keyed job")
    bad = {
        "{this is not json": "not_json",
        json.dumps(["command", "echo"]): "not_an_object",
        json.dumps({"command": "echo", "port": 0}): "invalid_job_request",
        json.dumps({"job_type": "run"}): "invalid_job_request",
        json.dumps({"command": "echo different"}): "idempotency_conflict",   # order-1 again, another request
    }
    for body in bad:
        aws.send(queue, body, key="order-1" if "different" in body else None)
    aws.send(queue, {"command": "echo keyed"}, key="order-1", key_attribute="Idempotency-Key")  # a re-send
    wait_for(lambda: stats(cluster)["sqs"]["received"] == 7 and aws.depth(queue) == 0, timeout=30,
             message="every message handled")
    dead = aws.take_all(dlq)
    assert {m["Body"]: m["MessageAttributes"]["corral_error"]["StringValue"] for m in dead} == bad
    for m in dead:
        assert m["MessageAttributes"]["corral_error_detail"]["StringValue"]
    assert len(jobs(cluster)) == 1
    counts = stats(cluster)["sqs"]
    assert counts == dict(counts, jobs_created=1, duplicates=1, rejected=5, dead_lettered=5, dropped=0)


@e2e
def test_one_notification_per_final_state(aws, clusters):
    topic, events = aws.topic_to_queue()
    cluster = clusters(agents=("node-1",), slots=2, SNS_TOPIC_ARN=topic, MAX_JOBS_PER_NODE=2)
    done = cluster.submit(command="echo ok")
    failed = cluster.submit(command="exit 3", max_retries=1)           # fails, is retried, fails: final
    waiting = cluster.submit(command="true", instance_id="no-such-node")
    cancelled = cluster.submit(command="sleep 60")
    cluster.wait_status(cancelled["job_id"], "running")
    for job in (waiting, cancelled):
        requests.post(f"{cluster.scheduler_url}/jobs/{job['job_id']}/cancel", json={}, timeout=10).raise_for_status()
    final = {job["job_id"]: cluster.wait_status(job["job_id"], "done", "failed", "cancelled", timeout=30)
             for job in (done, failed, waiting, cancelled)}
    got = collect(aws, events, 4, timeout=20)
    wait_for(lambda: stats(cluster)["sns"]["pending"] == 0, timeout=10, message="the outbox to drain")
    got += notifications(aws.take_all(events, wait=1))
    assert len(got) == 4, got                           # exactly one each, no retried failure among them
    for body in got:
        job = final[body["job_id"]]
        expected = {k: job[k] for k in ("job_id", "status", "exit_code", "node_id", "retry_count", "attempt",
                                        "finished_at")}
        assert {k: body[k] for k in expected} == expected
        assert body["event_id"] == f"{job['job_id']}:{job['attempt']}:{job['status']}"
    by_job = {b["job_id"]: b for b in got}
    assert by_job[done["job_id"]]["status"] == "done" and by_job[done["job_id"]]["exit_code"] == 0
    assert by_job[failed["job_id"]]["retry_count"] == 1 and by_job[failed["job_id"]]["exit_code"] == 3
    assert by_job[waiting["job_id"]]["node_id"] is None and by_job[cancelled["job_id"]]["node_id"] == "node-1"
    assert stats(cluster)["sns"]["published"] == 4


@e2e
def test_the_notification_of_a_scheduled_job_names_its_schedule_and_slot(aws, clusters):
    topic, events = aws.topic_to_queue()
    cluster = clusters(agents=("node-1",), SNS_TOPIC_ARN=topic)
    created = requests.post(cluster.scheduler_url + "/schedules", timeout=10, json={
        "name": "tick", "interval_secs": 1, "job": {"command": "true"}})
    assert created.status_code == 201, created.text
    got = collect(aws, events, 2, timeout=30)
    requests.patch(cluster.scheduler_url + "/schedules/tick", json={"enabled": False}, timeout=10).raise_for_status()
    for body in got:
        job = cluster.job(body["job_id"])
        assert (body["schedule"], body["slot"], body["status"]) == ("tick", job["slot"], "done")
    assert len({b["slot"] for b in got}) == len({b["job_id"] for b in got})  # a slot per job


@e2e
def test_notifications_wait_out_an_sns_outage(aws, clusters, late_server):
    topic, events = aws.topic_to_queue()
    cluster = clusters(agents=("node-1",), SNS_TOPIC_ARN=topic, AWS_ENDPOINT_URL_SNS=late_server.url,
                       SNS_BACKOFF_CAP_SECS=1)
    submitted = [cluster.submit(command=f"echo {n}") for n in range(3)]
    for job in submitted:
        cluster.wait_status(job["job_id"], "done")
    wait_for(lambda: stats(cluster)["sns"]["publish_failures"] >= 2, timeout=20,
             message="publishes to fail while SNS is down")
    assert stats(cluster)["sns"]["pending"] == 3
    late_server.start()
    got = collect(aws, events, 3, timeout=30)
    assert {b["event_id"] for b in got} == {f"{j['job_id']}:1:done" for j in submitted}
    wait_for(lambda: stats(cluster)["sns"]["pending"] == 0, timeout=10, message="the outbox to drain")


@e2e
def test_a_notification_survives_kill_9_between_commit_and_publish(aws, clusters, late_server):
    topic, events = aws.topic_to_queue()
    cluster = clusters(agents=("node-1",), SNS_TOPIC_ARN=topic, AWS_ENDPOINT_URL_SNS=late_server.url,
                       SNS_BACKOFF_CAP_SECS=1)
    job = cluster.submit(command="echo survivor")
    cluster.wait_status(job["job_id"], "done")
    wait_for(lambda: stats(cluster)["sns"]["publish_failures"] >= 1, timeout=20, message="a failed publish")
    assert stats(cluster)["sns"]["pending"] == 1             # committed, not published
    cluster.procs["scheduler"].kill()
    late_server.start()
    # The master is gone; its workers may take a moment longer to release the socket.
    wait_for(lambda: can_bind(cluster.scheduler_port), timeout=10, message="the old scheduler's port to be free")
    cluster.start_scheduler()
    got = collect(aws, events, 1, timeout=40)                  # after the dead holder's lease runs out
    assert [b["event_id"] for b in got] == [f"{job['job_id']}:1:done"]
    assert got[0]["node_id"] == "node-1" and got[0]["exit_code"] == 0
    wait_for(lambda: stats(cluster)["sns"]["pending"] == 0, timeout=10, message="the row to be marked")


@e2e
def test_intake_starts_by_itself_once_sqs_comes_up(aws, clusters, late_server):
    queue = aws.queue("late")
    cluster = clusters(agents=("node-1",), SQS_URL=queue, AWS_ENDPOINT_URL_SQS=late_server.url,
                       SQS_BACKOFF_CAP_SECS=1)
    aws.send(queue, {"command": "echo late"})
    wait_for(lambda: "SQS intake from" in cluster.procs["scheduler"].output(), timeout=20,
             message="the intake to report SQS unreachable")
    assert jobs(cluster) == []
    late_server.start()
    wait_for(lambda: [j["stdout"] for j in jobs(cluster) if j["status"] == "done"] == ["late\n"], timeout=30,
             message="the queued job to run")
    assert cluster.procs["scheduler"].alive() and aws.depth(queue) == 0
