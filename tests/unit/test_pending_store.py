"""Pending judgments live apart from the detector snapshot (streaming.pending_store):
each batch writes what it changed, a restart reads them back, and every
judgment is made exactly once, as replay makes it.

The store's backend is a dict with the three MapState calls it makes; the
operator test runs the real DetectorProcessor in pyspark's TwsTester, and
tests/integration/test_pending_state.py runs it in a real query."""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pandas as pd
import pytest
from pyspark.sql.streaming.tws_tester import TwsTester

from detectors.alerts import Alert
from detectors.config import DetectorConfig
from detectors.engine import Detector, PendingJudgment
from detectors.envelope import Envelope, envelope_from_obj
from detectors.pickling import fast_pickle
from detectors.remote import PartitionSegments, Segment
from detectors.view import history_of_plain
from producers.simulator import SimConfig, Simulator
from streaming import snapshot_format
from streaming.pending_store import JUDGMENTS, PendingStore
from streaming.processor import DetectorProcessor
from streaming.schema import ALERT, STATS
from tests.unit.recording_map_state import RecordingMapState

CLUSTER = "sim-1"  # the simulator's cluster; with one bucket, also the operator's key
# The operator's map states, in this format.
MAP_STATES = ("partition_groups", "pending", "remote_partitions", "held_chunks")


def attached(backend: RecordingMapState) -> PendingStore:
    store = PendingStore()
    store.attach(backend)  # type: ignore[arg-type]
    return store


def simulated(seed: int, events: int) -> list[dict[str, Any]]:
    """A history with faults of every rule early on (remote-segment deletions and
    quorum votes among them), at 500 events per second of event time: about
    1,500 judgments wait for grace + lateness at any moment."""
    config = SimConfig(seed=seed, fault_rate=0.02, warmup_ms=1000, events_per_second=500)
    return list(Simulator(config).events(events))


def envelopes(events: list[dict[str, Any]]) -> list[Envelope]:
    return [envelope_from_obj(e, f"mem:{i}", i) for i, e in enumerate(events)]


