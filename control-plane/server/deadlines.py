"""The gunicorn worker's timers: each connection's deadline for its phase (the read
timeout, keepalive, lingering close), in one heap the event loop waits on.

A connection moves on by `move`, which voids its older timers (an entry is valid only
for the connection's version it was set for), so nothing is ever removed from the heap.
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator

from corral.server.connection import BUSY, CLOSED, Conn


class Deadlines:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Conn, int]] = []  # (deadline, seq, conn, version)
        self._seq = itertools.count()

    def move(self, conn: Conn, phase: str, deadline: float | None = None) -> None:
        """Move a connection on; its deadline stays unless a new one is given. Timers
        set before are void (a heap entry is only valid for the version it was set for)."""
        conn.phase = phase
        conn.version += 1
        if deadline is not None:
            conn.deadline = deadline
        if phase not in (BUSY, CLOSED):
            heapq.heappush(self._heap, (conn.deadline, next(self._seq), conn, conn.version))

    def next_at(self) -> float | None:
        """When the earliest timer fires (it may be void by then), or None."""
        return self._heap[0][0] if self._heap else None

    def passed(self, now: float) -> Iterator[Conn]:
        """The connections whose deadline for the phase they are still in has passed."""
        while self._heap and self._heap[0][0] <= now:
            _, _, conn, version = heapq.heappop(self._heap)
            if version == conn.version:  # else the connection moved on since
                yield conn
