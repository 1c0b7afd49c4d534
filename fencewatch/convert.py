"""``fencewatch convert``: native Kafka logs to envelope JSONL (SPEC section 4).

    fencewatch convert request-log --node 1 kafka-request.log > events.jsonl
    kafka-dump-log.sh --cluster-metadata-decoder --files 0.log | fencewatch convert metadata-dump -
    fencewatch convert quorum-state --node 1 /var/lib/kafka/__cluster_metadata-0/quorum-state
    kafka-console-consumer.sh --topic __remote_log_metadata --formatter ... \\
        | fencewatch convert remote-log-metadata -

Envelopes go to stdout, one JSON line per record in input order. Dead letters
(``{"position", "reason", "raw"}``) go to ``--dead-letter FILE`` or stderr, and
a summary goes to stderr. A line or request entry over ``--max-record-bytes``
is a ``too_large`` dead letter and is skipped in bounded pieces, so memory stays
flat on any input. Exit codes: 0 done (even with dead letters, which are
reported), 1 an input or the dead-letter file cannot be used (said before any
output), 2 usage error, 130 stopped by SIGINT/SIGTERM (the summary says how far
it got).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from typing import IO, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from detectors.envelope import MAX_TS_MS, DeadLetter, Envelope, dumps
from detectors.parse_metadata_dump import MetadataDumpStats, iter_metadata_dump
from detectors.parse_quorum_state import QuorumStateStats, parse_quorum_state
from detectors.parse_remote_log_metadata import RemoteLogMetadataStats, iter_remote_log_metadata
from detectors.parse_request_log import RequestLogStats, iter_request_log
from fencewatch.interrupts import sigterm_as_interrupt
from fencewatch.options import add_record_limit_option, input_files, output_file

REQUEST_LOG = "request-log"
METADATA_DUMP = "metadata-dump"
QUORUM_STATE = "quorum-state"
REMOTE_LOG_METADATA = "remote-log-metadata"
Stats = RequestLogStats | MetadataDumpStats | QuorumStateStats | RemoteLogMetadataStats
# What each format counts (every input line or file is accounted for in its summary).
_STATS: dict[str, type[Stats]] = {
    REQUEST_LOG: RequestLogStats,
    METADATA_DUMP: MetadataDumpStats,
    QUORUM_STATE: QuorumStateStats,
    REMOTE_LOG_METADATA: RemoteLogMetadataStats,
}
_MAX_NODE_ID = 2147483647  # Kafka node ids are int32
_MAX_CLUSTER_CHARS = 249  # the envelope schema's limit


def add_parser(subparsers: Any) -> None:
    """Register ``convert`` on the ``fencewatch`` command line."""
    parser = subparsers.add_parser(
        "convert",
        help="convert Kafka's own logs and files (request log, metadata dump, quorum state, remote log "
        "metadata) to envelope JSONL",
        description=(
            "Convert native Kafka logs to fencewatch envelope JSONL on stdout. "
            "request-log: kafka-request.log (logger kafka.request.logger at DEBUG). "
            "metadata-dump: output of kafka-dump-log.sh --cluster-metadata-decoder. "
            "quorum-state: a controller's __cluster_metadata-0/quorum-state file, one envelope per file. "
            "remote-log-metadata: __remote_log_metadata as kafka-console-consumer.sh prints it with "
            "--formatter 'org.apache.kafka.server.log.remote.metadata.storage.serialization."
            "RemoteLogMetadataSerde$RemoteLogMetadataFormatter'."
        ),
        epilog="Exit codes: 0 done (dead letters are reported, not fatal), "
        "1 a file cannot be used, 2 usage error, 130 stopped by a signal.",
    )
    parser.add_argument("format", choices=tuple(_STATS), help="input format")
    parser.add_argument("files", nargs="+", metavar="FILE", help="input files; '-' is stdin")
    parser.add_argument(
        "--cluster", default="default", help="cluster name for the envelopes (default: default)"
    )
    parser.add_argument(
        "--node",
        type=int,
        help="id of the broker/controller that wrote the log (required for request-log, quorum-state)",
    )
    parser.add_argument(
        "--ts-ms",
        type=int,
        metavar="MS",
        help="quorum-state only: when the state was seen, epoch ms (default: the file's modification "
        "time; the file holds no time of its own)",
    )
    parser.add_argument(
        "--tz",
        default=None,
        help="IANA time zone the broker logs local time in (request-log only; default UTC)",
    )
    parser.add_argument(
        "--dead-letter",
        metavar="FILE",
        help="write dead letters as JSON lines to FILE (default: stderr)",
    )
    add_record_limit_option(parser)
    parser.set_defaults(run=run)


def _usage_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, or None."""
    if not args.cluster or len(args.cluster) > _MAX_CLUSTER_CHARS:
        return f"--cluster must be 1 to {_MAX_CLUSTER_CHARS} characters"
    if args.node is not None and not 0 <= args.node <= _MAX_NODE_ID:
        return f"--node must be a node id between 0 and {_MAX_NODE_ID}, got {args.node}"
    if args.format == REQUEST_LOG and args.node is None:
        return "request-log needs --node N: the id of the broker or controller that wrote the log"
    if args.format == QUORUM_STATE and args.node is None:
        return "quorum-state needs --node N: the id of the controller whose file it is (it names none)"
    if args.format == REMOTE_LOG_METADATA and args.node is not None:
        return "--node does not apply to remote-log-metadata: each record names the broker that wrote it"
    if args.ts_ms is not None and args.format != QUORUM_STATE:
        return "--ts-ms applies to quorum-state only (the other formats carry their own times)"
    if args.ts_ms is not None and not 0 <= args.ts_ms <= MAX_TS_MS:
        return f"--ts-ms must be epoch milliseconds between 0 and {MAX_TS_MS}, got {args.ts_ms}"
    if args.format == QUORUM_STATE and args.ts_ms is None and "-" in args.files:
        return "quorum-state from stdin needs --ts-ms MS: stdin has no modification time"
    if args.tz is not None:
        if args.format != REQUEST_LOG:
            return "--tz applies to request-log only (dump timestamps are epoch milliseconds)"
        try:
            ZoneInfo(args.tz)
        except (ZoneInfoNotFoundError, ValueError, OSError):  # "Europe" is a directory
            return f"--tz {args.tz!r} is not a known IANA time zone (e.g. UTC, Europe/Berlin)"
    return None


