"""SNS notifications of final job states, through a transactional outbox.

The status writer (store/status_writer.py) writes a row to `sns_outbox` in the same
transaction as a job's final status; the leased `Publisher` loop publishes pending rows
oldest first and marks them only after SNS accepted them. At-least-once: subscribers
deduplicate on the stable `event_id`. docs/sqs-sns.md ("How it is delivered").
"""
import json
import logging
import time
from collections.abc import Callable

from corral.server.leased import PacedLoop

from . import aws_clients

log = logging.getLogger(__name__)

LEASE_NAME = "sns-outbox"
BACKLOG_CHECK_SECS = 30.0


# ---- pure ---------------------------------------------------------------------

def publish_entry(row_id: int, message: dict, fifo: bool = False) -> dict:
    """One PublishBatch entry: the JSON message, with `status` and `event_id` attributes to filter on."""
    entry = {
        "Id": str(row_id),
        "Message": json.dumps(message, sort_keys=True, separators=(",", ":")),
        "MessageAttributes": {
            "status": {"DataType": "String", "StringValue": message["status"]},
            "event_id": {"DataType": "String", "StringValue": message["event_id"]},
        },
    }
    if fifo:  # a FIFO topic: one ordered group per job, SNS deduplicates on the event id
        entry["MessageGroupId"] = message["job_id"]
        entry["MessageDeduplicationId"] = message["event_id"]
    return entry


# ---- the loop -------------------------------------------------------------------

class Publisher(PacedLoop):
    """One pass of the outbox publisher per `tick(now)`; returns the seconds until the next pass."""

    def __init__(self, store, holder: str | None = None, client_factory=aws_clients.sns_client):
        # A pass publishes one batch, so it is short next to the lease; renewing
        # every pass keeps it.
        lease_ttl = max(10.0, 5 * store.settings.sns_poll_interval_secs)
        super().__init__(store, LEASE_NAME, lease_ttl, holder, max_backoff=store.settings.sns_backoff_cap_secs)
        self.idle = lease_ttl / 4
        self.settings = store.settings
        self.client_factory = client_factory
        self.client = None
        self.fifo = (self.settings.sns_topic_arn or "").endswith(".fifo")
        self.doing = f"publishing job notifications to {self.settings.sns_topic_arn}"
        self.next_backlog_check = 0.0
        self.next_purge = 0.0

    def one_pass(self, now: float) -> float:
        if now >= self.next_backlog_check:
            self.next_backlog_check = now + BACKLOG_CHECK_SECS
            self.check_backlog(now)
        if now >= self.next_purge:
            self.next_purge = now + 3600.0
            purged = self.store.outbox.purge(now - self.settings.sns_retention_secs)
            if purged:
                log.info("deleted %d published notifications older than SNS_RETENTION_SECS", purged)
        return self.publish_batch(now)

    def publish_batch(self, now: float) -> float:
        """Publish the oldest pending notifications (one PublishBatch call)."""
        rows = self.store.outbox.pending(self.settings.sns_publish_batch)
        if not rows:
            return self.settings.sns_poll_interval_secs
        entries = [publish_entry(row.id, row.message, self.fifo) for row in rows]
        try:
            if self.client is None:
                self.client = self.client_factory(self.settings)
            answer = self.client.publish_batch(TopicArn=self.settings.sns_topic_arn,
                                               PublishBatchRequestEntries=entries)
        except aws_clients.AWS_ERRORS as exc:
            text = aws_clients.error_text(exc)
            self.store.outbox.failed({row.id: text for row in rows})
            return self.publish_failed(text, len(rows))
        published = [int(ok["Id"]) for ok in answer.get("Successful", [])]
        self.store.outbox.published(published, now)
        refused = {int(bad["Id"]): f"{bad.get('Code')}: {bad.get('Message', '')}" for bad in answer.get("Failed", [])}
        if refused:
            self.store.outbox.failed(refused)
            for row_id, text in refused.items():
                log.error("SNS refused notification %s (outbox row %d): %s; it stays pending",
                          next(r.message["event_id"] for r in rows if r.id == row_id), row_id, text)
            return self.publish_failed(next(iter(refused.values())), len(refused))
        self.recovered("SNS publish")
        return 0.0 if len(rows) == self.settings.sns_publish_batch else self.settings.sns_poll_interval_secs

    def publish_failed(self, text: str, count: int) -> float:
        return self.failed(f"SNS publish to {self.settings.sns_topic_arn} failed ({text}); "
                           f"{count} notifications stay in the outbox")

    def check_backlog(self, now: float) -> tuple[int, float | None]:
        """Warn when the oldest waiting notification is older than SNS_BACKLOG_WARN_SECS."""
        pending, oldest_age = self.store.outbox.backlog(now)
        if oldest_age is not None and oldest_age >= self.settings.sns_backlog_warn_secs:
            log.warning("SNS outbox backlog: %d notifications waiting, the oldest for %.0fs "
                        "(see GET /stats; SNS_TOPIC_ARN=%s)", pending, oldest_age, self.settings.sns_topic_arn)
        return pending, oldest_age


def start(store, clock: Callable[[], float] = time.time):
    """Run the publisher in this process (every gunicorn worker; the lease picks one)."""
    return Publisher(store).start("sns-outbox", store.settings.sns_poll_interval_secs, clock)
