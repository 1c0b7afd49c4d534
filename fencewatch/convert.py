"""``fencewatch convert``: native Kafka logs to envelope JSONL (SPEC section 4).

    fencewatch convert request-log --node 1 kafka-request.log > events.jsonl
    kafka-dump-log.sh --cluster-metadata-decoder --files 0.log | fencewatch convert metadata-dump -
    fencewatch convert metadata-log --cluster prod-eu-1 00000000000000012345-0000000003.checkpoint \\
        00000000000000012345.log
    fencewatch convert quorum-state --node 1 /var/lib/kafka/__cluster_metadata-0/quorum-state
    kafka-console-consumer.sh --topic __remote_log_metadata --formatter ... \\
        | fencewatch convert remote-log-metadata -

Envelopes go to stdout, one JSON line per record in input order. Dead letters
(``{"position", "reason", "raw"}``) go to ``--dead-letter FILE``, else the first
five to stderr and all of them, once there are more, to a file in the current
directory (fencewatch.dead_letters); a summary accounting for every input line
goes to stderr. A line or request entry over ``--max-record-bytes`` is a
``too_large`` dead letter and is skipped in bounded pieces, so memory stays
flat on any input.

An input is recognised by its first lines (detectors.file_kinds) before any
output: one of another kind (a metadata dump given as a request log, envelope
JSONL converted already, a binary file) is refused with the command that reads
it. Exit codes: 0 done (even with dead letters, which are reported), 1 an input
or the dead-letter file cannot be used (said before any output) or the inputs
gave no record at all (said after, naming each input that gave none), 2 usage
error, 130 stopped by SIGINT/SIGTERM (the summary says how far it got).
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from detectors.envelope import MAX_TS_MS, Envelope, dumps
from detectors.file_kinds import FileKind
from detectors.parse_metadata_dump import MetadataDumpStats
from detectors.parse_native import Stats, parse_input
from detectors.parse_quorum_state import QuorumStateStats
from detectors.parse_remote_log_metadata import RemoteLogMetadataStats
from detectors.parse_request_log import RequestLogStats, unread_account
from fencewatch.dead_letters import SHOWN_ON_STDERR, DeadLetterOutput
from fencewatch.inputs import open_input, peek_kind, wrong_kind
from fencewatch.interrupts import sigterm_as_interrupt
from fencewatch.options import add_record_limit_option, input_files, output_file
from fencewatch.summaries import by_name

REQUEST_LOG = "request-log"
METADATA_DUMP = "metadata-dump"
QUORUM_STATE = "quorum-state"
REMOTE_LOG_METADATA = "remote-log-metadata"
METADATA_LOG = "metadata-log"  # binary files: fencewatch.convert_metadata_log
# What each format counts (every input line or file is accounted for in its summary).
_STATS: dict[str, type[Stats]] = {
    REQUEST_LOG: RequestLogStats,
    METADATA_DUMP: MetadataDumpStats,
    QUORUM_STATE: QuorumStateStats,
    REMOTE_LOG_METADATA: RemoteLogMetadataStats,
}
# The kind of file each format is (detectors.file_kinds recognises them).
FORMAT_KINDS = {
    REQUEST_LOG: FileKind.REQUEST_LOG,
    METADATA_DUMP: FileKind.METADATA_DUMP,
    QUORUM_STATE: FileKind.QUORUM_STATE,
    REMOTE_LOG_METADATA: FileKind.REMOTE_LOG_METADATA,
}
_MAX_NODE_ID = 2147483647  # Kafka node ids are int32
_MAX_CLUSTER_CHARS = 249  # the envelope schema's limit


# What each format reads, for its --help.
_FORMAT_HELP = {
    REQUEST_LOG: "convert kafka-request.log (logger kafka.request.logger at DEBUG) to envelope JSONL",
    METADATA_DUMP: "convert kafka-dump-log.sh --cluster-metadata-decoder output to envelope JSONL",
    QUORUM_STATE: "convert a controller's __cluster_metadata-0/quorum-state file to one envelope per file",
    REMOTE_LOG_METADATA: "convert __remote_log_metadata as kafka-console-consumer.sh prints it with "
    "RemoteLogMetadataSerde$RemoteLogMetadataFormatter to envelope JSONL",
    METADATA_LOG: "convert __cluster_metadata-0 segment (.log) and snapshot (.checkpoint) files, read "
    "natively, to the envelopes metadata-dump gives for the same records",
}


def add_parser(subparsers: Any) -> None:
    """Register ``convert`` on the ``fencewatch`` command line."""
    parser = subparsers.add_parser(
        "convert",
        help="convert Kafka's own logs and files (request log, metadata dump or log files, quorum state, "
        "remote log metadata) to envelope JSONL",
        description=(
            "Convert native Kafka logs to fencewatch envelope JSONL on stdout. "
            "request-log: kafka-request.log (logger kafka.request.logger at DEBUG). "
            "metadata-dump: output of kafka-dump-log.sh --cluster-metadata-decoder. "
            "metadata-log: the __cluster_metadata-0 segment and snapshot files themselves. "
            "quorum-state: a controller's __cluster_metadata-0/quorum-state file, one envelope per file. "
            "remote-log-metadata: __remote_log_metadata as kafka-console-consumer.sh prints it with "
            "--formatter 'org.apache.kafka.server.log.remote.metadata.storage.serialization."
            "RemoteLogMetadataSerde$RemoteLogMetadataFormatter'."
        ),
        epilog="Each input is recognised by its first lines: one of another kind is refused with the command "
        "that reads it. Exit codes: 0 done (dead letters are reported, not fatal), 1 a file cannot be used "
        "(is of another kind), or no input gave a record, 2 usage error, 130 stopped by a signal.",
    )
    # One sub-command per format, so `convert FORMAT --help` shows that format's help;
    # all share the options below, and args.format names the format as before.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "files", nargs="+", metavar="FILE", help="input files; '-' is stdin (not for metadata-log)"
    )
    common.add_argument(
        "--cluster", default="default", help="cluster name for the envelopes (default: default)"
    )
    common.add_argument(
        "--node",
        type=int,
        help="id of the broker/controller that wrote the log (required for request-log, quorum-state)",
    )
    common.add_argument(
        "--ts-ms",
        type=int,
        metavar="MS",
        help="quorum-state only: when the state was seen, epoch ms (default: the file's modification "
        "time; the file holds no time of its own)",
    )
    common.add_argument(
        "--tz",
        default=None,
        help="IANA time zone the broker logs local time in (request-log only; default UTC)",
    )
    common.add_argument(
        "--all-apis",
        action="store_true",
        help="request-log only: keep the entries of every API (default: only those some rule reads, "
        "the others counted by API in the summary)",
    )
    common.add_argument(
        "--dead-letter",
        metavar="FILE",
        help=f"write dead letters as JSON lines to FILE (default: the first {SHOWN_ON_STDERR} on stderr; "
        "when there are more, all of them to ./fencewatch-dead-letters.jsonl, or -2, -3... if it exists)",
    )
    add_record_limit_option(common)
    formats = parser.add_subparsers(dest="format", required=True, metavar="FORMAT", help="input format")
    for name, text in _FORMAT_HELP.items():
        formats.add_parser(name, parents=[common], help=text, description=text, epilog=parser.epilog)
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
    if args.all_apis and args.format != REQUEST_LOG:
        return "--all-apis applies to request-log only (the other formats hold no request entries)"
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
    if args.format == METADATA_LOG:
        # Imported here: only this format needs kafka-python.
        from fencewatch.convert_metadata_log import run as run_metadata_log

        return run_metadata_log(args)
    input_files(prog, args.files)
    output_file(prog, args.dead_letter, "--dead-letter")
    with ExitStack() as stack:
        # Open everything first so a typo in the last name fails before any output.
        try:
            opened = [(name, open_input(name, stack)) for name in args.files]
            dead = stack.enter_context(DeadLetterOutput(prog, args.dead_letter))
        except OSError as exc:
            reason = exc.strerror or exc
            print(f"{prog}: cannot open {exc.filename}: {reason} -- check the path", file=sys.stderr)
            return 1
        inputs = [(name, *peek_kind(stream)) for name, stream in opened]
        cluster = args.cluster if args.cluster != "default" else "C"
        node = "N" if args.node is None else str(args.node)
        wanted = FORMAT_KINDS[args.format]
        refusals = [wrong_kind(name, kind, wanted, cluster, node) for name, kind, _ in inputs]
        if any(refusals):
            for refusal in filter(None, refusals):
                print(f"{prog}: {refusal}", file=sys.stderr)
            return 1
        stats = _STATS[args.format]()
        out = sys.stdout
        stopped = False
        unusable: list[str] = []
        try:
            with sigterm_as_interrupt():
                for name, kind, stream in inputs:
                    before = _usable(stats)
                    items = parse_input(
                        stream,
                        stats,
                        source="stdin" if name == "-" else name,
                        cluster=args.cluster,
                        node=args.node,
                        max_record_bytes=args.max_record_bytes,
                        tz=args.tz or "UTC",
                        ts_ms=args.ts_ms,
                        all_apis=args.all_apis,
                    )
                    for item in items:
                        if isinstance(item, Envelope):
                            out.write(dumps(item.to_dict()) + "\n")
                        else:
                            dead.write(dumps(item.to_dict()))
                    if _gave_nothing(before, _usable(stats)):
                        unusable.append(_no_record(name, kind, wanted, before, _usable(stats)))
        except KeyboardInterrupt:
            stopped = True
        out.flush()
    summary = _summary(args.format, len(inputs), stats)
    print(f"{summary}; stopped by a signal" if stopped else summary, file=sys.stderr)
    where = dead.where()
    if where:
        print(where, file=sys.stderr)
    for line in unusable:
        print(f"{prog}: {line}", file=sys.stderr)
    # One input of several giving nothing is said; none giving anything fails.
    return 130 if stopped else 1 if unusable and not _usable(stats)[0] else 0


def _usable(stats: Stats) -> tuple[int, int, int]:
    """Records so far (request entries left out for their API included: the
    input is a request log, of APIs no rule reads), lines (files, for
    quorum-state) with content so far, dead letters so far."""
    if isinstance(stats, QuorumStateStats):
        return stats.records, stats.files, stats.dead_letters
    if isinstance(stats, RemoteLogMetadataStats):
        return stats.records, stats.lines - stats.other_lines, stats.dead_letters
    unread = stats.unread if isinstance(stats, RequestLogStats) else 0
    return stats.records + unread, stats.lines - stats.blank_lines, stats.dead_letters


def _gave_nothing(before: tuple[int, int, int], after: tuple[int, int, int]) -> bool:
    """Whether an input with content (between two ``_usable`` counts) gave no record."""
    return after[0] == before[0] and after[1] > before[1]


def _no_record(
    name: str, kind: FileKind, wanted: FileKind, before: tuple[int, int, int], after: tuple[int, int, int]
) -> str:
    """One line for an input that gave no record: what it held, and what to do."""
    shown = "stdin" if name == "-" else name
    lines, dead = after[1] - before[1], after[2] - before[2]
    head = f"no record in {shown}: {lines} non-blank lines, {dead} dead letters"
    if kind is wanted:
        return f"{head} -- the dead letters' reasons say what is wrong with its records"
    if kind is FileKind.LOG4J:
        return (
            f"{head}; it looks like {kind.value} -- request entries are written with logger "
            "kafka.request.logger at DEBUG, to kafka-request.log"
        )
    return f"{head}; it looks like {kind.value} -- `fencewatch convert --help` lists the formats it reads"


def _unread_apis(stats: RequestLogStats) -> str:
    """The summary's account of the entries of APIs no rule reads ("" if there was none)."""
    account = unread_account(stats.unread_by_api, stats.bridges)
    return f"; {account}; --all-apis keeps them" if account else ""


