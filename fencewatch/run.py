"""``fencewatch run``: the streaming job against a real Kafka cluster."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from contextlib import ExitStack
from typing import Any

from fencewatch.observability import add_observability_options, check_observability_paths, observability
from fencewatch.options import add_detector_options, bucket_count, detector_config, output_dir
from producers.kafka_publisher import SASL_PASSWORD_ENV, parse_config_pairs
from streaming.bucket_layout import DEFAULT_BUCKETS


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run the streaming detector on Spark against a Kafka event topic",
        description="Consume envelope events from a Kafka topic, detect fencing violations with Spark "
        "Structured Streaming (RocksDB state, checkpointed), and publish alerts and dead letters to topics.",
    )
    env = os.environ.get
    p.add_argument(
        "--bootstrap-servers",
        default=env("FENCEWATCH_BOOTSTRAP_SERVERS"),
        required=env("FENCEWATCH_BOOTSTRAP_SERVERS") is None,
        help="env FENCEWATCH_BOOTSTRAP_SERVERS",
    )
    p.add_argument(
        "--topic",
        default=env("FENCEWATCH_TOPIC"),
        required=env("FENCEWATCH_TOPIC") is None,
        help="the event topic (env FENCEWATCH_TOPIC)",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        metavar="DIR",
        help="Spark checkpoint directory: offsets and detector state; restart with the same one. "
        "One job at a time: a local checkpoint is locked while the job runs",
    )
    p.add_argument(
        "--master",
        default=env("FENCEWATCH_SPARK_MASTER", "local[2]"),
        help="Spark master URL, e.g. spark://host:7077 (env FENCEWATCH_SPARK_MASTER; default %(default)s)",
    )
    p.add_argument("--alerts-topic", default="fencewatch-alerts")
    p.add_argument("--dead-letter-topic", default="fencewatch-dead-letters")
    p.add_argument(
        "--kafka-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka setting for every client (TLS/SASL), repeatable; the SASL password may "
        "come from env FENCEWATCH_KAFKA_SASL_PASSWORD instead",
    )
    p.add_argument(
        "--starting-offsets",
        choices=("earliest", "latest"),
        default="earliest",
        help="where a new checkpoint starts reading (default %(default)s)",
    )
    p.add_argument(
        "--max-events-per-trigger", type=int, default=None, help="admission control per micro-batch"
    )
    p.add_argument(
        "--trigger-seconds", type=float, default=1.0, help="micro-batch interval (default %(default)s)"
    )
    p.add_argument(
        "--idle-flush-ms",
        type=int,
        default=10_000,
        help="judge waiting events after a cluster is silent this long (default %(default)s)",
    )
    p.add_argument(
        "--shuffle-partitions",
        type=int,
        default=2,
        help="Spark state partitions: how many tasks share the buckets (default %(default)s)",
    )
    p.add_argument(
        "--buckets",
        type=bucket_count,
        default=None,
        help="split each cluster's partitions into this many buckets, so one cluster's state and "
        f"work spread over several tasks (default {DEFAULT_BUCKETS} for a new checkpoint; a "
        "checkpoint keeps the count it was started with)",
    )
    p.add_argument(
        "--use-builtin-kafka",
        action="store_true",
        help="read with Spark's kafka connector (needs --packages spark-sql-kafka) instead of ours",
    )
    p.add_argument("--quiet", action="store_true", help="do not print alerts on stdout")
    add_observability_options(p)
    add_detector_options(p)
    p.set_defaults(run=run)


def kafka_settings(pairs: list[str]) -> dict[str, str]:
    try:
        settings = parse_config_pairs(pairs)
    except ValueError as exc:
        raise SystemExit(f"fencewatch run: {exc}") from None
    if "sasl.password" not in settings and os.environ.get(SASL_PASSWORD_ENV):
        settings["sasl.password"] = os.environ[SASL_PASSWORD_ENV]
    return settings


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _lock_checkpoint(stack: ExitStack, checkpoint: str) -> None:
    """Hold the checkpoint's lock until ``stack`` closes; CheckpointInUse if another job has it."""
    from streaming.checkpoint_lock import CheckpointLock, local_directory

    if local_directory(checkpoint) is None:
        print(
            f"fencewatch run: the checkpoint {checkpoint} is not on a local filesystem and cannot be "
            "locked: make sure no other job uses it",
            file=sys.stderr,
        )
        return
    stack.enter_context(CheckpointLock(checkpoint))


def run(args: argparse.Namespace) -> int:
    output_dir("fencewatch run", args.checkpoint, "--checkpoint")
    check_observability_paths(args, "fencewatch run")
    from streaming.bucket_layout import LayoutMismatch
    from streaming.checkpoint_lock import CheckpointInUse
    from streaming.job import JobOptions, spark_session, start
    from streaming.sinks import CompactedSinkTopic

    options = JobOptions(
        bootstrap_servers=args.bootstrap_servers,
        topic=args.topic,
        checkpoint=args.checkpoint,
        alerts_topic=args.alerts_topic,
        dead_letter_topic=args.dead_letter_topic,
        kafka_config=kafka_settings(args.kafka_config),
        starting_offsets=args.starting_offsets,
        max_events_per_trigger=args.max_events_per_trigger,
        trigger_seconds=args.trigger_seconds,
        idle_flush_ms=args.idle_flush_ms,
        use_builtin_kafka=args.use_builtin_kafka,
        buckets=args.buckets,
        detector=detector_config(args),
    )
    # Orchestrators stop services with SIGTERM: treat it as Ctrl-C, so the query
    # stops and the checkpoint stays consistent (an interrupted batch re-runs).
    signal.signal(signal.SIGTERM, _interrupt)
    with ExitStack() as stack:
        # First of all: a second job must neither run batches nor drain the outbox.
        try:
            _lock_checkpoint(stack, args.checkpoint)
        except CheckpointInUse as exc:
            print(f"fencewatch run: {exc}", file=sys.stderr)
            return 1
        obs = stack.enter_context(observability(args, args.checkpoint, "fencewatch run"))
        spark = spark_session(args.master, shuffle_partitions=args.shuffle_partitions)
        try:
            query = start(
                spark,
                options,
                console=None if args.quiet else sys.stdout,
                metrics=obs.metrics,
                webhooks=obs.webhooks,
            )
        except (CompactedSinkTopic, LayoutMismatch) as exc:
            spark.stop()
            print(f"fencewatch run: {exc}", file=sys.stderr)
            return 1
        print(
            f"fencewatch run: reading {args.topic} on {args.bootstrap_servers}, "
            f"checkpoint {args.checkpoint}; Ctrl-C stops",
            file=sys.stderr,
        )
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
            return 130
        finally:
            spark.stop()
    error = query.exception()
    if error is not None:
        print(f"fencewatch run: the query failed: {error}", file=sys.stderr)
        return 1
    return 0
