"""The buckets of a split cluster measure each clock once for all of them
(detectors.clock_exchange): every bucket's bounds go to the others as a clock
evidence record, which the streaming job publishes to its event topic after
each micro-batch and detectors.split.Split delivers at each exchange."""

from __future__ import annotations

import functools

from detectors.buckets import buckets_of
from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import DeadLetter, Envelope, envelope_from_obj
from detectors.split import Split
from detectors.truth import confusion
from producers.sim_clocks import Failover, parse_clock
from producers.simulator import SimConfig, Simulator
from streaming import snapshot_format

MEASURING = DetectorConfig(measure_clocks=True)
CLUSTER = "sim-1"
EVERY = 2_000  # events between exchanges: a micro-batch at a live rate


@functools.cache
def skewed(spec: str) -> tuple[tuple[Envelope, ...], tuple[dict, ...]]:
    """Issue 23's history: one broker's clock off by ``spec`` and a fail-over
    onto a controller 3 s behind."""
    sim = Simulator(
        SimConfig(
            seed=11,
            fault_rate=0.01,
            warmup_ms=3000,
            clocks=(parse_clock(spec), parse_clock("3001=-3s")),
            failovers=(Failover(15_000, to=3001),),
        )
    )
    events = tuple(
        envelope_from_obj(raw, f"sim:{i}", i) for i, (_, raw) in enumerate(sim.timed_events(20_000))
    )
    return events, tuple(sim.truth)


def zero() -> int:
    return 0  # the detectors' wall clock: picklable, as the job's is


@functools.cache
def run(
    spec: str, count: int, share: bool, twice: bool = False, restart_at: int | None = None
) -> tuple[list[dict], Split]:
    """The alerts of ``count`` buckets on ``skewed(spec)``; ``share``: exchanging
    every EVERY events; ``twice``: each clock evidence record delivered twice;
    ``restart_at``: every bucket pickled and restored as the job's state store
    does, at that exchange."""
    events, _ = skewed(spec)
    split = Split(count, MEASURING, now_ms=zero, share_clocks=share)
    exchanges = 0
    for i, env in enumerate(events, start=1):
        split.ingest(env)
        if share and i % EVERY == 0:
            for evidence in split.exchange(CLUSTER):
                if twice:
                    split.ingest(evidence)
            exchanges += 1
            if exchanges == restart_at:
                split.detectors = [snapshot_format.decode(snapshot_format.encode(d)) for d in split.detectors]
    return sorted((a.to_dict() for a in split.finish()), key=lambda a: a["alert_id"]), split


def totals(alerts: list[dict], truth: tuple[dict, ...]) -> tuple[int, int]:
    table = confusion(alerts, truth)
    return sum(c["tp"] for c in table.values()), sum(c["fp"] for c in table.values())


def widths(split: Split) -> list[float]:
    """Every bucket's interval of every broker at its newest time, as wide as it is."""
    out = []
    for detector in split.detectors:
        cs = detector.cluster(CLUSTER)
        for node, line in cs.clocks.lines.items():
            if node < 3000 and line.last_ts is not None:
                out.append(cs.node_interval(node, line.last_ts).width_ms)
    return out


def test_shared_bounds_narrow_every_bucket_s_clocks_and_raise_no_false_alarm():
    """Broker 3 three seconds ahead: with the bounds shared, the buckets'
    intervals are narrower in sum, no verdict is a false alarm, and at least
    as many violations are caught as by buckets measuring alone."""
    _, truth = skewed("3=+3s")
    alone, alone_split = run("3=+3s", 7, share=False)
    shared, shared_split = run("3=+3s", 7, share=True)
    tp_alone, fp_alone = totals(alone, truth)
    tp_shared, fp_shared = totals(shared, truth)
    assert fp_alone == fp_shared == 0
    assert tp_shared >= tp_alone
    assert sum(min(w, 30_000) for w in widths(shared_split)) < sum(
        min(w, 30_000) for w in widths(alone_split)
    )


def test_a_clock_behind_shared_raises_no_false_alarm():
    _, truth = skewed("3=-3s")
    shared, _ = run("3=-3s", 7, share=True)
    tp, fp = totals(shared, truth)
    assert fp == 0
    assert tp >= 0.85 * len(truth)


def test_evidence_delivered_twice_and_a_restart_change_no_alert():
    """Taking a bound twice changes nothing (a batch run again publishes its
    record again), and buckets restored from their pickles go on sharing."""
    once, _ = run("3=+3s", 7, share=True)
    assert once
    assert run("3=+3s", 7, share=True, twice=True)[0] == once
    assert run("3=+3s", 7, share=True, restart_at=4)[0] == once


def test_the_whole_cluster_and_another_layout_take_nothing_from_it():
    """A record of 7 buckets changes nothing for the whole cluster's detector
    (it measured every bound itself) nor for 5 buckets (another layout)."""
    events, _ = skewed("3=+3s")
    split = Split(7, MEASURING, share_clocks=True)
    records = []
    for i, env in enumerate(events[:8_000], start=1):
        split.ingest(env)
        if i % EVERY == 0:
            records.extend(split.exchange(CLUSTER))
    assert records
    assert all(buckets_of(r, 7) == tuple(range(7)) for r in records)
    for count in (1, 5):
        plain = Split(count, MEASURING, share_clocks=True)
        given = Split(count, MEASURING, share_clocks=True)
        for i, env in enumerate(events[:8_000], start=1):
            plain.ingest(env)
            given.ingest(env)
            if i % EVERY == 0:
                for record in records[: i // EVERY]:
                    given.ingest(record)
        assert [a.to_dict() for a in given.finish()] == [a.to_dict() for a in plain.finish()]
        whole = Detector(MEASURING, now_ms=lambda: 0)
        assert whole.ingest(records[0]) == []
        assert not whole.clusters[CLUSTER].clocks.lines


def test_bad_clock_evidence_is_one_dead_letter():
    split = Split(3, MEASURING, share_clocks=True)
    for body in (
        {"buckets": "3", "frame": 0, "shift_ms": 0, "bounds": []},
        {"buckets": 3, "frame": 0, "shift_ms": 0, "bounds": [[1, 2]]},
    ):
        split.ingest(Envelope(CLUSTER, None, 1_000, "clock_evidence", None, body, "t:1"))
    assert [type(letter) for letter in split.dead_letters] == [DeadLetter, DeadLetter]
    assert "clock evidence" in split.dead_letters[0].reason
    assert "bound" in split.dead_letters[1].reason
