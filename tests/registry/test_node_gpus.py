"""A node's GPUs and countable resources: what its registration says of them, how a bad
one is refused, how GET /nodes shows them, and the step that adds their columns."""
import shutil

import pytest

from corral.registry.app import create_app
from corral.registry.migrations import MIGRATIONS
from corral.registry.settings import RegistrySettings
from corral.server import db as dbmod
from corral.server import migrations


NODE = {"node_id": "node-1", "address": "10.0.0.5", "slots": 4, "cpus": 8, "memory_mb": 16000}
H100 = {"index": "0", "uuid": "GPU-5fd4c4a2-0e3b-8d7a-1c2f-3b4a5c6d7e8f", "model": "NVIDIA H100 80GB HBM3",
        "memory_mb": 81559}
MIG = {"index": "1:0", "uuid": "MIG-4b1a2c3d-0e3b-8d7a-1c2f-3b4a5c6d7e8f", "model": "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
       "memory_mb": 4864}
OLD_MIG = {"index": "1:1", "uuid": "MIG-GPU-8e1f2a3b-0e3b-8d7a-1c2f-3b4a5c6d7e8f/1/0",
           "model": "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "memory_mb": 4864}
GPUS = [H100, MIG, OLD_MIG]
RESOURCES = {"fpga": 2, "licence.matlab": 4, "nvme_scratch-gb": 0, "big": 1_000_000_000_000}
EQUIPPED = dict(NODE, gpus=GPUS, resources=RESOURCES)


def shown(client, node_id="node-1") -> list[dict]:
    """The node as each read route shows it."""
    return [client.get(f"/nodes/{node_id}").json, *[n for n in client.get("/nodes").json if n["node_id"] == node_id]]


def test_a_nodes_gpus_and_resources_are_stored_and_listed(client):
    answer = client.post("/nodes", json=EQUIPPED)
    assert answer.status_code == 201, answer.json
    views = [answer.json, *shown(client)]
    assert len(views) == 3
    for node in views:
        assert node["gpus"] == GPUS  # in the order registered
        assert node["resources"] == RESOURCES


def test_a_node_that_says_nothing_of_them_has_none(client):
    for body in (NODE, dict(NODE, node_id="node-2", gpus=None, resources=None),
                 dict(NODE, node_id="node-3", gpus=[], resources={})):
        answer = client.post("/nodes", json=body)
        assert answer.status_code == 201, answer.json
        for node in (answer.json, *shown(client, body["node_id"])):
            assert (node["gpus"], node["resources"]) == ([], {})


def test_reregistration_replaces_them_and_a_heartbeat_or_a_drain_keeps_them(client, clock):
    client.post("/nodes", json=EQUIPPED)
    clock.now += 5
    assert client.post("/nodes/node-1/heartbeat", json={"running": 1}).json["gpus"] == GPUS
    assert client.post("/nodes/node-1/heartbeat", json={}).json["resources"] == RESOURCES
    assert client.post("/nodes/node-1/drain", json={}).json["gpus"] == GPUS
    assert all((n["gpus"], n["resources"]) == (GPUS, RESOURCES) for n in shown(client))

    again = client.post("/nodes", json=dict(NODE, gpus=[H100], resources={"fpga": 1}))
    assert again.status_code == 200 and (again.json["gpus"], again.json["resources"]) == ([H100], {"fpga": 1})
    # Left out: the node has none any more (an agent restarted without its GPUs).
    assert client.post("/nodes", json=NODE).status_code == 200
    assert all((n["gpus"], n["resources"]) == ([], {}) for n in shown(client))


def many_gpus(count: int) -> list[dict]:
    return [dict(H100, index=str(i), uuid=f"GPU-{i:08d}") for i in range(count)]


@pytest.mark.parametrize("fields, message", [
    # the list and its devices
    ({"gpus": H100}, "'gpus' must be a JSON array"),
    ({"gpus": many_gpus(257)}, "'gpus' must hold 0 to 256 items, not 257"),
    ({"gpus": [H100, "GPU-1"]}, "'gpus' item 1 must be an object with index, uuid, model and memory_mb"),
    ({"gpus": [dict(H100, index="gpu0")]}, "'gpus' item 0: 'index' must be a GPU's index ('0'), or a MIG"),
    ({"gpus": [dict(H100, index="0:")]}, "'gpus' item 0: 'index' must be a GPU's index"),
    ({"gpus": [dict(H100, index="12345")]}, "'gpus' item 0: 'index' must be a GPU's index"),
    ({"gpus": [dict(H100, index="0\n")]}, "'gpus' item 0: 'index' must be a GPU's index"),
    ({"gpus": [dict(H100, index=0)]}, "'gpus' item 0: 'index' must be a string"),
    ({"gpus": [H100, dict(MIG, uuid="5fd4c4a2-0e3b")]},
     "'gpus' item 1: 'uuid' must be a device UUID ('GPU-...' or 'MIG-...')"),
    ({"gpus": [dict(H100, uuid="GPU-")]}, "'gpus' item 0: 'uuid' must be a device UUID"),
    ({"gpus": [dict(H100, uuid="GPU-a b")]}, "'gpus' item 0: 'uuid' must be a device UUID"),
    ({"gpus": [dict(H100, uuid="GPU-" + "a" * 121)]}, "'gpus' item 0: 'uuid' must be a device UUID"),
    ({"gpus": [H100, MIG, dict(MIG, index="1:5")]},
     f"'gpus' has the uuid {MIG['uuid']!r} twice (items 1 and 2)"),
    ({"gpus": [H100, dict(MIG, index="0")]}, "'gpus' has the index '0' twice (items 0 and 1)"),
    ({"gpus": [dict(H100, model="x" * 129)]}, "'gpus' item 0: 'model' is longer than 128 characters"),
    ({"gpus": [dict(H100, model="")]}, "'gpus' item 0: 'model' must not be empty"),
    ({"gpus": [dict(H100, model="H\x00100")]}, "'gpus' item 0: 'model' must not contain NUL characters"),
    ({"gpus": [dict(H100, memory_mb=-1)]}, "'gpus' item 0: 'memory_mb' must be between 0 and 16777216"),
    ({"gpus": [dict(H100, memory_mb=(1 << 24) + 1)]}, "'gpus' item 0: 'memory_mb' must be between 0 and 16777216"),
    ({"gpus": [dict(H100, memory_mb=True)]}, "'gpus' item 0: 'memory_mb' must be a whole number"),
    ({"gpus": [dict(H100, memory_mb=1024.0)]}, "'gpus' item 0: 'memory_mb' must be a whole number"),
    ({"gpus": [dict(H100, memory_mb="1024")]}, "'gpus' item 0: 'memory_mb' must be a whole number"),
    ({"gpus": [{k: v for k, v in H100.items() if k != "uuid"}]}, "'gpus' item 0: 'uuid' is required"),
    ({"gpus": [dict(H100, memory_mb=None)]}, "'gpus' item 0: 'memory_mb' is required"),
    ({"gpus": [dict(H100, serial="1320")]},
     "'gpus' item 0: unknown field 'serial'; allowed fields: index, memory_mb, model, uuid"),
    # resources
    ({"resources": [["fpga", 2]]}, "'resources' must be an object of whole numbers"),
    ({"resources": {f"r{i}": 1 for i in range(33)}}, "'resources' has more than 32 entries"),
    ({"resources": {"FPGA": 1}}, "'resources' key 'FPGA' is not a resource name"),
    ({"resources": {"2fpga": 1}}, "'resources' key '2fpga' is not a resource name"),
    ({"resources": {"fpga slot": 1}}, "'resources' key 'fpga slot' is not a resource name"),
    ({"resources": {"f" * 65: 1}}, "'resources' key 'fff"),
    ({"resources": {"": 1}}, "'resources' key '' is not a resource name"),
    ({"resources": {"gpus": 1}}, "'resources' key 'gpus' is reserved: gpus, memory_mb, cpu_percent, slots and jobs"),
    ({"resources": {"memory_mb": 1}}, "'resources' key 'memory_mb' is reserved"),
    ({"resources": {"cpu_percent": 1}}, "'resources' key 'cpu_percent' is reserved"),
    ({"resources": {"slots": 1}}, "'resources' key 'slots' is reserved"),
    ({"resources": {"jobs": 1}}, "'resources' key 'jobs' is reserved"),
    ({"resources": {"fpga": -1}}, "'resources' value for 'fpga' must be a whole number between 0 and 1000000000000"),
    ({"resources": {"fpga": 1_000_000_000_001}}, "'resources' value for 'fpga' must be a whole number between 0"),
    ({"resources": {"fpga": True}}, "'resources' value for 'fpga' must be a whole number"),
    ({"resources": {"fpga": 1.5}}, "'resources' value for 'fpga' must be a whole number"),
    ({"resources": {"fpga": 2.0}}, "'resources' value for 'fpga' must be a whole number"),
    ({"resources": {"fpga": "2"}}, "'resources' value for 'fpga' must be a whole number"),
    ({"resources": {"fpga": None}}, "'resources' value for 'fpga' must be a whole number"),
])
def test_bad_gpus_and_resources_are_refused_in_one_line_and_nothing_is_stored(client, fields, message):
    client.post("/nodes", json=EQUIPPED)
    response = client.post("/nodes", json=dict(NODE, node_id="node-2", **fields))
    assert response.status_code == 400
    assert response.json["error"].startswith(message) and "\n" not in response.json["error"], response.json
    again = client.post("/nodes", json=dict(NODE, **fields))  # nor is a registered node changed
    assert again.status_code == 400 and again.json["error"] == response.json["error"]
    assert [n["node_id"] for n in client.get("/nodes").json] == ["node-1"]
    assert all((n["gpus"], n["resources"], n["cpus"]) == (GPUS, RESOURCES, 8) for n in shown(client))


def test_the_largest_lists_pass():
    """The bounds themselves are accepted: 256 devices, 32 resources, the largest amounts."""
    from corral.registry.contract import NodeRegistration

    body = dict(NODE, gpus=[dict(g, memory_mb=1 << 24) for g in many_gpus(256)],
                resources={f"r{i}": 1_000_000_000_000 for i in range(32)})
    columns = NodeRegistration.check(body).columns()
    assert len(columns["gpus"]) == 256 and len(columns["resources"]) == 32


def test_the_openapi_document_shows_gpus_and_resources(client):
    schemas = client.get("/openapi.json").json["components"]["schemas"]
    registration, node = schemas["NodeRegistration"]["properties"], schemas["Node"]
    assert "description" in registration["gpus"] and "description" in registration["resources"]
    assert registration["gpus"]["anyOf"][0]["maxItems"] == 256
    resources = registration["resources"]["anyOf"][0]
    assert resources["maxProperties"] == 32
    assert resources["patternProperties"] == {
        r"^[a-z][a-z0-9_.-]{0,63}$": {"type": "integer", "minimum": 0, "maximum": 1_000_000_000_000}}
    gpu = schemas["Gpu"]
    assert set(gpu["required"]) == set(gpu["properties"]) == {"index", "uuid", "model", "memory_mb"}
    assert gpu["additionalProperties"] is False
    assert gpu["properties"]["index"]["pattern"] == r"^[0-9]{1,4}(:[0-9]{1,4})?$"
    assert gpu["properties"]["uuid"]["pattern"] == r"^(GPU|MIG)-[A-Za-z0-9/_.:-]{1,120}$"
    assert gpu["properties"]["memory_mb"] == {"type": "integer", "minimum": 0, "maximum": 1 << 24,
                                              "description": "The device's memory, in MiB."}
    assert {"gpus", "resources"} <= set(node["required"])
    assert set(schemas["GpuView"]["required"]) == {"index", "uuid", "model", "memory_mb"}


# ---- the step that adds the columns ---------------------------------------------------


@pytest.fixture
def real_migrations(monkeypatch):
    """The steps themselves run here, not a copy of a database they made (tests/migrated_template.py)."""
    import migrated_template
    monkeypatch.setattr("corral.server.migrations.apply", migrated_template._real_apply)


NODE_COLUMNS = ("node_id", "address", "kind", "slots", "labels", "registered_at", "last_heartbeat", "drained",
                "reserved_memory_mb", "reserved_cpu_percent")


def insert_as_the_previous_release(db, node_id: str) -> None:
    """A node row as a server of the previous release writes it: naming no new column."""
    values = (node_id, "10.0.0.9", "compute", 2, "{}", 1_800_000_000.0, 1_800_000_000.0, False, 0, 0)
    with db.connection_context():
        db.execute_sql(f"INSERT INTO node ({', '.join(NODE_COLUMNS)}) VALUES ({', '.join([db.param] * len(values))})",
                       values)


def test_the_step_adds_the_columns_to_a_database_of_the_previous_release_once(database_url, tmp_path, clock,
                                                                                real_migrations):
    previous = tmp_path / "previous-steps"
    previous.mkdir()
    names = MIGRATIONS.names()
    assert names[-1] == "0005_node_gpus"
    for name in names[:-1]:
        shutil.copy(f"{MIGRATIONS.directory}/{name}.py", previous / f"{name}.py")
    previous_set = migrations.MigrationSet(service="registry", directory=str(previous), lock_key=MIGRATIONS.lock_key)

    db = dbmod.open_database(database_url, service="registry")
    try:
        assert migrations.apply(db, previous_set) == names[:-1]
        with db.connection_context():
            assert not {"gpus", "resources"} & {c.name for c in db.get_columns("node")}
        insert_as_the_previous_release(db, "node-old")

        assert migrations.apply(db, MIGRATIONS) == ["0005_node_gpus"]
        with db.connection_context():
            columns = {c.name: c for c in db.get_columns("node")}
        assert columns["gpus"].null and columns["resources"].null
        insert_as_the_previous_release(db, "node-older")  # a server not yet upgraded keeps inserting

        # Again (a replica that found it unrecorded): the columns are there, nothing changes.
        with db.connection_context():
            db.execute_sql(f"DELETE FROM {MIGRATIONS.history_table} WHERE name = {db.param}", ("0005_node_gpus",))
        assert migrations.apply(db, MIGRATIONS) == ["0005_node_gpus"]
        assert migrations.apply(db, MIGRATIONS) == []
        with db.connection_context():
            assert {c.name for c in db.get_columns("node")} == set(columns)
    finally:
        dbmod.close_idle(db)

    client = create_app(RegistrySettings(database_url=database_url, heartbeat_timeout_secs=20),
                        clock=clock).test_client()
    assert [(n["node_id"], n["gpus"], n["resources"]) for n in client.get("/nodes").json] == [
        ("node-old", [], {}), ("node-older", [], {})]
    answer = client.post("/nodes", json=dict(EQUIPPED, node_id="node-old"))
    assert answer.status_code == 200 and answer.json["gpus"] == GPUS and answer.json["resources"] == RESOURCES
