"""The fencewatch-kafka Spark source against the embedded broker and local Spark.

Every test checks the source's contract: each produced record arrives exactly
once (no loss, no duplicate, the tail of a multi-record batch not stalled).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from detectors.buckets import buckets_of
from detectors.envelope import Envelope, parse_envelope
from producers.simulator import SimConfig, Simulator
from streaming import spark_kafka
from streaming.broker import EmbeddedBroker
from streaming.kafka_source import (
    EVENT_SCHEMA,
    IDLE_TICKS,
    MIN_SPLIT_EVENTS,
    KafkaStreamReader,
    OffsetRange,
    SourceOptions,
    apportion,
    read_events,
    split_ranges,
)
from streaming.query_start import start_query
from streaming.spark_kafka import SPARK_SOURCE, ConnectorNotLoaded

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

pytestmark = pytest.mark.integration

Produced = list[tuple[int, int, str, bytes]]
WAIT_SECONDS = 120.0


def _options(broker: EmbeddedBroker, topic: str, **extra: str) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": broker.bootstrap_servers,
        "subscribe": topic,
        "startingOffsets": "earliest",
        **extra,
    }


def _rows(spark: SparkSession, table: str) -> list[tuple[int, int, str, bytes]]:
    return [
        (r.partition, r.offset, r.key, bytes(r.value))
        for r in spark.sql(f"SELECT partition, offset, key, value FROM {table}").collect()
    ]


def _assert_exactly_once(got: list[tuple[int, int, str, bytes]], produced: Produced) -> None:
    assert len(got) == len(set(got)), "duplicates"
    missing = set(produced) - set(got)
    extra = set(got) - set(produced)
    assert not missing, f"{len(missing)} records lost, e.g. {sorted(missing)[:3]}"
    assert not extra, f"{len(extra)} unexpected records, e.g. {sorted(extra)[:3]}"


def _wait_for(
    query: StreamingQuery, condition: Callable[[], bool], what: str, timeout: float = WAIT_SECONDS
) -> None:
    """Poll ``condition`` until true; fail fast if the query died, or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        # Waits one interval, and raises at once if the query failed. A condition is
        # often a Spark job of its own (a count of the memory table): polled once a
        # second, it leaves the query more CPU.
        assert not query.awaitTermination(1.0), f"query stopped while waiting for {what}"


def _memory_query(df: DataFrame, *, available_now: bool) -> tuple[str, StreamingQuery]:
    """Start ``df`` into a memory table with a unique name; return (name, query)."""
    name = f"q_{uuid.uuid4().hex[:10]}"
    writer = df.writeStream.format("memory").queryName(name)
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime="200 milliseconds")
    )
    return name, start_query(writer)


def _list_offsets_lag(broker: EmbeddedBroker, topic: str, produced: Produced) -> bool:
    """True if ListOffsets under-reports some partition's end (tansu's quirk is in play)."""
    ends: dict[int, int] = {}
    for partition, offset, _, _ in produced:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "lag-check"})
    try:
        return any(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1] < end
            for p, end in ends.items()
        )
    finally:
        consumer.close()


# -- planning, no I/O ----------------------------------------------------------


def test_apportion_caps_the_total_and_shares_by_backlog() -> None:
    start = {"0": 0, "1": 10, "2": 5}
    end = {"0": 100, "1": 10, "2": 55}
    capped = apportion(start, end, 30)
    assert sum(capped[p] - start[p] for p in end) == 30
    assert capped == {"0": 20, "1": 10, "2": 15}
    assert apportion(start, end, 1000) == end
    # A partition new since `start` counts from offset 0.
    assert apportion({}, {"0": 3}, 2) == {"0": 2}


def test_split_ranges_cuts_hot_partitions() -> None:
    ranges = split_ranges("t", {"0": 0, "1": 7}, {"0": 250, "1": 7}, 100)
    assert [(r.partition, r.start, r.end) for r in ranges] == [
        (0, 0, 100),
        (0, 100, 200),
        (0, 200, 250),
    ]
    assert len(split_ranges("t", {"0": 0}, {"0": 250}, None)) == 1


