"""``fencewatch simulate``: simulated KRaft traffic with injected faults, as
envelope JSONL (a file or stdout) or published to a Kafka topic, plus the
ground truth of what was injected.

With ``--bootstrap-servers`` and ``--topic`` the events go to the topic instead
of a file, keyed by cluster (so they keep their order in one partition), paced
to ``--rate`` events per second of wall-clock time (token bucket; 0: as fast as
possible). The ground truth is written to ``--truth`` either way, once every
event is written or delivered: a failed run leaves no truth file behind.

``--native-forms`` sends quorum states and remote log metadata through Kafka's
own forms and fencewatch's parsers (producers.native_forms); ``--native-dir``
also keeps those forms as files.

``--clock NODE=SPEC`` breaks a node's clock and ``--failover-at`` forces a
controller failover (producers.sim_clocks), ``--failover-silence`` leaving the
metadata log silent after it as a crashed controller's election does; with
``-o FILE`` the clock ground truth goes to ``FILE.clocks.json``
(``Simulator.clock_record``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import orjson
from tqdm import tqdm

from detectors.alerts import FIRING, RESOLVED
from detectors.render import tally
from detectors.truth import count_by_status
from fencewatch.options import env_default, output_dir, output_file
from fencewatch.shipping import add_kafka_options, open_publisher, publisher_from_args
from producers.kafka_publisher import DeliveryError, TokenBucket
from producers.sim_clocks import TIME_FORMS, Failover, parse_clock, parse_time_ms
from producers.sim_model import CONTROLLER_IDS
from producers.simulator import SimConfig, Simulator

PROGRESS_MIN_EVENTS = 200_000


def add_parser(sub: Any) -> None:
    defaults = SimConfig()
    p = sub.add_parser(
        "simulate",
        help="simulate a KRaft cluster with injected fencing faults",
        description="Write envelope JSONL events of a simulated KRaft cluster (Kafka-native shapes, per-node "
        "clock skew) to a file or a Kafka topic, and the ground truth of the violations injected into it "
        "(each record's ts_ms by its writer's clock, true_ms in simulated true time).",
        epilog="The clock ground truth, FILE.clocks.json beside -o FILE, is one JSON object: start_ms (true "
        "time at the start), skew_ms, nodes (a list of {node, base_skew_ms, faults}: base_skew_ms is null "
        "for a node that wrote nothing; each fault is {kind: offset, offset_ms}, {kind: step, offset_ms, "
        "at_ms} or {kind: drift, ppm: microseconds gained per second} with its spec) "
        "and raft_leaders (a list of [true_ms, leader], one per election, the first leader first). A node's "
        "clock at true time T reads T + base_skew_ms + the sum of its faults' offsets: offset_ms; offset_ms "
        "once T - start_ms >= at_ms, else 0; ppm * (T - start_ms) / 1000000 whole milliseconds, rounded "
        "toward zero. The metadata log is stamped by the clock of the last leader at or before T.",
    )
    p.add_argument(
        "--seed", type=int, default=defaults.seed, help="same seed, same events (default %(default)s)"
    )
    p.add_argument("--events", type=int, default=100_000, help="about how many events (default %(default)s)")
    p.add_argument(
        "--output",
        "-o",
        metavar="FILE",
        help="events JSONL (default: stdout; not with --bootstrap-servers); the clock ground truth "
        "goes beside it to FILE.clocks.json (below)",
    )
    p.add_argument(
        "--truth",
        metavar="FILE",
        help="ground-truth JSONL (default: <output>.truth.jsonl, or "
        "fencewatch-truth.jsonl when writing to stdout or a topic)",
    )
    p.add_argument(
        "--cluster", default=defaults.cluster, help="the envelopes' cluster name (default %(default)s)"
    )
    p.add_argument(
        "--fault-rate",
        type=float,
        default=defaults.fault_rate,
        help="chance per simulated action that a fault is injected (default %(default)s)",
    )
    p.add_argument("--faults", default="", metavar="RULE,...", help="only inject these rules (default: all)")
    p.add_argument(
        "--brokers", type=int, default=defaults.brokers, help="simulated brokers (default %(default)s)"
    )
    p.add_argument(
        "--topics", type=int, default=defaults.topics, help="simulated Kafka topics (default %(default)s)"
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=defaults.partitions_per_topic,
        help="partitions per simulated topic (default %(default)s)",
    )
    p.add_argument(
        "--skew-ms", type=int, default=defaults.skew_ms, help="max clock skew per node (default %(default)s)"
    )
    p.add_argument(
        "--grace-ms",
        type=int,
        default=env_default("FENCEWATCH_GRACE_MS", defaults.grace_ms),
        help="the detector's grace window; faults stay clear of it (env FENCEWATCH_GRACE_MS)",
    )
    p.add_argument(
        "--metadata-version",
        type=int,
        default=defaults.metadata_version,
        help="KRaft metadata.version feature level (below 12, ISR shrinks bump the leader epoch)",
    )
    p.add_argument(
        "--events-per-second",
        type=int,
        default=defaults.events_per_second,
        help="simulated traffic rate (event time, not wall time)",
    )
    p.add_argument(
        "--native-forms",
        action="store_true",
        help="render quorum states as quorum-state files and remote log metadata as "
        "kafka-console-consumer.sh formatter lines, and read them back with fencewatch's parsers, "
        "as `fencewatch ship` does (Kafka's forms carry no cleaner offsets: zombie uploads are "
        "then caught from segmentLeaderEpochs and endOffset)",
    )
    p.add_argument(
        "--native-dir",
        metavar="DIR",
        help="keep the native files in DIR: controller-<node>/quorum-state (and every state as "
        "quorum-state.<n>) and remote-log-metadata.txt; implies --native-forms",
    )
    clocks = p.add_argument_group(
        "broken clocks (beyond --skew-ms, which the grace window must cover; these need not)"
    )
    clocks.add_argument(
        "--clock",
        action="append",
        default=[],
        metavar="NODE=SPEC",
        help="break NODE's clock (brokers 1..N, controllers "
        f"{CONTROLLER_IDS[0]}-{CONTROLLER_IDS[-1]}) on top of its base skew; SPEC is +OFFSET (constant "
        "from the start, e.g. +3s, -250ms, +1.5s), +OFFSET@TIME (a step: from TIME of simulated time "
        "after the start, e.g. +8s@60s) or +RATE/s (drift: e.g. +5ms/s gains 5 ms per simulated "
        "second); offsets and rates take a sign and ms or s; repeatable, one node's faults add up",
    )
    clocks.add_argument(
        "--failover-at",
        action="append",
        default=[],
        metavar="TIME",
        help="force a controller failover (a Raft election, as the random ones) at TIME after the start "
        "(e.g. 60s, 60000ms): the metadata log is stamped by the new leader's clock from then on; the "
        "seed picks the new leader among the other controllers, so it may not be the one --clock broke; "
        "repeatable",
    )
    clocks.add_argument(
        "--failover-to",
        action="append",
        default=[],
        metavar="NODE",
        help="the controller that wins the next forced failover (the first --failover-to the earliest "
        "--failover-at, the second the next...; one that already leads is re-elected), e.g. "
        f"--clock {CONTROLLER_IDS[1]}=-3s --failover-at 60s --failover-to {CONTROLLER_IDS[1]}",
    )
    clocks.add_argument(
        "--failover-silence",
        action="append",
        default=[],
        metavar="DURATION",
        help="how long the metadata log writes nothing (no records, no NoOps) from the next forced "
        "failover on, as while the voters wait out a crashed controller "
        "(controller.quorum.fetch.timeout.ms, 2 s, or more): the election and the new leader's first "
        "records come after it; brokers keep serving, whatever needs the controller waits (the first "
        "--failover-silence "
        "goes with the earliest --failover-at, the second the next...; default none), e.g. "
        "--failover-at 60s --failover-silence 3s",
    )
    add_kafka_options(p, from_env=False)
    kafka = p.add_argument_group("publishing to a topic (with --bootstrap-servers and --topic)")
    kafka.add_argument(
        "--rate",
        type=float,
        default=0.0,
        metavar="EVENTS_PER_SECOND",
        help="publish this many events per wall-clock second; 0: as fast as possible (default %(default)s)",
    )
    kafka.add_argument(
        "--status-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between progress lines on stderr; 0 for none (default %(default)s)",
    )
    kafka.add_argument(
        "--flush-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait at the end for outstanding deliveries (default %(default)s)",
    )
    p.set_defaults(run=run)


def config_from(args: argparse.Namespace) -> SimConfig:
    try:
        return SimConfig(
            clocks=tuple(parse_clock(text) for text in args.clock),
            failovers=_failovers(args.failover_at, args.failover_to, args.failover_silence),
            seed=args.seed,
            cluster=args.cluster,
            brokers=args.brokers,
            topics=args.topics,
            partitions_per_topic=args.partitions,
            fault_rate=args.fault_rate,
            faults=tuple(f.strip() for f in args.faults.split(",") if f.strip()),
            grace_ms=args.grace_ms,
            skew_ms=args.skew_ms,
            metadata_version=args.metadata_version,
            events_per_second=args.events_per_second,
            native_forms=args.native_forms or args.native_dir is not None,
        )
    except ValueError as exc:
        raise SystemExit(f"fencewatch simulate: {exc}") from None


def _failovers(
    times: list[str], winners: list[str], silences: list[str] | None = None
) -> tuple[Failover, ...]:
    """``--failover-at`` in time order, the k-th ``--failover-to`` naming the
    winner of the k-th, the k-th ``--failover-silence`` its silence."""
    at = []
    for text in times:
        try:
            at.append(parse_time_ms(text))
        except ValueError as exc:
            raise ValueError(f"--failover-at {text}: {exc} -- write {TIME_FORMS}") from None
    to: list[int] = []
    for text in winners:
        try:
            to.append(int(text))
        except ValueError:
            raise ValueError(f"--failover-to {text}: not a node id -- name a controller") from None
    if len(to) > len(at):
        raise ValueError(
            f"{len(to)} --failover-to for {len(at)} --failover-at -- name at most one winner per failover"
        )
    quiet: list[int] = []
    for text in silences or []:
        try:
            quiet.append(parse_time_ms(text))
        except ValueError as exc:
            raise ValueError(
                f"--failover-silence {text}: {exc} -- write a duration in ms or s, e.g. 3s"
            ) from None
    if len(quiet) > len(at):
        raise ValueError(
            f"{len(quiet)} --failover-silence for {len(at)} --failover-at "
            "-- give at most one silence per failover"
        )
    return tuple(
        Failover(ms, to[k] if k < len(to) else None, quiet[k] if k < len(quiet) else 0)
        for k, ms in enumerate(sorted(at))
    )


def truth_path(args: argparse.Namespace) -> str:
    """``--truth``, else beside the output file, else in the working directory."""
    if args.truth:
        return str(args.truth)
    return f"{args.output}.truth.jsonl" if args.output not in (None, "-") else "fencewatch-truth.jsonl"


def clocks_path(args: argparse.Namespace) -> str | None:
    """The clock ground truth goes beside an output file; none with stdout or a topic."""
    return f"{args.output}.clocks.json" if args.output not in (None, "-") else None


def run(args: argparse.Namespace) -> int:
    prog = "fencewatch simulate"
    output_file(prog, args.output, "--output")
    output_file(prog, truth_path(args), "--truth")
    output_file(prog, clocks_path(args), "the clock sidecar")
    output_dir(prog, args.native_dir, "--native-dir")
    try:
        sim = Simulator(config_from(args), native_dir=args.native_dir)
    except ValueError as exc:
        print(f"fencewatch simulate: {exc}", file=sys.stderr)
        return 2
    if args.bootstrap_servers or args.topic:
        return _publish(args, sim)
    output = args.output or "-"
    out = sys.stdout.buffer if output == "-" else open(output, "wb")  # noqa: SIM115
    bar = tqdm(
        total=args.events,
        unit="ev",
        desc="simulate",
        file=sys.stderr,
        disable=args.events < PROGRESS_MIN_EVENTS or None,
    )
    written = 0
    try:
        for env in sim.events(args.events):
            out.write(orjson.dumps(env) + b"\n")
            written += 1
            if written % 10_000 == 0:
                bar.update(10_000)
    finally:
        bar.close()
        if out is not sys.stdout.buffer:
            out.close()
        else:
            out.flush()
    _write_truth(sim, truth_path(args))
    clocks = clocks_path(args)
    if clocks is not None:
        _write_clocks(sim, clocks)
    print(
        f"simulated {written} events; {_injected(sim)}{_native(sim, args)}; truth: {truth_path(args)}"
        + (f"; clocks: {clocks}" if clocks else ""),
        file=sys.stderr,
    )
    return 0


def _write_truth(sim: Simulator, path: str) -> None:
    """Write the ground truth whole or not at all: a reader never sees half of it."""
    partial = f"{path}.partial"
    with open(partial, "wb") as f:
        for record in sim.truth:
            f.write(orjson.dumps(record) + b"\n")
    os.replace(partial, path)


def _write_clocks(sim: Simulator, path: str) -> None:
    """The clock ground truth (Simulator.clock_record), whole or not at all."""
    partial = f"{path}.partial"
    with open(partial, "wb") as f:
        f.write(orjson.dumps(sim.clock_record(), option=orjson.OPT_INDENT_2) + b"\n")
    os.replace(partial, path)


def _injected(sim: Simulator) -> str:
    """What the ground truth holds: violations per rule, and apart from them
    the resolutions of timer alerts (a zombie leader stepping down)."""
    by_status = count_by_status(sim.truth)
    violations, resolutions = by_status[FIRING], by_status[RESOLVED]
    line = f"injected {tally(sum(violations.values()), sum(resolutions.values()))}"
    for title, counts in (("violations", violations), ("resolutions", resolutions)):
        if counts:
            line += f"; {title}: " + ", ".join(f"{k}={v}" for k, v in counts.items())
    return line


def _native(sim: Simulator, args: argparse.Namespace) -> str:
    """What went through Kafka's native forms, if anything did."""
    if sim.native is None:
        return ""
    kept = f" (kept in {args.native_dir})" if args.native_dir else ""
    return (
        f"; through native forms: {sim.native.quorum_stats.records} quorum-state files, "
        f"{sim.native.remote_stats.records} remote-log-metadata lines{kept}"
    )


