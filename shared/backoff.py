"""How long a loop waits after a failure before it tries again."""


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
