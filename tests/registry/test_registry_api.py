"""The registry's API through Flask's test client, on a real SQLite file."""
import pytest

from corral.registry.app import Liveness, create_app
from corral.registry.settings import RegistrySettings


NODE = {"node_id": "node-1", "address": "10.0.0.5", "kind": "compute", "slots": 4,
        "cpus": 8, "memory_mb": 16000, "labels": {"zone": "a"}}


def test_health_is_derived_from_the_last_heartbeat():
    liveness = Liveness(20.0)
    assert liveness.status(100.0, 120.0) == "healthy"
    assert liveness.status(100.0, 120.5) == "unhealthy"


def test_after_a_restart_nodes_healthy_at_the_stop_get_one_timeout_to_heartbeat():
    # The registry stopped at about t=1000 (newest heartbeat) and starts again at t=1100.
    liveness = Liveness(20.0, started_at=1100.0, last_up=1000.0)
    assert liveness.status(995.0, 1110.0) == "healthy"     # healthy when it stopped: grace
    assert liveness.status(970.0, 1110.0) == "unhealthy"   # already silent for 30 s then
    assert liveness.status(995.0, 1121.0) == "unhealthy"   # the grace is over


def test_a_restarted_registry_does_not_declare_nodes_lost_at_once(database_url, clock):
    settings = RegistrySettings(database_url=database_url, heartbeat_timeout_secs=20)
    first = create_app(settings, clock=clock).test_client()
    first.post("/nodes", json=NODE)
    clock.now += 60                                          # down for a minute
    restarted = create_app(settings, clock=clock).test_client()
    assert restarted.get("/nodes/node-1").json["status"] == "healthy"
    assert [n["node_id"] for n in restarted.get("/nodes?status=healthy").json] == ["node-1"]
    clock.now += 21
    assert restarted.get("/nodes/node-1").json["status"] == "unhealthy"


def test_register_heartbeat_and_turn_unhealthy(client, clock):
    response = client.post("/nodes", json=NODE)
    assert response.status_code == 201
    node = response.json
    assert node["status"] == "healthy" and node["labels"] == {"zone": "a"} and node["slots"] == 4
    assert node["cpus"] == 8 and node["memory_mb"] == 16000
    clock.now += 15
    assert client.post("/nodes/node-1/heartbeat", json={"running": 2}).json["running"] == 2
    clock.now += 15
    assert client.get("/nodes/node-1").json["status"] == "healthy"
    clock.now += 10
    assert client.get("/nodes/node-1").json["status"] == "unhealthy"
    assert client.post("/nodes/node-1/heartbeat", json={}).json["status"] == "healthy"


def test_reregistration_updates_the_node(client):
    client.post("/nodes", json=NODE)
    again = client.post("/nodes", json=dict(NODE, slots=2, address="10.0.0.6"))
    assert again.status_code == 200
    assert again.json["slots"] == 2 and again.json["address"] == "10.0.0.6"
    assert len(client.get("/nodes").json) == 1


def test_list_filters_by_type_and_status(client, clock):
    client.post("/nodes", json=NODE)
    client.post("/nodes", json=dict(NODE, node_id="node-2"))
    client.post("/nodes", json=dict(NODE, node_id="lb-1", kind="gateway"))
    clock.now += 30
    client.post("/nodes/node-2/heartbeat", json={})
    ids = lambda q: [n["node_id"] for n in client.get("/nodes" + q).json]  # noqa: E731
    assert ids("") == ["lb-1", "node-1", "node-2"]
    assert ids("?type=compute") == ["node-1", "node-2"]
    assert ids("?type=compute&status=healthy") == ["node-2"]
    assert ids("?status=unhealthy") == ["lb-1", "node-1"]
    assert client.get("/nodes?status=dead").status_code == 400


def test_heartbeat_of_an_unknown_node_is_404(client):
    response = client.post("/nodes/ghost/heartbeat", json={})
    assert response.status_code == 404 and "register" in response.json["error"]


def test_deregister(client):
    client.post("/nodes", json=NODE)
    assert client.delete("/nodes/node-1", json={}).status_code == 200
    assert client.get("/nodes/node-1").status_code == 404


