"""The backend interface: what differs between the databases, asked by the code above them.

Each dialect has one `Backend` (control-plane/server/backends/sqlite.py and
postgres.py), reachable from any of its database objects with
`backend_of(db)` (control-plane/server/backends/lookup.py). The store, the
loops, the migrations and the compiled statements ask it instead of testing
which database they run on, so that every dialect's decision lives in its
backend's module and nowhere else.
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, ClassVar, TypeVar

import peewee

from corral.server.changefeed import FALLBACK_INTERVAL_SECS, ChangeFeed, IntervalFeed
from corral.shared.errors import SettingError

from .write_then_place import WriteThenPlace, one_transaction

if TYPE_CHECKING:
    from corral.server.db_marker import Guard

log = logging.getLogger("corral.server.migrations")  # the migrations' waits, said as theirs

T = TypeVar("T")
Query = TypeVar("Query", bound=peewee.Select)

# How long a process waits for a migration lock while another one migrates, and how
# often it asks again. Additive steps take milliseconds; an index on a large table, longer.
MIGRATION_LOCK_TIMEOUT_SECS = 600.0
MIGRATION_LOCK_RETRY_SECS = 0.1


class Backend:
    """One dialect's answers. The defaults are those of a database of one process
    (SQLite in memory): one writer at a time, no row locks, nothing shared."""

    name: ClassVar[str]
    # Whether write transactions run one at a time (SQLite's writers' lock) rather than
    # side by side (PostgreSQL): a write that finds nothing to do still holds up the others.
    one_writer: ClassVar[bool] = True
    # Whether every commit wakes the waiting claims' watchers (SQLite's data-version feed)
    # rather than only placements (PostgreSQL's notifications), so that they need a cheap
    # mark of placements to tell them apart.
    wakes_on_every_commit: ClassVar[bool] = True
    # Whether the event stream reads in windows of transaction ids (PostgreSQL: ids are
    # handed out before commit, so a higher id may commit first) rather than by id alone.
    windowed_events: ClassVar[bool] = False
    # Whether the compiled statements bind a list as one array parameter (= ANY, unnest)
    # and insert a row's children in the same statement (control-plane/server/statements.py).
    arrays: ClassVar[bool] = False
    # How a write and the placement it calls for share transactions (write_then_place.py).
    write_then_place: ClassVar[WriteThenPlace] = staticmethod(one_transaction)

    # ---- locks ----------------------------------------------------------------------
    def lock_placement(self, db: peewee.Database, recomputable: bool = False,
                       nodes: Collection[str] | None = None, skip_busy: bool = False) -> None:
        """Serialise placement across every process until the current transaction ends.
        `recomputable`: the transaction only places, so its commit need not wait for the
        disk. `nodes`: it places on these nodes only (None: on any), and need not exclude
        the placements on others. `skip_busy`: of those, only the nodes no other placement
        holds now (locked_nodes() then says which). By default the write lock every
        transaction takes already serialises placement."""

    def lock_quotas(self, db: peewee.Database) -> None:
        """Serialise the placements that count the teams' quotas until the current
        transaction ends (taken after lock_placement: two placements on different nodes
        would each see the other's jobs unplaced, and a team pass its quota). By
        default the write lock every transaction takes already does."""

    def locked_nodes(self, db: peewee.Database) -> frozenset | None:
        """The nodes the current transaction locked for placement (lock_placement's
        `nodes`); None when it may place on any."""
        return None

    def skip_locked(self, query: Query) -> Query:
        """`query` that skips the rows other transactions have locked, and locks its own
        (FOR UPDATE SKIP LOCKED); as it is where one writer runs at a time."""
        return query

    def lock_rows(self, query: Query) -> Query:
        """`query` that locks its rows until the transaction ends, waiting for another
        transaction's lock (FOR UPDATE); as it is where one writer runs at a time."""
        return query

    def for_share(self, query: Query) -> Query:
        """`query` whose rows no other transaction may change until this one ends (FOR
        SHARE); as it is where one writer runs at a time."""
        return query

    # ---- dialect variants ----------------------------------------------------------
    def pick(self, *, sqlite: T, postgresql: T) -> T:
        """This dialect's one of two variants (SQL text a migration runs, say)."""
        return sqlite

    # ---- processes and start-up -------------------------------------------------------
    def change_feed(self, db: peewee.Database, service: str, poll_only: bool) -> ChangeFeed:
        """How this process hears that other processes committed work
        (control-plane/server/changefeed.py)."""
        return IntervalFeed(FALLBACK_INTERVAL_SECS)

    def check_server(self, db: peewee.Database, processes: int) -> None:
        """At start: refuse a database server we cannot use (SettingError)."""

    def prepare(self, db: peewee.Database, service: str) -> None:
        """Before a service's migrations, connected: what its tables need to exist."""

    @contextlib.contextmanager
    def migration_lock(self, db: peewee.Database, key: int,
                       before_connect: Callable[[], None] | None = None) -> Iterator[None]:
        """A connection to `db`, held under the service's migration lock (`key`: its
        PostgreSQL advisory lock); `before_connect` runs just before it connects. An
        in-memory database is this process's alone: no lock."""
        with db.connection_context():
            yield

    def marker_guard(self, db: peewee.Database, service: str, history_table: str, init: bool) -> Guard | None:
        """The guard of the marker that says this service had a database
        (control-plane/server/db_marker.py), or None where nothing outlives it."""
        return None


def wait_for(take: Callable[[], bool], what: str) -> None:
    """Call take() until it returns True, saying once that we wait; SettingError after
    MIGRATION_LOCK_TIMEOUT_SECS."""
    deadline = time.monotonic() + MIGRATION_LOCK_TIMEOUT_SECS
    said = False
    while not take():
        if time.monotonic() >= deadline:
            raise SettingError(f"another process has held {what} for over {MIGRATION_LOCK_TIMEOUT_SECS:g} s; "
                               f"is a migration stuck?")
        if not said:
            log.warning("waiting for %s: another process is migrating the database", what)
            said = True
        time.sleep(MIGRATION_LOCK_RETRY_SECS)
