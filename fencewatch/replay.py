"""``fencewatch replay FILE...``: envelope JSONL in, alert JSONL out (SPEC 4)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import orjson
from tqdm import tqdm

from detectors.engine import Detector
from detectors.envelope import DeadLetter, dumps
from detectors.sources import merge_by_time, open_inputs, read_envelopes
from detectors.truth import confusion
from fencewatch.options import add_detector_options, detector_config
from fencewatch.report import print_confusion, print_summary

PROGRESS_MIN_BYTES = 16 * 1024 * 1024


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="judge envelope JSONL files offline",
        description="Merge envelope JSONL files by ts_ms, run every rule, print one alert JSON per line on "
        "stdout and a summary on stderr.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="envelope JSONL files ('-' for stdin)")
    p.add_argument("--dead-letter", metavar="FILE", help="write unusable records here (default: stderr)")
    p.add_argument(
        "--truth",
        metavar="FILE",
        help="a simulator's ground truth: print injected vs detected per rule and exit 1 if they differ",
    )
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    add_detector_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = detector_config(args)
    try:
        inputs = open_inputs(args.files)
    except OSError as exc:
        print(f"fencewatch replay: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    total = sum(os.fstat(f.fileno()).st_size for _, f in inputs if f is not sys.stdin.buffer)
    bar = tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc="replay",
        file=sys.stderr,
        disable=args.no_progress or total < PROGRESS_MIN_BYTES or None,
    )
    dead_out = open(args.dead_letter, "w") if args.dead_letter else sys.stderr  # noqa: SIM115
    detector = Detector(config)
    out = sys.stdout
    alerts: list[dict[str, Any]] = []
    dead = 0

    def report_dead(letter: DeadLetter) -> None:
        nonlocal dead
        dead += 1
        print(dumps(letter.to_dict()), file=dead_out)

    try:
        streams = [read_envelopes(f, name, bar.update) for name, f in inputs]
        for item in merge_by_time(streams):
            if isinstance(item, DeadLetter):
                detector.dead_letter(item)
                report_dead(item)
                continue
            letter = detector.ingest(item)
            if letter is not None:
                report_dead(letter)
            for alert in detector.drain():
                record = alert.to_dict()
                out.write(dumps(record) + "\n")
                if args.truth:
                    alerts.append(record)
        detector.flush()
        for alert in detector.drain():
            record = alert.to_dict()
            out.write(dumps(record) + "\n")
            if args.truth:
                alerts.append(record)
        out.flush()
    finally:
        bar.close()
        for _, f in inputs:
            if f is not sys.stdin.buffer:
                f.close()
        if dead_out is not sys.stderr:
            dead_out.close()
    print_summary(detector.counters, dead, sys.stderr)
    if args.truth:
        with open(args.truth, "rb") as f:
            truth = [orjson.loads(line) for line in f if line.strip()]
        return 0 if print_confusion(confusion(alerts, truth), sys.stderr) else 1
    return 0
