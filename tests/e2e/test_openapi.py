"""The OpenAPI documents are true of the services.

- Every route each Flask app has is documented (and nothing else is), so a
  route added without documentation fails here.
- Schemathesis fuzzes each live service (gunicorn, real SQLite) from its own
  /openapi.json and checks every answer against the document: no 5xx, only
  documented status codes, content types, headers and bodies. Some of the
  strings it draws are swapped for text with lone surrogates and control
  characters, which it never draws itself.

The registry and the scheduler run as one cluster, so nodes that the registry
fuzzing registers are synced by the scheduler and jobs get placed on them.
"""
import json
import re
from urllib.parse import parse_qsl, urlsplit

import hypothesis
import hypothesis.errors
import pytest
import requests
import schemathesis
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.generation.case import Case
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

import hostile
from cluster import Cluster
from corral.registry import openapi as registry_openapi
from corral.scheduler import openapi as scheduler_openapi

e2e = pytest.mark.e2e  # the tests that need the live servers

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, response_headers_conformance]
HTTP_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
MAX_EXAMPLES = 30
STATEFUL_EXAMPLES = 40


# ---- the live servers --------------------------------------------------------

@pytest.fixture(scope="module")
def live(tmp_path_factory):
    # A thread budget of 4 (event streams and waiting claims), streams that end once they
    # have sent what is stored, and claims that do not wait (no_waiting): every request
    # answers well within the request timeout. Waiting claims and open streams have tests
    # of their own (test_dispatch.py, test_events_api.py).
    c = Cluster(tmp_path_factory.mktemp("openapi"), LONG_POLL_MAX_WAITERS=4, EVENTS_STREAM_MAX_SECS=0)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def load_schema(base_url: str):
    config = schemathesis.Config.from_dict({"base-url": base_url, "request-timeout": 15})
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json", config=config, timeout=10)
    add_hostile_strings(schema)
    return schema


# ---- strings schemathesis does not draw ----------------------------------------
#
# Schemathesis draws strings from characters its codec (UTF-8) can encode: never a
# lone surrogate, and control characters only as often as any other. Hooks scoped to
# each schema swap some of the strings it drew, in the positive and negative cases of
# the fuzzing and the stateful runs alike, for text of any character: in bodies lone
# surrogates too (the JSON encoder sends them as `\ud800` escapes), in query strings
# and path parameters what UTF-8 can encode (a URL cannot carry a lone surrogate). The
# few characters that matter most are drawn far more often than among all of Unicode.

BODY_TEXT = hostile.any_text()
URL_TEXT = hostile.any_text(surrogates=False)
SEGMENT_TEXT = hostile.any_text(surrogates=False, min_size=1)  # "" would take a segment out of the path


def swapping_strings(value, text: st.SearchStrategy, keys: bool) -> st.SearchStrategy:
    """`value` with each string in it (object keys too if `keys`) kept or swapped for a draw of `text`."""
    if isinstance(value, str):
        return st.just(value) | text
    if isinstance(value, dict):
        pairs = [st.tuples(swapping_strings(key, text, False) if keys else st.just(key),
                           swapping_strings(item, text, keys)) for key, item in value.items()]
        return st.tuples(*pairs).map(dict)
    if isinstance(value, list):
        return st.tuples(*(swapping_strings(item, text, keys) for item in value)).map(list)
    return st.just(value)


def add_hostile_strings(schema) -> None:
    """Register the swapping hooks on `schema` only (not on schemathesis' global dispatcher)."""

    @schema.hook
    def flatmap_body(context, body):
        return swapping_strings(body, BODY_TEXT, keys=True)

    @schema.hook
    def flatmap_query(context, query):
        return swapping_strings(query, URL_TEXT, keys=False)

    @schema.hook
    def flatmap_path_parameters(context, path_parameters):
        return swapping_strings(path_parameters, SEGMENT_TEXT, keys=False)


@pytest.fixture(scope="module")
def registry_schema(live):
    return load_schema(live.registry_url)


@pytest.fixture(scope="module")
def scheduler_schema(live):
    return load_schema(live.scheduler_url)


# ---- the documents list exactly the app's routes ---------------------------

def app_routes(app) -> set[tuple[str, str]]:
    routes = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        routes |= {(method, path) for method in rule.methods - {"HEAD", "OPTIONS"}}
    return routes


