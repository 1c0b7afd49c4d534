"""``fencewatch receive-webhooks``: receive the job's webhooks and write them down.

    FENCEWATCH_WEBHOOK_SECRET=... fencewatch receive-webhooks --port 9099 --bind 0.0.0.0 \\
        --output received.jsonl

Accepts the three fencewatch formats on any path. With a secret, every
request must carry a valid ``v1`` signature over its timestamp, alert id and
body (401 unsigned or forged, 400 unreadable signing headers); without one it
takes anything in those formats, which is what Alertmanager's own unsigned
notifications need. Answers a repeated ``X-Fencewatch-Alert-Id`` with 200 but
records it once. Connections, body size and time are bounded (``--max-*``,
``--*-timeout-seconds``). Writes one JSON line per accepted request (see
:mod:`webhooks.receiver`) to ``--output`` or stdout, until
SIGTERM/SIGINT.

Exit codes: 0 stopped by a signal; 1 the port, output or secret file cannot be
used; 2 usage.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from fencewatch.options import input_file, output_file

SECRET_ENV = "FENCEWATCH_WEBHOOK_SECRET"
# The ServerLimits fields each have an option of the same name.
LIMITS = ("max_connections", "max_body_bytes", "body_timeout_seconds", "idle_timeout_seconds")


def _say(message: str) -> None:
    print(f"fencewatch receive-webhooks: {message}", file=sys.stderr, flush=True)


def add_parser(sub: Any) -> None:
    """Register ``receive-webhooks`` on the ``fencewatch`` command line."""
    p = sub.add_parser(
        "receive-webhooks",
        help="receive the job's webhook alerts, verify and de-duplicate them, write them as JSON lines",
        description="A small webhook receiver for docker-compose, end-to-end tests and trying an "
        "endpoint config out. With a secret, every request on every path must be signed (v1 HMAC "
        "over timestamp, alert id and body); it de-duplicates by X-Fencewatch-Alert-Id and appends "
        "one JSON line per accepted request.",
        epilog=f"The HMAC secret comes from env {SECRET_ENV} or --secret-file, never the command line. "
        "Exit codes: 0 stopped by a signal, 1 port, output or secret file unusable, 2 usage error.",
    )
    p.add_argument("--port", type=int, required=True, help="port to listen on (0: any free port)")
    p.add_argument(
        "--bind",
        default="127.0.0.1",
        metavar="ADDR",
        help="address to listen on (default %(default)s; 0.0.0.0 in a container)",
    )
    p.add_argument("--output", metavar="FILE", help="append JSON lines here (default: stdout)")
    p.add_argument(
        "--secret-file",
        metavar="FILE",
        help=f"file holding the HMAC secret (default: env {SECRET_ENV}; neither: signatures not checked)",
    )
    p.add_argument(
        "--max-skew-seconds",
        type=float,
        default=300.0,
        help="reject signed requests whose timestamp is further than this from now (default %(default)s)",
    )
    # Unset limits take ServerLimits' defaults. They are named in the help without
    # importing it: that would load aiohttp for every fencewatch command.
    # test_webhooks_receiver.py checks the two agree.
    limits = p.add_argument_group("limits (slow or hostile clients)")
    limits.add_argument(
        "--max-connections",
        type=_above_zero(int),
        help="connections open at once; one more gets 503 and is closed (default 1024)",
    )
    limits.add_argument(
        "--max-body-bytes", type=_above_zero(int), help="a larger body gets 413 (default 1048576)"
    )
    limits.add_argument(
        "--body-timeout-seconds",
        type=_above_zero(float),
        help="the body must arrive within this time of the headers, else 408 (default 10)",
    )
    limits.add_argument(
        "--idle-timeout-seconds",
        type=_above_zero(float),
        help="a connection that completes no request headers for this long is closed (default 15)",
    )
    p.set_defaults(run=run)


def _above_zero(kind: Callable[[str], float]) -> Callable[[str], Any]:
    noun = "whole number" if kind is int else "number"

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {noun}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value

    return parse


def run(args: argparse.Namespace) -> int:
    input_file("fencewatch receive-webhooks", args.secret_file, "--secret-file")
    output_file("fencewatch receive-webhooks", args.output, "--output")
    from webhooks.http_server import ServerLimits
    from webhooks.receiver import WebhookReceiver

    if args.secret_file:
        try:
            with open(args.secret_file, encoding="utf-8") as f:
                secret_text = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            _say(f"cannot read --secret-file {args.secret_file}: {exc}")
            return 1
        if not secret_text:
            _say(f"--secret-file {args.secret_file} is empty")
            return 1
    else:
        secret_text = os.environ.get(SECRET_ENV, "").strip()
    secret = secret_text.encode() if secret_text else None

    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    with ExitStack() as stack:
        try:
            output = (
                stack.enter_context(open(args.output, "a", encoding="utf-8")) if args.output else sys.stdout
            )
            receiver = WebhookReceiver(
                args.port,
                args.bind,
                secret=secret,
                output=output,
                max_skew_seconds=args.max_skew_seconds,
                limits=ServerLimits(
                    **{name: getattr(args, name) for name in LIMITS if getattr(args, name) is not None}
                ),
            )
        except OSError as exc:
            _say(f"cannot start: {exc}")
            return 1
        stack.callback(receiver.stop)
        checked = (
            "signatures checked"
            if secret is not None
            else f"no secret ({SECRET_ENV}): signatures NOT checked"
        )
        _say(f"listening on {args.bind}:{receiver.port}, {checked}")
        stopped.wait()
        _say(
            f"stopping: {len(receiver.received)} recorded, {receiver.duplicates} duplicates, "
            f"{receiver.rejected} rejected"
        )
    return 0
