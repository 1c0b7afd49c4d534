"""``fencewatch probe`` against the embedded tansu broker, which does not fence by
leader epoch (NOTES.md): a future currentLeaderEpoch and a partition that does not
exist are served, OffsetForLeaderEpoch is not advertised. The probe reports exactly
that, for 100 partitions, to stdout and the alerts topic; and it runs beside a job
(``fencewatch run --probe-interval``) as a thread. How long the 100 partitions take
is printed, not asserted: benchmarks/probe_latency.py measures it."""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import time

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry

from fencewatch.probe import beside_job
from streaming.broker import EmbeddedBroker
from streaming.metrics import Metrics

pytestmark = pytest.mark.integration

TANSU_RULES = {"PROBE_FUTURE_EPOCH_SERVED", "PROBE_UNKNOWN_PARTITION_SERVED"}


def probe(*argv: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "fencewatch", "probe", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    return done, time.monotonic() - started


@pytest.mark.timeout(180)
def test_tansu_deviations_are_reported_for_100_partitions(broker: EmbeddedBroker, make_topic):
    topic = make_topic(100)
    done, elapsed = probe(
        "--bootstrap-servers", broker.bootstrap_servers, "--once", "--topics", re.escape(topic)
    )
    print(f"fencewatch probe --once, 100 partitions: {elapsed:.2f} s (the process, imports included)")
    print(done.stderr)
    assert done.returncode == 3, done.stderr
    alerts = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert {a["rule"] for a in alerts} == TANSU_RULES
    future = [a for a in alerts if a["rule"] == "PROBE_FUTURE_EPOCH_SERVED"]
    # Fetch and ListOffsets, each on every partition; the missing partition once per API.
    assert sorted({(a["partition"], a["evidence"][1]["summary"].split()[0]) for a in future}) == sorted(
        (p, api) for p in range(100) for api in ("Fetch", "ListOffsets")
    )
    assert len(alerts) == 202
    assert {a["topic"] for a in alerts} == {topic}
    assert all("answered NONE (0)" in a["evidence"][2]["summary"] for a in alerts)
    lines = done.stderr.splitlines()
    assert any(re.match(r"\d+ +Fetch +v\d+ +ok 100 +NONE! 100/100 +- +- +NONE! 1/1$", line) for line in lines)
    assert any(
        re.match(r"\d+ +ListOffsets +v\d+ +ok 100 +NONE! 100/100 +- +- +NONE! 1/1$", line) for line in lines
    )
    assert any(
        re.match(r"\d+ +OffsetForLeaderEpoch +- +unsupported: not advertised$", line) for line in lines
    )
    assert "deviations: PROBE_FUTURE_EPOCH_SERVED 200, PROBE_UNKNOWN_PARTITION_SERVED 2" in lines


@pytest.mark.timeout(180)
def test_alerts_reach_the_alerts_topic_with_their_ids(broker: EmbeddedBroker, make_topic):
    probed, alerts_topic = make_topic(2), make_topic(1)
    done, _ = probe(
        *("--bootstrap-servers", broker.bootstrap_servers, "--once", "--quiet"),
        *("--topics", re.escape(probed), "--alerts-topic", alerts_topic, "--cluster", "lab"),
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == ""
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": "probe-test", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(alerts_topic, 0, 0)])
    received = []
    deadline = time.monotonic() + 30
    while len(received) < 6 and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            received.append(msg)
    consumer.close()
    # Fetch and ListOffsets on 2 partitions, and the missing partition once per API.
    assert len(received) == 6
    bodies = [orjson.loads(m.value()) for m in received]
    assert {m.key() for m in received} == {b"lab"}
    assert [dict(m.headers())["fencewatch-id"].decode() for m in received] == [b["alert_id"] for b in bodies]
    assert {b["rule"] for b in bodies} == TANSU_RULES


@pytest.mark.timeout(180)
def test_the_probe_runs_beside_the_job_as_a_thread(broker: EmbeddedBroker, make_topic):
    probed, alerts_topic = make_topic(1), make_topic(1)
    args = argparse.Namespace(
        bootstrap_servers=broker.bootstrap_servers,
        alerts_topic=alerts_topic,
        probe_interval=0.5,
        probe_cluster="sim-1",
        probe_topics=re.compile(re.escape(probed)),
        probe_max_partitions=1000,
        probe_requests_per_second=20.0,
        probe_timeout_seconds=5.0,
    )
    metrics = Metrics(CollectorRegistry())
    console = io.StringIO()
    with beside_job(args, {}, metrics, None, console):
        deadline = time.monotonic() + 30
        value = metrics.registry.get_sample_value
        labels = {"cluster": "sim-1", "rule": "PROBE_FUTURE_EPOCH_SERVED"}
        while time.monotonic() < deadline and (value("fencewatch_probe_deviations_total", labels) or 0) < 4:
            time.sleep(0.1)
    # Two rounds at least: each counts its deviations; the console shows each alert once.
    assert value("fencewatch_probe_deviations_total", labels) >= 4
    assert value("fencewatch_probe_last_success_timestamp_seconds", {"cluster": "sim-1"}) > 0
    printed = [orjson.loads(line) for line in console.getvalue().splitlines()]
    assert len(printed) == len({a["alert_id"] for a in printed}) == 4
    assert {a["rule"] for a in printed} == TANSU_RULES
