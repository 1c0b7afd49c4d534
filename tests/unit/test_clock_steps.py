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

from detectors.clocks import ClockBook
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


# Seed 3, -2 s: the step came after 1.5 s without a request from broker 3, so its
# times went back only 480 ms, less than a step shows by (ClockBook._stepped_back).
@pytest.mark.parametrize(("seed", "step"), [(2, "-2s"), (1, "-4s"), (3, "-2s")])
def test_a_broker_clock_stepped_back_raises_no_certain_false_alarm(seed, step):
    alerts, truth = judged(seed, step)
    table = confusion(alerts, truth)
    assert {k: v for k, v in table.items() if v["fp"]} == {}
    caught, _ = possible_counts(alerts, truth)
    injected = sum(row["tp"] + row["fn"] for row in table.values())
    assert sum(row["tp"] for row in table.values()) + caught == injected > 0


def test_a_brokers_deletions_after_its_clock_stepped_back_8s_are_not_certain():
    """Seed 3, broker 3 stepped back 8 s: its request lines after the step were
    refused as too late (Detector._first_delivery), so its clock evidence never
    showed the step, and its remote segment deletions, judged by its clock of
    before, were placed 8 s early where it did not lead: 6 certain false
    REMOTE_SEGMENT_ZOMBIE_DELETE. Now the first of those lines knows epochs
    created after its clock allows (ClockBook.refused), the node times the step
    wrote twice are blind and the deletions there clock uncertain; stamped
    behind the broker's own earlier records they would be at most possible
    anyway (RemoteView.behind, tests/unit/test_rules_remote.py)."""
    alerts, truth = judged(3, "-8s")
    table = confusion(alerts, truth)
    assert {k: v for k, v in table.items() if v["fp"]} == {}
    deletions = [a for a in alerts if a["rule"] == "REMOTE_SEGMENT_ZOMBIE_DELETE" and a["node"] == 3]
    assert [a for a in deletions if a["confidence"] == "certain"] == []


def test_a_request_that_knew_an_epoch_created_after_its_clock_allows_marks_a_step_back():
    """Broker 3's clock agrees within 20 ms while it fetches a new epoch every
    second; after a silence of 2.5 s it steps back 2.5 s, so its times go on
    where they stopped, and its first request knows an epoch created 2.38 s
    after its own time says it came. Its times around the step may have been
    written on either side of it: blind, and the bound of after the step does
    not pull the interval of a request just before it 2.4 s low."""
    clocks = ClockBook(window_ms=30_000, slack_ms=1000, ahead_ms=2000, limit_ms=30_000, back_ms=1000)
    for k in range(1, 11):
        ref = (("t", k), "L", 1)
        clocks.created_epoch(ref, 1000 * k)
        clocks.saw(3, 1000 * k + 20)
        clocks.knows(3, 1000 * k + 20, ref)
    before = clocks.interval(3, 9_900)
    assert (before.low_ms, before.high_ms) == (-980, 20)
    clocks.created_epoch((("t", 11), "L", 1), 12_400)
    clocks.saw(3, 10_030)  # true 12,530: 2.5 s back, 10 ms after its last time
    clocks.knows(3, 10_030, (("t", 11), "L", 1))
    assert clocks.lines[3].blind == [(10_030, 10_030)]
    after = clocks.interval(3, 9_900)
    assert (after.low_ms, after.high_ms) == (-980, 20)
