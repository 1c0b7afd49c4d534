"""Possible violations (SPEC 1.5, detectors.cluster.ClusterState.judge): a
verdict that holds for some clock offsets the evidence allows, not all, is
raised as possible with its condition, never dropped; a bound the user gives
(--clock-bound-ms) narrows the offsets and can make it certain.

The incident responder's case: a metadata dump and one broker's request log of
a few dozen requests. Broker 3 fetches ``events-0`` about once a second, each
fetch stating the leader epoch 5 created 4 s before its first: its only
evidence, one record, bounds its clock at most 4 s ahead and corroborates
nothing, so its interval is -1.0..+4.0 s (the slack below agreement up to the
bound). Every clock here agrees. At 20 s ``orders-0`` moves to leader epoch 1,
and 4 s later broker 3 applies a StopReplica for epoch 0: stale by 4 s, past
the 2 s grace window. Over the whole interval the window reaches back to 18 s,
where epoch 0 was current, so no certain verdict is possible.
"""

from __future__ import annotations

import io
import random
from typing import Any

import pytest

from detectors.alerts import CERTAIN, POSSIBLE, POSSIBLE_SEVERITY
from detectors.cluster import condition_text
from detectors.config import ALL_NODES, DetectorConfig
from detectors.engine import Detector
from detectors.envelope import DeadLetter, dumps
from detectors.errors import KafkaError
from detectors.merge import merge_sources
from detectors.sources import read_envelopes
from producers import shapes as s

EVENTS_ID = "Zq0aYbB5Rj2xWk9cD3e4fA"
EPOCH_5_MS = 10_000
ELECTION_MS = 20_000
STALE_STOP_MS = 24_000  # 4 s after the election that superseded its epoch
BROKER = 3
MEASURED = DetectorConfig(measure_clocks=True)


@pytest.fixture
def incident(make_history: Any) -> Any:
    """``incident(config)``: the sparse incident's history."""
    return lambda config=MEASURED: sparse_incident(make_history(config))


def sparse_incident(history: Any) -> Any:
    history.metadata(EPOCH_5_MS, s.topic("events", EVENTS_ID))
    history.metadata(EPOCH_5_MS, s.partition(EVENTS_ID, 0, [1, 2, 3], [1, 2, 3], 1, leader_epoch=5))
    history.change(ELECTION_MS, leader=2)  # orders-0: leader epoch 0 -> 1
    for i in range(36):  # a few dozen requests, the first 4 s after epoch 5's record
        history.request(EPOCH_5_MS + 4_000 + 1_000 * i, BROKER, s.fetch("events", 0, 0, epoch=5))
    history.request(STALE_STOP_MS, BROKER, s.stop_replica("orders", 0, 0, KafkaError.NONE))
    history.envelopes.sort(key=lambda env: env.ts_ms)  # as replay merges the files
    return history


def _stop_replica_alerts(incident: Any, config: DetectorConfig) -> list[Any]:
    outcome = incident(config).run()
    assert outcome.dead_letters == []
    return [a for a in outcome.alerts if a.rule == "STOP_REPLICA_STALE_EPOCH_APPLIED"]


def test_the_broker_interval_is_seconds_wide(incident):
    outcome = incident().run()
    interval = outcome.detector.cluster("c1").clocks.interval(BROKER, STALE_STOP_MS)
    assert (interval.low_ms, interval.high_ms) == (-1000, 3998)  # the fetches took 2 ms (totalTimeMs)


def test_a_stale_stop_replica_the_wide_interval_hides_is_a_possible_violation_with_its_condition(incident):
    """Before possible violations, this raised nothing at all: the only alert
    is the possible one."""
    [alert] = _stop_replica_alerts(incident, MEASURED)
    assert alert.confidence == POSSIBLE
    assert alert.severity == POSSIBLE_SEVERITY == "info"
    condition = alert.condition
    assert condition is not None
    # Its window, arrival - offset - grace, starts after the election for every
    # offset up to 23,998 - 2,000 - 20,000 = 1,998 ms (each request took 2 ms,
    # its totalTimeMs: the fetches' bound is 3,998 ms too).
    assert condition.allowed_ms == (-1000, 3998)
    assert condition.holds_ms == ((-1000, 1998),)
    assert condition.text == (
        "holds if node 3's clock is at most 1.998 s ahead of the metadata log's "
        "(its evidence allows 1 s behind .. 3.998 s ahead of it)"
    )
    assert condition.text in alert.message
    as_dict = alert.to_dict()
    assert as_dict["confidence"] == "possible"
    assert as_dict["clock_condition"] == {
        "node": 3,
        "allowed_ms": [-1000, 3998],
        "holds_ms": [[-1000, 1998]],
        "text": condition.text,
    }
    [clock] = [e for e in alert.evidence if e.role == "clock"]
    assert condition.text in clock.summary


def test_the_possible_violation_is_counted_apart_from_the_certain_ones(incident):
    outcome = incident().run()
    assert [a.confidence for a in outcome.alerts] == [POSSIBLE]
    counters = outcome.counters
    assert counters.alerts_by_rule(confidence=POSSIBLE) == {"STOP_REPLICA_STALE_EPOCH_APPLIED": 1}
    assert "STOP_REPLICA_STALE_EPOCH_APPLIED" not in counters.alerts_by_rule(confidence=CERTAIN)


