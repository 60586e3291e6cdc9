"""How long a loop waits after a failure before it tries again, and the loop that
runs a pass every interval and backs off while it fails."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable


class Backoff:
    """Delays that double after each failure, up to `cap`; reset() after a success."""

    def __init__(self, initial: float = 0.5, cap: float = 30.0):
        self.initial = min(initial, cap)
        self.cap = cap
        self._next = self.initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self.cap, self._next * 2)
        return delay

    def reset(self) -> None:
        self._next = self.initial


def every(interval: float, stop: threading.Event, one_pass: Callable[[], object], what: str,
          log: logging.Logger, expected: tuple[type[Exception], ...], cap: float = 30.0) -> None:
    """Run `one_pass` every `interval` until `stop`. A failure is logged (one of
    `expected` as a warning, anything else with its traceback) and the next try waits
    twice the interval, doubling after each further failure up to `cap` (never less
    than the interval)."""
    backoff = Backoff(2 * interval, max(cap, interval))
    delay = interval
    while not stop.wait(delay):
        try:
            one_pass()
            backoff.reset()
            delay = interval
        except expected as exc:
            delay = backoff.next()
            log.warning("%s failed: %s; retrying in %.1fs", what, exc, delay)
        except Exception:
            delay = backoff.next()
            log.exception("%s failed; retrying in %.1fs", what, delay)
