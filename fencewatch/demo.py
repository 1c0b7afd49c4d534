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
import contextlib
import heapq
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from detectors.alerts import FIRING, RESOLVED
from detectors.config import DetectorConfig
from detectors.render import alert_line, tally
from detectors.truth import confusion, count_by_status, is_possible, possible_counts
from fencewatch.event_broker import embedded_broker
from fencewatch.observability import add_observability_options, check_observability_paths, observability
from fencewatch.options import ALERTS_TOPIC
from fencewatch.summaries import print_confusion
from producers.kafka_publisher import KafkaPublisher, TokenBucket
from producers.simulator import SimConfig, Simulator

if TYPE_CHECKING:
    from lab.demo_node import RealKafka
    from streaming.broker import EmbeddedBroker
    from streaming.metrics import Metrics


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run everything locally: broker, simulated faults, Spark job, alerts",
        description="Everything on the embedded default: starts a local Kafka-compatible broker, "
        "publishes simulated KRaft traffic with injected fencing faults, runs the streaming job on "
        "local Spark, prints each alert as it arrives, and ends with a table of injected versus "
        "detected violations per rule. Two simulated clusters share the event topic: sim-1 as "
        "envelopes, and sim-native, whose quorum states and remote log metadata go through Kafka's "
        "own forms (quorum-state files, kafka-console-consumer.sh formatter lines) and the parsers "
        "fencewatch ship uses. Spark's own output goes to a log file the demo names.",
    )
    p.add_argument("--events", type=int, default=60_000, help="simulated events (default %(default)s)")
    p.add_argument(
        "--rate", type=int, default=3_000, help="events per second published (default %(default)s)"
    )
    p.add_argument(
        "--fault-rate",
        type=float,
        default=0.003,
        help="chance per simulated action that a fault is injected (default %(default)s)",
    )
    p.add_argument(
        "--seed", type=int, default=1, help="simulator seed: same seed, same events (default %(default)s)"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print each alert as its JSON document (one per line, the fields of docs/rules.md) "
        "instead of a one-line summary",
    )
    p.add_argument(
        "--timeout-seconds",
        type=float,
        default=300,
        help="give up waiting for the last alerts after this long (default %(default)s)",
    )
    p.add_argument(
        "--no-real-kafka",
        action="store_true",
        help="leave out the real Apache Kafka node (fetched from Maven Central on first use) that the demo "
        "otherwise runs and watches beside the simulated clusters",
    )
    add_observability_options(p, outbox_default="in the demo's temporary directory, removed when it ends")
    p.set_defaults(run=run)


def _line(payload: str) -> str:
    return alert_line(orjson.loads(payload))


