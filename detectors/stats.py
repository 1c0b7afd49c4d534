"""What a cluster's detector state looks like right now, as plain numbers:
the streaming job ships these snapshots to the driver, which exports them as
Prometheus metrics. Every key set here is bounded (rule ids, API names, fixed
reason classes), so metrics built on them have bounded cardinality."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from detectors.envelope import DeadLetterClass

# The ``reason`` label values of the dead-letter metric; each dead letter carries its class.
DEAD_LETTER_CLASSES = tuple(c.value for c in DeadLetterClass)


class UnverifiedReason(StrEnum):
    """Why an event could not be judged: the key it is counted under (in the
    summaries, the checkpointed counters and the ``reason`` label of
    ``fencewatch_unverified_events_total``). Values never change: checkpoints
    and dashboards hold them."""

    UNKNOWN_PARTITION = "unknown partition"
    PARTITION_CREATED_AFTER = "partition created after the event"
    NO_RESPONSE_ENTRY = "partition has no response entry"
    UNKNOWN_BROKER = "unknown broker"
    ISR_MEMBER_UNREGISTERED = "ISR member never registered in the view"
    LEADER_UNREGISTERED = "leader never registered in the view"
    REMOTE_SEGMENT_NOT_SEEN = "update for a remote segment not seen"
    BROKER_CHANGE_BEFORE_REGISTRATION = "broker change before its registration"
    TOPIC_REMOVAL_NOT_SEEN = "topic removal for a topic not seen"
    PARTITION_CHANGE_BEFORE_RECORD = "partition change before its partition record"
    PARTITION_BEFORE_TOPIC = "partition record before its topic record"
    BROKER_REGISTRATION_NOT_SEEN = "broker registration not seen"
    TOO_LATE = "too late: its grace window had closed when it arrived"
    CLOCK_UNCERTAIN = "clock uncertain"
    UNCLEAN_ELECTION_UNDECIDED = "unclean election the log cannot judge"
    BROKER_METADATA_BEHIND = "broker not shown to have applied the metadata record"


# Most gaps are a view that starts after the records it needed.
_FROM_THE_START = (
    "ship the cluster's metadata log from its start (`fencewatch ship metadata-dump`) or a snapshot"
)

# What each reason means and what to ship (or set) so it does not happen: one
# line each, printed beside the count in every summary.
UNVERIFIED_EXPLANATIONS: dict[UnverifiedReason, str] = {
    UnverifiedReason.UNKNOWN_PARTITION: (
        f"no metadata record for this partition before the request: {_FROM_THE_START}"
    ),
    UnverifiedReason.PARTITION_CREATED_AFTER: (
        "the request is older than its partition's first metadata record by more than the grace "
        "window: ship a metadata snapshot taken before the requests, or align the clocks of brokers "
        "and controllers (or raise --grace-ms / FENCEWATCH_GRACE_MS)"
    ),
    UnverifiedReason.NO_RESPONSE_ENTRY: (
        "the request log line has no answer for this partition, so its outcome is unknown: ship "
        "whole `kafka.request.logger` DEBUG lines (`fencewatch ship request-log`)"
    ),
    UnverifiedReason.UNKNOWN_BROKER: f"no registration of the AlterPartition's sender: {_FROM_THE_START}",
    UnverifiedReason.ISR_MEMBER_UNREGISTERED: f"no registration of a replica in the ISR: {_FROM_THE_START}",
    UnverifiedReason.LEADER_UNREGISTERED: f"no registration of the elected leader: {_FROM_THE_START}",
    UnverifiedReason.REMOTE_SEGMENT_NOT_SEEN: (
        "a remote segment's state changed before its COPY_SEGMENT_STARTED record was seen: ship "
        "__remote_log_metadata from its beginning (`fencewatch ship remote-log-metadata` fed by "
        "kafka-console-consumer.sh --from-beginning)"
    ),
    UnverifiedReason.BROKER_CHANGE_BEFORE_REGISTRATION: (
        f"a broker's fencing or shutdown record came before its registration: {_FROM_THE_START}"
    ),
    UnverifiedReason.TOPIC_REMOVAL_NOT_SEEN: (
        f"a topic the view never saw created was removed: {_FROM_THE_START}"
    ),
    UnverifiedReason.PARTITION_CHANGE_BEFORE_RECORD: (
        f"a partition changed before its PARTITION_RECORD, so its epochs are unknown: {_FROM_THE_START}"
    ),
    UnverifiedReason.PARTITION_BEFORE_TOPIC: (
        f"a partition's record came before its topic's: {_FROM_THE_START}"
    ),
    UnverifiedReason.BROKER_REGISTRATION_NOT_SEEN: (
        "the view started mid-log without a snapshot, after the broker's registration: its epoch and "
        "fencing before the first record the view saw of it are unknown. Start the view from the "
        "newest snapshot (`fencewatch ship metadata-log DIR`, or a dump of the `.checkpoint` "
        "before the segments)"
    ),
    UnverifiedReason.CLOCK_UNCERTAIN: (
        "the node's clock offset to the metadata log's is known only within an interval wider than "
        "--clock-limit-ms (or nothing bounds it from one side), so the moment it acted cannot be placed "
        "among the metadata records: the replay summary's clock lines name the node; fix its clock "
        "(NTP/chrony) or raise --clock-limit-ms"
    ),
    UnverifiedReason.UNCLEAN_ELECTION_UNDECIDED: (
        "a leader was elected from outside the ISR and ELR (an unclean election) and the metadata log "
        "does not say whether its topic allows that: set unclean.leader.election.enable for the topic "
        "or the cluster with kafka-configs.sh (a controller's server.properties is not in the log) and "
        "ship the log from before that; with ISR and ELR both empty it may also be KIP-966's "
        "last-known-leader recovery, which any setting allows"
    ),
    UnverifiedReason.BROKER_METADATA_BEHIND: (
        "a broker acted on a state the metadata log had superseded, but no BrokerHeartbeat of it "
        "reported that it had applied the record that did (its currentMetadataOffset; brokers apply "
        "the log late, by seconds after a pause or a restart): normal while a broker catches up; "
        "ship every controller's request log with kafka.request.logger at DEBUG so each heartbeat "
        "is read"
    ),
    UnverifiedReason.TOO_LATE: (
        "the event arrived after the verdicts of its time were made: raise --lateness-ms "
        "(FENCEWATCH_LATENESS_MS) to the shippers' worst delay, or ship with less delay"
    ),
}


def explain_unverified(key: str) -> str:
    """The one-line explanation of an unverified reason key; for a key this
    release does not know (a counter restored from another release's
    checkpoint), a line that says so."""
    try:
        return UNVERIFIED_EXPLANATIONS[UnverifiedReason(key)]
    except ValueError:
        return "a reason this release does not know (counted by another release of fencewatch)"


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
        # Possible violations (detectors.alerts.POSSIBLE), apart from the certain ones.
        "possible_alerts": [
            [rule, severity, status, n] for (rule, severity, status), n in counters.possible.items()
        ],
        # Nodes whose clock evidence contradicts the bound given for them: node -> [low, high, bound].
        "clock_bound_contradicted": {
            str(node): [int(low), int(high), int(bound)]
            for node, (low, high, bound) in state.bound_contradicted.items()
        },
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
        # Each node's clock minus the metadata log's, as measured (detectors.clocks).
        "clock_offsets": {
            str(node): interval.to_dict()
            for node, interval in state.clocks.measured_nodes(state.metadata_clock.shift_ms).items()
        },
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
    for name in ("alerts", "possible_alerts"):
        alerts: dict[tuple[str, str, str], int] = {}
        for snap in ordered:
            # A snapshot of a release before possible violations has none.
            for rule, severity, status, n in snap.get(name, ()):
                alerts[(rule, severity, status)] = alerts.get((rule, severity, status), 0) + n
        merged[name] = [[*key, n] for key, n in alerts.items()]
    contradicted: dict[str, list[int]] = {}
    for snap in ordered:
        contradicted.update(snap.get("clock_bound_contradicted") or {})
    merged["clock_bound_contradicted"] = contradicted
    for name in ("late", "duplicates", "pending_judgments"):
        merged[name] = sum(snap[name] for snap in ordered)
    times = [snap["newest_event_ts_ms"] for snap in ordered if snap["newest_event_ts_ms"] is not None]
    merged["newest_event_ts_ms"] = max(times, default=None)
    merged["clock_offsets"] = merge_clock_offsets([snap.get("clock_offsets") or {} for snap in ordered])
    return merged


def merge_clock_offsets(per_bucket: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """One interval per node from its buckets' (each measured from the requests
    of its own partitions): their intersection, where they agree; where they do
    not (a step that one bucket's evidence has seen and another's not yet), the
    interval of the bucket with the most evidence."""
    merged: dict[str, dict[str, Any]] = {}
    for offsets in per_bucket:
        for node, interval in offsets.items():
            known = merged.get(node)
            if known is None:
                merged[node] = dict(interval)
                continue
            low = max(_bound(known["low_ms"], -1), _bound(interval["low_ms"], -1))
            high = min(_bound(known["high_ms"], 1), _bound(interval["high_ms"], 1))
            if low <= high:
                merged[node] = {
                    **known,
                    "low_ms": None if low == float("-inf") else int(low),
                    "high_ms": None if high == float("inf") else int(high),
                    "low_measured": known["low_measured"] or interval["low_measured"],
                    "evidence": known["evidence"] + interval["evidence"],
                }
            elif interval["evidence"] > known["evidence"]:
                merged[node] = dict(interval)
    return merged


def _bound(value: int | None, side: int) -> float:
    """A bound of a JSON interval; None is open on that ``side`` (-1 low, 1 high)."""
    return float(value) if value is not None else side * float("inf")