def _spans(ranges: list[OffsetRange]) -> list[tuple[int, int, int]]:
    return [(r.partition, r.start, r.end) for r in ranges]


def test_min_splits_reads_one_hot_partition_in_several_tasks() -> None:
    # One cluster's events sit in one partition: two cores read it as two halves.
    assert _spans(split_ranges("t", {"0": 0, "1": 0}, {"0": 50_000, "1": 0}, None, 2)) == [
        (0, 0, 25_000),
        (0, 25_000, 50_000),
    ]
    # Pieces follow each partition's backlog, and a cap per split still holds.
    spans = _spans(split_ranges("t", {"0": 0, "1": 0}, {"0": 30_000, "1": 10_000}, 8_000, 4))
    assert spans == [
        (0, 0, 8_000),
        (0, 8_000, 16_000),
        (0, 16_000, 24_000),
        (0, 24_000, 30_000),
        (1, 0, 8_000),
        (1, 8_000, 10_000),
    ]
    spans = _spans(split_ranges("t", {"0": 100}, {"0": 30_100}, None, 3))
    assert spans == [(0, 100, 10_100), (0, 10_100, 20_100), (0, 20_100, 30_100)]
    # Shares are rounded up: two even partitions and five tasks wanted make six, not four.
    assert len(split_ranges("t", {"0": 0, "1": 0}, {"0": 30_000, "1": 30_000}, None, 5)) == 6


def test_min_splits_leaves_small_backlogs_whole() -> None:
    # A piece under MIN_SPLIT_EVENTS would cost a consumer's start for little reading.
    assert len(split_ranges("t", {"0": 0}, {"0": 2 * MIN_SPLIT_EVENTS - 1}, None, 2)) == 1
    assert len(split_ranges("t", {"0": 0}, {"0": 2 * MIN_SPLIT_EVENTS}, None, 8)) == 2
    assert split_ranges("t", {"0": 5}, {"0": 5}, None, 2) == []


def test_reader_plans_min_partitions_option() -> None:
    options = {"kafka.bootstrap.servers": "b:9092", "subscribe": "t", "minPartitions": "2"}
    reader = KafkaStreamReader(SourceOptions.parse(options))
    assert _spans(reader.partitions({"0": 0}, {"0": 20_000})) == [(0, 0, 10_000), (0, 10_000, 20_000)]


# -- end to end ------------------------------------------------------------------


def test_schema_is_the_event_schema(spark: SparkSession, broker: EmbeddedBroker) -> None:
    from pyspark.sql.types import StructType

    df = read_events(spark, _options(broker, "schema-only"))
    assert df.isStreaming
    assert df.schema == StructType.fromDDL(EVENT_SCHEMA)


def test_route_buckets_routes_each_record_as_it_is_read(
    spark: SparkSession, broker: EmbeddedBroker, make_topic: Callable[..., str]
) -> None:
    """With routeBuckets, every record carries its cluster (the key, else the
    envelope's) and the buckets buckets_of gives its envelope; a record that is
    no envelope goes to bucket 0 alone."""
    from pyspark.sql.types import StructType

    topic = make_topic(2)
    sim = Simulator(SimConfig(seed=5, fault_rate=0.05, partitions_per_topic=40))
    values = [orjson.dumps(e) for e in sim.events(400)] + [b"{not json", b"[1]"]
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for i, value in enumerate(values):
        # Every fifth keyless: its cluster comes from the envelope.
        producer.produce(topic, key=None if i % 5 == 0 else f"key-{i % 3}", value=value, partition=i % 2)
    assert producer.flush(30) == 0

    df = read_events(spark, _options(broker, topic), route_buckets=7)
    assert df.schema == StructType.fromDDL(f"{EVENT_SCHEMA}, route_cluster string, route_buckets array<int>")
    name, query = _memory_query(df, available_now=True)
    assert query.awaitTermination(WAIT_SECONDS), "availableNow query did not finish"
    rows = spark.sql(f"SELECT key, value, route_cluster, route_buckets FROM {name}").collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(values)
    fanned_out = 0
    for row in rows:
        env = parse_envelope(bytes(row.value))
        if isinstance(env, Envelope):
            assert row.route_cluster == (row.key if row.key is not None else env.cluster)
            assert tuple(row.route_buckets) == buckets_of(env, 7)
            fanned_out += len(row.route_buckets) == 7
        else:
            assert (row.route_cluster, row.route_buckets) == (row.key or "", [0])
    assert fanned_out, "no record went to every bucket"