def run(args: argparse.Namespace) -> int:
    prog = "fencewatch demo"
    check_observability_paths(args, prog)
    from fencewatch.spark_console import query_failed, spark_log_path, start_spark
    from streaming.job import JobOptions, start

    started = time.monotonic()
    received: list[dict[str, Any]] = []
    last_alert = [time.monotonic()]

    def on_alert(payload: str) -> None:
        received.append(orjson.loads(payload))
        last_alert[0] = time.monotonic()
        print(payload if args.json else _line(payload), flush=True)

    say = lambda text: print(f"[demo {time.monotonic() - started:5.1f}s] {text}", file=sys.stderr, flush=True)  # noqa: E731
    # Outside the demo's directory, which goes when the demo ends: a failure names it.
    log_file = None if args.verbose else spark_log_path(None, prog)
    with (
        tempfile.TemporaryDirectory(prefix="fencewatch-demo-") as work,
        observability(args, f"{work}/checkpoint", prog) as obs,
        embedded_broker(prog, "fix that and run the demo again") as broker,
        contextlib.ExitStack() as real_node,
    ):
        say(f"embedded broker on {broker.bootstrap_servers}")
        broker.create_topics({"fencewatch-events": 3, ALERTS_TOPIC: 1, "fencewatch-dead-letters": 1})
        live = None if args.no_real_kafka else _start_real_kafka(real_node, Path(work), broker, say)
        spark_log = f"; Spark's log: {log_file}" if log_file else ""
        say(f"starting Spark (local[2]) and the streaming job{spark_log}")
        spark = start_spark(prog, "local[2]", log_file, app_name="fencewatch-demo")
        options = JobOptions(
            bootstrap_servers=broker.bootstrap_servers,
            topic="fencewatch-events",
            checkpoint=f"{work}/checkpoint",
            trigger_seconds=1.0,
            idle_flush_ms=3_000,
            # Clocks measured, as every command measures them unless told not to
            # (fencewatch.options); DetectorConfig's own default leaves them unmeasured.
            detector=DetectorConfig(measure_clocks=True),
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
                # A possible violation (a clock its evidence leaves loose) counts only where
                # it caught an injected one no certain alert caught.
                injected = sim.truth + native.truth
                if not feeder.is_alive() and (
                    _caught(received, injected) >= len(injected)
                    or time.monotonic() - last_alert[0] > QUIET_SECONDS
                ):
                    break
                query.awaitTermination(1)
        except KeyboardInterrupt:
            say("interrupted")
        finally:
            query.stop()
            spark.stop()
        error = query.exception()
        if error is not None:
            query_failed(
                prog,
                error,
                log_file,
                args.verbose,
                "run the demo again; if it fails the same way, report it with the log",
            )
        if log_file is not None:
            os.remove(log_file)  # nothing failed: nothing in it to look at
        assert native.native is not None
        truth = sim.truth + native.truth
        say(
            f"detected {_tally([a for a in received if not is_possible(a)])} "
            f"(and {sum(map(is_possible, received))} possible, {possible_counts(received, truth)[0]} of "
            f"them injected ones no certain alert caught); injected {_tally(truth)}; "
            f"sim-native shipped {native.native.quorum_stats.records} quorum-state files and "
            f"{native.native.remote_stats.records} remote-log-metadata lines in native form"
        )
        if live is not None:
            from lab.demo_node import CLUSTER

            raised = sum(1 for alert in received if alert.get("cluster") == CLUSTER)
            say(
                f"{CLUSTER} (Apache Kafka {live.jars.version}): {live.traffic.stats.acknowledged} records "
                f"produced, {live.traffic.stats.consumed} consumed; {_judged(obs.metrics, CLUSTER)} of its "
                f"events judged, {raised} alerts (Kafka fences correctly: any alert of it is counted false "
                "below)"
            )
        return 0 if print_confusion(confusion(received, truth), sys.stderr) else 1


def _start_real_kafka(
    stack: contextlib.ExitStack, work: Path, broker: EmbeddedBroker, say: Callable[[str], None]
) -> RealKafka | None:
    """The real Kafka node, watched; one that cannot be had is said in one line
    and the demo goes on with the simulated clusters alone."""
    from lab.demo_node import real_kafka
    from localkafka.fetch import KafkaSetupError

    try:
        return stack.enter_context(real_kafka(work, broker.bootstrap_servers, "fencewatch-events", say))
    except KafkaSetupError as exc:
        say(f"no real Kafka node: {exc} (the demo goes on without it; --no-real-kafka skips it)")
        return None


def _judged(metrics: Metrics | None, cluster: str) -> str:
    """The events of ``cluster`` the job judged, from its own counters (what /metrics shows)."""
    if metrics is None:
        return "(metrics off: unknown)"
    total = sum(
        sample.value
        for family in metrics.detector.collect()
        if family.name == "fencewatch_events"
        for sample in family.samples
        if sample.labels.get("cluster") == cluster and sample.name.endswith("_total")
    )
    return str(int(total))


# With every event published, this long without an alert ends the wait: a
# violation no alert caught (the clock evidence left it clock uncertain) would
# otherwise hold the demo until --timeout-seconds.
QUIET_SECONDS = 30.0


def _caught(received: list[dict[str, Any]], truth: list[dict[str, Any]]) -> int:
    """The injected violations an alert caught: certain ones, and possible ones where no certain one did."""
    certain = sum(row["tp"] for row in confusion(received, truth).values())
    return certain + possible_counts(received, truth)[0]


def _tally(records: list[dict[str, Any]]) -> str:
    by_status = count_by_status(records)
    return tally(sum(by_status[FIRING].values()), sum(by_status[RESOLVED].values()))
