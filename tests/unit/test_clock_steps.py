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

import pytest

from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import envelope_from_obj
from detectors.truth import confusion, possible_counts
from producers.sim_clocks import parse_clock
from producers.simulator import SimConfig, Simulator

EVENTS = 30_000
STEP_AT = "7500ms"  # halfway through the run


@pytest.mark.parametrize(("seed", "step"), [(2, "-2s"), (1, "-4s")])
def test_a_broker_clock_stepped_back_raises_no_certain_false_alarm(seed, step):
    sim = Simulator(SimConfig(seed=seed, fault_rate=0.01, clocks=(parse_clock(f"3={step}@{STEP_AT}"),)))
    detector = Detector(DetectorConfig(measure_clocks=True), now_ms=lambda: 0)
    for i, (_, raw) in enumerate(sim.timed_events(EVENTS)):
        detector.ingest(envelope_from_obj(raw, f"sim:{i}", i))
    detector.flush()
    alerts = [a.to_dict() for a in detector.drain()]
    table = confusion(alerts, sim.truth)
    assert {k: v for k, v in table.items() if v["fp"]} == {}
    caught, _ = possible_counts(alerts, sim.truth)
    injected = sum(row["tp"] + row["fn"] for row in table.values())
    assert sum(row["tp"] for row in table.values()) + caught == injected > 0
