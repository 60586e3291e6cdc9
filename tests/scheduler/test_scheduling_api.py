"""Scheduling through the API, on each backend: constraints and pools, reservations,
priorities with aging, delayed jobs, the reason a pending job waits and why."""
import datetime

import pytest

from corral.scheduler.loops import Background
from corral.scheduler.service import Scheduler
from corral.scheduler.store import placing as store_module
from corral.scheduler.store.placement_reads import PlacementReads
from scheduler_app import end_attempt, make_app, submit

HOUR = 3600.0


def nodes(store, clock, *specs):
    """Nodes as the registry lists them: each a dict with node_id and what differs."""
    listed = [{"address": "127.0.0.1", "kind": "compute", "slots": 4, "status": "healthy", **spec}
              for spec in specs]
    store.nodes.sync_nodes(listed, clock())
    background_pass(store, clock)


def background_pass(store, clock):
    """What the background loop does for placement: place, then keep the reasons."""
    Scheduler(store).place(clock())
    store.placing.explain(clock())


def sized(node_id, memory=16_384, cpu=1600, **extra):
    return {"node_id": node_id, "max_memory_mb": memory, "max_cpu_percent": cpu,
            "default_limits": {"run": {"memory_mb": 512, "cpu_percent": 100},
                               "service": {"memory_mb": 1024, "cpu_percent": 200}}, **extra}


def job(client, job_id):
    return client.get(f"/jobs/{job_id}").json


def iso(ts):
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


# ---- constraints and pools ------------------------------------------------------------------

def test_a_constrained_job_goes_only_to_a_matching_node_and_waits_with_the_reason(client, store, clock):
    nodes(store, clock, sized("a", labels={"zone": "a"}), sized("b", labels={"zone": "b", "gpu": "a100"}))
    gpu = submit(client, command="x", constraints=[{"label": "zone", "op": "=", "value": "b"},
                                                   {"label": "gpu", "op": "exists"}])
    assert gpu["node_id"] == "b"
    assert gpu["constraints"] == [{"label": "zone", "op": "=", "value": "b"}, {"label": "gpu", "op": "exists"}]
    assert gpu["pending_reason"] == {"code": "placed", "message": "placed on b, waiting for it to start the job",
                                     "node_id": "b"}
    elsewhere = submit(client, command="x", constraints=[{"label": "zone", "op": "in", "value": ["c", "d"]}])
    assert elsewhere["node_id"] is None  # accepted: a node of zone c may join
    background_pass(store, clock)
    reason = job(client, elsewhere["job_id"])["pending_reason"]
    assert reason["code"] == "constraints_unmet"
    assert reason["constraint"] == {"label": "zone", "op": "in", "value": ["c", "d"]}
    listed = client.get("/jobs?pending_reason=constraints_unmet").json
    assert [j["job_id"] for j in listed] == [elsewhere["job_id"]]
    nodes(store, clock, sized("a", labels={"zone": "a"}), sized("b", labels={"zone": "b", "gpu": "a100"}),
          sized("c", labels={"zone": "c"}))
    assert job(client, elsewhere["job_id"])["node_id"] == "c"


def test_a_request_s_placement_reads_one_page_past_its_first_and_the_background_pass_goes_deeper(
        client, store, clock, monkeypatch):
    # Jobs no node can take head the queue; a job that fits is behind them. A submit's
    # placement gives up after one page past its first read (the node's four free slots),
    # so it does not read the whole queue on every request; the background pass finds it.
    monkeypatch.setattr(store_module, "QUEUE_PAGE", 2)
    nodes(store, clock, sized("a", labels={"zone": "a"}))
    blocked = [submit(client, command="x", constraints=[{"label": "zone", "op": "=", "value": "c"}])
               for _ in range(6)]
    behind = submit(client, command="x")
    assert behind["node_id"] is None and all(j["node_id"] is None for j in blocked)
    background_pass(store, clock)
    assert job(client, behind["job_id"])["node_id"] == "a"
    assert {job(client, j["job_id"])["pending_reason"]["code"] for j in blocked} == {"constraints_unmet"}


def test_a_pool_is_the_pool_label_and_unlabelled_nodes_are_in_default(client, store, clock):
    nodes(store, clock, sized("a"), sized("g", labels={"pool": "gpu"}))
    assert submit(client, command="x", pool="gpu")["node_id"] == "g"
    assert submit(client, command="x", pool="default")["node_id"] == "a"
    assert client.get("/nodes").json[1]["pool"] == "gpu" and client.get("/nodes").json[0]["pool"] == "default"