def test_available_now_reads_every_record_once(
    spark: SparkSession,
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    produce: Callable[..., Produced],
) -> None:
    topic = make_topic(3)
    produced = produce(topic, 3000, partitions=3, wave=250)
    assert _list_offsets_lag(broker, topic, produced), "test must exercise the watermark quirk"

    name, query = _memory_query(read_events(spark, _options(broker, topic)), available_now=True)
    assert query.awaitTermination(WAIT_SECONDS), "availableNow query did not finish"
    _assert_exactly_once(_rows(spark, name), produced)
    row = spark.sql(f"SELECT * FROM {name} LIMIT 1").collect()[0]
    assert row.topic == topic and row.timestamp > 1_600_000_000_000  # epoch ms


def test_continuous_query_reads_the_tail_of_each_batch(
    spark: SparkSession,
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    produce: Callable[..., Produced],
) -> None:
    topic = make_topic(3)
    name, query = _memory_query(read_events(spark, _options(broker, topic)), available_now=False)
    try:
        produced: Produced = []
        for wave in range(3):
            produced += produce(topic, 600, partitions=3, wave=200)
            expected = len(produced)
            # The last records of a wave sit past ListOffsets' watermark: they
            # must arrive without waiting for a later wave to push it forward.
            _wait_for(
                query,
                lambda expected=expected: spark.table(name).count() >= expected,
                f"wave {wave}: {expected} records",
            )
        _assert_exactly_once(_rows(spark, name), produced)
    finally:
        query.stop()


def test_an_idle_topic_gets_two_empty_batches_per_lull(
    spark: SparkSession,
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    produce: Callable[..., Produced],
) -> None:
    """``idleTriggerMs`` plans an empty batch (a new ``idle_ticks`` offset) after
    that long without records and once more after as long again, then waits
    for records: the job's timers get their batches, an idle job does not spin."""
    topic = make_topic(2)
    df = read_events(spark, _options(broker, topic, idleTriggerMs="1000"))
    name, query = _memory_query(df, available_now=False)

    def ticks() -> list[int]:
        # Empty batches that ran; Spark's idle reports have no addBatch phase.
        # Batch 0 runs even on an empty topic (a new query has no committed
        # offsets to compare with): it is the query's start, not a tick.
        return [
            json.loads(p["sources"][0]["endOffset"]).get(IDLE_TICKS, 0)
            for p in query.recentProgress
            if p["numInputRows"] == 0 and "addBatch" in p["durationMs"] and p["batchId"] > 0
        ]

    try:
        produced = produce(topic, 300, partitions=2, wave=100)
        _wait_for(query, lambda: spark.table(name).count() >= 300, "the first records")
        _wait_for(query, lambda: len(ticks()) >= 2, "two idle ticks", timeout=30)
        time.sleep(3)  # three more tick intervals: no third empty batch in this lull
        assert ticks() == [1, 2]
        produced += produce(topic, 300, partitions=2, wave=100)
        _wait_for(query, lambda: spark.table(name).count() >= 600, "the second records")
        _wait_for(query, lambda: len(ticks()) >= 4, "the next lull's ticks", timeout=30)
        assert ticks() == [1, 2, 3, 4]
        _assert_exactly_once(_rows(spark, name), produced)
    finally:
        query.stop()


