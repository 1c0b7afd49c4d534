"""The streaming job against a real broker and a real SparkSession: the same
alerts as ``fencewatch replay`` on the same events, and bad records in the
dead-letter topic."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from detectors.config import DetectorConfig
from detectors.engine import TOO_LATE, Detector
from detectors.envelope import envelope_from_obj
from detectors.split import Split
from detectors.truth import confusion, match_key
from producers.sim_clocks import Failover, parse_clock
from producers.simulator import SimConfig, Simulator
from streaming.broker import EmbeddedBroker
from streaming.job import JobOptions, start
from streaming.kafka_source import MIN_SPLIT_EVENTS
from streaming.metrics import Metrics

pytestmark = pytest.mark.integration

# Published keyed "sim-1", each with the dead-letter class it must be counted under.
BAD_RECORDS = [
    (b'{"cluster": "sim-1", "ts_ms": 1763720000000, "kind": "request"', "malformed_json"),  # truncated
    (b'{"cluster": "sim-1", "node": 1, "ts_ms": "yesterday", "kind": "request", "body": {}}', "wrong_type"),
    (b'{"cluster": "sim-1", "node": 1, "ts_ms": 1763720000000, "kind": "gossip", "body": {}}', "wrong_type"),
    (b"\xff\xfe not utf-8", "malformed_json"),
    (
        b'{"cluster": "sim-2", "node": 1, "ts_ms": 1763720000000, "kind": "request", "body": {}}',
        "cluster_mismatch",  # the record key names another cluster
    ),
]


# What ``fencewatch run`` judges with unless told otherwise: clocks measured, DEFAULT_BUCKETS buckets.
RUN_DEFAULTS = DetectorConfig(measure_clocks=True)


def simulate(seed: int, events: int) -> tuple[list[dict], list[dict]]:
    sim = Simulator(SimConfig(seed=seed, fault_rate=0.01))
    return list(sim.events(events)), sim.truth


def replayed(events: list[dict], config: DetectorConfig | None = None) -> Detector:
    """A detector after ``events`` and the end of input, as ``fencewatch replay`` leaves it."""
    detector = Detector(config)
    for i, event in enumerate(events):
        detector.ingest(envelope_from_obj(event, f"mem:{i}", i))
    detector.flush()
    return detector


def replay_alerts(
    events: list[dict], config: DetectorConfig | None = None, buckets: int = 1
) -> dict[str, dict]:
    """What the job with ``buckets`` buckets must raise on ``events`` (detectors.split;
    one bucket: the whole cluster's detector, ``fencewatch replay``'s)."""
    if buckets == 1:
        return {a.alert_id: a.to_dict() for a in replayed(events, config).drain()}
    split = Split(buckets, config or DetectorConfig())
    for i, event in enumerate(events):
        split.ingest(envelope_from_obj(event, f"mem:{i}", i))
    return {a.alert_id: a.to_dict() for a in split.finish()}


def publish(broker: EmbeddedBroker, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 20})
    for key, value in records:
        producer.produce(topic, key=key, value=value)
        producer.poll(0)
    assert producer.flush(60) == 0


def read_topic(broker: EmbeddedBroker, topic: str) -> list[tuple[dict[str, str], bytes]]:
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": "t", "enable.partition.eof": True}
    )
    meta = consumer.list_topics(topic, timeout=10).topics[topic]
    consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
    remaining, out = set(meta.partitions), []
    while remaining:
        msg = consumer.poll(10)
        assert msg is not None, f"timed out reading {topic}"
        if msg.error():
            assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
            remaining.discard(msg.partition())
            continue
        out.append(({k: v.decode() for k, v in msg.headers() or []}, msg.value()))
    consumer.close()
    return out


def job_options(
    broker: EmbeddedBroker,
    make_topic: Callable[[int], str],
    tmp_path: Path,
    max_events_per_trigger: int,
    buckets: int | None = None,
) -> JobOptions:
    """A job on fresh topics: a 3-partition source, one-partition alerts and dead letters."""
    return JobOptions(
        bootstrap_servers=broker.bootstrap_servers,
        topic=make_topic(3),
        checkpoint=str(tmp_path / "ck"),
        alerts_topic=make_topic(1),
        dead_letter_topic=make_topic(1),
        max_events_per_trigger=max_events_per_trigger,
        trigger_seconds=0.5,
        idle_flush_ms=2_000,
        buckets=buckets,
    )


def wait_for(condition: Callable[[], bool], query, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if query.exception() is not None:
            raise AssertionError(f"query failed while waiting for {what}: {query.exception()}")
        if condition():
            return
        query.awaitTermination(0.5)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@pytest.mark.parametrize(
    ("buckets", "batch_events"),
    # 64 buckets is extended: tests/unit/test_buckets.py checks it in one process.
    [(1, 5_000), (7, 3 * MIN_SPLIT_EVENTS), pytest.param(64, 5_000, marks=pytest.mark.extended)],
)
def test_streaming_alerts_equal_replay_and_ground_truth(
    spark, broker, make_topic, tmp_path: Path, buckets, batch_events
):
    """Whatever the number of buckets a cluster is split into (detectors.buckets),
    and whether a batch of the cluster's partition is read in one task or in
    pieces (kafka_source's minPartitions: two tasks on local[2] with 7 buckets)."""
    events, truth = simulate(seed=7, events=20_000)
    expected = replay_alerts(events)
    table = confusion(expected.values(), truth)
    assert all(c["fp"] == 0 and c["fn"] == 0 for c in table.values()), table
    options = job_options(broker, make_topic, tmp_path, max_events_per_trigger=batch_events, buckets=buckets)
    source, alerts_topic, dead_topic = options.topic, options.alerts_topic, options.dead_letter_topic
    records = [(e["cluster"].encode(), orjson.dumps(e)) for e in events]
    records[100:100] = [(b"sim-1", bad) for bad, _ in BAD_RECORDS]
    publish(broker, source, records)

    metrics = Metrics(CollectorRegistry())
    # Spark reports an idle query this often (default 10 s): the liveness
    # gauge must keep moving while no batch runs.
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "1000")
    query = start(spark, options, console=None, metrics=metrics)
    try:
        wait_for(lambda: len(read_topic(broker, alerts_topic)) >= len(expected), query, 400, "every alert")

        # Once idle, the job runs the two empty batches its source plans (the
        # idle flush runs in them; a late extra or duplicate alert would show)
        # and then no batch at all: no-data batches are off.
        def idle_batches() -> list[tuple[int, dict]]:
            # Spark's idle reports are progress entries too, without an addBatch phase.
            return [
                (p["batchId"], p["durationMs"])
                for p in query.recentProgress
                if p["numInputRows"] == 0 and "addBatch" in p["durationMs"]
            ]

        wait_for(lambda: len(idle_batches()) >= 2, query, 60, "two idle batches")
        time.sleep(3 * options.idle_flush_ms / 1000)
        assert len(idle_batches()) == 2, idle_batches()
        last_report = metrics.registry.get_sample_value("fencewatch_last_batch_timestamp_seconds")
        assert last_report is not None and last_report > time.time() - options.idle_flush_ms / 1000
    finally:
        query.stop()
    check_metrics(metrics, events, records, expected, source, query)
    delivered = read_topic(broker, alerts_topic)
    ids = [h["fencewatch-id"] for h, _ in delivered]
    assert len(ids) == len(set(ids)), "an alert was delivered twice"
    streamed = {orjson.loads(v)["alert_id"]: orjson.loads(v) for _, v in delivered}
    assert set(streamed) == set(expected)
    assert sorted(match_key(a) for a in streamed.values()) == sorted(match_key(a) for a in expected.values())

    letters = [orjson.loads(v) for _, v in read_topic(broker, dead_topic)]
    assert len(letters) == len(BAD_RECORDS)
    assert all(letter["reason"] and letter["source_offset"] is not None for letter in letters)
    assert any("kind" in letter["reason"] for letter in letters)
    assert any("malformed JSON" in letter["reason"] for letter in letters)


