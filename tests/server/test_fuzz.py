"""Fuzzing the request-body path of the routes that store what clients send, with
Hypothesis, through Flask's test client on real SQLite files.

Bodies are a route's valid body with a value or key replaced, JSON-ish values shaped
like the route's body (its field names, nested values of every type), either of them
with bytes spliced in, and arbitrary bytes. Their strings hold any character at all,
lone surrogates and control characters included, encoded the ways a client might:
JSON escapes (`\\ud800`) or raw UTF-8 (a surrogate as the bytes CESU-8 would use),
with NaN and Infinity where a float is one. The property is hostile.problem's: never
a 5xx, a JSON error for a 4xx, and a 4xx stored nothing.

Derandomized and without an example database, so CI runs the same examples every
time: 910 in all, about 5 seconds on a 2-core machine.
"""
import json
import operator
from functools import reduce

import hypothesis
import pytest
from hypothesis import strategies as st

import hostile
from corral.registry.contract import NodeRegistration, ServiceRegistration
from corral.scheduler.contract import ClaimRequest, JobRequest, OutputItem, StatusReport

JOB_FIELDS = tuple(JobRequest.model_fields)
REPORT_FIELDS = tuple(StatusReport.model_fields)
CLAIM_FIELDS = tuple(ClaimRequest.model_fields)
OUTPUT_FIELDS = tuple(OutputItem.model_fields)
NODE_FIELDS = tuple(NodeRegistration.model_fields)
SERVICE_FIELDS = tuple(ServiceRegistration.model_fields)

# Examples per route: many of valid bodies made hostile (those reach the database
# writes), fewer of the other kinds (refused early); 910 in all.
MUTATED_EXAMPLES, OTHER_EXAMPLES = 80, 25


def fuzz_settings(examples: int) -> hypothesis.settings:
    return hypothesis.settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                               suppress_health_check=list(hypothesis.HealthCheck), print_blob=False)


ANY_TEXT = hostile.any_text()
# Values a field could be given: well-formed ones now and then, so that some requests
# get past the type checks into each route's deeper checks and its database writes.
PLAUSIBLE = st.sampled_from(["true", "echo hi", "node-1", "job-1", "job-2", "running", "done", "failed",
                             "10.0.0.1", "web", "run", "service", 0, 1, 2, 8080, 64, True, False, None,
                             {"A": "b"}, {"memory_mb": 64, "cpu_percent": 50}])
SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-(1 << 80), max_value=1 << 80)
           | st.floats() | ANY_TEXT)
JSONISH = st.recursive(SCALARS | PLAUSIBLE, lambda children: (st.lists(children, max_size=3)
                                                             | st.dictionaries(ANY_TEXT, children, max_size=3)),
                       max_leaves=8)


def shaped(fields) -> st.SearchStrategy[dict]:
    """An object with some of `fields` (and now and then another key), any values."""
    return st.dictionaries(st.sampled_from(sorted(fields)) | ANY_TEXT, PLAUSIBLE | JSONISH, max_size=len(fields))


def batch(name: str, item: st.SearchStrategy, **extra) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({name: st.lists(item, max_size=3) | JSONISH}, optional=extra)


@st.composite
def mutated(draw, template: dict) -> dict:
    """The route's valid body with one or two of its values (mostly) or keys, at any
    depth, replaced: a string by other text, anything else by text or any JSON-ish value.
    What is left valid carries the replacement past the route's other checks, to its
    database write."""
    body = template
    for _ in range(draw(st.integers(1, 2))):
        places = list(hostile.positions(body))
        values = [place for place in places if place[0] == "value"]
        position = draw(st.sampled_from(values) | st.sampled_from(values) | st.sampled_from(places))
        kind, path, *_ = position
        was_text = kind == "key" or isinstance(reduce(operator.getitem, path, body), str)
        body = hostile.replace_at(body, position, draw(ANY_TEXT if was_text else ANY_TEXT | JSONISH))
    return body


# (service, endpoint, path): each route that stores what its body says.
ROUTES = [
    ("scheduler", "submit", "/jobs"),
    ("scheduler", "submit_batch", "/jobs/batch"),
    ("scheduler", "report_batch", "/jobs/reports"),
    ("scheduler", "live_output", "/jobs/output"),
    ("scheduler", "claim", "/nodes/node-1/claim"),
    ("registry", "register_node", "/nodes"),
    ("registry", "register_service", "/services"),
]
SHAPES = {
    "submit": shaped(JOB_FIELDS),
    "submit_batch": batch("jobs", shaped(JOB_FIELDS)),
    "report_batch": batch("reports", shaped(REPORT_FIELDS + ("job_id",)), claim=shaped(CLAIM_FIELDS + ("node_id",))),
    "live_output": batch("outputs", shaped(OUTPUT_FIELDS)),
    "claim": shaped(CLAIM_FIELDS),
    "register_node": shaped(NODE_FIELDS),
    "register_service": shaped(SERVICE_FIELDS),
}


@st.composite
def encoded(draw, values: st.SearchStrategy) -> bytes:
    """A value as a client might send it: escaped or raw UTF-8 (lone surrogates as the
    bytes CESU-8 would use), NaN and Infinity written out."""
    text = json.dumps(draw(values), ensure_ascii=draw(st.booleans()), allow_nan=True)
    return text.encode("utf-8", "surrogatepass")


@st.composite
def damaged(draw, values: st.SearchStrategy) -> bytes:
    """An encoded value with arbitrary bytes put in (or over) it somewhere."""
    raw = draw(encoded(values))
    at = draw(st.integers(0, len(raw)))
    cut = draw(st.integers(0, 3))
    return raw[:at] + draw(st.binary(max_size=6)) + raw[at + cut:]


def fuzz_route(tmp_path, service: str, path: str, bodies: st.SearchStrategy[bytes], examples: int) -> None:
    svc = getattr(hostile, service)(tmp_path)
    client = svc.client

    @fuzz_settings(examples)
    @hypothesis.given(data=bodies)
    def post(data: bytes) -> None:
        before = svc.stored()
        response = client.post(path, data=data, content_type="application/json")
        trouble = hostile.problem(response, "POST", before, svc.stored())
        assert trouble is None, f"POST {path} {data[:300]!r}: {trouble}"

    post()


IDS = [f"{service} {path}" for service, _, path in ROUTES]


@pytest.mark.slow
@pytest.mark.parametrize("service, endpoint, path", ROUTES, ids=IDS)
def test_valid_bodies_made_hostile(tmp_path, service, endpoint, path):
    fuzz_route(tmp_path, service, path, encoded(mutated(hostile.VALID_BODIES[service, endpoint])), MUTATED_EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("service, endpoint, path", ROUTES, ids=IDS)
def test_any_values_in_the_route_s_fields(tmp_path, service, endpoint, path):
    fuzz_route(tmp_path, service, path, encoded(SHAPES[endpoint]), OTHER_EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("service, endpoint, path", ROUTES, ids=IDS)
def test_damaged_and_arbitrary_bytes(tmp_path, service, endpoint, path):
    valid = hostile.VALID_BODIES[service, endpoint]
    bodies = damaged(mutated(valid) | SHAPES[endpoint]) | st.binary(max_size=64)
    fuzz_route(tmp_path, service, path, bodies, OTHER_EXAMPLES)
