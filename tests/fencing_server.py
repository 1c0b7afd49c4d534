"""A small Kafka protocol server that fences as KIP-320 says, for testing
``fencewatch probe`` against a broker that answers like Apache Kafka.

Built on kafka-python's own message classes: it decodes each request's header and
body with ``<Request>[version].decode(..., header=True)`` and encodes responses
with ``<Response>[version](...).encode(header=True, framed=True)``. It speaks
ApiVersions, Metadata, Fetch, ListOffsets and OffsetForLeaderEpoch; any other API
(or one it was told not to advertise) closes the connection, as tansu does.

Several brokers (one listening socket each, a node id each) share one
:class:`FencingCluster`. A partition's answer follows Kafka's order
(``ReplicaManager.getPartitionOrError``, then ``Partition.getLocalLog``'s
``checkCurrentLeaderEpoch``, then leadership): UNKNOWN_TOPIC_OR_PARTITION for a
partition the topic lacks; FENCED_LEADER_EPOCH (74) for an older epoch,
UNKNOWN_LEADER_EPOCH (75) for a newer one; NOT_LEADER_OR_FOLLOWER (6) from a
broker that is not the leader, except a consumer Fetch v11+ at a replica (KIP-392);
else NONE. ``misbehave(api, case, answer)`` replaces the answer for one API and
case (current, future, past, follower, unknown); ``before_answer`` runs before each
request is answered (an election between two questions). Every request is logged
with its arrival time.
"""

from __future__ import annotations

import socket
import socketserver
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse

NONE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER = 0, 3, 6
FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH = 74, 75
FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH = "Fetch", "ListOffsets", "OffsetForLeaderEpoch"
API_NAMES = {1: FETCH, 2: LIST_OFFSETS, 3: "Metadata", 18: "ApiVersions", 23: OFFSET_FOR_LEADER_EPOCH}
REQUESTS: dict[int, Any] = {
    1: FetchRequest,
    2: ListOffsetsRequest,
    3: MetadataRequest,
    18: ApiVersionsRequest,
    23: OffsetForLeaderEpochRequest,
}
# What the server advertises, as Kafka 3.9 does for these APIs.
ADVERTISED = {1: (4, 17), 2: (1, 9), 3: (0, 12), 18: (0, 3), 23: (2, 4)}
CLUSTER_ID = "fencing-test-cluster"


@dataclass
class Partition:
    leader: int
    epoch: int
    replicas: list[int]


@dataclass
class Topic:
    topic_id: uuid.UUID
    partitions: list[Partition]


@dataclass(frozen=True)
class Logged:
    """A request the server received: when (monotonic seconds), at which broker, what."""

    at: float
    node: int
    api: str
    version: int


