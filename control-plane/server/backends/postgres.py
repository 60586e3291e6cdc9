"""PostgreSQL: several replicas of each service on one database, each service in its
own schema. Everything that is PostgreSQL's own lives here: the pooled database and
its session timeouts (`PostgresDatabase`), the placement's advisory locks
(`lock_placement`), its answers to the backend interface (`PostgresBackend`), what
start-up refuses (`check_server`), the database's clock every replica decides by
(`DatabaseClock`), and LISTEN/NOTIFY waking claims on other replicas (`NotifyFeed`).
"""
from __future__ import annotations

import logging
import os
import threading
import time
import zlib
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import peewee
import psycopg
from playhouse.pool import PooledPostgresqlDatabase

from corral.server.audit_trail import AuditedCommits
from corral.server.changefeed import ERROR_BACKOFF_SECS, ChangeFeed, IntervalFeed
from corral.server.db_marker import Guard
from corral.shared.errors import SettingError

from .base import Backend, Query, T, wait_for
from .postgres_marker import PostgresGuard
from .postgres_url import parse_url, schema_for
from .write_then_place import commit_then_place

__all__ = ["PostgresDatabase", "open_postgres", "PostgresBackend", "POSTGRES", "check_server", "NotifyFeed",
           "session_options"]

log = logging.getLogger(__name__)

MIN_SERVER_VERSION = 130000  # PostgreSQL 13
# Session timeouts (milliseconds). Corral's transactions last milliseconds; a
# transaction idle for 5 s is a stopped process, whose locks must go.
LOCK_TIMEOUT_MS = 5000
IDLE_IN_TRANSACTION_TIMEOUT_MS = 5000
STATEMENT_TIMEOUT_MS = 30000
CONNECT_TIMEOUT_SECS = 5
# Threads of a server process that may hold a connection outside requests (the
# background pass, SQS intake, SNS outbox, the long-poll room's check): a pool
# needs these plus one for requests.
BACKGROUND_CONNECTIONS = 4
MIN_POOL_SIZE = BACKGROUND_CONNECTIONS + 1
# The advisory lock keys (pg_advisory_xact_lock takes a bigint): any constants
# that no other application in the same database is likely to use.
PLACEMENT_LOCK_KEY = 0x436F7272_616C0001
# Placements that count the teams' quotas: one at a time, whatever nodes they lock.
QUOTA_LOCK_KEY = 0x436F7272_616C0002
# A node's placement lock: the two-key form (a key space of its own), this class and
# a hash of the node's id (two ids of one hash only share a lock).
NODE_LOCK_CLASS = 0x436F7202
MAX_SKEW_SECS = 2.0
CLOCK_REFRESH_SECS = 10.0
# LISTEN/NOTIFY: a process sends at most one notification per DEBOUNCE_SECS
# (the first at once, from the thread that committed; the rest of a burst
# together, from a thread of its own), and its listener looks at the database
# every RECHECK_SECS even without one (notifications sent while it reconnects
# are lost). A notification waits at most NOTIFY_TIMEOUT_MS on the server.
DEBOUNCE_SECS = 0.005
NOTIFY_TIMEOUT_MS = 2000
RECHECK_SECS = 1.0
# A notification names the nodes its commits placed work on (comma-separated), so
# that the listeners wake those nodes' claims without a query; one that would be
# longer (PostgreSQL takes payloads below 8000 bytes), or work not tied to nodes,
# goes out empty: "look".
MAX_PAYLOAD_BYTES = 4000
POLL_ONLY_INTERVAL_SECS = 0.25


def session_options(url: str, schema: str) -> str:
    """The session settings every connection of a service starts with, as libpq's
    `options` (sent with the connection's start-up, so they cost no round trip;
    a SET on each check-out from the pool cost one per request), after any
    `options` the URL gives: the service's schema, the timeouts, UTC."""
    ours = (f"-c search_path={schema} -c lock_timeout={LOCK_TIMEOUT_MS} "
            f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_TIMEOUT_MS} "
            f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c TimeZone=UTC")
    given = parse_qs(urlsplit(url).query).get("options")
    return f"{given[-1]} {ours}" if given else ours


