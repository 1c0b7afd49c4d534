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
        # Which part of the cluster this state judges (detectors.buckets): the
        # driver sums buckets' counters, and takes cluster-wide facts from bucket 0.
        "bucket": state.bucket.index,
        "buckets": state.bucket.count,
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


def merge_buckets(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """One cluster's snapshot from its buckets' snapshots (detectors.buckets):
    counters and pending judgments summed, the newest event time the newest,
    cluster-wide facts from bucket 0 (the home of quorum records too)."""
    ordered = sorted(snapshots, key=lambda s: s.get("bucket", 0))
    # Bucket 0's copy of every cluster-wide fact (brokers, topics, tracked
    # partitions, open quorum alerts): every bucket's view holds them alike.
    merged = dict(ordered[0])
    for name in ("events", "unverified", "dead_letters"):
        table: dict[str, int] = {}
        for snap in ordered:
            for key, n in snap[name].items():
                table[key] = table.get(key, 0) + n
        merged[name] = table
    alerts: dict[tuple[str, str, str], int] = {}
    for snap in ordered:
        for rule, severity, status, n in snap["alerts"]:
            alerts[(rule, severity, status)] = alerts.get((rule, severity, status), 0) + n
    merged["alerts"] = [[*key, n] for key, n in alerts.items()]
    for name in ("late", "duplicates", "pending_judgments"):
        merged[name] = sum(snap[name] for snap in ordered)
    times = [snap["newest_event_ts_ms"] for snap in ordered if snap["newest_event_ts_ms"] is not None]
    merged["newest_event_ts_ms"] = max(times, default=None)
    return merged
