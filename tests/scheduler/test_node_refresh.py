"""The node list's refresh from the registry writes only the node rows that changed,
on each backend: an unchanged list writes none (it runs every NODE_REFRESH_SECS, over
thousands of nodes), and every node still shows when the list was last refreshed."""
import peewee
import pytest

from scheduler_app import Clock, make_app


@pytest.fixture
def clock():
    return Clock()


def node(node_id, **fields):
    """A node as the registry lists it (with its last heartbeat and labels, as JSON)."""
    return {"node_id": node_id, "address": "10.0.0.1", "kind": "compute", "slots": 4, "status": "healthy",
            "drained": False, "last_heartbeat": "2027-01-15T08:00:00.000Z", "labels": {"zone": "a", "gpu": "no"},
            "default_limits": {"run": {"memory_mb": 512, "cpu_percent": 100}}, "max_memory_mb": 4096,
            **fields}


def row_versions(db):
    """A reader of each node row's version: it moves whenever the row is written (inserted,
    updated, deleted and inserted again). PostgreSQL's xmin; on SQLite, triggers count."""
    if isinstance(db, peewee.PostgresqlDatabase):
        return lambda: dict(db.execute_sql("SELECT node_id, xmin::text FROM node").fetchall())
    db.execute_sql("CREATE TABLE node_writes (node_id TEXT)")
    for event, row in (("INSERT", "NEW"), ("UPDATE", "NEW"), ("DELETE", "OLD")):
        db.execute_sql(f"CREATE TRIGGER node_{event.lower()} AFTER {event} ON node "
                       f"BEGIN INSERT INTO node_writes VALUES ({row}.node_id); END")
    return lambda: dict(db.execute_sql(
        "SELECT node.node_id, COUNT(node_writes.node_id) FROM node "
        "LEFT JOIN node_writes ON node_writes.node_id = node.node_id GROUP BY node.node_id").fetchall())


def test_a_refresh_writes_only_the_node_rows_that_changed(database_url, clock):
    app = make_app(database_url, clock)
    client, store = app.test_client(), app.extensions["corral.store"]
    listed = [node("n1"), node("n2"), node("n3", kind="service")]
    store.nodes.sync_nodes(listed, clock())
    versions = row_versions(store.db)
    first = versions()
    assert sorted(first) == ["n1", "n2", "n3"]

    clock.now += 10
    store.nodes.sync_nodes([dict(n) for n in listed], clock())
    assert versions() == first  # the same list: no node row written
    # Every node shows the newest refresh all the same.
    assert {n["synced_at"] for n in client.get("/nodes").json} == {"2027-01-15T08:00:10.000Z"}

    clock.now += 10
    changed = [node("n1"), node("n2", slots=8), node("n3", kind="service", last_heartbeat="2027-01-15T08:00:15.000Z")]
    store.nodes.sync_nodes(changed, clock())
    after = versions()
    assert after["n1"] == first["n1"] and after["n2"] != first["n2"] and after["n3"] != first["n3"]
    shown = {n["node_id"]: n for n in client.get("/nodes").json}
    assert shown["n2"]["slots"] == 8 and shown["n3"]["last_heartbeat"] == "2027-01-15T08:00:15.000Z"
    assert {n["synced_at"] for n in shown.values()} == {"2027-01-15T08:00:20.000Z"}

    store.nodes.sync_nodes([node("n1"), node("n4")], clock())  # n2 and n3 gone, n4 new
    final = versions()
    assert sorted(final) == ["n1", "n4"] and final["n1"] == first["n1"]
    assert sorted(n["node_id"] for n in client.get("/nodes").json) == ["n1", "n4"]


def test_readiness_and_metrics_read_when_the_list_was_last_refreshed(database_url, clock):
    app = make_app(database_url, clock, node_refresh_secs=10)
    client, store = app.test_client(), app.extensions["corral.store"]
    assert store.nodes.list_synced_at() is None  # no node listed yet
    store.nodes.sync_nodes([node("n1")], clock())
    clock.now += 25
    store.nodes.sync_nodes([node("n1")], clock())  # unchanged: its row keeps its first write's time
    clock.now += 5
    assert store.nodes.list_synced_at() == clock() - 5
    assert client.get("/readyz").json["checks"]["node_list_age_secs"] == 5.0
    assert "corral_scheduler_node_list_age_seconds 5.0" in client.get("/metrics").text
