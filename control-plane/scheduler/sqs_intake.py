"""Job requests taken from an SQS queue (SQS_URL), as an alternative to POST /jobs.

A leased loop: one process across workers and replicas long-polls the queue, submits
each valid request under an idempotency key (so a message never makes two jobs) and
deletes it after the commit; bad messages go to SQS_DLQ_URL. docs/sqs-sns.md ("What
happens to each message") says what becomes of each. The pure parts (`parse_message`,
`classify`, `dead_letter_attributes`) are apart from the I/O.
"""
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import peewee
from opentelemetry.trace import INVALID_SPAN, Span

from corral.shared import tracecontext, tracing

from corral.server import json_body
from corral.shared.errors import BadRequest, CorralError, TooManyRequests
from corral.server import principals
from corral.server.leased import PacedLoop
from corral.server.leader import LeaseLost

from . import admission, aws_clients, metrics, spans, validation
from .service import Scheduler

log = logging.getLogger(__name__)

LEASE_NAME = "sqs-intake"
KEY_ATTRIBUTES = ("idempotency_key", "Idempotency-Key")
MAX_MESSAGES = 10           # the most one ReceiveMessage returns
MAX_ATTRIBUTES = 10         # the most message attributes SQS accepts on one message
DETAIL_CHARS = 1000

# Why a message never became a job (the `corral_error` attribute in the DLQ).
NOT_JSON = "not_json"
NOT_AN_OBJECT = "not_an_object"
INVALID_JOB_REQUEST = "invalid_job_request"
INVALID_IDEMPOTENCY_KEY = "invalid_idempotency_key"
IDEMPOTENCY_CONFLICT = "idempotency_conflict"
PROCESSING_ERROR = "processing_error"
TEAM_REFUSED = "team_refused"


# ---- pure ---------------------------------------------------------------------

@dataclass(frozen=True)
class Accepted:
    fields: dict            # the job's columns, as JobRequest.columns() gives them, and its trace's
    idempotency_key: str
    trace_invalid: bool = False  # a traceparent attribute came that is not valid (a new trace was started)
    trace: tracecontext.Received | None = field(default=None, compare=False)  # what came (its submit span's parent)


@dataclass(frozen=True)
class Rejected:
    reason: str             # one of the constants above
    detail: str             # for a human


def parse_message(message: dict) -> Accepted | Rejected:
    """A received SQS message as a job request, or why it is not one."""
    try:
        body = json_body.decode(message.get("Body") or "")  # as strictly as POST /jobs
    except json_body.JSONBodyError as exc:
        return Rejected(NOT_JSON, str(exc))
    if not isinstance(body, dict):
        return Rejected(NOT_AN_OBJECT, "the body must be a JSON object: a job request as for POST /jobs")
    try:
        fields = validation.job_request(body)  # exactly as a POST /jobs body
    except CorralError as exc:
        return Rejected(INVALID_JOB_REQUEST, exc.message)
    attributes = message.get("MessageAttributes") or {}
    try:
        key = client_key(attributes)
    except CorralError as exc:
        return Rejected(INVALID_IDEMPOTENCY_KEY, exc.message)
    # The trace context, as the traceparent and tracestate headers of POST /jobs.
    trace = tracecontext.received(*(string_attribute(attributes, name) for name in ("traceparent", "tracestate")))
    return Accepted(dict(fields, **tracecontext.job_fields(trace)), key or f"sqs:{message['MessageId']}",
                    trace.invalid, trace)


def string_attribute(attributes: dict, name: str) -> str | None:
    """A String message attribute's value (None: absent, or of another type)."""
    attribute = attributes.get(name) or {}
    if not str(attribute.get("DataType", "")).startswith("String"):
        return None
    value = attribute.get("StringValue")
    return value if isinstance(value, str) else None


def client_key(attributes: dict) -> str | None:
    """The producer's idempotency key from the message attributes, checked like the HTTP header."""
    for name in KEY_ATTRIBUTES:
        if name in attributes:
            attribute = attributes[name]
            if not str(attribute.get("DataType", "")).startswith("String") or "StringValue" not in attribute:
                raise BadRequest(f"the {name!r} message attribute must be a String")
            return validation.idempotency_key(attribute["StringValue"])
    return None


