"""Issue 23's campaign: several wrong clocks at once, and how well fencewatch
measures them.

    .venv/bin/python benchmarks/clock_campaign.py                  # 1,000,000 events
    .venv/bin/python benchmarks/clock_campaign.py --events 200000
    .venv/bin/python benchmarks/clock_campaign.py --silence-grid   # 100,000 events a cell
    .venv/bin/python benchmarks/clock_campaign.py --step-grid      # 60,000 events a cell

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

``--silence-grid``: one forced fail-over at 15 s onto controller 3001 (seed
1: from 3002; later, 3001 would already lead) after
which the metadata log stays silent (``Failover.silence_ms``: a crashed
controller's election), for every silence in ``--silences`` and every clock
offset of controller 3001 in ``--offsets`` (no other clock faults); a table
of the alerts against the ground truth and of the sampled intervals that do
not contain the true offset, per cell; ``--detail`` also lists each false
alarm and the sampled intervals that missed the truth.

``--step-grid``: broker 3's clock steps (an NTP step) by every size in
``--steps``, forward and back, halfway through the run, for every seed in
``--seeds`` (no other clock faults). A step may make what the broker did look
like a violation for as long as its measured interval has not caught up; the
verdicts must be at most possible (SPEC 1.5). Per cell: the injected
violations, the certain alerts that caught one and the false ones (which
must be 0), the possible ones that caught a violation no certain alert caught
and the false ones, the violations missed by both, and the recall of certain
and possible alerts together.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from detectors.clocks import ClockInterval
from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import envelope_from_obj
from detectors.truth import confusion, match_key, possible_counts
from producers.sim_clocks import ClockFault, Failover, parse_clock
from producers.simulator import SimConfig, Simulator

GRID_FAILOVER_AT_MS = 15_000
GRID_SILENCES = "0,2000,3000,5000"
GRID_OFFSETS = "0s,-1s,-2s,-3s,-4s,+2s,+4s"
STEP_SEEDS = "1,2,3"
STEP_SIZES = "2s,4s,8s"
STEP_BROKER = 3


def true_offset(sim: Simulator, node: int, true_ms: int, writer: int, shift_ms: int) -> int:
    """``node``'s clock minus the metadata log's continuous clock at true time
    ``true_ms``: the clock of ``writer``, the controller that wrote the newest
    metadata record so far, plus the shift the detector applied to make the
    log's time continuous (detectors.clocks.MetadataClock)."""
    return sim.node_clock_ms(node, true_ms) - sim.node_clock_ms(writer, true_ms) - shift_ms


@dataclass
class Measured:
    """One run judged: its alerts against the ground truth and the sampled
    request lines' intervals against the true offsets."""

    events: int
    truth: list[dict[str, Any]]
    alerts: list[dict[str, Any]]
    table: dict[tuple[str, str], dict[str, int]]
    elapsed_s: float
    checked: dict[str, int] = field(default_factory=lambda: {"inside": 0, "outside": 0, "unmeasured": 0})
    widths: list[float] = field(default_factory=list)
    misses: list[float] = field(default_factory=list)  # how far outside its interval a true offset lay, ms
    # (true_ms, node, truth, interval) of every sampled line whose interval missed the truth
    outside: list[tuple[int, int, int, ClockInterval]] = field(default_factory=list)
    at_end: list[str] = field(default_factory=list)

    def total(self, what: str) -> int:
        return sum(row[what] for row in self.table.values())

    def false_by_rule(self) -> dict[str, int]:
        return {rule: row["fp"] for (rule, _), row in self.table.items() if row["fp"]}

    def missed_by_rule(self) -> dict[str, int]:
        return {rule: row["fn"] for (rule, _), row in self.table.items() if row["fn"]}

    def false_alerts(self) -> list[dict[str, Any]]:
        """The alerts that match no injected violation."""
        injected = Counter(match_key(t) for t in self.truth)
        false = []
        for alert in self.alerts:
            key = match_key(alert)
            if injected[key]:
                injected[key] -= 1
            else:
                false.append(alert)
        return false


