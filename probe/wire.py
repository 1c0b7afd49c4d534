"""The Kafka messages ``fencewatch probe`` sends and reads, built from kafka-python's
own protocol classes (generated from Apache Kafka's JSON schemas): Metadata in,
Fetch / ListOffsets / OffsetForLeaderEpoch out, each carrying a ``currentLeaderEpoch``
per partition, and their per-partition error codes back."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import kafka.errors
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest, OffsetForLeaderEpochRequest
from kafka.protocol.metadata import MetadataRequest

from detectors.errors import error_name

FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH = "Fetch", "ListOffsets", "OffsetForLeaderEpoch"
APIS = (FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH)
REQUESTS: dict[str, Any] = {
    FETCH: FetchRequest,
    LIST_OFFSETS: ListOffsetsRequest,
    OFFSET_FOR_LEADER_EPOCH: OffsetForLeaderEpochRequest,
}
# The first version of each request with a per-partition currentLeaderEpoch (KIP-320).
EPOCH_SINCE = {FETCH: 9, LIST_OFFSETS: 4, OFFSET_FOR_LEADER_EPOCH: 2}
METADATA_EPOCH_SINCE = 7  # MetadataResponse partitions carry leader_epoch from v7
CONSUMER_REPLICA_ID = -1
LATEST_TIMESTAMP = -1
# The broker may hold a Fetch this long for data; a short positive wait, because
# some brokers (tansu) answer a zero wait with no partitions at all.
FETCH_MAX_WAIT_MS = 10


def answer_name(code: int) -> str:
    """Kafka's name of an error code (NOT_LEADER_OR_FOLLOWER, not the pre-2.6 name);
    kafka-python's for a code the rules do not name."""
    name = error_name(code)
    return name if name != str(code) else str(getattr(kafka.errors.for_code(code), "message", code))


def topic_id_text(topic_id: uuid.UUID | None) -> str | None:
    """A topic id as Kafka prints it (URL-safe base64, no padding); None for the zero id."""
    if topic_id is None or topic_id.int == 0:
        return None
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode()


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    topic_uuid: uuid.UUID | None
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]

    @property
    def topic_id(self) -> str | None:
        return topic_id_text(self.topic_uuid)


@dataclass(frozen=True)
class ClusterView:
    """What one Metadata response said: the cluster id, brokers, partitions (those with
    a leader and no error) and each topic's partition count (topics Metadata answered
    with an error, TOPIC_AUTHORIZATION_FAILED among them, are left out)."""

    cluster_id: str | None
    brokers: Mapping[int, tuple[str, int]]
    partitions: Mapping[tuple[str, int], PartitionInfo]
    partition_counts: Mapping[str, int]
    internal_topics: frozenset[str]


