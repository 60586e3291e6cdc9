"""How long a failed attempt waits before the next one. Pure.

Exponential backoff with full jitter: the n-th retry (n = 0, 1, ...) waits a
uniformly random time in [0, min(cap, base * factor**n)]. The jitter spreads
retries of many jobs that failed together (a bad deploy, a lost dependency)
instead of sending them back at the same instant.
"""
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    base_secs: float = 2.0
    factor: float = 2.0
    cap_secs: float = 300.0

    def ceiling(self, retry_count: int) -> float:
        """The longest the retry after `retry_count` earlier retries may wait."""
        # Cap the exponent so a large retry_count cannot overflow the float.
        return min(self.cap_secs, self.base_secs * self.factor ** min(retry_count, 64))

    def delay(self, retry_count: int, rng: random.Random | None = None) -> float:
        return (rng or random).uniform(0.0, self.ceiling(retry_count))