def classify(exc: Exception) -> str:
    """What to do with a message whose submit raised `exc`: reject, retry, keep for
    later or count against it."""
    if isinstance(exc, TooManyRequests):
        return "later"         # the cluster is full (MAX_PENDING_JOBS): the message is fine, the time is not
    if isinstance(exc, CorralError) and 400 <= exc.status < 500:
        return "reject"        # the request itself is refused: it would be refused every time
    if isinstance(exc, peewee.DatabaseError) and not isinstance(exc, peewee.IntegrityError):
        return "retry"         # our database, not the message: try again, never give up on it
    if isinstance(exc, (peewee.InterfaceError, LeaseLost)):
        return "retry"         # (another replica took the intake over: it will see the message again)
    return "unexpected"


def receive_count(message: dict) -> int:
    try:
        return int(message.get("Attributes", {}).get("ApproximateReceiveCount", 1))
    except (TypeError, ValueError):
        return 1


def dead_letter_attributes(message: dict, rejected: Rejected) -> dict:
    """The message's own attributes (as many as fit) plus why it was rejected."""
    ours = {
        "corral_error": rejected.reason,
        "corral_error_detail": rejected.detail[:DETAIL_CHARS] or rejected.reason,
        "corral_source_message_id": message.get("MessageId") or "unknown",
        "corral_receive_count": str(receive_count(message)),
    }
    attributes = {name: {"DataType": "String", "StringValue": value} for name, value in ours.items()}
    for name, value in (message.get("MessageAttributes") or {}).items():
        if len(attributes) >= MAX_ATTRIBUTES:
            break
        if name not in attributes:
            attributes[name] = {k: v for k, v in value.items()
                                if k in ("DataType", "StringValue", "BinaryValue")}
    return attributes


def dead_letter_request(message: dict, rejected: Rejected, fifo: bool = False) -> dict:
    """The SendMessage arguments (but the queue) for the DLQ: the original body, unchanged, and why."""
    entry = {"MessageBody": message.get("Body") or "", "MessageAttributes": dead_letter_attributes(message, rejected)}
    if fifo:  # a FIFO DLQ needs a group; the source MessageId makes a re-send a duplicate
        entry["MessageGroupId"] = "corral-rejected"
        entry["MessageDeduplicationId"] = message.get("MessageId") or "unknown"
    return entry


@dataclass
class Outcome:
    """What one pass decided for each message of a batch."""

    delete: list = field(default_factory=list)        # committed (or already known): delete
    reject: list = field(default_factory=list)        # (message, Rejected): DLQ or drop, then delete
    retry: list = field(default_factory=list)         # make visible again at once
    later: list = field(default_factory=list)         # make visible again after RETRY_AFTER_SECS
    created: int = 0
    duplicates: int = 0
    database_down: bool = False
    full: bool = False                                # MAX_PENDING_JOBS refused a submit


# ---- the loop -------------------------------------------------------------------

