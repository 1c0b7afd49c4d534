"""Publish a live ``__cluster_metadata-0`` as envelopes, each record once.

The follower (:class:`producers.metadata_log_follower.MetadataLogFollower`)
reads the directory; this publishes what it yields and keeps the resume
position in a state file. A position is saved only once every record before
it was acknowledged by the broker, so a restart (even after SIGKILL) loses
nothing and repeats only records that were sent but not yet confirmed; a
clean stop flushes first and repeats nothing. Records carry their log offset,
by which the detector drops a repeat.
"""

from __future__ import annotations

import os
from typing import Any, Unpack

from detectors.envelope import DeadLetter, Envelope
from producers.following_shipper import FollowingShipper, Pacing
from producers.kafka_publisher import KafkaPublisher
from producers.metadata_log import MetadataLogStats
from producers.metadata_log_follower import LogPosition, MetadataLogFollower
from producers.tail import StateError, read_state, write_state

FORMAT = "metadata-log"


class MetadataLogState:
    """The follower's :class:`LogPosition` for one directory, as JSON, replaced
    atomically (written aside, fsynced, renamed over) on every save."""

    def __init__(self, path: str, directory: str) -> None:
        self.path = path
        self.directory = os.path.abspath(directory)

    def load(self) -> LogPosition | None:
        """The saved position; None without a state file; :class:`StateError`
        for one that is unreadable or belongs to another directory."""
        obj = read_state(self.path)
        if obj is None:
            return None
        if obj.get("format") != FORMAT:
            raise StateError(f"state file {self.path} is not a metadata-log position")
        if obj.get("directory") != self.directory:
            raise StateError(
                f"state file {self.path} belongs to {obj.get('directory')}, not {self.directory}; "
                "use --state-file to keep a separate one"
            )
        try:
            segment = obj["segment"]
            segment = None if segment is None else int(segment)
            position = LogPosition(int(obj["next_offset"]), segment, int(obj["byte"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"state file {self.path}: bad position: {exc!r}") from None
        return position

    def save(self, position: LogPosition) -> None:
        write_state(self.path, {"format": FORMAT, "directory": self.directory, **position.to_dict()})


class MetadataLogShipper(FollowingShipper[LogPosition, MetadataLogFollower]):
    """Publishes what a follower yields; saves positions once delivered.

    Positions are saved once delivery confirms them
    (producers.confirmed_positions), as the request-log shipper's are.
    """

    def __init__(
        self,
        publisher: KafkaPublisher,
        state: MetadataLogState,
        *,
        cluster: str,
        node: int | None,
        stats: MetadataLogStats,
        **pacing: Unpack[Pacing],
    ) -> None:
        super().__init__(publisher, state.save, cluster=cluster, **pacing)
        self.state = state
        self.node = node
        self.stats = stats

    def run(self, follower: MetadataLogFollower) -> None:
        """Ship until the follower stops; flush and save. Raises DeliveryError."""
        self._follower = follower
        origin: dict[str, Any] = {"format": FORMAT, "cluster": self.cluster, "node": self.node}
        try:
            for item in follower.items():
                if isinstance(item, Envelope):
                    self.publisher.publish(item)
                elif isinstance(item, DeadLetter):
                    where = {**origin, "file": item.position.rpartition(":")[0]}
                    self.publisher.dead_letter(item, where, key=self.cluster)
                else:
                    self._positions.mark(item)
                    self._tick()
        finally:
            self._flush_and_save()

    def summary(self) -> str:
        s = self.publisher.stats
        saved = self._positions.saved
        at = saved.next_offset if saved is not None else "nothing yet"
        skipped = self.stats.control_records + self.stats.unread
        follow = self._follower.follow if self._follower is not None else None
        read = (
            f"{len(follow.snapshots)} snapshot(s) and {follow.segments} segment(s) read, "
            f"{follow.already_published} records skipped as published already, "
            if follow is not None
            else ""
        )
        return (
            f"{FORMAT}: {s.envelopes} records shipped, {s.dead_letters} dead letters "
            f"({s.delivered} delivered, {s.in_flight} in flight, {s.failed} failed), {read}{skipped} control "
            f"records and records without a schema skipped; saved position: next offset {at}"
        )
