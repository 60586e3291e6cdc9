"""Complete logs in S3 (CORRAL_LOG_BUCKET=s3://bucket/prefix): one object per chunk.

A chunk's key is `<prefix>/<job>/<attempt>/<stream>/<seq:08d>-<sha256[:16]>`. The
object is written before the row that names it commits (job_logs.py), so a row
never names a missing object; the digest in the key means two requests racing with
different bytes for one seq never overwrite the object the winning row names.

Objects whose row never committed (the scheduler died between the two) and those
of purged jobs whose deletion failed are left behind: a lifecycle rule on the
prefix that expires objects some days after JOB_RETENTION_SECS removes them
(docs/operations.md).
"""
from __future__ import annotations

import logging
import threading

from corral.shared.errors import NotFound, Unavailable

from . import aws_clients
from .settings import SchedulerSettings

log = logging.getLogger(__name__)

DELETE_BATCH = 1000  # keys per DeleteObjects call, S3's most


class LogObjects:
    def __init__(self, settings: SchedulerSettings):
        assert settings.log_bucket is not None
        self.bucket, _, prefix = settings.log_bucket.removeprefix("s3://").partition("/")
        self.prefix = prefix.strip("/")
        self.settings = settings
        self._client = None
        self._lock = threading.Lock()

    def key(self, job_row: int, attempt: int, stream: str, seq: int, sha256: str) -> str:
        name = f"job-{job_row}/{attempt}/{stream}/{seq:08d}-{sha256[:16]}"
        return f"{self.prefix}/{name}" if self.prefix else name

    def put(self, key: str, data: bytes) -> None:
        try:
            self.client().put_object(Bucket=self.bucket, Key=key, Body=data,
                                     ContentType="application/octet-stream")
        except aws_clients.AWS_ERRORS as exc:
            log.warning("could not store log chunk s3://%s/%s: %s", self.bucket, key, aws_clients.error_text(exc))
            raise Unavailable("the log store (S3) did not take the chunk; nothing was stored, retry shortly") \
                from None

    def get(self, key: str, first: int, last: int) -> bytes:
        """Bytes first..last (inclusive) of the object."""
        try:
            answer = self.client().get_object(Bucket=self.bucket, Key=key, Range=f"bytes={first}-{last}")
            return answer["Body"].read()
        except aws_clients.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise NotFound("a chunk of this log is no longer in the log store (S3)") from None
            raise self._unavailable(key, exc) from None
        except aws_clients.AWS_ERRORS as exc:
            raise self._unavailable(key, exc) from None

    def delete(self, keys: list[str]) -> int:
        """Delete objects, best effort (a failure is logged); how many went."""
        deleted = 0
        for at in range(0, len(keys), DELETE_BATCH):
            batch = keys[at:at + DELETE_BATCH]
            try:
                answer = self.client().delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True})
            except aws_clients.AWS_ERRORS as exc:
                log.warning("could not delete %d log object(s) of purged jobs from s3://%s: %s", len(batch),
                            self.bucket, aws_clients.error_text(exc))
                continue
            errors = answer.get("Errors") or []
            if errors:
                log.warning("could not delete %d log object(s) of purged jobs from s3://%s: %s", len(errors),
                            self.bucket, errors[0].get("Message", errors[0].get("Code")))
            deleted += len(batch) - len(errors)
        return deleted

    def client(self):
        with self._lock:  # built once, on first use (a boto3 client is then thread-safe)
            if self._client is None:
                self._client = aws_clients.s3_client(self.settings)
            return self._client

    def _unavailable(self, key: str, exc: Exception) -> Unavailable:
        log.warning("could not read log chunk s3://%s/%s: %s", self.bucket, key, aws_clients.error_text(exc))
        return Unavailable("the log store (S3) did not answer; retry shortly")
