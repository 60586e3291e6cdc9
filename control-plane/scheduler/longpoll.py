"""Long-poll claims (`POST /nodes/{node_id}/claim`): the waiting room of one server process.

A claim first tries at once (Claims.take_placed: one short write transaction). When
nothing is claimable and the agent asked to wait, the request thread enters the
process's `WaitRoom` and sleeps WITHOUT a database connection until it is poked:

- by a commit in this process that placed a job on its node: `Placing.dispatch`
  registers an after-commit callback that calls `poke(node_ids)`;
- by the process's change feed (control-plane/server/changefeed.py), which reports every commit anywhere
  (another worker, another replica, the background loop). When the feed says
  which nodes the commit placed work on (PostgreSQL's notifications name them),
  their waiters are poked; else, on the feed's thread, ONE grouped query ("which
  of the waiting nodes have pending jobs placed on them?") answers for every
  waiter of the process, and only the waiters of those nodes are poked. 200
  waiting agents cost one query per change (at most 20 a second with the SQLite
  watcher), and a waiter whose node got nothing is not even woken: lease
  renewals and reports elsewhere cost it nothing.

A poked waiter runs its claim, if the request is still fresh: a request that has
waited longer than FRESH_SECS is no proof that its agent is still alive (a host
that died or a network partition leaves the TCP connection looking open), so it
answers `[]` with `X-Corral-Long-Poll: again` instead, and the agent asks again
at once: one more round trip, and work is only ever handed to an agent that
spoke within the last FRESH_SECS, as with the `running` report of a polling
agent. Work placed on a silent node thus stays pending there and moves to a
healthy node as soon as the node turns unhealthy, as it always did.

A waiter also wakes every 5 s (CHECK_CLIENT_SECS)
to answer early when the client went away (the agent stopped: nothing is claimed
for a connection nobody reads) or the worker is stopping (SIGTERM: every waiter
answers at once, so a restart never waits out a long poll); and at its deadline
answers `[]`.

At most `max_waiters` claims wait at once in a process (LONG_POLL_MAX_WAITERS);
a claim beyond that answers at once, possibly `[]`, with the header
`X-Corral-Long-Poll: busy`, so that submits, reads and reports always find a
free gunicorn thread. The agent then asks again after POLL_INTERVAL_SECS. The
open event streams (`GET /events`, event_stream.py) hold a thread each too, from
a budget of their own (stream_hub.StreamBudget): they never take a claim's
place, and the claims' default leaves their cap free (`default_max_waiters`).
"""
from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from corral.server.changefeed import ChangeFeed

log = logging.getLogger(__name__)

# A waiter looks at its client connection at least this often (a stopping worker
# wakes every waiter itself). With 500 agents waiting, once a second was 500
# wake-ups a second for nothing.
CHECK_CLIENT_SECS = 5.0
# A waiting claim takes work only this long after its request arrived (proof of life);
# later it answers "again" and the agent asks again at once.
FRESH_SECS = 1.0
# Threads of each worker kept free of long polls when LONG_POLL_MAX_WAITERS is not set.
RESERVED_THREADS = 8

# Why a claim answered (the X-Corral-Long-Poll header carries "busy", "stopping", "again").
CLAIMED = "claimed"
NO_WAIT = "no-wait"        # wait_secs was 0
BUSY = "busy"              # the waiting room was full: answered at once
STOPPING = "stopping"      # the worker is shutting down
AGAIN = "again"            # work came after FRESH_SECS: ask again (at once) to take it
TIMED_OUT = "timed-out"    # waited the whole wait_secs
GONE = "gone"              # the client closed its connection