# 7 buckets is extended: test_job_crash.py runs the job as users do (8 buckets sharing
# clocks) against the same split over its topic, and tests/unit/test_clock_exchange.py
# checks the sharing in one process.
@pytest.mark.parametrize("buckets", [1, pytest.param(7, marks=pytest.mark.extended)])
def test_a_skewed_history_gives_replay_s_alerts_with_clocks_measured(
    spark, broker, make_topic, tmp_path: Path, buckets: int
):
    """Issue 23 through the job: broker 1's clock 5 s ahead and a fail-over onto
    a controller 3 s behind. One bucket raises replay's alerts. Seven buckets
    measure each clock once for all of them: after each micro-batch the job
    publishes their bounds to the event topic, which every bucket reads
    (detectors.clock_exchange), and raises what the same split raises in one
    process (detectors.split) on the topic as it then stands, read in its
    order: the clock evidence is input like the rest. Either way the ground
    truth, not one false alarm."""
    sim = Simulator(
        SimConfig(
            seed=11,
            fault_rate=0.01,
            warmup_ms=3000,
            clocks=(parse_clock("3001=-3s"), parse_clock("1=+5s")),
            failovers=(Failover(15_000, to=3001),),
        )
    )
    events = list(sim.events(20_000))
    config = RUN_DEFAULTS
    expected = replay_alerts(events, config, buckets)
    table = confusion(expected.values(), sim.truth)
    assert all(c["fp"] == 0 for c in table.values()), table
    assert sum(c["tp"] for c in table.values()) >= 0.9 * len(sim.truth)
    assert sum(c["fp"] for c in confusion(replay_alerts(events).values(), sim.truth).values()) > 0

    options = replace(
        job_options(broker, make_topic, tmp_path, max_events_per_trigger=4_000, buckets=buckets),
        detector=config,
    )
    publish(broker, options.topic, [(e["cluster"].encode(), orjson.dumps(e)) for e in events])
    query = start(spark, options, console=None, metrics=Metrics(CollectorRegistry()))
    try:
        if buckets == 1:
            wait_for(
                lambda: len(read_topic(broker, options.alerts_topic)) >= len(expected),
                query,
                400,
                "every alert",
            )
        else:
            # Which alerts to expect is known once the topic's clock evidence is: wait
            # until every event is read and the idle flush's two empty batches ran.
            wait_for(
                lambda: idle_after(query, len(events)), query, 400, "every event read and the idle flush"
            )
        time.sleep(3 * options.idle_flush_ms / 1000)  # a late extra alert would show
    finally:
        query.stop()
    streamed = {
        orjson.loads(v)["alert_id"]: orjson.loads(v) for _, v in read_topic(broker, options.alerts_topic)
    }
    if buckets > 1:
        topic = [orjson.loads(v) for _, v in read_topic(broker, options.topic)]
        assert any(record["kind"] == "clock_evidence" for record in topic)
        expected = replay_alerts(topic, config, buckets)
        table = confusion(expected.values(), sim.truth)
        assert all(c["fp"] == 0 for c in table.values()), table
        assert sum(c["tp"] for c in table.values()) >= 0.9 * len(sim.truth)
    assert set(streamed) == set(expected)

    def intervals(alerts: dict[str, dict]) -> list[tuple]:
        """Each alert's clock evidence: the interval its verdict allowed for."""
        return sorted(
            (alert_id, e["node"], e["offset_low_ms"], e["offset_high_ms"])
            for alert_id, a in alerts.items()
            for e in a["evidence"]
            if e["role"] == "clock"
        )

    assert intervals(streamed) == intervals(expected) != []


