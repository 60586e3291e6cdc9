"""Background loops that run exactly once across gunicorn workers and replicas.

Every process runs the loop thread; each pass first tries to take or renew a
lease row in the database. Only the holder does the work. A holder that dies
stops renewing and another process takes over once `expires_at` has passed; the
token increases on every change of holder (a fencing token). The loops themselves
are built on leased.py.
"""
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

import peewee

from corral.server.backends.lookup import backend_of
from corral.shared.backoff import Backoff

log = logging.getLogger(__name__)


class Lease(peewee.Model):
    name = peewee.CharField(primary_key=True, max_length=64)
    holder = peewee.CharField(max_length=128, null=True)
    expires_at = peewee.DoubleField(default=0.0)
    token = peewee.IntegerField(default=0)

    class Meta:
        table_name = "lease"


def holder_id() -> str:
    """A name for this process that is unique across hosts and restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseLost(Exception):
    """This process no longer holds the lease its write was made under."""


class Fence:
    """The lease one holder's loop runs under.

    `acquire()` takes or renews it at the start of each pass. `check()`, inside each
    of the pass's write transactions, refuses the write unless the lease row still
    names this holder and token. On PostgreSQL the row is read FOR SHARE, so a
    replica taking the lease over waits for the transaction to end, and every later
    one sees the new token: a leader that was paused (SIGSTOP, a frozen VM) past its
    lease and wakes up changes nothing. SQLite's write lock already orders them.

    Once `stopping` is set (the process is shutting down) the holder may renew a
    lease it holds but never takes one over: it would hold the lease, and its
    shutdown, for nothing, and keep a live replica from taking it.
    """

    def __init__(self, name: str, holder: str):
        self.name = name
        self.holder = holder
        self.token: int | None = None  # the token of the last acquisition, None when not holding
        self.stopping = threading.Event()

    def acquire(self, db: peewee.Database, ttl: float, now: float) -> int | None:
        """Take or renew the lease; the fencing token, or None if another holds it."""
        with db.atomic() as transaction:
            Lease.insert(name=self.name).on_conflict_ignore().execute()
            mine = Lease.name == self.name
            renewed = Lease.update(expires_at=now + ttl).where(mine & (Lease.holder == self.holder)).execute()
            if not renewed:
                taken = (Lease.update(holder=self.holder, expires_at=now + ttl, token=Lease.token + 1)
                         .where(mine & (Lease.expires_at < now)).execute())
                # Checked after the write: the lease can only have come free (the holder
                # gave it up) after that holder was told to stop, and so after this one
                # was, when both stop together.
                if not taken or self.stopping.is_set():
                    transaction.rollback()
                    self.token = None
                    return None
            self.token = Lease.get_by_id(self.name).token
            return self.token

    def check(self, db: peewee.Database) -> None:
        if self.token is None:
            raise LeaseLost(f"not holding the {self.name} lease")
        query = Lease.select(Lease.token).where((Lease.name == self.name) & (Lease.holder == self.holder)
                                                & (Lease.token == self.token))
        query = backend_of(db).for_share(query)
        if not list(query.tuples()):
            token, self.token = self.token, None
            raise LeaseLost(f"the {self.name} lease (token {token}) was taken over; this write is refused")

    def release(self, db: peewee.Database) -> None:
        """Give the lease up at once, so that another process need not wait out its ttl."""
        with db.atomic():
            Lease.update(expires_at=0.0).where((Lease.name == self.name) & (Lease.holder == self.holder)).execute()


class Tenure:
    """Since when this process has held a lease without a break: what came due before
    then was missed (nobody ran the loop), what comes due from then on is its own.

    A pass under a new token (a start, a restart, a takeover) or one more than `gap`
    seconds after the last one (the process was stopped, starved, its host suspended)
    begins a new tenure at its `now`."""

    def __init__(self, gap: float):
        self.gap = gap
        self.token: int | None = None   # None: not holding the lease
        self.since = 0.0
        self.last_pass: float | None = None
        self.paused = 0.0               # after "resumed": how long the process was away

    def begin_pass(self, token: int, now: float) -> str | None:
        """Note a pass under `token` at `now`: "taken" or "resumed" when it begins a new
        tenure, else None."""
        change = None
        self.paused = 0.0
        if token != self.token:
            change = "taken"
        elif self.last_pass is not None and now - self.last_pass > self.gap:
            change, self.paused = "resumed", now - self.last_pass
        if change is not None:
            self.token, self.since = token, now
        self.last_pass = now
        return change

    def lost(self) -> None:
        """Another process holds the lease (or took it over during a pass)."""
        self.token = None


class LoopThread:
    """Calls `tick(now)` every `interval` seconds in a daemon thread.

    An exception is logged with its traceback and the next pass waits longer
    (doubling up to `max_backoff`), so a broken database or a peer that is down
    never ends the loop and never spins it. `on_exit`, when set, runs in the
    thread once the loop has stopped (after its last pass).
    """

    def __init__(self, name: str, interval: float, tick: Callable[[float], object],
                 clock: Callable[[], float] = time.time, max_backoff: float = 30.0):
        self.name = name
        self.interval = interval
        self.tick = tick
        self.clock = clock
        self.max_backoff = max_backoff
        self.on_exit: Callable[[], None] | None = None
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, name=name, daemon=True)

    def start(self) -> "LoopThread":
        self.thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.stop_event.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def delay_after(self, result: object) -> float:
        """How long to wait after a pass that returned `result`."""
        return self.interval

    def run(self) -> None:
        delay = 0.0
        failures = 0
        backoff = Backoff(2 * self.interval, self.max_backoff)
        try:
            while not self.stop_event.wait(delay):
                try:
                    delay = self.delay_after(self.tick(self.clock()))
                    failures = 0
                    backoff.reset()
                except Exception:
                    failures += 1
                    delay = backoff.next()
                    log.exception("%s: pass failed (%d in a row); next try in %.1fs", self.name, failures, delay)
        finally:
            if self.on_exit is not None:
                try:
                    self.on_exit()
                except Exception:
                    log.exception("%s: could not end cleanly", self.name)
