"""How fast ``fencewatch replay`` judges a simulated history, next to how fast
the same file can merely be JSON-decoded.

    .venv/bin/python benchmarks/replay_throughput.py                  # 1,000,000 events
    .venv/bin/python benchmarks/replay_throughput.py --events 200000 --repeat 5
    .venv/bin/python benchmarks/replay_throughput.py --input events.jsonl   # reuse a file

One run: simulate ``--events`` envelopes with ``fencewatch simulate`` (in a
child process, so its memory does not count against replay's peak RSS), then
measure, ``--repeat`` times each, in this process:

(a) raw JSON parse: ``orjson.loads`` on every line, single process — the floor
    any JSONL consumer pays;
(b) ``fencewatch replay`` in-process: the real command (``fencewatch.replay.run``:
    read, envelope validation, merge by ``ts_ms``, detection, alert output),
    with stdout captured and stderr discarded.

The measurements take turns (parse, replay, parse, replay, ...), so on a
machine shared with other jobs every one of them sees the same load. It prints
the medians in events per second, replay's rate as a share of the raw parse
rate, this process's peak RSS (``resource.getrusage``, which covers both
measurements and excludes the simulator child), and replay's alerts against
the simulator's ground truth (tp/fp/fn totals).

``--baseline DIR`` adds (c): the same replay run by the ``detectors`` and
``fencewatch`` packages in DIR, another checkout of the project (for example
``git worktree add /tmp/fw-base HEAD``), in a child process that times itself
the way (b) is timed. It takes its turn after (b) in every round, and its
alerts are compared with (b)'s, ``detected_ms`` (wall time) aside::

    .venv/bin/python benchmarks/replay_throughput.py --events 200000 --repeat 5 --baseline /tmp/fw-base

Detection settings follow ``fencewatch replay``'s defaults, including any
``FENCEWATCH_*`` environment overrides, and are printed with the results.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import orjson

from detectors.truth import confusion
from fencewatch.cli import build_parser

T = TypeVar("T")


def rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    """Peak resident set size so far, in MB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(who).ru_maxrss / 1024


def simulate(path: Path, events: int, seed: int, fault_rate: float) -> float:
    """Write ``events`` envelopes (and ``<path>.truth.jsonl``); returns seconds."""
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "fencewatch",
            "simulate",
            "--seed",
            str(seed),
            "--events",
            str(events),
            "--fault-rate",
            str(fault_rate),
            "--output",
            str(path),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def raw_parse(path: Path) -> int:
    """Decode every line with orjson and keep nothing; returns the line count."""
    n = 0
    loads = orjson.loads
    with path.open("rb") as f:
        for line in f:
            if line.strip():
                loads(line)
                n += 1
    return n


def replay(path: Path) -> tuple[int, list[dict]]:
    """``fencewatch replay --no-progress FILE`` in this process; returns its
    exit code and the alerts it wrote."""
    args = build_parser().parse_args(["replay", "--no-progress", str(path)])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = int(args.run(args))
    return code, [orjson.loads(line) for line in out.getvalue().splitlines() if line]


