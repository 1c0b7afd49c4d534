"""What every ``fencewatch ship`` format's wiring shares (and ``fencewatch simulate``
the Kafka options): the Kafka options and the publisher they make, opened so bad
settings fail first; a following shipper's state file checked and loaded; and the
shipper run until SIGTERM/SIGINT, its end said in one line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TypeVar

from fencewatch.interrupts import stop_on_signals
from fencewatch.options import input_file, output_file
from producers.kafka_publisher import SASL_PASSWORD_ENV, DeliveryError, KafkaPublisher, parse_config_pairs
from producers.tail import SavedState, StateError

P = TypeVar("P")  # a saved position (load_state)

STATE_SUFFIX = ".fencewatch-offset"
BOOTSTRAP_ENV = "FENCEWATCH_BOOTSTRAP_SERVERS"
TOPIC_ENV = "FENCEWATCH_TOPIC"


def say(message: str) -> None:
    print(f"fencewatch ship: {message}", file=sys.stderr, flush=True)


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


def open_publisher(publisher: KafkaPublisher, prog: str, args: argparse.Namespace | None = None) -> bool:
    """Create the producer so bad settings fail before any input is read; report and return False.

    With ``args``, also ask the brokers once: a listener that refuses the
    client's settings (credentials, an untrusted certificate, TLS on one side
    only) ends the command in one line, as no retry can mend it; brokers that
    do not answer are waited for, the publisher saying so once."""
    from confluent_kafka import KafkaException

    try:
        publisher.open()
    except (KafkaException, ValueError, TypeError) as exc:
        print(f"{prog}: invalid Kafka settings: {exc}", file=sys.stderr)
        return False
    if args is not None:
        from fencewatch.kafka_preflight import check_kafka, kafka_settings

        settings = kafka_settings(prog, args.kafka_config)
        check_kafka(
            prog, args.bootstrap_servers, settings, args.topic, topic_must_exist=False, must_reach=False
        )
    return True


def state_path_for(file: str, state_file: str | None) -> str:
    """Where the position of ``file`` is kept: ``--state-file``, a file in that
    directory if it is one, or ``FILE.fencewatch-offset``."""
    if state_file and os.path.isdir(state_file):
        return os.path.join(state_file, os.path.basename(file) + STATE_SUFFIX)
    return state_file or file + STATE_SUFFIX


def load_state(prog: str, state: SavedState[P]) -> tuple[bool, P | None]:
    """Check a following shipper's state file and load the position saved in
    it (None: none yet). The file is named by its option even when it is the
    default, so the message says how to move it. A file that cannot be used is
    said in one line: (False, None)."""
    if os.path.lexists(state.path):
        input_file(prog, state.path, "--state-file")
    output_file(prog, state.path, "--state-file", with_siblings=True)  # saved by rename (tail.write_state)
    try:
        return True, state.load()
    except StateError as exc:
        print(f"{prog}: {exc} -- move it away to start over", file=sys.stderr)
        return False, None


def ship_until_stopped(
    prog: str,
    ship: Callable[[], None],
    stop: Callable[[], None],
    summary: Callable[[], str],
    *,
    state_path: str | None = None,
    read_error: Callable[[Exception], str] = str,
) -> int:
    """Run a following shipper (``ship``) with SIGTERM/SIGINT as a clean stop
    (``stop``), report how it ended, and return the exit code: 0, or 1 when
    records could not be delivered (the state file at ``state_path``, if any,
    keeps the last confirmed position) or the input could not be read
    (``read_error`` says so)."""
    with stop_on_signals(stop):
        try:
            ship()
        except DeliveryError as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            kept = f"; state kept at the last confirmed position in {state_path}" if state_path else ""
            say(summary() + kept)
            return 1
        except (OSError, StateError) as exc:
            print(f"{prog}: {read_error(exc)}", file=sys.stderr)
            return 1
    say(summary())
    return 0
