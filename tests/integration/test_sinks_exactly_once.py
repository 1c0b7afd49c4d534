"""The alerts and dead-letter topic sinks against the real broker, with publish
marks kept through a real SparkSession's Hadoop FileSystem: a re-run batch
publishes nothing twice, the read-back is bounded by the marks and fails
loudly, and compacted topics are refused.

A new ``Sinks`` on the same checkpoint is what a restarted job builds: each
test "crashes" by dropping one and calling the next with the batch Spark
would run first.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from test_job import read_topic

from fencewatch.spark_console import query_failed
from streaming.broker import EmbeddedBroker, free_port
from streaming.delivery_ledger import MARKS_DIRECTORY, DeliveryLedger, PublishMark
from streaming.schema import ALERT, DEAD_LETTER, OUTPUT_SCHEMA
from streaming.sinks import CompactedSinkTopic, DeliveryFailed, Sinks, TopicSink, refuse_compacted_topics

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.integration


def rows(spark: SparkSession, alerts: Iterable[str] = (), letters: Iterable[str] = ()) -> DataFrame:
    """A micro-batch of the operator's output: alerts and dead letters with these ids."""
    data = [(ALERT, "c1", i, None, None, None, orjson.dumps({"alert_id": i}).decode()) for i in alerts]
    data += [(DEAD_LETTER, "c1", i, None, 0, 1, orjson.dumps({"position": i}).decode()) for i in letters]
    return spark.createDataFrame(data, OUTPUT_SCHEMA)


class Job:
    """The sinks of one job life on ``checkpoint``."""

    def __init__(self, spark: SparkSession, broker: EmbeddedBroker, alerts: str, dead: str, checkpoint: Path):
        self.spark = spark
        self.sinks = Sinks(
            TopicSink(broker.bootstrap_servers, alerts, {}),
            TopicSink(broker.bootstrap_servers, dead, {}),
            DeliveryLedger(spark, str(checkpoint)),
            console=None,
        )

    def batch(self, batch_id: int, alerts: Iterable[str] = (), letters: Iterable[str] = ()) -> None:
        self.sinks(rows(self.spark, alerts, letters), batch_id)

    def crash(self) -> None:
        self.sinks.close()


def ids(broker: EmbeddedBroker, topic: str) -> list[str]:
    return [headers["fencewatch-id"] for headers, _ in read_topic(broker, topic)]


@pytest.fixture
def topics(make_topic: Callable[..., str]) -> tuple[str, str]:
    return make_topic(1), make_topic(1)


def read_back(caplog: pytest.LogCaptureFixture, topic: str) -> str:
    """The sink's log line saying what it read back from ``topic``."""
    messages = [r.getMessage() for r in caplog.records]
    found = [m for m in messages if m.startswith("read back") and f"from topic {topic}," in m]
    assert len(found) == 1, messages
    return found[0]


