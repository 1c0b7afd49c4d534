"""A view that starts in the middle of the metadata log (issue 24, item 3).

A real cluster deletes the metadata log's old segments once a snapshot covers
them, so a view starts from the newest ``.checkpoint`` and the segments after
it. A simulated history is cut at the middle of its metadata log: its first
half is folded into a snapshot as Kafka's controller writes one (one
RegisterBrokerRecord per broker, TopicRecord, PartitionRecord with the epochs
reached, FeatureLevelRecord; ``SnapshotGenerator`` / ``MetadataImage.write``),
written as ``.checkpoint`` bytes and read back from the text
``kafka-dump-log.sh`` prints for it. With the snapshot, the later half gives the
full history's alerts (after a warm-up of twice the grace window); without it,
the view counts what it cannot know as unverified and raises nothing the full
history does not.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import orjson
import pytest

import detectors.rules  # noqa: F401  (registers every rule)
from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import Envelope, envelope_from_obj
from detectors.parse_metadata_dump import iter_metadata_dump
from detectors.stats import UnverifiedReason
from detectors.view import ClusterView
from producers import shapes as s
from producers.simulator import SimConfig, Simulator

CONFIG = DetectorConfig()
WARMUP_MS = 2 * CONFIG.grace_ms
EVENTS = 100_000  # about 50 s of simulated time: brokers restart in the later half


@functools.cache
def _history(seed: int, fault_rate: float) -> list[Envelope]:
    sim = Simulator(SimConfig(seed=seed, fault_rate=fault_rate, warmup_ms=3_000))
    return [envelope_from_obj(raw, f"sim:{i}", i) for i, raw in enumerate(sim.events(EVENTS))]


def _cut(events: Sequence[Envelope]) -> tuple[list[Envelope], int, int]:
    """The metadata records before the middle of the log, the middle's offset
    and its time."""
    metadata = sorted((e for e in events if e.kind == "metadata"), key=lambda e: e.offset or 0)
    middle = metadata[len(metadata) // 2]
    assert middle.offset is not None
    return metadata[: len(metadata) // 2], middle.offset, middle.ts_ms


def _snapshot_bodies(folded: Sequence[Envelope]) -> list[dict[str, Any]]:
    """The records of a snapshot at the end of ``folded``: each broker's last
    registration with the epoch and flags its later change records gave, each
    live topic, each partition as the log left it, the feature levels."""
    view = ClusterView(retention_ms=10**12)
    registrations: dict[int, dict[str, Any]] = {}
    topics: dict[str, dict[str, Any]] = {}
    partitions: dict[tuple[str, int], dict[str, Any]] = {}
    features: dict[str, dict[str, Any]] = {}
    for env in folded:
        view.apply(env)
        data, kind = env.body["data"], env.body["type"]
        if kind == "REGISTER_BROKER_RECORD":
            registrations[data["brokerId"]] = env.body
        elif kind == "TOPIC_RECORD":
            topics[data["topicId"]] = env.body
        elif kind == "PARTITION_RECORD":
            partitions[(data["topicId"], data["partitionId"])] = env.body
        elif kind == "FEATURE_LEVEL_RECORD":
            features[data["name"]] = env.body
    bodies = list(features.values())
    for broker_id, body in sorted(registrations.items()):
        state = view.brokers[broker_id].latest
        if not state.registered:
            continue
        data = {**body["data"], "brokerEpoch": state.epoch, "fenced": state.fenced}
        if "inControlledShutdown" in data or state.shutting_down:
            data["inControlledShutdown"] = state.shutting_down
        bodies.append({**body, "data": data})
    for topic_id, body in topics.items():
        if topic_id in view.topics:
            bodies.append(body)
    for key, body in partitions.items():
        history = view.partitions.get(key)
        if history is None or key[0] not in view.topics:
            continue
        now = history.latest
        data = {
            **body["data"],
            "leader": now.leader,
            "leaderEpoch": now.leader_epoch,
            "partitionEpoch": now.partition_epoch,
            "isr": list(now.isr),
            "replicas": list(now.replicas),
        }
        if "eligibleLeaderReplicas" in data or now.elr:
            data["eligibleLeaderReplicas"] = list(now.elr)
        bodies.append({**body, "data": data})
    return bodies


def _dump_lines(name: str, end_offset: int, ts_ms: int, bodies: Sequence[dict[str, Any]]) -> list[str]:
    """What ``kafka-dump-log.sh --cluster-metadata-decoder`` (Kafka 4.1,
    DumpLogSegments) prints for a snapshot of ``bodies``: the SnapshotHeader's
    control batch, one batch of records numbered from 1, the SnapshotFooter's.
    (The simulator's topic ids are not UUIDs, so the bytes themselves cannot be
    written; tests/metadata_log_files.py checks the bytes against this text.)"""
    head = (
        "baseOffset: {base} lastOffset: {last} count: {count} baseSequence: -1 lastSequence: -1 "
        "producerId: -1 producerEpoch: -1 partitionLeaderEpoch: 1 isTransactional: false "
        "isControl: {control} deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: {ts} "
        "size: 91 magic: 2 compresscodec: none crc: 1234 isvalid: true"
    )
    line = "| offset: {offset} CreateTime: {ts} keySize: -1 valueSize: 23 sequence: -1 headerKeys: []"
    header = orjson.dumps({"version": 0, "lastContainedLogTimestamp": ts_ms}).decode()
    last = len(bodies)
    lines = [
        f"Dumping /k/__cluster_metadata-0/{name}",
        f"Snapshot end offset: {end_offset}, epoch: 1",
        head.format(base=0, last=0, count=1, control="true", ts=ts_ms),
        line.format(offset=0, ts=ts_ms) + " SnapshotHeader " + header,
        head.format(base=1, last=last, count=last, control="false", ts=ts_ms),
    ]
    lines += [
        line.format(offset=i, ts=ts_ms) + " payload: " + orjson.dumps(body).decode()
        for i, body in enumerate(bodies, start=1)
    ]
    lines += [
        head.format(base=last + 1, last=last + 1, count=1, control="true", ts=ts_ms),
        line.format(offset=last + 1, ts=ts_ms) + ' SnapshotFooter {"version":0}',
    ]
    return lines


def snapshot_envelopes(folded: Sequence[Envelope], end_offset: int, cluster: str) -> list[Envelope]:
    """``folded`` as a ``.checkpoint`` at ``end_offset``, read back from its dump."""
    name = f"{end_offset:020d}-0000000001.checkpoint"
    lines = _dump_lines(name, end_offset, max(e.ts_ms for e in folded), _snapshot_bodies(folded))
    parsed = list(iter_metadata_dump(lines, source=name, cluster=cluster))
    assert all(isinstance(p, Envelope) for p in parsed)
    return [p for p in parsed if isinstance(p, Envelope)]


def later(events: Iterable[Envelope], offset: int, ts_ms: int) -> list[Envelope]:
    """The metadata log from ``offset`` on, the request logs and quorum states
    from ``ts_ms`` on. ``__remote_log_metadata`` is another log, which Kafka's
    TopicBasedRemoteLogMetadataManager reads from its beginning: kept whole."""

    def kept(env: Envelope) -> bool:
        if env.kind == "metadata":
            return env.offset is not None and env.offset >= offset
        return env.kind == "remote_log_metadata" or env.ts_ms >= ts_ms

    return [e for e in events if kept(e)]


def detect(arrival: Iterable[Envelope]) -> Detector:
    detector = Detector(CONFIG, now_ms=lambda: 0)
    for env in arrival:
        assert detector.ingest(env) == []
    assert detector.flush() == []
    return detector


def after(detector: Detector, ts_ms: int) -> set[tuple[str, str]]:
    return {(a.rule, a.alert_id) for a in detector.drain() if a.ts_ms >= ts_ms}


def moments(detector: Detector, ts_ms: int) -> set[tuple[str, int | None, int]]:
    """Each alert as its rule, node and time: a view that lacks a topic's record
    names its partitions by the request's own fields, so the same violation has
    another alert id than in the full history."""
    return {(a.rule, a.node, a.ts_ms) for a in detector.drain() if a.ts_ms >= ts_ms}


@pytest.mark.parametrize("seed", [1])
def test_a_snapshot_at_the_middle_gives_the_full_historys_alerts(seed):
    events = _history(seed, fault_rate=0.002)
    folded, offset, ts_ms = _cut(events)
    full = after(detect(events), ts_ms + WARMUP_MS)
    snapshot = snapshot_envelopes(folded, offset, events[0].cluster)
    resumed = after(detect(snapshot + later(events, offset, ts_ms)), ts_ms + WARMUP_MS)
    assert full and resumed == full


@pytest.mark.parametrize("seed", [1])
def test_without_a_snapshot_nothing_is_raised_that_the_full_history_does_not(seed):
    events = _history(seed, fault_rate=0.002)
    _, offset, ts_ms = _cut(events)
    full = moments(detect(events), ts_ms)
    blind = detect(later(events, offset, ts_ms))
    raised = moments(blind, ts_ms)
    assert raised and raised <= full
    unverified = blind.counters.unverified
    assert unverified[UnverifiedReason.PARTITION_BEFORE_TOPIC] > 0
    assert unverified[UnverifiedReason.BROKER_REGISTRATION_NOT_SEEN] > 0


# ---- the rules in a view started mid-log ------------------------------------------------------

MID_LOG = 500  # the first offset of a log whose earlier segments are gone, no snapshot before it
SETUP_MS = 1000


def log_from(make_history: Any, first: int, late_broker: int | None = None, late_ms: int = 0) -> Any:
    """The standard cluster (brokers 1-3, ``orders``-0) with its metadata log
    read from offset ``first``; ``late_broker``'s only registration seen is at
    ``late_ms``, at broker epoch 30."""
    history = make_history(standard=False)
    history.metadata(SETUP_MS, s.feature_level(21), offset=first)
    for broker, epoch in history.broker_epochs.items():
        if broker != late_broker:
            history.metadata(SETUP_MS, s.register_broker(broker, epoch, fenced=False))
    history.metadata(SETUP_MS, s.topic(history.topic, history.topic_id))
    history.metadata(SETUP_MS, s.partition(history.topic_id, 0, [1, 2, 3], [1, 2, 3], 1))
    if late_broker is not None:
        history.metadata(late_ms, s.register_broker(late_broker, 30, fenced=False))
    return history


def propose(history: Any, ts_ms: int, broker_epoch: int) -> None:
    """Leader 1's AlterPartition (ISR [1, 2, 3], leader and partition epoch 0) accepted."""
    body = s.alter_partition(
        history.topic,
        history.topic_id,
        0,
        broker_id=1,
        broker_epoch=broker_epoch,
        leader_epoch=0,
        partition_epoch=0,
        new_isr=[1, 2, 3],
        error=0,
        result_partition_epoch=1,
    )
    history.request(ts_ms, history.controller, body)


