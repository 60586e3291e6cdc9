"""The scheduler's HTTP API (Flask). Run by `corral-scheduler` under gunicorn."""
import logging
import time
from collections.abc import Callable
from urllib.parse import urlencode

from flask import Flask, after_this_request, g, request
import peewee
from peewee import fn

from corral.shared import tracecontext

from corral.server import auth, guards, revocations, serve as server
from corral.server import db as dbmod
from corral.server import migrations
from corral.server.metrics import serve_metrics
from corral.shared.clients import RegistryClient
from corral.shared.contract import encode, respond
from corral.shared.errors import BadRequest, TooLarge
from corral.server.http import (base_app, error_response, query_choice, query_float, query_int, read_json_object,
                                request_body, serve_openapi, serve_readiness)
from corral.shared.states import ALL
from corral.shared.wire import (IDEMPOTENCY_HEADER, JOB_TYPES, LOG_ATTEMPT_HEADER, LOG_CHUNK_MAX_BYTES,
                               LOG_COMPLETE_HEADER, LOG_SIZE_HEADER, LONG_POLL_HEADER)

from corral.server.changefeed import ChangeFeed

from . import (contract, drains, event_stream, events, longpoll, loops, metrics, openapi, pages, revocation, sampler,
               schedule_loop, sns_outbox, spans, sqs_intake, ui, validation, views, waiting)
from .event_log import EventLog
from . import stream_hub
from .job_logs import JobLogs
from .migrations import MIGRATIONS
from .schedules import Schedules
from .models import Node, database
from .settings import SchedulerSettings
from .service import Scheduler
from .store import Store

log = logging.getLogger(__name__)

SERVICE = "scheduler"  # its PostgreSQL schema: corral_scheduler
MAX_PAGE = 1000
MAX_UNIX_SECS = 253402300799.0  # 9999-12-31T23:59:59Z: GET /stats/history?since= at most
# Answer header of a claim that answered [] before its deadline: "busy" (the process's
# waiting room is full) or "stopping" (the worker is shutting down): ask again after a
# pause; "again" (work came for the node after the claim had waited a while): ask
# again at once. See longpoll.py.

# Who may call each route (control-plane/server/auth.py); a route missing here is operator-only.
# Agents: claims, leases, reports, live output and the original design's poll, each
# for the node of their credential only. The read-only token: every read (READ),
# with env var values hidden.
ACCESS = {
    "stats": auth.READ,
    "stats_history": auth.READ,
    "list_nodes": auth.READ,
    "submit": auth.OPERATOR,
    "submit_batch": auth.OPERATOR,
    "list_jobs": auth.readable(auth.either(auth.NODE_IN_QUERY)),
    "read_job": auth.READ,
    "why_it_waits": auth.READ,
    "read_array": auth.READ,
    "cancel_array": auth.OPERATOR,
    "list_schedules": auth.READ,
    "create_schedule": auth.OPERATOR,
    "read_schedule": auth.READ,
    "change_schedule": auth.OPERATOR,
    "delete_schedule": auth.OPERATOR,
    "schedule_runs": auth.READ,
    "list_concurrency": auth.READ,
    "set_concurrency": auth.OPERATOR,
    "remove_concurrency": auth.OPERATOR,
    "job_events": auth.READ,
    "events_stream": auth.READ,
    "cancel": auth.OPERATOR,
    "retry": auth.OPERATOR,
    "drain_node": auth.OPERATOR,
    "undrain_node": auth.OPERATOR,
    "claim": auth.agent(auth.NODE_IN_PATH),
    "renew_lease": auth.agent(auth.NODE_IN_PATH),
    "report": auth.agent(auth.NODE_IN_BODY),
    "report_batch": auth.agent(auth.NODE_IN_BODY),
    "live_output": auth.agent(auth.NODE_IN_BODY),
    "put_log_chunk": auth.agent(auth.NODE_IN_RECORD),  # the node is in a header
    "put_log_chunks": auth.agent(auth.NODE_IN_BODY),
    "read_logs": auth.READ,
    "revoke_credential": auth.OPERATOR,
}
# The routes that take raw bytes (application/octet-stream) rather than JSON.
RAW_ROUTES = ("put_log_chunk",)


