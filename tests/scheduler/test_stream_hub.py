"""The event streams' own budget (per process, per credential), the threads it leaves
the waiting claims, and the hub: one look per change for every open stream, and
the streams woken only when events were committed."""
import threading

import peewee

from helpers import wait_for

from corral.scheduler import longpoll, stream_hub
from corral.scheduler.event_log import Recent
from corral.scheduler.events import Cursor, Filter
from corral.server.changefeed import ChangeFeed


def test_a_credential_at_its_cap_is_refused_while_others_open_streams():
    budget = stream_hub.StreamBudget(max_streams=3, per_credential=2)
    assert budget.take("token:reader") is None
    assert budget.take("token:reader") is None
    assert budget.take("token:reader") == stream_hub.CREDENTIAL_FULL
    assert budget.take("token:operator") is None
    assert budget.take("token:operator") == stream_hub.PROCESS_FULL  # the process's cap comes first
    budget.give_back("token:reader")
    assert budget.take("token:operator") is None
    assert budget.open == 3


def test_the_claims_default_leaves_the_streams_and_the_reserved_threads_free():
    threads = 128
    streams = stream_hub.default_max_streams(threads)
    waiters = longpoll.default_max_waiters(threads, streams)
    assert (streams, waiters) == (16, 104)
    assert threads - streams - waiters == longpoll.RESERVED_THREADS  # submits, reads, reports
    assert longpoll.default_max_waiters(8, stream_hub.default_max_streams(8)) == 3  # 4 reserved, 1 stream


def test_behind_compares_a_position_with_the_mark():
    assert stream_hub.behind(Cursor(id=5), None)  # not known yet: read
    assert stream_hub.behind(Cursor(id=5), 6) and not stream_hub.behind(Cursor(id=6), 6)
    assert not stream_hub.behind(Cursor(7, 7, 0, True), 7)  # every transaction below 7 read
    assert stream_hub.behind(Cursor(7, 7, 0, True), 9)
    assert stream_hub.behind(Cursor(5, 7, 3, True), 7)  # a window read in part


class ManualFeed(ChangeFeed):
    """A feed whose changes the test makes (`changed()`); no thread of its own."""

    def __init__(self):
        super().__init__(1.0)

    def ensure_started(self):
        pass


class CountingLog:
    """The hub's side of EventLog: the mark, the new events, and how often it was asked."""

    windowed = False

    def __init__(self):
        self.newest = 0
        self.asked = 0

    def mark(self):
        self.asked += 1
        return self.newest

    def recent(self, after, upto, limit):
        self.asked += 1
        return [Recent(i, "job", i, None, b"event: job\n\n") for i in range(after + 1, upto + 1)]


def test_one_look_per_change_serves_every_stream_and_wakes_them_only_for_events():
    feed, log = ManualFeed(), CountingLog()
    hub = stream_hub.StreamHub(log, peewee.SqliteDatabase(":memory:"), feed)
    streams, wakes, stop, ready = 50, [0] * 50, threading.Event(), []

    def stream(i):
        seen = hub.generation
        ready.append(i)
        while not stop.is_set():
            now = hub.wait(seen, 30.0)
            if now != seen:
                wakes[i] += 1
            seen = now

    for _ in range(streams):
        hub.join()
    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(streams)]
    try:
        wait_for(lambda: log.asked == 1 and hub.mark == 0, timeout=30, message="the hub's first look")
        for t in threads:
            t.start()
        wait_for(lambda: len(ready) == streams, timeout=30, message="the streams to wait")
        feed.changed()  # a commit that wrote no event (a lease renewal)
        wait_for(lambda: log.asked == 2, timeout=30, message="the hub's look")
        log.newest = 1
        feed.changed()  # a commit that wrote an event
        wait_for(lambda: all(w == 1 for w in wakes), timeout=30, message="every stream to wake")
        assert log.asked == 4  # one query per change and one read of the new events, for all 50 streams
        assert wakes == [1] * streams  # the change without an event woke none
        chunks, after = hub.take(Cursor(id=0), Filter())  # what each of them sends, with no query
        assert chunks == [b"event: job\n\n"] and after == Cursor(id=1)
        assert hub.take(Cursor(id=0), Filter(job_row=2)) == ([], Cursor(id=1))
    finally:
        stop.set()
        hub.stop()
        for t in threads:
            t.join(timeout=30)
