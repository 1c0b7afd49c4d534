"""``fencewatch kafka-lab``: Apache Kafka itself on this machine, with fencewatch
watching it as a user would, and optionally failures inflicted on it.

Fetches Kafka from Maven Central (once; cached), starts a KRaft cluster of
three controllers and three brokers on loopback (:mod:`localkafka`), real
client traffic (idempotent producers with ``acks=all``, consumers in a group),
``fencewatch ship`` for every file a rule reads and ``fencewatch run`` on an
embedded broker's event topic (:mod:`lab.watch`), and with
``--nemesis`` a seeded schedule of failures (:mod:`localkafka.nemesis`). Alerts
print as they arrive. At the end the cluster's own files are converted and
replayed (:mod:`lab.verdict`) and a table says what was injected,
judged and raised, and whether the view's leader epochs are Kafka's.

Kafka is right here, so every certain alert or dead letter is a false one:
the exit code is 1 when there is any, or an epoch differs. Possible alerts
(a verdict that holds only at some clock offsets the evidence allows) are
counted apart, with their conditions printed as they arrive.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from detectors.render import alert_line
from fencewatch.event_broker import embedded_broker
from fencewatch.options import fail
from fencewatch.replay import replay_config
from lab.verdict import (
    EpochComparison,
    compare_epochs,
    convert_native,
    judge,
    kafka_leader_epochs,
    measured_clocks,
    view_leader_epochs,
)
from lab.watch import ALERTS_TOPIC, DEAD_LETTER_TOPIC, EVENTS_TOPIC, JobCounters, Watchers
from localkafka.cluster import LocalKafkaCluster
from localkafka.fetch import DEFAULT_VERSION, KafkaSetupError, fetch_kafka
from localkafka.nemesis import FAULTS, SKEW_HOLD_SECONDS, Nemesis, plan
from localkafka.traffic import Traffic, create_topics, lab_topics

PROG = "fencewatch kafka-lab"
CLUSTER = "lab"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "kafka-lab",
        help="run Apache Kafka here, watched by fencewatch, optionally under injected failures",
        description="Fetch Apache Kafka from Maven Central (once, cached), start a KRaft cluster of three "
        "controllers and three brokers on loopback with real client traffic, ship every node's request log, "
        "a controller's metadata log and every controller's quorum-state to an embedded broker, judge them "
        "with the streaming job, and print alerts as they arrive. With --nemesis, failures are inflicted "
        "on a schedule the seed fixes: broker kills, pauses past replica.lag.time.max.ms, clean shutdowns, "
        "the active controller killed, reassignments, preferred and unclean elections, a topic deleted and "
        "made again, a broker's log directory wiped, a broker's clock skewed. Ends with a table: failures "
        "injected, requests judged by API, alerts, dead letters, leader epochs compared with Kafka's, each "
        "node's measured clock. Kafka is right here: any alert is a false one.",
        epilog="Exit codes: 0 no alert, no dead letter and every epoch as Kafka's; 1 otherwise, or a set-up "
        "problem (said in one line); 130 interrupted.",
    )
    p.add_argument(
        "--kafka-version",
        default=DEFAULT_VERSION,
        help="Apache Kafka release to fetch and run (default %(default)s)",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long traffic (and the nemesis) run (default %(default)s)",
    )
    p.add_argument("--nemesis", action="store_true", help="inflict failures during the run")
    p.add_argument(
        "--seed", type=int, default=1, help="the nemesis' seed: the same seed, the same schedule (default 1)"
    )
    p.add_argument(
        "--faults",
        default=",".join(FAULTS),
        metavar="KIND[,KIND...]",
        help=f"which failures the nemesis may inflict (default: all: {', '.join(FAULTS)})",
    )
    p.add_argument(
        "--skew-seconds",
        type=float,
        default=3.5,
        help="how far the skewed broker's clock runs ahead (default %(default)s)",
    )
    p.add_argument(
        "--rate", type=float, default=200.0, help="records produced per second (default %(default)s)"
    )
    p.add_argument(
        "--keep",
        metavar="DIR",
        help="keep the cluster's files (logs, metadata, the schedule, the converted envelopes) in DIR "
        "(default: a temporary directory, removed at the end)",
    )
    p.add_argument("--heap", default="384m", help="each Kafka node's JVM heap (-Xmx; default %(default)s)")
    p.add_argument(
        "--base-port",
        type=int,
        metavar="PORT",
        help="the nodes listen on PORT, PORT+1, ... (controllers first; default: free ports)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    kinds = tuple(k.strip() for k in args.faults.split(",") if k.strip())
    unknown = [k for k in kinds if k not in FAULTS]
    if unknown:
        fail(PROG, f"unknown fault {unknown[0]!r}", f"choose among {', '.join(FAULTS)}")
    if args.duration <= 0:
        fail(PROG, "--duration must be positive", "give the run's length in seconds")
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[kafka-lab {time.monotonic() - started:6.1f}s] {text}", file=sys.stderr, flush=True)

    try:
        jars = fetch_kafka(args.kafka_version, progress=lambda line: say(f"Maven Central: {line}"))
    except KafkaSetupError as exc:
        # Its message is one line that already says what to do.
        raise SystemExit(f"{PROG}: {exc}") from None
    with _work_dir(args.keep) as work:
        try:
            return _run(args, kinds, jars, work, say)
        except KafkaSetupError as exc:
            kept = f" (the cluster's files are in {work})" if args.keep else ""
            raise SystemExit(f"{PROG}: {exc}{kept}") from None


@contextlib.contextmanager
def _work_dir(keep: str | None) -> Iterator[Path]:
    if keep:
        path = Path(keep)
        path.mkdir(parents=True, exist_ok=True)
        yield path
    else:
        with tempfile.TemporaryDirectory(prefix="fencewatch-kafka-lab-") as tmp:
            yield Path(tmp)


def _run(args: argparse.Namespace, kinds: tuple[str, ...], jars: Any, work: Path, say: Any) -> int:
    say(f"Apache Kafka {jars.version} from {jars.lib_dir}")
    with contextlib.ExitStack() as stack:
        events = stack.enter_context(embedded_broker(PROG, "fix that and run kafka-lab again"))
        events.create_topics({EVENTS_TOPIC: 3, ALERTS_TOPIC: 1, DEAD_LETTER_TOPIC: 1})
        cluster = LocalKafkaCluster(jars, work / "kafka", heap=args.heap, base_port=args.base_port)
        stack.callback(cluster.stop)
        watchers = Watchers(
            cluster,
            events.bootstrap_servers,
            work / "fencewatch",
            cluster_name=CLUSTER,
            on_alert=lambda line: print(alert_line(json.loads(line)), flush=True),
        )
        stack.callback(watchers.stop)
        # Spark's start takes the longest: the job first, while Kafka starts.
        say(f"starting fencewatch run (its log: {watchers.work / 'logs' / 'job.stderr'})")
        watchers.start_job()
        say(f"starting Kafka: 3 controllers, 3 brokers under {cluster.root}")
        cluster.start()
        say(f"Kafka is up on {cluster.bootstrap_servers}; shipping its files to {events.bootstrap_servers}")
        watchers.start_shippers()
        from confluent_kafka.admin import AdminClient

        topics = lab_topics(
            [b.node_id for b in cluster.brokers], tiered_storage=cluster.layout.tiered_storage
        )
        create_topics(AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0}), topics)
        traffic = Traffic(cluster.bootstrap_servers, [t.name for t in topics], rate=args.rate)
        traffic.start()
        say(f"traffic: {args.rate:.0f} records/s with acks=all to {', '.join(t.name for t in topics)}")
        stop_at = time.monotonic() + args.duration
        nemesis = None
        if args.nemesis:
            faults = plan(args.seed, args.duration, [b.node_id for b in cluster.brokers], kinds)
            say(
                f"nemesis (seed {args.seed}): "
                + ", ".join(f.kind + (f"@{f.broker}" if f.broker else "") for f in faults)
            )
            nemesis = Nemesis(
                cluster,
                faults,
                work / "schedule.jsonl",
                topics=topics,
                skew_seconds=args.skew_seconds,
                say=say,
            )
            nemesis.run(stop_at)
            if nemesis.skewed:
                # Long enough under the skewed clock for its requests to measure it.
                stop_at = max(stop_at, time.monotonic() + SKEW_HOLD_SECONDS)
        while time.monotonic() < stop_at:
            child = watchers.failed_child()
            if child is not None:
                fail(
                    PROG,
                    f"{child.name} ended early: {child.stderr().strip().splitlines()[-1:]}",
                    f"see {child.stderr_path}",
                )
            time.sleep(1)
        stats = traffic.stop()
        say(
            f"traffic stopped: {stats.acknowledged} of {stats.produced} records acknowledged, "
            f"{stats.consumed} consumed"
        )
        time.sleep(3)  # the last requests' lines reach the request logs
        shipped = watchers.stop_shippers()
        say("shippers stopped; waiting for the job to judge what they shipped")
        counters = watchers.wait_until_judged(timeout_seconds=600)
        kafka_epochs = kafka_leader_epochs(cluster)
        say("converting the cluster's own files and replaying them")
        converted = convert_native(cluster, work / "envelopes", CLUSTER, watchers.shipped_bytes())
        judged = judge(converted.files, replay_config())
        epochs = compare_epochs(view_leader_epochs(judged.detector, CLUSTER), kafka_epochs)
        clocks = measured_clocks(judged.detector, CLUSTER)
        _print_table(
            jars.version,
            args,
            nemesis.records if nemesis else [],
            counters,
            watchers,
            shipped,
            converted,
            judged,
            epochs,
            clocks,
            cluster.clock_offsets,
        )
        if args.keep:
            say(f"the cluster's files, the schedule and the envelopes are in {work}")
        false = (
            (counters is None or sum(counters.alerts.values()) > 0)
            or any(alert["confidence"] != "possible" for alert in judged.alerts)
            or judged.dead_letters
            or converted.dead_letters
            or (counters is not None and sum(counters.dead_letters.values()) > 0)
            or epochs.differences
        )
        return 1 if false else 0
    return 1


def _print_table(
    version: str,
    args: argparse.Namespace,
    faults: list[Any],
    counters: JobCounters | None,
    watchers: Watchers,
    shipped: dict[str, str],
    converted: Any,
    judged: Any,
    epochs: EpochComparison,
    clocks: dict[int, Any],
    offsets: dict[int, float],
) -> None:
    rows: list[tuple[str, str]] = []
    by_kind = Counter(f.kind for f in faults)
    rows.append(("failures injected", f"{len(faults)}" + _counts(by_kind)))
    if counters is None:
        rows.append(("requests judged", "the job's /metrics did not answer"))
    else:
        requests = counters.events_by_kind.get("request", 0)
        rows.append(("requests judged (job)", f"{requests}" + _counts(counters.events_by_api)))
    replayed = Counter[str]()
    for stats in converted.request_logs.values():
        replayed.update(stats.records_by_api)
    rows.append(("requests read (replay)", f"{sum(replayed.values())}" + _counts(replayed)))
    unread = Counter[str]()
    for stats in converted.request_logs.values():
        unread.update(stats.unread_by_api)
    rows.append(("entries no rule reads", f"{sum(unread.values())}" + _counts(unread)))
    job_certain = sum(counters.alerts.values()) if counters else 0
    job_possible = sum(counters.possible.values()) if counters else 0
    replay_possible = sum(alert["confidence"] == "possible" for alert in judged.alerts)
    rows.append(
        (
            "alerts",
            f"job {job_certain} certain, {job_possible} possible; "
            f"replay {len(judged.alerts) - replay_possible} certain, {replay_possible} possible",
        )
    )
    job_dead = sum(counters.dead_letters.values()) if counters else 0
    shippers_dead = sum(_dead_in(line) for line in shipped.values())
    rows.append(
        (
            "dead letters",
            f"job {job_dead}{_counts(counters.dead_letters) if counters else ''}, shippers {shippers_dead}, "
            f"convert {len(converted.dead_letters)}, "
            f"replay {len(judged.dead_letters)}",
        )
    )
    differ = f"{len(epochs.differences)} differ" + (
        ": " + "; ".join(f"{t}-{p} view {v} broker {b} {k}" for t, p, v, k, b in epochs.differences[:5])
        if epochs.differences
        else ""
    )
    rows.append(
        ("leader epochs compared", f"{epochs.compared} partitions with every broker's Metadata: {differ}")
    )
    for node, interval in sorted(clocks.items()):
        true = offsets.get(node, 0.0)
        job = counters.clocks.get(str(node)) if counters else None
        job_text = f"; job {_bounds(job)}" if job else ""
        rows.append(
            (
                f"clock of node {node}",
                f"replay {interval.low_ms / 1000:+.3f}..{interval.high_ms / 1000:+.3f} s{job_text}"
                f" (true offset {true:+.1f} s)",
            )
        )
    unmeasured = sorted(set(converted.request_logs) - set(clocks))
    if unmeasured:
        # Their requests at the end were about epochs long established: bounds
        # too loose to measure by, so they are taken to agree with the log
        # within the grace window (detectors.clocks), as replay's summary says.
        rows.append(("clocks unmeasured", "nodes " + ", ".join(map(str, unmeasured)) + " (taken to agree)"))
    title = f"kafka-lab: Apache Kafka {version}, {args.duration:.0f} s" + (
        f", nemesis seed {args.seed}" if args.nemesis else ""
    )
    print(title)
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


def _counts(counter: Any) -> str:
    items = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))
    return " (" + ", ".join(f"{k} {v}" for k, v in items) + ")" if items else ""


def _bounds(bounds: tuple[float | None, float | None]) -> str:
    low, high = bounds
    return f"{'-inf' if low is None else f'{low:+.3f}'}..{'+inf' if high is None else f'{high:+.3f}'} s"


def _dead_in(summary: str) -> int:
    """The dead letters a shipper's summary line counts (``..., N dead letters ...``)."""
    words = summary.split()
    for i, word in enumerate(words[1:], start=1):
        if word == "dead" and words[i - 1].isdigit():
            return int(words[i - 1])
    return 0