@pytest.mark.parametrize(
    ("first", "started_mid_log"), [(None, False), (0, False), (1, False), (MID_LOG, True)]
)
def test_a_view_knows_it_started_mid_log_from_its_first_records_offset(first, started_mid_log):
    view = ClusterView(retention_ms=60_000)
    raw = s.envelope("c", "metadata", SETUP_MS, s.feature_level(21), offset=first)
    view.apply(envelope_from_obj(raw, "t:0", 0))
    assert view.started_mid_log is started_mid_log


@pytest.mark.violation("ALTER_PARTITION_STALE_BROKER_EPOCH_ACCEPTED")
@pytest.mark.parametrize("first", [1, MID_LOG])
def test_a_stale_broker_epoch_is_flagged_where_the_view_saw_its_registration_replaced(make_history, first):
    """Broker 1 re-registers at epoch 30 at 5000; its AlterPartition at 9000 still
    names epoch 10. Mid-log or not, the view saw epoch 30 take over before the window."""
    history = log_from(make_history, first)
    history.metadata(5000, s.register_broker(1, 30, fenced=False))
    propose(history, 9000, broker_epoch=10)
    assert [rule for rule, *_ in history.run().keys] == ["ALTER_PARTITION_STALE_BROKER_EPOCH_ACCEPTED"]


