"""The base of every background loop that one process runs at a time across gunicorn
workers and replicas (the scheduler's passes, schedules, the sampler, the SQS intake,
the SNS outbox).

Every worker runs the loop's thread; each pass takes or renews the loop's lease
(leader.py) and only the holder works. The base owns what they all share: the lease
and its renewal, the fencing token every write of a pass is made under (the loop's
store is fenced), the tenure (a holder stopped past its lease begins a new one, and a
write it makes meanwhile is refused), the backoff of a loop waiting out an outage, and
the thread that gives the lease up when it stops. A loop says what one pass does.
"""
import atexit
import logging
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import peewee

from corral.shared.backoff import Backoff

from . import serve as server
from .leader import Fence, LeaseLost, LoopThread, Tenure, holder_id

log = logging.getLogger(__name__)

S = TypeVar("S", bound="FencedStore")
R = TypeVar("R")


class FencedStore(Protocol):
    """What a loop needs of its store: the database, and a copy whose writes the fence checks."""

    db: peewee.Database

    def fenced(self: S, fence: Fence) -> S: ...


class LeasedLoop(Generic[S, R]):
    """One loop behind the lease `lease_name`: `tick(now)` is a pass, whatever `one_pass`
    returns (`not_holding()` when another process holds the lease, or took it over during
    the pass: the rest of the pass was refused by the fence).

    A pass under a new token, or one more than `gap` seconds (the lease period by
    default) after the last, begins a new tenure (`tenure.since`): what came due before
    it was missed. `max_backoff` caps both the wait after an outage the loop reports
    (`failed`) and after a pass that raised (the thread's).
    """

    doing = "running a leased loop"  # for the log: "<doing> (lease token 3)"

    def __init__(self, store: S, lease_name: str, lease_ttl: float, holder: str | None = None, *,
                 gap: float | None = None, max_backoff: float = 30.0):
        self.holder = holder or holder_id()
        self.fence = Fence(lease_name, self.holder)
        self.store = store.fenced(self.fence)  # every write is refused once another process holds the lease
        self.lease_ttl = lease_ttl
        self.tenure = Tenure(lease_ttl if gap is None else gap)
        self.max_backoff = max_backoff
        self.backoff = Backoff(1.0, max_backoff)
        self.failures = 0  # passes failed in a row (`failed`)
        self.log = logging.getLogger(type(self).__module__)  # each loop logs as its own module

    # ---- what a loop says --------------------------------------------------------

    def one_pass(self, now: float) -> R:
        """The loop's work, under the lease."""
        raise NotImplementedError

    def not_holding(self) -> R:
        """A pass's answer when this process does not hold the lease."""
        raise NotImplementedError

    def delay(self, result: R) -> float:
        """How long the thread waits after a pass that answered `result`."""
        raise NotImplementedError

    def taken(self, token: int) -> None:
        """This process took the lease (a start, a restart, a takeover)."""
        self.log.info("%s (lease token %d)", self.doing, token)

    def resumed(self, paused: float) -> None:
        """This process holds the lease still, but did not run for `paused` seconds (a new
        tenure begins): what a loop that keeps nothing per tenure need not hear of."""

    # ---- what the base does ------------------------------------------------------

    def tick(self, now: float) -> R:
        token = self.fence.acquire(self.store.db, self.lease_ttl, now)
        if token is None:
            self.tenure.lost()
            return self.not_holding()
        began = self.tenure.begin_pass(token, now)
        if began == "taken":
            self.taken(token)
        elif began == "resumed":
            self.resumed(self.tenure.paused)
        try:
            return self.one_pass(now)
        except LeaseLost as exc:
            self.tenure.lost()
            self.log.warning("stopped %s: %s", self.doing, exc)
            return self.not_holding()

    def failed(self, what: str) -> float:
        """A pass that could not do its work (`what` failed: an endpoint or the database
        is down): logged; the seconds to wait, doubling from 1 up to `max_backoff`."""
        self.failures += 1
        delay = self.backoff.next()
        self.log.warning("%s; next try in %.1fs", what, delay)
        return delay

    def recovered(self, what: str) -> None:
        """A pass that did its work: the backoff starts over (and says `what` works again)."""
        if self.failures:
            self.log.info("%s works again after %d failed tries", what, self.failures)
            self.failures = 0
            self.backoff.reset()

    def start(self, name: str, interval: float, clock: Callable[[], float] = time.time,
              join_timeout: float = 5.0) -> LoopThread:
        """Run the loop in a thread of this process (every gunicorn worker; the lease picks one)."""
        loop = PacedLoopThread(name, interval, lambda now: self.delay(self.tick(now)), clock=clock,
                               max_backoff=self.max_backoff)
        return run_in_background(self.store.db, loop, self.fence, join_timeout)


class PacedLoop(LeasedLoop[S, float]):
    """A leased loop whose pass answers how long to wait before the next; `idle` seconds
    while another process holds the lease."""

    idle = 1.0

    def not_holding(self) -> float:
        return self.idle

    def delay(self, result: float) -> float:
        return result


class PacedLoopThread(LoopThread):
    """A LoopThread whose `tick(now)` returns how many seconds to wait before the next pass.

    0 means "at once" (a long poll paces itself; a full batch means more work).
    An exception is still logged and backed off (doubling from `interval`).
    """

    def delay_after(self, result: object) -> float:
        return max(0.0, float(result))  # type: ignore[arg-type]  # tick returns a number


def on_a_connection(db: peewee.Database, tick: Callable[[float], object]) -> Callable[[float], object]:
    """`tick` run with a connection from the pool that is given back after each pass.
    A connection the database dropped meanwhile (a restart, a fast shutdown, a network
    cut) is discarded then and the next pass opens a new one; a connection kept open
    by the thread would fail every pass from then on."""

    def tick_on_a_connection(now: float):
        with db.connection_context():
            return tick(now)
    return tick_on_a_connection


def run_in_background(db: peewee.Database, loop: LoopThread, fence: Fence, join_timeout: float = 5.0) -> LoopThread:
    """Start `loop`, whose passes run under `fence`'s lease, each on a connection of
    its own (on_a_connection).

    The lease is given up when the loop ends, so that a restarted scheduler or another
    replica does not wait out the ttl before the loops run again. A worker told to
    stop (SIGTERM) ends its loop at once: it finishes the pass under way and takes
    no lease over from then on (Fence.stopping), so a worker that is itself shutting
    down never takes the lease another one just gave up. At any other normal exit
    the loop is stopped then (atexit)."""
    loop.tick = on_a_connection(db, loop.tick)

    def give_up_lease():
        with db.connection_context():
            fence.release(db)

    def told_to_stop():
        fence.stopping.set()
        loop.stop_event.set()

    def at_exit():
        loop.stop(join_timeout)
        if loop.thread.is_alive():  # a pass is stuck: its late writes are fenced off
            try:
                give_up_lease()
            except Exception:
                log.exception("could not release the %s lease", fence.name)

    loop.on_exit = give_up_lease
    server.on_stop_signal(told_to_stop)
    atexit.register(at_exit)
    return loop.start()