def clocked(fn: Callable[[], T]) -> tuple[float, T]:
    """Seconds one call of ``fn`` took, and its result."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def alerts_digest(alerts: list[dict]) -> str:
    """A digest of the alerts in order, without ``detected_ms`` (wall time)."""
    digest = hashlib.sha256()
    for alert in alerts:
        stable = {k: v for k, v in alert.items() if k != "detected_ms"}
        digest.update(orjson.dumps(stable, option=orjson.OPT_SORT_KEYS) + b"\n")
    return digest.hexdigest()


def replay_once(path: Path) -> int:
    """Child mode of ``--baseline``: time one in-process replay with whatever
    ``detectors`` and ``fencewatch`` PYTHONPATH points at; print it as JSON."""
    seconds, (code, alerts) = clocked(lambda: replay(path))
    print(json.dumps({"seconds": seconds, "code": code, "digest": alerts_digest(alerts)}))
    return 0


def baseline_replay(tree: Path, path: Path) -> dict:
    """One ``replay_once`` of ``path`` in a child process running the packages in ``tree``."""
    path_entries = [str(tree), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(e for e in path_entries if e)}
    done = subprocess.run(
        [sys.executable, __file__, "--replay-once", str(path)],
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    result: dict = json.loads(done.stdout.splitlines()[-1])
    return result


def fmt_rate(events: int, seconds: float) -> str:
    return f"{events / seconds:>12,.0f} ev/s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--events", type=int, default=1_000_000, help="events to simulate (default %(default)s)")
    p.add_argument(
        "--input", type=Path, metavar="FILE", help="reuse this envelope JSONL instead of simulating"
    )
    p.add_argument(
        "--truth",
        type=Path,
        metavar="FILE",
        help="ground truth for --input (default: FILE.truth.jsonl when it exists)",
    )
    p.add_argument(
        "--output", type=Path, metavar="FILE", help="keep the simulated events here (default: temp)"
    )
    p.add_argument("--repeat", type=int, default=3, help="runs per measurement (default %(default)s)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--fault-rate", type=float, default=0.0005, help="simulator fault rate (default %(default)s)"
    )
    p.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="also time the replay of another checkout of the project, in the same rounds",
    )
    p.add_argument("--replay-once", type=Path, help=argparse.SUPPRESS)  # --baseline's child
    args = p.parse_args(argv)
    if args.replay_once:
        return replay_once(args.replay_once)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if args.baseline and not (args.baseline / "detectors").is_dir():
        p.error(f"--baseline {args.baseline}: no detectors package there")

    with tempfile.TemporaryDirectory(prefix="fencewatch-bench-") as tmp:
        simulate_s, simulate_mb = None, 0.0
        if args.input:
            path = args.input
            truth_path = args.truth or Path(f"{path}.truth.jsonl")
        else:
            path = args.output or Path(tmp) / "events.jsonl"
            truth_path = Path(f"{path}.truth.jsonl")
            print(f"simulating {args.events:,} events to {path} ...", file=sys.stderr)
            simulate_s = simulate(path, args.events, args.seed, args.fault_rate)
            simulate_mb = rss_mb(resource.RUSAGE_CHILDREN)  # before any --baseline child runs
        imports_mb = rss_mb()

        parse_s: list[float] = []
        replay_s: list[float] = []
        base_s: list[float] = []
        base: dict = {}
        turns = "raw JSON parse, fencewatch replay" + (", baseline replay" if args.baseline else "")
        for n in range(1, args.repeat + 1):
            print(f"round {n} of {args.repeat}: {turns}", file=sys.stderr)
            seconds, lines = clocked(lambda: raw_parse(path))
            parse_s.append(seconds)
            seconds, (code, alerts) = clocked(lambda: replay(path))
            replay_s.append(seconds)
            if args.baseline:
                base = baseline_replay(args.baseline, path)
                base_s.append(base["seconds"])
        peak_mb = rss_mb()
        truth = (
            [orjson.loads(line) for line in truth_path.read_bytes().splitlines() if line.strip()]
            if truth_path.exists()
            else None
        )
        size_mb = path.stat().st_size / 1e6

    parse_med, replay_med = statistics.median(parse_s), statistics.median(replay_s)
    replay_cfg = build_parser().parse_args(["replay", "x"])
    rows = [
        ("input", f"{path} ({lines:,} events, {size_mb:,.1f} MB)"),
        (
            "simulated",
            f"seed {args.seed}, fault rate {args.fault_rate}, {simulate_s:.1f} s, "
            f"child peak RSS {simulate_mb:,.0f} MB"
            if simulate_s is not None
            else "no (--input)",
        ),
        (
            "detection",
            f"grace {replay_cfg.grace_ms} ms, lateness {replay_cfg.lateness_ms} ms, "
            f"quorum fetch timeout {replay_cfg.quorum_fetch_timeout_ms} ms",
        ),
        ("python", f"{sys.version.split()[0]}, {os.cpu_count()} CPUs, repeat {args.repeat}"),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print()
    print(f"{'measurement':<32} {'median':>17} {'median s':>9}  runs (s)")
    measured = [("raw JSON parse (orjson.loads)", parse_s), ("fencewatch replay (in-process)", replay_s)]
    if args.baseline:
        measured.append(("baseline replay (--baseline)", base_s))
    for name, secs in measured:
        med = statistics.median(secs)
        print(f"{name:<32} {fmt_rate(lines, med)} {med:>9.2f}  {' '.join(f'{s:.2f}' for s in secs)}")
    # Rates are events over seconds, so the rate ratio is the inverse of the time ratio.
    share, slowdown = parse_med / replay_med, replay_med / parse_med
    print(f"{'replay rate / raw parse rate':<32} {share:>17.1%}  ({slowdown:.1f}x slower)")
    if args.baseline:
        base_med = statistics.median(base_s)
        print(f"{'baseline rate / raw parse rate':<32} {parse_med / base_med:>17.1%}")
        print(f"{'replay rate / baseline rate':<32} {base_med / replay_med:>16.2f}x  ({args.baseline})")
        same = base["digest"] == alerts_digest(alerts) and base["code"] == code
        verdict = "identical" if same else "DIFFERENT"
        print(f"{'alerts as the baseline':<32} {verdict:>12}  (detected_ms aside)")
    print()
    print(f"{'peak RSS, this process':<32} {peak_mb:>12,.0f} MB  (after imports: {imports_mb:,.0f} MB)")
    print(f"{'replay exit code':<32} {code:>12}")
    print(f"{'alerts':<32} {len(alerts):>12,}")
    if truth is None:
        print(f"{'ground truth':<32} {'none':>12}  ({truth_path} not found)")
        return 0
    table = confusion(alerts, truth)
    totals = {k: sum(row[k] for row in table.values()) for k in ("tp", "fp", "fn")}
    print(f"{'ground truth (injected)':<32} {len(truth):>12,}")
    print(f"{'confusion tp / fp / fn':<32} {totals['tp']:>12,} / {totals['fp']:,} / {totals['fn']:,}")
    for rule, row in table.items():
        if row["fp"] or row["fn"]:
            print(f"  {rule}: tp {row['tp']} fp {row['fp']} fn {row['fn']}")
    return 0 if totals["fp"] == totals["fn"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
