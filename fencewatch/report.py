"""``fencewatch report``: the incident report (incidents.page) of a running job,
from its alerts topic.

The topic is read from its start to the end offsets it has when the command
starts, so the report is of a fixed set of alerts however fast new ones come.
The events topic is not read: each timeline is drawn from the alert's own
evidence (``replay --report`` draws the detector's view as well).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from functools import partial
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING

from fencewatch.options import (
    ALERTS_TOPIC,
    add_bootstrap_servers_option,
    add_detector_options,
    detector_config,
    fail,
    output_file,
)
from incidents.alert_records import not_an_alert
from incidents.page import DEFAULT_MAX_PER_RULE, IncidentReport
from incidents.timelines import from_evidence
from incidents.writing import write_report
from streaming.sinks import BROKER_TIMEOUT_S, DeliveryFailed, TopicSink

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
