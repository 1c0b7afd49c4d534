"""What one wrong clock does to fencewatch's verdicts: issue 23's table, re-run.

    .venv/bin/python benchmarks/clock_skew.py                 # 100,000 events, every row
    .venv/bin/python benchmarks/clock_skew.py --events 30000 --rows "broker +3s,metadata -3s from mid-run"

A ``fencewatch simulate`` history (default skew, every fault kind) is shifted
as an operator with one bad clock would see it: every ``ts_ms`` of one node
moved by a constant (one broker's request log and the remote log metadata it
writes), or the metadata log's from the
middle of the run on (a controller fail-over onto a fast or slow clock). The
ground truth moves with the records it names, so the injected violations are
the same in every row. Each row is judged twice: in the order the simulator
wrote the events (true time: what a streaming job reading live shippers sees)
and merged by ``ts_ms`` with every source keeping its own order (what replay's
merge of per-source files gives, detectors.merge). For
each it prints caught / false alarms / missed, the events refused as too late,
the verdicts counted "clock uncertain", and what the detector measured of the
shifted clock (detectors.clocks).
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from detectors.clocks import ClockInterval
from detectors.config import DetectorConfig
from detectors.envelope import Envelope, envelope_from_obj
from detectors.requests import ALTER_PARTITION
from detectors.split import Split
from detectors.stats import UnverifiedReason
from detectors.truth import confusion
from producers.simulator import SimConfig, Simulator

BROKER = 3
METADATA_RULES = ("ISR_INELIGIBLE_REPLICA_ADMITTED", "LEADER_INELIGIBLE_ELECTED")

Shift = Callable[[dict[str, Any]], int]  # an envelope (or truth record) -> ms to add


def broker_shift(ms: int) -> tuple[Shift, Shift]:
    def envelope(env: dict[str, Any]) -> int:
        if env["kind"] == "request":
            return ms if env["node"] == BROKER else 0
        # Remote log metadata records are stamped by the broker that writes them.
        data = env["body"].get("data") if env["kind"] == "remote_log_metadata" else None
        return ms if isinstance(data, dict) and data.get("brokerId") == BROKER else 0

    def truth(record: dict[str, Any]) -> int:
        return ms if record["node"] == BROKER and record["rule"] not in METADATA_RULES else 0

    return envelope, truth


def metadata_shift(ms: int, from_ms: int, stamped_by_log: set[int]) -> tuple[Shift, Shift]:
    def envelope(env: dict[str, Any]) -> int:
        return ms if env["kind"] == "metadata" and env["ts_ms"] >= from_ms else 0

    def truth(record: dict[str, Any]) -> int:
        # Only a violation the metadata log stamped moves: an ineligible replica
        # admitted to the ISR may be named by the controller's AlterPartition
        # request (its own request log) instead.
        ts = record["ts_ms"]
        named = record["rule"] in METADATA_RULES and ts in stamped_by_log
        return ms if named and ts >= from_ms else 0

    return envelope, truth


def rows(mid_ms: int, stamped_by_log: set[int]) -> dict[str, tuple[Shift, Shift] | None]:
    return {
        "none": None,
        "broker +1s": broker_shift(1000),
        "broker +3s": broker_shift(3000),
        "broker +6s": broker_shift(6000),
        "broker -3s": broker_shift(-3000),
        "metadata +3s from mid-run": metadata_shift(3000, mid_ms, stamped_by_log),
        "metadata -3s from mid-run": metadata_shift(-3000, mid_ms, stamped_by_log),
    }


def stamped_by_log(raw: list[dict[str, Any]]) -> set[int]:
    """The times of metadata records that no AlterPartition request shares: a
    violation at one of them is the metadata log's (an AlterPartition and the
    change it caused may be stamped in the same millisecond, and the alert then
    names the request)."""
    requests = {
        e["ts_ms"]
        for e in raw
        if e["kind"] == "request"
        and e["body"].get("requestHeader", {}).get("requestApiKey") == ALTER_PARTITION
    }
    return {e["ts_ms"] for e in raw if e["kind"] == "metadata"} - requests


def merged_by_time(history: list[Envelope]) -> list[Envelope]:
    """Every source's events in their own order, the sources merged by ``ts_ms``."""
    sources: dict[tuple[str, int], list[Envelope]] = {}
    for env in history:
        node = -1 if env.kind in ("metadata", "remote_log_metadata") or env.node is None else env.node
        sources.setdefault((env.kind, node), []).append(env)
    return list(heapq.merge(*sources.values(), key=lambda e: e.ts_ms))


