"""``fencewatch webhooks``: the parked alerts of a webhook outbox, listed and resent.

    fencewatch webhooks parked --outbox ck/fencewatch-webhook-outbox.sqlite [--endpoint oncall] [--json]
    fencewatch webhooks resend --outbox ck/fencewatch-webhook-outbox.sqlite [--endpoint oncall] \\
        [--alert-id ID ...]

An alert is parked when its endpoint rejected it (a 3xx or a 4xx other than
401/403/408/429), failed it ``max_attempts`` times, or did not take it within
``max_age_seconds``. ``parked`` shows each with its last answer. ``resend``
only moves rows back to pending: the running job's dispatcher (or the next
``fencewatch run`` on this outbox) delivers them within a second, with the
endpoint's current URL and secret. This command never posts anything itself,
so it needs no secrets and cannot race the job's delivery threads into
sending an alert twice.

Exit codes: 0 done; 1 the outbox cannot be used, or an ``--alert-id`` or
``--endpoint`` matched no parked row; 2 usage.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

if TYPE_CHECKING:
    from webhooks.outbox import Outbox, ParkedRow

T = TypeVar("T")

OUTBOX_ENV = "FENCEWATCH_WEBHOOK_OUTBOX"


def _say(message: str) -> None:
    print(f"fencewatch webhooks: {message}", file=sys.stderr, flush=True)


def add_parser(sub: Any) -> None:
    """Register ``webhooks`` (with ``parked`` and ``resend``) on the ``fencewatch`` command line."""
    p = sub.add_parser(
        "webhooks",
        help="list the webhook alerts the job gave up on (parked), and resend them",
        description="Parked webhook alerts: those an endpoint rejected, failed too often, or did not "
        "take within max_age_seconds. They stay in the outbox until resent.",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    outbox_help = (
        f"the job's webhook outbox (its --webhook-outbox; default <checkpoint>/fencewatch-webhook-outbox"
        f".sqlite; env {OUTBOX_ENV})"
    )

    listing = actions.add_parser(
        "parked",
        help="list parked alerts with their last answer",
        description="One line per parked alert: endpoint, alert id, rule, status (firing or resolved), "
        "why it was parked, attempts, when, and the last answer (HTTP status and body excerpt, or the "
        "error).",
    )
    resend = actions.add_parser(
        "resend",
        help="move parked alerts back to pending; the running job delivers them",
        description="Move parked alerts back to pending, due now and with a fresh max_age. The running "
        "job's dispatcher (or the next `fencewatch run` on this outbox) delivers them within a second; "
        "this command sends nothing itself. Without --alert-id every parked alert (of --endpoint) moves.",
    )
    for action in (listing, resend):
        action.add_argument(
            "--outbox",
            metavar="FILE",
            default=os.environ.get(OUTBOX_ENV),
            required=OUTBOX_ENV not in os.environ,
            help=outbox_help,
        )
        action.add_argument("--endpoint", metavar="NAME", help="only this endpoint's alerts")
    listing.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    listing.set_defaults(run=run_parked)
    resend.add_argument(
        "--alert-id", metavar="ID", nargs="+", default=[], help="only these alerts (default: all parked)"
    )
    resend.set_defaults(run=run_resend)


def _open(path: str) -> Outbox | None:
    from webhooks.outbox import Outbox, OutboxError

    try:
        return Outbox(path, create=False)
    except OutboxError as exc:
        _say(f"{exc} (give the job's --webhook-outbox file)")
        return None


def _endpoint_unknown(outbox: Outbox, endpoint: str | None) -> bool:
    if endpoint is None or endpoint in (known := outbox.endpoints()):
        return False
    _say(f"the outbox has no endpoint {endpoint!r}; it has: {', '.join(known) or 'none'}")
    return True


def _in_outbox(args: argparse.Namespace, action: Callable[[Outbox], T]) -> T | None:
    """``action`` on the outbox ``--outbox`` names, closed after; None (said why) when
    the file or ``--endpoint`` is not usable."""
    outbox = _open(args.outbox)
    if outbox is None:
        return None
    try:
        return None if _endpoint_unknown(outbox, args.endpoint) else action(outbox)
    finally:
        outbox.close()


def run_parked(args: argparse.Namespace) -> int:
    rows = _in_outbox(args, lambda outbox: outbox.parked(args.endpoint))
    if rows is None:
        return 1
    if args.json:
        for row in rows:
            sys.stdout.write(orjson.dumps(_as_dict(row)).decode() + "\n")
    elif rows:
        _print_table(rows)
    _say(f"{len(rows)} parked alert(s)" + (" (resend them with: fencewatch webhooks resend)" if rows else ""))
    return 0


def run_resend(args: argparse.Namespace) -> int:
    moved = _in_outbox(args, lambda outbox: outbox.resend(time.time(), args.endpoint, args.alert_id))
    if moved is None:
        return 1
    for endpoint, alert_id in moved:
        print(f"{endpoint}\t{alert_id}")
    _say(
        f"{len(moved)} parked alert(s) back to pending; the running job delivers them "
        "(or the next `fencewatch run` on this outbox does)"
    )
    missing = sorted(set(args.alert_id) - {alert_id for _, alert_id in moved})
    if missing:
        where = f" for endpoint {args.endpoint!r}" if args.endpoint else ""
        _say(f"not parked{where} (unknown, pending or delivered): {', '.join(missing)}")
        return 1
    return 0


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _as_dict(row: ParkedRow) -> dict[str, Any]:
    return {
        "endpoint": row.endpoint,
        "alert_id": row.alert_id,
        "rule": row.rule,
        "status": row.status,
        "reason": row.reason,
        "attempts": row.attempts,
        "enqueued_at": _utc(row.enqueued_at),
        "parked_at": _utc(row.parked_at),
        "last_status": row.last_status,
        "last_body": row.last_body,
        "last_error": row.last_error,
    }


def _print_table(rows: list[ParkedRow]) -> None:
    header = ("ENDPOINT", "ALERT ID", "RULE", "STATUS", "REASON", "ATTEMPTS", "PARKED AT", "LAST ANSWER")
    lines = [
        (
            row.endpoint,
            row.alert_id,
            row.rule or "-",
            row.status or "-",
            row.reason,
            str(row.attempts),
            _utc(row.parked_at),
            row.last_error or "(never attempted)",
        )
        for row in rows
    ]
    # The last column (the answer) is free text: pad only the ones before it.
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header) - 1)]
    for *cells, answer in [header, *lines]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)), answer, sep="  "
        )
