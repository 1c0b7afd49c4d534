"""A broker's clock that steps back mid-run (an NTP step) raises no certain
false alarm: what the step makes look like a violation is at most possible
(benchmarks/clock_campaign.py --step-grid measures it over seeds, sizes and
directions; docs/operations.md has the table).

Before: broker 3 stepped back 2 s (seed 2) had requests from before the step
measured by the bounds of after it, 1.8-2.8 s behind (a bucket of evidence
held node times the step wrote twice), and raised 4 certain
PRODUCE_ACCEPTED_BY_NON_LEADER false alarms; stepped back 4 s (seed 1), two
StopReplica answers of before and after the step, ordered by their times,
raised 2 certain STOP_REPLICA_STALE_CONTROLLER_ACCEPTED."""

from __future__ import annotations

from typing import Any

import pytest

from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import envelope_from_obj
from detectors.truth import confusion, possible_counts
from producers.sim_clocks import parse_clock
from producers.simulator import SimConfig, Simulator

EVENTS = 30_000
STEP_AT = "7500ms"  # halfway through the run


def judged(seed: int, step: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The alerts of ``EVENTS`` simulated events with broker 3's clock stepping by
    ``step`` halfway, judged in the order written, and the ground truth."""
    sim = Simulator(SimConfig(seed=seed, fault_rate=0.01, clocks=(parse_clock(f"3={step}@{STEP_AT}"),)))
    detector = Detector(DetectorConfig(measure_clocks=True), now_ms=lambda: 0)
    for i, (_, raw) in enumerate(sim.timed_events(EVENTS)):
        detector.ingest(envelope_from_obj(raw, f"sim:{i}", i))
    detector.flush()
    return [a.to_dict() for a in detector.drain()], sim.truth


@pytest.mark.parametrize(("seed", "step"), [(2, "-2s"), (1, "-4s")])
def test_a_broker_clock_stepped_back_raises_no_certain_false_alarm(seed, step):
    alerts, truth = judged(seed, step)
    table = confusion(alerts, truth)
    assert {k: v for k, v in table.items() if v["fp"]} == {}
    caught, _ = possible_counts(alerts, truth)
    injected = sum(row["tp"] + row["fn"] for row in table.values())
    assert sum(row["tp"] for row in table.values()) + caught == injected > 0


def test_a_brokers_deletions_after_its_clock_stepped_back_8s_are_at_most_possible():
    """Seed 3, broker 3 stepped back 8 s: its request lines after the step are
    refused as too late (Detector._first_delivery), so its clock evidence never
    shows the step, and its remote segment deletions, judged by its clock of
    before, were placed 8 s early where it did not lead: 6 certain false
    REMOTE_SEGMENT_ZOMBIE_DELETE. Stamped behind its own earlier records of the
    remote log (RemoteView.behind), they are possible violations now."""
    alerts, truth = judged(3, "-8s")
    table = confusion(alerts, truth)
    assert {k: v for k, v in table.items() if v["fp"]} == {}
    deletions = [a for a in alerts if a["rule"] == "REMOTE_SEGMENT_ZOMBIE_DELETE" and a["node"] == 3]
    assert len(deletions) == 6
    assert all(a["confidence"] == "possible" for a in deletions)
