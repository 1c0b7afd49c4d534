"""Apache Kafka itself, broken on purpose and watched by fencewatch as a user
would: no false alarm.

The session's real cluster (``real_kafka_cluster``: Kafka 4.4.0, three
controllers, three brokers) gets real traffic (idempotent producers with
acks=all, consumers in a group) and a short seeded nemesis: a broker killed,
a broker paused past replica.lag.time.max.ms (ISRs shrink and expand), the
active controller killed, an unclean election made necessary, a preferred
election, and a broker restarted with its clock 3.5 s ahead. Every node's
request log, a controller's metadata log and every controller's quorum-state
go through ``fencewatch ship`` to the embedded broker, and ``fencewatch run``
judges them; afterwards the same files are converted and replayed.

Kafka is right here, so the assertions are the absence of false alarms and
agreement with Kafka's own account: no certain alert in the job or in replay
(a possible one only where it needs a clock offset no node had), no dead
letter from any real log (every entry accounted for by API), the view's leader
epochs equal to every broker's Metadata answer for every partition, every
measured clock holding its true offset (the skewed broker's among them). The cluster is
healed at the end (every node running on a true clock) for the tests after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from detectors.requests import API_NAMES
from fencewatch.replay import replay_config
from lab.verdict import (
    Converted,
    Judged,
    PartitionEpochs,
    compare_epochs,
    convert_native,
    judge,
    kafka_leader_epochs,
    measured_clocks,
    view_leader_epochs,
)
from lab.watch import JobCounters, Watchers
from localkafka.cluster import LocalKafkaCluster
from localkafka.nemesis import (
    KILL_BROKER,
    KILL_CONTROLLER,
    PAUSE_BROKER,
    PREFERRED_ELECTION,
    SKEW_CLOCK,
    SKEW_HOLD_SECONDS,
    UNCLEAN_ELECTION,
    FaultRecord,
    Nemesis,
    plan,
)
from localkafka.traffic import Traffic, TrafficStats, create_topics, lab_topics
from streaming.broker import EmbeddedBroker

# In make test-extended, not make test: the two sources of false alarms it
# found on Kafka 4.4.0 are fixed (a controller fail-over's election silence
# taken for a clock step, tests/unit/test_real_controller_failover.py; brokers'
# late metadata, now bounded by their BrokerHeartbeat.currentMetadataOffset,
# tests/unit/test_real_broker_metadata_lag.py), and five of its six tests passed on
# 2026-12-08, but a second run the same day (0192235) found three open defects
# of the job beside replay: the job raised 822 possible alerts where replay of
# the same files raised 1 (possible verdicts hang on arrival order and on where
# the buckets' shared clock evidence lands), and the job's interval for the
# broker 3.5 s ahead was -5.578..+1.667 s, without its true offset.
pytestmark = [pytest.mark.integration, pytest.mark.extended]

SEED = 7
# Long enough for every one of FAULTS in the plan; each waits for the cluster
# to be whole again, so on a slow machine the run takes longer, not fewer faults.
PLANNED_SECONDS = 600.0
SKEW_SECONDS = 3.5
FAULTS = (KILL_BROKER, PAUSE_BROKER, KILL_CONTROLLER, UNCLEAN_ELECTION, PREFERRED_ELECTION, SKEW_CLOCK)
CLUSTER = "real-kafka"
# How far outside a measured interval a true offset may lie (the request log's
# millisecond stamps, the metadata log's batching), and half the widest the
# writing controller's interval may be.
CLOCK_TOLERANCE_SECONDS = 1.0


@dataclass
class LabRun:
    cluster: LocalKafkaCluster
    faults: list[FaultRecord]
    traffic: TrafficStats
    counters: JobCounters | None
    shipped: dict[str, str]
    job_alerts: list[str]
    converted: Converted
    judged: Judged
    kafka_epochs: dict[int, PartitionEpochs]
    skewed: dict[int, float]
    work: Path


@pytest.fixture(scope="module")
def lab_run(
    real_kafka_cluster: LocalKafkaCluster, broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LabRun]:
    cluster = real_kafka_cluster
    work = tmp_path_factory.mktemp("lab")
    suffix = uuid.uuid4().hex[:8]
    events, dead, alerts = f"lab-events-{suffix}", f"lab-dead-{suffix}", f"lab-alerts-{suffix}"
    broker.create_topics({events: 3, dead: 1, alerts: 1})
    watchers = Watchers(
        cluster,
        broker.bootstrap_servers,
        work / "fencewatch",
        cluster_name=CLUSTER,
        events_topic=events,
        dead_letter_topic=dead,
        alerts_topic=alerts,
    )
    brokers = [b.node_id for b in cluster.brokers]
    topics = lab_topics(brokers, tiered_storage=cluster.layout.tiered_storage)
    nemesis = Nemesis(
        cluster,
        plan(SEED, PLANNED_SECONDS, brokers, FAULTS, repeat=False),
        work / "schedule.jsonl",
        topics=topics,
        skew_seconds=SKEW_SECONDS,
    )
    try:
        watchers.start_job()
        watchers.start_shippers()
        create_topics(AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0}), topics)
        traffic = Traffic(cluster.bootstrap_servers, [t.name for t in topics], rate=100)
        traffic.start()
        records = nemesis.run()
        time.sleep(SKEW_HOLD_SECONDS)  # requests of the skewed broker measure its clock
        stats = traffic.stop()
        time.sleep(3)
        shipped = watchers.stop_shippers()
        counters = watchers.wait_until_judged(timeout_seconds=900)
        kafka_epochs = kafka_leader_epochs(cluster)
        converted = convert_native(cluster, work / "envelopes", CLUSTER, watchers.shipped_bytes())
        judged = judge(converted.files, replay_config())
        skewed = dict(nemesis.skewed)
        yield LabRun(
            cluster,
            records,
            stats,
            counters,
            shipped,
            list(watchers.alert_lines),
            converted,
            judged,
            kafka_epochs,
            skewed,
            work,
        )
    finally:
        watchers.stop()
        nemesis.heal()


def test_the_nemesis_inflicted_its_schedule(lab_run: LabRun) -> None:
    kinds = [r.kind for r in lab_run.faults]
    assert set(kinds) == set(FAULTS), kinds
    assert kinds[-1] == SKEW_CLOCK
    schedule = [json.loads(line) for line in (lab_run.work / "schedule.jsonl").read_text().splitlines()]
    assert [s["kind"] for s in schedule] == kinds and all(s["started"] and s["ended"] for s in schedule)
    unclean = next(r for r in lab_run.faults if r.kind == UNCLEAN_ELECTION)
    assert unclean.detail["new_leader"] == unclean.detail["follower"], unclean.detail
    assert lab_run.traffic.acknowledged > 0 and lab_run.traffic.consumed > 0


def test_no_certain_alert_and_every_possible_one_needs_a_clock_no_node_had(lab_run: LabRun) -> None:
    """Kafka is right here: no certain alert in the job or in replay. A possible
    one (a verdict that holds only at some clock offsets the evidence allows:
    a broker back from a pause has seen few requests, and its interval is
    seconds wide) must need an offset its node never had: 0, or the skewed
    broker's skew. Its condition then says what an operator's clock bound
    (``--clock-bound-ms``) would rule out."""
    assert lab_run.counters is not None, "the job's /metrics never answered"
    assert lab_run.counters.judged > 0
    job = [json.loads(line) for line in lab_run.job_alerts]
    for alerts in (job, lab_run.judged.alerts):
        certain = [a for a in alerts if a["confidence"] != "possible"]
        assert certain == [], [a["message"] for a in certain[:3]]
        for alert in alerts:
            condition = alert["clock_condition"]
            true_offsets = {0.0, lab_run.skewed.get(condition["node"], 0.0)}
            holding = [
                true
                for true in true_offsets
                if any(low <= true * 1000 <= high for low, high in condition["holds_ms"])
            ]
            assert holding == [], (alert["message"], condition["text"])
    assert sorted(a["alert_id"] for a in job) == sorted(a["alert_id"] for a in lab_run.judged.alerts)


def test_replay_command_gives_the_jobs_alerts(lab_run: LabRun) -> None:
    """``fencewatch replay`` of the converted files, as a user runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "fencewatch", "replay", "--no-progress", *map(str, lab_run.converted.files)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    replayed = sorted(json.loads(line)["alert_id"] for line in proc.stdout.splitlines() if line.strip())
    assert replayed == sorted(json.loads(line)["alert_id"] for line in lab_run.job_alerts)


