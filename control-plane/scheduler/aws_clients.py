"""boto3 clients for the SQS intake, the SNS outbox and the complete logs' S3 bucket.

Built when first needed, never at import. Credentials come from boto3's own chain; the
region is AWS_REGION or AWS_DEFAULT_REGION, else the queue URL's or topic ARN's, else
boto3's; the endpoint AWS_ENDPOINT_URL_SQS / _SNS, else AWS_ENDPOINT_URL, else AWS's
own (SchedulerSettings). Every call has a connect and a read timeout, and botocore's
`standard` retry mode (5 attempts in all) retries throttling and connection errors
before the loops' own backoff takes over.

boto3 itself (and botocore's Config) is imported by the first client built: a third of
a second of every scheduler process's start, which a cluster without SQS, SNS or S3
never needs. botocore's exceptions are light, and callers catch them.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from .settings import SchedulerSettings

if TYPE_CHECKING:
    from botocore.config import Config

__all__ = ["AWS_ERRORS", "BotoCoreError", "ClientError", "error_text", "region_of", "s3_client", "sns_client",
           "sqs_client"]

# What an SQS or SNS call raises when the service is unreachable, throttles past
# botocore's retries, refuses the request, or has no region / credentials.
AWS_ERRORS = (BotoCoreError, ClientError)

MAX_ATTEMPTS = 5
_QUEUE_URL_REGION = re.compile(r"^https://(?:sqs[.-]([a-z0-9-]+)|([a-z0-9-]+)\.queue)\.amazonaws\.com(?:\.cn)?/")


def region_of(url_or_arn: str | None) -> str | None:
    """The region named in an AWS queue URL or ARN; None for other endpoints (moto, ElasticMQ)."""
    if not url_or_arn:
        return None
    if url_or_arn.startswith("arn:"):
        parts = url_or_arn.split(":")
        return (parts[3] or None) if len(parts) > 5 else None
    match = _QUEUE_URL_REGION.match(url_or_arn)
    return (match.group(1) or match.group(2)) if match else None


def error_text(exc: Exception) -> str:
    """A short description of an AWS error for logs and the outbox: code and message."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return f"{error.get('Code', 'error')}: {error.get('Message', '')}".strip()
    return f"{type(exc).__name__}: {exc}"


def config(settings: SchedulerSettings, read_timeout: float) -> Config:
    from botocore.config import Config

    return Config(retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS},
                  connect_timeout=settings.aws_connect_timeout_secs, read_timeout=read_timeout)


def sqs_client(settings: SchedulerSettings):
    # A receive waits up to SQS_WAIT_TIME_SECS for messages: the read timeout must be longer.
    read_timeout = settings.sqs_wait_time_secs + settings.aws_read_timeout_secs
    return _client("sqs", settings.sqs_endpoint_url, settings.aws_region or region_of(settings.sqs_url),
                   config(settings, read_timeout))


def sns_client(settings: SchedulerSettings):
    return _client("sns", settings.sns_endpoint_url, settings.aws_region or region_of(settings.sns_topic_arn),
                   config(settings, settings.aws_read_timeout_secs))


def s3_client(settings: SchedulerSettings):
    """The complete logs' store (CORRAL_LOG_BUCKET). Path-style addressing at an endpoint
    of one's own (moto, MinIO): their buckets are not host names."""
    from botocore.config import Config

    cfg = config(settings, settings.aws_read_timeout_secs)
    if settings.s3_endpoint_url:
        cfg = cfg.merge(Config(s3={"addressing_style": "path"}))
    return _client("s3", settings.s3_endpoint_url, settings.aws_region, cfg)


def _client(service: str, endpoint_url: str | None, region: str | None, cfg: Config):
    import boto3

    # A session of its own: boto3's default session is not safe to share between threads.
    return boto3.session.Session().client(service, region_name=region, endpoint_url=endpoint_url, config=cfg)
