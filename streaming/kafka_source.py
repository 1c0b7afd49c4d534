"""A Spark streaming source that reads one Kafka topic with confluent-kafka.

Spark's own Kafka connector (``spark-sql-kafka-0-10``) is a jar that is not in
the pyspark wheel, so by default the job reads Kafka through this Python Data
Source ("fencewatch-kafka"). ``read_events`` returns the same columns from
either source, so the job does not care which one it got.

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
"""

from __future__ import annotations

import logging
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

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

SOURCE_NAME = "fencewatch-kafka"
# Columns of every record, whichever source reads it. ``timestamp`` is the
# Kafka record timestamp in epoch milliseconds (not a Spark TIMESTAMP, so the
# event-time code never depends on the session time zone).
EVENT_SCHEMA = "key string, value binary, topic string, partition int, offset long, timestamp long"
BUILTIN_KAFKA_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.3.0"

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


class BuiltinKafkaUnavailable(RuntimeError):
    """``use_builtin_kafka`` was asked for, but the connector jar is not loaded."""


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
    probe_timeout_seconds: float
    read_timeout_seconds: float
    idle_trigger_ms: int | None = None  # None: never plan an empty batch

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
            probe_timeout_seconds=(_positive_int(lowered, "probetimeoutms") or 10_000) / 1000,
            read_timeout_seconds=(_positive_int(lowered, "readtimeoutms") or 120_000) / 1000,
            idle_trigger_ms=_positive_int(lowered, "idletriggerms"),
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


def split_ranges(topic: str, start: Offsets, end: Offsets, max_per_split: int | None) -> list[OffsetRange]:
    """Cut each partition's ``[start, end)`` into ranges of at most ``max_per_split``."""
    ranges: list[OffsetRange] = []
    for p in sorted(end, key=int):
        lo, hi = start.get(p, 0), end[p]
        step = max_per_split or max(hi - lo, 1)
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
        # End offsets frozen by prepareForTriggerAvailableNow; None otherwise.
        self._target: Offsets | None = None
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
            watermarks = self._list_watermarks()
            if self._opts.starting_offsets == "earliest":
                self._initial = {p: low for p, (low, _) in watermarks.items()}
            else:
                self._initial = self._true_ends(watermarks)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self._opts.max_events_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._true_ends(self._list_watermarks())

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        available = self._target if self._target is not None else self._true_ends(self._list_watermarks())
        self._last_available = available
        positions = partition_offsets(start)
        # A partition new since `start` is read from offset 0 (Spark's Kafka
        # source does the same); one gone from the metadata keeps its offset.
        end = {p: max(positions.get(p, 0), available.get(p, 0)) for p in available}
        end.update({p: off for p, off in positions.items() if p not in end})
        end = {p: end[p] for p in sorted(end, key=int)}
        if isinstance(limit, ReadMaxRows):
            end = apportion(positions, end, limit.max_rows)
        elif not isinstance(limit, ReadAllAvailable):
            raise ValueError(f"{SOURCE_NAME} supports only ReadMaxRows limits, not {limit!r}")
        return self._with_idle_ticks(start, end)

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

    def _true_ends(self, watermarks: Mapping[str, tuple[int, int]]) -> Offsets:
        """The offset after the last fetchable record of each partition.

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
        probe_from = {p: high - 1 for p, (low, high) in watermarks.items() if high > low}
        fetched = self._fetch_high_watermarks(probe_from) if probe_from else {}
        return {p: max(high, fetched.get(p, high)) for p, (_, high) in watermarks.items()}

    def _fetch_high_watermarks(self, probe_from: Mapping[str, int]) -> dict[str, int]:
        consumer = self._planning_consumer()
        topic = self._opts.topic
        consumer.assign([TopicPartition(topic, int(p), off) for p, off in probe_from.items()])
        pending = {int(p) for p in probe_from}
        deadline = time.monotonic() + self._opts.probe_timeout_seconds
        try:
            while pending and time.monotonic() < deadline:
                msg = consumer.poll(0.1)
                if msg is None or _event_kind(msg) == "error":
                    continue
                # A record or an end-of-partition event both mean a Fetch
                # response for this partition arrived and set the watermark.
                pending.discard(msg.partition())
            answered = {p for p in probe_from if int(p) not in pending}
            result = {
                p: consumer.get_watermark_offsets(TopicPartition(topic, int(p)), cached=True)[1]
                for p in answered
            }
        finally:
            consumer.unassign()
        if pending:
            log.warning(
                "partitions %s of %r gave no fetch response within %.1fs; using ListOffsets",
                sorted(pending),
                topic,
                self._opts.probe_timeout_seconds,
            )
        return {p: high for p, high in result.items() if high >= 0}

    # -- reading (executors) ------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Yield exactly the records with offsets in ``[start, end)`` as Arrow batches."""
        assert isinstance(partition, OffsetRange)
        consumer = Consumer(
            {
                "group.id": _DEFAULT_GROUP_ID,
                **self._opts.client_config,
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                # If `start` was deleted by retention, start at the log start
                # rather than fail; offsets below `start` are dropped anyway.
                "auto.offset.reset": "earliest",
            }
        )
        try:
            consumer.assign([TopicPartition(partition.topic, partition.partition, partition.start)])
            yield from _read_range(consumer, partition, self._opts.read_timeout_seconds)
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
    ]
)