def open_db(settings: SchedulerSettings) -> peewee.Database:
    """The scheduler's database, bound to its models."""
    db = dbmod.open_database(settings.database_url, settings.sqlite_synchronous, service=SERVICE,
                             options=settings.db_options)
    database.initialize(db)
    return db


def open_store(settings: SchedulerSettings, on_placed: Callable[[set[str]], None] | None = None) -> Store:
    return Store(open_db(settings), settings, on_placed)


def create_schema(settings: SchedulerSettings, check: bool = False) -> list[str]:
    """Apply the database's pending schema migrations (the gunicorn master before the
    workers fork, and `corral-scheduler migrate`); the steps applied. With `check`,
    only the steps pending. A database newer than this code is a SettingError."""
    store = open_store(settings)
    dbmod.check_server(store.db, processes=1)
    try:
        return (migrations.pending if check else migrations.apply)(store.db, MIGRATIONS, settings.db_options.init)
    finally:
        dbmod.close_idle(store.db)  # the master forks the workers next


def registry_client(settings: SchedulerSettings, **kwargs) -> RegistryClient:
    """The scheduler's client of the registry: it reads the node list with the operators' token."""
    return RegistryClient(settings.registry_url, token=settings.credentials.operator,
                          verify=settings.registry_ca_bundle or True, **kwargs)


# PostgreSQL: the waiters' re-check looks for work at least this often even when
# no job event is newer than at its last look (see check_nodes).
FULL_LOOK_SECS = 10.0


def max_streams(settings: SchedulerSettings) -> int:
    """Event streams open at once in this process (EVENTS_STREAMS_MAX, stream_hub.py)."""
    if settings.events_streams_max is not None:
        return settings.events_streams_max
    return stream_hub.default_max_streams(server.worker_threads())


def wait_room(settings: SchedulerSettings, feed: ChangeFeed, store_of: Callable[[], Store]) -> longpoll.WaitRoom:
    """The waiting room of this process's long-poll claims, woken by its change feed
    when another process commits (wakeup.py). `store_of()` gives the store the room
    reads from (made after the room: the store tells the room of its placements)."""
    max_waiters = settings.long_poll_max_waiters
    if max_waiters is None:
        max_waiters = longpoll.default_max_waiters(server.worker_threads(), max_streams(settings))
    elif max_waiters + max_streams(settings) >= server.worker_threads():
        log.warning("LONG_POLL_MAX_WAITERS (%d) and EVENTS_STREAMS_MAX (%d) together may hold all %d threads of a "
                    "worker: submits and reports would wait for a thread", max_waiters, max_streams(settings),
                    server.worker_threads())
    seen: dict = {"mark": object(), "at": float("-inf")}  # the mark and time of the last full look

    def check_nodes(node_ids: set[str], recheck: bool = False) -> set[str]:
        """On the change feed's thread: which waiting nodes have work (one grouped
        query), unless a cheap mark says nothing was placed since the last look.

        Where every commit wakes it (SQLite), most commits (lease renewals, reports,
        submits that placed nothing) placed no job: the placement mark, written by
        every placement, decides. Where only placements notify (PostgreSQL), a
        notification always looks; the feed's periodic re-check, there for a lost
        notification, looks only when the newest job event moved (every placement
        writes one) or FULL_LOOK_SECS passed: event ids are not committed in order,
        so an unchanged newest id is no proof on its own. The mark is read first,
        so the query sees every placement the mark stands for."""
        store = store_of()
        mark: object
        with store.db.connection_context():
            if store.marks.marks_placements:
                mark = store.marks.placement_mark()
                if mark == seen["mark"]:
                    return set()
            elif recheck:
                mark = store.marks.event_mark()
                if mark == seen["mark"] and time.monotonic() - seen["at"] < FULL_LOOK_SECS:
                    return set()
            else:
                mark = seen["mark"]
            ready = store.claims.nodes_with_work(node_ids)
            seen.update(mark=mark, at=time.monotonic())
            return ready

    return longpoll.WaitRoom(feed, max_waiters, check_nodes)


