"""KIP-570: the leader epoch in StopReplicaRequest (version 3+)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from detectors.envelope import Envelope
from detectors.errors import KafkaError
from detectors.requests import Header, StopReplica
from detectors.rules.base import Rule, register
from detectors.stats import UnverifiedReason

if TYPE_CHECKING:
    from detectors.cluster import ClusterState

DELETE_SENTINEL = -2


@register
class StopReplicaStaleEpochApplied(Rule):
    """KIP-570. A StopReplica partition whose ``leaderEpoch`` (>= 0) is older
    than every leader epoch of the grace window was answered NONE: a reordered,
    stale request stopped (or deleted) a replica. Not a violation: an equal
    epoch (KIP-570 accepts it); -1 (pre-v3 controllers send no epoch); the -2
    deletion sentinel; FENCED_LEADER_EPOCH answers (fencing working)."""

    id = "STOP_REPLICA_STALE_EPOCH_APPLIED"
    severity = "critical"
    proposals = ("KIP-570",)


@register
class StopReplicaDeleteSentinelRejected(Rule):
    """KIP-570. ``leaderEpoch`` -2 marks a topic deletion, which does not bump
    the epoch, and overrides every epoch; answering FENCED_LEADER_EPOCH leaves
    the deleted topic's replica behind. Not a violation: other errors for -2
    (e.g. KAFKA_STORAGE_ERROR) and FENCED_LEADER_EPOCH for a real older epoch."""

    id = "STOP_REPLICA_DELETE_SENTINEL_REJECTED"
    severity = "warning"
    proposals = ("KIP-570",)


@register
class StopReplicaCurrentEpochRejected(Rule):
    """KIP-570. A StopReplica partition whose ``leaderEpoch`` is equal to or
    newer than every leader epoch of the grace window was answered
    FENCED_LEADER_EPOCH: the broker refused the current controller. Not a
    violation: FENCED_LEADER_EPOCH for an epoch that was already superseded."""

    id = "STOP_REPLICA_CURRENT_EPOCH_REJECTED"
    severity = "warning"
    proposals = ("KIP-570",)


@register
class StopReplicaStaleControllerAccepted(Rule):
    """KIP-570 (controller fencing). A broker answered NONE to a StopReplica whose
    ``controllerEpoch`` is older than one the same broker had already accepted
    (from a StopReplica, LeaderAndIsr or UpdateMetadata answered NONE: Kafka's
    ReplicaManager keeps one controller epoch that all three raise and check):
    it should have answered STALE_CONTROLLER_EPOCH. Not a violation: an old
    controller epoch at a broker that has not yet heard from the new controller;
    the epoch of a rejected UpdateMetadata; the same epoch again."""

    id = "STOP_REPLICA_STALE_CONTROLLER_ACCEPTED"
    severity = "critical"
    proposals = ("KIP-570",)


def judge(cs: ClusterState, env: Envelope, header: Header, request: StopReplica, home: bool = True) -> None:
    """``request`` holds the partitions of this detector's bucket; the
    controller epoch is judged in the request's home bucket (detectors.buckets)."""
    node = env.node
    identity = (header.request_ref, env.ts_ms)
    accepted = cs.controller_epochs.get(node) if node is not None else None
    previous = accepted.at(env.ts_ms - 1) if accepted else None
    stale = (
        previous
        if home and request.error == KafkaError.NONE and previous and request.controller_epoch < previous[0]
        else None
    )
    if stale and (cs.written_twice(node, env.ts_ms) or cs.written_twice(node, stale[1].ts_ms)):
        # The broker's clock stepped back over these times: which of the two it
        # accepted first cannot be told from them (benchmarks/clock_campaign.py --step-grid).
        cs.unverified(UnverifiedReason.CLOCK_UNCERTAIN)
    elif stale:
        cs.emit(
            StopReplicaStaleControllerAccepted,
            env,
            message=f"broker {node} accepted a StopReplica from controller epoch "
            f"{request.controller_epoch} after accepting controller epoch {stale[0]}",
            node=node,
            identity=identity,
            evidence=[stale[1]],
        )
    for part in request.partitions:
        if part.leader_epoch == DELETE_SENTINEL:
            if part.error == KafkaError.FENCED_LEADER_EPOCH:
                topic_key = cs.view.topic_key(part.topic, None, env.ts_ms)
                cs.emit(
                    StopReplicaDeleteSentinelRejected,
                    env,
                    message=f"broker {node} rejected the topic-deletion sentinel (leaderEpoch -2) "
                    f"for {part.topic}-{part.partition} with FENCED_LEADER_EPOCH",
                    node=node,
                    identity=identity,
                    partition_key=(topic_key, part.partition),
                )
            continue
        if part.leader_epoch < 0:
            continue
        if part.error is None:
            cs.unverified(UnverifiedReason.NO_RESPONSE_ENTRY)
            continue
        window = cs.partition_window(part.topic, None, part.partition, env)
        if window is None:
            continue
        key, states = window
        oldest = min(s.leader_epoch for s in states)
        newest = max(s.leader_epoch for s in states)
        tp = f"{part.topic}-{part.partition}"
        if part.error == KafkaError.NONE and part.leader_epoch < oldest:
            cs.emit(
                StopReplicaStaleEpochApplied,
                env,
                message=f"broker {node} applied a StopReplica for {tp} with stale leaderEpoch "
                f"{part.leader_epoch} (current {oldest})"
                + (" and deleted the partition" if part.delete else ""),
                node=node,
                identity=identity,
                evidence=[states[0].source],
                partition_key=key,
            )
        elif part.error == KafkaError.FENCED_LEADER_EPOCH and part.leader_epoch >= newest:
            cs.emit(
                StopReplicaCurrentEpochRejected,
                env,
                message=f"broker {node} rejected a StopReplica for {tp} with FENCED_LEADER_EPOCH "
                f"although its leaderEpoch {part.leader_epoch} is current (view: {newest})",
                node=node,
                identity=identity,
                evidence=[states[-1].source],
                partition_key=key,
            )
