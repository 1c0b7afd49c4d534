"""Where the operator's rows go: the alerts topic (SPEC 3 JSON keyed by
cluster), the dead-letter topic, the console, the webhook outbox, and the
metrics (detector snapshots).

Spark re-runs a micro-batch after a crash; its rows are the same (same input,
same state, deterministic alert ids). So when the job starts, each topic sink
reads back the ``fencewatch-id`` headers that the re-run batch may already have
published, from the offsets its publish mark recorded (``delivery_ledger``) to
the topic's end, and skips those ids: downstream sees every alert exactly
once. The webhook outbox is keyed by alert id, so enqueueing a re-run batch's
alerts again adds nothing.

Records are keyed by cluster, so one cluster's alerts keep their order in one
partition. A compacted topic would then keep only each cluster's newest alert:
the job refuses to start on one (:func:`refuse_compacted_topics`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from detectors import clock_exchange
from streaming.delivery_ledger import DeliveryLedger, PublishMark
from streaming.kafka_source import fetch_high_watermarks
from streaming.schema import ALERT, CLOCKS, DEAD_LETTER, STATS

if TYPE_CHECKING:
    from streaming.metrics import Metrics
    from webhooks import Dispatcher

log = logging.getLogger(__name__)

ID_HEADER = "fencewatch-id"
BATCH_HEADER = "fencewatch-batch"
BROKER_TIMEOUT_S = 30.0


class _DebugLog:
    """confluent-kafka's logger interface, sending librdkafka's lines to this
    module's logger at DEBUG (``fencewatch --verbose`` shows them) whatever
    their level: a connection's failure is an error line, several a second
    while a broker is down, which Python's last-resort handler would print;
    the sinks' own error names the cause once."""

    def log(self, level: int, msg: str, *args: Any) -> None:
        log.debug(msg, *args)


_DEBUG_LOG = _DebugLog()


class DeliveryFailed(RuntimeError):
    """Raised from foreachBatch so Spark fails the batch rather than commit it.
    One line, ``<what> -- <what to do>``, which ``fencewatch run`` prints as
    the job's error (fencewatch.spark_console)."""


class CompactedSinkTopic(ValueError):
    """The alerts or dead-letter topic is compacted, which would drop history."""


def refuse_compacted_topics(
    bootstrap_servers: str, topics: Iterable[str], kafka_config: Mapping[str, str]
) -> None:
    """Raise :class:`CompactedSinkTopic` if one of ``topics`` has a ``cleanup.policy``
    with ``compact``. A topic that does not exist yet is created by the first
    publish with the broker's default policy and checked at the next start."""
    settings: dict[str, Any] = {**kafka_config, "bootstrap.servers": bootstrap_servers, "logger": _DEBUG_LOG}
    admin = AdminClient(settings)
    futures = admin.describe_configs(
        [ConfigResource(ResourceType.TOPIC, topic) for topic in dict.fromkeys(topics)],
        request_timeout=BROKER_TIMEOUT_S,
    )
    for resource, future in futures.items():
        try:
            config = future.result(BROKER_TIMEOUT_S)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                log.warning(
                    "cannot read the cleanup.policy of topic %r (%s): make sure it is not compacted",
                    resource.name,
                    exc.args[0].str(),
                )
            continue
        policy = config.get("cleanup.policy")
        if policy is not None and "compact" in str(policy.value).split(","):
            raise CompactedSinkTopic(
                f"topic {resource.name} has cleanup.policy={policy.value}, but fencewatch keys alerts and "
                "dead letters by cluster, so compaction would keep only each cluster's newest one -- set "
                f"cleanup.policy=delete (kafka-configs.sh --alter --entity-type topics --entity-name "
                f"{resource.name} --add-config cleanup.policy=delete) or choose another topic"
            )


