"""``fencewatch run --kafka-source spark``: the job reading with Spark's own Kafka
source (streaming/spark_kafka.py, its package fetched from Maven Central on
first use) raises exactly the alerts and dead letters our Python source raises
on the same topic, and a SIGKILL and restart on its checkpoint neither loses
nor repeats an alert.

The topic is written one record per produce batch: Spark's source plans a
batch's end from ListOffsets, which the embedded broker reports as the last
batch's base offset + 1, so a multi-record batch's tail would stay unread
(streaming/spark_kafka.py); with one record a batch that offset is the log end,
as a Kafka broker reports it."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry
from spark_cluster import fencewatch_run, keep_running, wait_until
from test_job import BAD_RECORDS, RUN_DEFAULTS, read_topic, replay_alerts, wait_for
from test_job_crash import SETTLE_S, alert_ids, committed_batches, job_argv, rewind

from detectors.truth import match_key
from producers.simulator import SimConfig, Simulator
from streaming.broker import EmbeddedBroker
from streaming.bucket_layout import DEFAULT_BUCKETS
from streaming.job import JobOptions, start
from streaming.metrics import Metrics

pytestmark = pytest.mark.integration

EVENTS = 12_000


def publish_one_per_batch(broker: EmbeddedBroker, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "batch.num.messages": 1})
    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    assert producer.flush(60) == 0


def alerts_in(broker: EmbeddedBroker, topic: str) -> dict[str, dict]:
    return {orjson.loads(v)["alert_id"]: orjson.loads(v) for _, v in read_topic(broker, topic)}


def dead_letter_positions(broker: EmbeddedBroker, topic: str) -> set[tuple[int, int, str]]:
    """(source partition, source offset, reason) of every dead letter in ``topic``."""
    letters = [orjson.loads(value) for _, value in read_topic(broker, topic)]
    return {(d["source_partition"], d["source_offset"], d["reason"]) for d in letters}


@pytest.mark.timeout(900)
def test_spark_s_source_raises_our_source_s_alerts_each_once_across_a_sigkill(
    spark, broker: EmbeddedBroker, make_topic, tmp_path: Path
) -> None:
    events = list(Simulator(SimConfig(seed=11, fault_rate=0.01, warmup_ms=3000)).events(EVENTS))
    expected = replay_alerts(events, RUN_DEFAULTS, DEFAULT_BUCKETS)
    assert len(expected) >= 20, "the simulation should raise alerts spread over several micro-batches"
    records = [(e["cluster"].encode(), orjson.dumps(e)) for e in events]
    records[100:100] = [(b"sim-1", bad) for bad, _ in BAD_RECORDS]
    source = make_topic(3)
    publish_one_per_batch(broker, source, records)

    # Our Python source, in this process's session, as fencewatch run reads by default.
    ours = JobOptions(
        bootstrap_servers=broker.bootstrap_servers,
        topic=source,
        checkpoint=str(tmp_path / "ours"),
        alerts_topic=make_topic(1),
        dead_letter_topic=make_topic(1),
        max_events_per_trigger=3000,
        trigger_seconds=0.5,
        idle_flush_ms=2000,
        detector=RUN_DEFAULTS,
    )
    query = start(spark, ours, console=None, metrics=Metrics(CollectorRegistry()))
    try:
        wait_for(lambda: set(alert_ids(broker, ours.alerts_topic)) >= set(expected), query, 400, "our alerts")
        time.sleep(SETTLE_S)  # a late extra alert would show
    finally:
        query.stop()
    our_alerts = {
        orjson.loads(v)["alert_id"]: orjson.loads(v) for _, v in read_topic(broker, ours.alerts_topic)
    }
    assert set(our_alerts) == set(expected)
    our_letters = dead_letter_positions(broker, ours.dead_letter_topic)
    assert len(our_letters) == len(BAD_RECORDS)

    # Spark's source, through the command, killed after its first alert and restarted.
    alerts_topic, dead_topic, checkpoint = make_topic(1), make_topic(1), tmp_path / "spark"
    argv = [*job_argv(broker, source, alerts_topic, dead_topic, checkpoint), "--kafka-source", "spark"]
    first, second = fencewatch_run(argv, tmp_path / "run-1.log"), fencewatch_run(argv, tmp_path / "run-2.log")
    try:
        first.start()
        # The first run may download the connector (about 10 MB) before Spark starts.
        wait_until(lambda: len(alert_ids(broker, alerts_topic)) > 0, "the first alert", 400, alive=[first])
        first.kill()
        killed_wall = time.time()
        before = read_topic(broker, alerts_topic)
        assert len({h["fencewatch-id"] for h, _ in before}) < len(expected), (
            "every alert was out before the kill: the crash came too late to test a restart"
        )
        last = max(int(h["fencewatch-batch"]) for h, _ in before)
        if last in committed_batches(checkpoint):
            # As in test_job_crash: a kill between the sink's delivery and the commit.
            rewind(checkpoint, last)
        second.start()
        wait_until(
            lambda: set(alert_ids(broker, alerts_topic)) >= set(expected),
            "every alert after the restart",
            400,
            alive=[second],
        )
        assert (checkpoint / "commits" / str(last)).stat().st_mtime > killed_wall, (
            f"the restart did not re-run batch {last}"
        )
        keep_running(second, SETTLE_S)
        code = second.stop()
        assert code in (0, 130), f"the restarted job stopped with {code}:\n{second.log_tail()}"
    finally:
        first.kill()
        second.kill()

    ids = alert_ids(broker, alerts_topic)
    assert len(ids) == len(set(ids)), (
        f"alerts delivered twice: {sorted({i for i in ids if ids.count(i) > 1})}"
    )
    streamed = {orjson.loads(v)["alert_id"]: orjson.loads(v) for _, v in read_topic(broker, alerts_topic)}
    assert set(streamed) == set(our_alerts)
    assert sorted(match_key(a) for a in streamed.values()) == sorted(
        match_key(a) for a in our_alerts.values()
    )
    # The same records, named by the same partition and offset.
    assert dead_letter_positions(broker, dead_topic) == our_letters