# ---- reservations ------------------------------------------------------------------------------

def test_jobs_reserve_memory_and_one_that_does_not_fit_waits_until_a_job_ends(client, store, clock):
    nodes(store, clock, sized("a", memory=16_384))
    big = [submit(client, command="x", memory_mb=8192) for _ in range(4)]
    assert [j["node_id"] for j in big] == ["a", "a", None, None]
    assert big[0]["reserved"] == {"memory_mb": 8192, "cpu_percent": 100}  # CPU: the node's run default
    background_pass(store, clock)
    waiting = job(client, big[2]["job_id"])["pending_reason"]
    assert waiting["code"] == "no_capacity" and waiting["lacking"] == ["memory"]
    node = client.get("/nodes").json[0]
    assert node["allocatable"] == {"memory_mb": 16_384, "cpu_percent": 1600}
    assert node["reserved"] == {"memory_mb": 16_384, "cpu_percent": 200}
    end_attempt(client, big[0]["job_id"])
    assert job(client, big[2]["job_id"])["node_id"] == "a" and job(client, big[3]["job_id"])["node_id"] is None


def test_a_job_without_limits_reserves_the_node_s_default_and_the_reserve_counts(client, store, clock):
    node = sized("a", memory=2000, reserved_memory_mb=900)  # 1,100 MB allocatable: two 512 MB run jobs
    nodes(store, clock, node)
    placed = [submit(client, command="x")["node_id"] for _ in range(3)]
    assert placed == ["a", "a", None]
    listed = client.get("/nodes").json[0]
    assert listed["allocatable"]["memory_mb"] == 1100 and listed["reserved"]["memory_mb"] == 1024


def test_get_nodes_leaves_out_a_node_the_registry_sync_adds_while_it_reads(client, store, clock, monkeypatch):
    nodes(store, clock, sized("a"))
    read = PlacementReads.nodes
    added = []

    def racing(self, *args, **kwargs):
        found = read(self, *args, **kwargs)
        if not added:  # between GET /nodes' two reads, the sync adds node b
            added.append(True)
            listed = [{"address": "127.0.0.1", "kind": "compute", "slots": 4, "status": "healthy", **sized(n)}
                      for n in ("a", "b")]
            store.nodes.sync_nodes(listed, clock())
        return found

    monkeypatch.setattr(PlacementReads, "nodes", racing)
    answer = client.get("/nodes")
    assert answer.status_code == 200 and [n["node_id"] for n in answer.json] == ["a"]
    assert [n["node_id"] for n in client.get("/nodes").json] == ["a", "b"]


def test_get_nodes_shows_what_the_jobs_use_once_the_agent_says(client, store, clock):
    nodes(store, clock, sized("a", labels={"zone": "a"}))
    assert client.get("/nodes").json[0]["used"] is None
    client.post("/nodes/a/lease", json={"usage": {"memory_mb": 300, "cpu_percent": 40}})
    listed = client.get("/nodes").json[0]
    assert listed["used"] == {"memory_mb": 300, "cpu_percent": 40} and listed["labels"] == {"zone": "a"}


def test_binpack_fills_one_node_before_the_next(database_url, clock):
    app = make_app(database_url, clock, max_jobs_per_node=8, placement_policy="binpack")
    client, store = app.test_client(), app.extensions["corral.store"]
    nodes(store, clock, sized("a", memory=4096), sized("b", memory=8192))
    assert [submit(client, command="x", memory_mb=1024)["node_id"] for _ in range(5)] == ["a"] * 4 + ["b"]


def test_spread_takes_the_node_with_the_most_free_memory(database_url, clock):
    app = make_app(database_url, clock, max_jobs_per_node=8, placement_policy="spread")
    client, store = app.test_client(), app.extensions["corral.store"]
    nodes(store, clock, sized("a", memory=4096), sized("b", memory=8192))
    # b has 4,096 MB more: it takes jobs until a has as much free, then a has more free CPU.
    assert [submit(client, command="x", memory_mb=1024)["node_id"] for _ in range(6)] == ["b"] * 4 + ["a", "a"]


# ---- priorities --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_priorities_order_a_backlog(client, store, clock):
    nodes(store, clock, sized("a", slots=1))
    busy = submit(client, command="busy")
    low, high, normal = (submit(client, command=name, priority=p) for name, p in (("low", 10), ("high", 90),
                                                                                   ("normal", None)))
    assert low["priority"] == 10 and normal["priority"] == 50
    order = []
    current = busy
    for _ in range(3):
        end_attempt(client, current["job_id"])
        current = next(j for j in client.get("/jobs?status=pending").json if j["node_id"] == "a")
        order.append(current["command"])
    assert order == ["high", "normal", "low"]