def measure(sim: Simulator, events: int, sample_every: int = 50) -> Measured:
    """Judge ``events`` of ``sim`` in the order written (DetectorConfig
    measure_clocks), checking every ``sample_every``-th request line's interval
    against its node's true offset."""
    detector = Detector(DetectorConfig(measure_clocks=True), now_ms=lambda: 0)
    cluster = sim.config.cluster
    started = time.perf_counter()
    run = Measured(0, sim.truth, [], {}, 0.0)
    writer, last_true_ms = sim.metadata_clock_node(sim.config.start_ms), sim.config.start_ms
    for i, (true_ms, raw) in enumerate(sim.timed_events(events)):
        last_true_ms = true_ms
        env = envelope_from_obj(raw, f"sim:{i}", i)
        detector.ingest(env)
        cs = detector.clusters[cluster]
        if env.kind == "metadata" and cs.metadata_clock.back is None:
            # A record stamped behind its predecessor takes its predecessor's time
            # until the next one shows whether the clock stepped: until then the
            # continuous time is still the former writer's.
            writer = sim.metadata_clock_node(true_ms)
        if env.kind != "request" or env.node is None or i % sample_every:
            continue
        truth = true_offset(sim, env.node, true_ms, writer, cs.metadata_clock.shift_ms)
        # The interval a verdict on this line allows for (ClusterState.clock).
        interval = cs.clock(env)
        if not interval.measured or interval.width_ms > 10**9:
            run.checked["unmeasured"] += 1
            continue
        inside = interval.low_ms <= truth <= interval.high_ms
        run.checked["inside" if inside else "outside"] += 1
        run.widths.append(interval.width_ms)
        if not inside:
            run.misses.append(max(interval.low_ms - truth, truth - interval.high_ms))
            run.outside.append((true_ms, env.node, truth, interval))
    detector.flush()
    run.events = i + 1
    run.elapsed_s = time.perf_counter() - started
    run.alerts = [a.to_dict() for a in detector.drain()]
    run.table = confusion(run.alerts, sim.truth)
    cs = detector.clusters[cluster]
    for node, interval in cs.clocks.measured_nodes().items():
        truth = true_offset(sim, node, last_true_ms, writer, cs.metadata_clock.shift_ms)
        run.at_end.append(f"{interval.describe(node)} (true {truth} ms)")
    for offset, moved in cs.metadata_clock.steps:
        run.at_end.append(f"the metadata log's clock moved {moved / 1000:+.1f} s at offset {offset}")
    return run


def silence_grid(args: argparse.Namespace) -> None:
    """The table of ``--silence-grid`` (see the module's docstring)."""
    silences = [int(x) for x in args.silences.split(",")]
    offsets = [x.strip() for x in args.offsets.split(",")]
    print(
        f"{args.events} events a cell, seed {args.seed}; fail-over at {args.failover_at} ms onto "
        "controller 3001, the metadata log silent for SILENCE ms from it (the election at its end); "
        "3001's clock off by OFFSET; handover: the leader before -> after"
    )
    print(
        "intervals: every 50th request line's interval vs its node's true offset "
        "(out = does not contain it; miss = by how much, max)"
    )
    header = (
        f"{'silence':>7} {'offset':>6} {'injected':>8} {'caught':>6} {'false':>5} {'missed':>6} "
        f"{'in':>5} {'out':>4} {'miss':>6} {'handover':>9}  false alarms / missed by rule"
    )
    print(header)
    for silence in silences:
        for spec in offsets:
            clocks: tuple[ClockFault, ...] = ()
            if spec.lstrip("+-") not in ("0", "0s", "0ms"):
                clocks = (parse_clock(f"3001={spec}"),)
            failover = Failover(args.failover_at, to=3001, silence_ms=silence)
            sim = Simulator(SimConfig(seed=args.seed, clocks=clocks, failovers=(failover,)))
            run = measure(sim, args.events, args.sample_every)
            at = sim.config.start_ms + args.failover_at
            before = sim.metadata_clock_node(at - 1)
            handover = f"{before}->{sim.metadata_clock_node(at + silence)}"
            rules = "; ".join(
                [f"FP {r} {n}" for r, n in run.false_by_rule().items()]
                + [f"FN {r} {n}" for r, n in run.missed_by_rule().items()]
            )
            print(
                f"{silence:>7} {spec:>6} {len(run.truth):>8} {run.total('tp'):>6} {run.total('fp'):>5} "
                f"{run.total('fn'):>6} {run.checked['inside']:>5} {run.checked['outside']:>4} "
                f"{max(run.misses, default=0):>6.0f} {handover:>9}  {rules or '-'}",
                flush=True,
            )
            if args.detail:
                start = sim.config.start_ms
                for alert in run.false_alerts():
                    fields = {k: alert.get(k) for k in ("rule", "node", "ts_ms", "topic", "partition")}
                    print(f"      false alarm: {fields} (ts {alert['ts_ms'] - start} ms after the start)")
                for true_ms, node, truth, interval in run.outside:
                    print(
                        f"      out: node {node} at true +{true_ms - start} ms: truth {truth} ms "
                        f"not in {interval}"
                    )
                for line in run.at_end:
                    print(f"      at the end: {line}")