@pytest.mark.parametrize("body", [
    {"address": "x"},
    {"node_id": "a b", "address": "x"},
    {"node_id": "n", "address": ""},
    {"node_id": "n", "address": "x", "slots": 0},
    {"node_id": "n", "address": "x", "slots": "4"},
    {"node_id": "n", "address": "x", "labels": {"a": 1}},
    {"node_id": "n", "address": "x", "kind": "Compute!"},
    {"node_id": "n", "address": "x", "extra": True},
])
def test_bad_registrations_are_refused(client, body):
    response = client.post("/nodes", json=body)
    assert response.status_code == 400 and response.json["error"]
    assert client.get("/nodes").json == []


DEFAULTS = {"run": {"memory_mb": 512, "cpu_percent": 100, "max_processes": 1024},
            "service": {"memory_mb": 1024, "cpu_percent": 200, "max_processes": None}}
PLACED = dict(NODE, max_memory_mb=16000, max_cpu_percent=800, default_limits=DEFAULTS,
              reserved_memory_mb=1024, reserved_cpu_percent=50)


def test_a_nodes_default_limits_and_reserve_are_stored_and_listed(client):
    answer = client.post("/nodes", json=PLACED)
    assert answer.status_code == 201, answer.json
    for node in (answer.json, client.get("/nodes/node-1").json, client.get("/nodes").json[0]):
        assert node["default_limits"] == DEFAULTS
        assert (node["reserved_memory_mb"], node["reserved_cpu_percent"]) == (1024, 50)
    # max_processes may be left out (a node without a pids limit): null.
    unlimited = {"run": {"memory_mb": 4, "cpu_percent": 1}, "service": {"memory_mb": 1048576, "cpu_percent": 100000}}
    client.post("/nodes", json=dict(PLACED, node_id="node-2", default_limits=unlimited))
    assert client.get("/nodes/node-2").json["default_limits"]["run"] == {"memory_mb": 4, "cpu_percent": 1,
                                                                          "max_processes": None}


def test_a_node_that_says_nothing_of_them_has_no_defaults_and_no_reserve(client):
    node = client.post("/nodes", json=NODE).json
    assert (node["default_limits"], node["reserved_memory_mb"], node["reserved_cpu_percent"]) == (None, 0, 0)
    nulls = client.post("/nodes", json=dict(NODE, node_id="node-2", default_limits=None, reserved_memory_mb=None,
                                            reserved_cpu_percent=None)).json
    assert (nulls["default_limits"], nulls["reserved_memory_mb"], nulls["reserved_cpu_percent"]) == (None, 0, 0)


def test_reregistration_replaces_the_default_limits_and_reserve(client):
    client.post("/nodes", json=PLACED)
    smaller = {"run": {"memory_mb": 256, "cpu_percent": 50}, "service": {"memory_mb": 512, "cpu_percent": 100}}
    again = client.post("/nodes", json=dict(PLACED, default_limits=smaller, reserved_memory_mb=2048))
    assert again.status_code == 200
    node = client.get("/nodes/node-1").json
    assert node["default_limits"]["run"] == {"memory_mb": 256, "cpu_percent": 50, "max_processes": None}
    assert (node["reserved_memory_mb"], node["reserved_cpu_percent"]) == (2048, 50)
    # Left out: back to not said, and nothing reserved.
    client.post("/nodes", json=NODE)
    node = client.get("/nodes/node-1").json
    assert (node["default_limits"], node["reserved_memory_mb"], node["reserved_cpu_percent"]) == (None, 0, 0)


def limits(run=None, service=None):
    return {"run": {"memory_mb": 512, "cpu_percent": 100, **(run or {})},
            "service": {"memory_mb": 1024, "cpu_percent": 200, **(service or {})}}