class PostgresDatabase(AuditedCommits, PooledPostgresqlDatabase):
    """The pooled database of one service (its schema and session timeouts set on connect).

    A request holds a connection for its duration (a long-poll claim gives it back
    while it waits); one that finds all `pool_size` taken waits `pool_wait_secs`, then
    answers 503. The timeouts keep a replica stopped mid-transaction (SIGSTOP, a
    frozen VM) from holding locks the others wait on: its idle session is ended, and
    every wait for a lock or a query is bounded (the others answer 503 and retry)."""

    reuses_ids = False  # sequences never go back

    def __init__(self, url: str, service: str, pool_size: int, pool_wait_secs: float):
        self.url = url
        self.where = parse_url(url)
        self.schema = schema_for(service)
        self.pool_size = pool_size
        super().__init__(url, max_connections=pool_size, timeout=pool_wait_secs, stale_timeout=300,
                         prefer_psycopg3=True, connect_timeout=CONNECT_TIMEOUT_SECS,
                         keepalives=1, keepalives_idle=10, keepalives_interval=5, keepalives_count=3,
                         application_name=f"corral-{service}", options=session_options(url, self.schema))
        self.clock = DatabaseClock(self)

    def _is_closed(self, conn) -> bool:
        # The pool's own check pings the server at every check-out, one round trip
        # under the pool's lock. Here a connection counts as closed when psycopg
        # knows it is; one the server dropped unseen (a restart) fails its first
        # statement, and that failure empties the pool of idle ones (_broken).
        return self._dead(conn)

    def _dead(self, conn) -> bool:
        """Whether psycopg knows this connection is unusable (closed, or its state lost)."""
        return conn.closed or self._adapter.txn_status(conn) == self._adapter.txn_unknown

    def _broken(self) -> None:
        """After a failed statement: if the connection is gone, so are probably the
        idle ones (the server restarted, the network dropped): open new ones."""
        conn = getattr(self._state, "conn", None)
        if conn is not None and self._dead(conn):
            log.warning("lost a connection to PostgreSQL %s:%s; reconnecting", self.where["host"],
                        self.where["port"])
            self.close_idle()

    def execute_sql(self, sql, params=None):
        try:
            return super().execute_sql(sql, params)
        except (peewee.OperationalError, peewee.InterfaceError):
            self._broken()
            raise

    def begin(self, isolation_level=None):
        try:
            super().begin(isolation_level)
        except (peewee.OperationalError, peewee.InterfaceError):
            self._broken()
            raise

    def lock_placement(self, recomputable: bool = False, nodes: Collection[str] | None = None,
                       skip_busy: bool = False) -> None:
        """Serialise placement across every replica, until this transaction ends (taken
        once per transaction: the caller's first request holds it).

        `nodes`: the transaction places on these nodes only, so it excludes only the
        placements on them and those over every node: the placement lock shared,
        then each node's lock in the order of their keys (every taker orders them
        alike, so two never wait on each other in a cycle). None: every node, the
        placement lock alone. A transaction keeps the scope it took first; a wider
        one asked later would wait, with locks held, on others that wait on it.
        `skip_busy`: of `nodes`, lock those whose lock is free now and leave the others
        out of the scope, without waiting (new work: a node whose placement is under
        way takes the oldest waiting work itself, and a placement that waited for
        several nodes in turn would hold each node it had while it waited).

        `recomputable`: this transaction only places, so its commit does not wait for
        its WAL to reach the disk (synchronous_commit off until it ends), set in the
        same round trip as the lock (every round trip is paid with the lock held). A
        crash may lose the last few milliseconds of such commits, and the jobs they
        placed are then unplaced again, which the next placement pass repairs; every
        later commit that waits for the disk (a claim of those jobs, for one) flushes
        them first, the WAL being written in order. Placing commits then do not queue
        on a disk flush while they hold the placement lock."""
        outermost, held = self._placement_scope()
        wanted = EVERY_NODE if nodes is None else frozenset(nodes)
        if held is not None and not _covers(held, wanted):
            raise RuntimeError(f"placement on {_scope_text(wanted)} in a transaction that locked "
                               f"{_scope_text(held)} for it")
        asks: list[str] = []
        params: list[int] = []
        keys: list[int] = []
        if held is None:
            if wanted == EVERY_NODE:
                asks, params = ["pg_advisory_xact_lock(%s)"], [PLACEMENT_LOCK_KEY]
            else:
                keys = sorted({node_lock_key(node_id) for node_id in wanted})
                node_lock = "pg_try_advisory_xact_lock(%s, %s)" if skip_busy else "pg_advisory_xact_lock(%s, %s)"
                asks = ["pg_advisory_xact_lock_shared(%s)"] + [node_lock] * len(keys)
                params = [PLACEMENT_LOCK_KEY] + [k for key in keys for k in (NODE_LOCK_CLASS, key)]
        if recomputable:
            asks.append("set_config('synchronous_commit', 'off', true)")
        if not asks:
            return
        answers = self.execute_sql(f"SELECT {', '.join(asks)}", tuple(params)).fetchone()
        if skip_busy and keys:
            got = {key for key, locked in zip(keys, answers[1:]) if locked}
            wanted = frozenset(node_id for node_id in wanted if node_lock_key(node_id) in got)
        if outermost is not None and held is None:
            outermost.placement_scope = wanted

    def locked_nodes(self) -> frozenset | None:
        """The nodes this transaction locked for placement; None when it locked every
        node or none yet."""
        held = self._placement_scope()[1]
        return held if isinstance(held, frozenset) else None

    def _placement_scope(self) -> tuple[Any, str | frozenset | None]:
        """This transaction's outermost level (None outside one) and the scope it locked
        for placement (None: none yet), kept on that level so it ends with it."""
        transactions = self._state.transactions
        outermost = transactions[0] if transactions else None
        return outermost, getattr(outermost, "placement_scope", None)

    def lost(self) -> str | None:
        return None  # a server that went away shows as failed queries (503), not here

    def health(self) -> dict:
        """What keeps a queue table healthy, for /metrics: live and dead tuples of each of
        this service's tables (dead ones pile up when vacuum cannot keep up), and the
        age of the oldest open transaction in the database (it holds vacuum back)."""
        tables = {name: (live, dead) for name, live, dead in self.execute_sql(
            "SELECT relname, n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE schemaname = %s",
            (self.schema,)).fetchall()}
        (oldest,) = self.execute_sql(
            "SELECT COALESCE(EXTRACT(EPOCH FROM max(clock_timestamp() - xact_start)), 0)::float8 "
            "FROM pg_stat_activity WHERE datname = current_database() AND xact_start IS NOT NULL "
            "AND pid <> pg_backend_pid()").fetchone()
        return {"tables": tables, "oldest_transaction_secs": float(oldest), "clock_skew_secs": self.clock.skew()}


