"""Where the operator's rows go: the alerts topic (SPEC 3 JSON keyed by
cluster), the dead-letter topic, the console, the webhook outbox, and the
metrics (detector snapshots).

Spark re-runs a micro-batch after a crash; its rows are the same (same input,
same state, deterministic alert ids). Each sink remembers the ids it has
already delivered, reading them back from its topic when the job starts, and
skips them, so downstream sees every alert exactly once. The webhook outbox
is keyed by alert id, so enqueueing a re-run batch's alerts again adds nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TextIO

import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from streaming.schema import ALERT, DEAD_LETTER, STATS

if TYPE_CHECKING:
    from streaming.metrics import Metrics
    from streaming.webhooks import Dispatcher

ID_HEADER = "fencewatch-id"


class DeliveryFailed(RuntimeError):
    """Raised from foreachBatch so Spark fails the batch rather than commit it."""


def delivered_ids(
    bootstrap_servers: str, topic: str, kafka_config: Mapping[str, str], timeout_s: float = 30.0
) -> set[str]:
    """Every ``fencewatch-id`` header already in ``topic``, read to its end."""
    consumer = Consumer(
        {
            **kafka_config,
            "bootstrap.servers": bootstrap_servers,
            "group.id": "fencewatch-sink-recovery",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return set()
        consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        # End-of-partition events come from fetch responses, whose high watermark is
        # right even where ListOffsets is not (the embedded broker, NOTES.md).
        remaining = set(meta.partitions)
        ids: set[str] = set()
        while remaining:
            msg = consumer.poll(timeout_s)
            if msg is None:
                raise DeliveryFailed(f"timed out reading {topic} back to recover delivered ids")
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    remaining.discard(msg.partition())
                    continue
                raise DeliveryFailed(f"reading {topic}: {error}")
            headers: list[tuple[str, bytes | None]] = msg.headers() or []  # type: ignore[assignment]
            ids.update(v.decode() for k, v in headers if k == ID_HEADER and v is not None)
        return ids
    finally:
        consumer.close()


class TopicSink:
    """Publishes rows of one record type to a topic, once per id."""

    def __init__(self, bootstrap_servers: str, topic: str, kafka_config: Mapping[str, str]):
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.kafka_config = dict(kafka_config)
        self._delivered: set[str] | None = None
        self._producer: Producer | None = None

    def publish(self, rows: Iterable[Any], batch_id: int) -> list[Any]:
        """Deliver the rows not delivered before; returns those it delivered."""
        if self._delivered is None:
            self._delivered = delivered_ids(self.bootstrap_servers, self.topic, self.kafka_config)
        if self._producer is None:
            self._producer = Producer(
                {
                    **self.kafka_config,
                    "bootstrap.servers": self.bootstrap_servers,
                    "enable.idempotence": True,
                    "linger.ms": 5,
                }
            )
        errors: list[str] = []
        sent: list[Any] = []

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for row in rows:
            if row.id in self._delivered:
                continue
            self._producer.produce(
                self.topic,
                key=row.cluster.encode(),
                value=row.payload.encode(),
                headers=[(ID_HEADER, row.id.encode()), ("fencewatch-batch", str(batch_id).encode())],
                on_delivery=on_delivery,
            )
            self._producer.poll(0)
            sent.append(row)
        left = self._producer.flush(30)
        if errors or left:
            raise DeliveryFailed(f"{len(errors) + left} records to {self.topic} not delivered: {errors[:3]}")
        self._delivered.update(row.id for row in sent)
        return sent

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None


class Sinks:
    """The ``foreachBatch`` function: alerts to the webhook outbox, their topic
    and the console, dead letters to theirs, detector snapshots to the metrics.
    ``on_alert`` sees every newly delivered alert."""

    def __init__(
        self,
        alerts: TopicSink,
        dead_letters: TopicSink,
        console: TextIO | None = sys.stdout,
        on_alert: Callable[[str], None] | None = None,
        metrics: Metrics | None = None,
        webhooks: Dispatcher | None = None,
    ):
        self.alerts = alerts
        self.dead_letters = dead_letters
        self.console = console
        self.on_alert = on_alert
        self.metrics = metrics
        self.webhooks = webhooks

    def __call__(self, batch: Any, batch_id: int) -> None:
        rows = batch.collect()  # alerts, dead letters and one snapshot per cluster: few
        alerts = [r for r in rows if r.record_type == ALERT]
        letters = [r for r in rows if r.record_type == DEAD_LETTER]
        if self.webhooks is not None and alerts:
            # Into the durable outbox before the topic: a crash in between re-runs
            # the batch, and the outbox ignores ids it holds already.
            self.webhooks.enqueue(orjson.loads(r.payload) for r in alerts)
        new_alerts = self.alerts.publish(alerts, batch_id)
        new_letters = self.dead_letters.publish(letters, batch_id)
        if self.metrics is not None:
            self.metrics.sink_records.labels(sink="alerts_topic").inc(len(new_alerts))
            self.metrics.sink_records.labels(sink="dead_letter_topic").inc(len(new_letters))
            for row in rows:
                if row.record_type == STATS:
                    self.metrics.detector.update(orjson.loads(row.payload))
        for row in new_alerts:
            if self.console is not None:
                print(row.payload, file=self.console, flush=True)
            if self.on_alert is not None:
                self.on_alert(row.payload)

    def close(self) -> None:
        self.alerts.close()
        self.dead_letters.close()