@pytest.mark.parametrize("fields, message", [
    ({"default_limits": "512"}, "'default_limits' must be an object with 'run' and 'service' limits"),
    ({"default_limits": {"run": {"memory_mb": 512, "cpu_percent": 100}}}, "'service' is required"),
    ({"default_limits": {**limits(), "batch": {}}}, "unknown field 'batch'; allowed fields: run, service"),
    ({"default_limits": limits(run={"memory_mb": 3})}, "'memory_mb' must be between 4 and 1048576"),
    ({"default_limits": limits(service={"memory_mb": 1048577})}, "'memory_mb' must be between 4 and 1048576"),
    ({"default_limits": limits(run={"cpu_percent": 0})}, "'cpu_percent' must be between 1 and 100000"),
    ({"default_limits": limits(service={"cpu_percent": 100001})}, "'cpu_percent' must be between 1 and 100000"),
    ({"default_limits": limits(run={"cpu_percent": "100"})}, "'cpu_percent' must be a whole number"),
    ({"default_limits": limits(run={"max_processes": 0})}, "'max_processes' must be between 1 and 4194304"),
    ({"default_limits": limits(run={"swap_mb": 1})},
     "unknown field 'swap_mb'; allowed fields: cpu_percent, max_processes, memory_mb"),
    ({"default_limits": {"run": 512, "service": 1024}},
     "'run' must be an object with memory_mb and cpu_percent (and max_processes)"),
    ({"reserved_memory_mb": -1}, "'reserved_memory_mb' must be between 0 and 1048576"),
    ({"reserved_memory_mb": 1048577}, "'reserved_memory_mb' must be between 0 and 1048576"),
    ({"reserved_memory_mb": 1.5}, "'reserved_memory_mb' must be a whole number"),
    ({"reserved_cpu_percent": -1}, "'reserved_cpu_percent' must be between 0 and 100000"),
    ({"reserved_cpu_percent": 100001}, "'reserved_cpu_percent' must be between 0 and 100000"),
    ({"reserved_cpu_percent": True}, "'reserved_cpu_percent' must be a whole number"),
    ({"max_memory_mb": 1000, "reserved_memory_mb": 1001},
     "'reserved_memory_mb' (1001) is more than 'max_memory_mb' (1000)"),
    ({"max_cpu_percent": 400, "reserved_cpu_percent": 401},
     "'reserved_cpu_percent' (401) is more than 'max_cpu_percent' (400)"),
    ({"reserved_gpus": 1}, "unknown field 'reserved_gpus'"),
])
def test_bad_default_limits_and_reserves_are_refused_in_one_line_and_nothing_is_stored(client, fields, message):
    client.post("/nodes", json=PLACED)
    response = client.post("/nodes", json=dict(PLACED, node_id="node-2", **fields))
    assert response.status_code == 400
    assert response.json["error"].startswith(message) and "\n" not in response.json["error"], response.json
    again = client.post("/nodes", json=dict(PLACED, **fields))  # nor is a registered node changed
    assert again.status_code == 400
    assert [n["node_id"] for n in client.get("/nodes").json] == ["node-1"]
    node = client.get("/nodes/node-1").json
    assert (node["default_limits"], node["reserved_memory_mb"]) == (DEFAULTS, 1024)


def test_the_openapi_document_shows_the_default_limits_and_reserve(client):
    schemas = client.get("/openapi.json").json["components"]["schemas"]
    registration, node = schemas["NodeRegistration"]["properties"], schemas["Node"]["properties"]
    for name in ("default_limits", "reserved_memory_mb", "reserved_cpu_percent"):
        assert name in registration and name in node and "description" in registration[name]
    assert registration["reserved_memory_mb"]["anyOf"][0] == {"type": "integer", "minimum": 0, "maximum": 1048576}
    limits_schema = schemas["Limits"]
    assert set(limits_schema["required"]) == {"memory_mb", "cpu_percent"}
    assert limits_schema["properties"]["memory_mb"] == {"type": "integer", "minimum": 4, "maximum": 1048576}
    assert set(schemas["DefaultLimits"]["required"]) == {"run", "service"}
    assert limits_schema["additionalProperties"] is False