def open_postgres(url: str, service: str, pool_size: int, pool_wait_secs: float) -> PostgresDatabase:
    """The pooled database of `service` at a postgresql:// URL (only parsed: check_server() connects)."""
    return PostgresDatabase(url, service, pool_size, pool_wait_secs)


def check_server(db: PostgresDatabase, pool_size: int, processes: int) -> None:
    """Refuse to start (SettingError) on a server we cannot use; log the clock skew."""
    where = f"database {db.where['database']!r} on {db.where['host']}:{db.where['port']}"
    if pool_size < MIN_POOL_SIZE:
        raise SettingError(f"CORRAL_DB_POOL_SIZE={pool_size} is too small: a server process needs "
                           f"{BACKGROUND_CONNECTIONS} connections for its background threads and one for requests "
                           f"(at least {MIN_POOL_SIZE})")
    try:
        with psycopg.connect(db.url, connect_timeout=CONNECT_TIMEOUT_SECS, autocommit=True) as conn:
            version = conn.info.server_version
            max_connections = int(_one(conn, "SHOW max_connections"))
            reserved = int(_one(conn, "SHOW superuser_reserved_connections"))
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        password = urlsplit(db.url).password
        if password:
            reason = reason.replace(password, "***")
        raise SettingError(f"cannot connect to PostgreSQL {where}: {reason}") from None
    if version < MIN_SERVER_VERSION:
        raise SettingError(f"PostgreSQL {version // 10000} at {db.where['host']}:{db.where['port']} is too old: "
                           "Corral needs PostgreSQL 13 or newer")
    available = max_connections - reserved
    wanted = pool_size * processes
    if wanted > available:
        raise SettingError(f"{processes} server process(es) x CORRAL_DB_POOL_SIZE={pool_size} = {wanted} connections, "
                           f"more than the {available} that {where} allows (max_connections {max_connections} "
                           f"minus {reserved} reserved): lower CORRAL_DB_POOL_SIZE or raise max_connections")
    log.info("PostgreSQL %s: %d process(es) x %d connections of its %d (every replica and the other service "
             "count too)", where, processes, pool_size, available)
    skew = db.clock.measure()
    if abs(skew) > MAX_SKEW_SECS:
        log.warning("this host's clock differs from the database's by %.1f s; Corral goes by the database's, "
                    "but /readyz answers 503 until the clocks agree within %.0f s", skew, MAX_SKEW_SECS)


