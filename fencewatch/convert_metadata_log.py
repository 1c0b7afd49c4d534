"""``fencewatch convert metadata-log``: ``__cluster_metadata-0`` files to envelope JSONL.

    fencewatch convert metadata-log --cluster prod-eu-1 \\
        /var/lib/kafka/__cluster_metadata-0/00000000000000012345-0000000003.checkpoint \\
        /var/lib/kafka/__cluster_metadata-0/00000000000000012345.log

Reads segment (``.log``) and snapshot (``.checkpoint``) files natively
(:mod:`producers.metadata_log`) and writes the envelopes ``convert
metadata-dump`` writes for the same records, in file order, to stdout; dead
letters and the summary as the other formats do. A file that does not start
with a record batch v2 is refused before any output, naming what it looks
like. Exit codes as ``fencewatch convert``'s.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from detectors.envelope import Envelope, dumps
from detectors.file_kinds import SNIFF_BYTES, sniff
from fencewatch.dead_letters import DeadLetterOutput
from fencewatch.inputs import convert_command
from fencewatch.interrupts import sigterm_as_interrupt
from fencewatch.options import input_files, output_file
from fencewatch.summaries import by_name
from producers.metadata_log import HEADER_SIZE_UP_TO_MAGIC, MAGIC, MetadataLogStats, iter_metadata_log_file

PROG = "fencewatch convert"
FORMAT = "metadata-log"


def refusal(path: str, cluster: str, node: str) -> str | None:
    """Why ``path`` is no segment or snapshot (one line, with what reads it), or None.
    An empty file is a segment just rolled to."""
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    if not head or (len(head) >= HEADER_SIZE_UP_TO_MAGIC and head[HEADER_SIZE_UP_TO_MAGIC - 1] == MAGIC):
        return None
    kind = sniff(head.splitlines())
    command = convert_command(kind, path, cluster, node)
    what = f"{path} is not a metadata log segment or snapshot (no record batch v2 at its start)"
    if command is None:
        return f"{what}; it looks like {kind.value}"
    return f"{what}; it looks like {kind.value}: run `{command}`"


def run(args: argparse.Namespace) -> int:
    """Convert ``args.files`` in order; return the exit code."""
    if "-" in args.files:
        print(f"{PROG}: error: metadata-log reads files, not stdin: name each file", file=sys.stderr)
        return 2
    input_files(PROG, args.files)
    output_file(PROG, args.dead_letter, "--dead-letter")
    cluster = args.cluster if args.cluster != "default" else "C"
    node = "N" if args.node is None else str(args.node)
    try:
        refusals = [refusal(name, cluster, node) for name in args.files]
    except OSError as exc:
        print(f"{PROG}: cannot open {exc.filename}: {exc.strerror or exc} -- check the path", file=sys.stderr)
        return 1
    if any(refusals):
        for line in filter(None, refusals):
            print(f"{PROG}: {line}", file=sys.stderr)
        return 1
    stats = MetadataLogStats()
    stopped = False
    empty: list[str] = []
    with DeadLetterOutput(PROG, args.dead_letter) as dead:
        try:
            with sigterm_as_interrupt():
                for name in args.files:
                    before = (stats.batches, stats.records)
                    items = iter_metadata_log_file(
                        name,
                        cluster=args.cluster,
                        node=args.node,
                        stats=stats,
                        max_batch_bytes=args.max_record_bytes,
                    )
                    for item in items:
                        if isinstance(item, Envelope):
                            sys.stdout.write(dumps(item.to_dict()) + "\n")
                        else:
                            dead.write(dumps(item.to_dict()))
                    if stats.batches > before[0] and stats.records == before[1]:
                        empty.append(name)
        except KeyboardInterrupt:
            stopped = True
        sys.stdout.flush()
    print(summary(stats) + ("; stopped by a signal" if stopped else ""), file=sys.stderr)
    where = dead.where()
    if where:
        print(where, file=sys.stderr)
    for name in empty:
        print(
            f"{PROG}: no record in {shlex.quote(name)}: only control records, records without a schema "
            "here or dead letters (the summary counts them)",
            file=sys.stderr,
        )
    return 130 if stopped else 1 if empty and not stats.records else 0


def summary(stats: MetadataLogStats) -> str:
    """One human line: what became of every batch and record."""
    # Records of a version newer than the schemas here, read by the fields of the newest one.
    older = ", ".join(f"{k}={v}" for k, v in sorted(stats.read_as_older_by_type.items()))
    if older:
        older = f" (of a version newer than this release knows, read as the newest it knows: {older})"
    return (
        f"{PROG} {FORMAT}: {stats.files} file(s), {stats.batches} batches: {stats.records} records"
        f"{by_name(stats.records_by_type)}{older}, {stats.dead_letters} dead letters; skipped: "
        f"{stats.control_records} control records{by_name(stats.control_records_by_type)}, "
        f"{stats.unread} records without a schema here{by_name(stats.unread_by_type)}"
    )
