"""Everything the detector knows about one cluster, and the one place alerts
are made, so every rule produces the same alert shape."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from detectors.alerts import FIRING, Alert, Evidence, make_alert_id
from detectors.buckets import WHOLE, Bucket
from detectors.config import DetectorConfig
from detectors.envelope import Envelope
from detectors.history import History
from detectors.quorum import QuorumView
from detectors.remote import RemoteView
from detectors.rules.base import Rule
from detectors.stats import UnverifiedReason
from detectors.view import ClusterView, PartitionKey, PartitionState

# Alert ids remembered to suppress a second report of the same violation (the
# same fact seen from two sources, or a re-shipped event). Alerts are rare, so
# this bounds memory only for a cluster that is failing badly.
REMEMBERED_ALERT_IDS = 100_000


@dataclass
class Counters:
    """What happened to the events, for the summary and for metrics."""

    events: dict[str, int] = field(default_factory=dict)
    unverified: dict[str, int] = field(default_factory=dict)  # by UnverifiedReason value
    duplicates: int = 0
    late: int = 0
    dead_letters: dict[str, int] = field(default_factory=dict)  # by DeadLetterClass value
    alerts: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (rule, severity, status)

    def bump(self, table: dict[Any, int], key: Any) -> None:
        table[key] = table.get(key, 0) + 1

    def alerts_by_rule(self, status: str = FIRING) -> dict[str, int]:
        """Alerts of one status per rule: ``firing`` counts violations,
        ``resolved`` the timer alerts that ended."""
        by_rule: dict[str, int] = {}
        for (rule, _, alert_status), n in self.alerts.items():
            if alert_status == status:
                by_rule[rule] = by_rule.get(rule, 0) + n
        return by_rule


class ClusterState:
    def __init__(
        self,
        cluster: str,
        config: DetectorConfig,
        counters: Counters,
        now_ms: Callable[[], int],
        bucket: Bucket = WHOLE,
    ):
        """``bucket``: the part of the cluster's partitions this state judges
        (detectors.buckets); by default all of them."""
        self.cluster = cluster
        self.bucket = bucket
        self.config = config
        self.counters = counters
        self.now_ms = now_ms
        self.view = ClusterView(config.retention_ms)
        self.quorum = QuorumView()
        self.remote = RemoteView()
        # Newest controller epoch each broker accepted (StopReplica / LeaderAndIsr / UpdateMetadata).
        self.controller_epochs: dict[int, History[tuple[int, Evidence]]] = {}
        self.out: list[Alert] = []
        self._emitted: OrderedDict[str, None] = OrderedDict()

    def describe(self, key: PartitionKey) -> str:
        """``topic-partition`` with the topic's name where the view knows it."""
        name = self.view.topic_name(key[0]) or key[0].removeprefix("name:")
        return f"{name}-{key[1]}"

    def unverified(self, reason: str) -> None:
        """Count an event that cannot be judged; ``reason`` is an
        :class:`UnverifiedReason`, kept as its plain string value (counters are
        pickled with the detector and exported as metric labels)."""
        self.counters.bump(self.counters.unverified, str(reason))

    def partition_window(
        self, topic: str | None, topic_id: str | None, index: int, ts_ms: int
    ) -> tuple[PartitionKey, list[PartitionState]] | None:
        """The partition's states within the grace window around ``ts_ms``, or
        None (counted as unverified) when the view does not know the partition."""
        key = self.view.resolve_topic(topic, topic_id, ts_ms)
        history = self.view.partition((key, index)) if key else None
        if history is None:
            self.unverified(UnverifiedReason.UNKNOWN_PARTITION)
            return None
        grace = self.config.grace_ms
        states = history.window(ts_ms - grace, ts_ms + grace)
        if not states:
            self.unverified(UnverifiedReason.PARTITION_CREATED_AFTER)
            return None
        assert key is not None
        return (key, index), states

    def emit(
        self,
        rule: type[Rule],
        env: Envelope,
        *,
        message: str,
        node: int | None,
        identity: Iterable[object],
        evidence: Iterable[Evidence] = (),
        partition_key: PartitionKey | None = None,
        status: str = FIRING,
        severity: str | None = None,
        ts_ms: int | None = None,
        violation_summary: str | None = None,
    ) -> None:
        """Raise an alert once. ``identity`` names the violation (never a read
        position or wall time): it makes the alert id."""
        topic_key, index = partition_key if partition_key else (None, None)
        topic_id = topic_key if topic_key and not topic_key.startswith("name:") else None
        topic = self.view.topic_name(topic_key) or (
            topic_key.removeprefix("name:") if topic_key and topic_key.startswith("name:") else None
        )
        alert_id = make_alert_id(self.cluster, rule.id, status, topic_key, index, node, *identity)
        if alert_id in self._emitted:
            return
        self._emitted[alert_id] = None
        if len(self._emitted) > REMEMBERED_ALERT_IDS:
            self._emitted.popitem(last=False)
        chain = (*evidence, Evidence.of("violation", env, violation_summary or message))
        alert = Alert(
            alert_id=alert_id,
            rule=rule.id,
            severity=severity or rule.severity,
            status=status,
            cluster=self.cluster,
            topic=topic,
            topic_id=topic_id,
            partition=index,
            node=node,
            ts_ms=env.ts_ms if ts_ms is None else ts_ms,
            detected_ms=self.now_ms(),
            message=message,
            evidence=chain,
            links=rule.links(),
        )
        self.counters.bump(self.counters.alerts, (rule.id, alert.severity, status))
        self.out.append(alert)
