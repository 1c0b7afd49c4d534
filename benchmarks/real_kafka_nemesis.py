"""Apache Kafka under every failure of the nemesis, watched by fencewatch: the
false alarms (there should be none) and what was judged.

    .venv/bin/python benchmarks/real_kafka_nemesis.py                      # seed 1, 600 s
    .venv/bin/python benchmarks/real_kafka_nemesis.py --seed 3 --duration 900

Runs ``fencewatch kafka-lab --nemesis`` (every fault kind: broker kills,
pauses past replica.lag.time.max.ms, clean shutdowns, the active controller
killed, reassignments, preferred and unclean elections, a topic deleted and made
again, a broker's log directory wiped, a broker's clock skewed) as a user runs
it, and prints its table with the wall time the whole run took, the machine
(cores, load average before and after) and the date: the figures of
docs/performance.md's row. Exits with kafka-lab's code: 1 if any certain alert, dead
letter or leader epoch differing from Kafka's. tests/integration/test_real_kafka.py
runs a short nemesis of six faults in ``make test``; this is the long one.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import UTC, datetime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of traffic and faults")
    parser.add_argument("--keep", metavar="DIR", help="kafka-lab's --keep: the cluster's files, the schedule")
    args = parser.parse_args()
    command = [
        sys.executable,
        "-m",
        "fencewatch",
        "kafka-lab",
        "--nemesis",
        "--seed",
        str(args.seed),
        "--duration",
        str(args.duration),
    ]
    if args.keep:
        command += ["--keep", args.keep]
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    elapsed = time.monotonic() - started
    print(done.stdout, end="")
    if done.returncode not in (0, 1):
        print(done.stderr[-3000:], file=sys.stderr)
    print(
        f"command: fencewatch kafka-lab --nemesis --seed {args.seed} --duration {args.duration:.0f}; "
        f"exit {done.returncode}; wall {elapsed:.0f} s; {datetime.now(UTC):%Y-%m-%d}; "
        f"{os.cpu_count()} cores, load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
