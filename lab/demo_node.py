"""The demo's real Apache Kafka: one controller and one broker from Maven
Central (:mod:`localkafka`), real client traffic, and ``fencewatch ship`` of
both nodes' request logs, the controller's metadata log and quorum-state
into the demo's event topic (:class:`lab.watch.Watchers`), judged by
the demo's job beside the simulated clusters. Kafka fences correctly, so this
cluster (``kafka-live``) has no injected violation: any alert of it counts as
a false one in the demo's table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from lab.watch import Watchers
from localkafka.cluster import LocalKafkaCluster
from localkafka.fetch import KafkaJars, fetch_kafka
from localkafka.traffic import TopicSpec, Traffic, create_topics

CLUSTER = "kafka-live"
TOPIC = "demo-orders"
# One broker: every replicated default down to it.
SINGLE_BROKER = {
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
}


@dataclass
class RealKafka:
    """What the demo says of its real node at the end."""

    jars: KafkaJars
    cluster: LocalKafkaCluster
    traffic: Traffic


@contextmanager
def real_kafka(
    work: Path, events_bootstrap: str, events_topic: str, say: Callable[[str], None]
) -> Iterator[RealKafka]:
    """Fetch Kafka (the first time: about 55 MB, progress through ``say``),
    start it, its traffic and its shippers; stop them all on the way out."""
    downloads = 0

    def progress(line: str) -> None:
        nonlocal downloads
        downloads += 1
        if downloads == 1:
            say("fetching Apache Kafka from Maven Central (first run only; cached after)")
        if downloads % 10 == 0:
            say(f"  {downloads} jars fetched ({line.rsplit('/', 1)[-1]})")

    jars = fetch_kafka(progress=progress)
    cluster = LocalKafkaCluster(
        jars,
        work / "kafka",
        controllers=1,
        brokers=1,
        tiered_storage=False,
        broker_overrides=SINGLE_BROKER,
        heap="256m",
    )
    say(f"starting Apache Kafka {jars.version} (one controller, one broker) under {work / 'kafka'}")
    cluster.start()
    watchers = Watchers(
        cluster, events_bootstrap, work / "watch", cluster_name=CLUSTER, events_topic=events_topic
    )
    traffic = Traffic(cluster.bootstrap_servers, [TOPIC], rate=100.0, producers=1, consumers=1)
    try:
        create_topics(_admin(cluster), [TopicSpec(TOPIC, 3, replication_factor=1)])
        watchers.start_shippers()
        traffic.start()
        say(
            f"{CLUSTER}: Apache Kafka {jars.version} on {cluster.bootstrap_servers}, idempotent producer "
            "and consumer group; fencewatch ship sends its request logs, metadata log and quorum-state"
        )
        yield RealKafka(jars, cluster, traffic)
    finally:
        traffic.stop()
        watchers.stop_shippers()
        cluster.stop()


def _admin(cluster: LocalKafkaCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0})
