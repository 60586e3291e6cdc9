"""Complete logs kept in S3 (CORRAL_LOG_BUCKET), against moto's server over real HTTP:
each chunk an object written before its row commits, read back by range, deleted
with its job by the retention purge; an S3 that does not answer stores nothing."""
import boto3
import pytest

from aws import CLIENT_KWARGS
from scheduler_app import Clock, end_attempt, make_app, set_nodes, ship_log, submit
from scheduler_app import put_log_chunk as put, read_log_whole

from corral.scheduler.loops import Background
from corral.scheduler.models import LogChunk
from corral.scheduler.settings import SchedulerSettings

BUCKET = "corral-logs"


class OneNode:
    def list_nodes(self, kind=None, status=None):
        return [{"node_id": "n1", "address": "a", "kind": "compute", "slots": 4, "status": "healthy"}]


@pytest.fixture
def s3(aws_env):
    client = boto3.client("s3", endpoint_url=aws_env, **CLIENT_KWARGS)
    client.create_bucket(Bucket=BUCKET)
    yield client
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for item in page.get("Contents", []):
            client.delete_object(Bucket=BUCKET, Key=item["Key"])
    client.delete_bucket(Bucket=BUCKET)


def keys(s3):
    return sorted(item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []))


def running_app(tmp_path, clock, **overrides):
    settings = SchedulerSettings.from_env({"CORRAL_LOG_BUCKET": f"s3://{BUCKET}/corral/logs",
                                           "JOB_RETENTION_SECS": "60"})
    app = make_app(f"sqlite:///{tmp_path}/corral.db", clock, log_bucket=settings.log_bucket,
                   s3_endpoint_url=overrides.pop("s3_endpoint_url", None), job_retention_secs=60, **overrides)
    client, store = app.test_client(), app.extensions["corral.store"]
    set_nodes(store, clock, "n1")
    job_id = submit(client, command="true")["job_id"]
    client.post("/nodes/n1/claim", json={"max": 1, "wait_secs": 0})
    return client, store, job_id


@pytest.mark.slow
def test_chunks_are_objects_read_back_by_range_and_purged_with_their_job(s3, tmp_path):
    clock = Clock()
    client, store, job_id = running_app(tmp_path, clock)
    output = bytes(range(256)) * 2000
    ship_log(client, job_id, output, 200_000)
    ship_log(client, job_id, b"warn\n", 100, stream="stderr")
    stored = keys(s3)
    assert len(stored) == 4 and all(key.startswith(f"corral/logs/{job_id}/1/") for key in stored)
    assert [key.split("/")[5][:8] for key in stored if "/stdout/" in key] == ["00000000", "00000001", "00000002"]
    assert LogChunk.select().where(LogChunk.data.is_null(False)).count() == 0  # the bytes are in S3 only
    assert read_log_whole(client, job_id)[0] == output
    assert read_log_whole(client, job_id, stream="stderr")[0] == b"warn\n"
    answer = client.get(f"/jobs/{job_id}/logs?offset=199990&limit=20")
    assert answer.data == output[199_990:200_010]  # a range across two objects
    # A repeat stores no second object.
    assert put(client, job_id, output[:200_000], 0, 0).json["stored"] is False
    assert len(keys(s3)) == 4
    # The retention purge deletes the rows, then the objects.
    end_attempt(client, job_id, status="done")
    submit(client, command="true")  # SQLite keeps the newest job row: it is not that one
    assert Background(store, OneNode(), "me").tick(clock() + 3600)  # the leader's pass purges
    assert keys(s3) == [] and LogChunk.select().count() == 0


@pytest.mark.slow
def test_an_s3_that_does_not_answer_stores_nothing_and_says_retry(aws_env, tmp_path):
    client, store, job_id = running_app(tmp_path, Clock(), s3_endpoint_url="http://127.0.0.1:9",
                                        aws_connect_timeout_secs=0.5)
    answer = put(client, job_id, b"hello\n", 0, 0)
    assert answer.status_code == 503 and answer.headers["Retry-After"] and "S3" in answer.json["error"]
    assert LogChunk.select().count() == 0


@pytest.mark.parametrize("value", ["bucket", "s3://", "s3:///prefix", "http://bucket/x", "s3://b//x"])
def test_a_bucket_that_is_not_an_s3_url_is_refused_at_start(value):
    from corral.shared.errors import SettingError

    with pytest.raises(SettingError, match="CORRAL_LOG_BUCKET"):
        SchedulerSettings.from_env({"CORRAL_LOG_BUCKET": value})
