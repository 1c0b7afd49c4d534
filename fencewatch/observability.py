"""What ``fencewatch run`` and ``fencewatch demo`` share around the job:
Prometheus metrics served from the start, and webhook delivery."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from fencewatch.options import fail, input_file, output_file

if TYPE_CHECKING:
    from streaming.metrics import Metrics
    from webhooks import Dispatcher

DEFAULT_METRICS_PORT = 9464  # the port registered for OpenTelemetry/Prometheus exporters


@dataclass(frozen=True)
class Observability:
    metrics: Metrics
    webhooks: Dispatcher | None


def add_observability_options(
    p: argparse.ArgumentParser, outbox_default: str = "in a local --checkpoint directory"
) -> None:
    """``--metrics-port/--metrics-bind/--webhooks/--webhook-outbox``; ``outbox_default``
    says in ``--help`` where the outbox is without ``--webhook-outbox``."""
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
        help=f"the durable webhook outbox (SQLite) on local disk; default: {outbox_default} "
        "(env FENCEWATCH_WEBHOOK_OUTBOX)",
    )


def check_observability_paths(args: argparse.Namespace, prog: str) -> None:
    """The webhook config must be readable and the outbox writable, before the job starts."""
    input_file(prog, args.webhooks, "--webhooks")
    output_file(prog, args.webhook_outbox, "--webhook-outbox", with_siblings=True)


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
def observability(
    args: argparse.Namespace, checkpoint: str, prog: str, *, job: bool = True
) -> Iterator[Observability]:
    """Metrics served and webhooks delivering for the life of the job (``job`` False:
    of ``fencewatch probe`` alone, without the job's series)."""
    from prometheus_client import CollectorRegistry

    from streaming.metrics import Metrics, serve
    from webhooks import Dispatcher, WebhookConfigError, load_endpoints
    from webhooks.outbox import OutboxError

    metrics = Metrics(CollectorRegistry(), job=job)
    metrics.build.info({"version": version("fencewatch")})
    if args.metrics_port >= 0:
        try:
            port = serve(metrics, args.metrics_port, args.metrics_bind)
        except OSError as exc:
            fail(
                prog,
                f"cannot serve metrics on {args.metrics_bind}:{args.metrics_port}: {exc.strerror or exc}",
                "choose another --metrics-port (0: any free port), or -1 to turn metrics off",
            )
        print(f"{prog}: metrics on http://{args.metrics_bind}:{port}/metrics", file=sys.stderr)
    dispatcher = None
    if args.webhooks:
        try:
            endpoints = load_endpoints(args.webhooks)
        except (WebhookConfigError, OSError) as exc:
            raise SystemExit(f"{prog}: {args.webhooks}: {exc}") from None
        try:
            dispatcher = Dispatcher(endpoints, outbox_path(args, checkpoint), metrics)
        except OutboxError as exc:
            raise SystemExit(f"{prog}: {exc}") from None
        dispatcher.start()
        names = ", ".join(e.name for e in endpoints)
        print(f"{prog}: delivering alerts to webhooks {names}", file=sys.stderr)
    try:
        yield Observability(metrics, dispatcher)
    finally:
        if dispatcher is not None:
            dispatcher.stop()
