"""Alerts and counts as people read them: one place, so the console, Slack text,
Alertmanager annotations, summaries and reports all say the same thing."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from detectors.alerts import FIRING, POSSIBLE


def iso_utc(ts_ms: int) -> str:
    """Milliseconds since the epoch as ISO-8601 UTC, e.g. ``2025-11-21T10:13:42.358Z``
    (also RFC 3339, as Alertmanager wants it)."""
    return datetime.fromtimestamp(ts_ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def where(alert: Mapping[str, Any]) -> str:
    """``topic-partition`` (the topic id when the name is unknown), the topic alone
    without a partition, or empty for cluster-wide alerts."""
    topic = alert.get("topic") or alert.get("topic_id")
    if alert.get("partition") is None:
        return str(topic) if topic else ""
    return f"{topic}-{alert['partition']}"


def alert_line(alert: Mapping[str, Any]) -> str:
    """One human line for an alert (the SPEC section 3 dict):
    ``[FIRING critical] prod QUORUM_ZOMBIE_LEADER node 3000 at 2025-11-21T10:13:42.358Z: <message>``,
    ``[FIRING info POSSIBLE] ...`` for a possible violation.

    The status leads, so a resolution never reads as a second alert; an alert
    without one (written before statuses existed) is firing. Whatever the
    fields hold, the result is one line."""
    status = str(alert.get("status") or FIRING).upper()
    # A possible violation says so next to its severity (its message carries the condition).
    possible = " POSSIBLE" if alert.get("confidence") == POSSIBLE else ""
    parts = [f"[{status} {alert['severity']}{possible}]", str(alert.get("cluster")), str(alert["rule"])]
    if where(alert):
        parts.append(where(alert))
    if alert.get("node") is not None:
        parts.append(f"node {alert['node']}")
    parts.append(f"at {iso_utc(int(alert['ts_ms']))}")
    return " ".join(f"{' '.join(parts)}: {alert['message']}".split())


def plural(n: int, noun: str) -> str:
    """``1 alert``, ``2 alerts``, ``3 batches``."""
    if n == 1:
        return f"1 {noun}"
    return f"{n} {noun}es" if noun.endswith("ch") else f"{n} {noun}s"


def tally(violations: int, resolutions: int) -> str:
    """``99 violations and 4 resolutions``: resolved timer alerts end a violation
    already counted, so they are never counted as violations."""
    return f"{plural(violations, 'violation')} and {plural(resolutions, 'resolution')}"
