"""The agent's outbox: the reports of ended jobs, kept until the scheduler has them.

A report is delivered once the scheduler answered it: 200, or a refusal that
retrying cannot change (a 4xx: the attempt is stale or unknown), which drops it.
An unreachable scheduler keeps it, retried with backoff per report (1 s doubling
to 30 s). Several due reports go in one `POST /jobs/reports` (at most
REPORT_BATCH_MAX and about REPORT_BATCH_BYTES a call); the first batch may carry a
claim for the slots the reports free, whose jobs go to the caller's `on_claimed`.
A report refused as too large (413) is sent once more with the last
SHRUNK_OUTPUT_CHARS of its output: less output rather than a lost outcome.

Only the agent's work loop (and its shutdown, after the loop) adds and flushes.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from opentelemetry.trace import INVALID_SPAN, Span

from corral.shared import states
from corral.shared.backoff import Backoff
from corral.shared.clients import Rejected, SchedulerClient, Unreachable, split_batches

from . import spans

log = logging.getLogger(__name__)

# Reports sent in one POST /jobs/reports: at most this many, and about this many bytes.
REPORT_BATCH_MAX = 100
REPORT_BATCH_BYTES = 1024 * 1024
# A report refused as too large (413) is sent once more with this much output kept.
SHRUNK_OUTPUT_CHARS = 4096


@dataclass
class PendingReport:
    job_id: str
    attempt: int
    status: str
    result: dict
    next_try: float = 0.0
    tries: int = 0
    shrunk: bool = False
    backoff: Backoff = field(default_factory=lambda: Backoff(1.0, 30.0))
    span: Span = INVALID_SPAN  # corral.report (spans.py), ended once the scheduler has it


class Outbox:
    def __init__(self, node_id: str, scheduler: SchedulerClient, clock: Callable[[], float],
                 on_claimed: Callable[[list, float], object], on_claim_lost: Callable[[], object]):
        """`on_claimed(jobs, sent_at)`: the jobs a riding claim got (sent at `sent_at`);
        `on_claim_lost()`: a riding claim's answer never came (it may have taken jobs)."""
        self.node_id = node_id
        self.scheduler = scheduler
        self._clock = clock
        self._on_claimed = on_claimed
        self._on_claim_lost = on_claim_lost
        self._pending: list[PendingReport] = []

    def __len__(self) -> int:
        return len(self._pending)

    def __iter__(self) -> Iterator[PendingReport]:
        return iter(list(self._pending))

    def add(self, job_id: str, attempt: int, status: str, attempt_span: Span = INVALID_SPAN, **result) -> None:
        """A report to deliver; `attempt_span`: the attempt's span, its span's parent."""
        self._pending.append(PendingReport(job_id, attempt, status, result,
                                           span=spans.start_report(attempt_span, job_id, attempt, status)))

    def add_failed(self, job_id: str, attempt: int, exit_code: int, stderr: str, **extra) -> None:
        """A job that ended without a process of its own (it never started)."""
        self.add(job_id, attempt, states.FAILED, exit_code=exit_code, stdout="", stderr=stderr,
                 oom_killed=False, peak_memory_bytes=None, cpu_seconds=None, **extra)

    def flush(self, force: bool = False, claim: Callable[[], dict | None] | None = None) -> int:
        """Send the reports that are due (all of them with force); returns how many
        are still undelivered. Unreachable: kept and retried with backoff.
        Rejected: the attempt is stale or unknown, nothing to retry; dropped.
        Several due reports go in one POST /jobs/reports (one by one when the
        scheduler refuses the batch: too large, say). `claim()`: the claim the batch
        carries for the free slots (None: none)."""
        now = self._clock()
        due = [report for report in self._pending if force or report.next_try <= now]
        riding = claim() if claim is not None and due else None
        if len(due) >= 2 or riding is not None:
            rest = self._flush_batches(due, riding)
            if rest is None:
                return len(self._pending)
            due = rest
        for report in due:
            refused = None
            try:
                self._send(report)
            except Unreachable as exc:
                delay = self._retry_later(report)
                log.warning("could not deliver the %s report of job %s attempt %s (try %d): %s; "
                            "retrying in %.1fs", report.status, report.job_id, report.attempt,
                            report.tries, exc, delay)
                break  # the scheduler is down or slow: one timeout per pass is enough
            except Rejected as exc:
                log.warning("the scheduler refused the %s report of job %s attempt %s (%s); "
                            "dropping it", report.status, report.job_id, report.attempt, exc)
                refused = str(exc)
            self._settled(report, refused)
        return len(self._pending)

    def _settled(self, report: PendingReport, refused: str | None = None) -> None:
        """The scheduler has the report, or refused it (`refused`): it leaves the outbox."""
        self._pending.remove(report)
        spans.end_report(report.span, report.tries + 1, refused)

    def _retry_later(self, report: PendingReport) -> float:
        report.tries += 1
        delay = report.backoff.next()
        report.next_try = self._clock() + delay
        return delay

    def _flush_batches(self, due: list[PendingReport], claim: dict | None = None) -> list[PendingReport] | None:
        """Send `due` in batches (the first one carrying `claim`). Returns the reports
        still to send one by one, or None when the scheduler could not be reached (they
        wait for their next try)."""
        items = [(report, {"job_id": report.job_id, "node_id": self.node_id, "attempt": report.attempt,
                           "status": report.status, **report.result}) for report in due]
        chunks = split_batches(items, lambda entry: entry[1], REPORT_BATCH_MAX, REPORT_BATCH_BYTES)
        for index, chunk in enumerate(chunks):
            rest = [report for c in chunks[index:] for report, _ in c]
            try:
                sent_at = self._clock()
                results, claimed = self.scheduler.report_and_claim([item for _, item in chunk],
                                                                   claim if index == 0 else None)
                self._on_claimed(claimed, sent_at)
            except Unreachable as exc:
                if claim is not None and index == 0:
                    self._on_claim_lost()
                delay = 0.0
                for report, _ in chunk:
                    delay = self._retry_later(report)
                log.warning("could not deliver %d reports: %s; retrying in %.1fs", len(chunk), exc, delay)
                return None
            except Rejected as exc:  # too large (413), say: one by one handles each case
                log.warning("the scheduler refused a batch of %d reports (%s); sending them one by one",
                            len(chunk), exc)
                return rest
            except ValueError as exc:
                log.warning("%s; sending the reports one by one", exc)
                return rest
            for (report, _), result in zip(chunk, results):
                code = result["code"]
                if code == 200 or 400 <= code < 500:
                    if code != 200:
                        log.warning("the scheduler refused the %s report of job %s attempt %s (%s: %s); "
                                    "dropping it", report.status, report.job_id, report.attempt, code,
                                    result.get("error"))
                    self._settled(report, None if code == 200 else f"{code}: {result.get('error')}")
                else:
                    self._retry_later(report)
        return []

    def _send(self, report: PendingReport) -> None:
        try:
            self.scheduler.report(report.job_id, self.node_id, report.attempt, report.status,
                                  **report.result)
        except Rejected as exc:
            if exc.status != 413 or report.shrunk:
                raise
            # Too large for the scheduler: keep less output rather than lose the outcome.
            report.shrunk = True
            for name in ("stdout", "stderr"):
                if isinstance(report.result.get(name), str):
                    report.result[name] = report.result[name][-SHRUNK_OUTPUT_CHARS:]
            log.warning("the %s report of job %s attempt %s was too large; sending the last "
                        "%d characters of output", report.status, report.job_id, report.attempt,
                        SHRUNK_OUTPUT_CHARS)
            self.scheduler.report(report.job_id, self.node_id, report.attempt, report.status,
                                  **report.result)
