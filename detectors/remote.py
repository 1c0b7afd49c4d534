"""Tiered-storage remote log segments as their metadata reports them (KIP-405
records, plus KIP-1272's per-leader-epoch cleaner offsets).

What a segment says about its leader's lineage comes from what released Kafka
writes (RemoteLogSegmentMetadata): ``segmentLeaderEpochs`` maps each leader
epoch in the segment to the offset it starts at there, and ``endOffset`` is the
segment's last offset, so epoch E in a segment holds the offsets from its start
to the next epoch's start - 1, or to ``endOffset`` for the last. The leader
epoch cache (LeaderEpochFileCache) keeps epochs ordered by start offset, so an
epoch E' starting at S means every epoch before E' ended before S.

fencewatch reads the proposal's cleaner-offset map from ``cleanerOffsets``: a
list of ``{"leaderEpoch": E, "offset": O}`` entries on
RemoteLogSegmentMetadataRecord, shaped like ``segmentLeaderEpochs``. The
proposal names no field; released Kafka writes none."""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

from detectors.alerts import Evidence
from detectors.envelope import BadRecord, DeadLetterClass, Envelope
from detectors.fields import INT64, get_int, get_list, get_obj, get_str, objects
from detectors.pickling import fast_pickle

COPY_STARTED, COPY_FINISHED, DELETE_STARTED, DELETE_FINISHED = 0, 1, 2, 3
STATE_NAMES = (
    "COPY_SEGMENT_STARTED",
    "COPY_SEGMENT_FINISHED",
    "DELETE_SEGMENT_STARTED",
    "DELETE_SEGMENT_FINISHED",
)

SEGMENT_RECORD = "REMOTE_LOG_SEGMENT_METADATA_RECORD"
UPDATE_RECORD = "REMOTE_LOG_SEGMENT_METADATA_UPDATE_RECORD"
PARTITION_DELETE_RECORD = "REMOTE_PARTITION_DELETE_METADATA_RECORD"
_TYPE_ALIASES = {
    "RemoteLogSegmentMetadataRecord": SEGMENT_RECORD,
    "RemoteLogSegmentMetadataUpdateRecord": UPDATE_RECORD,
    "RemotePartitionDeleteMetadataRecord": PARTITION_DELETE_RECORD,
    SEGMENT_RECORD: SEGMENT_RECORD,
    UPDATE_RECORD: UPDATE_RECORD,
    PARTITION_DELETE_RECORD: PARTITION_DELETE_RECORD,
}
# RemotePartitionDeleteState ids: DELETE_PARTITION_MARKED 0, _STARTED 1, _FINISHED 2.
PARTITION_DELETE_FINISHED = 2


@fast_pickle
@dataclass(slots=True)
class Segment:
    """A remote segment while it is tracked. The records it keeps are kept
    without their bodies (envelope.without_body): only their time, node and
    position are read later, as evidence, and a segment lives as long as its
    data stays in remote storage."""

    segment_id: str
    key: tuple[str, int]
    broker_id: int
    cleaner: dict[int, int]
    state: int | None = None
    finished: Envelope | None = None
    delete_request: tuple[int, Envelope] | None = None
    zombie: bool = False
    # leader epoch -> (its first offset, its last offset) in this segment: the
    # range the segment claims the epoch's leader wrote (segmentLeaderEpochs, endOffset)
    epochs: dict[int, tuple[int, int]] = field(default_factory=dict)
    # How far its DELETE_SEGMENT_STARTED was stamped behind its broker's newest
    # earlier record of the same log partition, where that is a step back of
    # the broker's clock (RemoteView.behind); else 0.
    requested_behind_ms: int = 0


@fast_pickle
@dataclass(frozen=True, slots=True)
class SegmentEvent:
    """One remote-log-metadata record: a segment moving to ``state``."""

    segment_id: str
    key: tuple[str, int]
    broker_id: int
    state: int
    cleaner: dict[int, int] | None  # only on the segment record
    epochs: dict[int, tuple[int, int]] | None = None  # only on the segment record (Segment.epochs)


@fast_pickle
@dataclass(frozen=True, slots=True)
class PartitionDeleteEvent:
    """A remote-partition-delete record: the partition's remote segments are to go."""

    key: tuple[str, int]
    broker_id: int
    state: int


@fast_pickle
@dataclass(slots=True)
class PartitionSegments:
    """One partition's remote segments: the rules judge a segment against its
    partition's other segments, so they are kept, and stored, together."""

    # leader epoch -> the end offset a later epoch's accepted segment established for it
    established_end: dict[int, tuple[int, Evidence]] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)  # ids of tracked segments that finished copying
    # leader epoch -> the lowest offset an accepted segment starts it at: every
    # earlier epoch ended before it (segmentLeaderEpochs of accepted segments)
    epoch_starts: dict[int, tuple[int, Evidence]] = field(default_factory=dict)
    # Segment id -> segment, while tracked. Kafka's RemoteLogSegmentId is the pair
    # (topicIdPartition, id), so a segment is found under its partition.
    segments: dict[str, Segment] = field(default_factory=dict)


