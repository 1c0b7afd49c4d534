"""Real client traffic for a local cluster: idempotent producers with
``acks=all`` and consumers in a group, each in a thread, until stopped.

The lab's topics are made here too (:data:`LAB_TOPICS`): the ones the nemesis
needs as it breaks things (a topic that allows unclean elections, one to
reassign, one deleted and made again) and one with tiered storage on, whose
segments roll every few seconds so that Kafka writes ``__remote_log_metadata``.
Errors the clients meet while brokers die are counted, never raised: they are
what the nemesis is for.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

MAIN_TOPIC = "lab-orders"
TIERED_TOPIC = "lab-tiered"
# Replicated on two brokers only, with min.insync.replicas=1, so that its ISR
# shrinks to one replica while the other still runs (no eligible leader
# replicas: those are kept only below min.insync.replicas, KIP-966).
UNCLEAN_TOPIC = "lab-unclean"
REASSIGN_TOPIC = "lab-reassign"
RECREATED_TOPIC = "lab-recreated"
GROUP = "fencewatch-lab"


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int = 3
    config: dict[str, str] = field(default_factory=dict)
    # Explicit replicas per partition, where the nemesis needs to know them.
    assignment: list[list[int]] | None = None

    def new_topic(self) -> NewTopic:
        if self.assignment is not None:
            return NewTopic(
                self.name, len(self.assignment), replica_assignment=self.assignment, config=self.config
            )
        return NewTopic(self.name, self.partitions, self.replication_factor, config=self.config)


def lab_topics(brokers: list[int], *, tiered_storage: bool) -> list[TopicSpec]:
    """The lab's topics on ``brokers`` (at least three)."""
    first, second, third = brokers[:3]
    topics = [
        TopicSpec(MAIN_TOPIC, 6),
        TopicSpec(
            UNCLEAN_TOPIC,
            1,
            config={"unclean.leader.election.enable": "true", "min.insync.replicas": "1"},
            assignment=[[first, second]],
        ),
        TopicSpec(REASSIGN_TOPIC, 3, assignment=[[first, second], [second, third], [third, first]]),
        TopicSpec(RECREATED_TOPIC, 3),
    ]
    if tiered_storage:
        # Segments roll every 10 s (segment.ms) and are uploaded once rolled;
        # local copies go after 20 s, so reads reach the remote store too.
        topics.append(
            TopicSpec(
                TIERED_TOPIC,
                3,
                config={
                    "remote.storage.enable": "true",
                    "segment.ms": "10000",
                    "local.retention.ms": "20000",
                    "retention.ms": "3600000",
                },
            )
        )
    return topics


def create_topics(admin: AdminClient, topics: list[TopicSpec], timeout_seconds: float = 60.0) -> None:
    """Create ``topics`` (an existing one is left as it is) and wait until each
    is listed with a leader for every partition."""
    futures = admin.create_topics([t.new_topic() for t in topics], request_timeout=timeout_seconds)
    for future in futures.values():
        try:
            future.result(timeout_seconds)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    wait_for_leaders(admin, [t.name for t in topics], timeout_seconds)


def wait_for_leaders(admin: AdminClient, names: list[str], timeout_seconds: float) -> bool:
    """Whether every partition of ``names`` had a leader within the time."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(KafkaException):
            listed = admin.list_topics(timeout=5).topics
            if all(
                name in listed
                and listed[name].error is None
                and listed[name].partitions
                and all(p.leader >= 0 for p in listed[name].partitions.values())
                for name in names
            ):
                return True
        time.sleep(0.5)
    return False


@dataclass
class TrafficStats:
    produced: int = 0
    acknowledged: int = 0
    consumed: int = 0
    # Delivery and consumer errors by librdkafka's error name.
    errors: Counter[str] = field(default_factory=Counter)
    producers_recreated: int = 0


class Traffic:
    """``producers`` idempotent producers writing to ``topics`` at about
    ``rate`` records a second in all, and ``consumers`` consumers of one group
    reading them, until :meth:`stop`."""

    def __init__(
        self,
        bootstrap_servers: str,
        topics: list[str],
        *,
        rate: float = 200.0,
        producers: int = 2,
        consumers: int = 2,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topics = topics
        self.rate = rate
        self.stats = TrafficStats()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._produce, args=(i, producers), name=f"lab-producer-{i}", daemon=True)
            for i in range(producers)
        ] + [
            threading.Thread(target=self._consume, args=(i,), name=f"lab-consumer-{i}", daemon=True)
            for i in range(consumers)
        ]

    def __enter__(self) -> Traffic:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_seconds: float = 30.0) -> TrafficStats:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_seconds)
        return self.stats

    def _count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + amount)

    def _error(self, error: KafkaError) -> None:
        with self._lock:
            self.stats.errors[error.name()] += 1

    def _new_producer(self) -> Producer:
        return Producer(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 20,
                "message.timeout.ms": 120_000,
                # Brokers down on purpose: librdkafka's own lines would be noise.
                "log_level": 0,
                "error_cb": self._error,
            }
        )

    def _produce(self, index: int, count: int) -> None:
        producer = self._new_producer()
        interval = count / self.rate if self.rate > 0 else 1.0
        run = uuid.uuid4().hex[:8]
        sent = 0

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                self._count("acknowledged")
            else:
                self._error(err)

        while not self._stop.is_set():
            topic = self.topics[sent % len(self.topics)]
            try:
                producer.produce(
                    topic, key=f"{run}-{sent % 64}", value=f"{index}-{sent}", on_delivery=delivered
                )
                sent += 1
                self._count("produced")
                producer.poll(interval)
            except BufferError:
                producer.poll(interval)
            except KafkaException as exc:
                # A fatal error of the idempotent producer (its sequence lost, as
                # after an unclean election: OUT_OF_ORDER_SEQUENCE_NUMBER), raised
                # by produce or poll: a new producer, as an application would make.
                self._error(exc.args[0])
                if exc.args[0].fatal():
                    producer = self._replace(producer)
        with contextlib.suppress(KafkaException):
            producer.flush(10)

    def _replace(self, producer: Producer) -> Producer:
        with contextlib.suppress(KafkaException):
            producer.flush(1)
        self._count("producers_recreated")
        return self._new_producer()

    def _consume(self, index: int) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "group.id": GROUP,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": True,
                "log_level": 0,
                "error_cb": self._error,
                # A topic deleted and made again under the subscription is no error here.
                "topic.metadata.refresh.interval.ms": 5000,
            }
        )
        consumer.subscribe(self.topics)
        try:
            while not self._stop.is_set():
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                error = msg.error()
                if error is not None:
                    self._error(error)
                else:
                    self._count("consumed")
        finally:
            consumer.close()