def _summary(fmt: str, files: int, stats: Stats) -> str:
    """One human line: what became of every input line (every file, for
    quorum-state), in counts that add up to the total."""
    if isinstance(stats, QuorumStateStats):
        by_version = ", ".join(f"data_version {v}: {n}" for v, n in sorted(stats.records_by_version.items()))
        return (
            f"fencewatch convert {fmt}: {stats.files} file(s): {stats.records} records"
            + (f" ({by_version})" if by_version else "")
            + f", {stats.dead_letters} dead letters"
        )
    by_form = (
        by_name(stats.records_by_type)
        if isinstance(stats, RemoteLogMetadataStats)
        else by_name(stats.records_by_api)
        if isinstance(stats, RequestLogStats)
        else ""
    )
    head = (
        f"fencewatch convert {fmt}: {files} file(s), {stats.lines} lines: "
        f"{stats.records} records{by_form}, {stats.dead_letters} dead letters"
    )
    if isinstance(stats, RequestLogStats):
        return (
            f"{head}, {stats.continuation_lines} continuation lines of multi-line entries; skipped: "
            f"{stats.other_logger_lines} other-logger lines, {stats.blank_lines} blank lines, "
            f"{stats.unrecognised_lines} lines before any log4j entry{_unread_apis(stats)}"
        )
    if isinstance(stats, RemoteLogMetadataStats):
        return (
            f"{head}; skipped: {stats.other_lines} other lines "
            "(blank, or the consumer's 'Processed a total of N messages')"
        )
    control = by_name(stats.control_records_by_type)
    return (
        f"{head}; skipped: {stats.control_records} control records{control}, "
        f"{stats.header_lines} header and batch lines, {stats.blank_lines} blank lines, "
        f"{stats.unrecognised_lines} unrecognised lines"
    )
