"""``fencewatch ship``: publish native Kafka logs as envelopes to the event topic.

    fencewatch ship request-log --bootstrap-servers kafka:9092 --topic fencewatch-events \\
        --cluster prod-eu-1 --node 2 /var/log/kafka/kafka-request.log
    fencewatch ship metadata-dump --bootstrap-servers kafka:9092 --topic fencewatch-events \\
        --cluster prod-eu-1 dump-0.txt dump-1.txt
    fencewatch ship quorum-state --bootstrap-servers kafka:9092 --topic fencewatch-events \\
        --cluster prod-eu-1 --node 3000 /var/lib/kafka/__cluster_metadata-0
    fencewatch ship metadata-log --bootstrap-servers kafka:9092 --topic fencewatch-events \\
        --cluster prod-eu-1 /var/lib/kafka/__cluster_metadata-0
    fencewatch ship remote-log-metadata --bootstrap-servers kafka:9092 --topic fencewatch-events \\
        --cluster prod-eu-1 --from-topic --source-bootstrap-servers prod-eu-1-kafka:9092

This module parses the command line and wires each format's shipper, which
lives with the other producers. ``request-log`` follows the file like
``tail -F`` (rotation by rename and by copytruncate survive, see
:mod:`producers.tail`; :mod:`producers.request_log_shipper` publishes) until
SIGTERM/SIGINT, or with ``--once`` reads to the current end and exits.
``metadata-dump`` and ``remote-log-metadata`` publish their files once and exit
(:mod:`producers.dump_shipper`); ``remote-log-metadata --from-topic`` instead
reads the watched cluster's ``__remote_log_metadata`` itself, decoding each
record's bytes (:mod:`producers.remote_log_metadata_topic`), remembering its
position per partition like the following shippers, until SIGTERM/SIGINT or,
with ``--once``, to the topic's end. ``quorum-state`` watches a controller's
quorum-state file (:mod:`producers.quorum_state_shipper`) until SIGTERM/SIGINT,
or with ``--once`` publishes the current state and exits. ``metadata-log``
follows a live ``__cluster_metadata-0`` directory (shipped by
:mod:`producers.metadata_log_shipper`). Each format's wiring is a module of its
own: ``fencewatch.ship_request_log``, ``ship_dumps``, ``ship_remote_log_topic``,
``ship_quorum_state`` and ``ship_metadata_log``.

Records are keyed by ``--cluster``; values are envelope JSON. Dead letters go to
``--dead-letter-topic`` when given, else to stderr as JSON lines.

Delivery guarantee (request-log): the position in the file is saved to the
state file (default ``FILE.fencewatch-offset``) only after every record before
it was acknowledged by the broker. A restart therefore loses nothing, and can
repeat only records that were shipped but not yet confirmed when the shipper
died (a crash, SIGKILL, or a delivery failure): at-least-once for that last
unconfirmed stretch, exactly once for everything else. A clean stop (SIGTERM,
SIGINT, ``--once``) flushes and saves first, so the next run repeats nothing.

A partial last line is left for later (it waits for its newline); with
``--once`` the last request entry is shipped only once the log has moved past
it, so an entry that is still being written is never cut short.

A line or request entry over ``--max-record-bytes`` becomes a ``too_large``
dead letter without being held in memory. Request entries of APIs no rule
reads (``detectors.rules.READ_APIS``: a Heartbeat, a Metadata...) are counted by
API in the summary instead of shipped, unless ``--all-apis``.

Exit codes: 0 done; 1 a file or the state file cannot be used (said in one
line before anything is shipped), or records could not be delivered (the state
keeps the last confirmed position); 2 usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from detectors.parse_quorum_state import FILE_NAME as QUORUM_STATE_FILE_NAME
from fencewatch import ship_dumps, ship_quorum_state, ship_remote_log_topic, ship_request_log
from fencewatch.options import add_record_limit_option
from fencewatch.ship_remote_log_topic import REMOTE_TOPIC_STATE_FILE, SOURCE_SASL_PASSWORD_ENV
from fencewatch.shipping import (
    STATE_SUFFIX,
    add_kafka_options,
    publisher_from_args,
)
from producers.dump_shipper import METADATA_DUMP, REMOTE_LOG_METADATA
from producers.kafka_publisher import (
    parse_config_pairs,
)
from producers.quorum_state_shipper import FORMAT as QUORUM_STATE
from producers.request_log_shipper import FORMAT as REQUEST_LOG

METADATA_LOG = "metadata-log"  # fencewatch.ship_metadata_log
DEAD_LETTER_TOPIC_ENV = "FENCEWATCH_DEAD_LETTER_TOPIC"
SOURCE_BOOTSTRAP_ENV = "FENCEWATCH_SOURCE_BOOTSTRAP_SERVERS"
_MAX_NODE_ID = 2147483647
_MAX_CLUSTER_CHARS = 249


# -- command line ----------------------------------------------------------------


def add_parser(subparsers: Any) -> None:
    """Register ``ship`` on the ``fencewatch`` command line."""
    parser = subparsers.add_parser(
        "ship",
        help="publish Kafka's request log, metadata dump or log, or quorum state as envelopes to a topic",
        description="Publish native Kafka logs as fencewatch envelopes to a Kafka topic, keyed by "
        "cluster. request-log follows a live kafka-request.log like tail -F; metadata-dump "
        "publishes kafka-dump-log.sh --cluster-metadata-decoder output once; metadata-log follows a live "
        "__cluster_metadata-0 directory; quorum-state watches "
        "a controller's quorum-state file and publishes each new state.",
        epilog="Exit codes: 0 done, 1 a file cannot be used or records could not be delivered, "
        "2 usage error.",
    )
    formats = parser.add_subparsers(dest="format", required=True, metavar="FORMAT")

    follow = formats.add_parser(
        REQUEST_LOG,
        help="follow a kafka-request.log (tail -F), remembering the position in a state file",
        description="Follow kafka-request.log like tail -F (rotation by rename or copytruncate "
        "is survived) and publish each request entry of an API some rule reads as an envelope (--all-apis: "
        "of every API). The file position is saved only after the records before it were delivered, so a "
        "restart loses nothing and repeats "
        "at most the records that were not yet confirmed (none after a clean stop).",
        epilog="Exit codes: 0 done (stopped by SIGTERM/SIGINT or --once), 1 a file cannot be used "
        "or records could not be delivered, 2 usage error.",
    )
    _add_common(follow)
    follow.add_argument(
        "--node",
        type=int,
        required=True,
        help="id of the broker/controller that writes this log",
    )
    follow.add_argument(
        "--tz", default="UTC", help="IANA time zone the broker logs local time in (default UTC)"
    )
    follow.add_argument(
        "--state-file",
        metavar="PATH",
        help=f"where to keep the shipped position (default FILE{STATE_SUFFIX}; "
        f"a directory: <dir>/<file name>{STATE_SUFFIX})",
    )
    follow.add_argument(
        "--from-beginning",
        action="store_true",
        help="without a state file, start at the file's beginning (default: at its end, like tail -F)",
    )
    follow.add_argument(
        "--once",
        action="store_true",
        help="read to the current end and exit instead of following (batch use, tests)",
    )
    follow.add_argument(
        "--all-apis",
        action="store_true",
        help="publish the entries of every API (default: only those some rule reads; the others, "
        "Heartbeat, Metadata, ApiVersions..., are counted by API in the summary)",
    )
    follow.add_argument(
        "--poll-interval",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="how often to look for new data, rotation and truncation (default %(default)s)",
    )
    follow.add_argument("file", metavar="FILE", help="the request log to follow")

    dump = formats.add_parser(
        METADATA_DUMP,
        help="publish kafka-dump-log.sh --cluster-metadata-decoder output once",
        description="Publish the metadata records of kafka-dump-log.sh --cluster-metadata-decoder "
        "output as envelopes, then exit.",
    )
    _add_common(dump)
    dump.add_argument("--node", type=int, help="id of the controller whose log was dumped (optional)")
    dump.add_argument("files", nargs="+", metavar="FILE", help="dump files; '-' is stdin")

    remote = formats.add_parser(
        REMOTE_LOG_METADATA,
        help="publish __remote_log_metadata as kafka-console-consumer.sh prints it",
        description="Publish __remote_log_metadata records, read from the watched cluster's topic "
        "itself (--from-topic: each record's bytes decoded with Kafka's own schemas, the position per "
        "partition saved once delivered, so a restart repeats nothing confirmed), or as "
        "kafka-console-consumer.sh prints them with --formatter 'org.apache.kafka.server.log.remote."
        "metadata.storage.serialization.RemoteLogMetadataSerde$RemoteLogMetadataFormatter' (FILE "
        "arguments: read to their end; stdin is followed for as long as the consumer piped into it "
        "runs; nothing is saved between runs, and records repeated are dropped by the detector as "
        "duplicates).",
        epilog="Exit codes: 0 done (files read, --once at the topic's end, or stopped by SIGTERM/SIGINT), "
        "1 an input, the watched cluster or the state file cannot be used or records could not be "
        "delivered, 2 usage error.",
    )
    _add_common(remote)
    source = remote.add_argument_group("the watched cluster (--from-topic)")
    source.add_argument(
        "--from-topic",
        action="store_true",
        help="read __remote_log_metadata from the watched cluster instead of formatter output files",
    )
    source.add_argument(
        "--source-bootstrap-servers",
        metavar="HOSTS",
        default=os.environ.get(SOURCE_BOOTSTRAP_ENV),
        help=f"the watched cluster's brokers host:port[,host:port...] (env {SOURCE_BOOTSTRAP_ENV})",
    )
    source.add_argument(
        "--source-kafka-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka consumer setting for the watched cluster, repeatable (TLS/SASL: "
        "security.protocol, ssl.ca.location, sasl.mechanism, sasl.username, ...); the SASL password "
        f"may come from env {SOURCE_SASL_PASSWORD_ENV} instead; secrets are never printed",
    )
    source.add_argument(
        "--state-file",
        metavar="PATH",
        help="where to keep the next offset of each partition (default: "
        f"./{REMOTE_TOPIC_STATE_FILE} in the current directory)",
    )
    source.add_argument(
        "--once", action="store_true", help="read to the topic's end as it is at start, then exit"
    )
    remote.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="formatter output files; '-' is stdin (not with --from-topic)",
    )

    quorum = formats.add_parser(
        QUORUM_STATE,
        help="watch a controller's quorum-state file and publish each new state once",
        description="Watch the quorum-state file a KRaft controller keeps in __cluster_metadata-0 "
        "and publish each new content once, stamped with the time it was seen (the file has none). "
        "Kafka replaces the file by renaming a new one over it; that is followed. A state written "
        "and replaced again within one poll interval is never seen. A restart publishes the current "
        "state again; the detector recognises it by its content and drops it as a duplicate.",
        epilog="Exit codes: 0 done (stopped by SIGTERM/SIGINT or --once), 1 the file cannot be read "
        "or records could not be delivered, 2 usage error.",
    )
    _add_common(quorum)
    quorum.add_argument(
        "--node", type=int, required=True, help="id of the controller whose file it is (the file names none)"
    )
    quorum.add_argument("--once", action="store_true", help="publish the current state and exit")
    quorum.add_argument(
        "--poll-interval",
        type=float,
        default=0.1,
        metavar="SECONDS",
        help="how often to read the file; states replaced faster are missed (default %(default)s)",
    )
    quorum.add_argument(
        "path",
        metavar="PATH",
        help=f"the {QUORUM_STATE_FILE_NAME} file, or the __cluster_metadata-0 directory holding it",
    )
    live = formats.add_parser(
        METADATA_LOG,
        help="follow a live __cluster_metadata-0 directory from its newest snapshot, each record once",
        description="Follow the __cluster_metadata-0 directory of any broker or controller: start "
        "from the newest snapshot and the segments after it (or from the position in the state file), "
        "publish each record once with its log offset, follow the active segment as Kafka appends to "
        "it, roll to new segments, and take a newer snapshot when the segments before it were deleted. "
        "The position is saved only after the records before it were delivered.",
        epilog="Exit codes: 0 done (stopped by SIGTERM/SIGINT or --once), 1 the directory or state file "
        "cannot be used or records could not be delivered, 2 usage error.",
    )
    _add_common(live)
    live.add_argument("--node", type=int, help="id of the broker/controller whose directory it is (optional)")
    live.add_argument(
        "--state-file",
        metavar="PATH",
        help=f"where to keep the shipped position (default DIR{STATE_SUFFIX}, beside the directory; "
        f"a directory: <dir>/<DIR name>{STATE_SUFFIX})",
    )
    live.add_argument(
        "--once", action="store_true", help="read what is there now and exit instead of following"
    )
    live.add_argument(
        "--poll-interval",
        type=float,
        default=0.1,
        metavar="SECONDS",
        help="how often to look for appended batches and new segments (default %(default)s)",
    )
    live.add_argument("directory", metavar="DIR", help="the __cluster_metadata-0 directory to follow")
    parser.set_defaults(run=run)


def _add_common(parser: argparse.ArgumentParser) -> None:
    add_kafka_options(parser)
    parser.add_argument(
        "--cluster",
        required=True,
        help="cluster name: the envelopes' cluster and the records' key",
    )
    parser.add_argument(
        "--dead-letter-topic",
        metavar="TOPIC",
        default=os.environ.get(DEAD_LETTER_TOPIC_ENV),
        help=f"topic for dead letters (env {DEAD_LETTER_TOPIC_ENV}; default: JSON lines on stderr)",
    )
    parser.add_argument(
        "--flush-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait at exit for outstanding deliveries (default %(default)s)",
    )
    parser.add_argument(
        "--status-interval",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="seconds between status lines on stderr; 0 for none (default %(default)s)",
    )
    add_record_limit_option(parser)


def _usage_problem(args: argparse.Namespace) -> str | None:
    if not args.cluster or len(args.cluster) > _MAX_CLUSTER_CHARS:
        return f"--cluster must be 1 to {_MAX_CLUSTER_CHARS} characters"
    node = getattr(args, "node", None)  # remote-log-metadata has none: each record names its broker
    if node is not None and not 0 <= node <= _MAX_NODE_ID:
        return f"--node must be a node id between 0 and {_MAX_NODE_ID}, got {node}"
    if args.flush_timeout <= 0 or args.status_interval < 0:
        return "--flush-timeout must be positive and --status-interval non-negative"
    if args.format in (REQUEST_LOG, QUORUM_STATE, METADATA_LOG) and args.poll_interval <= 0:
        return "--poll-interval must be positive"
    if args.format == REMOTE_LOG_METADATA:
        return _remote_source_problem(args)
    if args.format == REQUEST_LOG:
        try:
            ZoneInfo(args.tz)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            return f"--tz {args.tz!r} is not a known IANA time zone (e.g. UTC, Europe/Berlin)"
    return None


def run(args: argparse.Namespace) -> int:
    """Ship ``args.file`` / ``args.files``; return the exit code."""
    prog = f"fencewatch ship {args.format}"
    problem = _usage_problem(args)
    publisher = None
    if problem is None:
        try:
            publisher = publisher_from_args(args, dead_letter_topic=args.dead_letter_topic)
        except ValueError as exc:
            problem = str(exc)
    if problem or publisher is None:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        return 2
    if args.format == REQUEST_LOG:
        return ship_request_log.run(args, publisher, prog)
    if args.format == QUORUM_STATE:
        return ship_quorum_state.run(args, publisher, prog)
    if args.format == METADATA_LOG:
        # Imported here: only this format needs kafka-python.
        from fencewatch import ship_metadata_log

        return ship_metadata_log.run(args, publisher, prog)
    if args.format == REMOTE_LOG_METADATA and args.from_topic:
        return ship_remote_log_topic.run(args, publisher, prog)
    return ship_dumps.run(args, publisher, prog)


# -- remote-log-metadata --from-topic ------------------------------------------------


def _remote_source_problem(args: argparse.Namespace) -> str | None:
    if not args.from_topic:
        unused = [
            option
            for option, given in (
                ("--source-kafka-config", args.source_kafka_config),
                ("--state-file", args.state_file),
                ("--once", args.once),
            )
            if given
        ]
        if unused:
            return f"{', '.join(unused)} only apply with --from-topic"
        return None if args.files else "give formatter output FILEs, or --from-topic"
    if args.files:
        return "--from-topic reads the topic: give no FILE"
    if not args.source_bootstrap_servers:
        return f"--from-topic needs --source-bootstrap-servers (or set {SOURCE_BOOTSTRAP_ENV})"
    try:
        parse_config_pairs(args.source_kafka_config)
    except ValueError as exc:
        return str(exc).replace("--kafka-config", "--source-kafka-config")
    return None