def idle_after(query, events: int) -> bool:
    """Whether the query read at least ``events`` records and its two newest
    batches read none (the source's idle ticks, which run the idle flush)."""
    progress = query.recentProgress
    read = sum(p["numInputRows"] for p in progress)
    newest = [p for p in progress if "addBatch" in p["durationMs"]][-2:]
    return read >= events and len(newest) == 2 and all(p["numInputRows"] == 0 for p in newest)


def check_metrics(metrics: Metrics, events, records, expected, topic: str, query) -> None:
    """The job's metrics tell the same story as its output."""
    registry = metrics.registry

    def total(name: str, **labels: str) -> float:
        return sum(
            sample.value
            for family in registry.collect()
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        )

    wait_for(lambda: registry.get_sample_value("fencewatch_query_running") == 0, query, 30, "query stopped")
    assert total("fencewatch_events_total", cluster="sim-1") == len(events)
    assert total("fencewatch_dead_letters_total", cluster="sim-1") == len(BAD_RECORDS)
    for reason in {kind for _, kind in BAD_RECORDS}:
        expected_letters = sum(kind == reason for _, kind in BAD_RECORDS)
        assert total("fencewatch_dead_letters_total", cluster="sim-1", reason=reason) == expected_letters
    assert total("fencewatch_alerts_total", cluster="sim-1") == len(expected)
    by_rule = {}
    for alert in expected.values():
        by_rule[alert["rule"]] = by_rule.get(alert["rule"], 0) + 1
    for rule, n in by_rule.items():
        assert total("fencewatch_alerts_total", cluster="sim-1", rule=rule) == n, rule
    assert total("fencewatch_source_events_total", topic=topic) == len(records)
    assert total("fencewatch_source_lag_events", topic=topic) == 0
    assert total("fencewatch_batches_total") >= 1
    assert total("fencewatch_batch_duration_seconds_count") == total("fencewatch_batches_total")
    assert total("fencewatch_sink_records_total", sink="alerts_topic") == len(expected)
    assert total("fencewatch_sink_records_total", sink="dead_letter_topic") == len(BAD_RECORDS)
    assert total("fencewatch_tracked_partitions", cluster="sim-1") > 0
    assert total("fencewatch_brokers", cluster="sim-1", state="registered") > 0


