"""After a lab run: the cluster's own files judged offline, and the view
checked against what Kafka itself says.

- :func:`convert_native` reads every node's request log, one controller's
  ``__cluster_metadata-0``, every controller's ``quorum-state`` and the
  cluster's ``__remote_log_metadata`` topic with the parsers ``fencewatch
  convert`` and ``ship`` use, writes the envelope JSONL files
  ``fencewatch replay`` takes, and keeps each request log's account: its
  entries by API, those no rule reads, and its dead letters.
- :func:`judge` runs the detector over those files as ``fencewatch replay``
  does (merged by time; the caller gives the settings, the command's defaults
  from ``fencewatch.replay.replay_config``).
- :func:`kafka_leader_epochs` asks every broker's Metadata API (v7+ carries
  each partition's leader epoch; Admin's describeTopics does not) and
  :func:`compare_epochs` sets it against the view's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detectors.clocks import ClockInterval
from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import DeadLetter, Envelope, dumps
from detectors.merge import merge_sources
from detectors.parse_native import parse_input
from detectors.parse_quorum_state import QuorumStateStats
from detectors.parse_remote_log_metadata import RemoteLogMetadataStats
from detectors.parse_request_log import RequestLogStats
from detectors.sources import EnvelopeLineStats, read_envelopes
from localkafka.cluster import LocalKafkaCluster
from producers.metadata_log import MetadataLogStats, iter_metadata_log_file
from producers.remote_log_metadata_records import TopicRecord, iter_topic_records
from producers.remote_log_metadata_topic import TopicReader, TopicUnavailable

MAX_RECORD_BYTES = 16 * 1024 * 1024


@dataclass
class Converted:
    """The envelope files of a run, and what became of every input."""

    files: list[Path] = field(default_factory=list)
    request_logs: dict[int, RequestLogStats] = field(default_factory=dict)
    metadata: MetadataLogStats = field(default_factory=MetadataLogStats)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)


def convert_native(
    cluster: LocalKafkaCluster, out_dir: Path, cluster_name: str, shipped_bytes: dict[int, int] | None = None
) -> Converted:
    """Every file the lab ships, converted to envelope JSONL under ``out_dir``;
    each node's request log up to ``shipped_bytes`` of it where given (what its
    shipper shipped: Kafka goes on logging after the shippers stop)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    done = Converted()
    for node in cluster.layout.nodes:
        stats = RequestLogStats()
        target = out_dir / f"request-log-{node.node_id}.jsonl"
        source = node.request_log
        if shipped_bytes is not None and node.node_id in shipped_bytes:
            source = out_dir / f"kafka-request-{node.node_id}.log"
            with open(node.request_log, "rb") as whole, open(source, "wb") as part:
                _copy_bytes(whole, part, shipped_bytes[node.node_id])
        with open(source, "rb") as stream:
            items = parse_input(
                stream,
                stats,
                source=str(node.request_log),
                cluster=cluster_name,
                node=node.node_id,
                max_record_bytes=MAX_RECORD_BYTES,
            )
            _write(items, target, done)
        done.request_logs[node.node_id] = stats
    first = cluster.controllers[0]
    # From the log's start: the bootstrap snapshot and every segment (the lab's
    # metadata log keeps them all: retention is days).
    files = sorted(first.metadata_dir.glob("00000000000000000000-0000000000.checkpoint")) + sorted(
        first.metadata_dir.glob("*.log")
    )
    target = out_dir / f"metadata-log-{first.node_id}.jsonl"
    items_of_all = (
        item
        for name in files
        for item in iter_metadata_log_file(
            str(name),
            cluster=cluster_name,
            node=first.node_id,
            stats=done.metadata,
            max_batch_bytes=MAX_RECORD_BYTES,
        )
    )
    _write(items_of_all, target, done)
    for controller in cluster.controllers:
        target = out_dir / f"quorum-state-{controller.node_id}.jsonl"
        with open(controller.quorum_state, "rb") as stream:
            items = parse_input(
                stream,
                QuorumStateStats(),
                source=str(controller.quorum_state),
                cluster=cluster_name,
                node=controller.node_id,
                max_record_bytes=MAX_RECORD_BYTES,
            )
            _write(items, target, done)
    if cluster.layout.tiered_storage:
        _write(_remote_log_metadata(cluster, cluster_name), out_dir / "remote-log-metadata.jsonl", done)
    return done


