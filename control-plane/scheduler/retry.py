"""How long a failed job attempt waits before the next one (the job retry policy). Pure.

Exponential backoff with full jitter: the n-th retry (n = 0, 1, ...) waits a
uniformly random time in [0, min(cap, base * factor**n)]. The jitter spreads
retries of many jobs that failed together (a bad deploy, a lost dependency)
instead of sending them back at the same instant.

Not the error backoff of a loop (corral.shared.backoff.Backoff): this one is random
and a setting of the job (RETRY_BASE_SECS, RETRY_FACTOR, RETRY_CAP_SECS).
"""
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryDelay:
    base_secs: float = 2.0
    factor: float = 2.0
    cap_secs: float = 300.0

    def ceiling(self, retry_count: int) -> float:
        """The longest the retry after `retry_count` earlier retries may wait."""
        # Cap the exponent so a large retry_count cannot overflow the float.
        return min(self.cap_secs, self.base_secs * self.factor ** min(retry_count, 64))

    def delay(self, retry_count: int, rng: random.Random | None = None) -> float:
        return (rng or random).uniform(0.0, self.ceiling(retry_count))