def batches(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def replay(envs: list[Envelope]) -> Detector:
    detector = Detector()
    for env in envs:
        detector.ingest(env)
    detector.flush()
    return detector


def arrivals(judgments: list[PendingJudgment]) -> list[int]:
    return sorted(j[2] for j in judgments)


def waiting(detector: Detector) -> list[int]:
    return sorted(entry[2] for entry in detector.cluster(CLUSTER).pending)


def test_a_batch_writes_what_it_changed_and_the_store_holds_what_waits():
    detector = Detector()
    detector.keep_pending_apart(CLUSTER, [])
    backend = RecordingMapState()
    store = attached(backend)
    partly_decided = peak = 0
    for version, batch in enumerate(batches(envelopes(simulated(5, 6000)), 400), start=1):
        for env in batch:
            detector.ingest(env)
        backend.writes.clear()
        changes = detector.pending_changes(CLUSTER)
        store.save(version, changes)
        updates = [key for op, key in backend.writes if op == "update"]
        # One value for every judgment the batch scheduled, one record per chunk it decided in.
        assert [k for k in updates if k[1] == JUDGMENTS] == (
            [(version, JUDGMENTS)] if changes.scheduled else []
        )
        records = [k for k in updates if k[1] != JUDGMENTS]
        assert all(record == version for _, record in records) and len({c for c, _ in records}) == len(
            records
        )
        partly_decided += len(records)
        peak = max(peak, len(detector.cluster(CLUSTER).pending))
        # What a new worker would read back is exactly what is waiting.
        assert arrivals(attached(backend).load()) == waiting(detector)
    assert peak > 100 and partly_decided > 0, "the history never kept judgments waiting across batches"
    detector.flush()
    store.save(version + 1, detector.pending_changes(CLUSTER))
    assert backend.values == {}, "decided chunks and their records were left in the store"


def test_restored_at_every_batch_the_detector_judges_each_once_as_replay():
    envs = envelopes(simulated(7, 5000))
    expected = replay(envs)
    backend = RecordingMapState()
    detector = Detector()
    detector.keep_pending_apart(CLUSTER, [])
    store = attached(backend)
    alerts: list[Alert] = []
    for version, batch in enumerate(batches(envs, 300), start=1):
        for env in batch:
            detector.ingest(env)
        alerts.extend(detector.drain())
        store.save(version, detector.pending_changes(CLUSTER))
        snapshot = snapshot_format.encode(detector)
        # A new worker: the detector from its snapshot, which carries no judgment, plus the store.
        detector = snapshot_format.decode(snapshot)
        assert detector.cluster(CLUSTER).pending == []
        store = attached(backend)
        detector.keep_pending_apart(CLUSTER, store.load())
    detector.flush()
    alerts.extend(detector.drain())
    ids = [a.alert_id for a in alerts]
    assert len(ids) == len(set(ids))
    assert ids and set(ids) == {a.alert_id for a in expected.drain()}
    # Every judgment made once: a judgment made twice (or lost) would change the
    # unverified and alert counts even where the alert id is the same.
    assert detector.counters == expected.counters


@fast_pickle
@dataclass(slots=True)
class RemoteViewOfFormat3:
    """detectors.remote.RemoteView as state formats 1 to 3 pickled it (de81004
    to 14666cb): tracked segments by id, beside their partitions."""

    segments: dict[str, Segment] = field(default_factory=dict)
    partitions: dict[tuple[str, int], PartitionSegments] = field(default_factory=dict)
    deleting: dict[tuple[str, int], tuple[int, int | None]] = field(default_factory=dict)


RemoteViewOfFormat3.__module__, RemoteViewOfFormat3.__qualname__ = "detectors.remote", "RemoteView"


def stored_remote(tester: TwsTester) -> dict[tuple[str, int], PartitionSegments]:
    """The remote segments the operator keeps in ``tester``'s state, by partition."""
    return {
        key: snapshot_format.decode(value)
        for key, (value,) in (tester.peekMapState("remote_partitions", CLUSTER) or {}).items()
    }


def written_by_format(
    written: int,
    detector: Detector,
    monkeypatch: pytest.MonkeyPatch,
    remote: dict[tuple[str, int], PartitionSegments] | None = None,
) -> bytes:
    """``detector``'s value as state format ``written`` (1 to 3) pickled it:
    each cluster's tracked remote segments inside, by id. ``remote``: CLUSTER's
    partitions' segments, when the detector holds them in a state store."""
    for name, cluster in detector.clusters.items():
        partitions = remote if remote is not None and name == CLUSTER else cluster.remote.partitions
        cluster.remote = RemoteViewOfFormat3(  # type: ignore[assignment]
            {sid: seg for part in partitions.values() for sid, seg in part.segments.items()},
            {key: PartitionSegments(part.established_end, part.finished) for key, part in partitions.items()},
            cluster.remote.deleting,
        )
    with monkeypatch.context() as patch:  # pickled under the name it had
        patch.setattr("detectors.remote.RemoteView", RemoteViewOfFormat3)
        return b"FWS" + bytes([written]) + pickle.dumps(detector, protocol=pickle.HIGHEST_PROTOCOL)


def test_a_snapshot_carrying_its_judgments_hands_them_to_the_store(monkeypatch: pytest.MonkeyPatch):
    envs = envelopes(simulated(11, 4000))
    expected = replay(envs)
    old = Detector()  # as releases before state format 2 ran it: judgments inside the snapshot
    for env in envs[:2000]:
        old.ingest(env)
    alerts = old.drain()
    carried = waiting(old)
    assert carried
    format_1 = written_by_format(1, old, monkeypatch)
    backend = RecordingMapState()
    detector = snapshot_format.decode(format_1)
    assert waiting(detector) == carried
    store = attached(backend)
    detector.keep_pending_apart(CLUSTER, store.load())
    for env in envs[2000:2200]:
        detector.ingest(env)
    # The store held nothing: every judgment waiting, carried or new, is reported as scheduled.
    now_waiting = waiting(detector)
    changes = detector.pending_changes(CLUSTER)
    assert arrivals(changes.scheduled) == now_waiting and changes.decided == []
    store.save(1, changes)
    detector = snapshot_format.decode(snapshot_format.encode(detector))
    detector.keep_pending_apart(CLUSTER, attached(backend).load())
    for env in envs[2200:]:
        detector.ingest(env)
    detector.flush()
    alerts.extend(detector.drain())
    assert sorted(a.alert_id for a in alerts) == sorted(a.alert_id for a in expected.drain())
    assert detector.counters == expected.counters


def rows(events: list[dict[str, Any]], first_offset: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "topic": "events",
            "partition": 0,
            "offset": range(first_offset, first_offset + len(events)),
            "value": [orjson.dumps(e) for e in events],
            "home": True,
        }
    )