def _one(conn: psycopg.Connection, sql: str):
    """The one value of a one-row query."""
    row = conn.execute(sql).fetchone()
    if row is None:
        raise psycopg.DataError(f"no row from {sql!r}")
    return row[0]


class DatabaseClock:
    """The database's clock, read as this process's clock plus a measured offset
    (remeasured every CLOCK_REFRESH_SECS on a short-lived connection of its own,
    so asking the time never waits for a query)."""

    def __init__(self, db: PostgresDatabase, local: Callable[[], float] = time.time):
        self.db = db
        self.local = local
        self.offset = 0.0
        self.measured_at: float | None = None
        self._lock = threading.Lock()

    def measure(self) -> float:
        """Read the database's clock once; the new offset (database minus here)."""
        with psycopg.connect(self.db.url, connect_timeout=CONNECT_TIMEOUT_SECS, autocommit=True) as conn:
            before = self.local()
            theirs = _one(conn, "SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8")
            after = self.local()
        self.offset = float(theirs) - (before + after) / 2
        self.measured_at = after
        return self.offset

    def __call__(self) -> float:
        here = self.local()
        if self.measured_at is None or here - self.measured_at > CLOCK_REFRESH_SECS:
            if self._lock.acquire(blocking=False):
                try:
                    self.measure()
                except psycopg.Error as exc:  # keep the last offset; the database answers 503 anyway
                    self.measured_at = here
                    log.warning("cannot read the database's clock (%s); keeping the last offset", exc)
                finally:
                    self._lock.release()
        return here + self.offset

    def skew(self) -> float:
        return self.offset


def named_nodes(payloads: list[str]) -> set[str] | None:
    """The nodes these notifications name together; None when one names none ("look")."""
    nodes: set[str] = set()
    for payload in payloads:
        if not payload:
            return None
        nodes.update(payload.split(","))
    return nodes


