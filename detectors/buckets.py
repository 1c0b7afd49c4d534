"""How one cluster's work splits into buckets, so the streaming job can spread
a cluster over many tasks (docs/architecture.md, "Buckets").

A partition belongs to bucket ``partition index mod count``. The index is the
one thing every record names the same way: requests name a topic by name or
by id depending on the API and its version (Fetch v13+ and AlterPartition v2+
by id, StopReplica by name), and which name goes with which id is known only
from the metadata log, which a stateless split before the shuffle cannot read.

Each record goes to the buckets of the partitions it names. Records every
bucket needs go to all of them ("fanned out"): the cluster-wide metadata
(brokers, topics, features), StopReplica / LeaderAndIsr / UpdateMetadata,
whose controller epoch a broker accepts for all its partitions, and
BrokerHeartbeat, how far a broker had applied the metadata log, and the
clock evidence the buckets share (detectors.clock_exchange). Records about no partition
(quorum traffic and state, requests no rule reads) go to bucket 0.

A record reaching several buckets is counted, dead-lettered and judged for
what is not a partition's (a request's controller or broker epoch) once, in
its *home* bucket: the lowest of its buckets. Every other copy only updates
that bucket's view and judges that bucket's partitions.

The streaming job computes the same split in Spark SQL before the shuffle
(streaming/routing.py); :func:`buckets_of` is its reference, which tests hold
the SQL to.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from detectors.envelope import Envelope
from detectors.requests import (
    ALTER_PARTITION,
    BROKER_HEARTBEAT,
    FETCH,
    LEADER_AND_ISR,
    LIST_OFFSETS,
    OFFSET_FOR_LEADER_EPOCH,
    PRODUCE,
    STOP_REPLICA,
    UPDATE_METADATA,
    is_quorum_fetch,
)

# Metadata records about one partition; every other metadata record is fanned out.
PARTITION_RECORDS = ("PARTITION_RECORD", "PARTITION_CHANGE_RECORD")
# Requests whose controller epoch every bucket must know, and BrokerHeartbeat:
# how far its broker had applied the metadata log, for every partition it serves.
FANNED_OUT_APIS = (STOP_REPLICA, LEADER_AND_ISR, UPDATE_METADATA, BROKER_HEARTBEAT)
# Where each partition-scoped request keeps its partition indexes:
# request.<topics>[].<partitions>[].<index>.
PARTITION_PATHS = {
    PRODUCE: ("topicData", "partitionData", "index"),
    FETCH: ("topics", "partitions", "partition"),
    LIST_OFFSETS: ("topics", "partitions", "partitionIndex"),
    OFFSET_FOR_LEADER_EPOCH: ("topics", "partitions", "partition"),
    ALTER_PARTITION: ("topics", "partitions", "partitionIndex"),
}


class _HasPartition(Protocol):
    @property
    def partition(self) -> int: ...


_P = TypeVar("_P", bound=_HasPartition)


@dataclass(frozen=True, slots=True)
class Bucket:
    """One bucket of a cluster; the default, 0 of 1, owns everything."""

    index: int = 0
    count: int = 1

    def owns(self, partition: int) -> bool:
        return self.count == 1 or partition % self.count == self.index

    def owned(self, items: Sequence[_P]) -> Sequence[_P]:
        """The entries of a request's partitions that this bucket judges
        (``items`` itself when the bucket owns everything)."""
        if self.count == 1:
            return items
        return [item for item in items if item.partition % self.count == self.index]

    def is_home(self, env: Envelope) -> bool:
        """Whether this bucket is ``env``'s home (see :func:`buckets_of`)."""
        return self.count == 1 or buckets_of(env, self.count)[0] == self.index


WHOLE = Bucket()  # the default: one bucket owns every partition


def buckets_of(env: Envelope, count: int) -> tuple[int, ...]:
    """The buckets that receive ``env``, ascending: the first is its home."""
    return (0,) if count == 1 else _buckets(env.kind, env.body, count)


def document_buckets(document: Any, count: int) -> tuple[int, ...]:
    """:func:`buckets_of` of a decoded JSON document not yet validated as an
    envelope: what the Kafka source routes a raw record by. A document that is
    no envelope's (not an object, a body that is not one) goes to bucket 0
    alone, where the detector dead-letters it."""
    body = document.get("body") if isinstance(document, dict) else None
    if count == 1 or not isinstance(body, dict):
        return (0,)
    return _buckets(document.get("kind"), body, count)


def _buckets(kind: Any, body: dict[str, Any], count: int) -> tuple[int, ...]:
    if kind == "metadata":
        data = body.get("data")
        if body.get("type") in PARTITION_RECORDS and isinstance(data, dict):
            # _of of the one index, without its set (338 ns against 861 ns a record,
            # timeit): nearly every record of a large cluster's snapshot is one of
            # these, routed at the source and again for its home when released
            # after being held.
            index = data.get("partitionId")
            return (index % count,) if isinstance(index, int) and not isinstance(index, bool) else (0,)
        return tuple(range(count))
    if kind == "clock_evidence":
        return tuple(range(count))  # every bucket takes what the others measured (detectors.clock_exchange)
    if kind == "remote_log_metadata":
        # A segment's record names its partition in its segment id; a partition's deletion, directly.
        segment = _dig(body, "data", "remoteLogSegmentId", "topicIdPartition")
        deleted = _dig(body, "data", "topicIdPartition")
        return _of((segment.get("partition"), deleted.get("partition")), count)
    if kind != "request":
        return (0,)
    api_key = _dig(body, "requestHeader").get("requestApiKey")
    if type(api_key) is not int:  # not 5.0 or true: the parse rejects those, and so does the SQL
        return (0,)
    if api_key in FANNED_OUT_APIS:
        return tuple(range(count))
    path = PARTITION_PATHS.get(api_key)
    if path is None or (api_key == FETCH and is_quorum_fetch(body)):
        return (0,)
    topics_key, parts_key, index_key = path
    return _of(
        (
            part.get(index_key)
            for topic in _objects(_dig(body, "request").get(topics_key))
            for part in _objects(topic.get(parts_key))
        ),
        count,
    )


def _of(indexes: Iterable[Any], count: int) -> tuple[int, ...]:
    # Malformed indexes route nowhere; a record with none goes to bucket 0, whose
    # parse turns it into a dead letter.
    found = {i % count for i in indexes if isinstance(i, int) and not isinstance(i, bool)}
    return tuple(sorted(found)) or (0,)


def _dig(obj: Any, *keys: str) -> dict[str, Any]:
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj if isinstance(obj, dict) else {}


def _objects(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
