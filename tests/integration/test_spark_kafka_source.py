"""``fencewatch run --kafka-source spark``: the job reading with Spark's own Kafka
source (streaming/spark_kafka.py, its package fetched from Maven Central on
first use) raises exactly the alerts and dead letters our Python source raises
on the same topic, and a SIGKILL and restart on its checkpoint neither loses
nor repeats an alert.

On Apache Kafka itself (``real_kafka_cluster``), not the embedded broker:
Spark's source plans a batch's end from ListOffsets, which tansu reports as the
last record batch's base offset + 1, so the tail of a topic written in batches
stays unread there (streaming/spark_kafka.py)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import orjson
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client import CollectorRegistry
from spark_cluster import fencewatch_run, keep_running, wait_until
from test_job import BAD_RECORDS, RUN_DEFAULTS, publish, read_topic, replay_alerts, wait_for
from test_job_crash import SETTLE_S, alert_ids, committed_batches, job_argv, rewind

from detectors.truth import match_key
from localkafka.cluster import LocalKafkaCluster
from producers.simulator import SimConfig, Simulator
from streaming.bucket_layout import DEFAULT_BUCKETS
from streaming.job import JobOptions, start
from streaming.metrics import Metrics

pytestmark = pytest.mark.integration

EVENTS = 12_000


def make_topic(cluster: LocalKafkaCluster, partitions: int = 1) -> str:
    name = f"spark-source-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(60)
    return name


def alerts_in(broker: LocalKafkaCluster, topic: str) -> dict[str, dict]:
    return {orjson.loads(v)["alert_id"]: orjson.loads(v) for _, v in read_topic(broker, topic)}


def dead_letter_positions(broker: LocalKafkaCluster, topic: str) -> set[tuple[int, int, str]]:
    """(source partition, source offset, reason) of every dead letter in ``topic``."""
    letters = [orjson.loads(value) for _, value in read_topic(broker, topic)]
    return {(d["source_partition"], d["source_offset"], d["reason"]) for d in letters}


@pytest.mark.timeout(900)
def test_spark_s_source_raises_our_source_s_alerts_each_once_across_a_sigkill(
    spark, real_kafka_cluster: LocalKafkaCluster, tmp_path: Path
) -> None:
    broker = real_kafka_cluster
    events = list(Simulator(SimConfig(seed=11, fault_rate=0.01, warmup_ms=3000)).events(EVENTS))
    expected = replay_alerts(events, RUN_DEFAULTS, DEFAULT_BUCKETS)
    assert len(expected) >= 20, "the simulation should raise alerts spread over several micro-batches"
    records = [(e["cluster"].encode(), orjson.dumps(e)) for e in events]
    records[100:100] = [(b"sim-1", bad) for bad, _ in BAD_RECORDS]
    source = make_topic(broker, 3)
    publish(broker, source, records)  # batched, as shippers publish

    # Our Python source, in this process's session, as fencewatch run reads by default.
    ours = JobOptions(
        bootstrap_servers=broker.bootstrap_servers,
        topic=source,
        checkpoint=str(tmp_path / "ours"),
        alerts_topic=make_topic(broker),
        dead_letter_topic=make_topic(broker),
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
    our_alerts = alerts_in(broker, ours.alerts_topic)
    assert set(our_alerts) == set(expected)
    our_letters = dead_letter_positions(broker, ours.dead_letter_topic)
    assert len(our_letters) == len(BAD_RECORDS)

    # Spark's source, through the command, killed after its first alert and restarted.
    alerts_topic, dead_topic, checkpoint = make_topic(broker), make_topic(broker), tmp_path / "spark"
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
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    assert not duplicates, f"alerts delivered twice: {duplicates}"
    streamed = alerts_in(broker, alerts_topic)
    assert set(streamed) == set(our_alerts)
    assert sorted(map(match_key, streamed.values())) == sorted(map(match_key, our_alerts.values()))
    # The same records, named by the same partition and offset.
    assert dead_letter_positions(broker, dead_topic) == our_letters
