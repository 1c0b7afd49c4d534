"""``fencewatch replay FILE...``: envelope JSONL in, alert JSONL out (SPEC 4).

Each input is recognised by its first lines first (detectors.file_kinds): a
native log not converted yet, or a binary file, is refused in one line naming
the ``fencewatch convert`` to run. Dead letters go where fencewatch.dead_letters
says; the summary accounts for every line read."""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from typing import Any

import orjson
from tqdm import tqdm

from detectors.config import DetectorConfig
from detectors.engine import TOO_LATE, Detector
from detectors.envelope import DeadLetter, dumps
from detectors.file_kinds import FileKind
from detectors.gc_tuning import tune_for_detector
from detectors.merge import merge_sources
from detectors.sources import EnvelopeLineStats, open_inputs, read_envelopes
from detectors.truth import confusion
from fencewatch.dead_letters import SHOWN_ON_STDERR, DeadLetterOutput
from fencewatch.inputs import peek_kind, wrong_kind
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
from fencewatch.summaries import (
    print_bound_contradictions,
    print_clocks,
    print_confusion,
    print_summary,
    replay_line_accounting,
)
from incidents.page import IncidentReport
from incidents.timelines import from_detector, from_evidence
from incidents.writing import write_report
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
        "re-delivered records are dropped as duplicates. A file that is not envelope JSONL (a native log "
        "not converted yet, a binary file) is refused with the convert command that reads it. Exit codes: "
        "0 done, 1 a file cannot be used, no file gave an envelope, or --truth disagrees, 2 usage error, "
        "130 stopped by a signal.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="envelope JSONL files ('-' for stdin)")
    p.add_argument(
        "--dead-letter",
        metavar="FILE",
        help=f"write unusable records here as JSON lines (default: the first {SHOWN_ON_STDERR} on stderr; "
        "when there are more, all of them to ./fencewatch-dead-letters.jsonl, or -2, -3... if it exists)",
    )
    p.add_argument(
        "--truth",
        metavar="FILE",
        help="a simulator's ground truth: print injected vs detected per rule and exit 1 if they differ",
    )
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    p.add_argument(
        "--report",
        metavar="FILE.html",
        help="also write a self-contained HTML incident report: a summary per rule and severity and "
        "a timeline per alert (docs/operations.md)",
    )
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
    output_file(prog, args.report, "--report", with_siblings=True)
    if args.report == "-":
        fail(prog, "--report - would mix the page with the alerts on stdout", "name an HTML file")
    truth = truth_records(prog, args.truth) if args.truth else None
    if args.engine == "spark":
        return run_spark(args, config, truth)
    try:
        inputs = open_inputs(args.files)
    except OSError as exc:
        print(f"fencewatch replay: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    # Read again from their start after the look at their first lines.
    sniffed = [(name, *peek_kind(f)) for name, f in inputs]
    if _refused(prog, [(name, kind) for name, kind, _ in sniffed]):
        _close(inputs)
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
    dead_out = DeadLetterOutput(prog, args.dead_letter)
    tune_for_detector()
    detector = Detector(config)
    out = sys.stdout
    alerts: list[dict[str, Any]] = []
    line_stats = [EnvelopeLineStats() for _ in sniffed]
    judged_dead = 0  # dead letters of envelopes the detector could not use
    report = replay_report(args.files, config) if args.report else None

    def report_dead(letter: DeadLetter) -> None:
        dead_out.write(dumps(letter.to_dict()))

    def report_judged_dead(letter: DeadLetter) -> None:
        nonlocal judged_dead
        judged_dead += 1
        report_dead(letter)

    stopped = False

    def write_alerts() -> None:
        for alert in detector.drain():
            record = alert.to_dict()
            out.write(dumps(record) + "\n")
            if truth is not None:
                alerts.append(record)
            if report is not None:
                report.add(record, partial(from_detector, detector, record))

    try:
        with sigterm_as_interrupt():
            streams = [
                read_envelopes(f, name, bar.update, args.max_record_bytes, counts)
                for (name, _, f), counts in zip(sniffed, line_stats, strict=True)
            ]
            for item in merge_sources(streams, config.lateness_ms, config.clock_limit_ms):
                if isinstance(item, DeadLetter):
                    detector.dead_letter(item)
                    report_dead(item)
                    continue
                for letter in detector.ingest(item):
                    report_judged_dead(letter)
                write_alerts()
            for letter in detector.flush():
                report_judged_dead(letter)
            write_alerts()
            out.flush()
    except KeyboardInterrupt:
        stopped = True
    finally:
        bar.close()
        _close(inputs)
        dead_out.close()
    print_summary(detector.counters, dead_out.count, sys.stderr)
    print_clocks(
        {
            name: (cs.clocks.measured_nodes(cs.metadata_clock.shift_ms), cs.metadata_clock)
            for name, cs in detector.clusters.items()
        },
        detector.config.grace_ms,
        detector.config.clock_limit_ms,
        sys.stderr,
    )
    print_bound_contradictions(
        {name: cs.bound_contradicted for name, cs in detector.clusters.items()}, sys.stderr
    )
    where = dead_out.where()
    if where:
        print(where, file=sys.stderr)
    if report is not None and write_report(prog, report, args.report):
        return 1
    if stopped:
        print(f"{prog}: stopped by a signal; judgments still waiting were not made", file=sys.stderr)
        return 130
    names = [name for name, _, _ in sniffed]
    no_envelope = _account_for_lines(prog, names, line_stats, detector, judged_dead)
    if truth is not None:
        return 0 if print_confusion(confusion(alerts, truth), sys.stderr) and not no_envelope else 1
    return 1 if no_envelope else 0


def _close(inputs: list[tuple[str, Any]]) -> None:
    for _, f in inputs:
        if f is not sys.stdin.buffer:
            f.close()


def _refused(prog: str, kinds: list[tuple[str, FileKind]]) -> bool:
    """Say, one line each, which inputs are not envelope JSONL and what reads them; True if any."""
    refusals = [
        wrong_kind("-" if name == "<stdin>" else name, kind, FileKind.ENVELOPES) for name, kind in kinds
    ]
    for refusal in filter(None, refusals):
        print(f"{prog}: {refusal}", file=sys.stderr)
    return any(refusals)


def _account_for_lines(
    prog: str,
    names: list[str],
    line_stats: list[EnvelopeLineStats],
    detector: Detector,
    judged_dead: int,
) -> bool:
    """Print what became of every line read, and a line for each input that
    gave no envelope at all; True if no input gave one."""
    total = EnvelopeLineStats()
    for counts in line_stats:
        total.add(counts)
    too_late = detector.counters.unverified.get(str(TOO_LATE), 0)  # counted as its string (Counters)
    duplicates = detector.counters.duplicates
    print(replay_line_accounting(prog, len(names), total, duplicates, too_late, judged_dead), file=sys.stderr)
    unusable = False
    for name, counts in zip(names, line_stats, strict=True):
        if counts.envelopes == 0 and counts.dead_letters:
            unusable = True
            print(
                f"{prog}: no envelope in {name}: all {counts.dead_letters} non-blank lines are dead letters "
                "-- their reasons say what is wrong; `fencewatch convert --help` lists the native formats "
                "it converts to envelopes",
                file=sys.stderr,
            )
    return unusable and total.envelopes == 0


def run_spark(args: argparse.Namespace, config: DetectorConfig, truth: list[dict[str, Any]] | None) -> int:
    """``--engine spark``: streaming.file_source.backfill, printed as replay prints."""
    prog = "fencewatch replay"
    if "-" in args.files:
        fail(prog, "--engine spark cannot read stdin ('-')", "name files, or use --engine python")
    kinds = []
    for name in args.files:
        with open(name, "rb") as f:
            kinds.append((name, peek_kind(f)[0]))
    if _refused(prog, kinds):
        return 1
    from fencewatch.spark_console import spark_log_path, start_spark
    from streaming.file_source import BackfillFailed, BackfillOptions, FilesOutOfOrder, backfill

    options = BackfillOptions(
        files=list(args.files),
        buckets=args.buckets,
        detector=config,
        max_record_bytes=args.max_record_bytes,
        progress_seconds=None if args.no_progress else SPARK_PROGRESS_SECONDS,
    )
    dead_out = DeadLetterOutput(prog, args.dead_letter)

    def report_dead(letter: str) -> None:
        dead_out.write(letter)

    def progress(line: str) -> None:
        print(f"{prog}: {line}", file=sys.stderr, flush=True)

    # Spark's and the JVM's output goes to a file (--verbose: the console), kept
    # and named only when the batch failed in Spark; otherwise nothing in it matters.
    log_file = None if args.verbose else spark_log_path(None, prog)
    keep_log = True  # until the outcome is known: an unexpected error keeps it too
    spark = start_spark(prog, args.master, log_file, app_name="fencewatch-replay")
    try:
        with sigterm_as_interrupt():
            result = backfill(spark, options, report_dead, None if args.no_progress else progress)
        keep_log = False
    except KeyboardInterrupt:
        keep_log = False
        print(f"{prog}: stopped by a signal; nothing was judged", file=sys.stderr)
        return 130
    except FilesOutOfOrder as exc:
        keep_log = False
        print(
            f"{prog}: {exc} -- name the pieces in order, concatenate the files, or use --engine python",
            file=sys.stderr,
        )
        return 1
    except BackfillFailed as exc:
        print(f"{prog}: {exc}" + (f" (Spark's log: {log_file})" if log_file else ""), file=sys.stderr)
        return 1
    finally:
        spark.stop()
        dead_out.close()
        if log_file is not None and not keep_log:
            os.remove(log_file)
    out = sys.stdout
    for alert in result.alerts:
        out.write(alert + "\n")
    out.flush()
    print_summary(result.counters, result.dead_letters, sys.stderr)
    where = dead_out.where()
    if where:
        print(where, file=sys.stderr)
    if args.report:
        report = replay_report(args.files, config)
        for alert in result.alerts:
            record = orjson.loads(alert)
            report.add(record, partial(from_evidence, record, config.grace_ms))
        if write_report(prog, report, args.report):
            return 1
    if truth is not None:
        alerts = [orjson.loads(a) for a in result.alerts]
        return 0 if print_confusion(confusion(alerts, truth), sys.stderr) else 1
    return 0


def replay_config() -> DetectorConfig:
    """The detector settings replay (and ``run``, whose options are the same) uses
    when none is given; the Kafka lab judges its files by them."""
    from fencewatch.cli import build_parser

    return detector_config(build_parser("replay").parse_args(["replay", "-"]))


def replay_report(files: list[str], config: DetectorConfig) -> IncidentReport:
    """The report ``--report`` fills, titled by the files replayed."""
    named = ", ".join("stdin" if f == "-" else os.path.basename(f) for f in files)
    return IncidentReport(title=f"fencewatch incident report: replay of {named}", grace_ms=config.grace_ms)