@dataclass
class FencingCluster:
    """The state the brokers answer from; every change holds ``lock``."""

    topics: dict[str, Topic] = field(default_factory=dict)
    faults: dict[tuple[str, str], int] = field(default_factory=dict)
    unadvertised: set[int] = field(default_factory=set)
    log: list[Logged] = field(default_factory=list)
    before_answer: Callable[[int, str, int], None] | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)

    def create_topic(self, name: str, partitions: int, brokers: list[int], replicas: int, epoch: int) -> None:
        """Partition p led by ``brokers[p % n]`` at ``epoch``, replicated on the next ones."""
        with self.lock:
            n = len(brokers)
            self.topics[name] = Topic(
                uuid.uuid4(),
                [
                    Partition(brokers[p % n], epoch, [brokers[(p + r) % n] for r in range(replicas)])
                    for p in range(partitions)
                ],
            )

    def elect(self, new_leader: bool = False) -> None:
        """An election on every partition: epoch + 1, and the next replica leads if ``new_leader``."""
        with self.lock:
            for topic in self.topics.values():
                for p in topic.partitions:
                    p.epoch += 1
                    if new_leader:
                        p.leader = p.replicas[(p.replicas.index(p.leader) + 1) % len(p.replicas)]

    def misbehave(self, api: str, case: str, answer: int) -> None:
        """Answer ``answer`` where Kafka would answer otherwise, for ``api`` and ``case``."""
        with self.lock:
            self.faults[(api, case)] = answer

    def answer(self, node: int, api: str, version: int, topic: str, index: int, epoch: int) -> int:
        """The error code for one partition of a read at broker ``node``."""
        with self.lock:
            found = self.topics.get(topic)
            if found is None or not 0 <= index < len(found.partitions):
                case, code = "unknown", UNKNOWN_TOPIC_OR_PARTITION
            else:
                p = found.partitions[index]
                if epoch >= 0 and p.epoch > epoch:
                    case, code = "past", FENCED_LEADER_EPOCH
                elif epoch >= 0 and p.epoch < epoch:
                    case, code = "future", UNKNOWN_LEADER_EPOCH
                elif node == p.leader:
                    case, code = "current", NONE
                elif api == FETCH and version >= 11 and node in p.replicas:
                    case, code = "follower", NONE
                else:
                    case, code = "follower", NOT_LEADER_OR_FOLLOWER
            return self.faults.get((api, case), code)

    def topic_named(self, topic_id: uuid.UUID) -> str:
        with self.lock:
            return next((name for name, t in self.topics.items() if t.topic_id == topic_id), "")


class _Handler(socketserver.BaseRequestHandler):
    server: _BrokerServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        while True:
            head = _read(sock, 4)
            if head is None:
                return
            payload = _read(sock, struct.unpack(">i", head)[0])
            if payload is None:
                return
            api_key, version = struct.unpack(">hh", payload[:4])
            cluster = self.server.cluster
            with cluster.lock:
                cluster.log.append(
                    Logged(time.monotonic(), self.server.node, API_NAMES.get(api_key, str(api_key)), version)
                )
                hook = cluster.before_answer
            if api_key not in REQUESTS or api_key in cluster.unadvertised:
                return  # closes the connection, as tansu does for an API it lacks
            request = REQUESTS[api_key][version].decode(payload, header=True)
            if hook is not None:
                hook(self.server.node, API_NAMES[api_key], version)
            response = self.server.respond(api_key, version, request)
            response.with_header(correlation_id=request.header.correlation_id)
            sock.sendall(response.encode(header=True, framed=True))


def _read(sock: socket.socket, n: int) -> bytes | None:
    chunks = b""
    while len(chunks) < n:
        try:
            chunk = sock.recv(n - len(chunks))
        except OSError:
            return None
        if not chunk:
            return None
        chunks += chunk
    return chunks


