"""KIP-841 / KIP-903: the controller's AlterPartition answers, judged on the
controller's request log."""

from __future__ import annotations

from typing import TYPE_CHECKING

from detectors.envelope import Envelope
from detectors.errors import KafkaError
from detectors.requests import AlterPartition, AlterPartitionEntry, Header
from detectors.rules.base import Rule, register
from detectors.rules.isr import IsrIneligibleReplicaAdmitted
from detectors.stats import UnverifiedReason
from detectors.view import BrokerState, PartitionKey, PartitionState

if TYPE_CHECKING:
    from detectors.cluster import ClusterState

V2_ONLY_ERRORS = (KafkaError.INELIGIBLE_REPLICA, KafkaError.NEW_LEADER_ELECTED, KafkaError.UNKNOWN_TOPIC_ID)


@register
class AlterPartitionStaleEpochAccepted(Rule):
    """KIP-841. The controller answered NONE to an AlterPartition whose
    ``leaderEpoch`` or ``partitionEpoch`` is older than the partition's state
    just before the change it made: a deposed leader rewrote the ISR. Not a
    violation: FENCED_LEADER_EPOCH / INVALID_UPDATE_VERSION answers; a request
    whose epochs match the state it replaced (its own change record may be
    logged before the request)."""

    id = "ALTER_PARTITION_STALE_EPOCH_ACCEPTED"
    severity = "critical"
    proposals = ("KIP-841",)


@register
class AlterPartitionStaleBrokerEpochAccepted(Rule):
    """KIP-903. The controller answered NONE to an AlterPartition whose
    ``brokerEpoch`` (not -1) matches none of the sender's registered epochs in
    the grace window (both ways: a failover can hand the controller role to a
    node whose clock runs behind the one that logged the registration): a
    previous incarnation of the broker changed the ISR.
    ``node`` is the controller. Not a violation: -1 (older senders); the epoch
    of a registration replaced within the grace window; STALE_BROKER_EPOCH
    answers."""

    id = "ALTER_PARTITION_STALE_BROKER_EPOCH_ACCEPTED"
    severity = "critical"
    proposals = ("KIP-903",)


@register
class AlterPartitionErrorVersionMismatch(Rule):
    """KIP-841. INELIGIBLE_REPLICA, NEW_LEADER_ELECTED or UNKNOWN_TOPIC_ID answered
    to a request below version 2 (older brokers cannot parse them), or
    OPERATION_NOT_ATTEMPTED answered for an ineligible ISR to version 2+
    (which must get INELIGIBLE_REPLICA). Not a violation: OPERATION_NOT_ATTEMPTED
    to v0/v1 for an ineligible replica — that is exactly what KIP-841 asks."""

    id = "ALTER_PARTITION_ERROR_VERSION_MISMATCH"
    severity = "warning"
    proposals = ("KIP-841",)


def judge(
    cs: ClusterState, env: Envelope, header: Header, request: AlterPartition, home: bool = True
) -> None:
    """Judges the partitions of this detector's bucket; the broker epoch, which
    is the request's, in the request's home bucket (detectors.buckets)."""
    if request.error != KafkaError.NONE:
        return  # the whole request was rejected: fencing working
    identity = (header.request_ref, env.ts_ms)
    if home and request.broker_epoch != -1 and any(p.error == KafkaError.NONE for p in request.partitions):
        window = cs.judged_window(env)
        states = cs.view.broker_window(request.broker_id, *window) if window else None
        if states is None:
            pass  # counted as clock uncertain
        elif window and cs.view.broker_unseen_at(request.broker_id, window[0]):
            # Only epochs the view saw fill the window: an older one may have held then.
            cs.unverified(UnverifiedReason.BROKER_REGISTRATION_NOT_SEEN)
        elif not states:
            cs.unverified(UnverifiedReason.UNKNOWN_BROKER)
        elif all(s.epoch != request.broker_epoch for s in states):
            cs.emit(
                AlterPartitionStaleBrokerEpochAccepted,
                env,
                message=f"controller {env.node} accepted an AlterPartition from broker "
                f"{request.broker_id} with stale broker epoch {request.broker_epoch} "
                f"(registered: {states[-1].epoch})",
                node=env.node,
                identity=identity,
                evidence=[states[-1].source],
            )
    for entry in cs.bucket.owned(request.partitions):
        _judge_version(cs, env, header, entry)
        if entry.error == KafkaError.NONE:
            _judge_accepted(cs, env, header, entry)


