"""``fencewatch probe``: ask a live cluster whether it fences (KIP-320), and alert where
it does not.

    fencewatch probe --bootstrap-servers kafka:9092 --once
    fencewatch probe --bootstrap-servers kafka:9092 --interval 60 --alerts-topic fencewatch-alerts

Each round reads Metadata (v7+: leader and leader epoch per partition), then asks
every partition's leader with Fetch, ListOffsets and OffsetForLeaderEpoch (the
versions both sides speak that carry ``currentLeaderEpoch``) at the current epoch, the
next one and, above 0, the previous one, a partition the topic does not have, and a
follower at the current epoch; one request per broker, API and kind of probe holds
all that broker's partitions. An answer other than Apache Kafka's is asked again
after Metadata is read again: repeated with the same leader and epoch it is an
alert (PROBE_* rules, docs/rules.md); an election in between clears it.

Requests only read. Each broker gets at most ``--requests-per-second`` requests a
second, each round at most ``--max-partitions`` partitions (round-robin), and
every request ``--timeout-seconds`` to answer.

Exit codes (``--once``): 0 every answer was Kafka's; 3 a deviation was confirmed;
1 the cluster cannot be probed (said in one line); 2 usage. With ``--interval`` the
probe runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, TextIO

from fencewatch.interrupts import signals_set
from fencewatch.observability import add_observability_options, check_observability_paths, observability
from fencewatch.options import add_bootstrap_servers_option, fail
from probe.client import (
    DEFAULT_REQUESTS_PER_SECOND,
    DEFAULT_TIMEOUT_SECONDS,
    ClusterRefused,
    ProbeClient,
    Unanswered,
    client_settings,
)
from probe.report import table
from probe.round import DEFAULT_MAX_PARTITIONS, Prober, RoundReport
from probe.service import ProbeService
from probe.sinks import AlertSinks

if TYPE_CHECKING:
    from streaming.metrics import Metrics


DEVIATION_EXIT = 3
STOPPED_EXIT = 130  # a canary stopped by SIGINT or SIGTERM, as Ctrl-C ends any command
DRAIN_SECONDS = 30.0


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value

    return parse


def _pattern(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression: {exc}") from None


def add_probe_limits(group: Any, prefix: str = "") -> None:
    """The politeness options, shared by ``probe`` and ``run --probe-interval``."""
    group.add_argument(
        f"--{prefix}topics",
        type=_pattern,
        metavar="PATTERN",
        help="probe the topics whose whole name matches this regular expression (default: every topic but "
        "internal ones)",
    )
    group.add_argument(
        f"--{prefix}cluster",
        metavar="NAME",
        help="the cluster's name in alerts and metrics, as the events name it (default: the cluster id "
        "Metadata reports)",
    )
    group.add_argument(
        f"--{prefix}max-partitions",
        type=_positive(int),
        default=DEFAULT_MAX_PARTITIONS,
        metavar="N",
        help="at most N partitions per round, taken round-robin so successive rounds cover all "
        "(default %(default)s)",
    )
    group.add_argument(
        f"--{prefix}requests-per-second",
        type=_positive(float),
        default=DEFAULT_REQUESTS_PER_SECOND,
        metavar="R",
        help="at most R requests a second to each broker (default %(default)s)",
    )
    group.add_argument(
        f"--{prefix}timeout-seconds",
        type=_positive(float),
        default=DEFAULT_TIMEOUT_SECONDS,
        metavar="S",
        help="how long a broker has to answer a request or a connection (default %(default)s)",
    )


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "probe",
        help="ask a live cluster whether it fences by leader epoch (KIP-320), and alert where it does not",
        description="Ask each partition's leader with Fetch, ListOffsets and OffsetForLeaderEpoch carrying "
        "the current, a newer and an older currentLeaderEpoch, a follower, and a partition that does not "
        "exist; an answer other than Apache Kafka's, confirmed after Metadata is read again, is an alert "
        "(PROBE_* rules, docs/rules.md). Requests only read. --once prints a conformance table per broker "
        "and API on stderr; alerts go to stdout, --alerts-topic and --webhooks. Metrics are served with "
        "--interval only.",
        epilog="Exit codes: 0 every answer was Kafka's; 3 a deviation was confirmed (--once); 1 the "
        "cluster cannot be probed; 2 usage error.",
    )
    add_bootstrap_servers_option(p)
    p.add_argument(
        "--kafka-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka setting (TLS/SASL: security.protocol, ssl.ca.location, sasl.mechanism, "
        "sasl.username, ...), repeatable; the SASL password may come from env "
        "FENCEWATCH_KAFKA_SASL_PASSWORD instead",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--once", action="store_true", help="probe one round, print the table and exit (default)"
    )
    mode.add_argument(
        "--interval",
        type=_positive(float),
        metavar="S",
        help="probe every S seconds until stopped, as a canary",
    )
    p.add_argument(
        "--alerts-topic",
        metavar="TOPIC",
        default=os.environ.get("FENCEWATCH_ALERTS_TOPIC"),
        help="also publish alerts to this topic, keyed by cluster (env FENCEWATCH_ALERTS_TOPIC; default: "
        "not published)",
    )
    p.add_argument("--quiet", action="store_true", help="do not print alerts on stdout")
    add_probe_limits(p.add_argument_group("probing"))
    add_observability_options(p, outbox_default="none: give it with --webhooks")
    p.set_defaults(run=run)


def add_run_options(p: argparse.ArgumentParser) -> None:
    """``fencewatch run``'s probe options: the probe beside the job."""
    group = p.add_argument_group("probe (fencewatch probe beside the job)")
    group.add_argument(
        "--probe-interval",
        type=_positive(float),
        metavar="S",
        help="also probe --bootstrap-servers' cluster every S seconds in the driver, as `fencewatch probe "
        "--interval S` does (default: no probe)",
    )
    add_probe_limits(group, prefix="probe-")


