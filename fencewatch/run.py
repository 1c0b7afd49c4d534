"""``fencewatch run``: the streaming job against a real Kafka cluster."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from contextlib import ExitStack
from typing import Any

from fencewatch.observability import add_observability_options, check_observability_paths, observability
from fencewatch.options import (
    ALERTS_TOPIC,
    add_bootstrap_servers_option,
    add_detector_options,
    bucket_count,
    detector_config,
    fail,
    output_dir,
)
from fencewatch.probe import add_run_options, beside_job
from streaming import spark_kafka
from streaming.bucket_layout import DEFAULT_BUCKETS
from streaming.spark_kafka import PYTHON_SOURCE, SOURCES, SPARK_SOURCE


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run the streaming detector on Spark against a Kafka event topic",
        description="Consume envelope events from a Kafka topic, detect fencing violations with Spark "
        "Structured Streaming (RocksDB state, checkpointed), and publish alerts and dead letters to topics.",
    )
    env = os.environ.get
    add_bootstrap_servers_option(p)
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
    p.add_argument(
        "--alerts-topic",
        default=ALERTS_TOPIC,
        help="topic the alerts are published to, keyed by cluster; must not be compacted "
        "(default %(default)s)",
    )
    p.add_argument(
        "--dead-letter-topic",
        default="fencewatch-dead-letters",
        help="topic for records that are not valid envelopes, with the reason; must not be "
        "compacted (default %(default)s)",
    )
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
        "--jvm-options",
        default=env("FENCEWATCH_JVM_OPTIONS", ""),
        metavar="OPTIONS",
        help="Java options of the driver's and executors' JVMs, given as --jvm-options=OPTIONS (env "
        "FENCEWATCH_JVM_OPTIONS; default: Spark's). -XX:TieredStopAtLevel=1 (HotSpot's C1 compiler "
        "alone) saves the JIT's CPU over a job's first minutes, on small machines",
    )
    p.add_argument(
        "--kafka-source",
        choices=SOURCES,
        default=env("FENCEWATCH_KAFKA_SOURCE", PYTHON_SOURCE),
        help="what reads the event topic: python, fencewatch's source (confluent-kafka in Spark's Python "
        f"workers), or spark, Spark's own ({spark_kafka.PACKAGE}, downloaded from Maven Central once, "
        f"into ${spark_kafka.CACHE_ENV} or else ~/.cache/fencewatch/spark-packages); --kafka-config's "
        "TLS and SASL settings reach either (env FENCEWATCH_KAFKA_SOURCE; default %(default)s; "
        "docs/operations.md, 'Which source reads the topic')",
    )
    p.add_argument("--quiet", action="store_true", help="do not print alerts on stdout")
    add_observability_options(p)
    add_detector_options(p)
    add_run_options(p)
    p.set_defaults(run=run)


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


def _check_source(prog: str, source: str, kafka_config: dict[str, str]) -> None:
    """End in one line if ``source`` is none of ours (the environment's default
    is not checked by argparse) or Spark's source cannot be given ``kafka_config``."""
    if source not in SOURCES:
        fail(
            prog,
            f"FENCEWATCH_KAFKA_SOURCE={source!r} is none of {', '.join(SOURCES)}",
            "fix or unset FENCEWATCH_KAFKA_SOURCE",
        )
    if source == SPARK_SOURCE:
        try:
            spark_kafka.java_client_settings(kafka_config)
        except spark_kafka.UnsupportedClientSetting as exc:
            fail(prog, str(exc), "drop or change it, or read with the Python source: --kafka-source python")


def _announce_download(prog: str) -> None:
    """Say so when Spark's source is about to be downloaded."""
    if not spark_kafka.is_cached():
        print(
            f"{prog}: downloading Spark's Kafka source ({spark_kafka.PACKAGE}, about 10 MB) from Maven "
            f"Central into {spark_kafka.cache_dir()}, once",
            file=sys.stderr,
        )


def run(args: argparse.Namespace) -> int:
    prog = "fencewatch run"
    output_dir(prog, args.checkpoint, "--checkpoint")
    check_observability_paths(args, prog)
    from pyspark.errors import StreamingQueryException

    from fencewatch.kafka_preflight import check_kafka, kafka_settings
    from fencewatch.spark_console import await_query, query_failed, spark_log_path, start_spark
    from streaming.bucket_layout import LayoutMismatch
    from streaming.checkpoint_lock import CheckpointInUse
    from streaming.job import JobOptions, start
    from streaming.sinks import CompactedSinkTopic

    detector = detector_config(args)
    options = JobOptions(
        bootstrap_servers=args.bootstrap_servers,
        topic=args.topic,
        checkpoint=args.checkpoint,
        alerts_topic=args.alerts_topic,
        dead_letter_topic=args.dead_letter_topic,
        kafka_config=kafka_settings(prog, args.kafka_config),
        starting_offsets=args.starting_offsets,
        max_events_per_trigger=args.max_events_per_trigger,
        trigger_seconds=args.trigger_seconds,
        idle_flush_ms=args.idle_flush_ms,
        kafka_source=args.kafka_source,
        buckets=args.buckets,
        detector=detector,
    )
    _check_source(prog, args.kafka_source, options.kafka_config)
    use_spark_source = args.kafka_source == SPARK_SOURCE
    # Orchestrators stop services with SIGTERM: treat it as Ctrl-C, so the query
    # stops and the checkpoint stays consistent (an interrupted batch re-runs).
    signal.signal(signal.SIGTERM, _interrupt)
    with ExitStack() as stack:
        # First of all: a second job must neither run batches nor drain the outbox.
        try:
            _lock_checkpoint(stack, args.checkpoint)
        except CheckpointInUse as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 1
        # Kafka's problems in one line now, not as a query failure after Spark's start.
        check_kafka(prog, args.bootstrap_servers, options.kafka_config, args.topic)
        if use_spark_source:
            _announce_download(prog)
        obs = stack.enter_context(observability(args, args.checkpoint, prog))
        console = None if args.quiet else sys.stdout
        stack.enter_context(beside_job(args, options.kafka_config, obs.metrics, obs.webhooks, console))
        log_file = None if args.verbose else spark_log_path(args.checkpoint, prog)
        spark = start_spark(
            prog,
            args.master,
            log_file,
            shuffle_partitions=args.shuffle_partitions,
            jvm_options=args.jvm_options,
            kafka_connector=use_spark_source,
        )
        spark_log = f"; Spark's log: {log_file}" if log_file else ""
        try:
            query = start(
                spark,
                options,
                console=None if args.quiet else sys.stdout,
                metrics=obs.metrics,
                webhooks=obs.webhooks,
                # As soon as the query runs, before its sources are up (streaming.query_start).
                on_started=lambda: print(
                    f"{prog}: reading {args.topic} on {args.bootstrap_servers}, "
                    f"checkpoint {args.checkpoint}{spark_log}; Ctrl-C stops",
                    file=sys.stderr,
                ),
            )
        except (CompactedSinkTopic, LayoutMismatch) as exc:
            spark.stop()
            print(f"{prog}: {exc}", file=sys.stderr)
            return 1
        try:
            if await_query(query):
                return 130
            error = query.exception()
        except StreamingQueryException as exc:
            error = exc
        finally:
            spark.stop()
        if error is None:
            return 0
    query_failed(
        prog,
        error,
        log_file,
        args.verbose,
        "once the cause is fixed, start the job again with the same --checkpoint (it resumes where it "
        "stopped); a cause outside your setup is a fencewatch bug: report it with the log",
    )
