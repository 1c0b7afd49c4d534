"""Offsets that vanish, without a broker or Spark: how the source plans past a
log that went back, how the listener reports loss rows, and the publish mark's
format. The broker and Spark sides are in tests/integration
(test_source_offsets_lost.py, test_sinks_exactly_once.py)."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry
from pyspark.sql import Row

from streaming.delivery_ledger import PublishMark, newest_usable
from streaming.kafka_source import LOST_OFFSETS_METRIC, LogSpan, plan_ends
from streaming.listener import JobListener, _ProgressAsJson
from streaming.metrics import Metrics


def test_a_log_that_ends_before_the_position_restarts_per_starting_offsets() -> None:
    position = {"0": 300, "1": 50, "2": 70}
    spans = {
        "0": LogSpan(start=0, end=120, confirmed=True),  # recreated: ends before 300
        "1": LogSpan(start=0, end=80, confirmed=True),  # grew: read on
        "2": LogSpan(start=0, end=60, confirmed=False),  # a ListOffsets value that may lag: wait
    }
    assert plan_ends(position, spans, "earliest") == ({"1": 80, "2": 70}, {"0": 0})
    assert plan_ends(position, spans, "latest") == ({"1": 80, "2": 70}, {"0": 120})


def test_partitions_new_or_gone_plan_as_before() -> None:
    ends, resets = plan_ends(
        {"0": 10, "5": 7}, {"0": LogSpan(0, 10, True), "1": LogSpan(0, 4, True)}, "earliest"
    )
    # New partition 1 from offset 0; partition 5, gone from the metadata, keeps its offset.
    assert (ends, resets) == ({"0": 10, "1": 4, "5": 7}, {})


def progress(rows: int, ranges: list[Row]) -> SimpleNamespace:
    source = SimpleNamespace(endOffset=json.dumps({"0": 400}), latestOffset=json.dumps({"0": 400}))
    return SimpleNamespace(
        progress=SimpleNamespace(
            name="fencewatch",
            batchDuration=100,
            numInputRows=rows,
            inputRowsPerSecond=1.0,
            processedRowsPerSecond=1.0,
            sources=[source],
            observedMetrics={LOST_OFFSETS_METRIC: Row(ranges=ranges)},
        )
    )


def test_the_listener_logs_and_counts_each_lost_range(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics(CollectorRegistry())
    listener = JobListener(metrics, "fencewatch", "events")
    lost = [Row(partition=0, first=100, offsets=200), Row(partition=2, first=7, offsets=3)]
    with caplog.at_level(logging.WARNING, logger="streaming.listener"):
        listener.onQueryProgress(progress(rows=52, ranges=lost))
        listener.onQueryProgress(progress(rows=10, ranges=[]))
    get = metrics.registry.get_sample_value
    assert get("fencewatch_source_offsets_lost_total", {"topic": "events"}) == 203
    # The two loss rows Spark counted as input rows are not records.
    assert get("fencewatch_source_events_total", {"topic": "events"}) == 50 + 10
    assert [r.getMessage() for r in caplog.records] == [
        "topic events partition 0: 200 offsets [100, 300) vanished before the job read them (retention, "
        "truncation, or the topic was deleted and recreated); their records were not judged",
        "topic events partition 2: 3 offsets [7, 10) vanished before the job read them (retention, "
        "truncation, or the topic was deleted and recreated); their records were not judged",
    ]


def report_json(rows: int, ranges: list[dict[str, int]]) -> str:
    """A progress report as the JVM writes it (``StreamingQueryProgress.json()``)."""
    offsets = json.dumps({"0": 400})
    source = {
        "description": "fencewatch-kafka",
        "startOffset": offsets,
        "endOffset": offsets,
        "latestOffset": offsets,
        "numInputRows": rows,
        "inputRowsPerSecond": 1.0,
        "processedRowsPerSecond": 1.0,
        "metrics": {},
    }
    return json.dumps(
        {
            "id": "9b2c2c8e-6d0a-4a5e-8a57-2f3c0c1d7f10",
            "runId": "0b7e3c55-3b8e-4c39-9a9d-6c8c8b0e4a21",
            "name": "fencewatch",
            "timestamp": "2026-11-27T05:00:00.000Z",
            "batchId": 7,
            "batchDuration": 100,
            "durationMs": {"triggerExecution": 100},
            "stateOperators": [],
            "sources": [source],
            "sink": {"description": "ForeachBatchSink", "numOutputRows": -1},
            "numInputRows": rows,
            "inputRowsPerSecond": 1.0,
            "processedRowsPerSecond": 1.0,
            "observedMetrics": {LOST_OFFSETS_METRIC: {"ranges": ranges}},
        }
    )


def test_the_listener_reads_each_report_as_json_in_one_call(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics(CollectorRegistry())
    listener = JobListener(metrics, "fencewatch", "events")
    calls: list[str] = []

    def event(report: str) -> SimpleNamespace:
        def json_of() -> str:
            calls.append("json")
            return report

        return SimpleNamespace(progress=lambda: SimpleNamespace(json=json_of))

    java_side = _ProgressAsJson(listener)
    with caplog.at_level(logging.WARNING, logger="streaming.listener"):
        java_side.onQueryProgress(event(report_json(21, [{"partition": 1, "first": 40, "offsets": 1}])))
    assert calls == ["json"]
    get = metrics.registry.get_sample_value
    assert get("fencewatch_source_offsets_lost_total", {"topic": "events"}) == 1
    assert get("fencewatch_source_events_total", {"topic": "events"}) == 20
    assert [r.getMessage()[:46] for r in caplog.records] == ["topic events partition 1: 1 offsets [40, 41) v"]


def test_a_publish_mark_survives_its_file_format() -> None:
    mark = PublishMark(12, {"alerts": {0: 5, 3: 9}, "dead": {}})
    assert PublishMark.from_json(mark.to_json()) == mark
    for damaged in (b"", b"{", b'{"batch_id": 1}', b'{"batch_id": "x", "ends": {}}', b"[]"):
        with pytest.raises(ValueError, match="not a publish mark"):
            PublishMark.from_json(damaged)


def test_the_marks_to_try_are_those_not_after_the_first_batch_newest_first() -> None:
    assert newest_usable([3, 9, 5, 4], first_batch=5) == [5, 4, 3]
    assert newest_usable([9], first_batch=5) == []