def test_max_events_per_trigger_bounds_each_batch(
    spark: SparkSession,
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    produce: Callable[..., Produced],
) -> None:
    topic = make_topic(3)
    produced = produce(topic, 1000, partitions=3, wave=100)
    df = read_events(spark, _options(broker, topic, maxEventsPerTrigger="150"))
    name, query = _memory_query(df, available_now=True)
    assert query.awaitTermination(WAIT_SECONDS)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert max(sizes) <= 150, sizes
    assert sum(sizes) == 1000 and len(sizes) >= 7, sizes
    _assert_exactly_once(_rows(spark, name), produced)


@pytest.mark.parametrize(
    ("records", "option"),
    [(1000, {"maxEventsPerSplit": "90"}), (3 * MIN_SPLIT_EVENTS, {"minPartitions": "3"})],
    ids=["max-events-per-split", "min-partitions"],
)
def test_a_hot_partition_read_in_pieces_gives_every_record_once(
    spark: SparkSession,
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    produce: Callable[..., Produced],
    records: int,
    option: dict[str, str],
) -> None:
    topic = make_topic(1)
    produced = produce(topic, records, partitions=1, wave=records // 2)
    df = read_events(spark, _options(broker, topic, **option))
    name, query = _memory_query(df, available_now=True)
    assert query.awaitTermination(WAIT_SECONDS)
    _assert_exactly_once(_rows(spark, name), produced)


def test_restart_from_checkpoint_continues_without_duplicates(
    spark: SparkSession,
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    produce: Callable[..., Produced],
    tmp_path: Path,
) -> None:
    topic = make_topic(3)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run_once() -> None:
        df = read_events(spark, _options(broker, topic, maxEventsPerTrigger="200"))
        query = start_query(
            df.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
        )
        assert query.awaitTermination(WAIT_SECONDS)

    first = produce(topic, 700, partitions=3, wave=100)
    run_once()
    assert spark.read.parquet(str(out)).count() == 700
    second = produce(topic, 500, partitions=3, wave=100)
    run_once()
    got = [
        (r.partition, r.offset, r.key, bytes(r.value))
        for r in spark.read.parquet(str(out)).select("partition", "offset", "key", "value").collect()
    ]
    _assert_exactly_once(got, first + second)


def test_starting_offsets_latest_skips_earlier_records(
    spark: SparkSession,
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    produce: Callable[..., Produced],
) -> None:
    topic = make_topic(3)
    produce(topic, 300, partitions=3, wave=100)
    df = read_events(spark, _options(broker, topic, startingOffsets="latest"))
    name, query = _memory_query(df, available_now=False)
    try:
        # Let a few empty triggers pass first: "latest" must be resolved once,
        # not again at each trigger (which would skip the records below).
        _wait_for(
            query,
            lambda: len(query.recentProgress) >= 1 and query.status["message"] != "Initializing sources",
            "the first trigger",
        )
        later = produce(topic, 450, partitions=3, wave=150)
        _wait_for(query, lambda: spark.table(name).count() >= len(later), "450 new records")
        _assert_exactly_once(_rows(spark, name), later)
    finally:
        query.stop()


def test_topic_created_after_the_query_started_is_read_from_its_start(
    spark: SparkSession,
    broker: EmbeddedBroker,
    produce: Callable[..., Produced],
) -> None:
    topic = f"late-topic-{uuid.uuid4().hex[:8]}"
    df = read_events(spark, _options(broker, topic, startingOffsets="latest"))
    name, query = _memory_query(df, available_now=False)
    try:
        _wait_for(query, lambda: len(query.recentProgress) >= 1, "the first trigger")
        broker.create_topics({topic: 2})
        produced = produce(topic, 200, partitions=2, wave=50)
        _wait_for(query, lambda: spark.table(name).count() >= len(produced), "200 records")
        _assert_exactly_once(_rows(spark, name), produced)
    finally:
        query.stop()


def test_spark_s_source_without_its_package_says_which_to_load(
    spark: SparkSession, broker: EmbeddedBroker
) -> None:
    """The tests' shared session has no connector: asking for Spark's source names it."""
    with pytest.raises(ConnectorNotLoaded, match=re.escape(spark_kafka.PACKAGE)):
        read_events(spark, _options(broker, "any"), source=SPARK_SOURCE)
