"""Ship the watched cluster's ``__remote_log_metadata`` straight from the topic:
each record's bytes decoded with Kafka's own schemas
(:mod:`producers.remote_log_metadata_records`), no console consumer or
formatter in between.

The reader assigns itself every partition of the topic (no consumer group: it
commits nothing to the watched cluster) and starts each at the position saved
in the state file, else at the partition's beginning. A position is saved only
once every record before it was acknowledged by the event topic's broker
(:class:`producers.confirmed_positions.ConfirmedPositions`), so a restart,
even after SIGKILL, loses nothing and repeats only records sent but not yet
confirmed, which the detector drops by their (partition, offset). The state
names the watched cluster's id, so a state file is never applied to another
cluster's topic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Unpack

from detectors.envelope import DeadLetter, Envelope
from detectors.parse_remote_log_metadata import RemoteLogMetadataStats
from producers.following_shipper import FollowingShipper, Pacing
from producers.kafka_publisher import KafkaPublisher
from producers.remote_log_metadata_records import TOPIC, TopicRecord, iter_topic_records
from producers.tail import StateError, read_state, write_state

FORMAT = "remote-log-metadata-topic"
# How long a --once run waits for records it knows are there (below the high
# watermarks it read at start) before saying the topic cannot be read.
_STALL_SECONDS = 60.0


class TopicUnavailable(OSError):
    """The watched cluster or its topic cannot be read; the message is one line
    saying why (an OSError: the shippers report it as an input they cannot read)."""


@dataclass(frozen=True)
class TopicPosition:
    """The next offset to read of each partition of the topic."""

    next_offsets: tuple[tuple[int, int], ...]

    def as_dict(self) -> dict[int, int]:
        return dict(self.next_offsets)


class TopicState:
    """The reader's :class:`TopicPosition` for one watched cluster, as JSON,
    replaced atomically on every save (:func:`producers.tail.write_state`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.cluster_id: str | None = None  # set once the watched cluster's id is known

    def load(self) -> tuple[str, TopicPosition] | None:
        """(cluster id, position) saved; None without a state file;
        :class:`StateError` for one that is unreadable."""
        obj = read_state(self.path)
        if obj is None:
            return None
        if obj.get("format") != FORMAT:
            raise StateError(f"state file {self.path} is not a {TOPIC} position")
        try:
            offsets = tuple(sorted((int(p), int(o)) for p, o in obj["next_offsets"].items()))
            return str(obj["cluster_id"]), TopicPosition(offsets)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateError(f"state file {self.path}: bad position: {exc!r}") from None

    def save(self, position: TopicPosition) -> None:
        write_state(
            self.path,
            {
                "format": FORMAT,
                "cluster_id": self.cluster_id,
                "next_offsets": {str(p): o for p, o in position.next_offsets},
            },
        )


class TopicReader:
    """Reads ``__remote_log_metadata`` of the watched cluster from ``start``
    (every partition from its beginning when None); yields each record and,
    after it, the position that follows it. ``expected_cluster_id``: the
    cluster the saved position belongs to (:class:`StateError` for another). ``once``: up to the high
    watermarks read at start, then end; otherwise until :meth:`stop`."""

    def __init__(
        self,
        config: dict[str, Any],
        *,
        start: TopicPosition | None,
        expected_cluster_id: str | None = None,
        once: bool,
        poll_timeout_seconds: float = 0.5,
        on_idle: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.start = start
        self.expected_cluster_id = expected_cluster_id
        self.once = once
        self.poll_timeout_seconds = poll_timeout_seconds
        self.on_idle = on_idle
        self.cluster_id: str | None = None
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def items(self) -> Iterator[TopicRecord | TopicPosition]:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        consumer = Consumer(
            {
                **self.config,
                # assign() only: the group is never joined and nothing is committed.
                "group.id": "fencewatch-ship-remote-log-metadata",
                "enable.auto.commit": False,
                "enable.partition.eof": False,
            }
        )
        try:
            try:
                metadata = consumer.list_topics(TOPIC, timeout=30)
            except KafkaException as exc:
                raise TopicUnavailable(f"cannot read the watched cluster's metadata: {exc.args[0]}") from None
            topic = metadata.topics.get(TOPIC)
            if topic is None or topic.error is not None or not topic.partitions:
                raise TopicUnavailable(
                    f"the watched cluster has no {TOPIC} topic -- is tiered storage on "
                    "(remote.log.storage.system.enable=true) and has a tiered topic been created?"
                )
            self.cluster_id = metadata.cluster_id
            if self.expected_cluster_id is not None and self.cluster_id != self.expected_cluster_id:
                raise StateError(
                    f"the state file belongs to cluster {self.expected_cluster_id}, and "
                    f"--source-bootstrap-servers reaches cluster {self.cluster_id}; use --state-file to keep "
                    "a separate one"
                )
            offsets = {p: 0 for p in sorted(topic.partitions)}
            if self.start is not None:
                offsets.update(self.start.as_dict())
            ends = self._high_watermarks(consumer, offsets) if self.once else {}
            consumer.assign([TopicPartition(TOPIC, p, o) for p, o in offsets.items()])
            last_progress = time.monotonic()
            while not self._stopped.is_set():
                if self.once and all(offsets[p] >= end for p, end in ends.items()):
                    return
                msg = consumer.poll(self.poll_timeout_seconds)
                if msg is None:
                    self.on_idle()
                    if self.once and time.monotonic() - last_progress > _STALL_SECONDS:
                        behind = {p: (offsets[p], e) for p, e in ends.items() if offsets[p] < e}
                        raise TopicUnavailable(f"{TOPIC} gave nothing for {_STALL_SECONDS:.0f} s at {behind}")
                    continue
                error = msg.error()
                if error is not None:
                    if error.fatal():
                        raise TopicUnavailable(f"reading {TOPIC} failed: {error.str()}")
                    continue
                last_progress = time.monotonic()
                partition, offset = int(msg.partition() or 0), int(msg.offset() or 0)
                yield TopicRecord(partition, offset, msg.value())
                offsets[partition] = offset + 1
                yield TopicPosition(tuple(sorted(offsets.items())))
        finally:
            consumer.close()

    def _high_watermarks(self, consumer: Any, offsets: dict[int, int]) -> dict[int, int]:
        from confluent_kafka import KafkaException, TopicPartition

        ends = {}
        for partition in offsets:
            try:
                _, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, partition), timeout=30)
            except KafkaException as exc:
                raise TopicUnavailable(f"cannot read {TOPIC}-{partition}'s end: {exc.args[0]}") from None
            ends[partition] = high
        return ends


