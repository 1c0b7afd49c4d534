"""What a cluster's detector state looks like right now, as plain numbers:
the streaming job ships these snapshots to the driver, which exports them as
Prometheus metrics. Every key set here is bounded (rule ids, API names, fixed
reason classes), so metrics built on them have bounded cardinality."""

from __future__ import annotations

import re
from typing import Any

# Dead-letter reasons are sentences naming a field; metrics need a small fixed
# set of classes. Checked in order; the first match wins.
_DEAD_LETTER_CLASSES = (
    ("not_utf8", re.compile(r"^not UTF-8")),
    ("malformed_json", re.compile(r"^malformed JSON|^request body must be a JSON object")),
    ("cluster_mismatch", re.compile(r"^record key .* differs from the envelope's cluster")),
    ("missing_field", re.compile(r"missing (required )?field")),
    ("out_of_range", re.compile(r"out of range|must be <=|must be >=|must be a broker id")),
    ("wrong_type", re.compile(r"must be (an?|one of) |must be integer|must be string|must be object")),
    ("no_timestamp", re.compile(r"no (usable )?timestamp")),
)
DEAD_LETTER_CLASSES = (*(name for name, _ in _DEAD_LETTER_CLASSES), "invalid")


def dead_letter_class(reason: str) -> str:
    """The bounded class of a dead letter's reason (one of DEAD_LETTER_CLASSES)."""
    for name, pattern in _DEAD_LETTER_CLASSES:
        if pattern.search(reason):
            return name
    return "invalid"


def split_event_key(key: str) -> tuple[str, str]:
    """``request:Produce`` -> ("request", "Produce"); ``metadata`` -> ("metadata", "")."""
    kind, _, api = key.partition(":")
    return kind, api


def cluster_snapshot(state: Any) -> dict[str, Any]:
    """A JSON-able snapshot of one cluster's counters and state sizes.

    ``state`` is the engine's per-cluster state (a ClusterState with a
    watermark); counters are cumulative since the state began, so they survive
    a restart from the checkpoint exactly as the state does."""
    counters = state.counters
    view = state.view
    latest = [h.latest for h in view.brokers.values()]
    live_topics = [t for t in view.topics.values() if t.deleted_ms is None]
    open_alerts: dict[str, int] = {}
    if state.quorum.open_zombies:
        open_alerts["QUORUM_ZOMBIE_LEADER"] = len(state.quorum.open_zombies)
    return {
        "cluster": state.cluster,
        "events": dict(counters.events),
        "unverified": dict(counters.unverified),
        "dead_letters": dict(counters.dead_letters),
        "alerts": [[rule, severity, status, n] for (rule, severity, status), n in counters.alerts.items()],
        "late": counters.late,
        "duplicates": counters.duplicates,
        "brokers": {
            "registered": sum(1 for b in latest if b.registered),
            "fenced": sum(1 for b in latest if b.registered and b.fenced),
            "controlled_shutdown": sum(1 for b in latest if b.registered and b.shutting_down),
        },
        "tracked_brokers": len(view.brokers),
        "tracked_topics": len(live_topics),
        "tracked_partitions": sum(t.partition_count for t in live_topics),
        "pending_judgments": len(state.pending),
        "open_alerts": open_alerts,
        "newest_event_ts_ms": state.max_ts_ms,
    }