def run(args: argparse.Namespace) -> int:
    """Convert ``args.files`` in order; return the exit code."""
    prog = "fencewatch convert"
    problem = _usage_problem(args)
    if problem:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        return 2
    input_files(prog, args.files)
    output_file(prog, args.dead_letter, "--dead-letter")
    with ExitStack() as stack:
        # Open everything first so a typo in the last name fails before any output.
        try:
            inputs = [(name, open_input(name, stack)) for name in args.files]
            dead_sink = (
                stack.enter_context(open(args.dead_letter, "w", encoding="utf-8"))
                if args.dead_letter
                else sys.stderr
            )
        except OSError as exc:
            reason = exc.strerror or exc
            print(f"{prog}: cannot open {exc.filename}: {reason} -- check the path", file=sys.stderr)
            return 1
        stats = _STATS[args.format]()
        out = sys.stdout
        stopped = False
        try:
            with sigterm_as_interrupt():
                for name, stream in inputs:
                    items = parse_input(
                        stream,
                        stats,
                        source="stdin" if name == "-" else name,
                        cluster=args.cluster,
                        node=args.node,
                        max_record_bytes=args.max_record_bytes,
                        tz=args.tz or "UTC",
                        ts_ms=args.ts_ms,
                    )
                    for item in items:
                        if isinstance(item, Envelope):
                            out.write(dumps(item.to_dict()) + "\n")
                        else:
                            dead_sink.write(dumps(item.to_dict()) + "\n")
        except KeyboardInterrupt:
            stopped = True
        out.flush()
    summary = _summary(args.format, len(inputs), stats)
    print(f"{summary}; stopped by a signal" if stopped else summary, file=sys.stderr)
    return 130 if stopped else 0


