"""``fencewatch replay FILE...``: envelope JSONL in, alert JSONL out (SPEC 4)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from tqdm import tqdm

from detectors.engine import Detector
from detectors.envelope import DeadLetter, dumps
from detectors.merge import merge_sources
from detectors.sources import open_inputs, read_envelopes
from detectors.truth import confusion
from fencewatch.interrupts import sigterm_as_interrupt
from fencewatch.options import (
    add_detector_options,
    add_record_limit_option,
    detector_config,
    input_files,
    output_file,
    truth_records,
)
from fencewatch.report import print_confusion, print_summary

PROGRESS_MIN_BYTES = 16 * 1024 * 1024


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="judge envelope JSONL files offline",
        description="Merge envelope JSONL files by ts_ms, run every rule, print one alert JSON per line on "
        "stdout and a summary on stderr. Files may be cut anywhere, named in any order and overlap: "
        "re-delivered records are dropped as duplicates. Exit codes: 0 done, 1 a file cannot be used "
        "or --truth disagrees, 2 usage error, 130 stopped by a signal.",
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
    add_record_limit_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = detector_config(args)
    prog = "fencewatch replay"
    input_files(prog, args.files)
    output_file(prog, args.dead_letter, "--dead-letter")
    truth = truth_records(prog, args.truth) if args.truth else None
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

    stopped = False

    def write_alerts() -> None:
        for alert in detector.drain():
            record = alert.to_dict()
            out.write(dumps(record) + "\n")
            if truth is not None:
                alerts.append(record)

    try:
        with sigterm_as_interrupt():
            streams = [read_envelopes(f, name, bar.update, args.max_record_bytes) for name, f in inputs]
            for item in merge_sources(streams, config.lateness_ms):
                if isinstance(item, DeadLetter):
                    detector.dead_letter(item)
                    report_dead(item)
                    continue
                for letter in detector.ingest(item):
                    report_dead(letter)
                write_alerts()
            for letter in detector.flush():
                report_dead(letter)
            write_alerts()
            out.flush()
    except KeyboardInterrupt:
        stopped = True
    finally:
        bar.close()
        for _, f in inputs:
            if f is not sys.stdin.buffer:
                f.close()
        if dead_out is not sys.stderr:
            dead_out.close()
    print_summary(detector.counters, dead, sys.stderr)
    if stopped:
        print(f"{prog}: stopped by a signal; judgments still waiting were not made", file=sys.stderr)
        return 130
    if truth is not None:
        return 0 if print_confusion(confusion(alerts, truth), sys.stderr) else 1
    return 0