def _remote_log_metadata(cluster: LocalKafkaCluster, cluster_name: str) -> Iterator[Envelope | DeadLetter]:
    """``__remote_log_metadata`` read to its current end, as ``ship
    remote-log-metadata --from-topic --once`` reads it."""
    reader = TopicReader(
        {"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0}, start=None, once=True
    )
    records = (item for item in reader.items() if isinstance(item, TopicRecord))
    try:
        yield from iter_topic_records(records, cluster=cluster_name, stats=RemoteLogMetadataStats())
    except TopicUnavailable:
        return  # no tiered topic made yet: nothing to read


def _copy_bytes(src: Any, dst: Any, count: int, chunk: int = 1 << 20) -> None:
    while count > 0:
        data = src.read(min(chunk, count))
        if not data:
            return
        dst.write(data)
        count -= len(data)


def _write(items: Any, target: Path, done: Converted) -> None:
    with open(target, "w") as out:
        for item in items:
            if isinstance(item, Envelope):
                out.write(dumps(item.to_dict()) + "\n")
            elif isinstance(item, DeadLetter):
                done.dead_letters.append(item.to_dict())
    done.files.append(target)


@dataclass
class Judged:
    detector: Detector
    alerts: list[dict[str, Any]]
    dead_letters: list[dict[str, Any]]


def judge(files: list[Path], config: DetectorConfig) -> Judged:
    """Every envelope of ``files``, merged by time and judged, as ``fencewatch replay`` does."""
    detector = Detector(config)
    alerts: list[dict[str, Any]] = []
    dead: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        streams = [
            read_envelopes(
                stack.enter_context(open(path, "rb")), str(path), None, MAX_RECORD_BYTES, EnvelopeLineStats()
            )
            for path in files
        ]
        for item in merge_sources(streams, config.lateness_ms, config.clock_limit_ms):
            if isinstance(item, DeadLetter):
                detector.dead_letter(item)
                dead.append(item.to_dict())
                continue
            dead.extend(letter.to_dict() for letter in detector.ingest(item))
            alerts.extend(alert.to_dict() for alert in detector.drain())
        dead.extend(letter.to_dict() for letter in detector.flush())
        alerts.extend(alert.to_dict() for alert in detector.drain())
    return Judged(detector, alerts, dead)


def measured_clocks(detector: Detector, cluster_name: str) -> dict[int, ClockInterval]:
    """Each node's clock offset to the metadata log's, as replay prints it."""
    state = detector.clusters.get(cluster_name)
    if state is None:
        return {}
    return state.clocks.measured_nodes(state.metadata_clock.shift_ms)


PartitionEpochs = dict[tuple[str, int], tuple[int, int]]  # (topic, partition) -> (leader, leader epoch)


def view_leader_epochs(detector: Detector, cluster_name: str) -> PartitionEpochs:
    """The leader and leader epoch the view derived for every partition of every
    topic not deleted."""
    state = detector.clusters.get(cluster_name)
    if state is None:
        return {}
    view = state.view
    out: PartitionEpochs = {}
    for key, topic in view.topics.items():
        if topic.deleted_ms is not None:
            continue
        for index in range(topic.partition_count):
            history = view.partition((key, index))
            if history is not None:
                out[(topic.name, index)] = (history.latest.leader, history.latest.leader_epoch)
    return out


def kafka_leader_epochs(
    cluster: LocalKafkaCluster, timeout_seconds: float = 120.0
) -> dict[int, PartitionEpochs]:
    """The leader and leader epoch of every partition in each running broker's
    Metadata answer (v7+ carries the epoch; Admin's describeTopics does not),
    asked again until every broker gives the same or the time is up. A broker
    answers from its own metadata cache, which can trail the controller's log
    for seconds (a real broker here reported one metadata offset for 19 s while
    the controllers moved on), so each broker's answer is kept apart."""
    import time

    from kafka import KafkaAdminClient
    from kafka.protocol.metadata import MetadataRequest

    async def metadata_of(admin: Any, node_id: int) -> Any:
        request = MetadataRequest(topics=None, allow_auto_topic_creation=False)
        return (await admin._manager.send(request, node_id=node_id)).to_dict()

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers, request_timeout_ms=30_000)
    deadline = time.monotonic() + timeout_seconds
    try:
        while True:
            running = [b.node_id for b in cluster.brokers if cluster.is_running(b.node_id)]
            answers = {
                node_id: _epochs(admin._manager.run(metadata_of, admin, node_id)) for node_id in running
            }
            first = next(iter(answers.values()), {})
            if all(answer == first for answer in answers.values()) or time.monotonic() > deadline:
                return answers
            time.sleep(2)
    finally:
        admin.close()


def _epochs(metadata: dict[str, Any]) -> PartitionEpochs:
    out: PartitionEpochs = {}
    for topic in metadata["topics"]:
        for part in topic["partitions"]:
            key = (topic["name"], int(part["partition_index"]))
            out[key] = (int(part["leader_id"]), int(part["leader_epoch"]))
    return out


@dataclass
class EpochComparison:
    compared: int
    # (topic, partition, the view's (leader, epoch) or None, Kafka's or None, the broker that said so)
    differences: list[tuple[str, int, tuple[int, int] | None, tuple[int, int] | None, int]]


def compare_epochs(view: PartitionEpochs, kafka: dict[int, PartitionEpochs]) -> EpochComparison:
    """The view's leader and epoch of each partition against each broker's answer."""
    partitions = set(view).union(*kafka.values()) if kafka else set(view)
    differences = [
        (topic, partition, view.get((topic, partition)), answer.get((topic, partition)), broker)
        for broker, answer in sorted(kafka.items())
        for topic, partition in sorted(partitions)
        if view.get((topic, partition)) != answer.get((topic, partition))
    ]
    return EpochComparison(len(partitions), differences)