def _client(
    prog: str, bootstrap_servers: str, settings: Mapping[str, str], args: Any, prefix: str
) -> ProbeClient:
    try:
        mapped = client_settings(settings)
    except ValueError as exc:
        fail(
            prog,
            str(exc),
            "leave it out; the probe takes TLS as PEM files (ssl.ca.location, ssl.certificate.location, "
            "ssl.key.location)",
        )
    return ProbeClient(
        bootstrap_servers,
        mapped,
        timeout_seconds=getattr(args, f"{prefix}timeout_seconds"),
        requests_per_second=getattr(args, f"{prefix}requests_per_second"),
    )


def _connect(prog: str, client: ProbeClient, settings: Mapping[str, str]) -> None:
    try:
        client.connect()
    except ClusterRefused as exc:
        client.close()
        # kafka-python's bootstrap (3.0.12) retries every failure until its deadline
        # and says only that it ran out; the broker's SCRAM refusal it never sees
        # (its transport drops bytes read together with the end of the stream, and
        # the broker closes right after the refusal). The same settings through
        # librdkafka name what the listener refused: credentials, an untrusted
        # certificate, a plaintext client on a TLS listener.
        from fencewatch.kafka_preflight import check_kafka

        check_kafka(prog, client.bootstrap_servers, settings, None, must_reach=False)
        fail(
            prog,
            f"cannot probe Kafka at {client.bootstrap_servers}: {exc}",
            "check --bootstrap-servers and that the brokers are up; with TLS or SASL, security.protocol, "
            "sasl.mechanism, sasl.username and the password (--kafka-config, env "
            "FENCEWATCH_KAFKA_SASL_PASSWORD)",
        )


def _prober(client: ProbeClient, args: Any, prefix: str) -> Prober:
    return Prober(
        client,
        cluster=getattr(args, f"{prefix}cluster"),
        topics=getattr(args, f"{prefix}topics"),
        max_partitions=getattr(args, f"{prefix}max_partitions"),
    )


