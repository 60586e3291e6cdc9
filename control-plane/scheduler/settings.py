"""Scheduler settings, read from the environment.

The table of each (SETTINGS, AWS) is below the dataclass, those both servers read are in
control-plane/server/settings.py, and docs/settings.md lists them all (SQS and SNS:
docs/sqs-sns.md)."""
import os
from collections.abc import Mapping
from dataclasses import dataclass

from corral.shared import settings as s
from corral.server import principals
from corral.server.db import DatabaseOptions
from corral.shared.credentials import Credentials
from corral.shared.errors import SettingError
from corral.server.http import DEFAULT_MAX_BODY_BYTES
from corral.server.settings import server_fields

from . import placement
from .oidc import OidcSettings, oidc_settings
from .retry import RetryDelay


@dataclass(frozen=True)
class SchedulerSettings:
    database_url: str
    sqlite_synchronous: str = "NORMAL"
    # CORRAL_DB_POOL_SIZE, CORRAL_DB_POOL_WAIT_SECS, CORRAL_PG_POLL_ONLY (control-plane/server/db.py).
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
    # Pending jobs the cluster holds at most: a submit beyond it is refused (429, see
    # admission.py); retries and requeues of existing jobs are never refused.
    max_pending_jobs: int = 100_000
    # How placement chooses among the nodes a job fits (placement.POLICIES), and how
    # many seconds of waiting are worth one point of priority (placement.queue_at).
    placement_policy: str = "round-robin"
    priority_aging_secs: float = 60.0
    # Fair share between teams and users (fairshare.py): usage counts half after this long; 0: off.
    fair_share_half_life_secs: float = 7 * 86400.0
    # Preemption (preemption.py): a team's guarantee reclaimed from borrowers; within a team,
    # a job this many points of priority above another may stop it (0: never).
    preemption: bool = True
    priority_preemption_gap: int = 0
    # Multi-node jobs (gangs.py): how long the first one waiting holds the nodes it found
    # while it waits for the rest (then lets others have them as long), and the ports a
    # gang's MASTER_PORT is chosen from on its rank 0's node.
    gang_hold_secs: float = 600.0
    gang_port_first: int = 29500
    gang_port_last: int = 29999
    schedule_catch_up_max: int = 100
    max_job_retries: int = 1
    retry_base_secs: float = 2.0
    retry_factor: float = 2.0
    retry_cap_secs: float = 300.0
    job_timeout_secs: float = 3600.0
    job_timeout_max_secs: float = 7 * 86400.0  # the most a job's own timeout_secs may ask
    job_kill_grace_secs: float = 10.0      # from a job's kill_signal to SIGKILL, unless it asks its own
    job_kill_grace_max_secs: float = 300.0  # the most a job's own kill_grace_secs may ask
    timeout_check_secs: float = 10.0
    node_refresh_secs: float = 2.0
    # The disk limit (MB) of a job whose request sets no disk_mb; 0: none.
    job_default_disk_mb: int = 10240
    dispatch_interval_secs: float = 1.0
    heartbeat_timeout_secs: float = 20.0   # also the agents' lease period
    node_lost_grace_secs: float = 15.0
    max_node_losses: int = 3
    output_tail_bytes: int = 64 * 1024
    # Complete logs (job_logs.py): each stream of each attempt is kept up to about this
    # many bytes (the agent drops the middle beyond), in the database or, with
    # log_bucket ("s3://bucket/prefix"), in S3 (s3_endpoint_url: an S3-compatible one).
    log_max_bytes: int = 10 * 1024 * 1024
    log_bucket: str | None = None
    s3_endpoint_url: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # A page of GET /jobs stops at about this many bytes of JSON (always one job at
    # least), so one request cannot make a worker hold hundreds of megabytes.
    page_max_bytes: int = 8 * 1024 * 1024
    # Long-poll claims (docs/dispatch.md): claims waiting at once per server process;
    # None: the worker's threads minus 8 and the streams' cap (longpoll.default_max_waiters).
    long_poll_max_waiters: int | None = None
    # Finished jobs older than this are deleted with their events (0: kept forever),
    # at most job_purge_batch per background pass.
    job_retention_secs: float = 7 * 86400.0
    job_purge_batch: int = 500
    # The event stream (GET /events, event_stream.py): how long its events are kept,
    # the keep-alive of an idle stream, and the longest a stream stays open.
    events_retention_secs: float = 3600.0
    events_keepalive_secs: float = 15.0
    events_stream_max_secs: float = 300.0
    # Open event streams per server process (None: an eighth of its threads,
    # stream_hub.default_max_streams) and per credential in a process.
    events_streams_max: int | None = None
    events_streams_per_credential: int = 8
    # The charts' sampler (sampler.py): a sample every stats_interval_secs, kept for
    # stats_retention_secs.
    stats_interval_secs: float = 10.0
    stats_retention_secs: float = 7200.0
    # SQS intake and SNS notifications (docs/sqs-sns.md); off while the URL / ARN is unset.
    sqs_url: str | None = None
    sqs_dlq_url: str | None = None
    sns_topic_arn: str | None = None
    sqs_user: str = "admin"                  # the submitter of the jobs of SQS messages
    sqs_team: str = "default"                # their team, unless a message names one of sqs_user's
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
    # Single sign-on (oidc.py): CORRAL_OIDC_*; None: bearer JWTs are not accepted.
    oidc: OidcSettings | None = None

    @property
    def backoff(self) -> RetryDelay:
        return RetryDelay(self.retry_base_secs, self.retry_factor, self.retry_cap_secs)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "SchedulerSettings":
        return cls(**server_fields(env, "scheduler.db"), **s.read_all(SETTINGS, env), **aws_settings(env),
                   **oidc_settings(env))


