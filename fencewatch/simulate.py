"""``fencewatch simulate``: simulated KRaft traffic with injected faults, as
envelope JSONL, plus the ground truth of what was injected."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson
from tqdm import tqdm

from fencewatch.options import env_default
from producers.simulator import SimConfig, Simulator

PROGRESS_MIN_EVENTS = 200_000


def add_parser(sub: Any) -> None:
    defaults = SimConfig()
    p = sub.add_parser(
        "simulate",
        help="simulate a KRaft cluster with injected fencing faults",
        description="Write envelope JSONL events of a simulated KRaft cluster (Kafka-native shapes, per-node "
        "clock skew) and the ground truth of the violations injected into it.",
    )
    p.add_argument(
        "--seed", type=int, default=defaults.seed, help="same seed, same events (default %(default)s)"
    )
    p.add_argument("--events", type=int, default=100_000, help="about how many events (default %(default)s)")
    p.add_argument("--output", "-o", default="-", metavar="FILE", help="events JSONL (default: stdout)")
    p.add_argument(
        "--truth",
        metavar="FILE",
        help="ground-truth JSONL (default: <output>.truth.jsonl, or "
        "fencewatch-truth.jsonl when writing to stdout)",
    )
    p.add_argument("--cluster", default=defaults.cluster)
    p.add_argument(
        "--fault-rate",
        type=float,
        default=defaults.fault_rate,
        help="chance per simulated action that a fault is injected (default %(default)s)",
    )
    p.add_argument("--faults", default="", metavar="RULE,...", help="only inject these rules (default: all)")
    p.add_argument("--brokers", type=int, default=defaults.brokers)
    p.add_argument("--topics", type=int, default=defaults.topics)
    p.add_argument("--partitions", type=int, default=defaults.partitions_per_topic, help="per topic")
    p.add_argument("--skew-ms", type=int, default=defaults.skew_ms, help="max clock skew per node")
    p.add_argument(
        "--grace-ms",
        type=int,
        default=env_default("FENCEWATCH_GRACE_MS", defaults.grace_ms),
        help="the detector's grace window; faults stay clear of it (env FENCEWATCH_GRACE_MS)",
    )
    p.add_argument(
        "--metadata-version",
        type=int,
        default=defaults.metadata_version,
        help="KRaft metadata.version feature level (below 12, ISR shrinks bump the leader epoch)",
    )
    p.add_argument(
        "--events-per-second",
        type=int,
        default=defaults.events_per_second,
        help="simulated traffic rate (event time, not wall time)",
    )
    p.set_defaults(run=run)


def config_from(args: argparse.Namespace) -> SimConfig:
    try:
        return SimConfig(
            seed=args.seed,
            cluster=args.cluster,
            brokers=args.brokers,
            topics=args.topics,
            partitions_per_topic=args.partitions,
            fault_rate=args.fault_rate,
            faults=tuple(f.strip() for f in args.faults.split(",") if f.strip()),
            grace_ms=args.grace_ms,
            skew_ms=args.skew_ms,
            metadata_version=args.metadata_version,
            events_per_second=args.events_per_second,
        )
    except ValueError as exc:
        raise SystemExit(f"fencewatch simulate: {exc}") from None


def run(args: argparse.Namespace) -> int:
    try:
        sim = Simulator(config_from(args))
    except ValueError as exc:
        print(f"fencewatch simulate: {exc}", file=sys.stderr)
        return 2
    truth_path = args.truth or (
        "fencewatch-truth.jsonl" if args.output == "-" else f"{args.output}.truth.jsonl"
    )
    out = sys.stdout.buffer if args.output == "-" else open(args.output, "wb")  # noqa: SIM115
    bar = tqdm(
        total=args.events,
        unit="ev",
        desc="simulate",
        file=sys.stderr,
        disable=args.events < PROGRESS_MIN_EVENTS or None,
    )
    written = 0
    try:
        for env in sim.events(args.events):
            out.write(orjson.dumps(env) + b"\n")
            written += 1
            if written % 10_000 == 0:
                bar.update(10_000)
    finally:
        bar.close()
        if out is not sys.stdout.buffer:
            out.close()
        else:
            out.flush()
    with open(truth_path, "wb") as f:
        for record in sim.truth:
            f.write(orjson.dumps(record) + b"\n")
    counts = ", ".join(f"{k}={v}" for k, v in sorted(sim.injected.items())) or "none"
    print(
        f"simulated {written} events; injected {len(sim.truth)} violations ({counts}); truth: {truth_path}",
        file=sys.stderr,
    )
    return 0