def judge(
    history: list[Envelope], config: DetectorConfig, buckets: int
) -> tuple[list[dict[str, Any]], Split]:
    """The alerts of the cluster split into ``buckets`` as the streaming job splits it."""
    split = Split(buckets, config)
    for env in history:
        split.ingest(env)
    return [a.to_dict() for a in split.finish()], split


def describe_offset(offset: dict[str, Any]) -> str:
    """What a snapshot's merged interval (stats.merge_clock_offsets) says of ``BROKER``'s clock."""
    low, high = offset["low_ms"], offset["high_ms"]
    return ClockInterval(
        -math.inf if low is None else low, math.inf if high is None else high, offset["measured"]
    ).describe(BROKER)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rows", default="", help="comma-separated row names (default: every row)")
    parser.add_argument(
        "--buckets",
        type=int,
        default=1,
        help="judge as the streaming job with this many buckets, each measuring clocks from its own "
        "partitions' requests (default 1: the whole cluster, as replay)",
    )
    parser.add_argument(
        "--topics",
        type=int,
        default=SimConfig().topics,
        help=f"topics of the simulated cluster, {SimConfig().partitions_per_topic} partitions each "
        f"(default {SimConfig().topics}): a bucket's clock evidence comes from its own partitions",
    )
    args = parser.parse_args()

    sim = Simulator(SimConfig(seed=args.seed, topics=args.topics))
    raw = list(sim.events(args.events))
    truth = sim.truth
    mid_ms = raw[len(raw) // 2]["ts_ms"]
    config = DetectorConfig(measure_clocks=True)
    wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
    table = rows(mid_ms, stamped_by_log(raw))
    print(
        f"{len(raw)} simulated events (seed {args.seed}), {len(truth)} injected violations; broker {BROKER}; "
        f"{args.buckets} bucket(s), {args.topics * sim.config.partitions_per_topic} partitions"
    )
    print(
        f"{'row':28} {'order':6} {'caught':>6} {'false':>6} {'missed':>6} {'late':>6} "
        f"{'uncertain':>9}  clock measured"
    )
    for name, shift in table.items():
        if wanted and name not in wanted:
            continue
        env_shift, truth_shift = shift if shift else (lambda _: 0, lambda _: 0)
        shifted = [{**e, "ts_ms": e["ts_ms"] + env_shift(e)} for e in raw]
        shifted_truth = [{**t, "ts_ms": t["ts_ms"] + truth_shift(t)} for t in truth]
        history = [envelope_from_obj(e, f"sim:{i}", i) for i, e in enumerate(shifted)]
        for order, events in (("true", history), ("merged", merged_by_time(history))):
            started = time.perf_counter()
            alerts, split = judge(events, config, args.buckets)
            elapsed = time.perf_counter() - started
            table_ = confusion(alerts, shifted_truth)
            tp = sum(r["tp"] for r in table_.values())
            fp = sum(r["fp"] for r in table_.values())
            fn = sum(r["fn"] for r in table_.values())
            snapshot = split.snapshot(sim.config.cluster)
            unverified = cast(dict[str, int], snapshot["unverified"])
            late = unverified.get(UnverifiedReason.TOO_LATE.value, 0)
            uncertain = unverified.get(UnverifiedReason.CLOCK_UNCERTAIN.value, 0)
            offsets = cast(dict[str, dict[str, Any]], snapshot["clock_offsets"])
            said = describe_offset(offsets[str(BROKER)]) if str(BROKER) in offsets else "-"
            print(
                f"{name:28} {order:6} {tp:6} {fp:6} {fn:6} {late:6} {uncertain:9}  {said}  ({elapsed:.1f} s)"
            )
            if fp:
                wrong = {k: v for k, v in table_.items() if v["fp"]}
                print(f"{'':36} false alarms by rule: {wrong}")


if __name__ == "__main__":
    main()