def test_a_waiting_job_gains_priority_as_it_waits(database_url, clock):
    """One point per PRIORITY_AGING_SECS: a priority-0 job that waited 50 points' worth
    goes before a priority-100 job that came later than that."""
    app = make_app(database_url, clock, max_jobs_per_node=1, priority_aging_secs=1.0)
    client, store = app.test_client(), app.extensions["corral.store"]
    nodes(store, clock, sized("a", slots=1))
    busy = submit(client, command="busy")
    old = submit(client, command="old", priority=0)
    clock.now += 99.0  # 99 points of waiting: more than the 100 - 0 = 100 points between them? not yet
    early = submit(client, command="early-urgent", priority=100)
    clock.now += 2.0
    late = submit(client, command="late-urgent", priority=100)
    end_attempt(client, busy["job_id"])
    assert job(client, early["job_id"])["node_id"] == "a"  # came within 100 s of the old job: goes first
    end_attempt(client, early["job_id"])
    assert job(client, old["job_id"])["node_id"] == "a"    # the late one came more than 100 s after it
    assert job(client, late["job_id"])["node_id"] is None


# ---- delayed jobs ----------------------------------------------------------------------------------------

def test_run_at_is_honoured_and_the_job_can_be_cancelled_while_it_waits(client, store, clock):
    nodes(store, clock, sized("a"))
    later = submit(client, command="x", run_at=iso(clock.now + HOUR))
    assert later["node_id"] is None and later["run_at"] == iso(clock.now + HOUR).replace("Z", ".000Z")
    assert later["pending_reason"]["code"] == "scheduled"
    assert later["pending_reason"]["until"] == later["run_at"]
    assert [j["job_id"] for j in client.get("/jobs?pending_reason=scheduled").json] == [later["job_id"]]
    delayed = submit(client, command="y", delay_secs=30)
    assert delayed["run_at"] is not None and delayed["node_id"] is None
    assert store.snapshot.next_due(clock.now) == clock.now + 30
    clock.now += 29
    background_pass(store, clock)
    assert job(client, delayed["job_id"])["node_id"] is None
    clock.now += 1
    background_pass(store, clock)
    assert job(client, delayed["job_id"])["node_id"] == "a"
    assert client.post(f"/jobs/{later['job_id']}/cancel", json={}).json["status"] == "cancelled"
    assert store.snapshot.next_due(clock.now) is None


def test_a_run_at_with_an_offset_is_the_same_instant(client, store, clock):
    nodes(store, clock, sized("a"))
    at = datetime.datetime.fromtimestamp(clock.now + HOUR, datetime.timezone(datetime.timedelta(hours=-5)))
    assert submit(client, command="x", run_at=at.isoformat())["run_at"] == iso(clock.now + HOUR).replace(
        "Z", ".000Z")


def test_the_background_loop_wakes_when_the_next_job_comes_due(client, store, clock):
    nodes(store, clock, sized("a"))
    background = Background(store, registry=None)
    background.tenure.token = 1  # as the lease holder
    assert background.delay_after(clock.now) == store.settings.dispatch_interval_secs
    submit(client, command="x", delay_secs=0.25)
    assert background.delay_after(clock.now) == pytest.approx(0.25)


# ---- why a job waits ----------------------------------------------------------------------------------------

def test_each_reason_appears_when_it_should(database_url, clock):
    app = make_app(database_url, clock, max_jobs_per_node=1, retry_base_secs=60.0)
    client, store = app.test_client(), app.extensions["corral.store"]
    lonely = submit(client, command="x")
    background_pass(store, clock)
    assert job(client, lonely["job_id"])["pending_reason"]["code"] == "no_healthy_node"
    nodes(store, clock, sized("a", slots=1), sized("d", slots=1, drained=True, labels={"disk": "ssd"}),
          {"node_id": "u", "status": "unhealthy"})
    assert job(client, lonely["job_id"])["pending_reason"]["code"] == "placed"
    full = submit(client, command="x")
    pinned = submit(client, command="x", instance_id="u")
    drained = submit(client, command="x", constraints=[{"label": "disk", "op": "=", "value": "ssd"}])
    background_pass(store, clock)
    codes = {j["job_id"]: j["pending_reason"]["code"] for j in client.get("/jobs?status=pending").json}
    assert codes[full["job_id"]] == "no_capacity"
    assert codes[pinned["job_id"]] == "pinned_node_unavailable"
    assert codes[drained["job_id"]] == "draining"
    # A failed attempt with retries left waits out its backoff.
    running = job(client, lonely["job_id"])
    body = {"node_id": "a", "attempt": running["attempt"]}
    client.post(f"/jobs/{lonely['job_id']}/status", json=dict(body, status="running"))
    client.post(f"/jobs/{lonely['job_id']}/status", json=dict(body, status="failed", exit_code=1))
    assert job(client, lonely["job_id"])["pending_reason"]["code"] == "backoff"
    assert [j["job_id"] for j in client.get("/jobs?pending_reason=backoff").json] == [lonely["job_id"]]
    assert client.get("/jobs/job-1").json["pending_reason"]["until"].endswith("Z")
    done = client.get("/jobs?status=running").json
    assert all(j["pending_reason"] is None for j in done)