class TopicSink:
    """Publishes rows of one record type to a topic, once per id. ``timeout_s``
    bounds each wait for the broker."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        kafka_config: Mapping[str, str],
        timeout_s: float = BROKER_TIMEOUT_S,
    ):
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.kafka_config = dict(kafka_config)
        self.timeout_s = timeout_s
        self._delivered: set[str] = set()
        self._producer: Producer | None = None
        self._reader: Consumer | None = None
        self._client_error: str | None = None  # the latest error librdkafka reported, for messages

    def _consumer(self) -> Consumer:
        if self._reader is None:
            self._reader = Consumer(
                {
                    **self.kafka_config,
                    **self._quiet(),
                    "bootstrap.servers": self.bootstrap_servers,
                    "group.id": "fencewatch-sink-recovery",
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    # A start past the end (the topic was recreated) reads the new log whole.
                    "auto.offset.reset": "earliest",
                }
            )
        return self._reader

    def _quiet(self) -> dict[str, Any]:
        """Client settings that keep librdkafka's connection failures off the
        console (several lines a second while a broker is down; ``--verbose``
        shows them) and keep its latest error for this sink's messages."""

        def on_error(error: KafkaError) -> None:
            self._client_error = error.str()

        return {"logger": _DEBUG_LOG, "error_cb": on_error}

    def _partitions(self) -> list[int]:
        """The topic's partitions; [] while it does not exist."""
        try:
            meta = self._consumer().list_topics(self.topic, timeout=self.timeout_s).topics.get(self.topic)
        except KafkaException as exc:
            raise DeliveryFailed(
                f"cannot read the metadata of topic {self.topic}: {exc.args[0].str()} -- check that "
                "--bootstrap-servers is reachable and the job may Describe and Read the topic"
            ) from None
        if meta is None or (meta.error is not None and meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            return []
        if meta.error is not None:
            raise DeliveryFailed(
                f"cannot read topic {self.topic}: {meta.error.str()} -- check that the job may Describe and "
                "Read it"
            )
        return sorted(meta.partitions)

    def _log_spans(self) -> dict[int, tuple[int, int]]:
        """Each partition's (log start, offset after its last record) now.

        The embedded broker's ListOffsets reports an end below the last record
        after multi-record batches (NOTES.md), so the end is taken from a Fetch
        response where one answers, as the source does."""
        consumer = self._consumer()
        watermarks: dict[int, tuple[int, int]] = {}
        for partition in self._partitions():
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(self.topic, partition), timeout=self.timeout_s, cached=False
                )
            except KafkaException as exc:
                raise DeliveryFailed(
                    f"cannot list the offsets of {self.topic}[{partition}]: {exc.args[0].str()} -- check "
                    "that the broker is reachable and the job may Describe the topic"
                ) from None
            watermarks[partition] = (int(low), int(high))
        probe_from = {p: high - 1 for p, (low, high) in watermarks.items() if high > low}
        fetched = (
            fetch_high_watermarks(consumer, self.topic, probe_from, self.timeout_s) if probe_from else {}
        )
        return {p: (low, max(high, fetched.get(p, high))) for p, (low, high) in watermarks.items()}

    def end_offsets(self) -> dict[int, int]:
        """Each partition's end offset now: where a publish mark says this sink stood."""
        return {p: end for p, (_, end) in self._log_spans().items()}

    def recover(self, mark: Mapping[int, int]) -> None:
        """Remember the ids already in the topic from ``mark`` (partition -> offset;
        the log start for a partition it lacks) to its end, so that a re-run
        batch skips them."""
        starts: dict[int, int] = {}
        for partition, (low, end) in self._log_spans().items():
            start = mark.get(partition)
            if start is not None and start < low:
                log.warning(
                    "%s[%d]: records from offset %d to %d were deleted before the job restarted; alerts a "
                    "re-run batch published among them may be published again",
                    self.topic,
                    partition,
                    start,
                    low,
                )
            # Outside the log (deleted by retention, or the topic was recreated or
            # truncated since the mark): read what the log holds now.
            starts[partition] = start if start is not None and low <= start <= end else OFFSET_BEGINNING
        ids = self._read_ids(starts)
        log.info(
            "read back %d delivered ids from topic %s, from offsets %s (-2: the log start) to the end",
            len(ids),
            self.topic,
            starts,
        )
        self._delivered.update(ids)

    def _read_ids(self, starts: Mapping[int, int]) -> set[str]:
        ids: set[str] = set()
        purpose = "to find what a re-run batch already published"
        for msg in self.read_back(starts, purpose, "the job may Read the topic"):
            headers: list[tuple[str, bytes | None]] = msg.headers() or []  # type: ignore[assignment]
            ids.update(v.decode() for k, v in headers if k == ID_HEADER and v is not None)
        return ids

    def read_back(
        self, starts: Mapping[int, int], purpose: str, may_read: str, ends: Mapping[int, int] | None = None
    ) -> Iterator[Any]:
        """The topic's messages from ``starts`` (partition -> offset; -2: the log
        start) to each partition's end: its end-of-partition event, or the offset
        before ``ends[partition]`` when given. ``purpose`` and ``may_read`` (who
        must be allowed to Read) complete the error messages."""
        if not starts:
            return
        consumer = self._consumer()
        consumer.assign([TopicPartition(self.topic, p, off) for p, off in starts.items()])
        # End-of-partition events come from fetch responses, whose high watermark is
        # right even where ListOffsets is not (the embedded broker, NOTES.md).
        remaining = set(starts)
        try:
            while remaining:
                msg = consumer.poll(self.timeout_s)
                if msg is None:
                    raise DeliveryFailed(
                        f"timed out after {self.timeout_s:.0f}s reading topic {self.topic} back from "
                        f"offsets {dict(starts)} (-2: the log start) {purpose} -- check that the broker "
                        f"is reachable and {may_read}"
                    )
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        remaining.discard(msg.partition())
                        continue
                    raise DeliveryFailed(
                        f"reading topic {self.topic} back failed: {error.str()} -- check that {may_read}"
                    )
                if ends is not None:
                    partition, offset = msg.partition(), msg.offset()
                    assert partition is not None and offset is not None  # a message, not an event
                    if offset >= ends[partition] - 1:
                        remaining.discard(partition)
                    if offset >= ends[partition]:
                        continue
                yield msg
        finally:
            consumer.unassign()

    def undelivered(self, rows: Iterable[Any]) -> list[Any]:
        """The rows whose ids this sink has not delivered."""
        return [row for row in rows if row.id not in self._delivered]

    def publish(self, rows: list[Any], batch_id: int) -> None:
        """Deliver ``rows`` (see :meth:`undelivered`); raise DeliveryFailed unless all arrived."""
        if not rows:
            return
        if self._producer is None:
            self._producer = Producer(
                {
                    **self.kafka_config,
                    **self._quiet(),
                    "bootstrap.servers": self.bootstrap_servers,
                    "enable.idempotence": True,
                    "linger.ms": 5,
                }
            )
        errors: list[str] = []
        delivered = 0

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            nonlocal delivered
            if err is None:
                delivered += 1
            else:
                errors.append(str(err))

        for row in rows:
            self._producer.produce(
                self.topic,
                key=row.cluster.encode(),
                value=row.payload.encode(),
                headers=[(ID_HEADER, row.id.encode()), (BATCH_HEADER, str(batch_id).encode())],
                on_delivery=on_delivery,
            )
            self._producer.poll(0)
        # Count what the delivery reports say, not what flush returns: its
        # queue length also counts the error and log events still queued
        # (rd_kafka_outq_len), so one record against a dead broker read as 3.
        self._producer.flush(self.timeout_s)
        if delivered < len(rows):
            why = "; ".join(dict.fromkeys(errors[:3])) or self._client_error or "no answer from the broker"
            raise DeliveryFailed(
                f"{len(rows) - delivered} record(s) to topic {self.topic} not delivered within "
                f"{self.timeout_s:.0f}s: {why} -- check that the brokers are up and reachable from the Spark "
                "driver and the job may Write the topic; started again with the same checkpoint, the job "
                "publishes them then"
            )
        self._delivered.update(row.id for row in rows)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None


