"""``fencewatch ship metadata-log DIR``: the command's wiring (producers.metadata_log_shipper does the work).

    fencewatch ship metadata-log --bootstrap-servers kafka:9092 --topic fencewatch-events \\
        --cluster prod-eu-1 /var/lib/kafka/meta/__cluster_metadata-0

Follows the ``__cluster_metadata-0`` directory of any broker or controller
from the newest snapshot (or the position saved in the state file, default
``DIR.fencewatch-offset`` beside the directory, never in it) until
SIGTERM/SIGINT, or with ``--once`` to what is there now.
"""

from __future__ import annotations

import argparse
import os
import sys

from fencewatch.shipping import load_state, open_publisher, say, ship_until_stopped, state_path_for
from producers.kafka_publisher import KafkaPublisher
from producers.metadata_log import MetadataLogStats
from producers.metadata_log_follower import MetadataLogFollower
from producers.metadata_log_shipper import MetadataLogShipper, MetadataLogState


def run(args: argparse.Namespace, publisher: KafkaPublisher, prog: str) -> int:
    directory = args.directory.rstrip("/") or "/"
    if not os.path.isdir(directory):
        what = "it is not a directory" if os.path.exists(directory) else "no such directory"
        print(
            f"{prog}: cannot follow {directory}: {what} -- name a broker's or controller's "
            "__cluster_metadata-0 directory",
            file=sys.stderr,
        )
        return 1
    if not os.access(directory, os.R_OK | os.X_OK):
        print(
            f"{prog}: cannot read {directory}: permission denied -- make it readable for this user",
            file=sys.stderr,
        )
        return 1
    state = MetadataLogState(state_path_for(directory, args.state_file), directory)
    usable, start = load_state(prog, state)
    if not usable:
        return 1
    if not open_publisher(publisher, prog, args):
        return 1
    stats = MetadataLogStats()
    shipper = MetadataLogShipper(
        publisher,
        state,
        cluster=args.cluster,
        node=args.node,
        stats=stats,
        status_interval_seconds=args.status_interval,
        flush_timeout_seconds=args.flush_timeout,
        status=say,
    )
    follower = MetadataLogFollower(
        directory,
        cluster=args.cluster,
        node=args.node,
        start=start,
        stats=stats,
        once=args.once,
        poll_interval_seconds=args.poll_interval,
        max_batch_bytes=args.max_record_bytes,
        sleep=publisher.poll,  # serve delivery reports while waiting for data
        on_idle=shipper.on_idle,
        notice=say,
    )
    return ship_until_stopped(
        prog,
        lambda: shipper.run(follower),
        follower.stop,
        shipper.summary,
        state_path=state.path,
    )