class NotifyFeed(ChangeFeed):
    """Other replicas' commits, from LISTEN on a connection of its own; `ring()` sends
    a (debounced) NOTIFY from another, naming the nodes placed on when it can
    (MAX_PAYLOAD_BYTES). Notifications of this process are skipped (its own waiters
    were poked directly).

    The first notification after a quiet DEBOUNCE_SECS goes out from the thread that
    rings, at once: handing it to the sender thread cost the dispatch path most of a
    millisecond (the committing thread goes on with its answer and holds the GIL).
    Not from inside the committing transaction: NOTIFY holds a database-wide lock
    until its transaction ends, which for a durable commit means across the disk
    flush, so every notifying commit would wait for the one before."""

    name = "pg-listener"

    def __init__(self, url: str, channel: str, recheck: float = RECHECK_SECS, debounce: float = DEBOUNCE_SECS):
        super().__init__(recheck)
        self.url = url
        self.channel = channel
        self.debounce = debounce
        self._wanted = threading.Event()
        self._sender_pid: int | None = None
        self._sender: threading.Thread | None = None
        self._own_backend = -1
        # What the next notification names (None: "look"; nothing to send when not
        # _has_pending), under _pending_lock; the sending connection and when it last
        # sent, under _send_lock.
        self._pending_lock = threading.Lock()
        self._pending: set[str] | None = set()
        self._has_pending = False
        self._send_lock = threading.Lock()
        self._conn: psycopg.Connection | None = None
        self._sent_at = float("-inf")
        self._failed_at = float("-inf")
        self._failing = False  # since the last failed send: logged once per outage

    def ring(self, nodes: Collection[str] | None = None) -> None:
        pid = os.getpid()
        if self._sender_pid != pid:
            with _START_LOCK:
                if self._sender_pid != pid:
                    self._wanted = threading.Event()
                    self._pending_lock = threading.Lock()
                    self._send_lock = threading.Lock()
                    self._pending, self._has_pending, self._conn = set(), False, None
                    self._sender = threading.Thread(target=self._send_loop, name="corral-pg-notify", daemon=True)
                    self._sender.start()
                    self._sender_pid = pid
        self._pend(nodes)
        if self._send_lock.acquire(blocking=False):  # else the one sending takes this too
            try:
                if time.monotonic() - self._sent_at >= self.debounce and self._send():
                    return
            finally:
                self._send_lock.release()
        self._wanted.set()

    def _pend(self, nodes: Collection[str] | None) -> None:
        """Have the next notification name `nodes` too (None: say "look")."""
        with self._pending_lock:
            if nodes is None or self._pending is None:
                self._pending = None
            else:
                self._pending.update(nodes)
            self._has_pending = True

    def _payload(self) -> str | None:
        """What the notification names, None when nothing is pending (and nothing is
        pending any more)."""
        with self._pending_lock:
            if not self._has_pending:
                return None
            nodes, self._pending, self._has_pending = self._pending, set(), False
        if not nodes:
            return ""
        payload = ",".join(sorted(nodes))
        if len(payload.encode()) > MAX_PAYLOAD_BYTES or any("," in node for node in nodes):
            return ""
        return payload

    def _send(self) -> bool:
        """Send what is pending (under _send_lock); False when it could not (it is
        pending again)."""
        if time.monotonic() - self._failed_at < ERROR_BACKOFF_SECS:
            return False
        payload = self._payload()
        if payload is None:
            return True
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self.url, connect_timeout=CONNECT_TIMEOUT_SECS, autocommit=True,
                                             options=f"-c statement_timeout={NOTIFY_TIMEOUT_MS}")
                self._own_backend = self._conn.info.backend_pid
            self._conn.execute("SELECT pg_notify(%s, %s)", (self.channel, payload))
            self._sent_at = time.monotonic()
            if self._failing:
                self._failing = False
                log.info("notifying the other replicas again")
            return True
        except psycopg.Error as exc:  # the others notice at their next re-check
            # Once per outage: the sender tries again every ERROR_BACKOFF_SECS meanwhile.
            (log.debug if self._failing else log.warning)("cannot notify the other replicas (%s)", exc)
            self._failing = True
            self._failed_at = time.monotonic()
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            self._pend(None if payload == "" else set(payload.split(",")))  # pending again
            self._wanted.set()  # the sender tries it after its backoff
            return False

    def _send_loop(self) -> None:
        """What the committing threads left: a burst's rest, one notification per
        DEBOUNCE_SECS; after a failure, one try per ERROR_BACKOFF_SECS."""
        while not self._stop.is_set():
            self._wanted.wait()
            self._wanted.clear()
            with self._send_lock:
                wait = max(self._sent_at + self.debounce, self._failed_at + ERROR_BACKOFF_SECS) - time.monotonic()
            if wait > 0 and self._stop.wait(wait):  # what rings meanwhile goes out as one notification
                break
            with self._send_lock:
                self._send()
        with self._send_lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def stop(self, timeout: float = 2.0) -> None:
        super().stop(timeout)
        self._wanted.set()  # the sender ends too

    def _run(self) -> None:
        conn = None
        failing = False
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(self.url, connect_timeout=CONNECT_TIMEOUT_SECS, autocommit=True)
                    conn.execute(f'LISTEN "{self.channel}"')
                    if failing:
                        log.info("listening for other replicas' work again")
                        failing = False
                    self.changed()  # what was sent while we were not listening
                # One notification or the re-check period, whichever comes first; this
                # process's own are skipped (its waiters were poked at its commit).
                got = [n for n in conn.notifies(timeout=self.interval, stop_after=1)]
                if not got:
                    self.changed(recheck=True)
                else:
                    others = [n.payload for n in got if n.pid != self._own_backend]
                    if others:
                        self.changed(nodes=named_nodes(others))
            except psycopg.Error as exc:
                if not failing:
                    log.warning("cannot listen for other replicas' work (%s); looking every %.0f s instead",
                                exc, ERROR_BACKOFF_SECS)
                    failing = True
                if conn is not None:
                    try:
                        conn.close()
                    except psycopg.Error:
                        pass
                    conn = None
                self.changed()
                self._stop.wait(ERROR_BACKOFF_SECS)
        if conn is not None:
            conn.close()