def test_services(client, clock):
    client.post("/nodes", json=NODE)
    svc = {"job_id": "job-7", "name": "web", "node_id": "node-1", "address": "10.0.0.5", "port": 8080}
    assert client.post("/services", json=svc).status_code == 201
    assert client.post("/services", json=dict(svc, name="api", job_id="job-8", healthy=True)).status_code == 201
    assert client.post("/services", json=dict(svc, healthy=False)).status_code == 200
    names = lambda q: [s["job_id"] for s in client.get("/services" + q).json]  # noqa: E731
    assert names("") == ["job-8", "job-7"]
    assert names("?healthy=true") == ["job-8"]
    assert names("?healthy=false") == ["job-7"]
    assert names("?name=web") == ["job-7"]
    assert client.delete("/services/job-7", json={}).status_code == 200
    assert client.delete("/services/job-7", json={}).status_code == 404
    assert names("") == ["job-8"]
    bad = client.post("/services", json=dict(svc, port=0))
    assert bad.status_code == 400 and "port" in bad.json["error"]


def test_a_service_of_a_lost_or_unknown_node_is_not_listed_healthy(client, clock):
    client.post("/nodes", json=NODE)
    client.post("/nodes", json=dict(NODE, node_id="node-2"))
    for job_id, node_id in (("job-1", "node-1"), ("job-2", "node-2"), ("job-3", "node-gone")):
        client.post("/services", json={"job_id": job_id, "name": "web", "node_id": node_id,
                                       "address": "10.0.0.5", "port": 8080, "healthy": True})
    healthy = lambda: [s["job_id"] for s in client.get("/services?healthy=true").json]  # noqa: E731
    assert healthy() == ["job-1", "job-2"]  # node-gone is not registered
    clock.now += 15
    client.post("/nodes/node-2/heartbeat", json={})
    clock.now += 10  # node-1 is silent past the timeout; its service's last check said healthy
    assert healthy() == ["job-2"]
    listed = {s["job_id"]: s for s in client.get("/services").json}
    assert (listed["job-1"]["healthy"], listed["job-1"]["node_healthy"]) == (False, False)
    assert [s["job_id"] for s in client.get("/services?healthy=false").json] == ["job-1", "job-3"]
    assert client.post("/nodes/node-1/heartbeat", json={}).status_code == 200
    assert healthy() == ["job-1", "job-2"]


def test_a_service_whose_last_check_is_stale_is_not_listed_healthy(client, clock):
    """An agent that stopped sending a service's health (it died, or lost the service)
    leaves a record whose last word was healthy: past SERVICE_CHECK_MAX_AGE_SECS (60 s)
    it reads unknown, and a load balancer no longer gets it."""
    client.post("/nodes", json=NODE)
    record = {"job_id": "job-1", "name": "web", "node_id": "node-1", "address": "10.0.0.5", "port": 8080,
              "healthy": True}
    client.post("/services", json=record)
    client.post("/services", json=dict(record, job_id="job-2"))
    healthy = lambda: [s["job_id"] for s in client.get("/services?healthy=true").json]  # noqa: E731
    for _ in range(4):  # the node heartbeats on; only job-2's agent sends its health again
        clock.now += 15
        client.post("/nodes/node-1/heartbeat", json={})
        client.post("/services", json=dict(record, job_id="job-2"))
    clock.now += 1  # job-1 last checked 61 s ago
    assert healthy() == ["job-2"]
    listed = {s["job_id"]: s for s in client.get("/services").json}
    assert (listed["job-1"]["healthy"], listed["job-1"]["node_healthy"]) == (None, True)
    assert listed["job-2"]["healthy"] is True
    assert [s["job_id"] for s in client.get("/services?healthy=false").json] == ["job-1"]
    assert client.get("/sd/prometheus/services").json[0]["labels"]["__meta_corral_job_id"] == "job-2"
    assert len(client.get("/sd/prometheus/services").json) == 1
    client.post("/services", json=record)  # checked again
    assert healthy() == ["job-1", "job-2"]


