"""A Spark streaming source that reads one Kafka topic with confluent-kafka.

The job reads Kafka through this Python Data Source ("fencewatch-kafka") or
Spark's own Kafka source (streaming/spark_kafka.py, a package fetched from
Maven Central); ``read_events`` returns the same columns from either, so the
job does not care which one it got.

Offsets are ``{"<partition>": <next offset>}`` JSON dicts that Spark keeps in
its checkpoint; a micro-batch reads ``[start, end)`` of every partition, so a
restart replays exactly the batch that was planned and never a record twice.

Idle ticks: the detector's processing-time timers (the idle flush) fire only
in a micro-batch, and Spark's no-data batches, which would run them, run
every trigger for a stateful query with processing-time timers: about one
core busy while the topic is quiet. The job turns those off; instead, when no
record has arrived for ``idleTriggerMs``, this source plans an empty batch by
counting ``"idle_ticks"`` in the offset, and a second one ``idleTriggerMs``
later in case the first came a moment before a timer was due. Then it waits
for records.

Vanished offsets: records can disappear before they are read: retention or
DeleteRecords moves the log start past them, or the topic is truncated or
deleted and recreated. A read that meets such a gap yields a *loss row*
(``lost_offsets`` set: how many offsets, from ``offset`` on) instead of
skipping it in silence; ``read_events`` turns loss rows into an observed
metric (``LOST_OFFSETS_METRIC``), which the job's listener logs and counts,
and drops them. When the planner finds a partition's log ending before the
position it reached (truncated or recreated), it logs a warning and goes on
reading from the log start (``startingOffsets`` earliest) or end (latest),
as a Kafka consumer whose position is out of range does.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from streaming.routing import SOURCE_ROUTE_COLUMNS, route_record
from streaming.spark_kafka import PYTHON_SOURCE, SOURCES, SPARK_SOURCE

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

SOURCE_NAME = "fencewatch-kafka"
# Columns of every record, whichever source reads it. ``timestamp`` is the
# Kafka record timestamp in epoch milliseconds (not a Spark TIMESTAMP, so the
# event-time code never depends on the session time zone).
EVENT_SCHEMA = "key string, value binary, topic string, partition int, offset long, timestamp long"
# What the Python source yields: the event columns; on loss rows only, how
# many offsets vanished from ``offset`` on (null on records); and, with the
# ``routeBuckets`` option, each record's routing (null without it).
SOURCE_SCHEMA = f"{EVENT_SCHEMA}, lost_offsets long, {SOURCE_ROUTE_COLUMNS}"
# The observed metric read_events reports loss rows under: ``ranges``, a list
# of (partition, first, offsets) per micro-batch.
LOST_OFFSETS_METRIC = "fencewatch_source_lost_offsets"

# Partition number (a string: JSON object keys are strings) -> next offset to read;
# plus IDLE_TICKS once the source has planned an empty batch.
Offsets = dict[str, int]
IDLE_TICKS = "idle_ticks"
TICKS_PER_LULL = 2
T = TypeVar("T")

_DEFAULT_GROUP_ID = "fencewatch-spark-source"
# Rows per Arrow batch handed to Spark: large enough to amortise the per-batch
# cost, small enough to keep a Python worker's memory flat.
_ARROW_BATCH_ROWS = 10_000
# The fewest records ``minPartitions`` gives a Spark task of its own: below it,
# starting one more consumer costs more than reading on in the same task.
MIN_SPLIT_EVENTS = 5_000


class KafkaSourceError(RuntimeError):
    """The source cannot go on: one line, ``<what> -- <what to do>``. Spark
    wraps it in a StreamingQueryException whose text holds it as the line
    ``streaming.kafka_source.<class>: <message>`` (fencewatch.spark_console)."""


class ReadTimedOut(KafkaSourceError, TimeoutError):
    """An executor got neither the planned records nor the end of the log in time."""


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, validated once.

    ``client_config`` holds every ``kafka.*`` option without the prefix; it is
    handed verbatim to librdkafka (so TLS/SASL use librdkafka's names, e.g.
    ``kafka.ssl.ca.location``, not the Java client's truststore options).
    """

    topic: str
    client_config: Mapping[str, str]
    starting_offsets: str  # "earliest" or "latest"
    max_events_per_trigger: int | None
    max_events_per_split: int | None
    min_partitions: int | None
    probe_timeout_seconds: float
    read_timeout_seconds: float
    idle_trigger_ms: int | None = None  # None: never plan an empty batch
    route_buckets: int | None = None  # None: leave routing to Spark SQL

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Validate Spark reader options; raise ``ValueError`` naming the bad one."""
        lowered = {k.lower(): str(v) for k, v in options.items()}
        client = {k[len("kafka.") :]: v for k, v in lowered.items() if k.startswith("kafka.")}
        if not client.get("bootstrap.servers"):
            raise ValueError("option 'kafka.bootstrap.servers' is required")
        topic = lowered.get("subscribe", "")
        if not topic or "," in topic:
            raise ValueError("option 'subscribe' must name exactly one topic")
        starting = lowered.get("startingoffsets", "latest").lower()
        if starting not in ("earliest", "latest"):
            raise ValueError(f"startingOffsets must be 'earliest' or 'latest', not {starting!r}")
        return cls(
            topic=topic,
            client_config=client,
            starting_offsets=starting,
            max_events_per_trigger=_positive_int(lowered, "maxeventspertrigger"),
            max_events_per_split=_positive_int(lowered, "maxeventspersplit"),
            min_partitions=_positive_int(lowered, "minpartitions"),
            probe_timeout_seconds=(_positive_int(lowered, "probetimeoutms") or 10_000) / 1000,
            read_timeout_seconds=(_positive_int(lowered, "readtimeoutms") or 120_000) / 1000,
            idle_trigger_ms=_positive_int(lowered, "idletriggerms"),
            route_buckets=_positive_int(lowered, "routebuckets"),
        )


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"option {name!r} must be an integer, not {raw!r}") from None
    if value <= 0:
        raise ValueError(f"option {name!r} must be positive, not {value}")
    return value


def partition_offsets(offsets: Mapping[str, T]) -> dict[str, T]:
    """The per-partition part of an offset (without the idle tick count)."""
    return {p: off for p, off in offsets.items() if p != IDLE_TICKS}


def fetch_high_watermarks(
    consumer: Consumer, topic: str, probe_from: Mapping[int, int], timeout_seconds: float
) -> dict[int, int]:
    """The high watermark a Fetch response reports for each partition, fetched
    from ``probe_from`` (an offset that exists), with ``consumer``; partitions
    that do not answer within ``timeout_seconds`` are left out (and logged).
    Where ListOffsets may lag (the embedded broker, ``_log_spans``), this is
    the true end of the log."""
    consumer.assign([TopicPartition(topic, p, off) for p, off in probe_from.items()])
    pending = set(probe_from)
    deadline = time.monotonic() + timeout_seconds
    try:
        while pending and time.monotonic() < deadline:
            msg = consumer.poll(0.1)
            if msg is None or _event_kind(msg) == "error":
                continue
            # A record or an end-of-partition event both mean a Fetch
            # response for this partition arrived and set the watermark.
            pending.discard(msg.partition())
        result = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1]
            for p in probe_from
            if p not in pending
        }
    finally:
        consumer.unassign()
    if pending:
        log.warning(
            "partitions %s of %r gave no fetch response within %.1fs; using ListOffsets",
            sorted(pending),
            topic,
            timeout_seconds,
        )
    return {p: int(high) for p, high in result.items() if high >= 0}


@dataclass(frozen=True)
class LogSpan:
    """The offsets one partition's log holds now: ``[start, end)``.

    ``confirmed``: ``end`` came from a fetch response or the log is empty, so
    it is the true end, not a ListOffsets value that may lag (NOTES.md)."""

    start: int
    end: int
    confirmed: bool


def plan_ends(
    position: Offsets, spans: Mapping[str, LogSpan], starting_offsets: str
) -> tuple[Offsets, Offsets]:
    """Each partition's end offset for the next batch, and the partitions whose
    log ends before ``position`` (truncated or recreated: a confirmed end below
    it) with the offset they go on from: the log start for ``earliest``, the
    end for ``latest``, as a Kafka consumer's ``auto.offset.reset`` does.

    A partition new since ``position`` is read from offset 0 (Spark's Kafka
    source does the same); one gone from the metadata keeps its offset."""
    ends: Offsets = {}
    resets: Offsets = {}
    for p, span in spans.items():
        at = position.get(p, 0)
        if span.confirmed and span.end < at:
            resets[p] = span.start if starting_offsets == "earliest" else span.end
        else:
            ends[p] = max(at, span.end)
    ends.update({p: off for p, off in position.items() if p not in spans})
    return ends, resets


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One Spark task's work: offsets ``[start, end)`` of one Kafka partition."""

    topic: str
    partition: int
    start: int
    end: int