@pytest.mark.parametrize("bound", [((ALL_NODES, 200),), ((BROKER, 200),)])
def test_a_bound_of_200_ms_makes_it_certain(incident, bound):
    [alert] = _stop_replica_alerts(incident, DetectorConfig(measure_clocks=True, clock_bounds=bound))
    assert alert.confidence == CERTAIN
    assert alert.severity == "critical"
    assert alert.condition is None
    [clock] = [e for e in alert.evidence if e.role == "clock"]
    assert (clock.offset_low_ms, clock.offset_high_ms) == (-200, 200)


def test_the_certain_alert_is_the_one_clocks_unmeasured_raise(incident):
    """Certain violations stay exactly as they were: the id, rule, severity and
    message of the alert a bound makes certain are those of the same verdict
    with every clock taken to agree."""
    [unmeasured] = _stop_replica_alerts(incident, DetectorConfig())
    [bounded] = _stop_replica_alerts(
        incident, DetectorConfig(measure_clocks=True, clock_bounds=((ALL_NODES, 200),))
    )
    keep = ("alert_id", "rule", "severity", "message", "confidence", "clock_condition")
    assert {k: bounded.to_dict()[k] for k in keep} == {k: unmeasured.to_dict()[k] for k in keep}


def test_a_bound_the_evidence_contradicts_is_reported_and_not_used(make_history):
    """Broker 3's clock is 3 s behind: its fetches of epoch 5, logged 0.1 s
    after the record by the log's time, are stamped 2.9 s before it, and a
    request cannot precede what it knew: the evidence puts the clock at least
    2.9 s behind, outside a bound of 200 ms. The bound is wrong (or the clock
    broke): it is reported, and the evidence is used."""
    history = make_history(DetectorConfig(measure_clocks=True, clock_bounds=((BROKER, 200),)))
    history.metadata(EPOCH_5_MS, s.topic("events", EVENTS_ID))
    history.metadata(EPOCH_5_MS, s.partition(EVENTS_ID, 0, [1, 2, 3], [1, 2, 3], 1, leader_epoch=5))
    for i in range(36):
        history.request(EPOCH_5_MS + 100 + 1_000 * i - 3_000, BROKER, s.fetch("events", 0, 0, epoch=5))
    history.envelopes.sort(key=lambda env: env.ts_ms)
    detector = history.run().detector
    cs = detector.cluster("c1")
    low, high, bound = cs.bound_contradicted[BROKER]
    assert low <= high
    assert high < -200 and bound == 200
    assert cs.node_interval(BROKER, EPOCH_5_MS) == cs.clocks.interval(BROKER, EPOCH_5_MS)


def test_condition_text_says_each_shape_in_words():
    assert condition_text(3, -1000, 5000, ((2500, 5000),)) == (
        "holds if node 3's clock is at least 2.5 s ahead of the metadata log's "
        "(its evidence allows 1 s behind .. 5 s ahead of it)"
    )
    assert "at least 0.3 s behind" in condition_text(3, -1000, 5000, ((-1000, -300),))
    assert "at most 0.3 s behind" in condition_text(3, -1000, 5000, ((-300, 5000),))
    assert "between 0.5 s behind and 3.2 s ahead of" in condition_text(3, -1000, 5000, ((-500, 3200),))
    assert " or " in condition_text(3, -1000, 5000, ((-1000, 0), (4000, 5000)))


@pytest.mark.parametrize("shuffle_seed", range(8))
def test_the_incident_cut_into_overlapping_files_given_in_any_order_gives_the_same_alerts(
    incident, shuffle_seed
):
    """Re-delivery invariance for a possible violation: the incident's lines
    replayed whole, and as overlapping pieces in a random order (every line
    at least once, some twice), give the same alerts, condition included."""
    lines = [dumps(env.to_dict()).encode() + b"\n" for env in incident().envelopes]
    clean = _replayed([lines])
    assert [a["confidence"] for a in clean] == ["possible"]
    rng = random.Random(shuffle_seed)
    a, b, c = sorted(rng.sample(range(1, len(lines)), 3))
    files = [lines[:b], lines[a:c], lines[b:], lines[a : a + (c - a) // 2]]
    rng.shuffle(files)
    assert _replayed(files) == clean
    assert _replayed([lines, lines]) == clean


def _replayed(files: list[list[bytes]]) -> list[dict[str, Any]]:
    """Replay's alerts for these files, without what differs between runs (where evidence was read)."""
    detector = Detector(MEASURED, now_ms=lambda: 0)
    streams = [read_envelopes(io.BytesIO(b"".join(f)), f"file{i}") for i, f in enumerate(files)]
    for item in merge_sources(streams, MEASURED.lateness_ms, MEASURED.clock_limit_ms):
        assert not isinstance(item, DeadLetter)
        detector.ingest(item)
    detector.flush()
    out = []
    for alert in detector.drain():
        record = alert.to_dict()
        for evidence in record["evidence"]:
            del evidence["position"]
        out.append(record)
    return sorted(out, key=lambda r: r["alert_id"])
