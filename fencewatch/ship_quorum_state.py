"""``fencewatch ship quorum-state PATH``: the command's wiring
(producers.quorum_state_shipper publishes each new state of a controller's
quorum-state file once)."""

from __future__ import annotations

import argparse
import os
import sys

from fencewatch.options import input_file
from fencewatch.shipping import open_publisher, say, ship_until_stopped
from producers.kafka_publisher import KafkaPublisher
from producers.quorum_state_shipper import QuorumStateShipper, quorum_state_path


def run(args: argparse.Namespace, publisher: KafkaPublisher, prog: str) -> int:
    path = quorum_state_path(args.path)
    if os.path.lexists(path):
        input_file(prog, path)
    elif args.once:
        print(f"{prog}: cannot open {path}: no such file -- check the path", file=sys.stderr)
        return 1
    if not open_publisher(publisher, prog, args):
        return 1
    shipper = QuorumStateShipper(
        publisher,
        path,
        cluster=args.cluster,
        node=args.node,
        poll_interval_seconds=args.poll_interval,
        status_interval_seconds=args.status_interval,
        flush_timeout_seconds=args.flush_timeout,
        max_record_bytes=args.max_record_bytes,
        status=say,
    )

    def read_error(exc: Exception) -> str:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        return f"cannot read {path}: {reason} -- check the path"

    return ship_until_stopped(
        prog, lambda: shipper.run(once=args.once), shipper.stop, shipper.summary, read_error=read_error
    )
