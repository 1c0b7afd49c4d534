"""``fencewatch ship remote-log-metadata --from-topic`` on Apache Kafka's own
``__remote_log_metadata`` (the session's ``real_kafka_cluster``, tiered
storage on with LocalTieredStorage): the envelopes it ships from the records'
bytes are exactly those ``fencewatch convert remote-log-metadata`` makes of
the same topic printed by Kafka's ``RemoteLogMetadataSerde$RemoteLogMetadataFormatter``
through Kafka's ConsoleConsumer; and a second run from its state file ships
nothing again.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from detectors.envelope import Envelope
from detectors.parse_remote_log_metadata import RemoteLogMetadataStats, iter_remote_log_metadata
from localkafka.cluster import LocalKafkaCluster

pytestmark = pytest.mark.integration

FORMATTER = (
    "org.apache.kafka.server.log.remote.metadata.storage.serialization."
    "RemoteLogMetadataSerde$RemoteLogMetadataFormatter"
)
CLUSTER = "real-kafka"


def formatter_envelopes(cluster: LocalKafkaCluster) -> dict[tuple[int, int], dict]:
    text = cluster.run_tool(
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        *("--bootstrap-server", cluster.bootstrap_servers, "--topic", "__remote_log_metadata"),
        *("--from-beginning", "--formatter", FORMATTER, "--timeout-ms", "20000"),
        timeout_seconds=180,
    )
    # The formatter's lines: run_tool's log4j prints the consumer's exit at the
    # timeout on stdout too (kafka-console-consumer.sh logs it to stderr).
    lines = [line for line in text.splitlines() if line.startswith("partition: ")]
    stats = RemoteLogMetadataStats()
    items = list(iter_remote_log_metadata(lines, source="formatter", cluster=CLUSTER, stats=stats))
    assert stats.dead_letters == 0, [i for i in items if not isinstance(i, Envelope)][:3]
    return {(e.body["partition"], e.offset): e.to_dict() for e in items if isinstance(e, Envelope)}


def ship(cluster: LocalKafkaCluster, events: str, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "fencewatch", "ship", "remote-log-metadata", "--from-topic", "--once"),
            *("--source-bootstrap-servers", cluster.bootstrap_servers, "--state-file", str(state)),
            *("--bootstrap-servers", cluster.bootstrap_servers, "--topic", events, "--cluster", CLUSTER),
            *("--status-interval", "0"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )


def shipped(cluster: LocalKafkaCluster, events: str) -> list[dict]:
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": f"t-{events}",
            "enable.auto.commit": False,
        }
    )
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(events, 0), timeout=30)
        consumer.assign([TopicPartition(events, 0, 0)])
        out: list[dict] = []
        deadline = time.monotonic() + 60
        while len(out) < high and time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is not None and msg.error() is None:
                out.append(orjson.loads(msg.value()))
        return out
    finally:
        consumer.close()


def uploaded(cluster: LocalKafkaCluster, topic: str) -> bool:
    """Whether some segment of ``topic`` has finished its upload, by the formatter's reading."""
    return any(
        e["body"]["type"] == "RemoteLogSegmentMetadataUpdateRecord"
        and e["body"]["data"]["remoteLogSegmentId"]["topicIdPartition"]["name"] == topic
        and e["body"]["data"]["remoteLogSegmentState"] == 1  # COPY_SEGMENT_FINISHED
        for e in formatter_envelopes(cluster).values()
    )


@pytest.mark.timeout(600)
def test_the_topic_read_from_its_bytes_gives_the_formatters_envelopes(
    real_kafka_cluster: LocalKafkaCluster, tmp_path: Path
):
    cluster = real_kafka_cluster
    if not cluster.layout.tiered_storage:
        pytest.fail(f"Kafka {cluster.jars.version}'s storage test jar was not served: no tiered storage")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    topic, events = f"tiered-{uuid.uuid4().hex[:6]}", f"events-{uuid.uuid4().hex[:6]}"
    config = {"remote.storage.enable": "true", "segment.bytes": str(1 << 20), "local.retention.ms": "1000"}
    futures = admin.create_topics([NewTopic(topic, 1, 3, config=config), NewTopic(events, 1, 3)])
    for future in futures.values():
        future.result(60)
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all", "linger.ms": 20})
    for i in range(2500):  # 2.5 MiB: two closed 1 MiB segments to upload
        producer.produce(topic, key=str(i).encode(), value=b"v" * 1024)
        producer.poll(0)
    assert producer.flush(60) == 0

    deadline = time.monotonic() + 180
    while not uploaded(cluster, topic):
        assert time.monotonic() < deadline, f"no segment of {topic} uploaded within 180 s"
        time.sleep(2)

    state = tmp_path / "remote.state"
    first = ship(cluster, events, state)
    assert first.returncode == 0, first.stderr
    expected = formatter_envelopes(cluster)
    got = {(e["body"]["partition"], e["offset"]): e for e in shipped(cluster, events)}
    # The formatter was read after the shipper: it may hold more of the
    # broker's own bookkeeping, never less, and every record both read is the same.
    assert got, first.stderr
    assert set(got) <= set(expected)
    assert {k: expected[k] for k in got} == got
    assert any(e["body"]["data"].get("txnIndexEmpty") is not None for e in got.values())
    assert {e["body"]["type"] for e in got.values()} >= {
        "RemoteLogSegmentMetadataRecord",
        "RemoteLogSegmentMetadataUpdateRecord",
    }

    second = ship(cluster, events, state)
    assert second.returncode == 0, second.stderr
    assert "0 records read" in second.stderr, second.stderr
    assert len(shipped(cluster, events)) == len(got)