def aws_settings(env: Mapping[str, str]) -> dict:
    """The SQS/SNS fields of SchedulerSettings, checked."""
    values = s.read_all(AWS, env)
    if values["sqs_url"] and values["sqs_dlq_url"] == values["sqs_url"]:
        raise SettingError("SQS_DLQ_URL must be another queue than SQS_URL")
    return values


def _user_name(name: str, value: str) -> str:
    if not principals.USER_RE.match(value):
        raise SettingError(f"{name} must be a user name (letters, digits, '.', '_', '@', '+' or '-'), got {value!r}")
    return value


def _team_name(name: str, value: str) -> str:
    if not principals.TEAM_RE.match(value):
        raise SettingError(f"{name} must be a team name (letters, digits, '.', '_' or '-'), got {value!r}")
    return value


def _queue_url(name: str, url: str) -> str:
    if not url.startswith(("https://", "http://")):
        raise SettingError(f"{name} must be a queue URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME), got {url!r}")
    return url


def _bucket_url(name: str, url: str) -> str:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    if not url.startswith("s3://") or not bucket or prefix.startswith("/") or "//" in prefix:
        raise SettingError(f"{name} must be s3://BUCKET or s3://BUCKET/PREFIX, got {url!r}")
    return url


def _topic_arn(name: str, topic: str) -> str:
    if not (topic.startswith("arn:") and topic.count(":") >= 5):
        raise SettingError(f"{name} must be a topic ARN (arn:aws:sns:REGION:ACCOUNT:NAME), got {topic!r}")
    return topic