def open_input(name: str, stack: ExitStack) -> IO[bytes]:
    """The input ``name`` ('-': stdin) opened in binary, closed with ``stack``."""
    # Binary: bytes that are not UTF-8 must become dead letters, not a crash.
    if name == "-":
        return sys.stdin.buffer
    return stack.enter_context(open(name, "rb"))


def parse_input(
    stream: IO[bytes],
    stats: Stats,
    *,
    source: str,
    cluster: str,
    node: int | None,
    max_record_bytes: int,
    tz: str = "UTC",
    ts_ms: int | None = None,
) -> Iterator[Envelope | DeadLetter]:
    """The envelopes and dead letters of one input, read with the parser of the
    format whose stats ``stats`` is (``_STATS``); ``fencewatch ship`` reads its
    dump-like inputs with it too.

    node: the writer, for the formats that do not name it (ignored for
    remote-log-metadata, whose records do); required for request-log and
    quorum-state (ValueError). tz: request-log only. ts_ms: quorum-state only,
    when the state was seen, epoch ms (default: the file's modification time).
    """
    if isinstance(stats, RemoteLogMetadataStats):
        return iter_remote_log_metadata(
            stream, source=source, cluster=cluster, stats=stats, max_record_bytes=max_record_bytes
        )
    if isinstance(stats, QuorumStateStats):
        if node is None:
            raise ValueError("quorum-state needs the node whose file it is (the file names none)")
        if ts_ms is None:
            ts_ms = os.fstat(stream.fileno()).st_mtime_ns // 1_000_000
        item = parse_quorum_state(
            stream,
            source=source,
            cluster=cluster,
            node=node,
            ts_ms=ts_ms,
            stats=stats,
            max_record_bytes=max_record_bytes,
        )
        return iter((item,))
    if isinstance(stats, RequestLogStats):
        if node is None:
            raise ValueError("request-log needs the node that wrote it")
        return iter_request_log(
            stream,
            source=source,
            cluster=cluster,
            node=node,
            tz=tz,
            stats=stats,
            max_record_bytes=max_record_bytes,
        )
    return iter_metadata_dump(
        stream, source=source, cluster=cluster, node=node, stats=stats, max_record_bytes=max_record_bytes
    )


def _summary(fmt: str, files: int, stats: Stats) -> str:
    """One human line: what was converted, what was dead-lettered, what was skipped."""
    if isinstance(stats, QuorumStateStats):
        by_version = ", ".join(f"data_version {v}: {n}" for v, n in sorted(stats.records_by_version.items()))
        return (
            f"fencewatch convert {fmt}: {stats.files} file(s): {stats.records} records"
            + (f" ({by_version})" if by_version else "")
            + f", {stats.dead_letters} dead letters"
        )
    head = (
        f"fencewatch convert {fmt}: {files} file(s), {stats.lines} lines: "
        f"{stats.records} records, {stats.dead_letters} dead letters"
    )
    if isinstance(stats, RequestLogStats):
        return f"{head}, {stats.other_logger_lines} other-logger lines skipped"
    if isinstance(stats, RemoteLogMetadataStats):
        by_form = ", ".join(f"{k}={v}" for k, v in sorted(stats.records_by_type.items()))
        return f"{head}{f' ({by_form})' if by_form else ''}, {stats.other_lines} other lines skipped"
    by_type = ", ".join(f"{k}={v}" for k, v in sorted(stats.control_records_by_type.items()))
    control = f" ({by_type})" if by_type else ""
    return (
        f"{head}, {stats.control_records} control records skipped{control}, "
        f"{stats.other_lines} other lines skipped"
    )