def default_max_waiters(threads: int, streams: int = 0) -> int:
    """Waiting claims allowed per process when LONG_POLL_MAX_WAITERS is unset: the
    worker's threads minus RESERVED_THREADS (at most half of them) for submits,
    reads and reports, minus the `streams` the event streams may hold
    (EVENTS_STREAMS_MAX): 128 - 8 - 16 = 104 by default."""
    return max(0, threads - min(RESERVED_THREADS, max(1, threads // 2)) - streams)


class Waiter:
    __slots__ = ("node_id", "event", "poked")

    def __init__(self, node_id: str):
        self.node_id = node_id
        self.event = threading.Event()
        self.poked = False  # set and taken under the room's lock


class WaitRoom:
    def __init__(self, feed: ChangeFeed, max_waiters: int,
                 check: Callable[[set[str], bool], set[str]]):
        """`check(node_ids, recheck)` answers which of those nodes have claimable work (one
        query); `recheck` as the feed's listeners get it (control-plane/server/changefeed.py)."""
        self.feed = feed
        self.max_waiters = max_waiters
        self._check = check
        self._lock = threading.Lock()
        self._by_node: dict[str, set[Waiter]] = {}
        self._count = 0
        self.closed = False
        self.refused = 0  # claims answered at once because the room was full
        self.checks = 0   # grouped queries run for the waiters
        feed.add_listener(self._on_change)

    @property
    def waiting(self) -> int:
        return self._count

    def enter(self, node_id: str) -> Waiter | None:
        """A place in the room, or None when it is full (or closed)."""
        self.feed.ensure_started()
        with self._lock:
            if self.closed or self._count >= self.max_waiters:
                self.refused += 1
                return None
            waiter = Waiter(node_id)
            self._by_node.setdefault(node_id, set()).add(waiter)
            self._count += 1
            return waiter

    def leave(self, waiter: Waiter) -> None:
        with self._lock:
            waiters = self._by_node.get(waiter.node_id)
            if waiters is not None and waiter in waiters:
                waiters.discard(waiter)
                self._count -= 1
                if not waiters:
                    del self._by_node[waiter.node_id]

    def take_poke(self, waiter: Waiter) -> bool:
        """Whether the waiter was poked since it last looked (and reset that)."""
        with self._lock:
            poked, waiter.poked = waiter.poked, False
            return poked

    def poke(self, node_ids: Iterable[str]) -> None:
        """Work was committed for these nodes: wake their waiters, which claim at once."""
        with self._lock:
            for node_id in node_ids:
                for waiter in self._by_node.get(node_id, ()):
                    waiter.poked = True
                    waiter.event.set()

    def placed(self, node_ids: set[str]) -> None:
        """After a commit that placed jobs (the store calls it): this process's waiters of
        those nodes claim now, and the other processes' watchers look now."""
        self.poke(node_ids)
        self.feed.ring(node_ids)

    def close(self) -> None:
        """The worker is stopping: every waiter answers now, no new one waits."""
        self.closed = True
        with self._lock:
            for waiters in self._by_node.values():
                for waiter in waiters:
                    waiter.event.set()

    def _on_change(self, recheck: bool = False, placed: set[str] | None = None) -> None:
        """On the feed's thread, after a commit somewhere: the waiters of the nodes it
        placed work on when the feed says which (no query), else one query for all
        waiting nodes.

        Snapshotting the nodes after the change was seen is enough: a waiter that
        entered later made its own first claim after the change, or its change
        is seen again on the feed's next look."""
        if placed is not None and not recheck:
            self.poke(placed)
            return
        with self._lock:
            nodes = set(self._by_node)
        if not nodes:
            return
        self.checks += 1
        try:
            ready = self._check(nodes, recheck)
        except Exception:
            log.exception("checking %d waiting node(s) for work failed; letting each of them look", len(nodes))
            ready = nodes
        if ready:
            self.poke(ready)


@dataclass
class ClaimAnswer:
    jobs: list
    outcome: str


def client_gone(sock) -> bool:
    """Whether the client closed the connection a request came on (gunicorn's socket)."""
    if sock is None:
        return False
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
        if not poller.poll(0):
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except (OSError, ValueError, TypeError):  # TLS sockets take no flags: assume it is there
        return False


def claim(scheduler, room: WaitRoom, node_id: str, request: dict, clock: Callable[[], float],
          sock=None) -> ClaimAnswer:
    """Claim now; when nothing is claimable, wait up to request['wait_secs'] for work."""
    wait_secs = request["wait_secs"]
    arrived = time.monotonic()
    deadline = arrived + wait_secs
    waiter = room.enter(node_id) if wait_secs > 0 else None
    store = scheduler.store
    try:
        jobs = scheduler.claim(node_id, request, clock())
        if jobs:
            return ClaimAnswer(jobs, CLAIMED)
        if wait_secs <= 0:
            return ClaimAnswer([], NO_WAIT)
        if waiter is None:
            return ClaimAnswer([], STOPPING if room.closed else BUSY)
        store.db.close()  # no connection is held while waiting
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            waiter.event.wait(min(remaining, CHECK_CLIENT_SECS))
            waiter.event.clear()
            if room.closed:
                return ClaimAnswer([], STOPPING)
            if client_gone(sock):
                return ClaimAnswer([], GONE)
            if room.take_poke(waiter):
                if time.monotonic() - arrived > FRESH_SECS:
                    return ClaimAnswer([], AGAIN)  # the agent's next claim (at once) takes it
                with store.db.connection_context():
                    jobs = scheduler.claim(node_id, request, clock(), poked=True)
                if jobs:
                    return ClaimAnswer(jobs, CLAIMED)
        return ClaimAnswer([], TIMED_OUT)
    finally:
        if waiter is not None:
            room.leave(waiter)
