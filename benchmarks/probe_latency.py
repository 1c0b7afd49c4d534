"""How long ``fencewatch probe --once`` takes for 100 partitions of the embedded broker.

    .venv/bin/python benchmarks/probe_latency.py                 # 5 runs, 100 partitions
    .venv/bin/python benchmarks/probe_latency.py --runs 9 --partitions 1000

Starts the embedded tansu broker, creates one topic of ``--partitions``
partitions and times the whole ``fencewatch probe --once`` process (interpreter
start and imports included, as an operator's cron job pays them) ``--runs``
times. Beside each probe it times ``python -c 'import fencewatch.probe'``: the
floor any probe run pays before its first request. Prints every run, the
medians and their difference (the probe's own work). The target the probe was
built for is 5 s for 100 partitions (tests/integration/test_probe_tansu.py
checks what the probe reports, not how fast).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streaming.broker import EmbeddedBroker

# tansu serves epochs it should fence (NOTES.md): the probe exits with 3, deviations found.
DEVIATIONS_FOUND = 3


def timed(argv: list[str], expect: int) -> float:
    """Seconds the command ``argv`` took; a wrong exit code stops the benchmark."""
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
    elapsed = time.monotonic() - started
    if done.returncode != expect:
        sys.exit(f"{argv[2:5]} exited with {done.returncode}, not {expect}: {done.stderr.strip()[-500:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=100)
    args = parser.parse_args()
    with EmbeddedBroker() as broker:
        broker.create_topics({"probed": args.partitions})
        probe = [sys.executable, "-m", "fencewatch", "probe", "--once", "--quiet"]
        probe += ["--bootstrap-servers", broker.bootstrap_servers, "--topics", "probed"]
        imports = [sys.executable, "-c", "import fencewatch.probe"]
        probes, floors = [], []
        for run in range(1, args.runs + 1):
            probes.append(timed(probe, DEVIATIONS_FOUND))
            floors.append(timed(imports, 0))
            print(f"run {run}: probe {probes[-1]:.2f} s, imports alone {floors[-1]:.2f} s", flush=True)
    probe_median, floor_median = statistics.median(probes), statistics.median(floors)
    print(
        f"{args.partitions} partitions, median of {args.runs}: probe {probe_median:.2f} s, "
        f"imports alone {floor_median:.2f} s, the probe's own work {probe_median - floor_median:.2f} s "
        "(target: 5 s for 100 partitions)"
    )


if __name__ == "__main__":
    main()