def test_why_names_the_closest_nodes_and_what_each_lacks(client, store, clock):
    nodes(store, clock, sized("a", memory=4096, labels={"zone": "a"}), sized("b", memory=65_536, labels={"zone": "b"}))
    waiting = submit(client, command="x", memory_mb=8192, constraints=[{"label": "zone", "op": "=", "value": "a"}])
    why = client.get(f"/jobs/{waiting['job_id']}/why").json
    assert why["job_id"] == waiting["job_id"]
    assert [n["node_id"] for n in why["closest_nodes"]] == ["b", "a"]  # the fewest shortfalls first
    assert why["closest_nodes"][0]["lacks"] == ["zone = a (the node has zone=b)"]
    assert why["closest_nodes"][1]["lacks"] == ["memory_mb 8192 is over the node's maximum 4096",
                                                "needs 8192 MB of memory, 4096 MB unreserved"]
    placed = submit(client, command="x", constraints=[{"label": "zone", "op": "=", "value": "b"}])
    end_attempt(client, placed["job_id"])
    conflict = client.get(f"/jobs/{placed['job_id']}/why")
    assert conflict.status_code == 409 and "does not wait" in conflict.json["error"]
    assert client.get("/jobs/job-999/why").status_code == 404


# ---- bad input --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, says", [
    ({"constraints": [{"label": "zone", "op": "~", "value": "a"}]}, "'op' must be one of"),
    ({"constraints": [{"label": "zone", "op": "="}]}, "op '=' needs a string 'value'"),
    ({"constraints": [{"label": "zone", "op": "in", "value": "a"}]}, "non-empty list of strings"),
    ({"constraints": [{"label": "zone", "op": "in", "value": []}]}, "non-empty list of strings"),
    ({"constraints": [{"label": "gpu", "op": "exists", "value": "x"}]}, "takes no 'value'"),
    ({"constraints": [{"label": "a b", "op": "exists"}]}, "'label' must be letters"),
    ({"constraints": {"label": "zone"}}, "'constraints' must be a list of constraints"),
    ({"pool": "no pool"}, "'pool' must be letters"),
    ({"priority": 101}, "'priority' must be between 0 and 100"),
    ({"priority": -1}, "'priority' must be between 0 and 100"),
    ({"run_at": "2026-12-24T02:00:00"}, "'run_at' needs a zone"),
    ({"run_at": "tomorrow"}, "'run_at' must be an ISO-8601 time"),
    ({"run_at": "2099-01-01T00:00:00Z"}, "'run_at' must be at most a year ahead"),
    ({"run_at": "2026-12-24T02:00:00Z", "delay_secs": 5}, "give 'run_at' or 'delay_secs', not both"),
    ({"delay_secs": -1}, "'delay_secs' must be"),
])
def test_bad_scheduling_fields_are_refused_and_change_nothing(client, body, says):
    refused = client.post("/jobs", json={"command": "x", **body})
    assert refused.status_code == 400 and says in refused.json["error"], refused.json
    batch = client.post("/jobs/batch", json={"jobs": [{"command": "x"}, {"command": "x", **body}]})
    assert batch.status_code == 400 and batch.json["errors"][0]["index"] == 1
    assert client.get("/jobs").json == []


def test_a_batch_carries_the_scheduling_fields(client, store, clock):
    nodes(store, clock, sized("a", labels={"zone": "a"}))
    jobs = client.post("/jobs/batch", json={"jobs": [
        {"command": "x", "priority": 70, "constraints": [{"label": "zone", "op": "!=", "value": "b"}]},
        {"command": "y", "pool": "default", "delay_secs": 60}]}).json
    assert jobs[0]["node_id"] == "a" and jobs[0]["priority"] == 70
    assert jobs[1]["node_id"] is None and jobs[1]["pending_reason"]["code"] == "scheduled"
