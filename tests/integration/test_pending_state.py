"""Pending judgments in their own state variable (streaming.pending_store), in
a real query: a job stopped mid-grace leaves its waiting judgments in the
``pending`` state and none in the detector values, and a job restarted from
that checkpoint, with nothing cached, judges each of them once: the two runs
together raise exactly what ``fencewatch replay`` raises."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from test_job import job_options, publish, read_topic, replay_alerts, wait_for
from test_upgrade_checkpoint import relocate, state

from producers.simulator import SimConfig, Simulator
from streaming import snapshot_format
from streaming.broker import EmbeddedBroker
from streaming.job import start
from streaming.pending_store import JUDGMENTS

pytestmark = pytest.mark.integration

EVENTS, SPLIT = 3000, 1500
WAIT_SECONDS = 300


def rows_read(query: Any) -> int:
    return sum(p["numInputRows"] for p in query.recentProgress)


def waiting_judgments(chunks: list[Any]) -> int:
    judgments, decided = 0, 0
    for row in chunks:
        data = snapshot_format.decode(row.user_map_value.data)
        if row.user_map_key.record == JUDGMENTS:
            judgments += len(data)
        else:
            decided += len(data)
    return judgments - decided


@pytest.mark.timeout(900)
def test_a_job_stopped_mid_grace_keeps_its_judgments_apart_and_judges_each_once_after(
    spark, broker: EmbeddedBroker, make_topic, tmp_path: Path
):
    config = SimConfig(seed=21, fault_rate=0.02, warmup_ms=1000, events_per_second=500)
    events = list(Simulator(config).events(EVENTS))
    records = [(b"sim-1", orjson.dumps(e)) for e in events]
    expected = replay_alerts(events)
    # No idle flush in the first run: what waits at the stop stays waiting.
    options = dataclasses.replace(
        job_options(broker, make_topic, tmp_path, max_events_per_trigger=500), idle_flush_ms=3_600_000
    )
    publish(broker, options.topic, records[:SPLIT])
    query = start(spark, options, console=None)
    try:
        wait_for(lambda: rows_read(query) == SPLIT, query, WAIT_SECONDS, "the first part read")
    finally:
        query.stop()
    assert query.exception() is None, query.exception()

    detectors = state(spark, options.checkpoint, "detector")
    assert detectors, "no detector state was written"
    for row in detectors:
        detector = snapshot_format.decode(row.value.snapshot)
        assert all(not cs.pending for cs in detector.clusters.values()), "a detector value holds judgments"
    waiting = waiting_judgments(state(spark, options.checkpoint, "pending"))
    assert waiting > 0, "no judgment was waiting at the stop: the restart would not test restoring them"

    # A copy of the checkpoint is another query scope: no worker holds its detectors.
    moved = tmp_path / "moved"
    shutil.copytree(options.checkpoint, moved)
    relocate(moved, f"file:{options.checkpoint}")
    rest = dataclasses.replace(options, checkpoint=str(moved), idle_flush_ms=2_000)
    publish(broker, options.topic, records[SPLIT:])
    query = start(spark, rest, console=None)
    try:
        wait_for(lambda: rows_read(query) == EVENTS - SPLIT, query, WAIT_SECONDS, "the rest read")

        def idle_batches() -> int:
            return sum(
                1 for p in query.recentProgress if p["numInputRows"] == 0 and "addBatch" in p["durationMs"]
            )

        wait_for(lambda: idle_batches() >= 2, query, 60, "the idle flush")
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    assert waiting_judgments(state(spark, rest.checkpoint, "pending")) == 0

    ids = [headers["fencewatch-id"] for headers, _ in read_topic(broker, options.alerts_topic)]
    assert len(ids) == len(set(ids)), f"alerts delivered twice: {sorted(i for i in ids if ids.count(i) > 1)}"
    missing, extra = sorted(set(expected) - set(ids)), sorted(set(ids) - set(expected))
    assert not missing and not extra, (
        f"missing {missing}, extra {extra} ({waiting} judgments waited at the stop)"
    )