class TopicShipper(FollowingShipper[TopicPosition, TopicReader]):
    """Publishes the envelopes of what a :class:`TopicReader` yields; saves
    positions once delivered."""

    def __init__(
        self,
        publisher: KafkaPublisher,
        state: TopicState,
        *,
        cluster: str,
        **pacing: Unpack[Pacing],
    ) -> None:
        super().__init__(publisher, state.save, cluster=cluster, **pacing)
        self.state = state
        self.stats = RemoteLogMetadataStats()

    def run(self, reader: TopicReader) -> None:
        """Ship until the reader ends or stops; flush and save. Raises
        DeliveryError and :class:`TopicUnavailable`."""
        self._follower = reader
        origin = {"format": "remote-log-metadata", "cluster": self.cluster, "topic": TOPIC}
        positions: list[TopicPosition] = []

        def records() -> Iterator[TopicRecord]:
            for item in reader.items():
                if isinstance(item, TopicPosition):
                    positions.append(item)
                else:
                    self.state.cluster_id = reader.cluster_id
                    yield item

        try:
            for item in iter_topic_records(records(), cluster=self.cluster, stats=self.stats):
                if isinstance(item, Envelope):
                    self.publisher.publish(item)
                elif isinstance(item, DeadLetter):
                    self.publisher.dead_letter(item, origin, key=self.cluster)
                if positions:
                    self._positions.mark(positions[-1])
                    positions.clear()
                self._tick()
        finally:
            if positions:
                self._positions.mark(positions[-1])
            self._flush_and_save()

    def _may_save(self) -> bool:
        """Not before the watched cluster's id is known: a state names its cluster."""
        return self.state.cluster_id is not None

    def summary(self) -> str:
        s = self.publisher.stats
        saved = self._positions.saved
        at = ", ".join(f"{p}:{o}" for p, o in saved.next_offsets) if saved is not None else "nothing yet"
        by_type = ", ".join(f"{n} {t}" for t, n in sorted(self.stats.records_by_type.items()))
        return (
            f"remote-log-metadata from {TOPIC}: {self.stats.lines} records read ({by_type or 'none'}), "
            f"{s.envelopes} shipped, {self.stats.dead_letters} dead letters ({s.delivered} delivered, "
            f"{s.in_flight} in flight, {s.failed} failed); saved next offsets (partition:offset): {at}"
        )
