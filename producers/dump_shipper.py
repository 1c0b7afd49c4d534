"""Publish dump-like inputs to their end: a metadata dump as
``kafka-dump-log.sh --cluster-metadata-decoder`` prints it, and
``__remote_log_metadata`` as ``kafka-console-consumer.sh`` prints it with
``RemoteLogMetadataSerde$RemoteLogMetadataFormatter``.

The caller parses each input and hands over its envelopes and dead letters;
a pipe is followed for as long as its writer runs, so
``kafka-console-consumer.sh ... | fencewatch ship remote-log-metadata -``
ships the topic as it grows. Nothing is saved between runs: records carry their
own offset and event time, by which the detector drops a repeat.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from detectors.envelope import DeadLetter, Envelope
from producers.kafka_publisher import KafkaPublisher

METADATA_DUMP = "metadata-dump"
REMOTE_LOG_METADATA = "remote-log-metadata"


class DumpShipper:
    """Publishes the parsed records of one format's inputs, until they end or :meth:`stop`.

    ``input_format``: ``metadata-dump`` or ``remote-log-metadata``, named in each dead
    letter's origin beside the cluster, the file and (for a dump, whose lines
    name no writer) the node.
    """

    def __init__(
        self,
        publisher: KafkaPublisher,
        *,
        input_format: str,
        cluster: str,
        node: int | None = None,
        flush_timeout_seconds: float = 30.0,
    ) -> None:
        if input_format not in (METADATA_DUMP, REMOTE_LOG_METADATA):
            raise ValueError(f"not a dump-like format: {input_format!r}")
        self.publisher = publisher
        self.input_format = input_format
        self.cluster = cluster
        self.node = node
        self.flush_timeout_seconds = flush_timeout_seconds
        self._stopped = threading.Event()

    def stop(self) -> None:
        """End after the record in hand (a signal handler may call it)."""
        self._stopped.set()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def ship(self, source: str, items: Iterable[Envelope | DeadLetter]) -> None:
        """Publish one input's records (``source``: its file name, or ``stdin``)."""
        origin: dict[str, Any] = {"format": self.input_format, "cluster": self.cluster, "file": source}
        if self.input_format == METADATA_DUMP:
            origin["node"] = self.node
        for item in items:
            if self._stopped.is_set():
                return
            if isinstance(item, Envelope):
                self.publisher.publish(item)
            else:
                self.publisher.dead_letter(item, origin, key=self.cluster)

    def flush(self) -> None:
        """Wait for outstanding deliveries. Raises DeliveryError for records that failed."""
        self.publisher.flush(self.flush_timeout_seconds)
