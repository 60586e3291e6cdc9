"""The W3C trace context a job is submitted with (shared/tracecontext.py), against the
specification's rules."""
import pytest

from corral.shared.tracecontext import TraceContext, new_trace, received

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{PARENT}-01"
STATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"


def test_a_valid_traceparent_and_tracestate_are_kept():
    got = received(VALID, STATE)
    assert (got.given, got.invalid) == (True, False)
    assert got.context == TraceContext(TRACE, PARENT, "01", STATE)
    assert got.context.traceparent == VALID
    assert received(f"00-{TRACE}-{PARENT}-00").context.flags == "00"  # not sampled: kept as said


def test_a_higher_version_is_read_for_the_fields_it_knows():
    got = received(f"cc-{TRACE}-{PARENT}-01-what-the-future-adds")
    assert not got.invalid and got.context.traceparent == VALID


@pytest.mark.parametrize("traceparent", [
    f"ff-{TRACE}-{PARENT}-01",                      # version ff is forbidden
    f"00-{'0' * 32}-{PARENT}-01",                   # all-zero trace id
    f"00-{TRACE}-{'0' * 16}-01",                    # all-zero parent id
    f"00-{TRACE.upper()}-{PARENT}-01",              # upper case
    f"00-{TRACE}-{PARENT}-01-extra",                # version 00 has exactly four fields
    f"00-{TRACE[:-1]}-{PARENT}-01",                 # short trace id
    "", "garbage", "00-xyz", "\udcff",
])
def test_an_invalid_traceparent_is_ignored_and_a_new_trace_started(traceparent):
    got = received(traceparent, STATE)
    assert (got.given, got.invalid) == (True, True)
    assert got.context.trace_id != TRACE and got.context.tracestate is None
    assert len(got.context.trace_id) == 32 and int(got.context.trace_id, 16)


def test_an_invalid_tracestate_is_dropped_and_the_traceparent_kept():
    got = received(VALID, "not a list member,,=,")
    assert not got.invalid and got.context.traceparent == VALID and got.context.tracestate is None


def test_without_a_traceparent_a_new_trace_starts():
    got = received(None)
    assert (got.given, got.invalid) == (False, False)
    assert got.context.trace_id != new_trace().trace_id  # random, not fixed


def test_an_attempt_gets_a_span_of_its_own_in_the_same_trace():
    job = received(VALID, STATE).context
    attempt = job.child()
    assert attempt.trace_id == TRACE and attempt.span_id not in (PARENT, "0" * 16) and len(attempt.span_id) == 16
    assert attempt.env() == {"TRACEPARENT": f"00-{TRACE}-{attempt.span_id}-01", "TRACESTATE": STATE}
    assert job.child().span_id != attempt.span_id
    assert "TRACESTATE" not in received(VALID).context.child().env()
