"""What a shipper that follows a file, a log or a topic shares with the others of
its kind (producers.request_log_shipper, producers.metadata_log_shipper,
producers.remote_log_metadata_topic): the publisher and the state its positions
are saved to once delivery confirms them (producers.confirmed_positions), the
status and save intervals, what it does while there is nothing new to read, and
the flush and save that end a run."""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Callable
from typing import Generic, Protocol, TypedDict, TypeVar

from producers.confirmed_positions import ConfirmedPositions, PeriodicDuties
from producers.kafka_publisher import KafkaPublisher

P = TypeVar("P")  # a position in what is followed


class Follower(Protocol):
    """What follows the log or topic: the shipper stops it when delivery fails."""

    def stop(self) -> None: ...


F = TypeVar("F", bound=Follower)


class Pacing(TypedDict, total=False):
    """A following shipper's intervals, flush deadline, clock and status line, as
    a subclass passes them on (``**pacing: Unpack[Pacing]``); the defaults are
    :class:`FollowingShipper`'s."""

    status_interval_seconds: float
    checkpoint_interval_seconds: float
    flush_timeout_seconds: float
    clock: Callable[[], float]
    status: Callable[[str], None]


class FollowingShipper(PeriodicDuties, Generic[P, F]):
    """Publishes what a follower (``F``) yields; saves its positions (``P``) once
    delivered. A subclass's ``run`` publishes, marks each position and ends with
    :meth:`_flush_and_save`."""

    def __init__(
        self,
        publisher: KafkaPublisher,
        save: Callable[[P], None],
        *,
        cluster: str,
        status_interval_seconds: float = 30.0,
        # How often the position is saved while records stream; it is also saved
        # whenever there is nothing new to read, and at the end.
        checkpoint_interval_seconds: float = 1.0,
        flush_timeout_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        status: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.publisher = publisher
        self.cluster = cluster
        self.status_interval_seconds = status_interval_seconds
        self.checkpoint_interval_seconds = checkpoint_interval_seconds
        self.flush_timeout_seconds = flush_timeout_seconds
        self._clock = clock
        self._status = status
        self._positions: ConfirmedPositions[P] = ConfirmedPositions(publisher, save)
        self._follower: F | None = None
        self._last_save = self._last_status = clock()

    @abstractmethod
    def summary(self) -> str:
        """One line: what was shipped and where the saved position stands."""

    def on_idle(self) -> None:
        """Nothing new to read: serve delivery reports, save, report."""
        self.publisher.poll(0)
        self._save_confirmed()
        self._tick()

    def _may_save(self) -> bool:
        """Whether a position may be saved yet (a subclass's state may need more first)."""
        return True

    def _save_confirmed(self) -> None:
        if self._may_save():
            self._positions.save_confirmed()
        self._last_save = self._clock()

    def _flush_and_save(self) -> None:
        """The end of a run: deliver what is in flight, then save what that
        confirmed, even when delivery fails (DeliveryError propagates)."""
        try:
            self.publisher.flush(self.flush_timeout_seconds)
        finally:
            self._save_confirmed()