def _first_round(prog: str, service: ProbeService) -> RoundReport:
    try:
        report = service.once()
    except (Unanswered, ClusterRefused) as exc:
        fail(
            prog,
            f"cannot probe Kafka at {service.prober.client.bootstrap_servers}: {exc}",
            "check the brokers",
        )
    if report.partitions_total == 0:
        fail(
            prog,
            f"no partition to probe on {service.prober.client.bootstrap_servers}",
            "check --topics, and that this principal may Describe the topics",
        )
    return report


def _drain(prog: str, webhooks: Any, outbox: str) -> None:
    """Give the webhook threads up to DRAIN_SECONDS to deliver what --once raised (at
    each endpoint's rate limit); what is left waits in the outbox for the next run."""
    deadline = time.monotonic() + DRAIN_SECONDS
    while (waiting := sum(webhooks.backlog().values())) and time.monotonic() < deadline:
        time.sleep(0.1)
    if waiting:
        print(
            f"{prog}: {waiting} webhook deliveries still wait in {outbox}; the next run with this outbox "
            "delivers them",
            file=sys.stderr,
        )


def run(args: argparse.Namespace) -> int:
    prog = "fencewatch probe"
    check_observability_paths(args, prog)
    if args.webhooks and not args.webhook_outbox:
        fail(prog, "--webhooks needs --webhook-outbox FILE", "name a file on local disk for the outbox")
    from fencewatch.kafka_preflight import kafka_settings
    from streaming.sinks import DeliveryFailed, TopicSink

    settings = kafka_settings(prog, args.kafka_config)
    client = _client(prog, args.bootstrap_servers, settings, args, "")
    if args.interval is None:
        args.metrics_port = -1
    stop = threading.Event()
    with ExitStack() as stack:
        if args.interval is not None:
            # A canary is stopped by SIGTERM (orchestrators) or Ctrl-C: either ends it
            # between rounds, the sinks closed, with Ctrl-C's exit code.
            stack.enter_context(signals_set(stop))
        _connect(prog, client, settings)
        stack.callback(client.close)
        obs = stack.enter_context(observability(args, ".", prog, job=False))
        topic = (
            None
            if args.alerts_topic is None
            else TopicSink(args.bootstrap_servers, args.alerts_topic, settings)
        )
        sinks = AlertSinks(None if args.quiet else sys.stdout, topic, obs.webhooks)
        stack.callback(sinks.close)
        service = ProbeService(_prober(client, args, ""), sinks, obs.metrics, DeliveryFailed)
        try:
            report = _first_round(prog, service)
        except DeliveryFailed as exc:
            fail(prog, str(exc), "check --alerts-topic")
        if args.interval is None:
            if obs.webhooks is not None:
                _drain(prog, obs.webhooks, args.webhook_outbox)
            print(table(report), file=sys.stderr, flush=True)
            return DEVIATION_EXIT if report.alerts else 0
        print(f"{prog}: {table(report)}", file=sys.stderr, flush=True)
        stop.wait(args.interval)
        service.every(args.interval, stop, sys.stderr)
    return STOPPED_EXIT


@contextmanager
def beside_job(
    args: argparse.Namespace,
    settings: Mapping[str, str],
    metrics: Metrics,
    webhooks: Any,
    console: TextIO | None,
) -> Iterator[None]:
    """``fencewatch run --probe-interval S``: a daemon thread probing the job's cluster,
    its alerts to the job's alerts topic, webhooks and console, until the job ends."""
    if args.probe_interval is None:
        yield
        return
    prog = "fencewatch run"
    from streaming.sinks import DeliveryFailed, TopicSink

    client = _client(prog, args.bootstrap_servers, settings, args, "probe_")
    _connect(prog, client, settings)
    sinks = AlertSinks(console, TopicSink(args.bootstrap_servers, args.alerts_topic, settings), webhooks)
    service = ProbeService(_prober(client, args, "probe_"), sinks, metrics, DeliveryFailed)
    stop = threading.Event()
    thread = threading.Thread(
        target=service.every,
        args=(args.probe_interval, stop, sys.stderr),
        name="fencewatch-probe",
        daemon=True,
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=args.probe_timeout_seconds * 4)
        sinks.close()
        client.close()
