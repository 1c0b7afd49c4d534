"""``fencewatch ship``: publish native Kafka logs as envelopes to the event topic.

    fencewatch ship request-log --bootstrap-servers kafka:9092 --topic fencewatch-events \\
        --cluster prod-eu-1 --node 2 /var/log/kafka/kafka-request.log
    fencewatch ship metadata-dump --bootstrap-servers kafka:9092 --topic fencewatch-events \\
        --cluster prod-eu-1 dump-0.txt dump-1.txt
    fencewatch ship quorum-state --bootstrap-servers kafka:9092 --topic fencewatch-events \\
        --cluster prod-eu-1 --node 3000 /var/lib/kafka/__cluster_metadata-0

``request-log`` follows the file like ``tail -F`` (rotation by rename and by
copytruncate survive, see :mod:`producers.tail`) until SIGTERM/SIGINT, or with
``--once`` reads to the current end and exits. ``metadata-dump`` publishes its
files once and exits. ``quorum-state`` watches a controller's quorum-state file
(see :class:`QuorumStateShipper`) until SIGTERM/SIGINT, or with ``--once``
publishes the current state and exits.

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
dead letter without being held in memory.

Exit codes: 0 done; 1 a file or the state file cannot be used (said in one
line before anything is shipped), or records could not be delivered (the state
keeps the last confirmed position); 2 usage.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from detectors.engine import wall_clock_ms
from detectors.envelope import DeadLetter, Envelope
from detectors.lines import DEFAULT_MAX_RECORD_BYTES
from detectors.parse_metadata_dump import MetadataDumpStats
from detectors.parse_quorum_state import FILE_NAME as QUORUM_STATE_FILE_NAME
from detectors.parse_quorum_state import QuorumStateStats, parse_quorum_state
from detectors.parse_remote_log_metadata import RemoteLogMetadataStats
from detectors.parse_request_log import RequestLogStats, iter_request_log
from fencewatch.convert import open_input, parse_input
from fencewatch.options import add_record_limit_option, input_file, input_files, output_file
from producers.kafka_publisher import (
    SASL_PASSWORD_ENV,
    DeliveryError,
    KafkaPublisher,
    parse_config_pairs,
)
from producers.tail import FileFollower, FilePosition, Segment, StateError, StateFile, StopFollowing

REQUEST_LOG = "request-log"
METADATA_DUMP = "metadata-dump"
QUORUM_STATE = "quorum-state"
REMOTE_LOG_METADATA = "remote-log-metadata"
STATE_SUFFIX = ".fencewatch-offset"
BOOTSTRAP_ENV = "FENCEWATCH_BOOTSTRAP_SERVERS"
TOPIC_ENV = "FENCEWATCH_TOPIC"
DEAD_LETTER_TOPIC_ENV = "FENCEWATCH_DEAD_LETTER_TOPIC"
_MAX_NODE_ID = 2147483647
_MAX_CLUSTER_CHARS = 249
# How often the resume position is saved while records stream (it is also saved
# whenever the follower finds no new data, and at exit).
CHECKPOINT_INTERVAL_SECONDS = 1.0


def _say(message: str) -> None:
    print(f"fencewatch ship: {message}", file=sys.stderr, flush=True)


# -- options shared with `fencewatch simulate` ---------------------------------


def add_kafka_options(parser: argparse.ArgumentParser, *, from_env: bool = True) -> None:
    """``--bootstrap-servers``, ``--topic`` and repeatable ``--kafka-config KEY=VALUE``.

    from_env: take the defaults of the first two from ``$FENCEWATCH_BOOTSTRAP_SERVERS``
    and ``$FENCEWATCH_TOPIC`` (off where giving them changes what a command does).
    """
    group = parser.add_argument_group("kafka")
    bootstrap_help = "broker list host:port[,host:port...]"
    topic_help = "topic the envelopes are published to"
    if from_env:
        bootstrap_help += f" (env {BOOTSTRAP_ENV})"
        topic_help += f" (env {TOPIC_ENV})"
    group.add_argument(
        "--bootstrap-servers",
        metavar="HOSTS",
        default=os.environ.get(BOOTSTRAP_ENV) if from_env else None,
        help=bootstrap_help,
    )
    group.add_argument("--topic", default=os.environ.get(TOPIC_ENV) if from_env else None, help=topic_help)
    group.add_argument(
        "--kafka-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka producer setting, repeatable (TLS/SASL: security.protocol, "
        "ssl.ca.location, sasl.mechanism, sasl.username, ...). The SASL password may come "
        f"from env {SASL_PASSWORD_ENV} instead of the command line; secrets are never printed",
    )


def publisher_from_args(args: argparse.Namespace, *, dead_letter_topic: str | None = None) -> KafkaPublisher:
    """A publisher for the parsed Kafka options; ValueError names a usage problem."""
    if not args.bootstrap_servers:
        raise ValueError(f"--bootstrap-servers is required (or set {BOOTSTRAP_ENV})")
    if not args.topic:
        raise ValueError(f"--topic is required (or set {TOPIC_ENV})")
    extra = parse_config_pairs(args.kafka_config)
    return KafkaPublisher(
        args.bootstrap_servers, args.topic, dead_letter_topic=dead_letter_topic, config=extra
    )


def open_publisher(publisher: KafkaPublisher, prog: str) -> bool:
    """Create the producer so bad settings fail before any input is read; report and return False."""
    from confluent_kafka import KafkaException

    try:
        publisher.open()
    except (KafkaException, ValueError, TypeError) as exc:
        print(f"{prog}: invalid Kafka settings: {exc}", file=sys.stderr)
        return False
    return True


# -- command line ----------------------------------------------------------------


def add_parser(subparsers: Any) -> None:
    """Register ``ship`` on the ``fencewatch`` command line."""
    parser = subparsers.add_parser(
        "ship",
        help="publish Kafka's request log, metadata dump or quorum state as envelopes to a topic",
        description="Publish native Kafka logs as fencewatch envelopes to a Kafka topic, keyed by "
        "cluster. request-log follows a live kafka-request.log like tail -F; metadata-dump "
        "publishes kafka-dump-log.sh --cluster-metadata-decoder output once; quorum-state watches "
        "a controller's quorum-state file and publishes each new state.",
        epilog="Exit codes: 0 done, 1 a file cannot be used or records could not be delivered, "
        "2 usage error.",
    )
    formats = parser.add_subparsers(dest="format", required=True, metavar="FORMAT")

    follow = formats.add_parser(
        REQUEST_LOG,
        help="follow a kafka-request.log (tail -F), remembering the position in a state file",
        description="Follow kafka-request.log like tail -F (rotation by rename or copytruncate "
        "is survived) and publish each request entry as an envelope. The file position is saved "
        "only after the records before it were delivered, so a restart loses nothing and repeats "
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
        description="Publish __remote_log_metadata records as kafka-console-consumer.sh prints them "
        "with --formatter 'org.apache.kafka.server.log.remote.metadata.storage.serialization."
        "RemoteLogMetadataSerde$RemoteLogMetadataFormatter'. Files are read to their end; stdin is "
        "followed for as long as the consumer piped into it runs. Nothing is saved between runs: "
        "started again from the beginning, it repeats records, which the detector drops as "
        "duplicates (they carry their own event time).",
    )
    _add_common(remote)
    remote.add_argument("files", nargs="+", metavar="FILE", help="formatter output files; '-' is stdin")

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
    if args.format in (REQUEST_LOG, QUORUM_STATE) and args.poll_interval <= 0:
        return "--poll-interval must be positive"
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
        return _run_request_log(args, publisher, prog)
    if args.format == QUORUM_STATE:
        return _run_quorum_state(args, publisher, prog)
    return _run_stream(args, publisher, prog)


# -- request-log -------------------------------------------------------------------


def state_path_for(file: str, state_file: str | None) -> str:
    """Where the position of ``file`` is kept: ``--state-file``, a file in that
    directory if it is one, or ``FILE.fencewatch-offset``."""
    if state_file and os.path.isdir(state_file):
        return os.path.join(state_file, os.path.basename(file) + STATE_SUFFIX)
    return state_file or file + STATE_SUFFIX


def _check_request_log_paths(args: argparse.Namespace, state_path: str, prog: str) -> None:
    """The followed file (which may appear later, unless --once) and the state
    file, named by its option even when it is the default, so the way to move
    it is in the message."""
    if os.path.lexists(args.file):
        input_file(prog, args.file)
    if os.path.lexists(state_path):
        input_file(prog, state_path, "--state-file")
    output_file(prog, state_path, "--state-file", with_siblings=True)  # saved by rename (StateFile.save)


def _run_request_log(args: argparse.Namespace, publisher: KafkaPublisher, prog: str) -> int:
    state = StateFile(state_path_for(args.file, args.state_file))
    _check_request_log_paths(args, state.path, prog)
    try:
        start = state.load()
    except StateError as exc:
        print(f"{prog}: {exc} -- move it away to start over", file=sys.stderr)
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
    if not open_publisher(publisher, prog):
        return 1
    shipper = RequestLogShipper(
        publisher,
        state,
        cluster=args.cluster,
        node=args.node,
        tz=args.tz,
        status_interval_seconds=args.status_interval,
        flush_timeout_seconds=args.flush_timeout,
        max_record_bytes=args.max_record_bytes,
    )
    follower = FileFollower(
        args.file,
        start=start,
        from_beginning=args.from_beginning,
        once=args.once,
        poll_interval_seconds=args.poll_interval,
        sleep=publisher.poll,  # serve delivery reports while waiting for data
        on_idle=shipper.on_idle,
        on_notice=_say,
        max_line_bytes=args.max_record_bytes,
    )
    return _ship_until_stopped(
        prog,
        lambda: shipper.run(follower),
        follower.stop,
        shipper.summary,
        undelivered_note=f"; state kept at the last confirmed position in {state.path}",
    )


def _ship_until_stopped(
    prog: str,
    ship: Callable[[], None],
    stop: Callable[[], None],
    summary: Callable[[], str],
    *,
    undelivered_note: str = "",
    read_error: Callable[[Exception], str] = str,
) -> int:
    """Run a following shipper (``ship``) with SIGTERM/SIGINT as a clean stop
    (``stop``), report how it ended, and return the exit code: 0, or 1 when
    records could not be delivered (``undelivered_note`` says what was kept) or
    the input could not be read (``read_error`` says so)."""
    with _stop_on_signals(stop):
        try:
            ship()
        except DeliveryError as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            _say(summary() + undelivered_note)
            return 1
        except (OSError, StateError) as exc:
            print(f"{prog}: {read_error(exc)}", file=sys.stderr)
            return 1
    _say(summary())
    return 0


@contextlib.contextmanager
def _stop_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """SIGTERM and SIGINT ask for a clean stop (flush, save the position) instead of dying."""
    previous: dict[signal.Signals, Any] = {}

    def handler(signum: int, frame: Any) -> None:
        stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        # Outside the main thread signals cannot be set: leave them alone.
        with contextlib.suppress(ValueError):
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


class RequestLogShipper:
    """Parses the follower's lines into envelopes, publishes them, and saves the
    resume position once everything before it was delivered.

    Each position is queued with the number of records produced before it;
    it is saved when the publisher confirms all of them (``confirmed_below``).
    """

    def __init__(
        self,
        publisher: KafkaPublisher,
        state: StateFile,
        *,
        cluster: str,
        node: int,
        tz: str = "UTC",
        status_interval_seconds: float = 30.0,
        checkpoint_interval_seconds: float = CHECKPOINT_INTERVAL_SECONDS,
        flush_timeout_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        status: Callable[[str], None] = _say,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        self.publisher = publisher
        self.state = state
        self.cluster = cluster
        self.node = node
        self.tz = tz
        self.status_interval_seconds = status_interval_seconds
        self.checkpoint_interval_seconds = checkpoint_interval_seconds
        self.flush_timeout_seconds = flush_timeout_seconds
        self.max_record_bytes = max_record_bytes
        self._clock = clock
        self._status = status
        self._checkpoints: deque[tuple[int, FilePosition]] = deque()
        self._confirmed: FilePosition | None = None
        self._saved: FilePosition | None = None
        self._segment: Segment | None = None
        self._stats = RequestLogStats()
        self._follower: FileFollower | None = None
        self._last_save = self._last_status = clock()

    def run(self, follower: FileFollower) -> None:
        """Ship until the follower stops; flush and save. Raises DeliveryError."""
        self._follower = follower
        try:
            for segment in follower.segments():
                self._segment, self._stats = segment, RequestLogStats()
                items = iter_request_log(
                    segment.lines(),
                    source=segment.path,
                    cluster=self.cluster,
                    node=self.node,
                    tz=self.tz,
                    stats=self._stats,
                    max_record_bytes=self.max_record_bytes,
                )
                for item in items:
                    if isinstance(item, Envelope):
                        self.publisher.publish(item)
                    else:
                        self._dead_letter(segment, item)
                    self._mark()
                    self._tick()
                self._mark()
        except StopFollowing:
            pass
        finally:
            self._finish()

    def _finish(self) -> None:
        try:
            self._mark()
            self.publisher.flush(self.flush_timeout_seconds)
        finally:
            self._save_confirmed()
            if self._segment is not None:
                self._segment.close()

    def _dead_letter(self, segment: Segment, letter: DeadLetter) -> None:
        # The parser counts lines from where this run started reading; the file's
        # own line number is what helps whoever looks at the dead letter.
        source, _, line = letter.position.rpartition(":")
        if source == segment.path and line.isdigit():
            letter = dataclasses.replace(letter, position=f"{segment.path}:{segment.first_line + int(line)}")
        self.publisher.dead_letter(
            letter,
            {"format": REQUEST_LOG, "cluster": self.cluster, "node": self.node, "file": segment.path},
            key=self.cluster,
        )

    def _mark(self) -> None:
        """Queue the current position: after every line the parser has finished with."""
        if self._segment is None:
            return
        consumed = self._stats.finished_lines
        position = self._segment.position_after(consumed)
        bound = self.publisher.stats.produced
        if self._checkpoints and self._checkpoints[-1][0] == bound:
            self._checkpoints[-1] = (bound, position)
        elif self._confirmed != position:
            self._checkpoints.append((bound, position))

    def _save_confirmed(self) -> None:
        confirmed_below = self.publisher.confirmed_below
        while self._checkpoints and self._checkpoints[0][0] <= confirmed_below:
            self._confirmed = self._checkpoints.popleft()[1]
        if self._confirmed is not None and self._confirmed != self._saved:
            self.state.save(self._confirmed)
            self._saved = self._confirmed
        self._last_save = self._clock()

    def _tick(self) -> None:
        now = self._clock()
        if now - self._last_save >= self.checkpoint_interval_seconds:
            self._save_confirmed()
        if self.status_interval_seconds and now - self._last_status >= self.status_interval_seconds:
            self._last_status = now
            self._status(self.summary())
        if self.publisher.stats.failed and self._follower is not None:
            self._follower.stop()  # stop reading; the exit flush reports the failures

    def on_idle(self) -> None:
        """The follower found no new data: serve delivery reports, save, report."""
        self.publisher.poll(0)
        self._mark()
        self._save_confirmed()
        self._tick()

    def lag_bytes(self) -> int:
        """Bytes of the current file not yet confirmed delivered (approximate)."""
        segment = self._segment
        if segment is None:
            return 0
        confirmed = self._confirmed
        same_file = confirmed is not None and (confirmed.dev, confirmed.ino) == (segment.dev, segment.ino)
        done = confirmed.offset if same_file and confirmed is not None else segment.start_offset
        return max(0, segment.size() - done)

    def summary(self) -> str:
        s = self.publisher.stats
        return (
            f"{s.envelopes} records shipped, {s.dead_letters} dead letters "
            f"({s.delivered} delivered, {s.in_flight} in flight, {s.failed} failed), "
            f"lag {self.lag_bytes()} bytes"
        )


# -- metadata-dump, remote-log-metadata --------------------------------------------


def _run_stream(args: argparse.Namespace, publisher: KafkaPublisher, prog: str) -> int:
    """Publish dump-like inputs (metadata-dump, remote-log-metadata) to their end.
    A pipe is followed for as long as its writer runs, so
    ``kafka-console-consumer.sh ... | fencewatch ship remote-log-metadata -``
    ships the topic as it grows."""
    input_files(prog, args.files)
    stats: MetadataDumpStats | RemoteLogMetadataStats = (
        MetadataDumpStats() if args.format == METADATA_DUMP else RemoteLogMetadataStats()
    )
    with ExitStack() as stack:
        try:
            inputs = [(name, open_input(name, stack)) for name in args.files]
        except OSError as exc:
            print(
                f"{prog}: cannot open {exc.filename}: {exc.strerror or exc} -- check the path",
                file=sys.stderr,
            )
            return 1
        if not open_publisher(publisher, prog):
            return 1
        stopped = threading.Event()
        with _stop_on_signals(stopped.set):
            try:
                for name, stream in inputs:
                    source = "stdin" if name == "-" else name
                    origin = {"format": args.format, "cluster": args.cluster, "file": source}
                    node = getattr(args, "node", None)  # remote-log-metadata has none
                    if args.format == METADATA_DUMP:
                        origin["node"] = node
                    items = parse_input(
                        stream,
                        stats,
                        source=source,
                        cluster=args.cluster,
                        node=node,
                        max_record_bytes=args.max_record_bytes,
                    )
                    for item in items:
                        if stopped.is_set():
                            break
                        if isinstance(item, Envelope):
                            publisher.publish(item)
                        else:
                            publisher.dead_letter(item, origin, key=args.cluster)
                publisher.flush(args.flush_timeout)
            except DeliveryError as exc:
                print(f"{prog}: {exc}", file=sys.stderr)
                return 1
    s = publisher.stats
    skipped = (
        f"{stats.control_records} control records skipped"
        if isinstance(stats, MetadataDumpStats)
        else f"{stats.other_lines} other lines skipped"
    )
    _say(
        f"{args.format}: {len(inputs)} file(s), {stats.lines} lines: {s.envelopes} records "
        f"shipped, {stats.dead_letters} dead letters ({s.delivered} delivered), {skipped}"
        + ("; stopped early by a signal" if stopped.is_set() else "")
    )
    return 130 if stopped.is_set() else 0


# -- quorum-state --------------------------------------------------------------------


def quorum_state_path(path: str) -> str:
    """The file to watch: ``path``, or the quorum-state file in it if it is a directory."""
    return os.path.join(path, QUORUM_STATE_FILE_NAME) if os.path.isdir(path) else path


def _run_quorum_state(args: argparse.Namespace, publisher: KafkaPublisher, prog: str) -> int:
    path = quorum_state_path(args.path)
    if os.path.lexists(path):
        input_file(prog, path)
    elif args.once:
        print(f"{prog}: cannot open {path}: no such file -- check the path", file=sys.stderr)
        return 1
    if not open_publisher(publisher, prog):
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
    )

    def read_error(exc: Exception) -> str:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        return f"cannot read {path}: {reason} -- check the path"

    return _ship_until_stopped(
        prog, lambda: shipper.run(once=args.once), shipper.stop, shipper.summary, read_error=read_error
    )


class QuorumStateShipper:
    """Publishes each new content of one controller's quorum-state file once.

    Kafka's FileQuorumStateStore writes ``quorum-state.tmp`` and renames it over
    the file, so a read by path always sees one whole state, old or new. The
    file is therefore opened afresh on every poll: that follows the rename
    without tracking inodes, and a file that is missing (not yet created, or
    removed) is waited for. A content equal to the last one seen is not
    published again; a content that comes back after another is (it is a new
    observation). Each envelope's ``ts_ms`` is when the change was seen
    (``clock_ms``): the file has no time. States replaced within one poll
    interval are never seen, so what they said cannot be judged.

    Nothing is saved between runs: a restart publishes the current state again,
    stamped anew. The detector recognises such a repeat by its node and content
    (``detectors.engine.Detector._first_delivery``) and counts it as a
    duplicate, so a restart adds no fact and raises no alert.
    """

    def __init__(
        self,
        publisher: KafkaPublisher,
        path: str,
        *,
        cluster: str,
        node: int,
        poll_interval_seconds: float = 0.1,
        status_interval_seconds: float = 30.0,
        flush_timeout_seconds: float = 30.0,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        clock_ms: Callable[[], int] = wall_clock_ms,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] | None = None,
        status: Callable[[str], None] = _say,
    ) -> None:
        self.publisher = publisher
        self.path = path
        self.cluster = cluster
        self.node = node
        self.poll_interval_seconds = poll_interval_seconds
        self.status_interval_seconds = status_interval_seconds
        self.flush_timeout_seconds = flush_timeout_seconds
        self.max_record_bytes = max_record_bytes
        self.stats = QuorumStateStats()
        self._clock_ms = clock_ms
        self._clock = clock
        self._sleep = sleep or publisher.poll  # serve delivery reports while waiting
        self._status = status
        self._stopped = threading.Event()
        self._last: bytes | None = None
        self._missing = False
        self._last_status = clock()

    def stop(self) -> None:
        self._stopped.set()

    def run(self, *, once: bool = False) -> None:
        """Poll until stopped (or once); flush. Raises DeliveryError and OSError."""
        try:
            while True:
                self.check()
                if once or self._stopped.is_set():
                    break
                self._tick()
                self._sleep(self.poll_interval_seconds)
                if self._stopped.is_set():
                    break
        finally:
            self.publisher.flush(self.flush_timeout_seconds)

    def check(self) -> bool:
        """Read the file once; publish its content if it changed. True if it did."""
        data = self._read()
        if data is None or data == self._last:
            return False
        self._last = data
        item = parse_quorum_state(
            data,
            source=self.path,
            cluster=self.cluster,
            node=self.node,
            ts_ms=self._clock_ms(),
            stats=self.stats,
            max_record_bytes=self.max_record_bytes,
        )
        if isinstance(item, Envelope):
            self.publisher.publish(item)
        else:
            origin = {"format": QUORUM_STATE, "cluster": self.cluster, "node": self.node, "file": self.path}
            self.publisher.dead_letter(item, origin, key=self.cluster)
        return True

    def _read(self) -> bytes | None:
        """The file's bytes (at most one over the limit), or None while it is missing."""
        try:
            with open(self.path, "rb") as f:
                data = f.read(self.max_record_bytes + 1)
        except FileNotFoundError:
            if not self._missing:
                self._missing = True
                if self._last is None:
                    self._status(f"waiting for {self.path}: it does not exist yet")
                else:
                    self._status(f"{self.path} was removed; waiting for it to come back")
            return None
        if self._missing:
            self._missing = False
            self._status(f"{self.path} appeared")
        return data

    def _tick(self) -> None:
        now = self._clock()
        if self.status_interval_seconds and now - self._last_status >= self.status_interval_seconds:
            self._last_status = now
            self._status(self.summary())
        if self.publisher.stats.failed:
            self.stop()  # the exit flush reports the failures

    def summary(self) -> str:
        s = self.publisher.stats
        return (
            f"{QUORUM_STATE}: {self.stats.files} new state(s) seen: {s.envelopes} shipped, "
            f"{s.dead_letters} dead letters ({s.delivered} delivered, {s.in_flight} in flight, "
            f"{s.failed} failed)"
        )
