"""Setting up span export (shared/tracing.py) from OpenTelemetry's standard variables,
and spans that take ids chosen before they start."""
import pytest
from opentelemetry import trace

from corral.shared import tracing
from corral.shared.tracecontext import TraceContext
from span_support import hex_ids

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}


@pytest.mark.parametrize("env, why", [
    (ENDPOINT, None),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, None),
    (dict(ENDPOINT, OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf"), None),
    ({}, "no OTEL_EXPORTER_OTLP_ENDPOINT is set"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, "no OTEL_EXPORTER_OTLP_ENDPOINT is set"),
    (dict(ENDPOINT, OTEL_SDK_DISABLED="TRUE"), "OTEL_SDK_DISABLED is true"),
    (dict(ENDPOINT, OTEL_TRACES_EXPORTER="none"), "OTEL_TRACES_EXPORTER is none"),
    (dict(ENDPOINT, OTEL_TRACES_EXPORTER="otlp,none"), "OTEL_TRACES_EXPORTER is none"),
    (dict(ENDPOINT, OTEL_TRACES_EXPORTER="zipkin"), "OTEL_TRACES_EXPORTER=zipkin: only otlp is supported"),
    (dict(ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL="grpc"), "the OTLP protocol is grpc: only http/protobuf is supported"),
    (dict(ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf"), None),
])
def test_spans_are_exported_only_when_the_standard_variables_ask_for_it(env, why):
    assert tracing.why_not(env) == why


def test_without_an_endpoint_nothing_is_installed_and_spans_are_the_apis_no_op(monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert tracing.setup("corral-test") is False
    assert not tracing.enabled()
    span = tracing.start("x", parent=TraceContext("1" * 32, "2" * 16))
    assert span is trace.INVALID_SPAN and not span.is_recording()
    tracing.end(span, error="ignored")
    tracing.shutdown()  # nothing to flush: returns at once


def test_with_an_endpoint_a_provider_is_installed_named_by_default_or_by_otel_service_name(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: never reached
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    try:
        assert tracing.setup("corral-test") is True and tracing.enabled()
        assert tracing.uninstall().resource.attributes["service.name"] == "corral-test"
        monkeypatch.setenv("OTEL_SERVICE_NAME", "edge-scheduler")
        assert tracing.setup("corral-test") is True
        assert tracing._provider.resource.attributes["service.name"] == "edge-scheduler"
    finally:
        tracing.shutdown(timeout_secs=1.0)  # no span queued: nothing is sent
    assert not tracing.enabled()


def test_a_span_takes_the_ids_chosen_for_it_under_its_parent(recorded):
    parent = TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "01", "congo=t61rcWkgMzE")
    own = parent.child()
    tracing.end(tracing.start("child", parent=parent, own=own))
    root = TraceContext("a" * 32, "b" * 16)
    tracing.end(tracing.start("root", parent=None, own=root), error="it failed")
    tracing.end(tracing.start("random", parent=parent))
    child, made_root, random_one = recorded.all()
    assert hex_ids(child) == (parent.trace_id, own.span_id, parent.span_id)
    assert child.context.trace_state.to_header() == "congo=t61rcWkgMzE"
    assert hex_ids(made_root) == ("a" * 32, "b" * 16, None)
    assert made_root.status.status_code == trace.StatusCode.ERROR and made_root.status.description == "it failed"
    trace_id, span_id, parent_id = hex_ids(random_one)  # ids of its own again once the preset one is used
    assert (trace_id, parent_id) == (parent.trace_id, parent.span_id) and span_id not in (own.span_id, "b" * 16)


def test_a_parent_that_is_not_sampled_records_nothing(recorded):
    parent = TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "00")
    span = tracing.start("unsampled", parent=parent, own=parent.child())
    tracing.end(span)
    assert not span.is_recording() and recorded.all() == []
