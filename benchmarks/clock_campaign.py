"""Issue 23's campaign: several wrong clocks at once, and how well fencewatch
measures them.

    .venv/bin/python benchmarks/clock_campaign.py                  # 1,000,000 events
    .venv/bin/python benchmarks/clock_campaign.py --events 200000

The simulator (every fault kind, default skew) runs with broker 1's clock
+5 s, broker 2's -2 s, broker 4's stepping +8 s at 40% of the run, and a
forced Raft fail-over at 60% onto controller 3001, whose clock is -3 s (the
metadata log's clock steps with it). The detector judges the events in the
order they were written. It prints the alerts against the ground truth, and,
for every request line of a node with clock evidence, whether the interval the
detector holds for that node at that moment (its evidence as a whole, and the
one a verdict on the line's first partition uses) contains the node's true
offset, with the median and 90th percentile widths.

The true offset is the node's clock minus the metadata log's continuous clock
(detectors.clocks.MetadataClock): the clock of the controller that wrote the
newest metadata record so far plus the shift the detector applied to make the
log's time continuous across the controller's clock steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import envelope_from_obj
from detectors.truth import confusion
from detectors.view import own_topic_key
from producers.sim_clocks import Failover, parse_clock
from producers.simulator import SimConfig, Simulator


def true_offset(sim: Simulator, node: int, true_ms: int, writer: int, shift_ms: int) -> int:
    """``node``'s clock minus the metadata log's continuous clock at true time
    ``true_ms``: the clock of ``writer``, the controller that wrote the newest
    metadata record so far, plus the shift the detector applied to make the
    log's time continuous (detectors.clocks.MetadataClock)."""
    return sim.node_clock_ms(node, true_ms) - sim.node_clock_ms(writer, true_ms) - shift_ms


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    seconds = args.events / SimConfig().events_per_second
    step_at, failover_at = int(seconds * 400), int(seconds * 600)  # ms: 40% and 60% of the run
    clocks = (
        parse_clock("1=+5s"),
        parse_clock("2=-2s"),
        parse_clock(f"4=+8s@{step_at}ms"),
        parse_clock("3001=-3s"),
    )
    sim = Simulator(SimConfig(seed=args.seed, clocks=clocks, failovers=(Failover(failover_at, to=3001),)))
    detector = Detector(DetectorConfig(measure_clocks=True), now_ms=lambda: 0)
    cluster = sim.config.cluster
    started = time.perf_counter()
    checked = {"node": [0, 0], "verdict": [0, 0]}  # [inside, outside]
    widths: dict[str, list[float]] = {"node": [], "verdict": []}
    outside: list[str] = []
    writer, last_true_ms = sim.metadata_clock_node(sim.config.start_ms), sim.config.start_ms
    for i, (true_ms, raw) in enumerate(sim.timed_events(args.events)):
        last_true_ms = true_ms
        env = envelope_from_obj(raw, f"sim:{i}", i)
        detector.ingest(env)
        if env.kind == "metadata":
            writer = sim.metadata_clock_node(true_ms)
        if env.kind != "request" or env.node is None or i % 50:
            continue
        cs = detector.clusters[cluster]
        truth = true_offset(sim, env.node, true_ms, writer, cs.metadata_clock.shift_ms)
        topics = env.body.get("request", {}).get("topicData") or env.body.get("request", {}).get("topics")
        partition = None
        if isinstance(topics, list) and topics and isinstance(topics[0], dict):
            parts = topics[0].get("partitionData") or topics[0].get("partitions") or [{}]
            index = parts[0].get("index", parts[0].get("partition", parts[0].get("partitionIndex")))
            name = topics[0].get("name", topics[0].get("topic"))
            if isinstance(index, int):
                partition = (own_topic_key(name, topics[0].get("topicId")), index)
        for kind, interval in (
            ("node", cs.clocks.interval(env.node, env.ts_ms)),
            ("verdict", cs.clocks.interval(env.node, env.ts_ms, partition) if partition else None),
        ):
            if interval is None or not interval.measured or interval.width_ms > 10**9:
                continue
            inside = interval.low_ms <= truth <= interval.high_ms
            checked[kind][0 if inside else 1] += 1
            widths[kind].append(interval.width_ms)
            if not inside and len(outside) < 10:
                outside.append(f"{kind} node {env.node} at true {true_ms}: truth {truth} not in {interval}")
    detector.flush()
    elapsed = time.perf_counter() - started
    alerts = [a.to_dict() for a in detector.drain()]
    table = confusion(alerts, sim.truth)
    tp = sum(r["tp"] for r in table.values())
    fp = sum(r["fp"] for r in table.values())
    fn = sum(r["fn"] for r in table.values())
    print(
        f"{args.events} events, seed {args.seed}, {elapsed:.0f} s; "
        "clock faults: broker 1 +5 s, broker 2 -2 s,"
    )
    print(f"  broker 4 +8 s from {step_at} ms, fail-over at {failover_at} ms onto controller 3001 at -3 s")
    print(
        f"alerts: {tp} caught, {fp} false, {fn} missed of {len(sim.truth)} injected "
        f"({tp / max(len(sim.truth), 1):.1%})"
    )
    for rule, row in table.items():
        if row["fp"] or row["fn"]:
            print(f"  {rule}: {row}")
    for kind, (inside, out) in checked.items():
        w = sorted(widths[kind])
        if not w:
            continue
        p90 = w[int(0.9 * (len(w) - 1))]
        print(
            f"{kind} intervals: {inside} of {inside + out} contain the true offset; "
            f"width median {statistics.median(w):.0f} ms, p90 {p90:.0f} ms"
        )
    for line in outside:
        print("  " + line)
    cs = detector.clusters[cluster]
    print("measured at the end:")
    for node, interval in cs.clocks.measured_nodes().items():
        truth = true_offset(sim, node, last_true_ms, writer, cs.metadata_clock.shift_ms)
        print(f"  {interval.describe(node)} (true {truth} ms)")
    for offset, moved in cs.metadata_clock.steps:
        print(f"  the metadata log's clock moved {moved / 1000:+.1f} s at offset {offset}")


if __name__ == "__main__":
    main()