def test_a_re_shipped_slice_changes_no_alert(spark, broker, make_topic, tmp_path: Path):
    """A shipper that crashed re-ships what it had not marked done: the job
    raises exactly replay's alerts on the clean input, and counts the rest as
    duplicates or too late to judge, never as dead letters."""
    events, _ = simulate(seed=11, events=24_000)
    expected = replay_alerts(events)
    assert expected
    options = job_options(broker, make_topic, tmp_path, max_events_per_trigger=4_000)
    source, alerts_topic, dead_topic = options.topic, options.alerts_topic, options.dead_letter_topic
    records = [(e["cluster"].encode(), orjson.dumps(e)) for e in events]
    reshipped = records[3_000:4_000] + records[-500:]  # an old slice and the tail
    publish(broker, source, records + reshipped)

    metrics = Metrics(CollectorRegistry())
    query = start(spark, options, console=None, metrics=metrics)
    try:
        consumed = lambda: metrics.registry.get_sample_value(  # noqa: E731
            "fencewatch_source_events_total", {"topic": source}
        )
        wait_for(lambda: consumed() == len(records) + len(reshipped), query, 400, "every record read")
        wait_for(lambda: len(read_topic(broker, alerts_topic)) >= len(expected), query, 120, "every alert")
        query.processAllAvailable()
    finally:
        query.stop()
    streamed = [orjson.loads(v)["alert_id"] for _, v in read_topic(broker, alerts_topic)]
    assert sorted(streamed) == sorted(expected)
    assert read_topic(broker, dead_topic) == []
    # Each re-shipped record is a duplicate (within its grace window, or of an
    # offset-ordered log) or too late to judge (its window closed long ago).
    duplicates = metrics.registry.get_sample_value("fencewatch_duplicate_records_total", {"cluster": "sim-1"})
    too_late = metrics.registry.get_sample_value(
        "fencewatch_unverified_events_total", {"cluster": "sim-1", "reason": TOO_LATE}
    )
    assert (duplicates or 0) + (too_late or 0) == len(reshipped)
