"""The agent's spans (shared/tracing.py) in each job's trace.

`corral.attempt` (one attempt on this node, from its claim to its end; its process's
TRACEPARENT names it) and its child `corral.report` (until the scheduler has the
report), both under the scheduler's `corral.submit`. Nothing here costs anything
without a provider.
"""
from __future__ import annotations

from typing import Any

from opentelemetry.trace import INVALID_SPAN, Span

from corral.shared import states, tracecontext, tracing
from corral.shared.tracecontext import TraceContext

ATTEMPT = "corral.attempt"
REPORT = "corral.report"


def attempt_context(job: dict) -> TraceContext | None:
    """The trace context the attempt of `job` runs with (TRACEPARENT): a span of its own
    under the job's stored one; None for a job stored without one."""
    if not job.get("traceparent"):
        return None
    return tracecontext.attempt_context(job["traceparent"], job.get("tracestate"))


def start_attempt(job: dict, own: TraceContext | None, job_id: str, attempt: int, node_id: str) -> Span:
    """The attempt's span, started now, with the ids of `own` (attempt_context), under
    the job's stored span."""
    if own is None or not tracing.enabled():
        return INVALID_SPAN
    parent = tracecontext.received(job["traceparent"], job.get("tracestate"))
    return tracing.start(ATTEMPT, parent=None if parent.invalid else parent.context, own=own,
                         kind=tracing.CONSUMER, attributes=_ids(job_id, attempt, node_id))


def failed_attempt(job: dict, job_id: str, attempt: int, node_id: str, why: str) -> Span:
    """The span of an attempt that ended as it was taken: it could not start here (it
    asks more than the node allows, the lease lapsed before it was taken). One the
    scheduler ended (reconciled) ends without a report; a service an agent adopts has
    no attempt span of the new agent's."""
    span = start_attempt(job, attempt_context(job), job_id, attempt, node_id)
    end_attempt(span, states.FAILED, -1, why)
    return span


def end_attempt(span: Span, status: str | None, exit_code: int | None, ended_by: str | None = None) -> None:
    """End the attempt's span: `status` as reported (None: not reported, the scheduler
    ended it), an error unless done; `ended_by`: why the agent ended it (jobs.END_*),
    if it did. The description never quotes the job's output (a trace goes elsewhere
    than the job's own report)."""
    attributes: dict[str, Any] = {"corral.status": status or "killed"}
    if exit_code is not None:
        attributes["process.exit.code"] = exit_code
    if ended_by is not None:
        attributes["corral.ended_by"] = ended_by
    error = None if status == states.DONE else ", ".join(
        part for part in (status or "killed", ended_by, None if exit_code is None else f"exit code {exit_code}")
        if part)
    tracing.end(span, error=error, attributes=attributes)


def start_report(attempt_span: Span, job_id: str, attempt: int, status: str) -> Span:
    """The report's span, under the attempt's (none without one)."""
    parent = tracing.context_of(attempt_span)
    if parent is None:
        return INVALID_SPAN
    return tracing.start(REPORT, parent=parent, kind=tracing.CLIENT,
                         attributes={"corral.job_id": job_id, "corral.attempt": attempt, "corral.status": status})


def end_report(span: Span, tries: int, refused: str | None = None) -> None:
    """The scheduler has the report (or refused it: `refused` says why)."""
    tracing.end(span, error=refused and f"refused: {refused}", attributes={"corral.report.tries": tries})


def _ids(job_id: str, attempt: int, node_id: str) -> dict[str, Any]:
    return {"corral.job_id": job_id, "corral.attempt": attempt, "corral.node_id": node_id}
