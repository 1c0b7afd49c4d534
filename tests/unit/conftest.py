"""Builders for the detector's unit tests.

A :class:`History` is one cluster's event history, written with
``producers.shapes`` in Kafka's native shapes. It numbers metadata offsets and
request correlation ids itself, runs the envelopes through a fresh
:class:`~detectors.engine.Detector` with a fixed fake clock, and returns what
came out. ``standard_cluster`` gives every rule test the same small KRaft
cluster:

- metadata.version feature level 21 (3.9: no leader-epoch bump on ISR shrink);
- brokers 1, 2, 3 registered and unfenced with broker epochs 10, 11, 12;
- topic ``orders`` (``TOPIC_ID``), partition 0 with replicas and ISR [1, 2, 3],
  leader 1, leader epoch 0, partition epoch 0;

all at ``SETUP_MS``. The active controller (writer of AlterPartition answers)
is node ``CONTROLLER``.

Violation tests carry ``@pytest.mark.violation("RULE_ID")``; test_engine.py
checks that every registered rule has one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from detectors.alerts import Alert
from detectors.cluster import Counters
from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import DeadLetter, Envelope, envelope_from_obj
from detectors.view import ClusterView
from producers import shapes as s

CLUSTER = "c1"
TOPIC = "orders"
TOPIC_ID = "qG8hUlWTTJ2eRb_bFvWRXg"
BROKER_EPOCHS = {1: 10, 2: 11, 3: 12}
CONTROLLER = 3000
SETUP_MS = 1000
NOW_MS = 1_800_000_000_000  # the fake wall clock: only ever shows up as detected_ms

# (rule, node, ts_ms, partition, topic): what a test asserts about each alert.
AlertKey = tuple[str, int | None, int, int | None, str | None]


def alert_key(alert: Alert) -> AlertKey:
    return (alert.rule, alert.node, alert.ts_ms, alert.partition, alert.topic)


@dataclass
class Outcome:
    """What one run of a history produced."""

    alerts: list[Alert]
    dead_letters: list[DeadLetter]
    detector: Detector
    arrival: list[Envelope]

    @property
    def keys(self) -> list[AlertKey]:
        return [alert_key(a) for a in self.alerts]

    @property
    def counters(self) -> Counters:
        return self.detector.counters

    @property
    def view(self) -> ClusterView:
        return self.detector.cluster(CLUSTER).view


class History:
    """One cluster's events in the order they happened (``envelopes``)."""

    topic = TOPIC
    topic_id = TOPIC_ID
    controller = CONTROLLER
    broker_epochs = BROKER_EPOCHS
    cluster_name = CLUSTER

    def __init__(self, config: DetectorConfig | None = None):
        self.config = config or DetectorConfig()
        self.envelopes: list[Envelope] = []
        self._offset = 0
        self._correlation_id = 0

    # ---- appending events ---------------------------------------------------------------

    def add(self, raw: dict[str, Any]) -> Envelope:
        """Validate a raw envelope (as a producer would ship it) and append it."""
        index = len(self.envelopes)
        env = envelope_from_obj(raw, f"history:{index}", index)
        self.envelopes.append(env)
        return env

    def metadata(self, ts_ms: int, body: dict[str, Any], *, offset: int | None = None) -> Envelope:
        """A metadata record at the next metadata offset (or the one given)."""
        if offset is None:
            offset = self._offset + 1
        self._offset = max(self._offset, offset)
        return self.add(s.envelope(CLUSTER, "metadata", ts_ms, body, offset=offset))

    def request(
        self, ts_ms: int, node: int, body: dict[str, Any], *, correlation_id: int | None = None
    ) -> Envelope:
        """A request-log line written by ``node``. Each gets a fresh correlation id
        unless one is given, as a client's requests do."""
        if correlation_id is None:
            self._correlation_id += 1
            correlation_id = self._correlation_id
        body = {**body, "requestHeader": {**body["requestHeader"], "correlationId": correlation_id}}
        return self.add(s.envelope(CLUSTER, "request", ts_ms, body, node=node))

    def quorum_state(self, ts_ms: int, node: int, body: dict[str, Any]) -> Envelope:
        return self.add(s.envelope(CLUSTER, "quorum_state", ts_ms, body, node=node))

    def remote(self, ts_ms: int, body: dict[str, Any]) -> Envelope:
        return self.add(s.envelope(CLUSTER, "remote_log_metadata", ts_ms, body))

    def change(self, ts_ms: int, **changed: Any) -> Envelope:
        """A PARTITION_CHANGE_RECORD for partition 0 of the standard topic."""
        return self.metadata(ts_ms, s.partition_change(TOPIC_ID, 0, **changed))

    def standard_cluster(self, ts_ms: int = SETUP_MS, *, feature_level: int = 21) -> History:
        self.metadata(ts_ms, s.feature_level(feature_level))
        for broker, epoch in BROKER_EPOCHS.items():
            self.metadata(ts_ms, s.register_broker(broker, epoch, fenced=False))
        self.metadata(ts_ms, s.topic(TOPIC, TOPIC_ID))
        self.metadata(ts_ms, s.partition(TOPIC_ID, 0, [1, 2, 3], [1, 2, 3], 1))
        return self

    # ---- running ------------------------------------------------------------------------

    def run(self, order: Iterable[int] | None = None, config: DetectorConfig | None = None) -> Outcome:
        """Ingest the envelopes (in ``order``, indexes into ``envelopes``, if given),
        flush, and collect the alerts and dead letters."""
        arrival = self.envelopes if order is None else [self.envelopes[i] for i in order]
        detector = Detector(config or self.config, now_ms=lambda: NOW_MS)
        dead: list[DeadLetter] = []
        for env in arrival:
            dead.extend(detector.ingest(env))
        dead.extend(detector.flush())
        return Outcome(detector.drain(), dead, detector, list(arrival))

    def time_order(self) -> list[int]:
        """Indexes of ``envelopes`` sorted by ``ts_ms`` (stable), as replay merges files."""
        return sorted(range(len(self.envelopes)), key=lambda i: self.envelopes[i].ts_ms)

    def keys(self) -> list[AlertKey]:
        """The alerts of a plain run; a test of a clean history asserts this is []."""
        outcome = self.run()
        assert outcome.dead_letters == [], outcome.dead_letters
        return outcome.keys


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "violation(rule_id): the test builds a history that violates this rule"
    )


@pytest.fixture
def make_history() -> Callable[..., History]:
    """``make_history(config=None, standard=True, feature_level=21)``: a History,
    with the standard cluster already in it unless ``standard=False``."""

    def make(
        config: DetectorConfig | None = None, *, standard: bool = True, feature_level: int = 21
    ) -> History:
        history = History(config)
        return history.standard_cluster(feature_level=feature_level) if standard else history

    return make


@pytest.fixture
def cluster(make_history: Callable[..., History]) -> History:
    """A History holding the standard cluster, default DetectorConfig."""
    return make_history()