@fast_pickle
@dataclass(slots=True)
class RemoteView:
    # (topic id, partition) -> its segments. Any mapping: the streaming job passes
    # one backed by Spark's state store, read per partition a record names.
    partitions: MutableMapping[tuple[str, int], PartitionSegments] = field(default_factory=dict)
    # partition -> (when it was first seen marked for deletion, when its deletion finished)
    deleting: dict[tuple[str, int], tuple[int, int | None]] = field(default_factory=dict)
    # (__remote_log_metadata partition, broker) -> the newest time its records there carry (behind)
    newest: dict[tuple[int | None, int], int] = field(default_factory=dict)

    def behind(self, log_partition: int | None, broker: int, ts_ms: int) -> int:
        """How far ``broker``'s record at ``ts_ms`` is stamped behind its newest
        earlier record in the same ``__remote_log_metadata`` partition (0: not
        behind). A broker writes a partition's records in the order it made them:
        RemoteLogManager stamps each event when it makes it, and
        TopicBasedRemoteLogMetadataManager.storeRemoteLogMetadata completes only
        once the record is produced and consumed back, so one partition's task
        waits for each before the next. A record stamped well behind an earlier
        one was made after its broker's clock stepped back. The log is applied
        in offset order per partition (detectors.redelivery), so the answer does
        not depend on how the input was cut or re-delivered."""
        key = (log_partition, broker)
        newest = self.newest.get(key)
        if newest is None or ts_ms >= newest:
            self.newest[key] = ts_ms
            return 0
        return newest - ts_ms

    def mark_deleting(self, event: PartitionDeleteEvent, ts_ms: int) -> None:
        marked, finished = self.deleting.get(event.key, (ts_ms, None))
        if event.state == PARTITION_DELETE_FINISHED:
            finished = ts_ms if finished is None else min(finished, ts_ms)
        self.deleting[event.key] = (min(marked, ts_ms), finished)

    def deleted_since(self, key: tuple[str, int]) -> int | None:
        """When ``key`` was first seen marked for deletion, if it was."""
        found = self.deleting.get(key)
        return None if found is None else found[0]

    def forget_deleted(self, before_ms: int) -> None:
        """Drop partitions whose deletion finished before ``before_ms``."""
        for key in [k for k, (_, done) in self.deleting.items() if done is not None and done < before_ms]:
            del self.deleting[key]


def _state(value: Any, path: str) -> int:
    if isinstance(value, str) and value in STATE_NAMES:
        return STATE_NAMES.index(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(STATE_NAMES):
        return value
    # A number is a state's ordinal, so beyond 0-3 it is out of range; a name
    # outside the set, or anything else, is not a state at all.
    kind = DeadLetterClass.of_bad_number(value)
    raise BadRecord(f"{path} must be one of {', '.join(STATE_NAMES)} (or 0-3), got {value!r}", kind)


def parse_event(body: dict[str, Any]) -> SegmentEvent | PartitionDeleteEvent:
    record_type = _TYPE_ALIASES.get(str(get_str(body, "type", "body")))
    if record_type is None:
        raise BadRecord(
            f"body.type {body.get('type')!r} is not a remote log metadata record",
            DeadLetterClass.INVALID,
        )
    data = get_obj(body, "data", "body")
    if record_type == PARTITION_DELETE_RECORD:
        # RemotePartitionDeleteMetadataRecord.json: topicIdPartition, brokerId, remotePartitionDeleteState.
        tip = get_obj(data, "topicIdPartition", "data")
        topic_id = get_str(tip, "id", "data.topicIdPartition")
        assert topic_id is not None
        state = get_int(data, "remotePartitionDeleteState", "data", bounds=(0, PARTITION_DELETE_FINISHED))
        key = (topic_id, get_int(tip, "partition", "data.topicIdPartition"))
        return PartitionDeleteEvent(key, get_int(data, "brokerId", "data"), state)
    ident = get_obj(data, "remoteLogSegmentId", "data")
    tip = get_obj(ident, "topicIdPartition", "data.remoteLogSegmentId")
    topic_id = get_str(tip, "id", "data.remoteLogSegmentId.topicIdPartition")
    partition = get_int(tip, "partition", "data.remoteLogSegmentId.topicIdPartition")
    segment_id = get_str(ident, "id", "data.remoteLogSegmentId")
    assert topic_id is not None and segment_id is not None
    state = _state(data.get("remoteLogSegmentState"), "data.remoteLogSegmentState")
    cleaner = epochs = None
    if record_type == SEGMENT_RECORD:
        cleaner = {
            get_int(e, "leaderEpoch", p): get_int(e, "offset", p, bounds=INT64)
            for p, e in objects(get_list(data, "cleanerOffsets", "data", default=[]), "data.cleanerOffsets")
        }
        epochs = _epoch_ranges(data)
    return SegmentEvent(
        segment_id, (topic_id, partition), get_int(data, "brokerId", "data"), state, cleaner, epochs
    )


def _epoch_ranges(data: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """Each leader epoch of a segment record with the offsets it holds there:
    from its start to the next epoch's start - 1, the last to ``endOffset``
    (RemoteLogSegmentMetadata.segmentLeaderEpochs, a map ordered by epoch).
    An epoch whose successor starts at the same offset holds none."""
    starts = sorted(
        (get_int(e, "leaderEpoch", p), get_int(e, "offset", p, bounds=INT64))
        for p, e in objects(
            get_list(data, "segmentLeaderEpochs", "data", default=[]), "data.segmentLeaderEpochs"
        )
    )
    if not starts:
        return {}
    end = get_int(data, "endOffset", "data", bounds=INT64)
    ranges: dict[int, tuple[int, int]] = {}
    for (epoch, start), following in zip(starts, [*starts[1:], None], strict=True):
        last = end if following is None else following[1] - 1
        if last >= start:
            ranges[epoch] = (start, last)
    return ranges