class Sinks:
    """The ``foreachBatch`` function: alerts to the webhook outbox, their topic
    and the console, dead letters to theirs, detector snapshots to the metrics.
    ``on_alert`` sees every newly delivered alert."""

    def __init__(
        self,
        alerts: TopicSink,
        dead_letters: TopicSink,
        ledger: DeliveryLedger,
        console: TextIO | None = sys.stdout,
        on_alert: Callable[[str], None] | None = None,
        metrics: Metrics | None = None,
        webhooks: Dispatcher | None = None,
        clock_evidence: TopicSink | None = None,
    ):
        """``clock_evidence``: the event topic, where the clock bounds the
        buckets measured go for every bucket to take (detectors.clock_exchange)."""
        self.alerts = alerts
        self.dead_letters = dead_letters
        self.clock_evidence = clock_evidence
        self.ledger = ledger
        self.console = console
        self.on_alert = on_alert
        self.metrics = metrics
        self.webhooks = webhooks
        self._recovered = False

    def _recover(self, first_batch: int) -> None:
        """Read back what ``first_batch`` may have published before a crash."""
        mark = self.ledger.newest(first_batch)
        if mark is None:
            log.info(
                "no publish mark in %s up to batch %d: reading %s and %s from their start",
                self.ledger.location,
                first_batch,
                self.alerts.topic,
                self.dead_letters.topic,
            )
        for sink in (self.alerts, self.dead_letters):
            # A topic or partition the mark lacks did not exist then: all of it is newer.
            sink.recover({} if mark is None else mark.ends.get(sink.topic, {}))
        self._recovered = True

    def __call__(self, batch: Any, batch_id: int) -> None:
        rows = batch.collect()  # alerts, dead letters and one snapshot per cluster: few
        alerts = [r for r in rows if r.record_type == ALERT]
        letters = [r for r in rows if r.record_type == DEAD_LETTER]
        if self.webhooks is not None and alerts:
            # Into the durable outbox before the topic: a crash in between re-runs
            # the batch, and the outbox ignores ids it holds already.
            self.webhooks.enqueue(orjson.loads(r.payload) for r in alerts)
        if not self._recovered:
            self._recover(batch_id)
        new_alerts = self.alerts.undelivered(alerts)
        new_letters = self.dead_letters.undelivered(letters)
        if new_alerts or new_letters:
            sinks = (self.alerts, self.dead_letters)
            self.ledger.record(PublishMark(batch_id, {s.topic: s.end_offsets() for s in sinks}))
        self.alerts.publish(new_alerts, batch_id)
        self.dead_letters.publish(new_letters, batch_id)
        if self.clock_evidence is not None:
            # Not in the ledger: a batch run again publishes them again, and a
            # bound taken twice changes nothing.
            self.clock_evidence.publish(clock_evidence_records(rows, batch_id), batch_id)
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
        if self.clock_evidence is not None:
            self.clock_evidence.close()


def clock_evidence_records(rows: Iterable[Any], batch_id: int) -> list[Record]:
    """The buckets' clock bounds of one batch (CLOCKS rows), merged per cluster
    into clock evidence envelopes (detectors.clock_exchange), as records for the
    event topic, keyed by cluster as every shipper keys its records."""
    by_cluster: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.record_type == CLOCKS:
            by_cluster.setdefault(row.cluster, []).append(orjson.loads(row.payload))
    out = []
    for cluster, bodies in sorted(by_cluster.items()):
        # Bodies in bucket order, so a tie between buckets keeps the lowest's bound.
        bodies.sort(key=lambda body: body["bucket"])
        for i, body in enumerate(clock_exchange.merge(bodies)):
            envelope = {
                "cluster": cluster,
                "node": None,
                "ts_ms": clock_exchange.envelope_body_time(body),
                "kind": clock_exchange.CLOCK_EVIDENCE,
                "body": body,
            }
            out.append(Record(cluster, f"clock-evidence:{batch_id}:{i}", orjson.dumps(envelope).decode()))
    return out


class Record(NamedTuple):
    """A record for :meth:`TopicSink.publish` made on the driver."""

    cluster: str
    id: str
    payload: str
