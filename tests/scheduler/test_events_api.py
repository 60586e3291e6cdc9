"""`GET /events` through the app: what each transition and node change sends, the
filters, resuming with Last-Event-ID (PostgreSQL's commits out of id order too),
the retention, keep-alives and the bound on open streams."""
import json
import threading

import psycopg
import pytest

from helpers import wait_for
from scheduler_app import Clock, end_attempt, make_app, set_nodes, submit

from corral.scheduler.event_log import EventLog
from corral.shared import sse
from corral.shared.credentials import Credentials
from corral.server.db import is_postgres
from corral.shared.timeutil import iso


@pytest.fixture
def clock():
    return Clock()


def app_for(database_url, clock, **overrides):
    # Streams that end at once: a test reads the whole answer of each.
    overrides.setdefault("events_stream_max_secs", 0.0)
    return make_app(database_url, clock, **overrides)


def read(client, last_event_id=None, query=""):
    headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
    answer = client.get(f"/events{query}", headers=headers)
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert answer.mimetype == "text/event-stream"
    messages = list(sse.messages([answer.get_data()]))
    assert messages[-1].event == "end"  # EVENTS_STREAM_MAX_SECS
    return messages[:-1]


def position(client):
    """Where a stream that starts now starts (its `open` event's id)."""
    opened = [m for m in read(client) if m.event == "open"]
    assert len(opened) == 1 and json.loads(opened[0].data) == {"resumed": False}
    return opened[0].id


def bodies(messages, event="job"):
    return [json.loads(m.data) for m in messages if m.event == event]


def test_every_transition_of_a_job_is_streamed_in_order(database_url, clock):
    client = app_for(database_url, clock).test_client()
    store = client.application.extensions["corral.store"]
    set_nodes(store, clock, "n1")
    start = position(client)
    job = submit(client, command="true", max_retries=1)
    set_nodes(store, clock, "n1")  # the background pass places it
    end_attempt(client, job["job_id"], "failed", exit_code=3)
    set_nodes(store, clock, "n1")
    end_attempt(client, job["job_id"], "done")
    messages = read(client, start)
    assert messages[0].event == "open" and json.loads(messages[0].data) == {"resumed": True}
    steps = [(e["from"], e["to"], e["attempt"]) for e in bodies(messages)]
    # Submitted, placed, running, failed into a retry, placed again, running, done.
    assert steps == [(None, "pending", 0), ("pending", "pending", 1), ("pending", "running", 1),
                     ("running", "pending", 1), ("pending", "pending", 2), ("pending", "running", 2),
                     ("running", "done", 2)]
    done = bodies(messages)[-1]
    assert done["job_id"] == job["job_id"] and done["node_id"] == "n1" and done["at"] == iso(clock.now)
    # The same history as the job's own events, reasons and all.
    history = client.get(f"/jobs/{job['job_id']}/events").json
    assert [e["reason"] for e in bodies(messages)] == [e["reason"] for e in history]


def test_a_stream_resumes_after_any_event_without_gaps_or_repeats(database_url, clock):
    client = app_for(database_url, clock).test_client()
    start = position(client)
    for _ in range(5):
        submit(client)
    everything = [m for m in read(client, start) if m.event == "job"]
    assert len(everything) == 5
    for i, message in enumerate(everything):
        after = [m for m in read(client, message.id) if m.event == "job"]
        assert [m.data for m in after] == [m.data for m in everything[i + 1:]]
    # Ids only grow along the stream, and the last says where a fresh stream starts.
    assert len({m.id for m in everything}) == 5


def test_filters_by_job_node_and_type(database_url, clock):
    client = app_for(database_url, clock).test_client()
    store = client.application.extensions["corral.store"]
    start = position(client)
    set_nodes(store, clock, "n1", "n2")
    first, second = submit(client, command="true", instance_id="n1"), submit(client, command="true", instance_id="n2")
    set_nodes(store, clock, "n1", "n2")
    only_first = bodies(read(client, start, f"?job_id={first['job_id']}"))
    assert only_first and {e["job_id"] for e in only_first} == {first["job_id"]}
    on_n2 = read(client, start, "?node_id=n2")
    assert {json.loads(m.data)["node_id"] for m in on_n2 if m.event != "open"} == {"n2"}
    assert second["job_id"] in {e["job_id"] for e in bodies(on_n2)}
    nodes_only = read(client, start, "?type=node")
    assert {m.event for m in nodes_only} == {"open", "node"}
    both = read(client, start, "?type=node,job")
    assert {m.event for m in both} == {"open", "node", "job"}


