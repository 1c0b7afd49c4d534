"""Fixtures for tests against real components: an embedded broker (and local
Spark, in tests/conftest.py).

``broker`` and ``spark`` are started once per session (each takes seconds);
tests isolate themselves through unique topic, query and directory names.
"""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from localkafka.cluster import LocalKafkaCluster  # noqa: E402
from localkafka.fetch import fetch_kafka  # noqa: E402
from streaming.broker import EmbeddedBroker  # noqa: E402

if TYPE_CHECKING:
    pass


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """A tansu broker on a random free port, stopped after the session."""
    with EmbeddedBroker() as running:
        yield running


@pytest.fixture(scope="session")
def real_kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafkaCluster]:
    """Apache Kafka itself (``localkafka.fetch.DEFAULT_VERSION``, fetched from
    Maven Central on first use and cached): three controllers and three
    brokers as separate JVMs on free loopback ports, request loggers at DEBUG,
    tiered storage on where the storage test jar is served. Started once per
    session (about half a minute on two cores) and stopped after it; tests
    share it, so each uses topics of its own and leaves every node running.
    """
    jars = fetch_kafka()
    with LocalKafkaCluster(jars, tmp_path_factory.mktemp("real-kafka"), heap="320m") as cluster:
        yield cluster


@pytest.fixture
def make_topic(broker: EmbeddedBroker, request: pytest.FixtureRequest) -> Callable[..., str]:
    """Factory: ``make_topic(partitions=3)`` creates a topic with a unique name."""

    def create(partitions: int = 3) -> str:
        stem = re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:80]
        name = f"{stem}-{uuid.uuid4().hex[:8]}"
        broker.create_topics({name: partitions})
        return name

    return create


Produced = list[tuple[int, int, str, bytes]]  # (partition, offset, key, value)


@pytest.fixture
def produce(broker: EmbeddedBroker) -> Callable[..., Produced]:
    """Factory: ``produce(topic, count, partitions=3, wave=100)`` -> what was written.

    Records go round-robin to the partitions, ``wave`` records per partition
    and flush, so every flush writes one multi-record batch per partition:
    exactly what makes tansu's ListOffsets high watermark lag (NOTES.md).
    Keys and values are ``k-<run>-<i>`` / ``v-<run>-<i>``, unique across calls.
    """
    from confluent_kafka import KafkaError, Message, Producer

    def run(topic: str, count: int, partitions: int = 3, wave: int = 100) -> Produced:
        delivered: Produced = []
        errors: list[str] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                delivered.append((msg.partition(), msg.offset(), msg.key().decode(), msg.value()))

        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap_servers,
                "linger.ms": 1000,
                "batch.num.messages": 100_000,
            }
        )
        run_id = uuid.uuid4().hex[:6]
        for i in range(count):
            producer.produce(
                topic,
                key=f"k-{run_id}-{i}",
                value=f"v-{run_id}-{i}".encode(),
                partition=i % partitions,
                on_delivery=on_delivery,
            )
            if (i + 1) % (wave * partitions) == 0:
                producer.flush(30)
        remaining = producer.flush(30)
        assert remaining == 0 and not errors, f"{remaining} undelivered, errors: {errors[:3]}"
        assert len(delivered) == count
        return delivered

    return run
