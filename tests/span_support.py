"""Spans recorded in memory (shared/tracing.py with the SDK's InMemorySpanExporter),
and how a test reads them: by name, by trace, as parent and child."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from corral.shared import tracing


class Recorded:
    def __init__(self, exporter: InMemorySpanExporter):
        self.exporter = exporter

    def all(self, name: str | None = None, trace_id: str | None = None) -> list:
        """The ended spans (named `name`, in trace `trace_id`), in the order they ended."""
        return [span for span in self.exporter.get_finished_spans()
                if (name is None or span.name == name)
                and (trace_id is None or span.context.trace_id == int(trace_id, 16))]

    def one(self, name: str, trace_id: str | None = None):
        spans = self.all(name, trace_id)
        assert len(spans) == 1, [(s.name, s.attributes) for s in self.all()]
        return spans[0]


def hex_ids(span) -> tuple[str, str, str | None]:
    """(trace id, span id, parent span id) of a recorded span, as traceparent spells them."""
    parent = format(span.parent.span_id, "016x") if span.parent is not None else None
    return format(span.context.trace_id, "032x"), format(span.context.span_id, "016x"), parent


def traceparent_ids(traceparent: str) -> tuple[str, str]:
    """(trace id, span id) of a traceparent."""
    _, trace_id, span_id, _ = traceparent.split("-")
    return trace_id, span_id


@contextlib.contextmanager
def recording() -> Iterator[Recorded]:
    """Spans recorded (conftest's `recorded`), as the exporting setup would install them
    but exported at once, in memory; back to no-op spans after."""
    exporter = InMemorySpanExporter()
    tracing.install(tracing.new_provider(SimpleSpanProcessor(exporter)))
    try:
        yield Recorded(exporter)
    finally:
        tracing.uninstall()