class _BrokerServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, node: int, cluster: FencingCluster, all_ports: dict[int, int]):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.node = node
        self.cluster = cluster
        self.all_ports = all_ports

    def respond(self, api_key: int, version: int, request: Any) -> Any:
        if api_key == 18:
            return ApiVersionsResponse[version](
                error_code=0,
                api_keys=[
                    ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
                    for k, (lo, hi) in sorted(ADVERTISED.items())
                    if k not in self.cluster.unadvertised
                ],
                throttle_time_ms=0,
            )
        if api_key == 3:
            return self._metadata(version, request)
        if api_key == 1:
            return FetchResponse[version](
                throttle_time_ms=0,
                error_code=0,
                session_id=0,
                responses=[
                    FetchResponse.FetchableTopicResponse(
                        topic=t.topic,
                        topic_id=t.topic_id,
                        partitions=[
                            FetchResponse.FetchableTopicResponse.PartitionData(
                                partition_index=p.partition,
                                error_code=self._answer(
                                    FETCH,
                                    version,
                                    t.topic or self.cluster.topic_named(t.topic_id),
                                    p.partition,
                                    p.current_leader_epoch,
                                ),
                                high_watermark=0,
                                last_stable_offset=0,
                                log_start_offset=0,
                                aborted_transactions=[],
                                preferred_read_replica=-1,
                                records=b"",
                            )
                            for p in t.partitions
                        ],
                    )
                    for t in request.topics
                ],
                node_endpoints=[],
            )
        if api_key == 2:
            return ListOffsetsResponse[version](
                throttle_time_ms=0,
                topics=[
                    ListOffsetsResponse.ListOffsetsTopicResponse(
                        name=t.name,
                        partitions=[
                            ListOffsetsResponse.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                                partition_index=p.partition_index,
                                error_code=self._answer(
                                    LIST_OFFSETS, version, t.name, p.partition_index, p.current_leader_epoch
                                ),
                                timestamp=-1,
                                offset=0,
                                leader_epoch=-1,
                            )
                            for p in t.partitions
                        ],
                    )
                    for t in request.topics
                ],
            )
        return OffsetForLeaderEpochResponse[version](
            throttle_time_ms=0,
            topics=[
                OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult(
                    topic=t.topic,
                    partitions=[
                        OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult.EpochEndOffset(
                            error_code=self._answer(
                                OFFSET_FOR_LEADER_EPOCH, version, t.topic, p.partition, p.current_leader_epoch
                            ),
                            partition=p.partition,
                            leader_epoch=-1,
                            end_offset=-1,
                        )
                        for p in t.partitions
                    ],
                )
                for t in request.topics
            ],
        )

    def _answer(self, api: str, version: int, topic: str, index: int, epoch: int) -> int:
        return self.cluster.answer(self.node, api, version, topic, index, epoch)

    def _metadata(self, version: int, request: Any) -> Any:
        with self.cluster.lock:
            wanted = None if request.topics is None else [t.name for t in request.topics]
            names = sorted(self.cluster.topics) if wanted is None else wanted
            topics = []
            for name in names:
                topic = self.cluster.topics.get(name)
                if topic is None:
                    topics.append(
                        MetadataResponse.MetadataResponseTopic(
                            error_code=UNKNOWN_TOPIC_OR_PARTITION,
                            name=name,
                            topic_id=uuid.UUID(int=0),
                            is_internal=False,
                            partitions=[],
                        )
                    )
                    continue
                topics.append(
                    MetadataResponse.MetadataResponseTopic(
                        error_code=0,
                        name=name,
                        topic_id=topic.topic_id,
                        is_internal=False,
                        partitions=[
                            MetadataResponse.MetadataResponseTopic.MetadataResponsePartition(
                                error_code=0,
                                partition_index=i,
                                leader_id=p.leader,
                                leader_epoch=p.epoch,
                                replica_nodes=list(p.replicas),
                                isr_nodes=list(p.replicas),
                                offline_replicas=[],
                            )
                            for i, p in enumerate(topic.partitions)
                        ],
                    )
                )
        return MetadataResponse[version](
            throttle_time_ms=0,
            brokers=[
                MetadataResponse.MetadataResponseBroker(node_id=n, host="127.0.0.1", port=port, rack=None)
                for n, port in sorted(self.all_ports.items())
            ],
            cluster_id=CLUSTER_ID,
            controller_id=min(self.all_ports),
            topics=topics,
        )


class FencingServer:
    """Brokers ``nodes`` of one :class:`FencingCluster`, each on a free port of
    127.0.0.1; a context manager."""

    def __init__(self, nodes: tuple[int, ...] = (1, 2, 3)):
        self.cluster = FencingCluster()
        self._ports: dict[int, int] = {}
        self._servers = [_BrokerServer(n, self.cluster, self._ports) for n in nodes]
        for n, server in zip(nodes, self._servers, strict=True):
            self._ports[n] = server.server_address[1]
        self._threads: list[threading.Thread] = []

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self._ports.values())

    def __enter__(self) -> FencingServer:
        for server in self._servers:
            thread = threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def requests(self, api: str | None = None) -> list[Logged]:
        with self.cluster.lock:
            return [r for r in self.cluster.log if api is None or r.api == api]