def _publish(args: argparse.Namespace, sim: Simulator) -> int:
    """Publish the events to ``args.topic`` at ``args.rate`` events/s, then,
    once every one is delivered, write the truth."""
    prog = "fencewatch simulate"
    problem = None
    if args.output:
        problem = "--output writes a file; with --bootstrap-servers the events go to --topic"
    elif args.rate < 0 or args.status_interval < 0 or args.flush_timeout <= 0:
        problem = "--rate and --status-interval must be >= 0 and --flush-timeout positive"
    try:
        publisher = publisher_from_args(args)
    except ValueError as exc:
        problem = problem or str(exc)
    if problem:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        return 2
    if not open_publisher(publisher, prog):
        return 1
    from fencewatch.kafka_preflight import check_kafka, kafka_settings

    # A producer would queue every event for a dead broker and fail only at the end.
    check_kafka(
        prog,
        args.bootstrap_servers,
        kafka_settings(prog, args.kafka_config),
        args.topic,
        topic_must_exist=False,
    )
    bucket = TokenBucket(args.rate)
    started = last_status = time.monotonic()
    published = 0
    code = 0
    try:
        for env in sim.events(args.events):
            bucket.take()
            publisher.publish(env, label=f"event {published}")
            published += 1
            if args.status_interval and published % 256 == 0:
                now = time.monotonic()
                if now - last_status >= args.status_interval:
                    last_status = now
                    print(f"{prog}: {_progress(publisher, published, now - started)}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted after {published} events; flushing", file=sys.stderr)
        code = 130
    try:
        publisher.flush(args.flush_timeout)
    except DeliveryError as exc:
        print(
            f"{prog}: {publisher.stats.delivered} of {published} events delivered to topic {args.topic}: "
            f"{exc} -- check the broker and the topic, then run again; no truth file was written",
            file=sys.stderr,
        )
        return 1
    _write_truth(sim, truth_path(args))
    elapsed = time.monotonic() - started
    print(
        f"{prog}: {_progress(publisher, published, elapsed)} to topic {args.topic}; "
        f"{_injected(sim)}{_native(sim, args)}; truth: {truth_path(args)}",
        file=sys.stderr,
    )
    return code


def _progress(publisher: Any, published: int, elapsed_seconds: float) -> str:
    rate = published / elapsed_seconds if elapsed_seconds > 0 else 0.0
    s = publisher.stats
    return (
        f"published {published} events ({s.delivered} delivered, {s.failed} failed) "
        f"in {elapsed_seconds:.1f}s, {rate:.0f} events/s"
    )
