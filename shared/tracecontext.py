"""The W3C trace context (https://www.w3.org/TR/trace-context/) of a job: the trace
its submit belongs to, kept with the job, and handed to each attempt as
TRACEPARENT and TRACESTATE naming a span of its own, so that a job that calls
other traced services continues the trace.

Headers are parsed by OpenTelemetry's propagator (the API package only: no SDK,
nothing exported, nothing costs more than the parse), as the specification
says: a traceparent that is not valid is ignored and a new trace started
(`Received.invalid` says so, for a metric); a higher version is read for the
fields this version knows; a tracestate that is not valid is dropped and the
traceparent kept. Pure apart from the random ids.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
SAMPLED = "01"


@dataclass(frozen=True)
class TraceContext:
    trace_id: str            # 32 lowercase hex digits, not all zero
    span_id: str             # 16 lowercase hex digits, not all zero: the span it stands for
    flags: str = SAMPLED     # 2 hex digits (01: sampled)
    tracestate: str | None = None

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    def child(self, span_id: str | None = None) -> TraceContext:
        """A span of its own in the same trace (an attempt's), with the same state."""
        return TraceContext(self.trace_id, span_id or new_span_id(), self.flags, self.tracestate)

    def env(self) -> dict[str, str]:
        """The variables a process continues the trace from."""
        return {"TRACEPARENT": self.traceparent, **({"TRACESTATE": self.tracestate} if self.tracestate else {})}


@dataclass(frozen=True)
class Received:
    """What a submit carried: its context (a new trace when none, or none valid, came)
    and whether a traceparent came that was not valid."""

    context: TraceContext
    given: bool
    invalid: bool


def job_fields(got: Received) -> dict[str, str | None]:
    """The trace columns of the jobs one submit makes: a span of their own (the
    submit's) under what the request came with."""
    submit = got.context.child()
    return {"traceparent": submit.traceparent, "tracestate": submit.tracestate}


def attempt_context(traceparent: str, tracestate: str | None) -> TraceContext:
    """The context of one attempt of a job (its TRACEPARENT and TRACESTATE: `env()`): a
    span of its own under the job's."""
    return received(traceparent, tracestate).context.child()


def new_span_id() -> str:
    while True:
        span_id = secrets.token_hex(8)
        if int(span_id, 16):
            return span_id


def new_trace() -> TraceContext:
    while True:
        trace_id = secrets.token_hex(16)
        if int(trace_id, 16):
            return TraceContext(trace_id, new_span_id())


def received(traceparent: str | None, tracestate: str | None = None) -> Received:
    """The trace context of `traceparent` and `tracestate` (header or message attribute
    values, None when absent)."""
    if traceparent is None:
        return Received(new_trace(), given=False, invalid=False)
    carrier = {"traceparent": traceparent, **({"tracestate": tracestate} if tracestate is not None else {})}
    span = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
    if not span.is_valid:
        return Received(new_trace(), given=True, invalid=True)
    state = span.trace_state.to_header() or None
    context = TraceContext(format(span.trace_id, "032x"), format(span.span_id, "016x"),
                           format(span.trace_flags, "02x"), state)
    return Received(context, given=True, invalid=False)