def test_a_rerun_batch_publishes_nothing_twice_and_reads_back_only_past_its_mark(
    spark: SparkSession,
    broker: EmbeddedBroker,
    topics: tuple[str, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    alerts, dead = topics
    first = Job(spark, broker, alerts, dead, tmp_path)
    first.batch(0, alerts=["a1", "a2", "a3"], letters=["d1"])
    first.batch(1)  # nothing to publish: no mark
    first.batch(2, alerts=["a4", "a5"])
    first.crash()  # after batch 2 published, before Spark committed it

    with caplog.at_level(logging.INFO, logger="streaming.sinks"):
        second = Job(spark, broker, alerts, dead, tmp_path)
        second.batch(2, alerts=["a4", "a5"])
        second.batch(3, alerts=["a6"], letters=["d2"])
    assert ids(broker, alerts) == ["a1", "a2", "a3", "a4", "a5", "a6"]
    assert ids(broker, dead) == ["d1", "d2"]
    # Batch 2's mark holds the ends before it published: 3 alerts, 1 dead letter.
    assert read_back(caplog, alerts) == (
        f"read back 2 delivered ids from topic {alerts}, from offsets {{0: 3}} (-2: the log start) to the end"
    )
    assert read_back(caplog, dead).startswith(
        f"read back 0 delivered ids from topic {dead}, from offsets {{0: 1}}"
    )
    # Only the newest mark is kept.
    assert sorted(p.name for p in (tmp_path / MARKS_DIRECTORY).iterdir() if not p.name.startswith(".")) == [
        "3"
    ]


def test_a_crash_before_spark_commits_the_next_batch_costs_one_batch_of_read_back(
    spark: SparkSession,
    broker: EmbeddedBroker,
    topics: tuple[str, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Spark committed batch 1, then the job died: batch 2 runs first and never
    published; reading back from batch 1's mark is enough and bounded."""
    alerts, dead = topics
    first = Job(spark, broker, alerts, dead, tmp_path)
    first.batch(0, alerts=["a1", "a2"])
    first.batch(1, alerts=["a3"])
    first.crash()

    with caplog.at_level(logging.INFO, logger="streaming.sinks"):
        second = Job(spark, broker, alerts, dead, tmp_path)
        second.batch(2, alerts=["a4"])
    assert ids(broker, alerts) == ["a1", "a2", "a3", "a4"]
    assert read_back(caplog, alerts).startswith(
        f"read back 1 delivered ids from topic {alerts}, from offsets {{0: 2}}"
    )


def test_a_crash_between_the_mark_and_the_publish_reads_back_nothing_old(
    spark: SparkSession,
    broker: EmbeddedBroker,
    topics: tuple[str, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Batch 1 wrote its mark at the true end (3), then died before publishing.
    The embedded broker's ListOffsets still says 1 there (one multi-record
    batch, NOTES.md): the read-back must not take that for a truncated topic
    and read from the log start."""
    alerts, dead = topics
    first = Job(spark, broker, alerts, dead, tmp_path)
    first.batch(0, alerts=["a1", "a2", "a3"])
    sinks = first.sinks
    sinks.ledger.record(
        PublishMark(1, {s.topic: s.end_offsets() for s in (sinks.alerts, sinks.dead_letters)})
    )
    first.crash()
    lister = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "lag-check"})
    try:
        listed_end = lister.get_watermark_offsets(TopicPartition(alerts, 0), timeout=10, cached=False)[1]
    finally:
        lister.close()
    assert listed_end < 3, "the test must exercise the watermark quirk"

    with caplog.at_level(logging.INFO, logger="streaming.sinks"):
        Job(spark, broker, alerts, dead, tmp_path).batch(1, alerts=["a4"])
    assert ids(broker, alerts) == ["a1", "a2", "a3", "a4"]
    assert read_back(caplog, alerts).startswith(
        f"read back 0 delivered ids from topic {alerts}, from offsets {{0: 3}}"
    )


def test_without_a_mark_the_read_back_starts_at_the_log_start(
    spark: SparkSession,
    broker: EmbeddedBroker,
    topics: tuple[str, str],
    tmp_path: Path,
) -> None:
    """A fresh checkpoint on topics an earlier checkpoint's job wrote to: every
    id there counts (the new job recomputes the same alerts)."""
    alerts, dead = topics
    Job(spark, broker, alerts, dead, tmp_path / "old").batch(0, alerts=["a1", "a2"], letters=["d1"])
    fresh = Job(spark, broker, alerts, dead, tmp_path / "new")
    fresh.batch(0, alerts=["a1", "a2", "a3"], letters=["d1"])
    assert ids(broker, alerts) == ["a1", "a2", "a3"]
    assert ids(broker, dead) == ["d1"]


def test_a_topic_recreated_since_the_mark_is_read_back_whole(
    spark: SparkSession,
    broker: EmbeddedBroker,
    topics: tuple[str, str],
    tmp_path: Path,
) -> None:
    """Batch 1's mark says offset 3, but the alerts topic was recreated and now
    ends before it. The read-back must read the new log from its start (the
    embedded broker answers a fetch past the end with nothing at all, so a
    read from the mark would only time out)."""
    alerts, dead = topics
    first = Job(spark, broker, alerts, dead, tmp_path)
    first.batch(0, alerts=["a1", "a2", "a3"])
    first.batch(1, alerts=["a4", "a5"])
    first.crash()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.delete_topics([alerts])[alerts].result(30)
    deadline = time.monotonic() + 30
    while alerts in admin.list_topics(timeout=5).topics:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    broker.create_topics({alerts: 1})

    second = Job(spark, broker, alerts, dead, tmp_path)
    second.batch(1, alerts=["a4", "a5"])  # the new topic lacks them: published
    second.crash()
    third = Job(spark, broker, alerts, dead, tmp_path)
    third.batch(1, alerts=["a4", "a5"])  # batch 1's first mark (offset 3) is past the new end
    assert ids(broker, alerts) == ["a4", "a5"]


def test_a_sink_that_cannot_reach_the_broker_fails_in_one_line_and_keeps_librdkafka_quiet(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Reading back and publishing, each fails with the sink's one line
    (``<what> -- <what to do>``, naming the topic and librdkafka's cause); the
    clients' failed connections, several log lines a second, stay off stderr,
    and are logged at DEBUG only (at ERROR, Python's last-resort handler would
    print them in a job that configures no logging)."""
    caplog.set_level(logging.DEBUG, logger="streaming.sinks")
    from pyspark.sql import Row

    dead = f"127.0.0.1:{free_port()}"
    sink = TopicSink(dead, "fencewatch-alerts", {}, timeout_s=2)
    try:
        with pytest.raises(DeliveryFailed) as reading:
            sink.recover({})
        with pytest.raises(DeliveryFailed) as publishing:
            sink.publish([Row(cluster="c1", payload="{}", id="a1")], 0)
    finally:
        sink.close()
    assert re.fullmatch(
        r"cannot read the metadata of topic fencewatch-alerts: .+ -- check that --bootstrap-servers is "
        r"reachable and the job may Describe and Read the topic",
        str(reading.value),
    )
    assert re.fullmatch(
        r"1 record\(s\) to topic fencewatch-alerts not delivered within 2s: .*Connect to ipv4#"
        + re.escape(dead)
        + r" failed: Connection refused.* -- check that the brokers are up and reachable from the Spark "
        r"driver and the job may Write the topic; started again with the same checkpoint, the job "
        r"publishes them then",
        str(publishing.value),
    )
    assert "Connect to" not in capfd.readouterr().err
    connecting = [r for r in caplog.records if "Connect to" in r.getMessage()]
    assert connecting and {r.levelno for r in connecting} == {logging.DEBUG}


def test_a_sink_failing_in_a_query_ends_the_job_with_its_one_line(
    spark: SparkSession, tmp_path: Path
) -> None:
    """What ``fencewatch run`` prints when its sinks lose the broker under a
    running query: Spark wraps the sink's error in a foreachBatch failure and a
    stack trace, and the command prints the sink's line (query_failed)."""
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import functions as F

    dead = f"127.0.0.1:{free_port()}"
    sinks = Sinks(
        TopicSink(dead, "fencewatch-alerts", {}, timeout_s=2),
        TopicSink(dead, "fencewatch-dead-letters", {}, timeout_s=2),
        DeliveryLedger(spark, str(tmp_path / "ck")),
        console=None,
    )
    alerts = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 5)
        .load()
        .select(
            F.lit(ALERT).alias("record_type"),
            F.lit("c1").alias("cluster"),
            F.concat(F.lit("a"), F.col("value").cast("string")).alias("id"),
            F.col("value").alias("ts_ms"),
            F.lit(None).cast("int").alias("source_partition"),
            F.lit(None).cast("long").alias("source_offset"),
            F.lit("{}").alias("payload"),
        )
    )
    query = alerts.writeStream.foreachBatch(sinks).option("checkpointLocation", str(tmp_path / "ck")).start()
    try:
        with pytest.raises(StreamingQueryException) as failed:
            query.awaitTermination(120)
    finally:
        query.stop()
        sinks.close()
    with pytest.raises(SystemExit) as ended:
        query_failed("fencewatch run", failed.value, "spark.log", False, "see the log")
    line = str(ended.value)
    assert "\n" not in line
    assert re.fullmatch(
        r"fencewatch run: the streaming job stopped: cannot read the metadata of topic fencewatch-alerts: "
        r".+ -- check that --bootstrap-servers is reachable and the job may Describe and Read the topic; "
        r"details in spark\.log",
        line,
    ), line


def test_publish_marks_keep_the_first_of_a_batch_and_skip_unreadable_ones(
    spark: SparkSession, tmp_path: Path
) -> None:
    ledger = DeliveryLedger(spark, f"file://{tmp_path}")
    assert ledger.newest(5) is None
    ledger.record(PublishMark(4, {"alerts": {0: 10}}))
    ledger.record(PublishMark(4, {"alerts": {0: 12}}))  # a re-run of batch 4
    assert ledger.newest(4) == PublishMark(4, {"alerts": {0: 10}})
    assert ledger.newest(3) is None  # a mark of a later batch than the first one run
    (tmp_path / MARKS_DIRECTORY / "5").write_bytes(b'{"batch_id": 5, "ends"')  # damaged
    assert ledger.newest(6) == PublishMark(4, {"alerts": {0: 10}})
    ledger.record(PublishMark(7, {"alerts": {0: 15}, "dead": {}}))
    assert ledger.newest(9) == PublishMark(7, {"alerts": {0: 15}, "dead": {}})
    assert sorted(p.name for p in (tmp_path / MARKS_DIRECTORY).iterdir() if not p.name.startswith(".")) == [
        "7"
    ]


def test_compacted_alerts_or_dead_letter_topics_are_refused(broker: EmbeddedBroker, make_topic) -> None:
    plain = make_topic(1)
    compacted = f"{plain}-compacted"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    policy = {"cleanup.policy": "compact,delete"}
    admin.create_topics([NewTopic(compacted, 1, 1, config=policy)])[compacted].result(30)

    refuse_compacted_topics(broker.bootstrap_servers, [plain, f"{plain}-not-created-yet"], {})
    with pytest.raises(CompactedSinkTopic) as refused:
        refuse_compacted_topics(broker.bootstrap_servers, [plain, compacted], {})
    message = str(refused.value)
    assert "\n" not in message
    assert f"topic {compacted} has cleanup.policy=compact,delete" in message
    assert f"--entity-name {compacted} --add-config cleanup.policy=delete" in message