def test_node_changes_are_events(database_url, clock):
    client = app_for(database_url, clock).test_client()
    store = client.application.extensions["corral.store"]
    start = position(client)
    set_nodes(store, clock, "n1")
    set_nodes(store, clock, ("n1", "unhealthy"), "n2")
    set_nodes(store, clock, "n1", "n2")
    store.nodes.sync_nodes([{"node_id": "n1", "status": "healthy", "drained": True}], clock())
    store.nodes.sync_nodes([{"node_id": "n1", "status": "healthy", "drained": False}], clock())
    changes = [(e["node_id"], e["change"]) for e in bodies(read(client, start, "?type=node"), "node")]
    assert changes == [("n1", "registered"), ("n1", "unhealthy"), ("n2", "registered"), ("n1", "healthy"),
                       ("n1", "drained"), ("n2", "deregistered"), ("n1", "undrained")]
    set_nodes(store, clock, "n1")  # the same list again: nothing changed, nothing said
    assert len(bodies(read(client, start, "?type=node"), "node")) == len(changes)


@pytest.mark.parametrize("query, header, says", [
    ("?type=jobs", None, "unknown event type"),
    ("?job_id=42", None, "job id"),
    ("", "banana", "not an event id"),
    ("", "-1", "not an event id"),
    ("", "1.2", "not an event id"),
    ("", "9" * 30, "not an event id"),
])
def test_bad_requests_are_refused_before_a_stream_begins(tmp_path, clock, query, header, says):
    client = app_for(f"sqlite:///{tmp_path}/s.db", clock).test_client()
    answer = client.get(f"/events{query}", headers={"Last-Event-ID": header} if header else {})
    assert answer.status_code == 400 and says in answer.json["error"]


def test_a_position_older_than_the_retention_says_what_was_missed(database_url, clock):
    client = app_for(database_url, clock).test_client()
    log = EventLog(client.application.extensions["corral.store"].db)
    start = position(client)
    for _ in range(4):
        submit(client)
        clock.now += 10
    with log.db.connection_context():
        assert log.prune(clock.now - 25, 100) == 2  # the first two are older than 25 s
    messages = read(client, start)
    assert messages[0].event == "missed" and messages[1].event == "open"
    assert "EVENTS_RETENTION_SECS" in json.loads(messages[0].data)["reason"]
    assert len(bodies(messages)) == 2
    # Resuming from the `missed` event's id goes on from the oldest kept, saying nothing more.
    again = read(client, messages[0].id)
    assert again[0].event == "open" and len(bodies(again)) == 2


def test_the_newest_event_is_never_pruned(tmp_path, clock):
    """SQLite would give a deleted newest id to the next row: a client past it would skip it."""
    client = app_for(f"sqlite:///{tmp_path}/s.db", clock).test_client()
    log = EventLog(client.application.extensions["corral.store"].db)
    submit(client)
    submit(client)
    with log.db.connection_context():
        assert log.prune(clock.now + 100, 100) == 1
        after = log.now()
    submit(client)
    assert len(bodies(read(client, str(after)))) == 1


@pytest.mark.slow
def test_an_idle_stream_sends_keep_alives_with_its_position(tmp_path, clock):
    client = app_for(f"sqlite:///{tmp_path}/s.db", clock, events_keepalive_secs=0.05,
                     events_stream_max_secs=0.5).test_client()
    body = client.get("/events").get_data(as_text=True)
    assert body.startswith("retry: ")
    assert ": keep-alive" in body
    assert body.rstrip().split("\n")[-2] == "event: end"


def test_streams_beyond_the_process_budget_are_refused_with_the_reason(tmp_path, clock):
    app = app_for(f"sqlite:///{tmp_path}/s.db", clock, events_streams_max=1, events_stream_max_secs=60.0)
    client = app.test_client()
    held = client.get("/events", buffered=False)
    assert held.status_code == 200
    refused = client.get("/events")
    assert refused.status_code == 503 and "EVENTS_STREAMS_MAX" in refused.json["error"]
    assert refused.headers["Retry-After"]
    assert 'corral_event_streams_total{outcome="refused"}' in client.get("/metrics").get_data(as_text=True)
    held.close()  # the client went away: its place is free again
    assert client.get("/events", buffered=False).status_code == 200


