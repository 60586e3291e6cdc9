"""The scheduler's spans (shared/tracing.py), in each job's trace:

    corral.submit   the submit (POST /jobs, /jobs/batch, an SQS message, a schedule's
                    run): the span the jobs' stored traceparent names, a child of the
                    context the submit came with (a root when none, or none valid, came)
      corral.place  a job placed on a node: one per placement, so one per attempt

A batch, an array and an SQS message are one submit: all their jobs store the one
submit span. A submit answered from its idempotency key makes a span of its own
(corral.created false) that no job names: the jobs keep the first submit's.
Nothing here costs anything when no provider is installed.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span

from corral.shared import tracecontext, tracing

log = logging.getLogger(__name__)

SUBMIT = "corral.submit"
PLACE = "corral.place"


def submit(got: tracecontext.Received, fields: Mapping[str, Any], source: str,
           kind: trace.SpanKind = tracing.SERVER, attributes: Mapping[str, Any] | None = None) -> Span:
    """The span of a submit whose jobs store `fields` (tracecontext.job_fields of `got`),
    started now; `source`: api, batch, sqs or schedule."""
    if not tracing.enabled():
        return trace.INVALID_SPAN
    own = tracecontext.received(fields["traceparent"], fields.get("tracestate")).context
    parent = got.context if got.given and not got.invalid else None
    return tracing.start(SUBMIT, parent=parent, own=own, kind=kind,
                         attributes={"corral.source": source, **(attributes or {})})


def submitted(span: Span, created: bool, attributes: Mapping[str, Any]) -> None:
    """What a submit made: whether it created its jobs, and which (corral.job_id,
    corral.job_count or corral.array_id)."""
    if span.is_recording():
        span.set_attributes({"corral.created": created, **attributes})


def http_attributes(method: str, route: str) -> dict[str, str]:
    """The semantic attributes of an HTTP server span, as known before the answer."""
    return {"http.request.method": method, "http.route": route, "url.path": route}


def answered(span: Span, status_code: int) -> None:
    """End a request's submit span with its answer's status (an error from 500 on: a
    refusal is the client's, as HTTP server spans count it)."""
    tracing.end(span, error=f"HTTP {status_code}" if status_code >= 500 else None,
                attributes={"http.response.status_code": status_code})


# (job id, stored traceparent, stored tracestate, attempt, node id) of one placement.
Placed = tuple[str, str | None, str | None, int, str]


def placed(placements: Iterable[Placed], started_ns: int) -> None:
    """A corral.place span for each placement, under its job's submit span, from
    `started_ns` to now (after the placement committed). Never raises: the placement
    stands whatever happens to its spans."""
    try:
        for job_id, traceparent, tracestate, attempt, node_id in placements:
            if not traceparent:  # a job older than stored trace contexts
                continue
            parent = tracecontext.received(traceparent, tracestate)
            span = tracing.start(PLACE, parent=None if parent.invalid else parent.context, start_time=started_ns,
                                 attributes={"corral.job_id": job_id, "corral.node_id": node_id,
                                             "corral.attempt": attempt})
            tracing.end(span)
    except Exception:
        log.exception("recording placement spans failed")


def now_ns() -> int:
    """A span's start time (the spans' clock is the wall clock, not the scheduler's)."""
    return time.time_ns()
