"""``fencewatch receive-webhooks``: receive the job's webhooks and write them down.

    FENCEWATCH_WEBHOOK_SECRET=... fencewatch receive-webhooks --port 9099 --bind 0.0.0.0 \\
        --output received.jsonl

Accepts the three fencewatch formats on any path and Alertmanager's own
(unsigned) POSTs on ``/alertmanager``; verifies ``X-Fencewatch-Signature``
when a secret is given (401 otherwise); answers a repeated
``X-Fencewatch-Alert-Id`` with 200 but records it once. Writes one JSON line
per accepted request (see :mod:`streaming.webhooks.receiver`) to ``--output``
or stdout, until SIGTERM/SIGINT.

Exit codes: 0 stopped by a signal; 1 the port, output or secret file cannot be
used; 2 usage.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from contextlib import ExitStack
from typing import Any

SECRET_ENV = "FENCEWATCH_WEBHOOK_SECRET"


def _say(message: str) -> None:
    print(f"fencewatch receive-webhooks: {message}", file=sys.stderr, flush=True)


def add_parser(sub: Any) -> None:
    """Register ``receive-webhooks`` on the ``fencewatch`` command line."""
    p = sub.add_parser(
        "receive-webhooks",
        help="receive the job's webhook alerts, verify and de-duplicate them, write them as JSON lines",
        description="A small webhook receiver for docker-compose, end-to-end tests and trying an "
        "endpoint config out. Verifies HMAC signatures when a secret is given, de-duplicates by "
        "X-Fencewatch-Alert-Id, and appends one JSON line per accepted request.",
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
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from streaming.webhooks.receiver import WebhookReceiver

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
                args.port, args.bind, secret=secret, output=output, max_skew_seconds=args.max_skew_seconds
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