# An open defect besides (2026-12-08, seed 7): the job counted one PRODUCE and
# one unchecked entry more than the request-log files hold (a record counted twice).
def test_no_dead_letter_and_every_request_log_entry_accounted_for(lab_run: LabRun) -> None:
    assert lab_run.converted.dead_letters == [], lab_run.converted.dead_letters[:3]
    assert lab_run.judged.dead_letters == [], lab_run.judged.dead_letters[:3]
    assert lab_run.counters is not None and sum(lab_run.counters.dead_letters.values()) == 0
    for name, summary in lab_run.shipped.items():
        assert " 0 dead letters" in summary and "exit" not in summary, (name, summary)
    read = Counter[str]()
    for node, stats in lab_run.converted.request_logs.items():
        assert stats.dead_letters == 0, node
        # One line an entry: read, or counted unread by its API (no entry wraps).
        assert stats.record_lines == stats.records + stats.unread + stats.dead_letters, node
        assert sum(stats.records_by_api.values()) == stats.records, node
        read.update(stats.records_by_api)
    # Brokers served these, controllers answered AlterPartition: every one read.
    for api in ("PRODUCE", "FETCH", "ALTER_PARTITION"):
        assert read[api] > 0, read
    # The job judged every request the files hold (it read them as shipped, the
    # files were read whole afterwards; the shippers stopped after the last line):
    # by API, and the entries of APIs no rule reads that were kept for their time
    # alone (RequestLogStats.bridges) as "unchecked".
    expected = Counter[str]()
    for api, count in read.items():
        expected[api if api in API_NAMES.values() else "unchecked"] += count
    assert lab_run.counters.events_by_api == dict(expected), (lab_run.counters.events_by_api, dict(expected))