# The scheduler's own settings (besides those both servers read: control-plane/server/settings.py).
SETTINGS = (
    s.Setting("REGISTRY_URL", "registry_url", "urls", "http://127.0.0.1:9000",
              "where the node list comes from (read with `CORRAL_API_TOKEN`); several URLs: the registry's "
              "replicas, tried in order"),
    s.Setting("REGISTRY_CA_BUNDLE", "registry_ca_bundle", "file", None,
              "CA certificates that verify an `https://` `REGISTRY_URL`", shown="the system's CAs"),
    s.Setting("MAX_JOBS_PER_NODE", "max_jobs_per_node", "int", 1,
              "running jobs a node may hold at once (an agent may advertise fewer slots)", minimum=1, maximum=10_000),
    s.Setting("MAX_PENDING_JOBS", "max_pending_jobs", "int", 100_000,
              "pending jobs the cluster holds at most: a submit (single, batch, array, SQS message, schedule "
              "run) that would go beyond is refused with 429 and `Retry-After`, and nothing is stored; retries "
              "and requeues of existing jobs always pass. Several processes may overshoot it by what they "
              "admit within a second (docs/operations.md)", minimum=1, maximum=100_000_000),
    s.Setting("PLACEMENT_POLICY", "placement_policy", "choice", "round-robin",
              "how a job's node is chosen among those it fits: `round-robin` (the next in turn), `binpack` (the "
              "least free memory after placement, then CPU) or `spread` (the most free memory after placement)",
              choices=placement.POLICIES),
    s.Setting("PRIORITY_AGING_SECS", "priority_aging_secs", "float", 60.0,
              "a waiting job gains one point of priority for each this many seconds it waits (so a job of "
              "priority 0 waits at most 100 times this behind priority-100 work); applies to jobs as they queue",
              minimum=0.0, maximum=86400.0),
    s.Setting("FAIR_SHARE_HALF_LIFE_SECS", "fair_share_half_life_secs", "float", 7 * 86400.0,
              "fair share between teams, and between users of a team: the core-seconds a team or user used count "
              "half as much after this long (docs/scheduling.md, \"Fair share\"); 0 turns fair share off "
              "(jobs are placed in queue order only)", minimum=0.0, maximum=3650 * 86400.0),
    s.Setting("PREEMPTION", "preemption", "bool", True,
              "a team below its guaranteed quota whose jobs wait while other teams run on borrowed capacity gets "
              "it back: their jobs are stopped (kill signal, grace) and requeued without spending a retry "
              "(docs/scheduling.md, \"Preemption\"); false: it waits for their jobs to end"),
    s.Setting("PRIORITY_PREEMPTION_GAP", "priority_preemption_gap", "int", 0,
              "within a team, a waiting job may stop running jobs whose priority is at least this many points "
              "below its own (0: never)", minimum=0, maximum=100),
    s.Setting("GANG_HOLD_SECS", "gang_hold_secs", "float", 600.0,
              "a multi-node job at the head of the queue holds the nodes it found (no other job takes them) while "
              "it waits for the rest to free up, this long; then it lets other jobs have them for as long, and "
              "holds again (0: never holds)", minimum=0.0, maximum=7 * 86400.0),
    s.Setting("GANG_PORT_FIRST", "gang_port_first", "int", 29500,
              "the first port a multi-node job's MASTER_PORT is chosen from, on its rank 0's node (keep the range "
              "out of the kernel's ephemeral ports: net.ipv4.ip_local_reserved_ports)", minimum=1024, maximum=65535),
    s.Setting("GANG_PORT_LAST", "gang_port_last", "int", 29999,
              "the last port of that range (a node runs at most this many minus GANG_PORT_FIRST plus one "
              "multi-node jobs' rank 0 at once)", minimum=1024, maximum=65535),
    s.Setting("SCHEDULE_CATCH_UP_MAX", "schedule_catch_up_max", "int", 100,
              "a schedule with catch_up all runs at most this many of the slots it missed while the scheduler "
              "was down (the newest); the older ones are recorded as skipped", minimum=1, maximum=10_000),
    s.Setting("MAX_JOB_RETRIES", "max_job_retries", "int", 1,
              "a failed job goes back to pending this many times, then stays failed", minimum=0, maximum=20),
    s.Setting("JOB_TIMEOUT_SECS", "job_timeout_secs", "float", 3600.0,
              "a `run` job running longer is stopped and failed, exit code -1, stderr `job timed out` (a job's "
              "own `timeout_secs` replaces it for that job; a team's lower `max_timeout_secs` bounds it)",
              minimum=0.1),
    s.Setting("JOB_TIMEOUT_MAX_SECS", "job_timeout_max_secs", "float", 7 * 86400.0,
              "the largest `timeout_secs` a job may ask for; a request above it is refused (400). JOB_TIMEOUT_SECS "
              "applies to the jobs that ask none, whatever this is", minimum=1.0, maximum=366 * 86400.0),
    s.Setting("JOB_KILL_GRACE_SECS", "job_kill_grace_secs", "float", 10.0,
              "seconds between the stop signal of an end Corral causes (timeout, cancel, preemption) and SIGKILL "
              "of whatever is left of the job (a job's own `kill_grace_secs` replaces it for that job)",
              minimum=0.0, maximum=86400.0),
    s.Setting("JOB_KILL_GRACE_MAX_SECS", "job_kill_grace_max_secs", "float", 300.0,
              "the largest `kill_grace_secs` a job may ask for; a request above it is refused (400)",
              minimum=0.0, maximum=86400.0),
    s.Setting("TIMEOUT_CHECK_SECS", "timeout_check_secs", "float", 10.0,
              "how often the scheduler looks for timed-out jobs", minimum=0.05),
    s.Setting("JOB_DEFAULT_DISK_MB", "job_default_disk_mb", "int", 10240,
              "the most a job's work dir may hold (MB) when its request sets no `disk_mb`; past it the agent ends "
              "the job (`ended_by: disk`); 0: no limit for such jobs", minimum=0, maximum=16 * 1024 * 1024),
    s.Setting("NODE_REFRESH_SECS", "node_refresh_secs", "float", 2.0,
              "how often the node list is fetched from the registry", minimum=0.05),
    s.Setting("DISPATCH_INTERVAL_SECS", "dispatch_interval_secs", "float", 1.0,
              "how often the background pass places waiting jobs (submits and finished jobs also place at once)",
              minimum=0.05),
    s.Setting("NODE_LOST_GRACE_SECS", "node_lost_grace_secs", "float", 15.0,
              "how long after a lapsed lease running jobs are requeued (keep above `AGENT_KILL_GRACE_SECS`)",
              minimum=0.0),
    s.Setting("MAX_NODE_LOSSES", "max_node_losses", "int", 3,
              "a job whose node is lost more often than this is failed", minimum=0, maximum=100),
    s.Setting("RETRY_BASE_SECS", "retry_base_secs", "float", 2.0,
              "backoff before the first retry (upper bound; the wait is random below it)",
              minimum=0.0, maximum=86400.0),
    s.Setting("RETRY_FACTOR", "retry_factor", "float", 2.0,
              "each further retry may wait this many times longer", minimum=1.0, maximum=10.0),
    s.Setting("RETRY_CAP_SECS", "retry_cap_secs", "float", 300.0,
              "the longest a retry waits", minimum=0.0, maximum=7 * 86400.0),
    s.Setting("LONG_POLL_MAX_WAITERS", "long_poll_max_waiters", "int", None,
              "claims that may wait at once in one server process; `0`: none waits", minimum=0, maximum=100_000,
              shown="threads per worker − 8 (at most half) − `EVENTS_STREAMS_MAX` (104)"),
    s.Setting("JOB_RETENTION_SECS", "job_retention_secs", "float", 7 * 86400.0,
              "finished jobs older than this are purged with their events; `0` keeps them", minimum=0.0),
    s.Setting("JOB_PURGE_BATCH", "job_purge_batch", "int", 500,
              "most jobs purged per background pass", minimum=1, maximum=100_000),
    s.Setting("EVENTS_RETENTION_SECS", "events_retention_secs", "float", 3600.0,
              "how long `GET /events` keeps its events (a Last-Event-ID older than this misses some)",
              minimum=10.0, maximum=30 * 86400.0),
    s.Setting("EVENTS_KEEPALIVE_SECS", "events_keepalive_secs", "float", 15.0,
              "an idle event stream gets a keep-alive comment this often", minimum=0.5, maximum=300.0),
    s.Setting("EVENTS_STREAM_MAX_SECS", "events_stream_max_secs", "float", 300.0,
              "an event stream ends after this long (its client resumes with Last-Event-ID); "
              "`0`: it sends the stored events and ends", minimum=0.0, maximum=86400.0),
    s.Setting("EVENTS_STREAMS_MAX", "events_streams_max", "int", None,
              "event streams (`GET /events`) open at once in one server process, each holding a thread; one "
              "more is refused with `503` (the waiting claims have a budget of their own)", minimum=0,
              maximum=100_000, shown="threads per worker ÷ 8 (16)"),
    s.Setting("EVENTS_STREAMS_PER_CREDENTIAL", "events_streams_per_credential", "int", 8,
              "event streams one credential (the operator token, the read-only token; without tokens, one client "
              "address) may hold open at once in one server process; one more is refused with `429`",
              minimum=1, maximum=100_000),
    s.Setting("STATS_INTERVAL_SECS", "stats_interval_secs", "float", 10.0,
              "how often the cluster's counts and usage are sampled for the dashboard's charts "
              "(`GET /stats/history`)", minimum=0.1, maximum=3600.0),
    s.Setting("STATS_RETENTION_SECS", "stats_retention_secs", "float", 7200.0,
              "how long samples are kept (older ones are deleted as new ones are taken)",
              minimum=60.0, maximum=30 * 86400.0),
    s.Setting("CORRAL_OUTPUT_TAIL_BYTES", "output_tail_bytes", "int", 64 * 1024,
              "the tail of stdout and of stderr that is stored", minimum=256),
    s.Setting("CORRAL_LOG_MAX_BYTES", "log_max_bytes", "int", 10 * 1024 * 1024,
              "each stream (stdout, stderr) of each attempt is kept whole up to this many bytes; past it the "
              "agent keeps the first and last halves and marks what it dropped", minimum=64 * 1024,
              maximum=1024 ** 4),
    s.Setting("CORRAL_PAGE_MAX_BYTES", "page_max_bytes", "int", 8 * 1024 * 1024,
              "a page of `GET /jobs` stops at about this many bytes (one job at least) and links the next",
              minimum=4096),
)

