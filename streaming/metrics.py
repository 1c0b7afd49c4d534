"""Every Prometheus metric fencewatch exports, defined in this one module.

All metrics live on the registry handed to :class:`Metrics` (tests use a fresh
``CollectorRegistry()``). Names follow Prometheus conventions: ``fencewatch_``
prefix, ``_total`` for counters, base units (seconds). Label sets are bounded:
cluster, rule id, severity, status, event kind, Kafka API name, reason class,
webhook endpoint name and source topic. No per-partition series; the
per-node ones (each node's measured clock offset) are bounded by the nodes of
a cluster, its brokers and controllers.

Detector counters are not counted here: the stateful operator keeps them in
its checkpointed state and ships a snapshot per cluster bucket with each
micro-batch (``detectors.stats``); :class:`DetectorCollector` exposes the
newest snapshot of each bucket, merged per cluster, at scrape time. So they
restart from the checkpoint with the state, and a re-run batch never counts
an event twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from detectors import rules
from detectors.alerts import CERTAIN, POSSIBLE
from detectors.stats import merge_buckets, split_event_key

log = logging.getLogger(__name__)

BROKER_STATES = ("registered", "fenced", "controlled_shutdown")
BATCH_SECONDS_BUCKETS = (0.25, 0.5, 1, 2, 3, 5, 8, 13, 21, 34, 60, 120, 300)


def measured_clock_offsets(
    snapshot: Mapping[str, Any],
) -> Iterator[tuple[str, float | None, float | None, int]]:
    """(node, low, high, evidence) for each node of ``snapshot`` whose clock
    offset to the metadata log's was measured, the bounds in seconds.

    A node without evidence (``measured`` false) is left out: its 0..0 is an
    assumption, not a measurement. So is a node whose bounds contradict each
    other (low above high: its offset is unknown). A bound the evidence does
    not give (None in the snapshot) is None. A snapshot of a release without
    clock offsets (an older checkpoint's) has no ``clock_offsets`` at all."""
    for node, offset in sorted((snapshot.get("clock_offsets") or {}).items()):
        low, high = offset.get("low_ms"), offset.get("high_ms")
        if not offset.get("measured") or (low is None and high is None):
            continue
        if low is not None and high is not None and low > high:
            continue
        yield (
            str(node),
            None if low is None else low / 1000,
            None if high is None else high / 1000,
            int(offset.get("evidence", 0)),
        )


class DetectorCollector(Collector):
    """Exposes the newest detector snapshot of each cluster bucket, merged per
    cluster (see detectors.stats)."""

    def __init__(self) -> None:
        self._snapshots: dict[tuple[str, int], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._contradicted: set[tuple[str, str]] = set()  # (cluster, node) already logged

    def update(self, snapshot: Mapping[str, Any]) -> None:
        """Keep ``snapshot`` unless a newer one (higher ``state_version``) of
        its bucket is held. A snapshot without a bucket is of bucket 0. A node
        whose clock evidence first contradicts the bound given for it is
        logged, once (and exported as fencewatch_clock_bound_contradicted)."""
        key = (str(snapshot["cluster"]), int(snapshot.get("bucket", 0)))
        with self._lock:
            held = self._snapshots.get(key)
            if held is None or held.get("state_version", 0) <= snapshot.get("state_version", 0):
                self._snapshots[key] = dict(snapshot)
            for node, (low, high, bound) in sorted((snapshot.get("clock_bound_contradicted") or {}).items()):
                if (key[0], node) not in self._contradicted:
                    self._contradicted.add((key[0], node))
                    log.warning(
                        "cluster %s: node %s's clock evidence (offset %d..%d ms against the metadata "
                        "log's) contradicts --clock-bound-ms %d given for it: the bound is wrong or the "
                        "clock broke; verdicts use the evidence",
                        key[0],
                        node,
                        low,
                        high,
                        bound,
                    )

    def clusters(self) -> list[str]:
        with self._lock:
            return sorted({cluster for cluster, _ in self._snapshots})

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            by_cluster: dict[str, list[dict[str, Any]]] = {}
            for (cluster, _), snap in sorted(self._snapshots.items()):
                by_cluster.setdefault(cluster, []).append(snap)
        snapshots = [merge_buckets(snaps) for snaps in by_cluster.values()]
        events = CounterMetricFamily(
            "fencewatch_events",
            "Events judged, by kind and (for requests) Kafka API",
            labels=["cluster", "kind", "api"],
        )
        unverified = CounterMetricFamily(
            "fencewatch_unverified_events",
            "Events that could not be checked (the view lacked their partition, broker or segment)",
            labels=["cluster", "reason"],
        )
        dead_letters = CounterMetricFamily(
            "fencewatch_dead_letters",
            "Records sent to the dead-letter topic, by reason class",
            labels=["cluster", "reason"],
        )
        alerts = CounterMetricFamily(
            "fencewatch_alerts",
            "Alerts raised, by rule, severity, status (firing, or resolved for timer rules) and "
            "confidence (certain: holds for every clock offset the evidence allows; possible: for some, "
            "at severity info)",
            labels=["cluster", "rule", "severity", "status", "confidence"],
        )
        bound_contradicted = GaugeMetricFamily(
            "fencewatch_clock_bound_contradicted",
            "1 for a node whose clock evidence contradicts the bound given for it (--clock-bound-ms): the "
            "bound is wrong or the clock broke, and verdicts use the evidence",
            labels=["cluster", "node"],
        )
        late = CounterMetricFamily(
            "fencewatch_late_events",
            "Events that arrived later than the lateness allowance",
            labels=["cluster"],
        )
        duplicates = CounterMetricFamily(
            "fencewatch_duplicate_records",
            "Records delivered again (the same identity: see detectors.redelivery) and skipped",
            labels=["cluster"],
        )
        open_alerts = GaugeMetricFamily(
            "fencewatch_open_alerts",
            "Timer alerts firing and not yet resolved (zombie quorum leaders)",
            labels=["cluster", "rule"],
        )
        brokers = GaugeMetricFamily(
            "fencewatch_brokers",
            "Brokers by their state in the metadata log (fenced and controlled_shutdown are subsets of "
            "registered)",
            labels=["cluster", "state"],
        )
        tracked = {
            name: GaugeMetricFamily(
                f"fencewatch_tracked_{name}",
                f"{name.capitalize()} in the detector's view",
                labels=["cluster"],
            )
            for name in ("partitions", "topics", "brokers")
        }
        pending = GaugeMetricFamily(
            "fencewatch_pending_judgments",
            "Request outcomes waiting for their grace window before they are judged",
            labels=["cluster"],
        )
        newest = GaugeMetricFamily(
            "fencewatch_newest_event_timestamp_seconds",
            "Event time of the newest event processed (Unix seconds)",
            labels=["cluster"],
        )
        clock_offset = GaugeMetricFamily(
            "fencewatch_clock_offset_seconds",
            "A node's clock minus the metadata log's lies between the low and the high bound, measured from "
            "causal evidence in Kafka's logs (a node without evidence has no series)",
            labels=["cluster", "node", "bound"],
        )
        clock_evidence = GaugeMetricFamily(
            "fencewatch_clock_offset_evidence",
            "How much causal evidence (buckets of the node's time holding some) a node's measured clock "
            "offset rests on",
            labels=["cluster", "node"],
        )
        for snap in snapshots:
            cluster = snap["cluster"]
            for key, n in sorted(snap["events"].items()):
                kind, api = split_event_key(key)
                events.add_metric([cluster, kind, api], n)
            for reason, n in sorted(snap["unverified"].items()):
                unverified.add_metric([cluster, reason], n)
            for reason, n in sorted(snap["dead_letters"].items()):
                dead_letters.add_metric([cluster, reason], n)
            # Every rule's firing series exists from the start at 0, so that
            # increase() sees the first alert of a rule (a series born at 1 shows none).
            raised = {(rule, severity, status): n for rule, severity, status, n in snap["alerts"]}
            for rule in rules.RULES.values():
                raised.setdefault((rule.id, rule.severity, "firing"), 0)
            for (rule_id, severity, status), n in sorted(raised.items()):
                alerts.add_metric([cluster, rule_id, severity, status, CERTAIN], n)
            for rule_id, severity, status, n in sorted(snap.get("possible_alerts", ())):
                alerts.add_metric([cluster, rule_id, severity, status, POSSIBLE], n)
            for node in sorted(snap.get("clock_bound_contradicted") or {}):
                bound_contradicted.add_metric([cluster, node], 1)
            late.add_metric([cluster], snap["late"])
            duplicates.add_metric([cluster], snap["duplicates"])
            open_alerts.add_metric(
                [cluster, "QUORUM_ZOMBIE_LEADER"], snap["open_alerts"].get("QUORUM_ZOMBIE_LEADER", 0)
            )
            for state in BROKER_STATES:
                brokers.add_metric([cluster, state], snap["brokers"][state])
            for name, family in tracked.items():
                family.add_metric([cluster], snap[f"tracked_{name}"])
            pending.add_metric([cluster], snap["pending_judgments"])
            if snap["newest_event_ts_ms"] is not None:
                newest.add_metric([cluster], snap["newest_event_ts_ms"] / 1000)
            # Built anew at every scrape: a node no longer in the snapshot has no series.
            for node, low, high, evidence in measured_clock_offsets(snap):
                for bound, value in (("low", low), ("high", high)):
                    if value is not None:
                        clock_offset.add_metric([cluster, node, bound], value)
                clock_evidence.add_metric([cluster, node], evidence)
        yield from (events, unverified, dead_letters, alerts, late, duplicates, open_alerts, brokers)
        yield from tracked.values()
        yield from (pending, newest, clock_offset, clock_evidence, bound_contradicted)


class Metrics:
    """The job's metrics on one registry: detector snapshots, the query's
    progress, the sinks, webhook delivery and the probe (probe.report.record).

    ``job``: whether the process runs the streaming job; ``fencewatch probe`` alone
    exports no query, source or sink series (a query that never ran would read as
    one that stopped)."""

    def __init__(self, registry: CollectorRegistry, *, job: bool = True):
        self.registry = registry
        self.detector = DetectorCollector()
        registry.register(self.detector)
        self.build = Info("fencewatch_build", "fencewatch version", registry=registry)

        # ---- the probe (fed by probe.report.record) ----
        self.probe_requests = Counter(
            "fencewatch_probe_requests",
            "Probe requests, by Kafka API and outcome (conforming, deviating, other_error, failed; "
            "unsupported: an API the broker does not take with currentLeaderEpoch, once per round)",
            ["cluster", "api", "outcome"],
            registry=registry,
        )
        self.probe_deviations = Counter(
            "fencewatch_probe_deviations",
            "Confirmed deviations from Kafka's fencing answers (PROBE_* rules)",
            ["cluster", "rule"],
            registry=registry,
        )
        self.probe_last_success = Gauge(
            "fencewatch_probe_last_success_timestamp_seconds",
            "When a probe round last got an answer to every request (Unix seconds)",
            ["cluster"],
            registry=registry,
        )
        if job:
            self._job_metrics(registry)
        self._webhook_metrics(registry)

    def _job_metrics(self, registry: CollectorRegistry) -> None:
        # ---- the streaming query (fed by streaming.listener) ----
        self.query_running = Gauge(
            "fencewatch_query_running",
            "1 while the streaming query runs, 0 once it stopped",
            registry=registry,
        )
        self.query_failures = Counter(
            "fencewatch_query_failures", "Streaming query terminations with an error", registry=registry
        )
        self.batches = Counter("fencewatch_batches", "Micro-batches completed", registry=registry)
        self.batch_duration = Histogram(
            "fencewatch_batch_duration_seconds",
            "Wall time of each micro-batch",
            buckets=BATCH_SECONDS_BUCKETS,
            registry=registry,
        )
        self.last_batch = Gauge(
            "fencewatch_last_batch_timestamp_seconds",
            "When the query last started, completed a micro-batch or reported itself idle (Unix seconds)",
            registry=registry,
        )
        self.source_events = Counter(
            "fencewatch_source_events", "Records read from the event topic", ["topic"], registry=registry
        )
        self.input_rate = Gauge(
            "fencewatch_input_events_per_second",
            "Arrival rate Spark measured over the newest micro-batch",
            registry=registry,
        )
        self.processing_rate = Gauge(
            "fencewatch_processed_events_per_second",
            "Processing rate Spark measured over the newest micro-batch",
            registry=registry,
        )
        self.source_lag_events = Gauge(
            "fencewatch_source_lag_events",
            "Records in the event topic not yet processed",
            ["topic"],
            registry=registry,
        )
        self.source_lag_seconds = Gauge(
            "fencewatch_source_lag_seconds",
            "How long ago the oldest unprocessed record became available (0 when caught up)",
            ["topic"],
            registry=registry,
        )
        self.source_offsets_lost = Counter(
            "fencewatch_source_offsets_lost",
            "Offsets of the event topic that vanished before the job read them (retention, truncation, "
            "a recreated topic)",
            ["topic"],
            registry=registry,
        )

        # ---- sinks ----
        self.sink_records = Counter(
            "fencewatch_sink_records",
            "Records delivered to a sink for the first time (alerts topic, dead-letter topic)",
            ["sink"],
            registry=registry,
        )

    def _webhook_metrics(self, registry: CollectorRegistry) -> None:
        # ---- webhook delivery (fed by webhooks.dispatcher) ----
        self.webhook_deliveries = Counter(
            "fencewatch_webhook_deliveries",
            "Alerts delivered to a webhook endpoint",
            ["endpoint"],
            registry=registry,
        )
        self.webhook_failures = Counter(
            "fencewatch_webhook_failures",
            "Failed delivery attempts, by reason (timeout, connection, http_3xx, http_4xx, http_5xx)",
            ["endpoint", "reason"],
            registry=registry,
        )
        self.webhook_parkings = Counter(
            "fencewatch_webhook_parkings",
            "Alerts parked (given up on until an operator resends them), by reason (rejected, redirect, "
            "unrenderable, retries_exhausted, max_age)",
            ["endpoint", "reason"],
            registry=registry,
        )
        self.webhook_parked = Gauge(
            "fencewatch_webhook_parked",
            "Alerts parked in the outbox for an endpoint, waiting for `fencewatch webhooks resend`",
            ["endpoint"],
            registry=registry,
        )
        self.webhook_rate_limited = Counter(
            "fencewatch_webhook_rate_limited",
            "Deliveries held back by the endpoint's rate limit",
            ["endpoint"],
            registry=registry,
        )
        self.webhook_backlog = Gauge(
            "fencewatch_webhook_backlog",
            "Alerts waiting in the outbox for an endpoint (retry backlog)",
            ["endpoint"],
            registry=registry,
        )
        self.webhook_oldest_pending = Gauge(
            "fencewatch_webhook_oldest_pending_seconds",
            "Age of the oldest alert waiting for an endpoint (0 when none waits)",
            ["endpoint"],
            registry=registry,
        )


def serve(metrics: Metrics, port: int, addr: str = "0.0.0.0") -> int:
    """Serve ``/metrics`` on ``port`` (0: any free port) in a daemon thread; returns the port."""
    server, _ = start_http_server(port, addr=addr, registry=metrics.registry)
    return int(server.server_port)
