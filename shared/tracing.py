"""Exporting spans (OpenTelemetry, over OTLP/HTTP) set up from OpenTelemetry's own
variables (docs/operations.md, "Tracing"), and the one way Corral's code starts a span.

Nothing is installed unless `why_not` (pure) finds the SDK, an endpoint and nothing
turning it off; `start` then returns the API's no-op span, so spans cost nothing.
A span's ids can be chosen before it starts (`own`, ids from tracecontext.py): a job
keeps its submit's traceparent, an attempt's process gets its span's as TRACEPARENT.
"""
from __future__ import annotations

import contextvars
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags, \
    TraceState

from corral.shared.tracecontext import TraceContext

log = logging.getLogger(__name__)

# How long a stopping process waits for its queued spans to be exported.
SHUTDOWN_SECS = 5.0
HTTP_PROTOBUF = "http/protobuf"
NO_SDK = ("an OTLP endpoint is set but the OpenTelemetry SDK is not installed (pip install 'corral[otel]'): "
          "not exporting spans")

_NOOP = trace.NoOpTracer()
_tracer: trace.Tracer = _NOOP
_provider: Any = None  # the SDK's TracerProvider while one is installed
# (trace id or None, span id) the next span started in this context takes.
_preset: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("corral_span_ids", default=None)

INTERNAL, SERVER, CLIENT, CONSUMER = SpanKind.INTERNAL, SpanKind.SERVER, SpanKind.CLIENT, SpanKind.CONSUMER


def why_not(env: Mapping[str, str]) -> str | None:
    """None when these variables ask for spans to be exported; else why not."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "OTEL_SDK_DISABLED is true"
    exporter = env.get("OTEL_TRACES_EXPORTER", "")
    exporters = {name.strip().lower() for name in exporter.split(",") if name.strip()}
    if "none" in exporters:
        return "OTEL_TRACES_EXPORTER is none"
    if exporters - {"otlp"}:
        return f"OTEL_TRACES_EXPORTER={exporter}: only otlp is supported"
    if not (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
            or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()):
        return "no OTEL_EXPORTER_OTLP_ENDPOINT is set"
    # The traces' own variable wins over the general one, as for the endpoint.
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "").strip()
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip() or HTTP_PROTOBUF)
    if protocol != HTTP_PROTOBUF:
        return f"the OTLP protocol is {protocol}: only {HTTP_PROTOBUF} is supported"
    return None


def log_plan(env: Mapping[str, str], default_service: str) -> None:
    """Say once, at a server's start (before its workers set up), whether spans will be
    exported: a configuration that asks for them but cannot have them is a warning."""
    why = why_not(env)
    if why is None and not sdk_installed():
        log.warning(NO_SDK)
    elif why is None:
        log.info("each worker exports spans as %s over OTLP/HTTP",
                 env.get("OTEL_SERVICE_NAME", "").strip() or default_service)
    elif "ENDPOINT" not in why:
        log.info("not exporting spans: %s", why)


def sdk_installed() -> bool:
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


def setup(default_service: str) -> bool:
    """Install the exporting provider when the environment asks for it (module
    docstring); whether it did. Call it in the process that makes the spans, after
    any fork: the BatchSpanProcessor's thread does not survive one (a gunicorn server
    sets up in each worker, control-plane/server/serve.py)."""
    why = why_not(os.environ)
    if why is not None:
        log.debug("not exporting spans: %s", why)
        return False
    if not sdk_installed():
        log.warning(NO_SDK)
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    # OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES) wins over the default.
    named = bool(os.environ.get("OTEL_SERVICE_NAME", "").strip()) or \
        "service.name" in OTELResourceDetector().detect().attributes
    resource = Resource.create({} if named else {"service.name": default_service})
    install(new_provider(BatchSpanProcessor(OTLPSpanExporter()), resource))
    log.info("exporting spans as %s", resource.attributes.get("service.name"))
    return True


def new_provider(processor: Any, resource: Any = None) -> Any:
    """A TracerProvider sending spans to `processor` that takes preset ids (`start`);
    the sampler is the SDK's (OTEL_TRACES_SAMPLER; parent-based by default)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class PresetIds(RandomIdGenerator):
        """The SDK's random ids, but for a span `start` was given ids for (the SDK asks
        for a span id once per span, and for a trace id for a root only). Made here: the
        SDK is imported only where spans are exported."""

        def generate_span_id(self) -> int:
            preset = _preset.get()
            return super().generate_span_id() if preset is None else preset[1]

        def generate_trace_id(self) -> int:
            preset = _preset.get()
            return super().generate_trace_id() if preset is None else preset[0]

    provider = TracerProvider(resource=resource, id_generator=PresetIds(), shutdown_on_exit=False)
    provider.add_span_processor(processor)
    return provider


def install(provider: Any) -> None:
    """Make `provider` (new_provider) the one spans go to (setup; tests)."""
    global _tracer, _provider
    _provider = provider
    _tracer = provider.get_tracer("corral")


def uninstall() -> Any:
    """Back to no-op spans; the provider that was installed (None: none)."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, _NOOP
    return provider


def enabled() -> bool:
    """Whether spans are recorded (a provider is installed)."""
    return _provider is not None


def shutdown(timeout_secs: float = SHUTDOWN_SECS) -> None:
    """Export the spans still queued, waiting at most `timeout_secs` (a collector that
    does not answer must not hold up a stop), and stop exporting."""
    provider = uninstall()
    if provider is None:
        return
    done = threading.Thread(target=provider.shutdown, name="tracing-shutdown", daemon=True)
    done.start()
    done.join(timeout_secs)
    if done.is_alive():
        log.warning("the queued spans were not exported within %.0fs; dropping them", timeout_secs)


def start(name: str, *, parent: TraceContext | None, own: TraceContext | None = None,
          kind: SpanKind = INTERNAL, attributes: Mapping[str, Any] | None = None,
          start_time: int | None = None) -> Span:
    """A span under `parent` (None: the root of a trace), with the ids of `own` when
    given (chosen before: a root takes its trace id too). End it (`end`). The API's
    no-op span when nothing is installed."""
    if _provider is None:
        return trace.INVALID_SPAN
    context = trace.set_span_in_context(NonRecordingSpan(span_context(parent))) if parent else Context()
    token = _preset.set((int(own.trace_id, 16), int(own.span_id, 16)) if own is not None else None)
    try:
        return _tracer.start_span(name, context, kind, attributes, start_time=start_time)
    finally:
        _preset.reset(token)


def end(span: Span, error: str | None = None, attributes: Mapping[str, Any] | None = None) -> None:
    """End `span`, with status ERROR and `error` as its description when given."""
    if not span.is_recording():
        return
    if attributes:
        span.set_attributes(attributes)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


def span_context(context: TraceContext) -> SpanContext:
    """The OpenTelemetry span context `context` stands for (a remote one: it was
    received or stored)."""
    state = TraceState.from_header([context.tracestate]) if context.tracestate else None
    return SpanContext(int(context.trace_id, 16), int(context.span_id, 16), is_remote=True,
                       trace_flags=TraceFlags(int(context.flags, 16)), trace_state=state)


def context_of(span: Span) -> TraceContext | None:
    """The TraceContext of a span, ended or not (to parent spans started later); None
    for the no-op span."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return TraceContext(format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"), format(ctx.trace_flags, "02x"),
                        ctx.trace_state.to_header() or None)
