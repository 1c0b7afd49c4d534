"""``fencewatch run``: the streaming job against a real Kafka cluster."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from fencewatch.options import add_detector_options, detector_config
from producers.kafka_publisher import SASL_PASSWORD_ENV, parse_config_pairs

if TYPE_CHECKING:
    from streaming.metrics import Metrics
    from streaming.webhooks import Dispatcher

DEFAULT_METRICS_PORT = 9464  # the port registered for OpenTelemetry/Prometheus exporters


@dataclass(frozen=True)
class Observability:
    metrics: Metrics
    webhooks: Dispatcher | None


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
        help="Spark checkpoint directory: offsets and detector state; restart with the same one",
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
        "--shuffle-partitions", type=int, default=2, help="Spark state partitions (default %(default)s)"
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


def add_observability_options(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(env("FENCEWATCH_METRICS_PORT", str(DEFAULT_METRICS_PORT))),
        help="serve Prometheus /metrics here from the start; 0: any free port, -1: off "
        "(env FENCEWATCH_METRICS_PORT; default %(default)s)",
    )
    p.add_argument(
        "--metrics-bind",
        default=env("FENCEWATCH_METRICS_BIND", "0.0.0.0"),
        help="address for /metrics (env FENCEWATCH_METRICS_BIND; default %(default)s)",
    )
    p.add_argument(
        "--webhooks",
        metavar="FILE",
        default=env("FENCEWATCH_WEBHOOKS"),
        help="webhook endpoints (TOML, docs/operations.md); URLs and secrets come from the "
        "environment or files it names (env FENCEWATCH_WEBHOOKS)",
    )
    p.add_argument(
        "--webhook-outbox",
        metavar="FILE",
        default=env("FENCEWATCH_WEBHOOK_OUTBOX"),
        help="the durable webhook outbox (SQLite) on local disk; default: in a local --checkpoint "
        "directory (env FENCEWATCH_WEBHOOK_OUTBOX)",
    )


def outbox_path(args: argparse.Namespace, checkpoint: str) -> str:
    """Where the webhook outbox lives: it must survive restarts like the checkpoint."""
    if args.webhook_outbox:
        return str(args.webhook_outbox)
    scheme = urlparse(checkpoint).scheme
    if scheme not in ("", "file"):
        raise SystemExit(
            f"fencewatch: the checkpoint {checkpoint} is not on local disk; "
            "pass --webhook-outbox FILE on a persistent local volume"
        )
    directory = Path(urlparse(checkpoint).path if scheme else checkpoint)
    directory.mkdir(parents=True, exist_ok=True)
    return str(directory / "fencewatch-webhook-outbox.sqlite")


@contextmanager
def observability(args: argparse.Namespace, checkpoint: str, prog: str) -> Iterator[Observability]:
    """Metrics served and webhooks delivering for the life of the job."""
    from prometheus_client import CollectorRegistry

    from streaming.metrics import Metrics, serve
    from streaming.webhooks import Dispatcher, WebhookConfigError, load_endpoints

    metrics = Metrics(CollectorRegistry())
    metrics.build.info({"version": version("fencewatch")})
    if args.metrics_port >= 0:
        try:
            port = serve(metrics, args.metrics_port, args.metrics_bind)
        except OSError as exc:
            raise SystemExit(
                f"{prog}: cannot serve metrics on {args.metrics_bind}:{args.metrics_port} ({exc}); "
                "choose another --metrics-port, or -1 to turn metrics off"
            ) from None
        print(f"{prog}: metrics on http://{args.metrics_bind}:{port}/metrics", file=sys.stderr)
    dispatcher = None
    if args.webhooks:
        try:
            endpoints = load_endpoints(args.webhooks)
        except (WebhookConfigError, OSError) as exc:
            raise SystemExit(f"{prog}: {args.webhooks}: {exc}") from None
        dispatcher = Dispatcher(endpoints, outbox_path(args, checkpoint), metrics)
        dispatcher.start()
        names = ", ".join(e.name for e in endpoints)
        print(f"{prog}: delivering alerts to webhooks {names}", file=sys.stderr)
    try:
        yield Observability(metrics, dispatcher)
    finally:
        if dispatcher is not None:
            dispatcher.stop()


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


def run(args: argparse.Namespace) -> int:
    from streaming.job import JobOptions, spark_session, start

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
        detector=detector_config(args),
    )
    # Orchestrators stop services with SIGTERM: treat it as Ctrl-C, so the query
    # stops and the checkpoint stays consistent (an interrupted batch re-runs).
    signal.signal(signal.SIGTERM, _interrupt)
    with observability(args, args.checkpoint, "fencewatch run") as obs:
        spark = spark_session(args.master, shuffle_partitions=args.shuffle_partitions)
        query = start(
            spark,
            options,
            console=None if args.quiet else sys.stdout,
            metrics=obs.metrics,
            webhooks=obs.webhooks,
        )
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