def test_removing_a_service_record_of_an_attempt_never_removes_a_newer_attempts(client):
    client.post("/nodes", json=NODE)
    record = {"job_id": "job-1", "name": "web", "node_id": "node-1", "address": "10.0.0.5", "port": 8080,
              "healthy": True, "attempt": 3}
    client.post("/services", json=record)
    stale = client.delete("/services/job-1?attempt=2", json={})
    assert stale.status_code == 409 and "attempt 3" in stale.json["error"]
    bad = client.delete("/services/job-1?attempt=x", json={})
    assert bad.status_code == 400 and "attempt" in bad.json["error"]
    assert [s["attempt"] for s in client.get("/services").json] == [3]  # neither changed anything
    assert client.delete("/services/job-1?attempt=3", json={}).status_code == 200
    assert client.delete("/services/job-1?attempt=3", json={}).status_code == 404


def test_prometheus_discovery_lists_the_healthy_services_and_nodes_with_their_labels(database_url, clock):
    settings = RegistrySettings(database_url=database_url, heartbeat_timeout_secs=20, sd_node_port=9200)
    client = create_app(settings, clock=clock).test_client()
    labels = {"zone": "a", "gpu.model": "a100", "9lives": "x", "gpu_model": "shadowed"}
    client.post("/nodes", json=dict(NODE, labels=labels))
    client.post("/nodes", json=dict(NODE, node_id="node-2", address="fd00::2", labels={}))
    client.post("/nodes/node-2/drain", json={})
    client.post("/nodes", json=dict(NODE, node_id="node-3", address="10.0.0.9"))
    for job_id, node_id, healthy in (("job-1", "node-1", True), ("job-2", "node-2", True),
                                     ("job-3", "node-1", False), ("job-4", "node-3", True),
                                     ("job-5", "node-gone", True)):
        client.post("/services", json={"job_id": job_id, "name": "web", "node_id": node_id, "address": "10.0.0.5",
                                       "port": 8080, "healthy": healthy, "attempt": 2})
    clock.now += 15
    for node_id in ("node-1", "node-2"):
        client.post(f"/nodes/{node_id}/heartbeat", json={})
    clock.now += 10  # node-3 is silent past the timeout

    services = client.get("/sd/prometheus/services")
    assert services.status_code == 200 and services.mimetype == "application/json"
    node_1 = {"__meta_corral_node_id": "node-1", "__meta_corral_node_kind": "compute",
              "__meta_corral_node_drained": "false", "__meta_corral_label_zone": "a",
              "__meta_corral_label_gpu_model": "a100", "__meta_corral_label_9lives": "x"}
    node_2 = {"__meta_corral_node_id": "node-2", "__meta_corral_node_kind": "compute",
              "__meta_corral_node_drained": "true"}
    assert services.json == [  # only checked-healthy services on healthy nodes
        {"targets": ["10.0.0.5:8080"], "labels": {"__meta_corral_service": "web", "__meta_corral_job_id": "job-1",
                                                  "__meta_corral_attempt": "2", **node_1}},
        {"targets": ["10.0.0.5:8080"], "labels": {"__meta_corral_service": "web", "__meta_corral_job_id": "job-2",
                                                  "__meta_corral_attempt": "2", **node_2}},
    ]
    assert client.get("/sd/prometheus/nodes").json == [
        {"targets": ["10.0.0.5:9200"], "labels": node_1},
        {"targets": ["[fd00::2]:9200"], "labels": node_2},  # drained: still there, still exporting
    ]


def test_errors_are_json(client):
    assert client.post("/nodes", data="x").status_code == 415
    assert client.post("/nodes", data="{", content_type="application/json").status_code == 400
    assert client.get("/nodes/nope").json["error"]


def test_drain_and_undrain(client, clock):
    client.post("/nodes", json=NODE)
    client.post("/nodes", json=dict(NODE, node_id="node-2"))
    drained = client.post("/nodes/node-1/drain", json={})
    assert drained.status_code == 200 and drained.json["drained"] is True
    assert client.post("/nodes", json=NODE).json["drained"] is True   # an agent restart keeps it
    assert [n["node_id"] for n in client.get("/nodes?drained=true").json] == ["node-1"]
    assert [n["node_id"] for n in client.get("/nodes?drained=false").json] == ["node-2"]
    assert client.post("/nodes/node-1/undrain", json={}).json["drained"] is False
    assert client.post("/nodes/ghost/drain", json={}).status_code == 404
    assert client.get("/nodes?drained=maybe").status_code == 400