class Intake(PacedLoop):
    """One receive-and-submit pass per `tick(now)`; returns the seconds until the next pass."""

    def __init__(self, store, holder: str | None = None, client_factory=aws_clients.sqs_client,
                 clock: Callable[[], float] = time.time):
        settings = store.settings
        # A pass waits up to SQS_WAIT_TIME_SECS in ReceiveMessage, then submits:
        # the lease must outlast it comfortably.
        lease_ttl = max(30.0, 2 * (settings.sqs_wait_time_secs + settings.aws_read_timeout_secs))
        super().__init__(store, LEASE_NAME, lease_ttl, holder, max_backoff=settings.sqs_backoff_cap_secs)
        self.idle = min(5.0, lease_ttl / 4)
        self.scheduler = Scheduler(self.store)
        self.clock = clock  # a receive may wait: jobs are created at the time it returned
        self.settings = settings
        self.client_factory = client_factory
        self.client = None
        self.doing = f"taking job requests from {settings.sqs_url}"

    def taken(self, token: int) -> None:
        log.info("%s (dead-letter queue: %s; lease token %d)", self.doing, self.settings.sqs_dlq_url or "none", token)

    def one_pass(self, now: float) -> float:
        try:
            messages = self.receive()
            if not messages:
                return self.succeeded()
            outcome = self.handle(messages, self.clock())
            self.count(sqs_received=len(messages), sqs_jobs_created=outcome.created,
                       sqs_duplicates=outcome.duplicates, sqs_rejected=len(outcome.reject))
            self.settle(outcome)
        except aws_clients.AWS_ERRORS as exc:
            return self.intake_failed(aws_clients.error_text(exc))
        if outcome.database_down:
            return self.intake_failed("the database is unavailable")
        if outcome.full:
            return self.intake_failed(f"the cluster holds {admission.SETTING} pending jobs")
        return self.succeeded()

    def receive(self) -> list[dict]:
        if self.client is None:
            self.client = self.client_factory(self.settings)
        answer = self.client.receive_message(
            QueueUrl=self.settings.sqs_url, MaxNumberOfMessages=MAX_MESSAGES,
            WaitTimeSeconds=self.settings.sqs_wait_time_secs,
            VisibilityTimeout=self.settings.sqs_visibility_timeout_secs,
            MessageSystemAttributeNames=["ApproximateReceiveCount"], MessageAttributeNames=["All"])
        return answer.get("Messages", [])

    def handle(self, messages: list[dict], now: float) -> Outcome:
        """Submit each message's job (each commit is its own transaction); decide the rest.
        The key is the message's `idempotency_key` (or `Idempotency-Key`) attribute, else
        `sqs:<MessageId>`. A message refused at MAX_PENDING_JOBS goes back with the rest of
        its batch (`later`), never to the DLQ nor counted against SQS_MAX_RECEIVES; a
        database error makes it visible again at once, any other error too until it was
        received SQS_MAX_RECEIVES times, then it is rejected."""
        outcome = Outcome()
        for message in messages:
            if outcome.database_down:
                outcome.retry.append(message)
                continue
            if outcome.full:  # the next ones would be refused too
                outcome.later.append(message)
                continue
            parsed = parse_message(message)
            if isinstance(parsed, Rejected):
                outcome.reject.append((message, parsed))
                continue
            refusal = self.attribute(parsed.fields)
            if refusal is not None:
                outcome.reject.append((message, refusal))
                continue
            if parsed.trace_invalid:
                metrics.trace_context_invalid("sqs")
            span = self.submit_span(message, parsed)
            try:
                if parsed.fields.get("array") is not None:
                    array, _, _, created = self.scheduler.submit_array(parsed.fields, now, parsed.idempotency_key)
                    what = f"array-{array.id} ({array.count} jobs)"
                    spans.submitted(span, created, {"corral.array_id": f"array-{array.id}",
                                                    "corral.job_count": array.count})
                else:
                    job, created = self.scheduler.submit(parsed.fields, now, parsed.idempotency_key)
                    what = job.job_id
                    spans.submitted(span, created, {"corral.job_id": job.job_id, "corral.job_count": 1})
            except Exception as exc:  # noqa: BLE001 -- classified below; nothing escapes the pass
                tracing.end(span, error=f"not submitted: {type(exc).__name__}")
                self.submit_failed(message, exc, outcome)
                continue
            tracing.end(span)
            outcome.delete.append(message)
            if created:
                outcome.created += 1
                log.info("SQS message %s: created %s", message["MessageId"], what)
            else:
                outcome.duplicates += 1
                log.info("SQS message %s (received %d times): %s already exists for key %r; not created again",
                         message["MessageId"], receive_count(message), what, parsed.idempotency_key)
        return outcome

    def attribute(self, fields: dict) -> Rejected | None:
        """Give a message's jobs their team and submitter (SQS_USER, and SQS_TEAM unless the
        message names another team of that user's), in `fields`; or why not."""
        user, team = self.settings.sqs_user, fields.get("team") or self.settings.sqs_team
        if team != self.settings.sqs_team:
            roles = self.store.accounts.roles_of(user)
            if roles is None or not (roles[0] == principals.ADMIN or team in roles[1]):
                return Rejected(TEAM_REFUSED, f"SQS_USER {user!r} is not a member of team {team!r}")
            try:
                self.store.accounts.require_teams({team})
            except CorralError as exc:
                return Rejected(TEAM_REFUSED, exc.message)
        fields.update(team=team, submitted_by=user)
        return None

    @staticmethod
    def submit_span(message: dict, parsed: Accepted) -> Span:
        """The corral.submit span of a message's jobs (spans.py): a consumer's, under the
        trace context the message came with."""
        if parsed.trace is None:
            return INVALID_SPAN
        return spans.submit(parsed.trace, parsed.fields, "sqs", kind=tracing.CONSUMER, attributes={
            "messaging.system": "aws_sqs", "messaging.operation.type": "process",
            "messaging.message.id": message["MessageId"]})

    def submit_failed(self, message: dict, exc: Exception, outcome: Outcome) -> None:
        kind = classify(exc)
        if kind == "reject":
            reason = IDEMPOTENCY_CONFLICT if exc.status == 409 else INVALID_JOB_REQUEST
            outcome.reject.append((message, Rejected(reason, exc.message)))
        elif kind == "later":
            log.warning("SQS message %s: %s; it goes back to the queue", message["MessageId"], exc)
            outcome.full = True
            outcome.later.append(message)
        elif kind == "retry":
            log.warning("SQS message %s: database error (%s); it goes back to the queue", message["MessageId"], exc)
            outcome.database_down = True
            outcome.retry.append(message)
        elif receive_count(message) >= self.settings.sqs_max_receives:
            log.exception("SQS message %s failed on its receive number %d; giving up on it",
                          message["MessageId"], receive_count(message))
            outcome.reject.append((message, Rejected(PROCESSING_ERROR, f"{type(exc).__name__}: {exc}")))
        else:
            log.exception("SQS message %s failed (receive number %d); it goes back to the queue",
                          message["MessageId"], receive_count(message))
            outcome.retry.append(message)

    def settle(self, outcome: Outcome) -> None:
        """Delete what is committed, dead-letter or drop the rejected, release the retries."""
        self.delete(outcome.delete)
        dead_lettered = dropped = 0
        if outcome.reject and self.settings.sqs_dlq_url:
            sent = self.dead_letter(outcome.reject)
            self.delete(sent)
            dead_lettered = len(sent)
        elif outcome.reject:
            for message, rejected in outcome.reject:
                log.error("SQS message %s is not a job request (%s: %s); deleted (no SQS_DLQ_URL). Body: %r",
                          message["MessageId"], rejected.reason, rejected.detail, (message.get("Body") or "")[:200])
            self.delete([message for message, _ in outcome.reject])
            dropped = len(outcome.reject)
        if outcome.retry:
            self.release(outcome.retry)
        if outcome.later:
            self.release(outcome.later, admission.RETRY_AFTER_SECS)
        self.count(sqs_dead_lettered=dead_lettered, sqs_dropped=dropped,
                   sqs_requeued=len(outcome.retry) + len(outcome.later))

    def count(self, **counts: int) -> None:
        metrics.sqs_counted(counts)  # Prometheus first: it needs no database
        try:
            self.store.stats.bump(**counts)
        except peewee.PeeweeException as exc:  # only statistics: never worth a redelivery
            log.warning("could not update the SQS counters: %s", exc)

    def dead_letter(self, rejected: list) -> list[dict]:
        """Send the rejected messages to the DLQ, one call each (a body may be near the size
        limit); the ones SQS took, to delete from the source queue."""
        fifo = self.settings.sqs_dlq_url.endswith(".fifo")
        sent = []
        for message, why in rejected:
            try:
                self.client.send_message(QueueUrl=self.settings.sqs_dlq_url, **dead_letter_request(message, why, fifo))
            except aws_clients.ClientError as exc:  # refused (too large, access denied): try again later
                log.error("could not move SQS message %s (%s: %s) to the dead-letter queue (%s); it stays in "
                          "the queue", message["MessageId"], why.reason, why.detail, aws_clients.error_text(exc))
                continue
            log.warning("SQS message %s is not a job request (%s: %s); moved to the dead-letter queue",
                        message["MessageId"], why.reason, why.detail)
            sent.append(message)
        return sent

    def delete(self, messages: list[dict]) -> None:
        if not messages:
            return
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
        answer = self.client.delete_message_batch(QueueUrl=self.settings.sqs_url, Entries=entries)
        for bad in answer.get("Failed", []):
            # The job is committed: when the message comes back, its key finds that job.
            log.warning("could not delete SQS message %s (%s: %s); it will be received again and not "
                        "create a second job", messages[int(bad["Id"])]["MessageId"], bad.get("Code"),
                        bad.get("Message"))

    def release(self, messages: list[dict], after_secs: int = 0) -> None:
        """Make the messages visible again `after_secs` from now."""
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": after_secs}
                   for i, m in enumerate(messages)]
        try:
            answer = self.client.change_message_visibility_batch(QueueUrl=self.settings.sqs_url, Entries=entries)
        except aws_clients.AWS_ERRORS as exc:
            log.warning("could not make %d SQS messages visible again (%s); they return after "
                        "SQS_VISIBILITY_TIMEOUT_SECS", len(messages), aws_clients.error_text(exc))
            return
        if answer.get("Failed"):
            log.warning("could not make %d SQS messages visible again; they return after "
                        "SQS_VISIBILITY_TIMEOUT_SECS", len(answer["Failed"]))

    def succeeded(self) -> float:
        self.recovered("SQS intake")
        return 0.0  # the long poll paces the loop

    def intake_failed(self, text: str) -> float:
        return self.failed(f"SQS intake from {self.settings.sqs_url} failed ({text})")


def start(store, clock: Callable[[], float] = time.time):
    """Run the intake in this process (every gunicorn worker; the lease picks one)."""
    # The thread may sit in a long poll: do not hold a stopping worker up for it.
    return Intake(store, clock=clock).start("sqs-intake", 1.0, clock, join_timeout=1.0)
