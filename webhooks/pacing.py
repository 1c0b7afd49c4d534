"""When to try again: exponential backoff with full jitter, a server's
Retry-After within bounds, a token bucket, and a circuit breaker.

All of them take the current time as an argument (seconds) and never sleep:
the dispatcher turns their answers into next-attempt times.
"""

from __future__ import annotations

import email.utils
import math
import random
from datetime import UTC


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


def retry_after_seconds(value: str | None, now: float, cap_seconds: float) -> float | None:
    """A Retry-After header as seconds from ``now`` (Unix seconds), at most ``cap_seconds``.

    Both forms of RFC 9110: delta-seconds (``"120"``) and an HTTP date. None
    when the header is absent or neither form, so the caller falls back to its
    own backoff. A huge value (``99999999``, a date in year 9999) is capped,
    never an overflow: a server cannot pause an endpoint longer than its
    configured maximum backoff.
    """
    if value is None:
        return None
    value = value.strip()
    # isascii: str.isdigit() accepts digits such as "²" that float() refuses.
    if value.isascii() and value.isdigit():
        # float() of a very long digit string is inf, never an error; min() then caps it.
        return min(float(value), cap_seconds)
    try:
        when = email.utils.parsedate_to_datetime(value)
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - now
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if not math.isfinite(seconds):
        return None
    return min(max(0.0, seconds), cap_seconds)


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


class Circuit:
    """Whether an endpoint may be sent anything now, and for how long it is held back.

    Two kinds of failure hold an endpoint back:

    - :meth:`hold` -- a failure that is about the endpoint, not the alert
      (connection refused, timeout, 429, a gateway's 502/503/504): the
      dispatcher holds the endpoint for the time it chose.
    - :meth:`row_failed` -- a failure answered about one row (a 500). Alone it
      holds nothing back: that row backs off by itself. Only when ``threshold``
      different rows fail with no delivery in between does the endpoint look
      broken as a whole: the circuit opens for a backoff that doubles with each
      opening. While no delivery has succeeded since, the next failing row (the
      one probe sent after the pause) re-opens it at once.

    :meth:`succeeded` closes it. State lives in memory: after a restart,
    ``threshold`` rows find out again.
    """

    def __init__(self, threshold: int, base_seconds: float, cap_seconds: float, rng: random.Random):
        if threshold < 1:
            raise ValueError(f"threshold must be at least 1, got {threshold}")
        self.threshold = threshold
        self.base_seconds = base_seconds
        self.cap_seconds = cap_seconds
        self._rng = rng
        self._failed_rows: set[int] = set()
        self._openings = 0
        self.held_until = -math.inf

    def is_held(self, now: float) -> bool:
        return self.held_until > now

    def hold(self, until: float) -> None:
        """Hold the endpoint back until ``until`` (or longer, if it already is)."""
        self.held_until = max(self.held_until, until)

    def row_failed(self, row: int, now: float) -> float | None:
        """Count a failure of row ``row``; returns the pause in seconds when the circuit opens."""
        self._failed_rows.add(row)
        if len(self._failed_rows) < self.threshold:
            return None
        self._openings += 1
        pause = backoff_seconds(self._openings, self.base_seconds, self.cap_seconds, self._rng)
        self.hold(now + pause)
        return pause

    def succeeded(self) -> None:
        self._failed_rows.clear()
        self._openings = 0
