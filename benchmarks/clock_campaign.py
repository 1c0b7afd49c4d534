"""Issue 23's campaign: several wrong clocks at once, and how well fencewatch
measures them.

    .venv/bin/python benchmarks/clock_campaign.py                  # 1,000,000 events
    .venv/bin/python benchmarks/clock_campaign.py --events 200000

The simulator (every fault kind, default skew) runs with broker 1's clock
+5 s, broker 2's -2 s, broker 4's stepping +8 s at 40% of the run, and a
forced Raft fail-over at 60% onto controller 3001, whose clock is -3 s (the
metadata log's clock steps with it). The detector judges the events in the
order they were written. It prints the alerts against the ground truth, and,
for every 50th request line, whether the interval a verdict on it allows for
contains the node's true offset, with the median and 90th percentile widths.

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
    checked = {"inside": 0, "outside": 0, "unmeasured": 0}
    widths: list[float] = []
    misses: list[int] = []  # how far outside its interval a true offset lay, ms
    outside: list[str] = []
    writer, last_true_ms = sim.metadata_clock_node(sim.config.start_ms), sim.config.start_ms
    for i, (true_ms, raw) in enumerate(sim.timed_events(args.events)):
        last_true_ms = true_ms
        env = envelope_from_obj(raw, f"sim:{i}", i)
        detector.ingest(env)
        cs = detector.clusters[cluster]
        if env.kind == "metadata" and cs.metadata_clock.back is None:
            # A record stamped behind its predecessor takes its predecessor's time
            # until the next one shows whether the clock stepped: until then the
            # continuous time is still the former writer's.
            writer = sim.metadata_clock_node(true_ms)
        if env.kind != "request" or env.node is None or i % 50:
            continue
        truth = true_offset(sim, env.node, true_ms, writer, cs.metadata_clock.shift_ms)
        # The interval a verdict on this line allows for (ClusterState.clock).
        interval = cs.clock(env)
        if not interval.measured or interval.width_ms > 10**9:
            checked["unmeasured"] += 1
            continue
        inside = interval.low_ms <= truth <= interval.high_ms
        checked["inside" if inside else "outside"] += 1
        widths.append(interval.width_ms)
        if not inside:
            misses.append(max(interval.low_ms - truth, truth - interval.high_ms))
        if not inside and len(outside) < 10:
            outside.append(f"node {env.node} at true {true_ms}: truth {truth} ms not in {interval}")
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
    w = sorted(widths)
    if w:
        print(
            f"request lines sampled (every 50th): {checked['inside']} intervals contain the true offset, "
            f"{checked['outside']} do not, {checked['unmeasured']} unmeasured; width median "
            f"{statistics.median(w):.0f} ms, p90 {w[int(0.9 * (len(w) - 1))]:.0f} ms"
        )
    if misses:
        m = sorted(misses)
        print(
            f"  outside by: median {statistics.median(m):.0f} ms, p90 {m[int(0.9 * (len(m) - 1))]} ms, "
            f"max {m[-1]} ms; {sum(1 for x in m if x <= 5)} of them by 5 ms or less"
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