def operator(tester_state: TwsTester | None = None, scope: str | None = None) -> TwsTester:
    """The real operator in pyspark's in-memory tester; with ``tester_state``, a
    new task on a copy of that tester's state: in a new worker (its own cache)
    unless it names the same ``scope``."""
    processor = DetectorProcessor(
        DetectorConfig(), scope=scope or uuid.uuid4().hex, idle_flush_ms=10_000, buckets=1
    )
    tester = TwsTester(processor, timeMode="ProcessingTime")
    if tester_state is not None:
        tester.updateValueState("detector", CLUSTER, tester_state.peekValueState("detector", CLUSTER))
        for name in MAP_STATES:
            tester.updateMapState(name, CLUSTER, tester_state.peekMapState(name, CLUSTER))
    return tester


def test_the_operator_writes_a_lean_detector_and_a_restart_mid_grace_judges_each_once():
    events = simulated(13, 6000)
    envs = envelopes(events)
    expected = replay(envs)
    tester = operator()
    alert_ids: list[str] = []
    sizes: list[tuple[int, int, int]] = []  # (detector bytes, pending judgments, their bytes)

    def run(t: TwsTester, out: pd.DataFrame) -> None:
        alert_ids.extend(out.loc[out["record_type"] == ALERT, "id"])
        stats = orjson.loads(out.loc[out["record_type"] == STATS, "payload"].iloc[-1])
        chunks = t.peekMapState("pending", CLUSTER)
        sizes.append(
            (
                len(t.peekValueState("detector", CLUSTER)[1]),
                stats["pending_judgments"],
                sum(len(data) for (_, record), (data,) in chunks.items() if record == JUDGMENTS),
            )
        )

    for start in range(0, 3000, 500):
        run(tester, tester.testInPandas(CLUSTER, rows(events[start : start + 500], start)))
    # Judgments wait after every batch, in the pending state: the detector value
    # carries none, and is smaller than they alone are (it used to hold them all).
    assert all(pending > 0 for _, pending, _ in sizes)
    assert all(detector < judgments for detector, _, judgments in sizes), sizes
    detector = snapshot_format.decode(tester.peekValueState("detector", CLUSTER)[1])
    assert detector.cluster(CLUSTER).pending == []

    restarted = operator(tester)  # a new worker mid-grace: nothing cached, judgments in the store
    for start in range(3000, 6000, 500):
        run(restarted, restarted.testInPandas(CLUSTER, rows(events[start : start + 500], start)))
    flushed = restarted.setProcessingTime(10**13)  # the idle flush: what still waits is judged
    alert_ids.extend(flushed.loc[flushed["record_type"] == ALERT, "id"])
    assert restarted.peekMapState("pending", CLUSTER) in ({}, None)
    assert len(alert_ids) == len(set(alert_ids)), "an alert was raised twice"
    assert sorted(alert_ids) == sorted(a.alert_id for a in expected.drain())
    final = snapshot_format.decode(restarted.peekValueState("detector", CLUSTER)[1])
    assert final.counters == expected.counters


def test_a_detector_cached_in_the_worker_writes_to_the_state_of_the_task_running_it():
    events = simulated(17, 1000)
    scope = uuid.uuid4().hex
    first = operator(scope=scope)
    first.testInPandas(CLUSTER, rows(events[:500], 0))
    # The next batch runs as another task in the same worker: the cached detector is
    # used, and every write must reach this task's state client, not the finished one's.
    second = operator(first, scope=scope)
    second.testInPandas(CLUSTER, rows(events[500:], 500))
    assert (2, JUDGMENTS) in second.peekMapState("pending", CLUSTER)
    assert (2, JUDGMENTS) not in first.peekMapState("pending", CLUSTER)
    assert second.peekValueState("detector", CLUSTER)[0] == 2


