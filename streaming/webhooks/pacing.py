"""When to try again: exponential backoff with full jitter, and a token bucket.

Both take the current time as an argument (seconds) and never sleep: the
dispatcher turns their answers into next-attempt times.
"""

from __future__ import annotations

import random


def backoff_seconds(failures: int, base_seconds: float, cap_seconds: float, rng: random.Random) -> float:
    """The wait after the ``failures``-th failed attempt in a row (1 for the first).

    Full jitter: uniform in ``[0, min(cap, base * 2**(failures-1))]``, so
    senders that failed together do not retry together.
    """
    if failures < 1:
        raise ValueError(f"failures counts from 1, got {failures}")
    # Past 2**60 the product only overflows; the cap has long taken over.
    ceiling = min(cap_seconds, base_seconds * 2.0 ** min(failures - 1, 60))
    return rng.uniform(0.0, ceiling)


class TokenBucket:
    """``rate_per_second`` sustained, up to ``burst`` at once after a quiet spell.

    Starts full. ``now`` is any clock in seconds that does not go backwards much
    (a step back only delays refill).
    """

    def __init__(self, rate_per_second: float, burst: float, now: float):
        if rate_per_second <= 0 or burst < 1:
            raise ValueError("rate_per_second must be > 0 and burst >= 1")
        self.rate_per_second = rate_per_second
        self.burst = burst
        self._tokens = burst
        self._last = now

    def _refill(self, now: float) -> None:
        if now > self._last:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate_per_second)
            self._last = now

    def take(self, now: float) -> float:
        """Take one token and return 0, or take none and return the seconds until one is there."""
        self._refill(now)
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self.rate_per_second