def _read_range(consumer: Consumer, rng: OffsetRange, timeout_seconds: float) -> Iterator[pa.RecordBatch]:
    keys: list[str | None] = []
    values: list[bytes | None] = []
    offsets: list[int] = []
    timestamps: list[int | None] = []
    next_offset = rng.start
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
            if kind == "eof" or off < next_offset:
                # An end of log below `end` is a lagging follower or lost
                # data: keep polling until the deadline. Offsets below
                # `next_offset` come back after an offset reset: already read.
                continue
            key = msg.key()
            ts_type, ts_ms = msg.timestamp()
            keys.append(None if key is None else key.decode("utf-8", "replace"))
            values.append(msg.value())
            offsets.append(off)
            timestamps.append(None if ts_type == TIMESTAMP_NOT_AVAILABLE else ts_ms)
            next_offset = off + 1
            deadline = time.monotonic() + timeout_seconds
        if len(offsets) >= _ARROW_BATCH_ROWS:
            yield _to_batch(rng, keys, values, offsets, timestamps)
            keys, values, offsets, timestamps = [], [], [], []
        if next_offset < rng.end and time.monotonic() > deadline:
            raise TimeoutError(
                f"{rng.topic}[{rng.partition}]: no record at offset >= {next_offset} within "
                f"{timeout_seconds:.0f}s although the planned range ends at {rng.end} "
                f"(last client error: {last_error}); the records were deleted or lost "
                "(the embedded broker keeps data in memory only) or the broker is unreachable"
            )
    if offsets:
        yield _to_batch(rng, keys, values, offsets, timestamps)


def _to_batch(
    rng: OffsetRange,
    keys: list[str | None],
    values: list[bytes | None],
    offsets: list[int],
    timestamps: list[int | None],
) -> pa.RecordBatch:
    n = len(offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.string()),
            pa.array(values, pa.binary()),
            pa.array([rng.topic] * n, pa.string()),
            pa.array([rng.partition] * n, pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array(timestamps, pa.int64()),
        ],
        schema=_ARROW_SCHEMA,
    )


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
    (events per Spark task, splitting hot partitions); ``probeTimeoutMs``
    (default 10000) and ``readTimeoutMs`` (default 120000); ``idleTriggerMs``
    (plan an empty micro-batch after this long without records, and once more
    after as long again; default never).
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return EVENT_SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(SourceOptions.parse(self.options))


def register(spark: SparkSession) -> None:
    """Make ``format("fencewatch-kafka")`` available in ``spark``'s session."""
    spark.dataSource.register(KafkaDataSource)


def read_events(
    spark: SparkSession, options: Mapping[str, str], use_builtin_kafka: bool = False
) -> DataFrame:
    """A streaming DataFrame of ``EVENT_SCHEMA`` rows from one Kafka topic.

    ``options`` are this module's source options. ``use_builtin_kafka`` reads
    with Spark's Kafka connector instead (``maxEventsPerTrigger`` becomes
    ``maxOffsetsPerTrigger``, ``maxEventsPerSplit`` ``maxRecordsPerPartition``);
    it needs the connector jar, else ``BuiltinKafkaUnavailable`` is raised.
    """
    SourceOptions.parse(options)  # fail here, not inside a Python worker
    if not use_builtin_kafka:
        register(spark)
        return spark.readStream.format(SOURCE_NAME).options(**options).load()

    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    renamed = {
        "maxeventspertrigger": "maxOffsetsPerTrigger",
        "maxeventspersplit": "maxRecordsPerPartition",
    }
    ours_only = {"probetimeoutms", "readtimeoutms", "idletriggerms"}
    builtin = {renamed.get(k.lower(), k): v for k, v in options.items() if k.lower() not in ours_only}
    try:
        raw = spark.readStream.format("kafka").options(**builtin).load()
    except AnalysisException as exc:
        # Spark 4.3 raises KAFKA_DATA_SOURCE_NOT_ENABLED; older ones DATA_SOURCE_NOT_FOUND.
        if exc.getCondition() not in ("KAFKA_DATA_SOURCE_NOT_ENABLED", "DATA_SOURCE_NOT_FOUND"):
            raise
        raise BuiltinKafkaUnavailable(
            "Spark's Kafka connector is not on the classpath. Start Spark with "
            f"--packages {BUILTIN_KAFKA_PACKAGE} (or spark.jars.packages), or read with the "
            f"built-in Python source instead (use_builtin_kafka=False)."
        ) from exc
    return raw.select(
        F.col("key").cast("string").alias("key"),
        F.col("value"),
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.unix_millis(F.col("timestamp")).alias("timestamp"),
    )
