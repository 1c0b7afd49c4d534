"""``fencewatch ship metadata-dump|remote-log-metadata FILE...``: the command's
wiring for dump-like inputs, each read to its end with the parser ``fencewatch
convert`` uses and published by producers.dump_shipper."""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack

from detectors.parse_metadata_dump import MetadataDumpStats
from detectors.parse_native import parse_input
from detectors.parse_remote_log_metadata import RemoteLogMetadataStats
from fencewatch.inputs import open_input
from fencewatch.interrupts import stop_on_signals
from fencewatch.options import input_files
from fencewatch.shipping import open_publisher, say
from producers.dump_shipper import METADATA_DUMP, DumpShipper
from producers.kafka_publisher import DeliveryError, KafkaPublisher


def run(args: argparse.Namespace, publisher: KafkaPublisher, prog: str) -> int:
    """Publish dump-like inputs (metadata-dump, remote-log-metadata) to their end
    (:class:`producers.dump_shipper.DumpShipper`)."""
    input_files(prog, args.files)
    stats: MetadataDumpStats | RemoteLogMetadataStats = (
        MetadataDumpStats() if args.format == METADATA_DUMP else RemoteLogMetadataStats()
    )
    node = getattr(args, "node", None)  # remote-log-metadata has none
    with ExitStack() as stack:
        try:
            inputs = [(name, open_input(name, stack)) for name in args.files]
        except OSError as exc:
            print(
                f"{prog}: cannot open {exc.filename}: {exc.strerror or exc} -- check the path",
                file=sys.stderr,
            )
            return 1
        if not open_publisher(publisher, prog, args):
            return 1
        shipper = DumpShipper(
            publisher,
            input_format=args.format,
            cluster=args.cluster,
            node=node,
            flush_timeout_seconds=args.flush_timeout,
        )
        with stop_on_signals(shipper.stop):
            try:
                for name, stream in inputs:
                    source = "stdin" if name == "-" else name
                    items = parse_input(
                        stream,
                        stats,
                        source=source,
                        cluster=args.cluster,
                        node=node,
                        max_record_bytes=args.max_record_bytes,
                    )
                    shipper.ship(source, items)
                shipper.flush()
            except DeliveryError as exc:
                print(f"{prog}: {exc}", file=sys.stderr)
                return 1
    s = publisher.stats
    skipped = (
        f"{stats.control_records} control records skipped"
        if isinstance(stats, MetadataDumpStats)
        else f"{stats.other_lines} other lines skipped"
    )
    say(
        f"{args.format}: {len(inputs)} file(s), {stats.lines} lines: {s.envelopes} records "
        f"shipped, {stats.dead_letters} dead letters ({s.delivered} delivered), {skipped}"
        + ("; stopped early by a signal" if shipper.stopped else "")
    )
    return 130 if shipper.stopped else 0