# SQS intake and SNS notifications (docs/sqs-sns.md).
AWS = (
    s.Setting("SQS_URL", "sqs_url", "text", None, "queue to take job requests from; unset: no intake",
              parse=_queue_url, form="a queue URL"),
    s.Setting("SQS_DLQ_URL", "sqs_dlq_url", "text", None,
              "queue for messages that are not valid job requests (another than `SQS_URL`); unset: they are "
              "deleted with an ERROR log line", parse=_queue_url, form="a queue URL"),
    s.Setting("SNS_TOPIC_ARN", "sns_topic_arn", "text", None,
              "topic for final job states; unset: no notifications", parse=_topic_arn, form="a topic ARN"),
    s.Setting("SQS_USER", "sqs_user", "text", "admin",
              "the user the jobs of SQS messages are submitted by (their `submitted_by`); `admin`: the bootstrap "
              "token's", parse=_user_name, form="a user name"),
    s.Setting("SQS_TEAM", "sqs_team", "text", "default",
              "the team the jobs of SQS messages belong to, unless a message names one of `SQS_USER`'s teams",
              parse=_team_name, form="a team name"),
    s.Setting("SQS_WAIT_TIME_SECS", "sqs_wait_time_secs", "int", 20,
              "long-poll wait of each `ReceiveMessage`", minimum=0, maximum=20),
    s.Setting("SQS_VISIBILITY_TIMEOUT_SECS", "sqs_visibility_timeout_secs", "int", 60,
              "visibility timeout asked for on receive: how long before an undeleted message is delivered again",
              minimum=1, maximum=43200),
    s.Setting("SQS_MAX_RECEIVES", "sqs_max_receives", "int", 5,
              "receives after which a message that keeps failing unexpectedly goes to the DLQ (database errors "
              "never count)", minimum=1, maximum=1000),
    s.Setting("SQS_BACKOFF_CAP_SECS", "sqs_backoff_cap_secs", "float", 60.0,
              "longest wait between tries while SQS fails (doubling from 1 s)", minimum=0.1, maximum=3600.0),
    s.Setting("SNS_PUBLISH_BATCH", "sns_publish_batch", "int", 10,
              "notifications per `PublishBatch` call", minimum=1, maximum=10),
    s.Setting("SNS_POLL_INTERVAL_SECS", "sns_poll_interval_secs", "float", 1.0,
              "how often an empty outbox is looked at: the usual delay of a notification",
              minimum=0.05, maximum=60.0),
    s.Setting("SNS_BACKOFF_CAP_SECS", "sns_backoff_cap_secs", "float", 60.0,
              "longest wait between tries while SNS fails (doubling from 1 s)", minimum=0.1, maximum=3600.0),
    s.Setting("SNS_BACKLOG_WARN_SECS", "sns_backlog_warn_secs", "float", 300.0,
              "warn (every 30 s) while the oldest pending notification is older than this", minimum=1.0),
    s.Setting("SNS_RETENTION_SECS", "sns_retention_secs", "float", 7 * 86400.0,
              "published notifications are deleted from the outbox after this", minimum=0.0),
    s.Setting("AWS_REGION", "aws_region", "text", None,
              "the region; unset: the region in `SQS_URL` / `SNS_TOPIC_ARN`, else boto3's configuration",
              fallbacks=("AWS_DEFAULT_REGION",), form="a region name"),
    s.Setting("AWS_ENDPOINT_URL_SQS", "sqs_endpoint_url", "text", None,
              "an SQS-compatible endpoint; `AWS_ENDPOINT_URL` sets one for both services; unset: AWS",
              fallbacks=("AWS_ENDPOINT_URL",), form="a URL"),
    s.Setting("AWS_ENDPOINT_URL_SNS", "sns_endpoint_url", "text", None,
              "an SNS-compatible endpoint; `AWS_ENDPOINT_URL` sets one for both services; unset: AWS",
              fallbacks=("AWS_ENDPOINT_URL",), form="a URL"),
    s.Setting("CORRAL_LOG_BUCKET", "log_bucket", "text", None,
              "where jobs' complete logs are stored: `s3://BUCKET/PREFIX` (each chunk an object); unset: in the "
              "database", parse=_bucket_url, form="s3://bucket/prefix"),
    s.Setting("AWS_ENDPOINT_URL_S3", "s3_endpoint_url", "text", None,
              "an S3-compatible endpoint for `CORRAL_LOG_BUCKET`; `AWS_ENDPOINT_URL` sets one for every service; "
              "unset: AWS", fallbacks=("AWS_ENDPOINT_URL",), form="a URL"),
    s.Setting("CORRAL_AWS_CONNECT_TIMEOUT_SECS", "aws_connect_timeout_secs", "float", 5.0,
              "connect timeout of every SQS, SNS and S3 call", minimum=0.1, maximum=300.0),
    s.Setting("CORRAL_AWS_READ_TIMEOUT_SECS", "aws_read_timeout_secs", "float", 10.0,
              "read timeout of every SQS, SNS and S3 call (a receive gets `SQS_WAIT_TIME_SECS` on top)",
              minimum=0.1, maximum=300.0),
)
