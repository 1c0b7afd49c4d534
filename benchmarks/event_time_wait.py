"""How long, in event time, a violation waits for its alert: the newest event
time read when the alert was raised less the violating event's. A judgment
waits for the latest moment its node's clock allows plus the grace window
(docs/architecture.md, "Time and clocks"), so this is the part of
event-to-alert latency that the detector itself imposes, before any Spark or
Kafka delay. One process: the whole cluster's detector, or the streaming
job's buckets (detectors.split.Split) measuring clocks alone or sharing them
every ``--exchange-every`` events, as the job does after each micro-batch
(detectors.clock_exchange). Certain alerts only; prints p50, p99 and max.

    .venv/bin/python benchmarks/event_time_wait.py --events 120000 --rate 3000 \\
        --layout 1 --layout 8 --layout 8:3000
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from detectors.alerts import CERTAIN
from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import envelope_from_obj
from detectors.split import Split
from producers.simulator import SimConfig, Simulator


def waits(
    events: Iterable[dict[str, Any]], config: DetectorConfig, buckets: int, exchange_every: int
) -> dict[str, tuple[int, dict[str, Any]]]:
    """Each certain alert's wait in event time (ms), by alert id, for ``buckets``
    buckets (1: the whole cluster) sharing clocks every ``exchange_every`` events (0: never)."""
    split = Split(buckets, config, share_clocks=exchange_every > 0) if buckets > 1 else None
    whole = Detector(config, now_ms=lambda: 0)
    detectors = split.detectors if split is not None else [whole]
    newest = -(2**62)
    out: dict[str, tuple[int, dict[str, Any]]] = {}
    clusters: set[str] = set()
    for i, event in enumerate(events, start=1):
        env = envelope_from_obj(event, f"mem:{i}", i)
        newest = max(newest, env.ts_ms)
        clusters.add(env.cluster)
        if split is not None:
            split.ingest(env)
            if exchange_every and i % exchange_every == 0:
                for cluster in sorted(clusters):
                    split.exchange(cluster)
        else:
            whole.ingest(env)
        for detector in detectors:
            for alert in detector.drain():
                if alert.confidence == CERTAIN:
                    out.setdefault(alert.alert_id, (newest - alert.ts_ms, alert.to_dict()))
    for detector in detectors:
        detector.flush()
        for alert in detector.drain():
            if alert.confidence == CERTAIN:
                out.setdefault(alert.alert_id, (newest - alert.ts_ms, alert.to_dict()))
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--events", type=int, default=120_000)
    p.add_argument("--rate", type=int, default=3000, help="simulated events a second (event time)")
    p.add_argument("--fault-rate", type=float, default=0.003)
    p.add_argument("--seed", type=int, default=3001)
    p.add_argument(
        "--layout",
        action="append",
        help="BUCKETS or BUCKETS:EXCHANGE_EVERY, repeatable (default 1, 8 and 8:3000)",
    )
    args = p.parse_args(argv)
    sim = Simulator(SimConfig(seed=args.seed, fault_rate=args.fault_rate, events_per_second=args.rate))
    events = list(sim.events(args.events))
    config = DetectorConfig(measure_clocks=True)
    print(f"{len(events):,} events at {args.rate} ev/s (seed {args.seed}), clocks measured; certain alerts")
    for layout in args.layout or ["1", "8", "8:3000"]:
        count, _, every = layout.partition(":")
        started = time.process_time()
        got = waits(events, config, int(count), int(every or 0))
        w = [ms / 1000 for ms, _ in got.values()]
        print(
            f"buckets {count:>3} sharing clocks every {every or '-':>6} events: {len(w)} alerts, "
            f"wait p50 {pct(w, 0.5):.2f} s  p99 {pct(w, 0.99):.2f} s  "
            f"max {max(w, default=float('nan')):.2f} s  ({time.process_time() - started:.1f} CPU-s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
