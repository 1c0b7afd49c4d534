"""``fencewatch replay FILE...``: envelope JSONL in, alert JSONL out (SPEC 4)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import orjson
from tqdm import tqdm

from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import DeadLetter, dumps
from detectors.gc_tuning import tune_for_detector
from detectors.merge import merge_sources
from detectors.sources import open_inputs, read_envelopes
from detectors.truth import confusion
from fencewatch.interrupts import sigterm_as_interrupt
from fencewatch.options import (
    add_detector_options,
    add_record_limit_option,
    bucket_count,
    detector_config,
    fail,
    input_files,
    output_file,
    truth_records,
)
from fencewatch.report import print_confusion, print_summary
from streaming.bucket_layout import DEFAULT_BUCKETS  # no Spark import

PROGRESS_MIN_BYTES = 16 * 1024 * 1024
ENGINES = ("python", "spark")
SPARK_PROGRESS_SECONDS = 10.0


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
    spark = p.add_argument_group(
        "engine",
        "--engine spark runs the streaming job's detector (streaming.job.detect: buckets, RocksDB state) "
        "over the files on Spark, in one available-now micro-batch, and prints the same alerts, dead letters "
        "and summary. It reads several files one after another, so they must be consecutive pieces of one "
        "stream named in time order (it checks, and refuses others); no stdin",
    )
    spark.add_argument(
        "--engine",
        choices=ENGINES,
        default="python",
        help="python: this process (default); spark: the streaming job's Spark operator",
    )
    spark.add_argument(
        "--buckets",
        type=bucket_count,
        default=DEFAULT_BUCKETS,
        help="--engine spark: split each cluster into this many buckets, judged in parallel "
        "(default %(default)s)",
    )
    spark.add_argument(
        "--master",
        default=os.environ.get("FENCEWATCH_SPARK_MASTER", "local[2]"),
        help="--engine spark: Spark master URL (env FENCEWATCH_SPARK_MASTER; default %(default)s)",
    )
    add_detector_options(p)
    add_record_limit_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = detector_config(args)
    prog = "fencewatch replay"
    input_files(prog, args.files)
    output_file(prog, args.dead_letter, "--dead-letter")
    truth = truth_records(prog, args.truth) if args.truth else None
    if args.engine == "spark":
        return run_spark(args, config, truth)
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
    tune_for_detector()
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


def run_spark(args: argparse.Namespace, config: DetectorConfig, truth: list[dict[str, Any]] | None) -> int:
    """``--engine spark``: streaming.file_source.backfill, printed as replay prints."""
    prog = "fencewatch replay"
    if "-" in args.files:
        fail(prog, "--engine spark cannot read stdin ('-')", "name files, or use --engine python")
    from streaming.file_source import BackfillFailed, BackfillOptions, FilesOutOfOrder, backfill
    from streaming.job import spark_session

    options = BackfillOptions(
        files=list(args.files),
        buckets=args.buckets,
        detector=config,
        max_record_bytes=args.max_record_bytes,
        progress_seconds=None if args.no_progress else SPARK_PROGRESS_SECONDS,
    )
    dead_out = open(args.dead_letter, "w") if args.dead_letter else sys.stderr  # noqa: SIM115

    def report_dead(letter: str) -> None:
        print(letter, file=dead_out)

    def progress(line: str) -> None:
        print(f"{prog}: {line}", file=sys.stderr, flush=True)

    spark = spark_session(args.master, app_name="fencewatch-replay")
    try:
        with sigterm_as_interrupt():
            result = backfill(spark, options, report_dead, None if args.no_progress else progress)
    except KeyboardInterrupt:
        print(f"{prog}: stopped by a signal; nothing was judged", file=sys.stderr)
        return 130
    except FilesOutOfOrder as exc:
        print(
            f"{prog}: {exc} -- name the pieces in order, concatenate the files, or use --engine python",
            file=sys.stderr,
        )
        return 1
    except BackfillFailed as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
        if dead_out is not sys.stderr:
            dead_out.close()
    out = sys.stdout
    for alert in result.alerts:
        out.write(alert + "\n")
    out.flush()
    print_summary(result.counters, result.dead_letters, sys.stderr)
    if truth is not None:
        alerts = [orjson.loads(a) for a in result.alerts]
        return 0 if print_confusion(confusion(alerts, truth), sys.stderr) else 1
    return 0