_START_LOCK = threading.Lock()



# A placement's scope: this, or the frozenset of the nodes it places on.
EVERY_NODE = "every node"


def _covers(held: str | frozenset, wanted: str | frozenset) -> bool:
    return held == EVERY_NODE or (wanted != EVERY_NODE and wanted <= held)  # type: ignore[operator]


def node_lock_key(node_id: str) -> int:
    """The second key of a node's placement lock: a stable signed 32-bit hash of its id."""
    return zlib.crc32(node_id.encode()) - (1 << 31)


def _scope_text(scope: str | frozenset) -> str:
    return scope if isinstance(scope, str) else ", ".join(sorted(scope))


class PostgresBackend(Backend):
    """PostgreSQL: several writers at once."""

    name = "postgresql"
    # A write commits before the placement it calls for, which alone holds the placement lock.
    one_writer = False
    write_then_place = staticmethod(commit_then_place)
    # Only placements wake the watchers of waiting claims (NotifyFeed), and the periodic re-check.
    wakes_on_every_commit = False
    windowed_events = True
    arrays = True

    def lock_placement(self, db: peewee.Database, recomputable: bool = False,
                       nodes: Collection[str] | None = None, skip_busy: bool = False) -> None:
        cast(PostgresDatabase, db).lock_placement(recomputable, nodes, skip_busy)

    def lock_quotas(self, db: peewee.Database) -> None:
        # Always after the placement locks, so no two takers wait on each other in a cycle.
        db.execute_sql("SELECT pg_advisory_xact_lock(%s)", (QUOTA_LOCK_KEY,))

    def locked_nodes(self, db: peewee.Database) -> frozenset | None:
        return cast(PostgresDatabase, db).locked_nodes()

    def skip_locked(self, query: Query) -> Query:
        return query.for_update(skip_locked=True)

    def lock_rows(self, query: Query) -> Query:
        return query.for_update()

    def for_share(self, query: Query) -> Query:
        return query.for_update("FOR SHARE")  # type: ignore[arg-type]  # peewee takes the clause text

    def pick(self, *, sqlite: T, postgresql: T) -> T:
        return postgresql

    def change_feed(self, db: peewee.Database, service: str, poll_only: bool) -> ChangeFeed:
        if poll_only:
            return IntervalFeed(POLL_ONLY_INTERVAL_SECS)
        return NotifyFeed(cast(PostgresDatabase, db).url, f"{schema_for(service)}_work")

    def check_server(self, db: peewee.Database, processes: int) -> None:
        if isinstance(db, PostgresDatabase):
            check_server(db, db.pool_size, processes)

    def prepare(self, db: peewee.Database, service: str) -> None:
        # A schema of its own per service (the connections' search_path names it).
        db.execute_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema_for(service)}"')

    @contextmanager
    def migration_lock(self, db: peewee.Database, key: int,
                       before_connect: Callable[[], None] | None = None) -> Iterator[None]:
        """A session advisory lock on the migrating connection, asked again and again
        (pg_try_advisory_lock) so that the wait has a deadline of ours (a plain
        pg_advisory_lock would wait for the session's lock_timeout)."""
        with db.connection_context():
            wait_for(lambda: bool(db.execute_sql("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]),
                     f"the migration lock (PostgreSQL advisory lock {key})")
            try:
                yield
            finally:
                db.execute_sql("SELECT pg_advisory_unlock(%s)", (key,))

    def marker_guard(self, db: peewee.Database, service: str, history_table: str, init: bool) -> Guard | None:
        return PostgresGuard(db, service, history_table, init, cast(PostgresDatabase, db).url)


POSTGRES = PostgresBackend()