def test_a_bucket_of_state_format_2_has_its_partitions_moved_into_groups(monkeypatch: pytest.MonkeyPatch):
    """Up to state format 2 each partition's history had its own entry in the
    ``partitions`` MapState: the first batch after the upgrade moves them into
    ``partition_groups`` and judges on them as replay does."""
    events = simulated(19, 4000)
    expected = replay(envelopes(events))
    tester = operator()
    first = tester.testInPandas(CLUSTER, rows(events[:2000], 0))
    alert_ids = list(first.query("record_type == @ALERT")["id"])
    groups = tester.peekMapState("partition_groups", CLUSTER)
    histories = {
        (topic, partition): data
        for (topic, _), (value,) in groups.items()
        for partition, data in snapshot_format.decode(value).items()
    }
    assert len(histories) > len(groups) > 0

    # The same state as format 2 wrote it: one entry per partition, a format-2 detector value.
    version, detector = tester.peekValueState("detector", CLUSTER)
    old = operator()
    remote = stored_remote(tester)
    old.updateValueState(
        "detector",
        CLUSTER,
        (version, written_by_format(2, snapshot_format.decode(detector), monkeypatch, remote)),
    )
    old.updateMapState("pending", CLUSTER, tester.peekMapState("pending", CLUSTER))
    # Format 2 pickled each history as its objects; this release keeps them as plain values.
    old.updateMapState(
        "partitions",
        CLUSTER,
        {
            key: (b"FWS\x02" + pickle.dumps(history_of_plain(pickle.loads(data))),)
            for key, data in histories.items()
        },
    )

    out = old.testInPandas(CLUSTER, rows(events[2000:], 2000))
    alert_ids.extend(out.query("record_type == @ALERT")["id"])
    alert_ids.extend(old.setProcessingTime(10**13).query("record_type == @ALERT")["id"])
    assert old.peekMapState("partitions", CLUSTER) in ({}, None)
    moved = {
        (topic, partition)
        for (topic, _), (value,) in old.peekMapState("partition_groups", CLUSTER).items()
        for partition in snapshot_format.decode(value)
    }
    assert moved >= set(histories)
    assert snapshot_format.format_of(old.peekValueState("detector", CLUSTER)[1]) == snapshot_format.FORMAT
    assert sorted(alert_ids) == sorted(a.alert_id for a in expected.drain())


def test_a_bucket_of_state_format_3_has_its_remote_segments_moved_to_their_partitions(
    monkeypatch: pytest.MonkeyPatch,
):
    """Up to state format 3 the detector value carried every tracked remote
    segment: the first batch after the upgrade moves them, under their
    partitions, into ``remote_partitions`` and judges on them as replay does."""
    events = simulated(23, 4000)
    expected = replay(envelopes(events))
    tester = operator()
    alert_ids = list(
        tester.testInPandas(CLUSTER, rows(events[:2000], 0)).query("record_type == @ALERT")["id"]
    )
    stored = stored_remote(tester)
    assert any(part.segments for part in stored.values()), "no segment tracked: the test would show nothing"

    # The same state as format 3 wrote it: the segments inside the detector value.
    version, value = tester.peekValueState("detector", CLUSTER)
    format_3 = written_by_format(3, snapshot_format.decode(value), monkeypatch, stored)
    old = operator()
    old.updateValueState("detector", CLUSTER, (version, format_3))
    for name in ("partition_groups", "pending"):
        old.updateMapState(name, CLUSTER, tester.peekMapState(name, CLUSTER))

    out = old.testInPandas(CLUSTER, rows(events[2000:], 2000))
    alert_ids.extend(out.query("record_type == @ALERT")["id"])
    alert_ids.extend(old.setProcessingTime(10**13).query("record_type == @ALERT")["id"])
    assert old.peekMapState("remote_partitions", CLUSTER)
    assert snapshot_format.format_of(old.peekValueState("detector", CLUSTER)[1]) == snapshot_format.FORMAT
    assert sorted(alert_ids) == sorted(a.alert_id for a in expected.drain())
    final = snapshot_format.decode(old.peekValueState("detector", CLUSTER)[1])
    assert final.counters == expected.counters


def test_a_cached_detector_moves_its_idle_flush_without_listing_timers(monkeypatch: pytest.MonkeyPatch):
    """The idle flush follows a bucket's last batch: one timer, ``idle_flush_ms``
    after it. A worker that loaded the detector lists the stored timers to
    delete them; one that holds the stored version knows them already."""
    events = simulated(23, 1500)
    tester = operator()
    listed: list[Any] = []
    handle = tester.handle
    list_timers = type(handle).listTimers
    monkeypatch.setattr(type(handle), "listTimers", lambda self: listed.append(1) or list_timers(self))
    for batch, start in enumerate(range(0, 1500, 500)):
        tester.setProcessingTime(1_000 * (batch + 1))
        tester.testInPandas(CLUSTER, rows(events[start : start + 500], start))
        handle.setGroupingKey(CLUSTER)
        assert list(handle.listTimers()) == [1_000 * (batch + 1) + 10_000]
        listed.pop()  # the assertion's own listing
    assert len(listed) == 1  # the first batch, which built its detector, only

    restarted = operator(tester)  # a new worker: nothing cached; the stored timer is listed
    restarted.handle._timers = handle._timers
    restarted.setProcessingTime(5_000)
    restarted.testInPandas(CLUSTER, rows(simulated(23, 2000)[1500:], 1500))
    restarted.handle.setGroupingKey(CLUSTER)
    assert list(restarted.handle.listTimers()) == [15_000]
    assert len(listed) == 3  # the restarted batch's, and the assertion's
