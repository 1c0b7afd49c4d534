"""Metrics: detector snapshots, the exposition format, lag estimates, the
listener's handling of query progress."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from detectors import rules
from detectors.engine import Detector
from detectors.envelope import DeadLetter, envelope_from_obj
from detectors.stats import DEAD_LETTER_CLASSES, dead_letter_class
from producers.simulator import SimConfig, Simulator
from streaming.listener import JobListener, LagEstimator, offsets_total
from streaming.metrics import Metrics


def simulated_detector(events: int = 8_000) -> Detector:
    detector = Detector()
    sim = Simulator(SimConfig(seed=3, fault_rate=0.02, warmup_ms=1_000))
    for i, event in enumerate(sim.events(events)):
        detector.ingest(envelope_from_obj(event, f"mem:{i}", i))
    detector.flush()
    detector.drain()
    return detector


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parse the exposition text, as Prometheus would scrape it."""
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_snapshot_counts_match_the_detector():
    detector = simulated_detector()
    detector.dead_letter(DeadLetter("mem:x", "malformed JSON: unexpected end of data", ""))
    metrics = Metrics(CollectorRegistry())
    metrics.detector.update(detector.snapshot("sim-1"))
    scraped = samples(metrics)

    def total(name: str, **labels: str) -> float:
        return sum(
            v
            for (n, ls), v in scraped.items()
            if n == name and all(dict(ls).get(k) == x for k, x in labels.items())
        )

    counters = detector.counters
    assert total("fencewatch_events_total") == sum(counters.events.values())
    assert (
        total("fencewatch_events_total", kind="request", api="PRODUCE") == counters.events["request:PRODUCE"]
    )
    assert total("fencewatch_alerts_total") == sum(counters.alerts.values()) > 0
    assert total("fencewatch_dead_letters_total", reason="malformed_json") == 1
    assert total("fencewatch_unverified_events_total") == sum(counters.unverified.values())
    assert total("fencewatch_tracked_partitions", cluster="sim-1") > 0
    assert total("fencewatch_brokers", state="registered") >= total("fencewatch_brokers", state="fenced")


def test_every_rule_has_a_zero_firing_series_before_its_first_alert():
    """increase() cannot see a counter's first increment if the series is born at 1."""
    metrics = Metrics(CollectorRegistry())
    metrics.detector.update(Detector().snapshot("quiet"))
    scraped = samples(metrics)
    for rule in rules.RULES.values():
        key = (
            "fencewatch_alerts_total",
            (("cluster", "quiet"), ("rule", rule.id), ("severity", rule.severity), ("status", "firing")),
        )
        assert scraped[key] == 0, rule.id


def test_an_older_snapshot_never_replaces_a_newer_one():
    metrics = Metrics(CollectorRegistry())
    snapshot = Detector().snapshot("c")
    metrics.detector.update({**snapshot, "late": 5, "state_version": 7})
    metrics.detector.update({**snapshot, "late": 2, "state_version": 6})
    assert metrics.registry.get_sample_value("fencewatch_late_events_total", {"cluster": "c"}) == 5
    metrics.detector.update({**snapshot, "late": 6, "state_version": 8})
    assert metrics.registry.get_sample_value("fencewatch_late_events_total", {"cluster": "c"}) == 6


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("malformed JSON: unexpected end of data", "malformed_json"),
        ("not UTF-8: invalid start byte", "not_utf8"),
        ("missing field body.request.header", "missing_field"),
        ("missing required field(s): ts_ms", "missing_field"),
        ("body.data.leaderEpoch = 99999999999 is out of range for its Kafka type", "out_of_range"),
        ("ts_ms must be integer", "wrong_type"),
        (
            "record key 'a' differs from the envelope's cluster 'b': publish records keyed by cluster",
            "cluster_mismatch",
        ),
        ("something nobody foresaw", "invalid"),
    ],
)
def test_dead_letter_reasons_fall_into_a_fixed_set_of_classes(reason: str, expected: str):
    assert dead_letter_class(reason) == expected
    assert expected in DEAD_LETTER_CLASSES


def test_offsets_total_reads_both_source_formats():
    assert offsets_total('{"0": 10, "1": 5}') == 15
    assert offsets_total('{"events": {"0": 10, "1": 5}}') == 15
    assert offsets_total(None) is None


def test_lag_in_seconds_is_how_long_ago_the_oldest_unread_record_arrived():
    lag = LagEstimator()
    assert lag.observe(100.0, latest_total=50, end_total=50) == (0, 0.0)
    assert lag.observe(101.0, latest_total=80, end_total=50) == (30, 0.0)  # record 50 appeared at 101
    assert lag.observe(105.0, latest_total=120, end_total=60) == (60, 4.0)
    assert lag.observe(106.0, latest_total=120, end_total=120) == (0, 0.0)


def test_lag_history_restarts_when_offsets_go_back():
    lag = LagEstimator()
    lag.observe(100.0, latest_total=500, end_total=400)
    assert lag.observe(200.0, latest_total=10, end_total=0) == (10, 0.0)


def progress(name: str, duration_ms: int, rows: int, end: dict, latest: dict) -> SimpleNamespace:
    source = SimpleNamespace(endOffset=json.dumps(end), latestOffset=json.dumps(latest))
    return SimpleNamespace(
        progress=SimpleNamespace(
            name=name,
            batchDuration=duration_ms,
            numInputRows=rows,
            inputRowsPerSecond=float("nan"),
            processedRowsPerSecond=250.0,
            sources=[source],
        )
    )


def test_listener_turns_progress_into_metrics_for_its_own_query_only():
    metrics = Metrics(CollectorRegistry())
    stopped = []
    listener = JobListener(
        metrics, "fencewatch", "events", on_terminated=lambda: stopped.append(1), clock=lambda: 50.0
    )
    listener.onQueryStarted(SimpleNamespace(name="fencewatch", id="q1"))
    listener.onQueryProgress(progress("fencewatch", 1500, 100, {"0": 100}, {"0": 130}))
    listener.onQueryProgress(progress("other", 9000, 7, {"0": 1}, {"0": 1}))
    get = metrics.registry.get_sample_value
    assert get("fencewatch_query_running") == 1
    assert get("fencewatch_batches_total") == 1
    assert get("fencewatch_batch_duration_seconds_sum") == 1.5
    assert get("fencewatch_source_events_total", {"topic": "events"}) == 100
    assert get("fencewatch_source_lag_events", {"topic": "events"}) == 30
    assert get("fencewatch_input_events_per_second") == 0  # Spark's NaN for an empty rate
    assert get("fencewatch_processed_events_per_second") == 250
    assert get("fencewatch_last_batch_timestamp_seconds") == 50
    listener.onQueryTerminated(SimpleNamespace(id="other-query", exception=None))
    assert get("fencewatch_query_running") == 1 and not stopped
    listener.onQueryTerminated(SimpleNamespace(id="q1", exception="boom"))
    assert get("fencewatch_query_running") == 0
    assert get("fencewatch_query_failures_total") == 1
    assert stopped == [1]