def create_app(settings: SchedulerSettings | None = None, clock: Callable[[], float] = time.time,
               start_loops: bool = False) -> Flask:
    """The WSGI app. `start_loops` runs the background loops in this process (gunicorn workers)."""
    settings = settings or SchedulerSettings.from_env()
    db = open_db(settings)
    room = wait_room(settings, dbmod.change_feed(db, SERVICE, settings.db_options), lambda: store)
    store = Store(db, settings, on_placed=room.placed)
    clock = dbmod.deciding_clock(db, clock)  # PostgreSQL: the database's clock
    if not dbmod.in_a_worker():  # a server's master migrated before forking its workers
        migrations.apply(store.db, MIGRATIONS, settings.db_options.init)
    app = base_app(__name__, settings.max_body_bytes)
    floors = revocation.floors(db)
    guards.install(app, settings.credentials, ACCESS, settings.allowed_hosts, server.loopback_only(), RAW_ROUTES,
                   floors=floors)
    dbmod.init_app(app, store.db)
    serve_openapi(app, openapi.DOCUMENT)
    app.register_blueprint(ui.blueprint)  # the dashboard at /ui
    readiness_registry = registry_client(settings, timeout=(1.0, 1.0))

    def ready(checks: dict) -> None:
        """Ready: the database answers, and placement has nodes to go by — a fresh
        node list (refreshed within three refresh periods) or a registry that answers."""
        dbmod.check_ready(store.db, checks)
        newest = Node.select(fn.MAX(Node.synced_at)).scalar()
        age = None if newest is None else clock() - newest
        checks["node_list_age_secs"] = None if age is None else round(age, 1)
        if age is not None and age <= 3 * settings.node_refresh_secs:
            return
        readiness_registry.healthz(timeout=1.0)
        checks["registry"] = "ok"

    serve_readiness(app, ready)
    serve_metrics(app, metrics.FAMILIES, lambda: metrics.scrape(store, clock))
    app.extensions["corral.store"] = store
    scheduler = Scheduler(store)
    app.extensions["corral.scheduler"] = scheduler
    app.extensions["corral.wait_room"] = room
    if start_loops:
        server.on_stop_signal(room.close)  # under gunicorn: SIGTERM ends every long poll at once
        app.extensions["corral.loops"] = loops.start(store, registry_client(settings), clock)
        app.extensions["corral.schedule_loop"] = schedule_loop.start(store, clock)
        app.extensions["corral.sampler"] = sampler.start(store, clock)
        if settings.sqs_url:
            app.extensions["corral.sqs_intake"] = sqs_intake.start(store, clock)
        if settings.sns_topic_arn:
            app.extensions["corral.sns_outbox"] = sns_outbox.start(store, clock)

    def job_view(job) -> contract.Job:
        return views.job(job, settings, clock(), hide_env=auth.read_only())

    jobs_answer = list[contract.Job]

    @app.get("/stats")
    def stats():
        return respond(views.stats(store.stats.job_counts(), store.stats.counters(), settings,
                                   *store.outbox.backlog(clock())))

    @app.get("/stats/history")
    def stats_history():
        since = query_float("since", 0.0, MAX_UNIX_SECS)
        node_id = request.args.get("node_id") or None
        nodes = query_choice("nodes", ("all", "none")) != "none"
        return respond(views.stats_history(sampler.history(since), settings, node_id, nodes))

    @app.get("/nodes")
    def list_nodes():
        return respond([views.node(*row) for row in store.nodes.nodes_and_slots()], of=list[contract.SchedulerNode])

    def traced(source: str) -> dict:
        """The trace columns of this request's jobs, from its traceparent and tracestate
        headers (shared/tracecontext.py)."""
        got = tracecontext.received(request.headers.get("traceparent"), request.headers.get("tracestate"))
        if got.invalid:
            metrics.trace_context_invalid(source)
        fields = tracecontext.job_fields(got)
        # The corral.submit span the jobs store (spans.py), ended with the answer.
        span = g.submit_span = spans.submit(got, fields, source,
                                            attributes=spans.http_attributes(request.method, request.path))
        if span.is_recording():
            @after_this_request
            def end_span(response):
                spans.answered(span, response.status_code)
                return response
        return fields

    def submitted(created: bool, **attributes) -> None:
        spans.submitted(g.submit_span, created, {f"corral.{name}": value for name, value in attributes.items()})

    @app.post("/jobs/batch")
    def submit_batch():
        items = validation.job_batch(read_json_object())
        trace = traced("batch")
        items = [dict(item, **trace) for item in items]
        key = validation.idempotency_key(request.headers.get(IDEMPOTENCY_HEADER))
        if key is not None and len(key) > 250:
            raise BadRequest("the Idempotency-Key header of a batch must be at most 250 characters")
        jobs, created = scheduler.submit_batch(items, clock(), key)
        submitted(created, job_count=len(jobs))
        return respond([job_view(j) for j in jobs], 201 if created else 200, of=jobs_answer)

    def agent_view(job) -> contract.Job:
        """A job as its node's agent gets it: with the grant that lets the node record the
        job's service in the registry (shared/credentials.py; none without tokens)."""
        grant = None
        if job.job_type == "service" and job.node_id is not None:
            grant = settings.credentials.service_grant(job.job_id, job.attempt, job.node_id)
        return views.job(job, settings, clock(), grant)

    def require_items_node(items) -> None:
        """Every item of an agent's batch must be about the agent's own node."""
        for _, item in items:
            if isinstance(item, dict):
                auth.require_node(item["node_id"])

    @app.post("/jobs/reports")
    def report_batch():
        items, claim = validation.report_batch(read_json_object())
        require_items_node(items)
        if claim is not None:
            auth.require_node(claim[0])
        results, claimed = scheduler.report_batch(items, clock(), claim)
        answer: dict = {"results": [views.report_result(r) for r in results]}
        if claim is not None:
            answer["claimed"] = [agent_view(j) for j in claimed]
        return respond(contract.ReportResults.model_validate(answer))

    @app.post("/jobs/output")
    def live_output():
        items = validation.output_batch(read_json_object())
        require_items_node(items)
        return respond(contract.OutputResults.model_validate(
            {"results": [views.item_result(r) for r in store.output.store(items)]}))

    @app.post("/nodes/<node_id>/claim")
    def claim(node_id):
        if not validation.NODE_ID_RE.match(node_id):
            raise BadRequest("the node id must be letters, digits, '.', '_' or '-' (at most 128)")
        body = validation.claim_request(read_json_object())
        answer = longpoll.claim(scheduler, room, node_id, body, clock, request.environ.get("gunicorn.socket"))
        response = respond([agent_view(j) for j in answer.jobs], of=jobs_answer)
        if answer.outcome in (longpoll.BUSY, longpoll.STOPPING, longpoll.AGAIN):
            response.headers[LONG_POLL_HEADER] = answer.outcome
        return response

    @app.post("/jobs")
    def submit():
        fields = dict(validation.job_request(read_json_object()), **traced("api"))
        key = validation.idempotency_key(request.headers.get(IDEMPOTENCY_HEADER))
        if fields["array"] is not None:
            if key is not None and len(key) > 245:
                raise BadRequest("the Idempotency-Key header of an array must be at most 245 characters")
            array, first, last, created = scheduler.submit_array(fields, clock(), key)
            submitted(created, array_id=f"array-{array.id}", job_count=array.count)
            return respond(views.array_created(array, first, last), 201 if created else 200)
        job, created = scheduler.submit(fields, clock(), key)
        submitted(created, job_id=job.job_id, job_count=1)
        metrics.submitted(store.db, "api", int(created))  # committed: store.submits.submit has returned
        return respond(job_view(job), 201 if created else 200)

    @app.get("/arrays/<array_id>")
    def read_array(array_id):
        return respond(views.array_summary(*store.jobs.array(array_id)))

    @app.post("/arrays/<array_id>/cancel")
    def cancel_array(array_id):
        scheduler.cancel_array(array_id, clock())
        return respond(views.array_summary(*store.jobs.array(array_id)))

    schedules = Schedules(store)

    def schedule_answers(rows: list) -> list[contract.ScheduleAnswer]:
        last = schedules.last_runs(rows)
        return [views.schedule(row, last.get(row.id), auth.read_only()) for row in rows]

    @app.get("/schedules")
    def list_schedules():
        return respond(schedule_answers(schedules.list_schedules()), of=list[contract.ScheduleAnswer])

    @app.post("/schedules")
    def create_schedule():
        return respond(schedule_answers([schedules.create(read_json_object(), clock())])[0], status=201)

    @app.get("/schedules/<name>")
    def read_schedule(name):
        return respond(schedule_answers([schedules.get(name)])[0])

    @app.patch("/schedules/<name>")
    def change_schedule(name):
        return respond(schedule_answers([schedules.update(name, read_json_object(), clock())])[0])

    @app.delete("/schedules/<name>")
    def delete_schedule(name):
        schedules.delete(name)
        return app.response_class(status=204)

    @app.get("/schedules/<name>/runs")
    def schedule_runs(name):
        limit = query_int("limit", 100, 1, MAX_PAGE)
        return respond([views.schedule_run(*row) for row in schedules.runs(name, limit)],
                       of=list[contract.ScheduleRunAnswer])

    @app.get("/concurrency")
    def list_concurrency():
        return respond([views.concurrency(*row) for row in store.limits.concurrency_limits()],
                       of=list[contract.ConcurrencyLimitAnswer])

    @app.put("/concurrency/<key>")
    def set_concurrency(key):
        key = validation.concurrency_key(key)
        limit = contract.ConcurrencyLimitRequest.check(read_json_object()).limit
        store.limits.set_concurrency_limit(key, limit)
        scheduler.limits_changed(clock())
        return respond(views.concurrency(*store.limits.concurrency_limits(key)[0]))

    @app.delete("/concurrency/<key>")
    def remove_concurrency(key):
        key = validation.concurrency_key(key)
        store.limits.remove_concurrency_limit(key)
        scheduler.limits_changed(clock())
        return app.response_class(status=204)

    @app.get("/jobs")
    def list_jobs():
        node_id = request.args.get("node_id") or None
        status = query_choice("status", ALL)
        job_type = query_choice("job_type", JOB_TYPES)
        pending_reason = query_choice("pending_reason", waiting.CODES)
        filters = validation.job_filters(request.args)
        limit = query_int("limit", 100, 1, MAX_PAGE)
        newest_first = query_choice("order", ("asc", "desc")) == "desc"
        after = None
        if request.args.get("after"):
            after = validation.parse_job_id(request.args["after"])
            if after is None:
                raise BadRequest("query parameter 'after' must be a job id such as job-42")
        if (node_id and status == "pending" and job_type is None and pending_reason is None and after is None
                and not newest_first and not any(value is not None for value in filters.values())):
            jobs = store.jobs.pending_for_agent(node_id, limit)  # the agents' poll: at most its free slots
        else:
            jobs = store.jobs.iter_jobs(node_id=node_id, status=status, job_type=job_type, after=after,
                                        limit=limit, newest_first=newest_first, pending_reason=pending_reason,
                                        now=clock(), **filters)
        view = agent_view if auth.calling_node() is not None else job_view
        page = pages.cut(((j.job_id, encode(view(j))) for j in jobs), limit,
                         settings.page_max_bytes)
        response = app.response_class(page.body(), mimetype="application/json")
        if page.next_after is not None:
            args = request.args.to_dict()
            args["after"] = page.next_after
            response.headers["Link"] = f'<{request.path}?{urlencode(args)}>; rel="next"'
        return response

    revoke_registry = registry_client(settings, timeout=(2.0, 5.0))

    @app.post("/nodes/<node_id>/credential/revoke")
    def revoke_credential(node_id):
        """Refuse the node's credentials below a generation, on the registry and here."""
        wanted = revocations.revocation_request(node_id, request.get_data(cache=True), read_json_object)
        return respond(revocation.revoke(db, revoke_registry, floors, node_id, wanted, clock()))

    @app.get("/jobs/<job_id>")
    def read_job(job_id):
        return respond(job_view(store.jobs.get(job_id)))

    @app.get("/jobs/<job_id>/why")
    def why_it_waits(job_id):
        job, closest = store.placing.why(job_id)
        view = job_view(job)
        return respond(contract.WhyItWaits.model_validate({
            "job_id": job.job_id, "pending_reason": view.pending_reason, "closest_nodes": closest}))

    @app.post("/jobs/<job_id>/cancel")
    def cancel(job_id):
        return respond(job_view(scheduler.cancel(job_id, clock())))

    drain_registry = registry_client(settings, timeout=(2.0, 5.0))

    @app.post("/nodes/<node_id>/drain")
    def drain_node(node_id):
        return respond(contract.NodeDrain.model_validate(
            drains.set_drained(store, drain_registry, node_id, True, clock())))

    @app.post("/nodes/<node_id>/undrain")
    def undrain_node(node_id):
        return respond(contract.NodeDrain.model_validate(
            drains.set_drained(store, drain_registry, node_id, False, clock())))

    @app.post("/nodes/<node_id>/lease")
    def renew_lease(node_id):
        if not validation.NODE_ID_RE.match(node_id):
            raise BadRequest("the node id must be letters, digits, '.', '_' or '-' (at most 128)")
        renewal = contract.LeaseRenewal.check(read_json_object() if request_body().strip() else {})
        usage = renewal.usage
        running = store.leases.renew_lease(node_id, clock(),
                                           None if usage is None else (usage.memory_mb, usage.cpu_percent))
        return respond(views.lease(node_id, settings.heartbeat_timeout_secs, running))

    @app.post("/jobs/<job_id>/retry")
    def retry(job_id):
        return respond(job_view(scheduler.retry(job_id, clock())))

    @app.get("/jobs/<job_id>/events")
    def job_events(job_id):
        return respond([views.event(e) for e in store.jobs.events(job_id)], of=list[contract.JobEvent])

    event_log = EventLog(store.db)
    stream_timing = event_stream.Timing(settings.events_keepalive_secs, settings.events_stream_max_secs,
                                        settings.events_retention_secs)
    stream_budget = stream_hub.StreamBudget(max_streams(settings), settings.events_streams_per_credential)
    hub = stream_hub.StreamHub(event_log, store.db, room.feed)
    app.extensions["corral.stream_hub"] = hub
    if start_loops:
        server.on_stop_signal(hub.stop)  # under gunicorn: SIGTERM ends every stream at once

    @app.get("/events")
    def events_stream():
        wanted = event_filter()
        try:
            cursor, first = event_stream.start(event_log, request.headers.get("Last-Event-ID"))
        except events.BadCursor as exc:
            raise BadRequest(str(exc)) from None
        who = stream_credential()
        refusal = stream_budget.take(who)
        if refusal is not None:
            return stream_refused(refusal)
        metrics.event_stream("opened")
        store.db.close()  # the stream holds no connection between its reads
        body = event_stream.stream(event_log, store.db, hub, cursor, wanted, first, stream_timing,
                                   lambda: room.closed or hub.stopped, lambda: stream_budget.give_back(who))
        return app.response_class(body, mimetype="text/event-stream",
                                  headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def stream_credential() -> str:
        """Whose streams count together: the token's role, or the client's address
        where no token is configured (loopback only)."""
        role = g.get("corral_role")
        return f"token:{role}" if role else f"address:{request.remote_addr}"

    def stream_refused(refusal: str):
        if refusal == stream_hub.PROCESS_FULL:
            metrics.event_stream("refused")
            response = error_response(503, "this server process already holds as many event streams as it "
                                           f"allows (EVENTS_STREAMS_MAX={stream_budget.max_streams}); try again "
                                           "shortly or another replica")
        else:
            metrics.event_stream("refused_credential")
            response = error_response(429, "this credential already holds as many event streams in this server "
                                           "process as it may (EVENTS_STREAMS_PER_CREDENTIAL="
                                           f"{stream_budget.per_credential}); close one or try again shortly")
        response.headers["Retry-After"] = "2"
        return response

    def event_filter() -> events.Filter:
        job_row = None
        if request.args.get("job_id"):
            job_row = validation.parse_job_id(request.args["job_id"])
            if job_row is None:
                raise BadRequest("query parameter 'job_id' must be a job id such as job-42")
        try:
            types = events.parse_types(request.args.getlist("type"))
        except ValueError as exc:
            raise BadRequest(f"query parameter 'type': {exc}") from None
        return events.Filter(job_row, request.args.get("node_id") or None, types)

    job_logs = JobLogs(store.db, settings)

    @app.put("/jobs/<job_id>/attempts/<attempt>/logs/<stream>/<seq>")
    def put_log_chunk(job_id, attempt, stream, seq):
        chunk = validation.log_chunk(attempt, stream, seq, request.headers)
        auth.require_node(chunk["node_id"])
        data = request_body()
        if len(data) > LOG_CHUNK_MAX_BYTES:
            raise TooLarge(f"a log chunk is at most {LOG_CHUNK_MAX_BYTES} bytes; this one has {len(data)}")
        stored = job_logs.put(job_id, data=data, now=clock(), **chunk)
        return respond(contract.LogChunkStored.model_validate(views.log_position(stored)))

    @app.post("/jobs/logs")
    def put_log_chunks():
        items = validation.log_chunk_batch(read_json_object())
        require_items_node(items)
        return respond(contract.LogChunkResults.model_validate(
            {"results": [views.log_chunk_result(r) for r in job_logs.put_many(items, clock())]}))

    @app.get("/jobs/<job_id>/logs")
    def read_logs(job_id):
        attempt = request.args.get("attempt") or None
        if attempt is not None:
            attempt = validation.whole_number(attempt, "query parameter 'attempt'", 1, validation.MAX_ATTEMPT)
        stream = validation.log_stream(request.args.get("stream") or "stdout")
        offset = query_int("offset", 0, 0, validation.MAX_LOG_OFFSET)
        # A larger limit is cut to one chunk's worth: the client goes on from offset + what came.
        limit = min(query_int("limit", LOG_CHUNK_MAX_BYTES, 1, validation.MAX_LOG_OFFSET), LOG_CHUNK_MAX_BYTES)
        piece = job_logs.read(job_id, attempt, stream, offset, limit)
        return app.response_class(piece.data, mimetype="application/octet-stream", headers={
            LOG_SIZE_HEADER: str(piece.size), LOG_COMPLETE_HEADER: "true" if piece.complete else "false",
            LOG_ATTEMPT_HEADER: str(piece.attempt), "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff"})  # a job's bytes are never rendered as a page

    @app.post("/jobs/<job_id>/status")
    def report(job_id):
        body = validation.status_report(read_json_object())
        auth.require_node(body["node_id"])
        return respond(job_view(scheduler.report(job_id, body, clock())))

    return app
