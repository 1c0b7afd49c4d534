"""Offsets that vanish from the event topic are reported, never skipped in silence.

The embedded broker (tansu) implements neither DeleteRecords nor retention,
so offsets vanish here the one way it supports: the topic is deleted and
recreated with fewer records while a query has read it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from streaming.broker import EmbeddedBroker
from streaming.kafka_source import read_events
from streaming.listener import JobListener
from streaming.metrics import Metrics
from streaming.query_start import start_query

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

Produced = list[tuple[int, int, str, bytes]]
WAIT_SECONDS = 180.0


def recreate(broker: EmbeddedBroker, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again, empty, once the deletion shows in the metadata."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 30
    while topic in admin.list_topics(timeout=5).topics:
        assert time.monotonic() < deadline, f"{topic} still listed after its deletion"
        time.sleep(0.1)
    broker.create_topics({topic: partitions})


def rewind_last_commit(checkpoint: Path) -> int:
    """Leave ``checkpoint`` as a crash after its last batch was planned, before
    Spark committed it: the restart runs that batch's planned range again."""
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    last = commits[-1]
    for name in (str(last), f".{last}.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    return last


class Run:
    """One availableNow run of the source over ``checkpoint``, its rows
    gathered by foreachBatch and its progress fed to a JobListener."""

    def __init__(self, spark: SparkSession, broker: EmbeddedBroker, topic: str, checkpoint: Path):
        self.spark, self.broker, self.topic, self.checkpoint = spark, broker, topic, checkpoint
        self.metrics = Metrics(CollectorRegistry())
        self.rows: list[tuple[int, int, bytes]] = []

    def __call__(self) -> None:
        name = f"q_{uuid.uuid4().hex[:10]}"
        listener = JobListener(self.metrics, name, self.topic)
        self.spark.streams.addListener(listener)
        options = {
            "kafka.bootstrap.servers": self.broker.bootstrap_servers,
            "subscribe": self.topic,
            "startingOffsets": "earliest",
            # How long a read waits at an end of log inside its range before
            # it reports the rest as lost.
            "readTimeoutMs": "3000",
        }

        def gather(batch: Any, batch_id: int) -> None:
            self.rows.extend((r.partition, r.offset, bytes(r.value)) for r in batch.collect())

        try:
            query = start_query(
                read_events(self.spark, options)
                .writeStream.foreachBatch(gather)
                .option("checkpointLocation", str(self.checkpoint))
                .queryName(name)
                .trigger(availableNow=True)
            )
            assert query.awaitTermination(WAIT_SECONDS), "the availableNow query did not finish"
            assert query.exception() is None, query.exception()
            # The listener hears the last progress event asynchronously.
            deadline = time.monotonic() + 30
            while self.metrics.registry.get_sample_value("fencewatch_query_running") != 0:
                assert time.monotonic() < deadline, "the listener never heard the query stop"
                time.sleep(0.1)
        finally:
            self.spark.streams.removeListener(listener)

    def lost(self) -> float:
        value = self.metrics.registry.get_sample_value(
            "fencewatch_source_offsets_lost_total", {"topic": self.topic}
        )
        return value or 0.0

    def events(self) -> float:
        value = self.metrics.registry.get_sample_value(
            "fencewatch_source_events_total", {"topic": self.topic}
        )
        return value or 0.0


def test_offsets_gone_from_a_planned_batch_are_logged_and_counted(
    spark: SparkSession,
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    produce: Callable[..., Produced],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A batch planned over [0, 300) is re-run after a crash, but the topic was
    recreated meanwhile and holds 100 records: the read gets those and reports
    offsets [100, 300) lost, on the driver: a warning and the counter."""
    topic = make_topic(1)
    checkpoint = tmp_path / "checkpoint"
    first = Run(spark, broker, topic, checkpoint)
    old = produce(topic, 300, partitions=1, wave=100)
    first()
    assert len(first.rows) == len(old) and first.lost() == 0
    rewind_last_commit(checkpoint)
    recreate(broker, topic, 1)
    new = produce(topic, 100, partitions=1, wave=100)

    second = Run(spark, broker, topic, checkpoint)
    with caplog.at_level(logging.WARNING, logger="streaming.listener"):
        second()
    assert second.lost() == 200
    lost_lines = [r.getMessage() for r in caplog.records if "vanished" in r.getMessage()]
    assert lost_lines == [
        f"topic {topic} partition 0: 200 offsets [100, 300) vanished before the job read them (retention, "
        "truncation, or the topic was deleted and recreated); their records were not judged"
    ]
    # Loss rows are reports, not records: neither in the output nor in the record count.
    assert {value for _, _, value in second.rows} == {value for _, _, _, value in new}
    assert second.events() == len(second.rows)


def test_a_recreated_topic_is_read_from_its_start(
    spark: SparkSession,
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    produce: Callable[..., Produced],
    tmp_path: Path,
) -> None:
    """The query had read 300 records when the topic was recreated with 150: its
    log now ends before the query's position, and the query reads the new log
    from its start (startingOffsets earliest), each record once; nothing that
    was planned vanished, so nothing is counted lost."""
    topic = make_topic(1)
    checkpoint = tmp_path / "checkpoint"
    first = Run(spark, broker, topic, checkpoint)
    produce(topic, 300, partitions=1, wave=100)
    first()
    recreate(broker, topic, 1)
    new = produce(topic, 150, partitions=1, wave=50)

    second = Run(spark, broker, topic, checkpoint)
    second()
    assert sorted(second.rows) == sorted((p, off, value) for p, off, _, value in new)
    assert second.lost() == 0
