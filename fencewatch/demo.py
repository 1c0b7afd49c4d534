"""``fencewatch demo``: everything on the embedded default. Starts the embedded
broker, creates the topics, publishes simulated traffic with injected faults,
runs the streaming job on local Spark, prints alerts as they arrive, and ends
with injected versus detected per rule.

Two simulated clusters share the event topic: ``sim-1`` as envelopes, every
rule injected, and ``sim-native``, whose quorum states and remote log metadata
go through Kafka's own forms (quorum-state files and RemoteLogMetadataFormatter
lines, kept in the demo's temporary directory) and fencewatch's parsers, as
``fencewatch ship`` sends a real cluster's (producers.native_forms)."""

from __future__ import annotations

import argparse
import heapq
import sys
import tempfile
import threading
import time
from typing import Any

import orjson

from detectors.truth import confusion
from fencewatch.observability import add_observability_options, check_observability_paths, observability
from fencewatch.report import print_confusion
from producers.kafka_publisher import KafkaPublisher, TokenBucket
from producers.simulator import SimConfig, Simulator


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run everything locally: broker, simulated faults, Spark job, alerts",
        description=__doc__,
    )
    p.add_argument("--events", type=int, default=60_000, help="simulated events (default %(default)s)")
    p.add_argument(
        "--rate", type=int, default=3_000, help="events per second published (default %(default)s)"
    )
    p.add_argument("--fault-rate", type=float, default=0.003, help="default %(default)s")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print alerts as SPEC JSON instead of one line each")
    p.add_argument(
        "--timeout-seconds",
        type=float,
        default=300,
        help="give up waiting for the last alerts after this long (default %(default)s)",
    )
    add_observability_options(p)
    p.set_defaults(run=run)


def _line(payload: str) -> str:
    alert = orjson.loads(payload)
    where = f" {alert['topic']}-{alert['partition']}" if alert.get("partition") is not None else ""
    return (
        f"[{alert['severity']:>8}] {alert['cluster']} {alert['rule']}{where} node {alert['node']}: "
        f"{alert['message']}"
    )


def run(args: argparse.Namespace) -> int:
    check_observability_paths(args, "fencewatch demo")
    from streaming.broker import EmbeddedBroker
    from streaming.job import JobOptions, spark_session, start

    started = time.monotonic()
    received: list[dict[str, Any]] = []

    def on_alert(payload: str) -> None:
        received.append(orjson.loads(payload))
        print(payload if args.json else _line(payload), flush=True)

    say = lambda text: print(f"[demo {time.monotonic() - started:5.1f}s] {text}", file=sys.stderr, flush=True)  # noqa: E731
    with (
        tempfile.TemporaryDirectory(prefix="fencewatch-demo-") as work,
        observability(args, f"{work}/checkpoint", "fencewatch demo") as obs,
        EmbeddedBroker() as broker,
    ):
        say(f"embedded broker on {broker.bootstrap_servers}")
        broker.create_topics({"fencewatch-events": 3, "fencewatch-alerts": 1, "fencewatch-dead-letters": 1})
        say("starting Spark (local[2]) and the streaming job")
        spark = spark_session("local[2]", app_name="fencewatch-demo")
        options = JobOptions(
            bootstrap_servers=broker.bootstrap_servers,
            topic="fencewatch-events",
            checkpoint=f"{work}/checkpoint",
            trigger_seconds=1.0,
            idle_flush_ms=3_000,
        )
        query = start(
            spark, options, console=None, on_alert=on_alert, metrics=obs.metrics, webhooks=obs.webhooks
        )
        sim = Simulator(SimConfig(seed=args.seed, fault_rate=args.fault_rate))
        native = Simulator(
            SimConfig(
                seed=args.seed + 1, cluster="sim-native", fault_rate=args.fault_rate, native_forms=True
            ),
            native_dir=f"{work}/native",
        )
        publisher = KafkaPublisher(broker.bootstrap_servers, "fencewatch-events")
        native_events = args.events // 2

        def publish() -> None:
            bucket = TokenBucket(args.rate)
            # Each cluster has its own watermark, so how the two interleave does not matter.
            both = heapq.merge(
                sim.events(args.events), native.events(native_events), key=lambda e: e["ts_ms"]
            )
            for env in both:
                bucket.take()
                publisher.publish(env)
            # Closed here, while the broker still runs: a producer left open logs a
            # disconnect when the broker stops.
            publisher.close(60)

        say(
            f"publishing {args.events + native_events} simulated events at {args.rate}/s with faults; "
            f"sim-native's quorum states and remote log metadata as Kafka writes them (quorum-state "
            f"files, kafka-console-consumer.sh formatter lines in {work}/native), read by fencewatch's "
            "parsers as `fencewatch ship quorum-state|remote-log-metadata` reads them"
        )
        feeder = threading.Thread(target=publish, name="simulator", daemon=True)
        feeder.start()
        try:
            deadline = time.monotonic() + args.events / max(args.rate, 1) + args.timeout_seconds
            while time.monotonic() < deadline and query.exception() is None:
                if not feeder.is_alive() and len(received) >= len(sim.truth) + len(native.truth):
                    break
                query.awaitTermination(1)
        except KeyboardInterrupt:
            say("interrupted")
        finally:
            query.stop()
            spark.stop()
        if query.exception() is not None:
            print(f"fencewatch demo: the streaming job failed: {query.exception()}", file=sys.stderr)
            return 1
        assert native.native is not None
        say(
            f"{len(received)} alerts; {len(sim.truth) + len(native.truth)} violations injected; "
            f"sim-native shipped {native.native.quorum_stats.records} quorum-state files and "
            f"{native.native.remote_stats.records} remote-log-metadata lines in native form"
        )
        truth = sim.truth + native.truth
        return 0 if print_confusion(confusion(received, truth), sys.stderr) else 1
