"""Publish each new content of a KRaft controller's ``quorum-state`` file once."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from detectors.engine import wall_clock_ms
from detectors.envelope import Envelope
from detectors.lines import DEFAULT_MAX_RECORD_BYTES
from detectors.parse_quorum_state import FILE_NAME, QuorumStateStats, parse_quorum_state
from producers.confirmed_positions import StatusDuties
from producers.kafka_publisher import KafkaPublisher

FORMAT = "quorum-state"


def quorum_state_path(path: str) -> str:
    """The file to watch: ``path``, or the quorum-state file in it if it is a directory."""
    return os.path.join(path, FILE_NAME) if os.path.isdir(path) else path


class QuorumStateShipper(StatusDuties):
    """Publishes each new content of one controller's quorum-state file once.

    Kafka's FileQuorumStateStore writes ``quorum-state.tmp`` and renames it over
    the file, so a read by path always sees one whole state, old or new. The
    file is therefore opened afresh on every poll: that follows the rename
    without tracking inodes, and a file that is missing (not yet created, or
    removed) is waited for. A content equal to the last one seen is not
    published again; a content that comes back after another is (it is a new
    observation). Each envelope's ``ts_ms`` is when the change was seen
    (``clock_ms``): the file has no time. States replaced within one poll
    interval are never seen, so what they said cannot be judged.

    Nothing is saved between runs: a restart publishes the current state again,
    stamped anew. The detector recognises such a repeat by its node and content
    (``detectors.engine.Detector._first_delivery``) and counts it as a
    duplicate, so a restart adds no fact and raises no alert.
    """

    def __init__(
        self,
        publisher: KafkaPublisher,
        path: str,
        *,
        cluster: str,
        node: int,
        poll_interval_seconds: float = 0.1,
        status_interval_seconds: float = 30.0,
        flush_timeout_seconds: float = 30.0,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        clock_ms: Callable[[], int] = wall_clock_ms,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] | None = None,
        status: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.publisher = publisher
        self.path = path
        self.cluster = cluster
        self.node = node
        self.poll_interval_seconds = poll_interval_seconds
        self.status_interval_seconds = status_interval_seconds
        self.flush_timeout_seconds = flush_timeout_seconds
        self.max_record_bytes = max_record_bytes
        self.stats = QuorumStateStats()
        self._clock_ms = clock_ms
        self._clock = clock
        self._sleep = sleep or publisher.poll  # serve delivery reports while waiting
        self._status = status
        self._stopped = threading.Event()
        self._last: bytes | None = None
        self._missing = False
        self._last_status = clock()

    def stop(self) -> None:
        self._stopped.set()

    def run(self, *, once: bool = False) -> None:
        """Poll until stopped (or once); flush. Raises DeliveryError and OSError."""
        try:
            while True:
                self.check()
                if once or self._stopped.is_set():
                    break
                self._report(self._clock())
                self._sleep(self.poll_interval_seconds)
                if self._stopped.is_set():
                    break
        finally:
            self.publisher.flush(self.flush_timeout_seconds)

    def check(self) -> bool:
        """Read the file once; publish its content if it changed. True if it did."""
        data = self._read()
        if data is None or data == self._last:
            return False
        self._last = data
        item = parse_quorum_state(
            data,
            source=self.path,
            cluster=self.cluster,
            node=self.node,
            ts_ms=self._clock_ms(),
            stats=self.stats,
            max_record_bytes=self.max_record_bytes,
        )
        if isinstance(item, Envelope):
            self.publisher.publish(item)
        else:
            origin = {"format": FORMAT, "cluster": self.cluster, "node": self.node, "file": self.path}
            self.publisher.dead_letter(item, origin, key=self.cluster)
        return True

    def _read(self) -> bytes | None:
        """The file's bytes (at most one over the limit), or None while it is missing."""
        try:
            with open(self.path, "rb") as f:
                data = f.read(self.max_record_bytes + 1)
        except FileNotFoundError:
            if not self._missing:
                self._missing = True
                if self._last is None:
                    self._status(f"waiting for {self.path}: it does not exist yet")
                else:
                    self._status(f"{self.path} was removed; waiting for it to come back")
            return None
        if self._missing:
            self._missing = False
            self._status(f"{self.path} appeared")
        return data

    def _stop_reading(self) -> None:
        self.stop()

    def summary(self) -> str:
        s = self.publisher.stats
        return (
            f"{FORMAT}: {self.stats.files} new state(s) seen: {s.envelopes} shipped, "
            f"{s.dead_letters} dead letters ({s.delivered} delivered, {s.in_flight} in flight, "
            f"{s.failed} failed)"
        )
