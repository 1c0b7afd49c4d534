"""Resume positions saved only once delivery confirms them, for every shipper
that follows a file, a log or a topic (producers.following_shipper), those
shippers' periodic duties
(:class:`PeriodicDuties`), and the status duties every shipper has
(:class:`StatusDuties`).

Each position is queued with the number of records produced before it and
saved when the publisher has confirmed all of them
(``KafkaPublisher.confirmed_below``): a restart, even after SIGKILL, loses
nothing and repeats only records sent but not yet confirmed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from producers.kafka_publisher import KafkaPublisher

P = TypeVar("P")


class ConfirmedPositions(Generic[P]):
    def __init__(self, publisher: KafkaPublisher, save: Callable[[P], None]) -> None:
        self._publisher = publisher
        self._save = save
        self._waiting: deque[tuple[int, P]] = deque()  # (records produced before it, position)
        self.confirmed: P | None = None  # the newest position every record before which is delivered
        self.saved: P | None = None

    def mark(self, position: P) -> None:
        """``position`` follows every record produced so far."""
        bound = self._publisher.stats.produced
        if self._waiting and self._waiting[-1][0] == bound:
            self._waiting[-1] = (bound, position)
        elif self.confirmed != position:
            self._waiting.append((bound, position))

    def save_confirmed(self) -> None:
        """Save the newest position the publisher's confirmations cover, if new."""
        confirmed_below = self._publisher.confirmed_below
        while self._waiting and self._waiting[0][0] <= confirmed_below:
            self.confirmed = self._waiting.popleft()[1]
        if self.confirmed is not None and self.confirmed != self.saved:
            self._save(self.confirmed)
            self.saved = self.confirmed


class _Reporter(Protocol):
    """What :class:`StatusDuties` needs of the shipper it is mixed into."""

    status_interval_seconds: float
    _last_status: float

    @property
    def publisher(self) -> KafkaPublisher: ...

    def _status(self, line: str) -> None: ...

    def _stop_reading(self) -> None: ...

    def summary(self) -> str: ...


class StatusDuties:
    """Every shipper's duties between reads: its status line and its stop on failed delivery."""

    def _report(self: _Reporter, now: float) -> None:
        """Report the summary every ``status_interval_seconds`` (0: never), and
        stop reading once delivery has failed (the exit flush reports the failures)."""
        if self.status_interval_seconds and now - self._last_status >= self.status_interval_seconds:
            self._last_status = now
            self._status(self.summary())
        if self.publisher.stats.failed:
            self._stop_reading()


class _Stoppable(Protocol):
    def stop(self) -> None: ...


class _Shipper(_Reporter, Protocol):
    """What :class:`PeriodicDuties` needs of the shipper it is mixed into."""

    checkpoint_interval_seconds: float
    _last_save: float

    @property
    def _follower(self) -> _Stoppable | None: ...

    def _clock(self) -> float: ...

    def _save_confirmed(self) -> None: ...

    def _report(self, now: float) -> None: ...


class PeriodicDuties(StatusDuties):
    """A following shipper's duties between records and when idle."""

    def _tick(self: _Shipper) -> None:
        """Save the confirmed position every ``checkpoint_interval_seconds``, then
        the status duties (:class:`StatusDuties`)."""
        now = self._clock()
        if now - self._last_save >= self.checkpoint_interval_seconds:
            self._save_confirmed()
        self._report(now)

    def _stop_reading(self: _Shipper) -> None:
        if self._follower is not None:
            self._follower.stop()