def apportion(start: Offsets, end: Offsets, max_events: int) -> Offsets:
    """Cap the events between ``start`` and ``end`` at ``max_events`` in total.

    Each partition gets a share proportional to its backlog (largest remainder
    rounding), so the total is exactly ``min(max_events, backlog)`` and a busy
    partition cannot starve the others.
    """
    backlog = {p: end[p] - start.get(p, 0) for p in end}
    total = sum(backlog.values())
    if total <= max_events:
        return dict(end)
    shares = {p: n * max_events / total for p, n in backlog.items()}
    taken = {p: int(s) for p, s in shares.items()}
    leftover = max_events - sum(taken.values())
    for p in sorted(shares, key=lambda p: taken[p] - shares[p])[:leftover]:
        taken[p] += 1
    return {p: start.get(p, 0) + taken[p] for p in end}


def split_ranges(
    topic: str,
    start: Offsets,
    end: Offsets,
    max_per_split: int | None,
    min_splits: int | None = None,
) -> list[OffsetRange]:
    """Cut each partition's ``[start, end)`` into ranges of at most
    ``max_per_split``, and into at least ``min_splits`` ranges in all where
    the backlog allows it: one cluster's events sit in one Kafka partition
    (records are keyed by cluster), which would otherwise be one Spark task
    however many cores read. Each partition gets pieces in proportion to its
    backlog, rounded up (so ``min_splits`` are reached), none smaller
    than ``MIN_SPLIT_EVENTS``: a piece costs a consumer's start."""
    backlog = {p: end[p] - start.get(p, 0) for p in end}
    total = sum(n for n in backlog.values() if n > 0)
    ranges: list[OffsetRange] = []
    for p in sorted(end, key=int):
        lo, hi = start.get(p, 0), end[p]
        pieces = 1
        if min_splits and total:
            wanted = math.ceil(min_splits * backlog[p] / total)
            pieces = max(1, min(wanted, backlog[p] // MIN_SPLIT_EVENTS))
        step = math.ceil(max(backlog[p], 1) / pieces)
        if max_per_split:
            step = min(step, max_per_split)
        ranges.extend(OffsetRange(topic, int(p), s, min(s + step, hi)) for s in range(lo, hi, step))
    return ranges


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver and reads offset ranges on executors.

    Spark pickles the reader to the executors, so ``__init__`` does no I/O and
    the planning consumer is created lazily on the driver only.
    """

    def __init__(self, options: SourceOptions) -> None:
        self._opts = options
        self._consumer: Consumer | None = None
        # Spark may ask for the initial offset again before the first batch
        # is planned (4.3 asked twice, one trigger apart): "latest" must
        # resolve once, or records produced in between would be skipped.
        self._initial: Offsets | None = None
        # The logs' spans frozen by prepareForTriggerAvailableNow; None otherwise.
        self._target: dict[str, LogSpan] | None = None
        self._last_available: Offsets | None = None
        self._warned_missing_topic = False
        # Since when (monotonic) latestOffset has found nothing new, or since the
        # last idle tick; None while records arrive. Ticks since the last record.
        self._idle_since: float | None = None
        self._lull_ticks = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_consumer"] = None
        return state

    # -- planning (driver) --------------------------------------------------

    def initialOffset(self) -> Offsets:
        if self._initial is None:
            spans = self._log_spans()
            earliest = self._opts.starting_offsets == "earliest"
            self._initial = {p: span.start if earliest else span.end for p, span in spans.items()}
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self._opts.max_events_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._log_spans()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        spans = self._target if self._target is not None else self._log_spans()
        self._last_available = {p: span.end for p, span in spans.items()}
        positions = partition_offsets(start)
        end, resets = plan_ends(positions, spans, self._opts.starting_offsets)
        if isinstance(limit, ReadMaxRows):
            end = apportion(positions, end, limit.max_rows)
        elif not isinstance(limit, ReadAllAvailable):
            raise ValueError(f"{SOURCE_NAME} supports only ReadMaxRows limits, not {limit!r}")
        for p, reset in resets.items():
            log.warning(
                "topic %s partition %s now ends at offset %d, before offset %d which this query had "
                "read up to: the topic was truncated or deleted and recreated; reading on from offset %d "
                "(startingOffsets %s)",
                self._opts.topic,
                p,
                spans[p].end,
                positions[p],
                reset,
                self._opts.starting_offsets,
            )
        end.update(resets)
        return self._with_idle_ticks(start, {p: end[p] for p in sorted(end, key=int)})

    def _with_idle_ticks(self, start: Offsets, end: Offsets) -> Offsets:
        """``end`` with the tick count of ``start``, one more when the topic
        has been idle for ``idleTriggerMs`` (at most TICKS_PER_LULL times per
        lull): a new offset, so Spark plans a batch with no records, in which
        the job's timers fire."""
        ticks = start.get(IDLE_TICKS, 0)
        interval_ms = self._opts.idle_trigger_ms
        # Trigger.AvailableNow must end once it has read up to its target.
        if interval_ms is not None and self._target is None:
            now = time.monotonic()
            if end != partition_offsets(start):
                self._idle_since, self._lull_ticks = None, 0
            elif self._idle_since is None:
                self._idle_since = now
            elif self._lull_ticks < TICKS_PER_LULL and (now - self._idle_since) * 1000 >= interval_ms:
                ticks += 1
                self._idle_since = now
                self._lull_ticks += 1
        return {**end, IDLE_TICKS: ticks} if ticks else end

    def reportLatestOffset(self) -> Offsets | None:
        return self._last_available

    def partitions(self, start: Offsets, end: Offsets) -> list[OffsetRange]:
        return split_ranges(
            self._opts.topic,
            partition_offsets(start),
            partition_offsets(end),
            self._opts.max_events_per_split,
            self._opts.min_partitions,
        )

    def commit(self, end: Offsets) -> None:
        """Nothing to do: progress lives in Spark's checkpoint, not in a consumer group."""

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _planning_consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(
                {
                    "group.id": _DEFAULT_GROUP_ID,
                    **self._opts.client_config,
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    # A probe needs one fetch response per partition, not data:
                    # answer fast at the log end and fetch little.
                    "fetch.wait.max.ms": 10,
                    "max.partition.fetch.bytes": 65_536,
                    "queued.max.messages.kbytes": 1_024,
                }
            )
        return self._consumer

    def _list_watermarks(self) -> dict[str, tuple[int, int]]:
        """ListOffsets (low, high) per partition of the topic; {} while it does not exist."""
        consumer = self._planning_consumer()
        timeout = self._opts.probe_timeout_seconds
        try:
            meta = consumer.list_topics(self._opts.topic, timeout=timeout).topics.get(self._opts.topic)
            if meta is None or meta.error is not None:
                # Once per reader: triggers keep polling for the topic to appear.
                if not self._warned_missing_topic:
                    log.warning("topic %r not available yet: %s", self._opts.topic, meta and meta.error)
                    self._warned_missing_topic = True
                return {}
            return {
                str(p): tuple(  # type: ignore[misc]
                    consumer.get_watermark_offsets(
                        TopicPartition(self._opts.topic, p), timeout=timeout, cached=False
                    )
                )
                for p in sorted(meta.partitions)
            }
        except KafkaException as exc:
            servers = self._opts.client_config.get("bootstrap.servers")
            raise KafkaSourceError(
                f"cannot read the offsets of topic {self._opts.topic} from Kafka at {servers}: "
                f"{exc.args[0].str()} -- check that the brokers are up and reachable from the Spark "
                "driver, and the client settings (--kafka-config); started again with the same "
                "checkpoint, the job resumes where it stopped"
            ) from exc

    def _log_spans(self) -> dict[str, LogSpan]:
        """Each partition's log start and the offset after its last fetchable record.

        Why not just the ListOffsets high watermark: the embedded tansu broker
        reports base offset + 1 of the last record *batch* there (10 records
        produced in one batch -> 1), although every record is fetchable. An end
        planned from it would stall the tail until the next batch arrived, and
        never fetch the last batch's tail in a quiet topic. The high watermark
        in a Fetch response is right, so we fetch from ``high - 1`` (a record
        that exists: the last batch's base offset) and take librdkafka's cached
        watermark from that response. On a real Kafka broker both agree and
        the probe costs one small fetch per partition and trigger. A partition
        that does not answer within ``probeTimeoutMs`` keeps the ListOffsets
        value: possibly late, never past the data, so no record is lost.
        """
        watermarks = self._list_watermarks()
        probe_from = {p: high - 1 for p, (low, high) in watermarks.items() if high > low}
        fetched = self._fetch_high_watermarks(probe_from) if probe_from else {}
        return {
            p: LogSpan(low, max(high, fetched.get(p, high)), confirmed=p in fetched or high <= low)
            for p, (low, high) in watermarks.items()
        }

    def _fetch_high_watermarks(self, probe_from: Mapping[str, int]) -> dict[str, int]:
        fetched = fetch_high_watermarks(
            self._planning_consumer(),
            self._opts.topic,
            {int(p): off for p, off in probe_from.items()},
            self._opts.probe_timeout_seconds,
        )
        return {str(p): high for p, high in fetched.items()}

    # -- reading (executors) ------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Yield exactly the records with offsets in ``[start, end)`` as Arrow
        batches, and a loss row for each run of those offsets that vanished."""
        assert isinstance(partition, OffsetRange)
        consumer = Consumer(
            {
                "group.id": _DEFAULT_GROUP_ID,
                **self._opts.client_config,
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                # If `start` is out of the log (retention, truncation), start at
                # the log start rather than fail: _read_range reports the gap.
                "auto.offset.reset": "earliest",
            }
        )
        try:
            consumer.assign([TopicPartition(partition.topic, partition.partition, partition.start)])
            rows = _Rows(partition, self._opts.route_buckets)
            yield from _read_range(consumer, rows, self._opts.read_timeout_seconds)
        finally:
            consumer.close()


_ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("lost_offsets", pa.int64()),
        ("route_cluster", pa.string()),
        ("route_buckets", pa.list_(pa.int32())),
    ]
)


class _Rows:
    """The rows of one offset range read so far, as Arrow columns; each record
    routed to ``route_buckets`` buckets if given (streaming/routing.py)."""

    def __init__(self, rng: OffsetRange, route_buckets: int | None = None):
        self.rng = rng
        self.route_buckets = route_buckets
        self._clear()

    def _clear(self) -> None:
        self.keys: list[str | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int | None] = []
        self.lost: list[int | None] = []
        self.clusters: list[str | None] = []
        self.buckets: list[list[int] | None] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def record(self, msg: Message, offset: int) -> None:
        raw_key, value = msg.key(), msg.value()
        key = None if raw_key is None else raw_key.decode("utf-8", "replace")
        ts_type, ts_ms = msg.timestamp()
        self.keys.append(key)
        self.values.append(value)
        self.offsets.append(offset)
        self.timestamps.append(None if ts_type == TIMESTAMP_NOT_AVAILABLE else ts_ms)
        self.lost.append(None)
        if self.route_buckets is None:
            self.clusters.append(None)
            self.buckets.append(None)
        else:
            cluster, buckets = route_record(key, value, self.route_buckets)
            self.clusters.append(cluster)
            self.buckets.append(buckets)

    def loss(self, first: int, end: int) -> None:
        """Offsets ``[first, end)`` vanished before they were read."""
        self.keys.append(None)
        self.values.append(None)
        self.offsets.append(first)
        self.timestamps.append(None)
        self.lost.append(end - first)
        self.clusters.append(None)
        self.buckets.append(None)

    def take(self) -> pa.RecordBatch:
        n = len(self.offsets)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(self.keys, pa.string()),
                pa.array(self.values, pa.binary()),
                pa.array([self.rng.topic] * n, pa.string()),
                pa.array([self.rng.partition] * n, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                pa.array(self.timestamps, pa.int64()),
                pa.array(self.lost, pa.int64()),
                pa.array(self.clusters, pa.string()),
                pa.array(self.buckets, pa.list_(pa.int32())),
            ],
            schema=_ARROW_SCHEMA,
        )
        self._clear()
        return batch


def _log_start(consumer: Consumer, rng: OffsetRange, timeout_seconds: float) -> int:
    """The partition's log start offset: from the last fetch response, else asked for."""
    tp = TopicPartition(rng.topic, rng.partition)
    low, _ = consumer.get_watermark_offsets(tp, cached=True)
    if low < 0:
        low, _ = consumer.get_watermark_offsets(tp, timeout=timeout_seconds, cached=False)
    return int(low)


def _read_range(consumer: Consumer, rows: _Rows, timeout_seconds: float) -> Iterator[pa.RecordBatch]:
    rng = rows.rng
    next_offset = rng.start
    # Where the broker last said the log ends, inside the range; None once a record came after.
    log_end: int | None = None
    last_error: KafkaError | None = None
    deadline = time.monotonic() + timeout_seconds
    while next_offset < rng.end:
        msgs = consumer.consume(min(_ARROW_BATCH_ROWS, rng.end - next_offset), timeout=0.5)
        for msg in msgs:
            kind = _event_kind(msg)
            if kind == "error":
                last_error = msg.error()
                continue
            off = msg.offset()
            if off is None:  # records and end-of-partition events always carry one
                continue
            if off >= rng.end:
                # A record past the range, or the end of the log at or past
                # `end` (the rest of the range held no records: transaction
                # markers, compaction): the range is complete.
                next_offset = rng.end
                break
            if kind == "eof":
                if off < next_offset:
                    # The log now ends before offsets this range has read: it was
                    # truncated or recreated (the consumer reset to its start, and
                    # the records below `next_offset` came back). The rest is gone.
                    rows.loss(next_offset, rng.end)
                    next_offset = rng.end
                    break
                # An end of log inside the range is a lagging leader or lost
                # data: keep polling until the deadline.
                log_end = off
                continue
            if off < next_offset:
                continue  # came back after an offset reset: already read
            if off > next_offset:
                # A gap: transaction markers and compaction leave some; offsets
                # below the log start are deleted records.
                deleted_to = min(off, _log_start(consumer, rng, timeout_seconds))
                if deleted_to > next_offset:
                    rows.loss(next_offset, deleted_to)
            rows.record(msg, off)
            next_offset = off + 1
            log_end = None
            deadline = time.monotonic() + timeout_seconds
        if len(rows) >= _ARROW_BATCH_ROWS:
            yield rows.take()
        if next_offset < rng.end and time.monotonic() > deadline:
            if log_end is None:
                raise ReadTimedOut(
                    f"{rng.topic}[{rng.partition}]: no record at offset >= {next_offset} and no end of "
                    f"the log within {timeout_seconds:.0f}s although the planned range ends at {rng.end} "
                    f"(last client error: {last_error}); the broker is unreachable, or the log now ends "
                    "before that offset (the embedded broker answers such a fetch with nothing) -- check "
                    "that the brokers are up and reachable from the Spark executors; started again with "
                    "the same checkpoint, the job re-reads the batch"
                )
            # The broker has kept saying the log ends inside the range: the rest is gone.
            rows.loss(log_end, rng.end)
            next_offset = rng.end
    if len(rows):
        yield rows.take()


def _event_kind(msg: Message) -> str:
    """``"record"``, ``"eof"`` (end of partition) or ``"error"``.

    Non-fatal client errors are informational (librdkafka retries by itself),
    so they are logged and the caller's timeout decides; fatal ones raise.
    """
    err = msg.error()
    if err is None:
        return "record"
    if err.code() == KafkaError._PARTITION_EOF:
        return "eof"
    if err.fatal():
        raise KafkaException(err)
    log.warning("kafka client error (retrying): %s", err)
    return "error"


class KafkaDataSource(DataSource):
    """``spark.readStream.format("fencewatch-kafka")``: one Kafka topic as a stream.

    Options: ``kafka.bootstrap.servers`` (required) and any ``kafka.*`` client
    setting; ``subscribe`` (one topic); ``startingOffsets`` (``earliest`` |
    ``latest``, default latest; applies to a new checkpoint only);
    ``maxEventsPerTrigger`` (events per micro-batch); ``maxEventsPerSplit``
    (events per Spark task, splitting hot partitions); ``minPartitions``
    (read each batch in at least this many Spark tasks where it holds at least
    ``MIN_SPLIT_EVENTS`` events per task, as Spark's connector's option of that
    name; the job sets Spark's default parallelism); ``probeTimeoutMs``
    (default 10000) and ``readTimeoutMs`` (default 120000); ``idleTriggerMs``
    (plan an empty micro-batch after this long without records, and once more
    after as long again; default never); ``routeBuckets`` (route each record to
    this many buckets of its cluster as it is read; default: not routed).

    Rows have ``SOURCE_SCHEMA``: the event columns plus ``lost_offsets``, set
    only on loss rows (see the module docstring), which ``read_events`` drops,
    and the routing columns.
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(SourceOptions.parse(self.options))


def register(spark: SparkSession) -> None:
    """Make ``format("fencewatch-kafka")`` available in ``spark``'s session."""
    spark.dataSource.register(KafkaDataSource)


def read_events(
    spark: SparkSession,
    options: Mapping[str, str],
    source: str = PYTHON_SOURCE,
    route_buckets: int | None = None,
) -> DataFrame:
    """A streaming DataFrame of ``EVENT_SCHEMA`` rows from one Kafka topic.

    ``options`` are this module's source options. ``source``: ``"python"``
    reads with this module's source, ``"spark"`` with Spark's own
    (streaming/spark_kafka.py, which says how the options carry over; it
    raises ``spark_kafka.ConnectorNotLoaded`` when the session lacks it). With
    ``route_buckets``, our source also routes each record to that many buckets
    as it reads it: its rows carry ``routing.SOURCE_ROUTE_COLUMNS`` too, which
    ``routing.route`` then uses (Spark's cannot; its rows are routed in Spark
    SQL). Offsets that vanished before our source read them are reported per
    micro-batch as the observed metric ``LOST_OFFSETS_METRIC`` (a query's
    progress carries it to its listeners).
    """
    from pyspark.sql import functions as F

    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, not {source!r}")
    if route_buckets is not None and source == PYTHON_SOURCE:
        options = {**options, "routeBuckets": str(route_buckets)}
    opts = SourceOptions.parse(options)  # fail here, not inside a Python worker
    if source == SPARK_SOURCE:
        from streaming import spark_kafka

        return spark_kafka.read_events(spark, options)
    register(spark)
    rows = spark.readStream.format(SOURCE_NAME).options(**options).load()
    if opts.route_buckets is None:
        rows = rows.drop("route_cluster", "route_buckets")
    lost = F.col("lost_offsets")
    # Observed metrics are gathered as the batch runs and reach the driver
    # with the query's progress: the executors that meet a gap have no
    # other way to the driver's metrics.
    reported = rows.observe(
        LOST_OFFSETS_METRIC,
        F.collect_list(
            F.when(
                lost.isNotNull(),
                F.struct("partition", F.col("offset").alias("first"), lost.alias("offsets")),
            )
        ).alias("ranges"),
    )
    return reported.where(lost.isNull()).drop("lost_offsets")