def documented_routes(document: dict) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in document["paths"].items()
            for method in item if method in HTTP_METHODS}


def make_registry_app(tmp_path):
    from corral.registry.app import create_app
    from corral.registry.settings import RegistrySettings
    return create_app(RegistrySettings(database_url=f"sqlite:///{tmp_path}/r.db"))


def make_scheduler_app(tmp_path):
    from corral.scheduler.app import create_app
    from corral.scheduler.settings import SchedulerSettings
    return create_app(SchedulerSettings(database_url=f"sqlite:///{tmp_path}/s.db"))


def resolve_refs(node, document: dict, where: str = "#") -> None:
    """Fail on a $ref that points nowhere."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if ref is not None:
            target = document
            for part in ref.removeprefix("#/").split("/"):
                assert isinstance(target, dict) and part in target, f"{where}: unresolved $ref {ref}"
                target = target[part]
        for key, value in node.items():
            resolve_refs(value, document, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            resolve_refs(value, document, f"{where}/{i}")


@pytest.mark.parametrize("make_app", [make_registry_app, make_scheduler_app], ids=["registry", "scheduler"])
def test_document_lists_every_route(make_app, tmp_path):
    app = make_app(tmp_path)
    document = app.test_client().get("/openapi.json").get_json()
    routes, documented = app_routes(app), documented_routes(document)
    assert routes - documented == set(), "routes the OpenAPI document does not describe"
    assert documented - routes == set(), "documented operations the app does not have"


@pytest.mark.parametrize("make_app", [make_registry_app, make_scheduler_app], ids=["registry", "scheduler"])
def test_document_is_well_formed(make_app, tmp_path):
    document = make_app(tmp_path).test_client().get("/openapi.json").get_json()
    assert document["openapi"] == "3.1.0"
    assert document["info"]["title"] and document["info"]["version"]
    resolve_refs(document, document)
    error = document["components"]["schemas"]["Error"]
    assert error["required"] == ["error"] and error["properties"]["error"]["type"] == "string"
    operation_ids = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            operation_ids.append(operation["operationId"])
            assert operation.get("summary"), f"{method.upper()} {path} has no summary"
            responses = operation["responses"]
            assert any(code.startswith("2") for code in responses), f"{method.upper()} {path}: no success answer"
            if "{" in path:
                assert "404" in responses, f"{method.upper()} {path} can answer 404"
            if method in ("post", "put", "patch", "delete"):  # JSON only, with or without a body
                assert "415" in responses, f"{method.upper()} {path}: 415"
            if operation.get("requestBody", {}).get("required", True) and "requestBody" in operation:
                assert {"400", "413", "415"} <= set(responses), f"{method.upper()} {path}: body errors"
                if "application/octet-stream" in operation["requestBody"]["content"]:
                    continue  # raw bytes (an agent's log chunk)
                schema = operation["requestBody"]["content"]["application/json"]["schema"]
                name = schema["$ref"].rsplit("/", 1)[-1]
                assert document["components"]["schemas"][name]["additionalProperties"] is False
    assert len(operation_ids) == len(set(operation_ids)), "duplicate operationId"


@e2e
@pytest.mark.parametrize("service", ["registry", "scheduler"])
def test_live_document_is_served(live, service):
    response = requests.get(getattr(live, f"{service}_url") + "/openapi.json", timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    document = json.loads(response.text)
    assert document["openapi"] == "3.1.0"
    module = registry_openapi if service == "registry" else scheduler_openapi
    assert document == json.loads(json.dumps(module.DOCUMENT))


# ---- fuzzing the live servers against their documents ------------------------
#
# Schemathesis' own pytest plugin (`from_fixture(...).parametrize()`) does not
# run under pytest 9 (it sets `Function._nodeid`), so the cases come from its
# Python API: the coverage phase's boundary cases, then Hypothesis with
# positive and negative data, then a stateful run following inferred links.

def operations(document: dict) -> list[str]:
    # Schemathesis leaves out the operation serving the schema itself;
    # test_live_document_is_served covers GET /openapi.json.
    return [f"{method.upper()} {path}" for method, path in
            ((m, p) for p, item in document["paths"].items() for m in item if m in HTTP_METHODS)
            if path != "/openapi.json"]


def hypothesis_settings(**overrides) -> hypothesis.settings:
    return hypothesis.settings(**{
        "max_examples": MAX_EXAMPLES, "deadline": None, "derandomize": True, "database": None,
        "suppress_health_check": list(hypothesis.HealthCheck), "print_blob": False, **overrides})


def no_waiting(case) -> None:
    """A claim's `wait_secs`, when left out, null or in range, becomes 0: a fuzzed claim would
    otherwise hold a thread for up to 25 s, longer than the request timeout. Values out of
    range are sent as drawn."""
    if not case.path.endswith("/claim") or not isinstance(case.body, dict):
        return
    wait = case.body.get("wait_secs")
    if wait is None or (isinstance(wait, (int, float)) and not isinstance(wait, bool) and 0 < wait <= 25):
        case.body["wait_secs"] = 0


def call_and_validate(case) -> None:
    no_waiting(case)
    case.call_and_validate(checks=CHECKS)


def check_operation(schema, label: str) -> None:
    method, path = label.split(" ", 1)
    operation = schema[path][method]
    # 1. Coverage: boundary and just-invalid values of every parameter and field.
    config = schema.config.generation_for(operation=operation, phase="coverage")
    for case in schema.iter_coverage_cases(operation, generation_modes=list(GenerationMode),
                                           generation_config=config):
        call_and_validate(case)
    # 2. Fuzzing: random valid and invalid requests.
    has_input = bool(list(operation.iter_parameters())) or bool(operation.body)
    strategy = operation.as_strategy(generation_mode=GenerationMode.POSITIVE)
    if has_input:
        strategy = strategy | operation.as_strategy(generation_mode=GenerationMode.NEGATIVE)

    @hypothesis_settings()
    @hypothesis.given(case=strategy)
    def fuzz(case):
        call_and_validate(case)

    fuzz()


@e2e
@pytest.mark.parametrize("label", operations(registry_openapi.DOCUMENT))
def test_registry_answers_as_documented(registry_schema, label):
    check_operation(registry_schema, label)


@e2e
@pytest.mark.parametrize("label", operations(scheduler_openapi.DOCUMENT))
def test_scheduler_answers_as_documented(scheduler_schema, label):
    check_operation(scheduler_schema, label)


@pytest.fixture
def surrogates_leave_validity_unknown(monkeypatch):
    """A body a link changed is checked again against its schema with jsonschema_rs,
    which cannot take the lone surrogates the hooks put in strings (UnicodeEncodeError):
    for such a body, whether it is valid is left unknown, as schemathesis does for a
    schema its validator cannot read. The request is still sent and its answer checked."""
    original = Case._validate_component

    def validate_component(self, location, value, validator_cls):
        try:
            return original(self, location, value, validator_cls)
        except UnicodeEncodeError:
            return None

    monkeypatch.setattr(Case, "_validate_component", validate_component)


@e2e
@pytest.mark.parametrize("service", ["registry", "scheduler"])
def test_stateful_sequences_answer_as_documented(request, service, surrogates_leave_validity_unknown):
    """Sequences that feed one answer into the next request (submit, then read, report...)."""
    schema = request.getfixturevalue(f"{service}_schema")

    class Machine(schema.as_state_machine()):
        def before_call(self, case):
            no_waiting(case)

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(response, checks=CHECKS, transport_kwargs=kwargs)

    settings = hypothesis_settings(max_examples=STATEFUL_EXAMPLES, stateful_step_count=10,
                                   phases=[hypothesis.Phase.generate])
    try:
        Machine.run(settings=settings)
    except hypothesis.errors.FlakyStrategyDefinition:
        # Which rules can run depends on earlier answers (a second POST /nodes for the same id
        # is a 200, not a 201), so a replayed prefix may draw differently. That ends the run
        # early; it is not a finding. A failed check is still raised (as itself or FlakyFailure).
        pass


BODY_OPERATIONS = [
    ("registry", "POST", "/nodes", {}),
    ("registry", "POST", "/nodes/{node_id}/heartbeat", {"node_id": "n1"}),
    ("registry", "POST", "/services", {}),
    ("scheduler", "POST", "/jobs", {}),
    ("scheduler", "POST", "/jobs/{job_id}/status", {"job_id": "job-1"}),
    ("scheduler", "POST", "/jobs/batch", {}),
    ("scheduler", "POST", "/jobs/reports", {}),
    ("scheduler", "POST", "/nodes/{node_id}/claim", {"node_id": "n1"}),
]


@e2e
@pytest.mark.parametrize("service,method,path,path_parameters", BODY_OPERATIONS,
                         ids=[f"{s} {m} {p}" for s, m, p, _ in BODY_OPERATIONS])
def test_body_errors_answer_as_documented(request, service, method, path, path_parameters):
    """415 (not JSON), 413 (too large) and 400 (not an object): cases the fuzzing rarely builds."""
    operation = request.getfixturevalue(f"{service}_schema")[path][method]
    cases = [
        (415, operation.Case(path_parameters=path_parameters, body="x", media_type="text/plain")),
        (413, operation.Case(path_parameters=path_parameters, body={"x": "y" * (4 << 20)},
                             media_type="application/json")),
        (400, operation.Case(path_parameters=path_parameters, body=["not", "an", "object"],
                             media_type="application/json")),
    ]
    for status, case in cases:
        response = case.call_and_validate(checks=CHECKS)
        assert response.status_code == status, response.text


@e2e
def test_job_pages_link_to_the_next_page(live, scheduler_schema):
    """A full page carries a documented `Link` to the next one; following the links visits each job once."""
    submitted = [live.submit(command=f"echo {n}")["job_id"] for n in range(5)]
    operation = scheduler_schema["/jobs"]["GET"]
    first = int(submitted[0].removeprefix("job-"))
    query = {"limit": 2, "order": "asc"} | ({"after": f"job-{first - 1}"} if first > 1 else {})
    seen, pages = [], 0
    while query is not None and pages < 10:
        response = operation.Case(query=query).call_and_validate(checks=CHECKS)
        page, pages = [job["job_id"] for job in response.json()], pages + 1
        seen += page
        links = response.headers.get("link")  # schemathesis: lower-case names, lists of values
        if links:
            assert len(page) == 2 and len(links) == 1
            target = re.fullmatch(r'<([^>]*)>; rel="next"', links[0]).group(1)
            assert urlsplit(target).path == "/jobs"
            query = dict(parse_qsl(urlsplit(target).query))
            assert query["after"] == page[-1]
        else:
            assert len(page) < 2
            query = None
    assert seen == submitted and pages == 3


DEEP = "[" * 50_000 + "]" * 50_000  # nested past Python's recursion limit
MALFORMED = [
    ("registry", "/nodes", '{"node_id": "n1", "address": "a", "labels": ' + DEEP + "}"),
    ("registry", "/nodes/n1/heartbeat", DEEP),
    ("registry", "/services", DEEP),
    ("scheduler", "/jobs", '{"command": ' + DEEP + "}"),
    ("scheduler", "/jobs/job-1/status", DEEP),
    ("scheduler", "/jobs/batch", '{"jobs": ' + DEEP + "}"),
    ("scheduler", "/jobs/reports", '{"reports": [' + DEEP + "]}"),
    ("scheduler", "/nodes/n1/claim", '{"max": 1, "default_limits": ' + DEEP + "}"),
    ("scheduler", "/jobs", '{"command": "true", "deploy_url": "http://[/build.zip"}'),
    ("scheduler", "/jobs", '{"command": "true", "deploy_url": "https://[::zz]/build.zip"}'),
    ("scheduler", "/jobs", '{"command": "true", "deploy_url": "https://a\uff03b/build.zip"}'),
]


@pytest.mark.parametrize("service,path,body", MALFORMED,
                         ids=["nodes-deep", "heartbeat-deep", "services-deep", "jobs-deep", "status-deep",
                              "batch-deep", "reports-deep", "claim-deep",
                              "deploy-url-bracket", "deploy-url-bad-ipv6", "deploy-url-nfkc"])
def test_malformed_body_is_a_bad_request(tmp_path, service, path, body):
    """Inputs the fuzzing is unlikely to build: the answer must still be the documented 400, not a 500."""
    app = (make_registry_app if service == "registry" else make_scheduler_app)(tmp_path)
    response = app.test_client().post(path, data=body, content_type="application/json")
    assert response.status_code == 400, response.get_data(as_text=True)
    assert set(response.get_json()) == {"error"}


@e2e
def test_no_unhandled_errors_logged(live):
    """A 500 the checks did not see (or a crash in a background loop) still shows in the logs."""
    for name in ("registry", "scheduler"):
        log = live.procs[name].output()
        assert "unhandled error" not in log and "Traceback" not in log, f"{name} log:\n{log[-6000:]}"
