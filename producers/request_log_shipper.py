"""Publish a followed ``kafka-request.log`` as envelopes, resuming where the last run stopped.

The follower (:class:`producers.tail.FileFollower`) reads the file like
``tail -F``; this parses its lines into envelopes, publishes them, and saves
the resume position in a state file only once every record before it was
acknowledged by the broker. A restart therefore loses nothing, and repeats
only the records that were sent but not yet confirmed when the shipper died;
a clean stop flushes and saves first, so the next run repeats nothing.

Only the entries of the APIs some rule reads (``detectors.rules.READ_APIS``)
are published, unless ``all_apis``; the others are counted by API name in the
summary.
"""

from __future__ import annotations

import dataclasses
from typing import Unpack

from detectors.envelope import DeadLetter, Envelope
from detectors.lines import DEFAULT_MAX_RECORD_BYTES
from detectors.parse_request_log import RequestLogStats, iter_request_log, unread_account
from detectors.rules import READ_APIS
from producers.following_shipper import FollowingShipper, Pacing
from producers.kafka_publisher import KafkaPublisher
from producers.tail import FileFollower, FilePosition, Segment, StateFile, StopFollowing

FORMAT = "request-log"


class RequestLogShipper(FollowingShipper[FilePosition, FileFollower]):
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
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        all_apis: bool = False,
        **pacing: Unpack[Pacing],
    ) -> None:
        super().__init__(publisher, state.save, cluster=cluster, **pacing)
        self.state = state
        self.node = node
        self.tz = tz
        self.max_record_bytes = max_record_bytes
        self.apis = None if all_apis else READ_APIS
        # Entries left out for their API, by API name, over every file of the run
        # (each file's RequestLogStats counts into it).
        self.unread_by_api: dict[str, int] = {}
        self._earlier_bridges = 0  # entries of those APIs shipped for their time, in earlier files
        self._segment: Segment | None = None
        self._stats = self._new_stats()

    def run(self, follower: FileFollower) -> None:
        """Ship until the follower stops; flush and save. Raises DeliveryError."""
        self._follower = follower
        try:
            for segment in follower.segments():
                self._earlier_bridges += self._stats.bridges
                self._segment, self._stats = segment, self._new_stats()
                items = iter_request_log(
                    segment.lines(),
                    source=segment.path,
                    cluster=self.cluster,
                    node=self.node,
                    tz=self.tz,
                    stats=self._stats,
                    max_record_bytes=self.max_record_bytes,
                    apis=self.apis,
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

    def _new_stats(self) -> RequestLogStats:
        return RequestLogStats(unread_by_api=self.unread_by_api)

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

    def on_idle(self) -> None:
        """The follower found no new data: queue the position it reached, then
        serve delivery reports, save, report."""
        self._mark()
        super().on_idle()

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
        account = unread_account(self.unread_by_api, self._earlier_bridges + self._stats.bridges)
        unread = f"; {account}" if account else ""
        return (
            f"{s.envelopes} records shipped, {s.dead_letters} dead letters "
            f"({s.delivered} delivered, {s.in_flight} in flight, {s.failed} failed), "
            f"lag {self.lag_bytes()} bytes{unread}"
        )