def step_grid(args: argparse.Namespace) -> None:
    """The table of ``--step-grid`` (see the module's docstring)."""
    seeds = [int(x) for x in args.seeds.split(",")]
    sizes = [x.strip() for x in args.steps.split(",")]
    seconds = args.events / SimConfig().events_per_second
    step_at = int(seconds * 500)  # ms: halfway
    print(
        f"{args.events} events a cell (fault rate {args.fault_rate}); broker {STEP_BROKER}'s clock "
        f"steps by STEP at {step_at} ms; certain: alerts that hold for every offset the evidence allows, "
        "possible: for some (caught: an injected violation no certain alert caught)"
    )
    header = (
        f"{'seed':>4} {'step':>5} {'injected':>8} {'certain':>7} {'false':>5} {'possible':>8} "
        f"{'false':>5} {'missed':>6} {'recall':>6}  certain false alarms by rule"
    )
    print(header)
    totals = Counter[str]()
    for size in sizes:
        for sign in "+-":
            for seed in seeds:
                spec = f"{STEP_BROKER}={sign}{size}@{step_at}ms"
                sim = Simulator(SimConfig(seed=seed, fault_rate=args.fault_rate, clocks=(parse_clock(spec),)))
                run = measure(sim, args.events, args.sample_every)
                caught, false = possible_counts(run.alerts, run.truth)
                tp, fp, fn = run.total("tp"), run.total("fp"), run.total("fn")
                injected = tp + fn
                recall = (tp + caught) / injected if injected else 1.0
                totals.update(
                    {
                        "injected": injected,
                        "tp": tp,
                        "fp": fp,
                        "caught": caught,
                        "false": false,
                        "missed": fn - caught,
                    }
                )
                rules = "; ".join(f"{r} {n}" for r, n in run.false_by_rule().items())
                print(
                    f"{seed:>4} {sign + size:>5} {injected:>8} {tp:>7} {fp:>5} {caught:>8} {false:>5} "
                    f"{fn - caught:>6} {recall:>6.1%}  {rules or '-'}",
                    flush=True,
                )
                if args.detail:
                    for alert in run.false_alerts():
                        fields = {k: alert.get(k) for k in ("rule", "node", "ts_ms", "confidence")}
                        after = alert["ts_ms"] - sim.config.start_ms
                        print(f"      false: {fields} ({after} ms after the start)")
    recall = (totals["tp"] + totals["caught"]) / totals["injected"] if totals["injected"] else 1.0
    print(
        f"{'all':>4} {'':>5} {totals['injected']:>8} {totals['tp']:>7} {totals['fp']:>5} "
        f"{totals['caught']:>8} {totals['false']:>5} {totals['missed']:>6} {recall:>6.1%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=None, help="default 1,000,000; 100,000 a grid cell")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sample-every", type=int, default=50, metavar="N", help="check every N-th line")
    parser.add_argument("--silence-grid", action="store_true", help="the election-silence grid instead")
    parser.add_argument("--silences", default=GRID_SILENCES, help="ms, comma-separated (default %(default)s)")
    parser.add_argument(
        "--offsets", default=GRID_OFFSETS, help="3001's clock offsets, comma-separated (default %(default)s)"
    )
    parser.add_argument(
        "--failover-at", type=int, default=GRID_FAILOVER_AT_MS, metavar="MS", help="with --silence-grid"
    )
    parser.add_argument(
        "--detail", action="store_true", help="with --silence-grid or --step-grid: every false alarm and miss"
    )
    parser.add_argument("--step-grid", action="store_true", help="the clock-step grid instead")
    parser.add_argument("--seeds", default=STEP_SEEDS, help="with --step-grid (default %(default)s)")
    parser.add_argument(
        "--fault-rate", type=float, default=0.01, help="with --step-grid (default %(default)s)"
    )
    parser.add_argument(
        "--steps",
        default=STEP_SIZES,
        help="with --step-grid: step sizes, each both ways (default %(default)s)",
    )
    args = parser.parse_args()
    if args.step_grid:
        args.events = args.events or 60_000
        step_grid(args)
        return
    if args.silence_grid:
        args.events = args.events or 100_000
        silence_grid(args)
        return
    args.events = args.events or 1_000_000
    seconds = args.events / SimConfig().events_per_second
    step_at, failover_at = int(seconds * 400), int(seconds * 600)  # ms: 40% and 60% of the run
    clocks = (
        parse_clock("1=+5s"),
        parse_clock("2=-2s"),
        parse_clock(f"4=+8s@{step_at}ms"),
        parse_clock("3001=-3s"),
    )
    sim = Simulator(SimConfig(seed=args.seed, clocks=clocks, failovers=(Failover(failover_at, to=3001),)))
    run = measure(sim, args.events, args.sample_every)
    table = run.table
    tp, fp, fn = run.total("tp"), run.total("fp"), run.total("fn")
    print(
        f"{args.events} events, seed {args.seed}, {run.elapsed_s:.0f} s; "
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
    w = sorted(run.widths)
    if w:
        print(
            f"request lines sampled (every {args.sample_every}th): {run.checked['inside']} intervals "
            f"contain the true offset, {run.checked['outside']} do not, {run.checked['unmeasured']} "
            f"unmeasured; width median {statistics.median(w):.0f} ms, p90 {w[int(0.9 * (len(w) - 1))]:.0f} ms"
        )
    if run.misses:
        m = sorted(run.misses)
        print(
            f"  outside by: median {statistics.median(m):.0f} ms, p90 {m[int(0.9 * (len(m) - 1))]:.0f} ms, "
            f"max {m[-1]:.0f} ms; {sum(1 for x in m if x <= 5)} of them by 5 ms or less"
        )
    for true_ms, node, truth, interval in run.outside[:10]:
        print(f"  node {node} at true {true_ms}: truth {truth} ms not in {interval}")
    print("measured at the end:")
    for line in run.at_end:
        print(f"  {line}")


if __name__ == "__main__":
    main()
