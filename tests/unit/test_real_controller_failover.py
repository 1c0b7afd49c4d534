"""A real controller fail-over's election silence is no step of the metadata
log's clock (MetadataClock._place, Detector._place_metadata).

Kafka 4.4.0 under ``fencewatch kafka-lab --nemesis --seed 1`` (2026-12-07):
controller 103, the active one, was SIGKILLed; 102 took the log over (its
LeaderChange at offset 1850) after 2.3 s of silence, every node on one
machine's clock. Taken for a step of 1.8 s forward, the silence moved every
later record 1.8 s early: the record giving lab-orders-4 leader epoch 2
(offset 1900) was placed before broker 3's fetches that still carried epoch 1
(its followers had not yet heard of it), and 32 FETCH_STALE_EPOCH_SERVED
alerts fired on broker 3, certain, every one false. Now the silence is placed
as a silence, and the bounds from before allow a step hidden in it instead
(ClockBook.taken_over). The data are Kafka's own
files of that run: controller 101's metadata segment and bootstrap snapshot,
and broker 3's request log from 22:24:00 to 22:25:19 (tests/data/README.md).
"""

from __future__ import annotations

from pathlib import Path

from kafka_files import DATA, metadata_log_envelopes, request_log_envelopes

from fencewatch.replay import replay_config
from lab.verdict import judge

CLUSTER = "lab"


def _envelopes(tmp_path: Path) -> list[Path]:
    metadata = tmp_path / "metadata.jsonl"
    metadata_log_envelopes(
        DATA / "failover-00000000000000000000-0000000000.checkpoint",
        DATA / "failover-00000000000000000000.log.gz",
        metadata,
        cluster=CLUSTER,
        node=101,
    )
    requests = tmp_path / "broker-3.jsonl"
    stats = request_log_envelopes(
        DATA / "failover-broker-3-request.log.gz", requests, source="broker-3", cluster=CLUSTER, node=3
    )
    assert stats.dead_letters == 0 and stats.records > 500
    return [metadata, requests]


def test_the_election_silence_is_not_a_step_and_no_stale_fetch_is_raised(tmp_path: Path) -> None:
    judged = judge(_envelopes(tmp_path), replay_config())
    clock = judged.detector.clusters[CLUSTER].metadata_clock
    # The silence before 102's LeaderChange (2.3 s, every clock right) moved nothing.
    assert [offset for offset, _ in clock.steps] == [], clock.steps
    assert clock.shift_ms == 0
    assert judged.alerts == [], [a["message"] for a in judged.alerts[:3]]
    assert judged.dead_letters == []
    # Broker 3's fetches were judged, not left aside.
    assert judged.detector.counters.events.get("request:FETCH", 0) > 500
    # The log changed hands twice (103 at offset 933, 102 back at 1850) and ends with 102.
    assert clock.writer is not None and clock.writer[1] == 102
