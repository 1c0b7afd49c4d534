"""Publish a followed ``kafka-request.log`` as envelopes, resuming where the last run stopped.

The follower (:class:`producers.tail.FileFollower`) reads the file like
``tail -F``; this parses its lines into envelopes, publishes them, and saves
the resume position in a state file only once every record before it was
acknowledged by the broker. A restart therefore loses nothing, and repeats
only the records that were sent but not yet confirmed when the shipper died;
a clean stop flushes and saves first, so the next run repeats nothing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from detectors.envelope import DeadLetter, Envelope
from detectors.lines import DEFAULT_MAX_RECORD_BYTES
from detectors.parse_request_log import RequestLogStats, iter_request_log
from producers.confirmed_positions import ConfirmedPositions
from producers.kafka_publisher import KafkaPublisher
from producers.tail import FileFollower, FilePosition, Segment, StateFile, StopFollowing

FORMAT = "request-log"
# How often the resume position is saved while records stream (it is also saved
# whenever the follower finds no new data, and at exit).
CHECKPOINT_INTERVAL_SECONDS = 1.0


class RequestLogShipper:
    """Parses the follower's lines into envelopes, publishes them, and saves the
    resume position once everything before it was delivered.

    Each position is queued with the number of records produced before it;
    it is saved when the publisher confirms all of them (``confirmed_below``).
    """

    def __init__(
        self,
        publisher: KafkaPublisher,
        state: StateFile,
        *,
        cluster: str,
        node: int,
        tz: str = "UTC",
        status_interval_seconds: float = 30.0,
        checkpoint_interval_seconds: float = CHECKPOINT_INTERVAL_SECONDS,
        flush_timeout_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        status: Callable[[str], None] = lambda line: None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        self.publisher = publisher
        self.state = state
        self.cluster = cluster
        self.node = node
        self.tz = tz
        self.status_interval_seconds = status_interval_seconds
        self.checkpoint_interval_seconds = checkpoint_interval_seconds
        self.flush_timeout_seconds = flush_timeout_seconds
        self.max_record_bytes = max_record_bytes
        self._clock = clock
        self._status = status
        self._positions: ConfirmedPositions[FilePosition] = ConfirmedPositions(publisher, state.save)
        self._segment: Segment | None = None
        self._stats = RequestLogStats()
        self._follower: FileFollower | None = None
        self._last_save = self._last_status = clock()

    def run(self, follower: FileFollower) -> None:
        """Ship until the follower stops; flush and save. Raises DeliveryError."""
        self._follower = follower
        try:
            for segment in follower.segments():
                self._segment, self._stats = segment, RequestLogStats()
                items = iter_request_log(
                    segment.lines(),
                    source=segment.path,
                    cluster=self.cluster,
                    node=self.node,
                    tz=self.tz,
                    stats=self._stats,
                    max_record_bytes=self.max_record_bytes,
                )
                for item in items:
                    if isinstance(item, Envelope):
                        self.publisher.publish(item)
                    else:
                        self._dead_letter(segment, item)
                    self._mark()
                    self._tick()
                self._mark()
        except StopFollowing:
            pass
        finally:
            self._finish()

    def _finish(self) -> None:
        try:
            self._mark()
            self.publisher.flush(self.flush_timeout_seconds)
        finally:
            self._save_confirmed()
            if self._segment is not None:
                self._segment.close()

    def _dead_letter(self, segment: Segment, letter: DeadLetter) -> None:
        # The parser counts lines from where this run started reading; the file's
        # own line number is what helps whoever looks at the dead letter.
        source, _, line = letter.position.rpartition(":")
        if source == segment.path and line.isdigit():
            letter = dataclasses.replace(letter, position=f"{segment.path}:{segment.first_line + int(line)}")
        self.publisher.dead_letter(
            letter,
            {"format": FORMAT, "cluster": self.cluster, "node": self.node, "file": segment.path},
            key=self.cluster,
        )

    def _mark(self) -> None:
        """Queue the current position: after every line the parser has finished with."""
        if self._segment is None:
            return
        consumed = self._stats.finished_lines
        self._positions.mark(self._segment.position_after(consumed))

    def _save_confirmed(self) -> None:
        self._positions.save_confirmed()
        self._last_save = self._clock()

    def _tick(self) -> None:
        now = self._clock()
        if now - self._last_save >= self.checkpoint_interval_seconds:
            self._save_confirmed()
        if self.status_interval_seconds and now - self._last_status >= self.status_interval_seconds:
            self._last_status = now
            self._status(self.summary())
        if self.publisher.stats.failed and self._follower is not None:
            self._follower.stop()  # stop reading; the exit flush reports the failures

    def on_idle(self) -> None:
        """The follower found no new data: serve delivery reports, save, report."""
        self.publisher.poll(0)
        self._mark()
        self._save_confirmed()
        self._tick()

    def lag_bytes(self) -> int:
        """Bytes of the current file not yet confirmed delivered (approximate)."""
        segment = self._segment
        if segment is None:
            return 0
        confirmed = self._positions.confirmed
        same_file = confirmed is not None and (confirmed.dev, confirmed.ino) == (segment.dev, segment.ino)
        done = confirmed.offset if same_file and confirmed is not None else segment.start_offset
        return max(0, segment.size() - done)

    def summary(self) -> str:
        s = self.publisher.stats
        return (
            f"{s.envelopes} records shipped, {s.dead_letters} dead letters "
            f"({s.delivered} delivered, {s.in_flight} in flight, {s.failed} failed), "
            f"lag {self.lag_bytes()} bytes"
        )
