"""``fencewatch ship request-log FILE``: the command's wiring
(producers.request_log_shipper publishes, producers.tail follows the file like
``tail -F``); the position is saved only once delivery confirms it."""

from __future__ import annotations

import argparse
import os
import sys

from fencewatch.options import input_file
from fencewatch.shipping import load_state, open_publisher, say, ship_until_stopped, state_path_for
from producers.kafka_publisher import KafkaPublisher
from producers.request_log_shipper import RequestLogShipper
from producers.tail import FileFollower, StateFile


def run(args: argparse.Namespace, publisher: KafkaPublisher, prog: str) -> int:
    state = StateFile(state_path_for(args.file, args.state_file))
    if os.path.lexists(args.file):  # it may appear later, unless --once
        input_file(prog, args.file)
    usable, start = load_state(prog, state)
    if not usable:
        return 1
    followed = os.path.abspath(args.file)
    if start is not None and start.followed != followed:
        print(
            f"{prog}: state file {state.path} belongs to {start.followed}, not {followed}; "
            "use --state-file to keep a separate one",
            file=sys.stderr,
        )
        return 1
    if args.once and start is None and not os.path.exists(args.file):
        print(f"{prog}: cannot open {args.file}: no such file -- check the path", file=sys.stderr)
        return 1
    if not open_publisher(publisher, prog, args):
        return 1
    shipper = RequestLogShipper(
        publisher,
        state,
        cluster=args.cluster,
        node=args.node,
        tz=args.tz,
        status_interval_seconds=args.status_interval,
        flush_timeout_seconds=args.flush_timeout,
        status=say,
        max_record_bytes=args.max_record_bytes,
        all_apis=args.all_apis,
    )
    follower = FileFollower(
        args.file,
        start=start,
        from_beginning=args.from_beginning,
        once=args.once,
        poll_interval_seconds=args.poll_interval,
        sleep=publisher.poll,  # serve delivery reports while waiting for data
        on_idle=shipper.on_idle,
        on_notice=say,
        max_line_bytes=args.max_record_bytes,
    )
    return ship_until_stopped(
        prog,
        lambda: shipper.run(follower),
        follower.stop,
        shipper.summary,
        state_path=state.path,
    )