def test_view_leader_epochs_equal_kafkas_for_every_partition(lab_run: LabRun) -> None:
    view = view_leader_epochs(lab_run.judged.detector, CLUSTER)
    comparison = compare_epochs(view, lab_run.kafka_epochs)
    assert len(lab_run.kafka_epochs) == len(lab_run.cluster.brokers)
    assert comparison.compared > 0
    assert comparison.differences == []


def test_every_measured_clock_holds_its_true_offset_and_the_skewed_broker_is_measured(
    lab_run: LabRun,
) -> None:
    """Each node's measured interval holds its true offset (0, or the skew); the
    skewed broker and the controller that wrote the log at the end are measured.
    How narrow a broker's interval is depends on how soon its requests carry a
    new epoch (a loaded machine's brokers learn seconds late), so only the
    writing controller's, bounded from both sides by its AlterPartition answers
    (detectors.clocks), is held narrow."""
    clocks = measured_clocks(lab_run.judged.detector, CLUSTER)
    assert lab_run.skewed, "no broker ran on a skewed clock"
    for node_id in lab_run.skewed:
        assert node_id in clocks, f"the skewed broker {node_id} has no measured clock: {clocks}"
    for node_id, interval in clocks.items():
        true = lab_run.skewed.get(node_id, 0.0)
        low, high = interval.low_ms / 1000, interval.high_ms / 1000
        assert low - CLOCK_TOLERANCE_SECONDS <= true <= high + CLOCK_TOLERANCE_SECONDS, (node_id, low, high)
    writer = lab_run.judged.detector.clusters[CLUSTER].metadata_clock.writer
    assert writer is not None and writer[1] in clocks, (writer, clocks)
    active = clocks[writer[1]]
    assert active.high_ms - active.low_ms <= 2 * CLOCK_TOLERANCE_SECONDS * 1000, active
    job = _job_clocks(lab_run.counters)
    for skewed_id, true in lab_run.skewed.items():
        low, high = job[str(skewed_id)]
        assert low is not None and high is not None
        assert low - CLOCK_TOLERANCE_SECONDS <= true <= high + CLOCK_TOLERANCE_SECONDS, (skewed_id, low, high)


def _job_clocks(counters: JobCounters | None) -> dict[str, Any]:
    assert counters is not None
    return counters.clocks
