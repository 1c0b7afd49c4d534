"""``fencewatch report``: the incident report (fencewatch.incident_report) of a
running job, from its alerts topic; and the writing that ``fencewatch replay
--report`` shares.

The topic is read from its start to the end offsets it has when the command
starts, so the report is of a fixed set of alerts however fast new ones come.
The events topic is not read: each timeline is drawn from the alert's own
evidence (``replay --report`` draws the detector's view as well).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING

from detectors.alerts import FIRING, STATUSES
from detectors.config import DetectorConfig
from fencewatch.incident_report import DEFAULT_MAX_PER_RULE, IncidentReport
from fencewatch.incident_timelines import from_evidence
from fencewatch.options import (
    ALERTS_TOPIC,
    add_bootstrap_servers_option,
    add_detector_options,
    detector_config,
    fail,
    output_file,
)
from streaming.sinks import BROKER_TIMEOUT_S, DeliveryFailed, TopicSink

# The fields of SPEC 3 a timeline and the summary need; a record without them is no alert.
REQUIRED_FIELDS = ("alert_id", "rule", "severity", "ts_ms", "detected_ms", "message")
SHOWN_SKIPPED = 10


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="write the HTML incident report of a running job's alerts topic",
        description="Read a fencewatch job's alerts topic from its start to its end now and write one "
        "self-contained HTML file: a summary per rule and severity, and a timeline per alert drawn from "
        "the alert's evidence (fencewatch replay --report also draws the partition's leader, epochs, ISR "
        "and fenced brokers). Exit codes: 0 written, 1 the topic or the file cannot be used, 2 usage error.",
    )
    add_bootstrap_servers_option(p)
    p.add_argument(
        "--alerts-topic",
        default=ALERTS_TOPIC,
        help="the topic fencewatch run publishes alerts to (default %(default)s)",
    )
    p.add_argument("-o", "--output", required=True, metavar="FILE.html", help="where to write the report")
    p.add_argument(
        "--max-per-rule",
        type=int,
        default=DEFAULT_MAX_PER_RULE,
        metavar="N",
        help="draw the first N alerts of each rule; the others are counted (default %(default)s)",
    )
    p.add_argument(
        "--timeout-seconds",
        type=float,
        default=BROKER_TIMEOUT_S,
        metavar="S",
        help="give up when the broker does not answer for this long (default %(default)s)",
    )
    add_detector_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    prog = "fencewatch report"
    output_file(prog, args.output, "--output", with_siblings=True)
    if args.max_per_rule < 0:
        fail(prog, f"--max-per-rule {args.max_per_rule} is negative", "give 0 or more")
    if args.timeout_seconds <= 0:
        fail(prog, f"--timeout-seconds {args.timeout_seconds} is not positive", "give a number of seconds")
    config = detector_config(args)
    report = IncidentReport(
        title=f"fencewatch incident report: {args.alerts_topic} on {args.bootstrap_servers}",
        grace_ms=config.grace_ms,
        max_per_rule=args.max_per_rule,
    )
    skipped: list[str] = []  # the first few, to show
    skipped_count = 0
    seen: set[str] = set()
    repeats = 0
    try:
        for position, record in read_alerts(args.bootstrap_servers, args.alerts_topic, args.timeout_seconds):
            problem = not_an_alert(record)
            if problem:
                skipped_count += 1
                if len(skipped) < SHOWN_SKIPPED:
                    skipped.append(f"{position}: {problem}")
                continue
            if record["alert_id"] in seen:
                # At-least-once delivery may repeat an alert; its id says so (SPEC 3).
                repeats += 1
                continue
            seen.add(record["alert_id"])
            report.add(record, partial(from_evidence, record, config.grace_ms))
    except DeliveryFailed as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    for line in skipped:
        print(f"{prog}: skipped {line}", file=sys.stderr)
    if skipped_count:
        print(
            f"{prog}: {skipped_count} records of {args.alerts_topic} are not alerts and were skipped",
            file=sys.stderr,
        )
    if repeats:
        print(f"{prog}: {repeats} repeated alerts (same alert_id) counted once", file=sys.stderr)
    return write_report(prog, report, args.output)


def read_alerts(bootstrap_servers: str, topic: str, timeout_s: float) -> Iterator[tuple[str, Any]]:
    """Each record of ``topic`` from its start to its end now, as
    (``topic/partition@offset``, decoded JSON or the raw bytes that are not JSON)."""
    sink = TopicSink(bootstrap_servers, topic, {}, timeout_s)
    try:
        ends = sink.end_offsets()  # true ends even where ListOffsets lags (NOTES.md)
        starts = {p: OFFSET_BEGINNING for p, end in ends.items() if end > 0}
        for msg in sink.read_back(starts, f"up to offsets {ends}", "you may Read it", ends):
            where = f"{topic}/{msg.partition()}@{msg.offset()}"
            value = msg.value() or b""
            try:
                yield where, orjson.loads(value)
            except orjson.JSONDecodeError:
                yield where, value
    finally:
        sink.close()


def not_an_alert(record: Any) -> str | None:
    """Why ``record`` cannot be reported as a SPEC 3 alert, or None."""
    if not isinstance(record, dict):
        return "not a JSON object"
    missing = [name for name in REQUIRED_FIELDS if name not in record]
    if missing:
        return f"no {', '.join(missing)}"
    if not all(isinstance(record[name], str) for name in ("alert_id", "rule", "severity", "message")):
        return "alert_id, rule, severity and message must be strings"
    if not all(isinstance(record[name], int) for name in ("ts_ms", "detected_ms")):
        return "ts_ms and detected_ms must be integers"
    if record.get("status", FIRING) not in STATUSES:
        return f"status must be one of {', '.join(STATUSES)}"
    if not _ints_or_null(record, ("node", "partition")):
        return "node and partition must be integers or null"
    links = record.get("links", [])
    if not isinstance(links, list) or not all(isinstance(link, str) for link in links):
        return "links must be a list of strings"
    evidence = record.get("evidence", [])
    if not isinstance(evidence, list) or not all(
        isinstance(e, dict) and isinstance(e.get("ts_ms"), int) and _ints_or_null(e, ("node", "offset"))
        for e in evidence
    ):
        return (
            "evidence must be a list of objects with an integer ts_ms, and node and offset integers or null"
        )
    return None


def _ints_or_null(record: dict[str, Any], names: Sequence[str]) -> bool:
    return all(record.get(name) is None or type(record.get(name)) is int for name in names)


def replay_report(files: Sequence[str], config: DetectorConfig) -> IncidentReport:
    """The report ``fencewatch replay --report`` fills."""
    named = ", ".join("stdin" if f == "-" else os.path.basename(f) for f in files)
    return IncidentReport(title=f"fencewatch incident report: replay of {named}", grace_ms=config.grace_ms)


def write_report(prog: str, report: IncidentReport, path: str) -> int:
    """Write the page beside ``path`` and rename it over, so a reader never
    opens half a report. Returns the exit code."""
    page = report.html()
    partial_path = f"{path}.partial"
    try:
        with open(partial_path, "w", encoding="utf-8") as f:
            f.write(page)
        os.replace(partial_path, path)
    except OSError as exc:
        print(f"{prog}: cannot write the report {path}: {exc.strerror}", file=sys.stderr)
        return 1
    drawn = sum(len(v) for v in report.drawn.values())
    print(
        f"{prog}: wrote {path} ({len(page.encode()) // 1024} KiB): {report.total} alerts, {drawn} timelines",
        file=sys.stderr,
    )
    return 0