@pytest.mark.violation("ALTER_PARTITION_STALE_BROKER_EPOCH_ACCEPTED")
def test_a_broker_registered_first_in_a_log_read_from_its_start_had_no_other_epoch(make_history):
    history = log_from(make_history, 1, late_broker=1, late_ms=8500)
    propose(history, 9000, broker_epoch=10)
    assert [rule for rule, *_ in history.run().keys] == ["ALTER_PARTITION_STALE_BROKER_EPOCH_ACCEPTED"]


def test_a_broker_first_seen_within_the_window_of_a_mid_log_view_is_unverified(make_history):
    """The same records from offset 500: broker 1's registration at 8500 may have
    replaced one at epoch 10 the view never saw, which held at the request's time."""
    history = log_from(make_history, MID_LOG, late_broker=1, late_ms=8500)
    propose(history, 9000, broker_epoch=10)
    outcome = history.run()
    assert outcome.keys == []
    assert outcome.counters.unverified[UnverifiedReason.BROKER_REGISTRATION_NOT_SEEN] >= 1


@pytest.mark.parametrize(
    ("first", "reason"),
    [(1, UnverifiedReason.ISR_MEMBER_UNREGISTERED), (MID_LOG, UnverifiedReason.BROKER_REGISTRATION_NOT_SEEN)],
)
def test_an_isr_member_without_a_registration_names_what_was_missing(make_history, first, reason):
    history = log_from(make_history, first, late_broker=3, late_ms=20_000)
    history.change(5000, isr=[1, 2])
    history.change(6000, isr=[1, 2, 3])
    outcome = history.run()
    assert outcome.keys == []
    assert outcome.counters.unverified[reason] == 1
