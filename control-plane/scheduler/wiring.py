"""What a scheduler process builds besides its routes.

The store and the waiting room of its long-poll claims (with the room's check of which
nodes have work), the routes' context (api/context.py), the readiness check, and the
background loops. app.py composes these into the WSGI app."""
import logging
import time
from collections.abc import Callable

import peewee

from corral.server import db as dbmod
from corral.server import migrations
from corral.server import serve as server
from corral.server.changefeed import ChangeFeed
from corral.shared.clients import RegistryClient

from . import (event_stream, longpoll, loops, revocation, sampler, schedule_loop, sns_outbox,
               sqs_intake, stream_hub)
from .api.context import SchedulerApi
from .event_log import EventLog
from .identities import Identities
from .job_logs import JobLogs
from .migrations import MIGRATIONS
from .models import database
from .schedules import Schedules
from .service import Scheduler
from .settings import SchedulerSettings
from .store import Store

log = logging.getLogger(__name__)

SERVICE = "scheduler"  # its PostgreSQL schema: corral_scheduler

# PostgreSQL: the waiters' re-check looks for work at least this often even when
# no job event is newer than at its last look (see check_nodes).
FULL_LOOK_SECS = 10.0


def open_db(settings: SchedulerSettings) -> peewee.Database:
    """The scheduler's database, bound to its models."""
    db = dbmod.open_database(settings.database_url, settings.sqlite_synchronous, service=SERVICE,
                             options=settings.db_options)
    database.initialize(db)
    return db


def open_store(settings: SchedulerSettings, on_placed: Callable[[set[str]], None] | None = None) -> Store:
    return Store(open_db(settings), settings, on_placed)


def registry_client(settings: SchedulerSettings, **kwargs) -> RegistryClient:
    """The scheduler's client of the registry: it reads the node list with the operators' token."""
    return RegistryClient(settings.registry_url, token=settings.credentials.operator,
                          verify=settings.registry_ca_bundle or True, **kwargs)


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


def scheduler_api(settings: SchedulerSettings, db: peewee.Database, clock: Callable[[], float]) -> SchedulerApi:
    """This process's store, waiting room, stream hub and the rest the routes use, on
    `db` (migrated here unless a server's master did before forking its workers)."""
    room = wait_room(settings, dbmod.change_feed(db, SERVICE, settings.db_options), lambda: store)
    store = Store(db, settings, on_placed=room.placed)
    clock = dbmod.deciding_clock(db, clock)  # PostgreSQL: the database's clock
    if not dbmod.in_a_worker():
        migrations.apply(store.db, MIGRATIONS, settings.db_options.init)
    event_log = EventLog(store.db)
    return SchedulerApi(
        settings=settings, store=store, scheduler=Scheduler(store), clock=clock, room=room,
        floors=revocation.floors(db),
        tokens=Identities(store, settings.oidc, clock),
        schedules=Schedules(store), job_logs=JobLogs(store.db, settings),
        event_log=event_log, hub=stream_hub.StreamHub(event_log, store.db, room.feed),
        stream_budget=stream_hub.StreamBudget(max_streams(settings), settings.events_streams_per_credential),
        stream_timing=event_stream.Timing(settings.events_keepalive_secs, settings.events_stream_max_secs,
                                          settings.events_retention_secs),
        drain_registry=registry_client(settings, timeout=(2.0, 5.0)),
        revoke_registry=registry_client(settings, timeout=(2.0, 5.0)))


def readiness(api: SchedulerApi) -> Callable[[dict], None]:
    """The readiness check: the database answers, and placement has nodes to go by — a
    fresh node list (refreshed within three refresh periods) or a registry that answers."""
    registry = registry_client(api.settings, timeout=(1.0, 1.0))

    def ready(checks: dict) -> None:
        dbmod.check_ready(api.store.db, checks)
        newest = api.store.nodes.list_synced_at()
        age = None if newest is None else api.clock() - newest
        checks["node_list_age_secs"] = None if age is None else round(age, 1)
        if age is not None and age <= 3 * api.settings.node_refresh_secs:
            return
        registry.healthz(timeout=1.0)
        checks["registry"] = "ok"

    return ready


def start_loops(api: SchedulerApi) -> dict:
    """Run the background loops in this process (gunicorn workers), and end every long
    poll and event stream at once on SIGTERM; the app's extensions that hold them."""
    store, clock = api.store, api.clock
    server.on_stop_signal(api.room.close)
    server.on_stop_signal(api.hub.stop)
    started = {
        "corral.loops": loops.start(store, registry_client(api.settings), clock),
        "corral.schedule_loop": schedule_loop.start(store, clock),
        "corral.sampler": sampler.start(store, clock),
    }
    if api.settings.sqs_url:
        started["corral.sqs_intake"] = sqs_intake.start(store, clock)
    if api.settings.sns_topic_arn:
        started["corral.sns_outbox"] = sns_outbox.start(store, clock)
    return started
