"""KIP-359: the leader epoch in ProduceRequest, and writes accepted by a broker
that is not the leader.

Each rule here blames a broker for acting on a leadership or epoch the
metadata log had superseded. Where the controllers' request logs carry its
BrokerHeartbeats, that is certain only once a heartbeat of it, by the earliest
moment it may have acted, reported it had applied the record that superseded
it (ClusterState.metadata_applied): brokers apply the log seconds late after a
pause or a restart. Without one it is counted unverified."""

from __future__ import annotations

from typing import TYPE_CHECKING

from detectors.alerts import Evidence
from detectors.applied_metadata import EpochAbove, LedByOther
from detectors.envelope import Envelope
from detectors.errors import KafkaError
from detectors.requests import Header, PartitionOutcome
from detectors.rules.base import Rule, register
from detectors.stats import UnverifiedReason
from detectors.view import PartitionState

if TYPE_CHECKING:
    from detectors.cluster import ClusterState


@register
class ProduceStaleEpochAccepted(Rule):
    """KIP-359. The partition's leader answered a Produce with NONE although the
    request's ``currentLeaderEpoch`` (>= 0) is older than every leader epoch the
    partition had within the grace window: the leader should have answered
    FENCED_LEADER_EPOCH. Not a violation: requests without the field (-1, stock
    Kafka clients); an epoch that was current within the grace window (the
    broker may not have applied the bump yet); a FENCED_LEADER_EPOCH answer
    (fencing working). When the broker is not the leader at all,
    PRODUCE_ACCEPTED_BY_NON_LEADER is raised instead."""

    id = "PRODUCE_STALE_EPOCH_ACCEPTED"
    severity = "warning"
    proposals = ("KIP-359",)


@register
class ProduceAcceptedByNonLeader(Rule):
    """KIP-359 motivation. A broker answered a Produce partition with NONE while
    it was not the partition's leader at any moment of the grace window around
    the request: a zombie leader accepting writes that the real leader never
    sees. Critical when ``acks=-1`` (the client believes the write is durable).
    Not a violation: a former leader within the grace window after the election
    (brokers apply metadata late); NOT_LEADER_OR_FOLLOWER answers."""

    id = "PRODUCE_ACCEPTED_BY_NON_LEADER"
    severity = "warning"
    proposals = ("KIP-359",)


@register
class ProduceEpochErrorMismatch(Rule):
    """KIP-359 / KIP-320. The epoch error contradicts the epochs: FENCED_LEADER_EPOCH
    for a request epoch not older than every epoch in the grace window, or
    UNKNOWN_LEADER_EPOCH for one not newer than any. Clients react to the two
    differently (refresh metadata vs back off), so a swapped code stalls them.
    Not a violation: either error for an epoch that lagged or led within the grace window."""

    id = "PRODUCE_EPOCH_ERROR_MISMATCH"
    severity = "warning"
    proposals = ("KIP-359", "KIP-320")


def judge(
    cs: ClusterState, env: Envelope, header: Header, acks: int, outcomes: list[PartitionOutcome]
) -> None:
    node = env.node
    window = cs.window_of(env)
    for outcome in outcomes:
        if outcome.error is None:
            cs.unverified(UnverifiedReason.NO_RESPONSE_ENTRY)
            continue
        found = cs.partition_window(outcome.topic, outcome.topic_id, outcome.partition, env, window=window)
        if found is None:
            continue
        key, states = found
        if len(states) == 1:  # the everyday window: one state throughout
            state = states[0]
            oldest = newest = state.leader_epoch
            lead = node == state.leader
        else:
            oldest = min(s.leader_epoch for s in states)
            newest = max(s.leader_epoch for s in states)
            lead = any(node == s.leader for s in states)
        epoch = outcome.epoch
        if outcome.error == KafkaError.NONE:
            if lead and not 0 <= epoch < oldest:
                continue
            # What the broker acted on (its leadership, or the epoch) was superseded
            # throughout the window: by the record it must have applied to know it.
            superseded = LedByOther(node) if not lead else EpochAbove(epoch)
            applied = cs.metadata_applied(env, node, key, states[0], superseded)
            if applied is None:
                continue  # counted unverified: it may not have applied that record yet
            identity = (header.request_ref, env.ts_ms)
            evidence = [*_evidence(states), *applied]
            if not lead:
                leaders = {s.leader for s in states}
                cs.emit(
                    ProduceAcceptedByNonLeader,
                    env,
                    message=f"broker {node} accepted a produce (acks={acks}) to {cs.describe(key)} "
                    f"while the leader was {sorted(leaders)} for the whole grace window",
                    node=node,
                    identity=identity,
                    evidence=evidence,
                    partition_key=key,
                    severity="critical" if acks == -1 else None,
                )
            elif 0 <= outcome.epoch < oldest:
                cs.emit(
                    ProduceStaleEpochAccepted,
                    env,
                    message=f"leader {node} accepted a produce to {cs.describe(key)} "
                    f"with stale currentLeaderEpoch {outcome.epoch} (leader epoch {oldest})",
                    node=node,
                    identity=identity,
                    evidence=evidence,
                    partition_key=key,
                )
        elif epoch >= 0 and (
            (outcome.error == KafkaError.FENCED_LEADER_EPOCH and epoch >= newest)
            or (outcome.error == KafkaError.UNKNOWN_LEADER_EPOCH and epoch <= oldest)
        ):
            # UNKNOWN_LEADER_EPOCH says the broker had not heard of the epoch: wrong
            # only if it had applied the record that made it (FENCED_LEADER_EPOCH for
            # an epoch not older than the view's says it knew a newer one: no lag).
            applied = (
                cs.metadata_applied(env, node, key, states[0], EpochAbove(epoch - 1))
                if outcome.error == KafkaError.UNKNOWN_LEADER_EPOCH
                else []
            )
            if applied is None:
                continue
            identity = (header.request_ref, env.ts_ms)
            evidence = [*_evidence(states), *applied]
            cs.emit(
                ProduceEpochErrorMismatch,
                env,
                message=f"broker {node} answered {KafkaError(outcome.error).name} "
                f"to a produce to {cs.describe(key)} with currentLeaderEpoch {outcome.epoch} "
                f"while the leader epoch was {oldest if oldest == newest else f'{oldest}..{newest}'}",
                node=node,
                identity=identity,
                evidence=evidence,
                partition_key=key,
            )


def _evidence(states: list[PartitionState]) -> list[Evidence]:
    """The records that set the window's first and last states."""
    return [states[0].source] if len(states) == 1 else [states[0].source, states[-1].source]