def metadata_request(version: int, topics: Iterable[str] | None) -> Any:
    """Metadata for ``topics`` (None: every topic), never creating one."""
    listed = (
        None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in sorted(topics)]
    )
    return MetadataRequest[version](
        topics=listed,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


def cluster_view(response: Any) -> ClusterView:
    partitions: dict[tuple[str, int], PartitionInfo] = {}
    counts: dict[str, int] = {}
    internal: set[str] = set()
    for topic in response.topics:
        if topic.error_code != 0:
            continue
        counts[topic.name] = len(topic.partitions)
        if topic.is_internal:
            internal.add(topic.name)
        topic_uuid = getattr(topic, "topic_id", None)
        for p in topic.partitions:
            if p.error_code == 0 and p.leader_id >= 0:
                partitions[(topic.name, p.partition_index)] = PartitionInfo(
                    topic.name,
                    topic_uuid,
                    p.partition_index,
                    p.leader_id,
                    p.leader_epoch,
                    tuple(p.replica_nodes),
                )
    return ClusterView(
        cluster_id=response.cluster_id,
        brokers={b.node_id: (b.host, b.port) for b in response.brokers},
        partitions=partitions,
        partition_counts=counts,
        internal_topics=frozenset(internal),
    )


def choose_version(api: str, advertised: Mapping[int, tuple[int, int]]) -> int | str:
    """The highest version of ``api`` both sides speak that carries currentLeaderEpoch,
    or why there is none (the broker's ApiVersions ``advertised``: key -> (min, max))."""
    request = REQUESTS[api]
    span = advertised.get(request.API_KEY)
    if span is None:
        return "not advertised"
    version = min(span[1], request.max_version)
    if version < EPOCH_SINCE[api] or version < span[0]:
        return f"v{span[0]}-v{span[1]} advertised, none with currentLeaderEpoch (v{EPOCH_SINCE[api]}+)"
    return version


@dataclass(frozen=True, slots=True)
class Item:
    """One partition of a probe request: which partition and the epoch it carries."""

    topic: str
    topic_uuid: uuid.UUID | None
    partition: int
    epoch: int


def build_request(api: str, version: int, items: Iterable[Item]) -> Any:
    """One request of ``api`` at ``version`` asking about every item."""
    by_topic: dict[str, list[Item]] = {}
    for item in items:
        by_topic.setdefault(item.topic, []).append(item)
    if api == FETCH:
        return FetchRequest[version](
            replica_id=CONSUMER_REPLICA_ID,
            max_wait_ms=FETCH_MAX_WAIT_MS,
            min_bytes=0,
            max_bytes=1,
            isolation_level=0,
            # A full fetch that opens no session on the broker (FINAL_EPOCH).
            session_id=0,
            session_epoch=-1,
            topics=[
                FetchRequest.FetchTopic(
                    topic=topic,
                    topic_id=ps[0].topic_uuid or uuid.UUID(int=0),
                    partitions=[
                        FetchRequest.FetchTopic.FetchPartition(
                            partition=i.partition,
                            current_leader_epoch=i.epoch,
                            fetch_offset=0,
                            last_fetched_epoch=-1,
                            log_start_offset=-1,
                            partition_max_bytes=1,
                        )
                        for i in ps
                    ],
                )
                for topic, ps in by_topic.items()
            ],
            forgotten_topics_data=[],
            rack_id="",
        )
    if api == LIST_OFFSETS:
        return ListOffsetsRequest[version](
            replica_id=CONSUMER_REPLICA_ID,
            isolation_level=0,
            topics=[
                ListOffsetsRequest.ListOffsetsTopic(
                    name=topic,
                    partitions=[
                        ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                            partition_index=i.partition,
                            current_leader_epoch=i.epoch,
                            timestamp=LATEST_TIMESTAMP,
                        )
                        for i in ps
                    ],
                )
                for topic, ps in by_topic.items()
            ],
            timeout_ms=1000,
        )
    return OffsetForLeaderEpochRequest[version](
        replica_id=CONSUMER_REPLICA_ID,
        topics=[
            OffsetForLeaderEpochRequest.OffsetForLeaderTopic(
                topic=topic,
                partitions=[
                    OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
                        partition=i.partition, current_leader_epoch=i.epoch, leader_epoch=max(i.epoch, 0)
                    )
                    for i in ps
                ],
            )
            for topic, ps in by_topic.items()
        ],
    )


def answers(api: str, response: Any, names_by_id: Mapping[uuid.UUID, str]) -> dict[tuple[str, int], int]:
    """(topic, partition) -> error code, for every partition the response answers.
    Fetch v13+ names topics by id: ``names_by_id`` maps them back."""
    out: dict[tuple[str, int], int] = {}
    if api == FETCH:
        for topic in response.responses:
            name = getattr(topic, "topic", None) or names_by_id.get(topic.topic_id, "")
            for p in topic.partitions:
                out[(name, p.partition_index)] = p.error_code
    elif api == LIST_OFFSETS:
        for topic in response.topics:
            for p in topic.partitions:
                out[(topic.name, p.partition_index)] = p.error_code
    else:
        for topic in response.topics:
            for p in topic.partitions:
                out[(topic.topic, p.partition)] = p.error_code
    return out