def test_full_streams_never_refuse_a_claim_or_a_submit(tmp_path, clock):
    """Streams have a budget of their own: with it full, an agent's waiting claim still
    waits and takes the work placed on its node, and a submit is answered."""
    app = app_for(f"sqlite:///{tmp_path}/s.db", clock, events_streams_max=1, long_poll_max_waiters=1,
                  events_stream_max_secs=60.0)
    client = app.test_client()
    store = app.extensions["corral.store"]
    set_nodes(store, clock, "n1")
    room = app.extensions["corral.wait_room"]
    held = client.get("/events", buffered=False)
    answers = []
    agent = threading.Thread(target=lambda: answers.append(client.post("/nodes/n1/claim",
                                                                       json={"max": 1, "wait_secs": 20})))
    try:
        assert client.get("/events").status_code == 503
        assert room.waiting == 0  # the open stream took no claim's place
        agent.start()
        wait_for(lambda: room.waiting == 1 or answers, timeout=30, message="the claim to wait")
        assert not answers, answers[0].headers  # it waits: not answered "busy"
        job = submit(client, command="true", instance_id="n1")
        agent.join(timeout=60)
        claim = answers[0]
        if claim.headers.get("X-Corral-Long-Poll") == "again":  # the claim had waited past FRESH_SECS
            claim = client.post("/nodes/n1/claim", json={"max": 1, "wait_secs": 0})
        assert claim.status_code == 200 and [j["job_id"] for j in claim.json] == [job["job_id"]]
    finally:
        held.close()
        room.close()
        agent.join(timeout=60) if agent.is_alive() else None


READER, OPERATOR = "events-test-reader-3b8e1f0c7a", "events-test-operator-6d2a9c4f1e"


@pytest.mark.parametrize("tokens", [True, False], ids=["tokens", "tokenless"])
def test_one_credential_cannot_take_every_stream(tmp_path, clock, tokens):
    """At EVENTS_STREAMS_PER_CREDENTIAL the next stream of that credential (a token;
    without tokens, a client address) is refused with 429 and the reason, while
    another credential still opens one."""
    extra = {"credentials": Credentials(OPERATOR, "events-test-agent-secret-5f1c8b2e", reader=READER)} if tokens else {}
    app = app_for(f"sqlite:///{tmp_path}/s.db", clock, events_streams_per_credential=2, events_stream_max_secs=60.0,
                  **extra)
    client = app.test_client()
    if tokens:
        first, second = {"headers": bearer(READER)}, {"headers": bearer(OPERATOR)}
    else:
        first, second = {"environ_base": {"REMOTE_ADDR": "127.0.0.1"}}, {"environ_base": {"REMOTE_ADDR": "127.0.0.2"}}
    held = [client.get("/events", buffered=False, **first) for _ in range(2)]
    try:
        assert [h.status_code for h in held] == [200, 200]
        refused = client.get("/events", **first)
        assert refused.status_code == 429, refused.get_data(as_text=True)
        assert "EVENTS_STREAMS_PER_CREDENTIAL" in refused.json["error"] and refused.headers["Retry-After"]
        other = client.get("/events", buffered=False, **second)
        assert other.status_code == 200
        other.close()
        metrics_text = client.get("/metrics", **({"headers": bearer(OPERATOR)} if tokens else {})).get_data(True)
        assert 'corral_event_streams_total{outcome="refused_credential"}' in metrics_text
        held.pop().close()  # one closed: the credential may open another
        held.append(client.get("/events", buffered=False, **first))
        assert held[-1].status_code == 200
    finally:
        for h in held:
            h.close()


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.slow
def test_an_idle_stream_makes_no_query_and_wakes_for_an_event(tmp_path, clock, monkeypatch):
    """An open stream sleeps until the change feed reports a commit with events for it:
    over seconds of quiet it sends its keep-alives without one query, then an event
    committed by a submit arrives at once."""
    app = app_for(f"sqlite:///{tmp_path}/s.db", clock, events_keepalive_secs=0.2, events_stream_max_secs=60.0)
    client = app.test_client()
    db = app.extensions["corral.store"].db
    queries = []
    execute_sql = db.execute_sql
    monkeypatch.setattr(db, "execute_sql", lambda sql, *a, **k: (queries.append(sql), execute_sql(sql, *a, **k))[1])
    answer = client.get("/events", buffered=False)
    assert answer.status_code == 200
    text = []
    chunks = iter(answer.response)

    def read_all():
        for chunk in chunks:
            text.append(chunk.decode())

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    try:
        wait_for(lambda: "keep-alive" in "".join(text), timeout=30, message="a first keep-alive")
        wait_for(lambda: app.extensions["corral.stream_hub"].mark is not None, timeout=30,
                 message="the hub's first look")
        queries.clear()
        keep_alives = "".join(text).count("keep-alive")
        wait_for(lambda: "".join(text).count("keep-alive") >= keep_alives + 10, timeout=60,
                 message="ten more keep-alives")  # 2 s of quiet
        assert queries == []
        job = submit(client)
        wait_for(lambda: job["job_id"] in "".join(text), timeout=30, message="the submit's event")
    finally:
        app.extensions["corral.stream_hub"].stop()  # the worker stops: the stream ends at once
        reader.join(timeout=30)
        answer.close()
    assert not reader.is_alive()


