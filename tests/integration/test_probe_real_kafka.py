"""``fencewatch probe --once`` against Apache Kafka itself (the session's
``real_kafka_cluster``): Kafka fences by leader epoch, so every answer is
Kafka's and the probe reports no deviation, before and after leaders move.

Between rounds the leader of partition 0 is killed (SIGKILL: the controller
fences it after ``broker.session.timeout.ms`` and elects another leader,
bumping the epoch), then restarted and made leader again by a preferred
election (another bump). The first round, on a new topic, has no past epoch
to ask with (its column is ``-``); the last one asks partition 0's leader with
a current, a future and a past epoch, as a stale client would. tansu's
deviations are reported by tests/integration/test_probe_tansu.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import ElectionType, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from localkafka.cluster import LocalKafkaCluster

pytestmark = pytest.mark.integration

PARTITIONS = 3
PAST = 5  # the table's columns: broker, api, version, current, future, past, follower, unknown partition


def probe_once(cluster: LocalKafkaCluster, topic: str) -> list[str]:
    """One round of ``fencewatch probe --once`` as a user runs it: its table's
    lines, once it has said every answer was Kafka's."""
    done = subprocess.run(
        [
            *(sys.executable, "-m", "fencewatch", "probe", "--bootstrap-servers", cluster.bootstrap_servers),
            *("--once", "--topics", re.escape(topic), "--cluster", "real-kafka"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    print(done.stderr)
    lines = done.stderr.splitlines()
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr}"
    assert done.stdout == "", f"alerts printed:\n{done.stdout}"
    assert "deviations: none" in lines
    assert f"of {PARTITIONS} partitions" in lines[0]
    return lines


def leader_of(cluster: LocalKafkaCluster, topic: str, partition: int) -> int:
    """The partition's leader as the brokers running now describe it (a fresh
    client each time: one that knew a killed broker keeps asking it)."""
    running = ",".join(f"127.0.0.1:{b.port}" for b in cluster.brokers if cluster.is_running(b.node_id))
    admin = AdminClient({"bootstrap.servers": running, "log_level": 0})
    description = admin.describe_topics(TopicCollection([topic]), request_timeout=10)[topic].result(15)
    return description.partitions[partition].leader.id


def wait_for(what: str, check, timeout_seconds: float = 90) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass  # a broker just killed: ask again
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout_seconds:.0f} s: {what}")


def table_row(lines: list[str], broker: int, api: str) -> list[str]:
    row = next(line for line in lines if re.match(rf"{broker} +{api} ", line))
    return re.split(r" {2,}", row.strip())


@pytest.mark.timeout(600)
def test_no_deviation_from_kafka_through_a_killed_leader_and_a_preferred_election(
    real_kafka_cluster: LocalKafkaCluster,
):
    cluster = real_kafka_cluster
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    topic = f"probe-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, PARTITIONS, 3)])[topic].result(60)
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    for i in range(30):
        producer.produce(topic, value=b"x", partition=i % PARTITIONS)
    assert producer.flush(60) == 0

    first = probe_once(cluster, topic)
    # A new topic: every epoch is 0, so there is no past one to ask with.
    assert all(table_row(first, b.node_id, "Fetch")[PAST] == "-" for b in cluster.brokers)

    deposed = leader_of(cluster, topic, 0)
    cluster.kill(deposed)
    try:
        wait_for(
            f"a leader of {topic}-0 other than {deposed}", lambda: leader_of(cluster, topic, 0) != deposed
        )
        probe_once(cluster, topic)
    finally:
        cluster.start_node(deposed)  # and wait until it is registered and unfenced

    partition = TopicPartition(topic, 0)

    def elected_back() -> bool:
        admin.elect_leaders(ElectionType.PREFERRED, [partition]).result(30)
        return leader_of(cluster, topic, 0) == deposed

    # The restarted broker must rejoin the ISR before it can be elected.
    wait_for(f"broker {deposed} leading {topic}-0 again", elected_back, 120)

    last = probe_once(cluster, topic)
    # Partition 0's leader was asked with an epoch below its current one and
    # answered FENCED_LEADER_EPOCH, as Kafka does (the column says "ok").
    fetch = table_row(last, deposed, "Fetch")
    assert fetch[PAST].startswith("ok "), fetch
