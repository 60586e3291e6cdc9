"""How many bytes the gunicorn worker's connections may hold buffered, in all.

Every connection may buffer FREE_BUFFER_BYTES whatever the others hold; beyond that
only while the worker's buffers hold less than the budget in all. A connection over
it is paused (not read: TCP holds its client back) until other requests have been
handed to threads, within its own deadline.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from corral.server.connection import Conn

# Every connection may buffer this much whatever the others hold: heads and the
# bodies of submits, claims and leases fit, so those are never held back.
FREE_BUFFER_BYTES = 64 * 1024
# The least a worker's connections may buffer in all (at least 4 bodies at the limit).
MIN_BUFFER_BUDGET = 64 * 1024 * 1024


class BufferBudget:
    def __init__(self, body_limit: int) -> None:
        self.budget = max(MIN_BUFFER_BUDGET, 4 * body_limit)
        self.buffered = 0
        self._paused: deque[Conn] = deque()

    def hold(self, nbytes: int) -> None:
        self.buffered += nbytes

    def release(self, nbytes: int) -> None:
        self.buffered -= nbytes

    def over(self, conn: Conn) -> bool:
        """Whether reading this connection must wait for others' buffers to empty
        (never when it is the only one holding bytes: it would wait for nothing)."""
        return (len(conn.buf) >= FREE_BUFFER_BYTES and self.buffered >= self.budget
                and self.buffered > len(conn.buf))

    def pause(self, conn: Conn) -> None:
        if not conn.paused:
            conn.paused = True
            self._paused.append(conn)

    def resumed(self) -> Iterator[Conn]:
        """The paused connections that may be read again now, oldest first."""
        while self._paused and self.buffered < self.budget:
            conn = self._paused.popleft()
            conn.paused = False
            yield conn
