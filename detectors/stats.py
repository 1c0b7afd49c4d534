"""What a cluster's detector state looks like right now, as plain numbers:
the streaming job ships these snapshots to the driver, which exports them as
Prometheus metrics. Every key set here is bounded (rule ids, API names, fixed
reason classes), so metrics built on them have bounded cardinality."""

from __future__ import annotations

from typing import Any

from detectors.envelope import DeadLetterClass

# The ``reason`` label values of the dead-letter metric; each dead letter carries its class.
DEAD_LETTER_CLASSES = tuple(c.value for c in DeadLetterClass)


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