def _judge_version(cs: ClusterState, env: Envelope, header: Header, entry: AlterPartitionEntry) -> None:
    if entry.error is None:
        return
    wrong = None
    if header.api_version < 2 and entry.error in V2_ONLY_ERRORS:
        wrong = f"{KafkaError(entry.error).name} to AlterPartition v{header.api_version}"
    elif header.api_version >= 2 and entry.error == KafkaError.OPERATION_NOT_ATTEMPTED:
        # The controller's own answer, judged at its own time placed in the
        # metadata log's: ineligible throughout its handling.
        handled = cs.controller_handled(env)
        ineligible = [
            r
            for r in entry.new_isr
            if (states := cs.view.broker_window(r, *handled)) and all(s.ineligibility() for s in states)
        ]
        if ineligible:
            wrong = (
                f"OPERATION_NOT_ATTEMPTED instead of INELIGIBLE_REPLICA to AlterPartition "
                f"v{header.api_version} (ineligible: {ineligible})"
            )
    if wrong:
        key = cs.view.topic_key(entry.topic, entry.topic_id, env.ts_ms)
        cs.emit(
            AlterPartitionErrorVersionMismatch,
            env,
            message=f"controller {env.node} answered {wrong} for {cs.describe((key, entry.partition))}",
            node=env.node,
            identity=(header.request_ref, env.ts_ms),
            partition_key=(key, entry.partition),
        )


def _judge_accepted(cs: ClusterState, env: Envelope, header: Header, entry: AlterPartitionEntry) -> None:
    found = cs.partition_window(entry.topic, entry.topic_id, entry.partition, env)
    if found is None:
        return
    key, _ = found
    history = cs.view.partition(key)
    assert history is not None
    # The controller is the authority: no grace, the state it replaced or held
    # then, its time placed in the metadata log's (the earliest: the oldest state).
    arrival, completion = cs.controller_handled(env)
    before = _state_replaced(cs, key, completion, entry.result_partition_epoch) or history.at(arrival)
    if before is not None and (
        entry.leader_epoch < before.leader_epoch or entry.partition_epoch < before.partition_epoch
    ):
        cs.emit(
            AlterPartitionStaleEpochAccepted,
            env,
            message=f"controller {env.node} accepted an AlterPartition for {cs.describe(key)} "
            f"with leaderEpoch {entry.leader_epoch}/partitionEpoch {entry.partition_epoch} "
            f"while the partition was at {before.leader_epoch}/{before.partition_epoch}",
            node=env.node,
            identity=(header.request_ref, env.ts_ms),
            evidence=[before.source],
            partition_key=key,
        )
    _judge_isr_members(cs, env, entry, key)


def _judge_isr_members(
    cs: ClusterState, env: Envelope, entry: AlterPartitionEntry, key: PartitionKey
) -> None:
    """KIP-841 / KIP-903 as Kafka's controller enforces them
    (ReplicationControlManager.validateAlterPartitionData, via
    ineligibleReplicasForIsr): it rejects the request if ANY member of the
    proposed ISR, kept or added, is unregistered, in controlled shutdown, fenced,
    or named in ``newIsrWithEpochs`` with a broker epoch (not -1) other than its
    registered one. Registrations change between the controller's check and the
    completion line, and clocks differ: a member counts as ineligible only if it
    was so at every moment of the grace window."""
    window = cs.judged_window(env)
    if window is None:
        return
    for replica in entry.new_isr:
        epoch = entry.isr_epochs.get(replica, -1)
        if cs.view.broker_unseen_at(replica, window[0]):
            cs.unverified(UnverifiedReason.BROKER_REGISTRATION_NOT_SEEN)
            continue
        states = cs.view.broker_window(replica, *window)
        if not states:
            cs.unverified(UnverifiedReason.ISR_MEMBER_UNREGISTERED)
            continue
        reasons = [_ineligibility(s, epoch) for s in states]
        if not all(reasons):
            continue
        # The identity and node of isr.judge_change: when the controller's change
        # record for this answer adds the replica, both name one violation, one alert.
        cs.emit(
            IsrIneligibleReplicaAdmitted,
            env,
            message=f"controller {env.node} accepted an AlterPartition for {cs.describe(key)} "
            f"although its new ISR holds replica {replica} ({reasons[-1]})",
            node=replica,
            identity=(entry.result_partition_epoch,),
            evidence=[states[-1].source],
            partition_key=key,
        )


def _ineligibility(broker: BrokerState, epoch: int) -> str | None:
    """Why the controller must refuse ``broker`` in a proposed ISR that names it
    at broker ``epoch`` (-1: none named), or None."""
    why = broker.ineligibility()
    if why is None and epoch != -1 and broker.epoch != epoch:
        why = f"stale broker epoch {epoch}, registered {broker.epoch}"
    return why


def _state_replaced(
    cs: ClusterState, key: tuple[str, int], ts_ms: int, result_epoch: int
) -> PartitionState | None:
    """The partition state this request's own change replaced: the change record
    may be logged (and applied) just before the request's completion line."""
    if result_epoch < 1:
        return None
    history = cs.view.partition(key)
    if history is None:
        return None
    for state in history.window(ts_ms - cs.config.retention_ms, ts_ms + cs.config.grace_ms):
        if state.partition_epoch == result_epoch - 1:
            return state
    return None