def test_readiness(client):
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json["status"] == "ready"
    assert ready.json["checks"]["database"] == "ok"
    if "clock_skew_secs" in ready.json["checks"]:   # PostgreSQL: this host against the server
        assert abs(ready.json["checks"]["clock_skew_secs"]) < 2


@pytest.mark.e2e
def test_concurrent_registrations_heartbeats_and_service_records_never_fail(cluster):
    """Upserts, not check-then-insert: the same node registering from many connections at
    once (an agent retrying, several registry replicas) and its service recorded at once."""
    import concurrent.futures

    import requests

    url = cluster.registry_url
    node = {"node_id": "race-1", "address": "10.0.0.9", "slots": 2}
    service = {"job_id": "job-1", "name": "web", "node_id": "race-1", "address": "10.0.0.9", "port": 80}

    def one(i):
        with requests.Session() as s:
            codes = [s.post(url + "/nodes", json=node, timeout=10).status_code,
                     s.post(url + "/nodes/race-1/heartbeat", json={"running": i % 3}, timeout=10).status_code,
                     s.post(url + "/services", json=dict(service, healthy=bool(i % 2)), timeout=10).status_code]
        return codes

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        codes = [c for codes in pool.map(one, range(48)) for c in codes]
    assert set(codes) <= {200, 201} and codes.count(201) <= 2, codes
    assert [n["node_id"] for n in requests.get(url + "/nodes", timeout=5).json()] == ["race-1"]
    assert [s["job_id"] for s in requests.get(url + "/services", timeout=5).json()] == ["job-1"]


LOW = "only 812 MB free on the filesystem of /var/lib/corral/work, under AGENT_MIN_FREE_DISK_MB (1024 MB)"


def test_a_node_refusing_work_says_why_in_its_heartbeat_and_a_heartbeat_without_it_clears_it(client):
    assert client.post("/nodes", json=NODE).json["refusing_work"] is None
    answer = client.post("/nodes/node-1/heartbeat", json={"running": 0, "refusing_work": LOW})
    assert answer.status_code == 200 and answer.json["refusing_work"] == LOW
    assert client.get("/nodes/node-1").json["refusing_work"] == LOW
    assert [n["refusing_work"] for n in client.get("/nodes").json] == [LOW]
    # An older agent says nothing of it: it takes work.
    assert client.post("/nodes/node-1/heartbeat", json={"running": 0}).json["refusing_work"] is None
    client.post("/nodes/node-1/heartbeat", json={"refusing_work": LOW})
    assert client.post("/nodes/node-1/heartbeat", json={"refusing_work": None}).json["refusing_work"] is None
    # Registration says it too (an agent that starts short of space), and replaces it.
    assert client.post("/nodes", json=dict(NODE, refusing_work=LOW)).json["refusing_work"] == LOW
    assert client.post("/nodes", json=NODE).json["refusing_work"] is None


@pytest.mark.parametrize("value", ["", 5, True, ["low"], {"why": "low"}, "x\x00y", "x" * 1025])
def test_a_bad_refusing_work_is_refused_and_changes_nothing(client, value):
    client.post("/nodes", json=NODE)
    client.post("/nodes/node-1/heartbeat", json={"refusing_work": LOW})
    answer = client.post("/nodes/node-1/heartbeat", json={"running": 3, "refusing_work": value})
    assert answer.status_code == 400 and "refusing_work" in answer.json["error"]
    node = client.get("/nodes/node-1").json
    assert node["refusing_work"] == LOW and node["running"] is None
    assert client.post("/nodes", json=dict(NODE, refusing_work=value)).status_code == 400


def test_the_openapi_document_shows_refusing_work(client):
    schemas = client.get("/openapi.json").json["components"]["schemas"]
    assert "refusing_work" in schemas["Node"]["properties"]
    assert "refusing_work" in schemas["Heartbeat"]["properties"]
    assert "refusing_work" in schemas["NodeRegistration"]["properties"]