@pytest.mark.e2e
def test_postgres_sends_nothing_an_open_transaction_could_still_precede(pg_url, clock):
    """An event whose id was drawn first but committed last is not skipped: the later
    commit is held back until the earlier transaction ends."""
    assert is_postgres(pg_url)
    client = app_for(pg_url, clock).test_client()
    start = position(client)
    with psycopg.connect(pg_url) as slow:
        slow.execute("SET search_path TO corral_scheduler")
        slow.execute("INSERT INTO stream_event (at, type, data) VALUES (1, 'log', '{\"slow\": true}')")
        job = submit(client)  # its event has a larger id and commits first
        held = read(client, start)
        assert bodies(held) == [] and bodies(held, "log") == []
        resume = held[-1].id
        slow.commit()
    messages = read(client, resume)
    assert bodies(messages, "log") == [{"slow": True, "at": iso(1.0)}]
    assert [e["job_id"] for e in bodies(messages)] == [job["job_id"]]
    assert [m.event for m in messages[1:]] == ["log", "job"]  # in id order


@pytest.mark.e2e
def test_postgres_streams_are_not_held_back_by_another_databases_transaction(pg_server, pg_url, clock):
    """Another application's long transaction on the same server (another database)
    holds nothing back: only the scheduler's own database's transactions count."""
    client = app_for(pg_url, clock).test_client()
    start = position(client)
    other = pg_server.create_database()
    try:
        with psycopg.connect(pg_server.url(other)) as elsewhere:
            elsewhere.execute("CREATE TABLE t (x int)")
            elsewhere.execute("INSERT INTO t VALUES (1)")  # a writing transaction, left open
            job = submit(client)
            assert [e["job_id"] for e in bodies(read(client, start))] == [job["job_id"]]
            elsewhere.rollback()
    finally:
        pg_server.drop_database(other)


def test_many_streams_share_one_read_of_new_events(tmp_path, clock, monkeypatch):
    """Twenty streams following a busy cluster do not each query for every commit:
    the hub reads the new events once and every stream sends them from there."""
    streams = 20
    app = app_for(f"sqlite:///{tmp_path}/s.db", clock, events_stream_max_secs=60.0,
                  events_streams_max=streams, events_streams_per_credential=streams)
    client = app.test_client()
    db = app.extensions["corral.store"].db
    queries = []
    execute_sql = db.execute_sql
    monkeypatch.setattr(db, "execute_sql", lambda sql, *a, **k: (queries.append(sql), execute_sql(sql, *a, **k))[1])
    answers = [client.get("/events", buffered=False) for _ in range(streams)]
    texts = [[] for _ in answers]

    def read_all(answer, text):
        for chunk in answer.response:
            text.append(chunk.decode())

    readers = [threading.Thread(target=read_all, args=pair, daemon=True) for pair in zip(answers, texts)]
    for reader in readers:
        reader.start()
    hub = app.extensions["corral.stream_hub"]
    try:
        wait_for(lambda: hub.streams == streams and hub.mark is not None, timeout=30,
                 message="every stream to follow the hub")
        jobs = [submit(client)["job_id"] for _ in range(3)]
        queries.clear()  # the submits' own queries were made
        jobs += [submit(client)["job_id"] for _ in range(3)]
        wait_for(lambda: all(all(j in "".join(t) for j in jobs) for t in texts), timeout=60,
                 message="every stream to send every job's event")
        reads = [q for q in queries if "stream_event" in q and "INSERT" not in q]
        assert len(reads) < streams, reads  # not one read (or more) per stream
    finally:
        hub.stop()
        for reader in readers:
            reader.join(timeout=30)
        for answer in answers:
            answer.close()
