"""The stateful operator: the detection core inside ``transformWithStateInPandas``.

Grouped by (cluster, bucket) (streaming/routing.py); each group's rows are
the raw event records of one micro-batch that the bucket receives, handled in
topic order (partition, offset) exactly as ``fencewatch replay`` handles a
file, so both raise the same alerts (detectors.buckets says what a bucket
receives and judges).
A processing-time timer flushes judgments still waiting for their grace
window when a bucket's events stop arriving (the streaming counterpart of
replay's end of input).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from detectors import clock_exchange
from detectors.buckets import Bucket
from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import DeadLetter, DeadLetterClass, Envelope, parse_envelope
from detectors.gc_tuning import collector_paused, tune_for_detector
from streaming import snapshot_format
from streaming.pending_store import PENDING_KEY_SCHEMA, PENDING_VALUE_SCHEMA, PendingStore
from streaming.routing import decode_key
from streaming.schema import OUTPUT_COLUMNS, alert_row, clock_evidence_row, dead_letter_row, stats_row
from streaming.state import (
    DETECTOR_SCHEMA,
    GROUP_KEY_SCHEMA,
    GROUP_VALUE_SCHEMA,
    HELD_KEY_SCHEMA,
    HELD_VALUE_SCHEMA,
    PARTITION_KEY_SCHEMA,
    PARTITION_VALUE_SCHEMA,
    REMOTE_KEY_SCHEMA,
    REMOTE_VALUE_SCHEMA,
    HeldChunkStore,
    PartitionStore,
    RemoteStore,
)

# The idle-flush timers a bucket has registered (at most one), or None when
# this worker does not know them (a detector loaded from the state store).
Timers = tuple[int, ...] | None

# What this worker process already holds: (query scope, key) -> (version,
# detector, pending store, timers).
_LIVE: dict[tuple[str, str], tuple[int, Detector, PendingStore, Timers]] = {}

# Records this task handed to one of its buckets as a copy (not home): the
# cluster-wide records every bucket receives (detectors.buckets) come once per
# bucket, and a task holds many buckets, which it handles one after another.
# Parsed once per task instead: position -> envelope. A position is one record
# within a task (a micro-batch reads each offset once, and each file line has
# its own). Envelopes are immutable, and replay's split (detectors.split)
# hands one envelope to many buckets' detectors the same way.
_COPIES: dict[str, Envelope] = {}


class DetectorProcessor(StatefulProcessor):
    def __init__(
        self, config: DetectorConfig, scope: str, idle_flush_ms: int, buckets: int, share_clocks: bool = False
    ):
        """``scope`` names the query (its checkpoint), so several queries in one
        worker never share a cached detector; ``idle_flush_ms`` is how long a
        bucket may be silent before waiting judgments are made anyway;
        ``buckets``: how many buckets each cluster is split into;
        ``share_clocks``: each bucket emits the clock bounds it measured, for the
        driver to publish to every bucket (detectors.clock_exchange)."""
        self.config = config
        self.scope = scope
        self.idle_flush_ms = idle_flush_ms
        self.buckets = buckets
        self.share_clocks = share_clocks

    def init(self, handle: StatefulProcessorHandle) -> None:
        tune_for_detector()  # this Python worker holds detectors from now on
        _COPIES.clear()  # a new task: only its own copies are kept, so memory stays bounded
        self.handle = handle
        self.snapshot = handle.getValueState("detector", DETECTOR_SCHEMA)
        self.partition_groups = handle.getMapState("partition_groups", GROUP_KEY_SCHEMA, GROUP_VALUE_SCHEMA)
        # Where state formats 0 to 2 kept each partition's history; moved into groups on first load.
        self.legacy_partitions = handle.getMapState(
            "partitions", PARTITION_KEY_SCHEMA, PARTITION_VALUE_SCHEMA
        )
        self.pending = handle.getMapState("pending", PENDING_KEY_SCHEMA, PENDING_VALUE_SCHEMA)
        self.remote_partitions = handle.getMapState(
            "remote_partitions", REMOTE_KEY_SCHEMA, REMOTE_VALUE_SCHEMA
        )
        self.held_chunks = handle.getMapState("held_chunks", HELD_KEY_SCHEMA, HELD_VALUE_SCHEMA)

    # ---- state ---------------------------------------------------------------------------------

    def _load(self, key: str) -> tuple[str, int, Detector, PendingStore, Timers]:
        """The key's cluster, state version, detector, pending-judgment store
        and timers (None: not known in this worker)."""
        cluster, index = decode_key(key, self.buckets)
        stored = self.snapshot.get()
        version = int(stored[0]) if stored is not None else 0
        # Taken out, not read: a batch that fails after changing the detector must not
        # leave it cached as the stored version, which Spark rolls back to for the retry.
        # _save puts it back once the batch's state is written.
        live = _LIVE.pop((self.scope, key), None)
        cached = live is not None and live[0] == version
        pending = live[2] if live is not None and cached else PendingStore()
        timers = live[3] if live is not None and cached else None
        # Each task has its own state client: a cached store still holds the previous task's.
        pending.attach(self.pending)
        written = snapshot_format.FORMAT
        if live is not None and cached:
            detector = live[1]
        else:
            if stored is not None:
                with collector_paused():
                    detector = snapshot_format.decode(stored[1])
                written = snapshot_format.format_of(stored[1])
            else:
                detector = Detector(self.config, bucket=Bucket(index, self.buckets))
                detector.cluster(cluster).view.partitions = PartitionStore()
                detector.cluster(cluster).remote.partitions = RemoteStore()
            with collector_paused():
                stored_judgments = pending.load()
            # A snapshot of state format 0 or 1 still carries its judgments: they are
            # queued already, and written to the pending store at the next save.
            detector.keep_pending_apart(cluster, stored_judgments)
        state = detector.cluster(cluster)
        if self.share_clocks:
            clock_exchange.share(state)  # a checkpoint of before shares from this batch on
        store = state.view.partitions
        assert isinstance(store, PartitionStore)
        store.attach(self.partition_groups, self.buckets)
        # Earlier formats' state is written in the new places at this batch's save,
        # in the same state commit as the clear of the old.
        if written < snapshot_format.GROUPED_PARTITIONS:
            with collector_paused():
                store.adopt(self.legacy_partitions.iterator())
            self.legacy_partitions.clear()
        if written < snapshot_format.REMOTE_PARTITIONS:
            remote = RemoteStore()
            remote.adopt(state.remote.partitions)
            state.remote.partitions = remote
        assert isinstance(state.remote.partitions, RemoteStore)
        state.remote.partitions.attach(self.remote_partitions)
        log = state.metadata_log
        if not isinstance(log.chunk_data, HeldChunkStore):
            # A new detector, or one of a state format before 5, whose held records load
            # unchunked: no chunk is made before the first save, which writes them here.
            assert not log.chunk_data, "chunks made before the state store was attached"
            log.chunk_data = HeldChunkStore()
        log.chunk_data.attach(self.held_chunks)
        return cluster, version, detector, pending, timers

    def _save(
        self, key: str, cluster: str, version: int, detector: Detector, pending: PendingStore, timers: Timers
    ) -> int:
        state = detector.cluster(cluster)
        # Writing makes no reference cycles, but after a snapshot's burst it
        # pickles a million histories and records: collections would walk them all.
        with collector_paused():
            for store in (state.view.partitions, state.remote.partitions):
                assert isinstance(store, PartitionStore | RemoteStore)
                store.flush()
            version += 1
            pending.save(version, detector.pending_changes(cluster))
            self.snapshot.update((version, snapshot_format.encode(detector)))
            # After the pickle: pickling is what puts newly held records into chunks.
            held = state.metadata_log.chunk_data
            assert isinstance(held, HeldChunkStore)
            held.flush()
        _LIVE[(self.scope, key)] = (version, detector, pending, timers)
        return version

    @staticmethod
    def _stats(cluster: str, version: int, detector: Detector) -> dict[str, Any]:
        # The state version orders snapshots of one bucket for the driver's metrics.
        return stats_row(cluster, {**detector.snapshot(cluster), "state_version": version})

    def _rearm_idle_timer(self, detector: Detector, now_ms: int, timers: Timers) -> Timers:
        """Put the bucket's idle flush ``idle_flush_ms`` after ``now_ms`` if it
        has judgments waiting; returns its timers now. Timers this worker
        registered itself (the cached detector's version is the stored one, so
        they are the stored timers too) are not listed first: listing costs a
        state-server round trip or two per bucket and batch."""
        for expiry in list(self.handle.listTimers()) if timers is None else timers:
            self.handle.deleteTimer(expiry)
        if not detector.pending_count():
            return ()
        expiry = now_ms + self.idle_flush_ms
        self.handle.registerTimer(expiry)
        return (expiry,)

    # ---- the operator ----------------------------------------------------------------------------

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        cluster, version, detector, pending, timers = self._load(key[0])
        out: list[dict[str, Any]] = []
        batch = pd.concat(list(rows), ignore_index=True).sort_values(["partition", "offset"], kind="stable")
        # Plain lists: iterating numpy scalars costs several times more per row.
        for topic, partition, offset, value, home in zip(
            batch["topic"].tolist(),
            batch["partition"].tolist(),
            batch["offset"].tolist(),
            batch["value"].tolist(),
            batch["home"].tolist(),
            strict=True,
        ):
            position = f"{topic}/{partition}@{offset}"
            item: Envelope | DeadLetter | None = _COPIES.get(position)
            if item is None:
                item = parse_envelope(value, position, offset)
                if not home and isinstance(item, Envelope):
                    _COPIES[position] = item
            if isinstance(item, Envelope) and item.cluster != cluster:
                item = DeadLetter(
                    position,
                    f"record key {cluster!r} differs from the envelope's cluster "
                    f"{item.cluster!r}: publish records keyed by cluster",
                    _text(value),
                    kind=DeadLetterClass.CLUSTER_MISMATCH,
                )
            if isinstance(item, DeadLetter):
                if home:  # one letter per record, from its home bucket
                    detector.dead_letter(item)
                    out.append(dead_letter_row(cluster, item, partition, offset))
                continue
            for letter in detector.ingest(item, home):
                if letter.position == position:
                    out.append(
                        dead_letter_row(
                            cluster, dataclasses.replace(letter, raw=_text(value)), partition, offset
                        )
                    )
                else:  # a held record released now: its letter names its own position
                    out.append(dead_letter_row(cluster, letter, None, None))
            out.extend(alert_row(a) for a in detector.drain())
        timers = self._rearm_idle_timer(detector, timerValues.getCurrentProcessingTimeInMs(), timers)
        out.extend(_shared(cluster, detector))
        version = self._save(key[0], cluster, version, detector, pending, timers)
        out.append(self._stats(cluster, version, detector))
        yield pd.DataFrame(out, columns=OUTPUT_COLUMNS)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        cluster, version, detector, pending, timers = self._load(key[0])
        rows = [dead_letter_row(cluster, letter, None, None) for letter in detector.flush()]
        rows.extend(alert_row(a) for a in detector.drain())
        # pyspark deletes the expired timer once this handler has run.
        expired = expiredTimerInfo.getExpiryTimeInMs()
        if timers is not None:
            timers = tuple(t for t in timers if t != expired)
        rows.extend(_shared(cluster, detector))
        version = self._save(key[0], cluster, version, detector, pending, timers)
        rows.append(self._stats(cluster, version, detector))
        yield pd.DataFrame(rows, columns=OUTPUT_COLUMNS)

    def close(self) -> None:
        pass


def _shared(cluster: str, detector: Detector) -> list[dict[str, Any]]:
    """The clock bounds the bucket measured in this batch, taken out before the
    save (a retried batch measures them again), as a row for the driver."""
    body = clock_exchange.take_shared(detector.cluster(cluster))
    return [] if body is None else [clock_evidence_row(cluster, body)]


def _text(value: Any) -> str:
    return bytes(value).decode("utf-8", errors="replace") if value is not None else ""
