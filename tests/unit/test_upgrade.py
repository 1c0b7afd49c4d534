"""A detector snapshot written by the previous release restores in this one.

``tests/data/upgrade/detector-06212d9.pickle`` is a Detector pickled by
fencewatch at 06212d9 (the release before re-deliveries were recognised) after
the first 1,500 of 4,000 simulated events (seed 3, fault rate 0.02, warm-up
1 s), as the streaming job keeps it in its state store. Made with that tree's
code: ``Detector()``, ``ingest`` of each event, ``drain``, ``pickle.dumps``;
restored here as the job restores it (``snapshot_format.decode``: state format 0).
That release's simulator wrote remote log metadata without offsets; the events
are regenerated here the same way.
"""

from __future__ import annotations

from pathlib import Path

import detectors.rules  # noqa: F401  (registers every rule)
from detectors.engine import Detector
from detectors.envelope import envelope_from_obj
from producers.simulator import SimConfig, Simulator
from streaming import snapshot_format

SNAPSHOT = Path(__file__).resolve().parents[1] / "data" / "upgrade" / "detector-06212d9.pickle"
PREFIX = 1_500


def previous_release_events() -> list[dict]:
    # That release's simulator wrote no NoOps and kept faults clear of the grace window alone.
    config = SimConfig(seed=3, fault_rate=0.02, warmup_ms=1_000, noop_interval_ms=0, clock_slack_ms=0)
    events = list(Simulator(config).events(4_000))
    for event in events:
        if event["kind"] == "remote_log_metadata":
            event["offset"] = None
    return events


def alert_ids(detector: Detector, events: list[dict], start: int) -> tuple[set[str], list]:
    letters = []
    for i, event in enumerate(events[start:], start=start):
        letters.extend(detector.ingest(envelope_from_obj(event, f"mem:{i}", i)))
    letters.extend(detector.flush())
    return {a.alert_id for a in detector.drain()}, letters


def test_a_snapshot_of_the_previous_release_restores_and_goes_on_judging():
    events = previous_release_events()
    fresh = Detector()
    for i, event in enumerate(events[:PREFIX]):
        fresh.ingest(envelope_from_obj(event, f"mem:{i}", i))
    drained_before_the_snapshot = {a.alert_id for a in fresh.drain()}
    rest_ids, _ = alert_ids(fresh, events, PREFIX)

    restored = snapshot_format.decode(SNAPSHOT.read_bytes())
    continued_ids, letters = alert_ids(restored, events, PREFIX)
    assert letters == []
    assert rest_ids, "no alert after the snapshot: the test would show nothing"
    assert continued_ids == rest_ids
    assert not continued_ids & drained_before_the_snapshot


def test_the_restored_metadata_log_resumes_after_the_last_applied_offset():
    events = previous_release_events()
    restored = snapshot_format.decode(SNAPSHOT.read_bytes())
    cluster = restored.cluster("sim-1")
    last = max(e["offset"] for e in events[:PREFIX] if e["kind"] == "metadata")
    assert cluster.metadata_log.last == last
    # Re-delivering the prefix's metadata is recognised, not applied again.
    before = restored.counters.duplicates
    for i, event in enumerate(events[:PREFIX]):
        if event["kind"] == "metadata":
            assert restored.ingest(envelope_from_obj(event, f"again:{i}", i)) == []
    assert restored.counters.duplicates - before == sum(e["kind"] == "metadata" for e in events[:PREFIX])


def test_the_restored_remote_segments_are_kept_under_their_partitions():
    """That release kept tracked segments by id beside their partitions; this
    one keeps them under their partitions (state format 4)."""
    events = previous_release_events()
    fresh = Detector()
    for i, event in enumerate(events[:PREFIX]):
        fresh.ingest(envelope_from_obj(event, f"mem:{i}", i))
    restored = snapshot_format.decode(SNAPSHOT.read_bytes())

    def segments(detector: Detector) -> dict[tuple[str, int], list[tuple[str, int | None]]]:
        partitions = detector.cluster("sim-1").remote.partitions
        return {
            key: sorted((sid, seg.state) for sid, seg in part.segments.items())
            for key, part in partitions.items()
            if part.segments
        }

    assert segments(fresh), "no segment tracked at the snapshot: the test would show nothing"
    assert segments(restored) == segments(fresh)
