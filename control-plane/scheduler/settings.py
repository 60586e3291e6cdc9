"""Scheduler settings, read from the environment (see the README for each;
SQS and SNS in docs/sqs-sns.md)."""
import os
from collections.abc import Mapping
from dataclasses import dataclass

from corral.shared import settings as s
from corral.shared.db import DatabaseOptions
from corral.shared.credentials import Credentials, server_credentials
from corral.shared.guards import allowed_hosts
from corral.shared.errors import SettingError
from corral.shared.http import DEFAULT_MAX_BODY_BYTES

from .retry import Backoff


@dataclass(frozen=True)
class SchedulerSettings:
    database_url: str
    sqlite_synchronous: str = "NORMAL"
    # CORRAL_DB_POOL_SIZE, CORRAL_DB_POOL_WAIT_SECS, CORRAL_PG_POLL_ONLY (shared/db.py).
    db_options: DatabaseOptions = DatabaseOptions()
    # The registry's base URL, or its replicas' comma-separated (the client fails over).
    registry_url: str = "http://127.0.0.1:9000"
    # CA bundle that verifies an https:// REGISTRY_URL; None: the system's CAs.
    registry_ca_bundle: str | None = None
    # CORRAL_API_TOKEN, CORRAL_AGENT_TOKEN (shared/credentials.py); unset: open, loopback
    # only. The scheduler reads the registry's node list with CORRAL_API_TOKEN, and
    # both servers derive node credentials from CORRAL_AGENT_TOKEN: give both the same.
    credentials: Credentials = Credentials()
    # CORRAL_ALLOWED_HOSTS: Host names a loopback-only server accepts besides loopback ones.
    allowed_hosts: frozenset[str] = frozenset()
    max_jobs_per_node: int = 1
    max_job_retries: int = 1
    retry_base_secs: float = 2.0
    retry_factor: float = 2.0
    retry_cap_secs: float = 300.0
    job_timeout_secs: float = 3600.0
    timeout_check_secs: float = 10.0
    node_refresh_secs: float = 2.0
    dispatch_interval_secs: float = 1.0
    heartbeat_timeout_secs: float = 20.0   # also the agents' lease period
    node_lost_grace_secs: float = 15.0
    max_node_losses: int = 3
    output_tail_bytes: int = 64 * 1024
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # A page of GET /jobs stops at about this many bytes of JSON (always one job at
    # least), so one request cannot make a worker hold hundreds of megabytes.
    page_max_bytes: int = 8 * 1024 * 1024
    # Long-poll claims (docs/dispatch.md): claims waiting at once per server process;
    # None: the worker's threads minus 8 (longpoll.default_max_waiters).
    long_poll_max_waiters: int | None = None
    # Finished jobs older than this are deleted with their events (0: kept forever),
    # at most job_purge_batch per background pass.
    job_retention_secs: float = 7 * 86400.0
    job_purge_batch: int = 500
    # SQS intake and SNS notifications (docs/sqs-sns.md); off while the URL / ARN is unset.
    sqs_url: str | None = None
    sqs_dlq_url: str | None = None
    sns_topic_arn: str | None = None
    sqs_wait_time_secs: int = 20
    sqs_visibility_timeout_secs: int = 60
    sqs_max_receives: int = 5
    sqs_backoff_cap_secs: float = 60.0
    sns_publish_batch: int = 10
    sns_poll_interval_secs: float = 1.0
    sns_backoff_cap_secs: float = 60.0
    sns_backlog_warn_secs: float = 300.0
    sns_retention_secs: float = 7 * 86400.0
    aws_region: str | None = None            # None: boto3's own chain, or the queue URL / topic ARN
    sqs_endpoint_url: str | None = None      # None: AWS (or what ~/.aws/config says)
    sns_endpoint_url: str | None = None
    aws_connect_timeout_secs: float = 5.0
    aws_read_timeout_secs: float = 10.0

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.retry_base_secs, self.retry_factor, self.retry_cap_secs)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "SchedulerSettings":
        return cls(
            database_url=s.database_url(env, "scheduler.db"),
            sqlite_synchronous=s.sqlite_synchronous(env),
            db_options=DatabaseOptions.from_database_env(env),
            registry_url=s.env_urls(env, "REGISTRY_URL", "http://127.0.0.1:9000"),
            registry_ca_bundle=s.env_file(env, "REGISTRY_CA_BUNDLE"),
            credentials=server_credentials(env),
            allowed_hosts=allowed_hosts(env),
            max_jobs_per_node=s.env_int(env, "MAX_JOBS_PER_NODE", 1, minimum=1, maximum=10_000),
            max_job_retries=s.env_int(env, "MAX_JOB_RETRIES", 1, minimum=0, maximum=20),
            retry_base_secs=s.env_float(env, "RETRY_BASE_SECS", 2.0, minimum=0.0, maximum=86400.0),
            retry_factor=s.env_float(env, "RETRY_FACTOR", 2.0, minimum=1.0, maximum=10.0),
            retry_cap_secs=s.env_float(env, "RETRY_CAP_SECS", 300.0, minimum=0.0, maximum=7 * 86400.0),
            job_timeout_secs=s.env_float(env, "JOB_TIMEOUT_SECS", 3600.0, minimum=0.1),
            timeout_check_secs=s.env_float(env, "TIMEOUT_CHECK_SECS", 10.0, minimum=0.05),
            node_refresh_secs=s.env_float(env, "NODE_REFRESH_SECS", 2.0, minimum=0.05),
            dispatch_interval_secs=s.env_float(env, "DISPATCH_INTERVAL_SECS", 1.0, minimum=0.05),
            heartbeat_timeout_secs=s.env_float(env, "HEARTBEAT_TIMEOUT_SECS", 20.0, minimum=0.1),
            node_lost_grace_secs=s.env_float(env, "NODE_LOST_GRACE_SECS", 15.0, minimum=0.0),
            max_node_losses=s.env_int(env, "MAX_NODE_LOSSES", 3, minimum=0, maximum=100),
            output_tail_bytes=s.env_int(env, "CORRAL_OUTPUT_TAIL_BYTES", 64 * 1024, minimum=256),
            max_body_bytes=s.env_int(env, "CORRAL_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES, minimum=1024),
            page_max_bytes=s.env_int(env, "CORRAL_PAGE_MAX_BYTES", 8 * 1024 * 1024, minimum=4096),
            long_poll_max_waiters=_optional_int(env, "LONG_POLL_MAX_WAITERS", minimum=0, maximum=100_000),
            job_retention_secs=s.env_float(env, "JOB_RETENTION_SECS", 7 * 86400.0, minimum=0.0),
            job_purge_batch=s.env_int(env, "JOB_PURGE_BATCH", 500, minimum=1, maximum=100_000),
            **aws_settings(env),
        )


def aws_settings(env: Mapping[str, str]) -> dict:
    """The SQS/SNS fields of SchedulerSettings, checked."""
    sqs_url = _queue_url(env, "SQS_URL")
    dlq_url = _queue_url(env, "SQS_DLQ_URL")
    if sqs_url and dlq_url == sqs_url:
        raise SettingError("SQS_DLQ_URL must be another queue than SQS_URL")
    topic = s.env_str(env, "SNS_TOPIC_ARN", None)
    if topic is not None and not (topic.startswith("arn:") and topic.count(":") >= 5):
        raise SettingError(f"SNS_TOPIC_ARN must be a topic ARN (arn:aws:sns:REGION:ACCOUNT:NAME), got {topic!r}")
    general_endpoint = s.env_str(env, "AWS_ENDPOINT_URL", None)
    return dict(
        sqs_url=sqs_url,
        sqs_dlq_url=dlq_url,
        sns_topic_arn=topic,
        sqs_wait_time_secs=s.env_int(env, "SQS_WAIT_TIME_SECS", 20, minimum=0, maximum=20),
        sqs_visibility_timeout_secs=s.env_int(env, "SQS_VISIBILITY_TIMEOUT_SECS", 60, minimum=1, maximum=43200),
        sqs_max_receives=s.env_int(env, "SQS_MAX_RECEIVES", 5, minimum=1, maximum=1000),
        sqs_backoff_cap_secs=s.env_float(env, "SQS_BACKOFF_CAP_SECS", 60.0, minimum=0.1, maximum=3600.0),
        sns_publish_batch=s.env_int(env, "SNS_PUBLISH_BATCH", 10, minimum=1, maximum=10),
        sns_poll_interval_secs=s.env_float(env, "SNS_POLL_INTERVAL_SECS", 1.0, minimum=0.05, maximum=60.0),
        sns_backoff_cap_secs=s.env_float(env, "SNS_BACKOFF_CAP_SECS", 60.0, minimum=0.1, maximum=3600.0),
        sns_backlog_warn_secs=s.env_float(env, "SNS_BACKLOG_WARN_SECS", 300.0, minimum=1.0),
        sns_retention_secs=s.env_float(env, "SNS_RETENTION_SECS", 7 * 86400.0, minimum=0.0),
        aws_region=s.env_str(env, "AWS_REGION", None) or s.env_str(env, "AWS_DEFAULT_REGION", None),
        sqs_endpoint_url=s.env_str(env, "AWS_ENDPOINT_URL_SQS", None) or general_endpoint,
        sns_endpoint_url=s.env_str(env, "AWS_ENDPOINT_URL_SNS", None) or general_endpoint,
        aws_connect_timeout_secs=s.env_float(env, "CORRAL_AWS_CONNECT_TIMEOUT_SECS", 5.0, minimum=0.1,
                                             maximum=300.0),
        aws_read_timeout_secs=s.env_float(env, "CORRAL_AWS_READ_TIMEOUT_SECS", 10.0, minimum=0.1, maximum=300.0),
    )


def _optional_int(env: Mapping[str, str], name: str, minimum: int, maximum: int) -> int | None:
    if s.env_str(env, name, None) is None:
        return None
    return s.env_int(env, name, 0, minimum=minimum, maximum=maximum)


def _queue_url(env: Mapping[str, str], name: str) -> str | None:
    url = s.env_str(env, name, None)
    if url is not None and not url.startswith(("https://", "http://")):
        raise SettingError(f"{name} must be a queue URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME), got {url!r}")
    return url
