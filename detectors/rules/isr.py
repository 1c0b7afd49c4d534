"""KIP-841 / KIP-903: only active replicas join the ISR or become leader. Judged
on the metadata log itself, where the change takes effect."""

from __future__ import annotations

from typing import TYPE_CHECKING

from detectors.metadata_configs import UNCLEAN_LEADER_ELECTION_ENABLE, parse_boolean
from detectors.rules.base import Rule, register
from detectors.stats import UnverifiedReason
from detectors.view import PartitionChange

if TYPE_CHECKING:
    from detectors.cluster import ClusterState


@register
class IsrIneligibleReplicaAdmitted(Rule):
    """KIP-841, KIP-903. A PARTITION_CHANGE_RECORD, or a new partition's
    PARTITION_RECORD, adds to the ISR a replica that is fenced, in controlled
    shutdown or unregistered; or the controller answers NONE to an AlterPartition
    whose proposed ISR holds such a replica, or one named in ``newIsrWithEpochs``
    at a broker epoch other than its registered one — any member, kept or added,
    as the controller checks every member (rules.alter_partition). Such a
    replica may lack acknowledged data and later be elected. ``node`` is the
    admitted replica (the metadata log does not name its writer). Not a
    violation: a fenced broker that merely stays as the last ISR member (the
    controller's own change record keeps it so the partition can recover);
    re-adding a broker after it was unfenced; a member that was eligible at some
    moment of the AlterPartition's grace window; INELIGIBLE_REPLICA /
    OPERATION_NOT_ATTEMPTED answers; snapshot PARTITION_RECORDs that re-state
    existing partitions (partitionEpoch > 0)."""

    id = "ISR_INELIGIBLE_REPLICA_ADMITTED"
    severity = "critical"
    proposals = ("KIP-841", "KIP-903")


@register
class LeaderIneligibleElected(Rule):
    """KIP-841, KIP-966. A metadata record makes a fenced, shutting-down or
    unregistered broker the partition's leader; or, in a PARTITION_CHANGE_RECORD,
    a broker in neither the ISR nor the ELR the partition had (an unclean
    election, which loses acknowledged records) although the log sets
    ``unclean.leader.election.enable`` false for its topic (the topic's own
    setting, else the controllers' node or cluster default one:
    ClusterView.topic_config). ``node`` is that broker. Not a violation:
    ``leader: -1`` (no leader, e.g. the last ISR member was fenced); a record
    that keeps the current leader while only bumping the epoch; a leader from
    the ELR (KIP-966); an unclean election on a topic whose setting is true
    (the controller does them since Kafka 3.9, KAFKA-12670; before, KRaft
    ignored the setting and only an operator's unclean ElectLeaders made one).
    Counted unverified instead: an unclean election where the log sets nothing
    (a controller's server.properties may allow it) or where ISR and ELR were
    both empty (KIP-966's last-known-leader recovery elects outside them
    whatever the setting). An operator's ``kafka-leader-election.sh
    --election-type unclean`` (ElectLeaders UNCLEAN) overrides the setting and
    leaves the same record: the alert says so."""

    id = "LEADER_INELIGIBLE_ELECTED"
    severity = "critical"
    proposals = ("KIP-841",)


def judge_change(cs: ClusterState, change: PartitionChange) -> None:
    """Judge a partition change at the moment it is applied: metadata records
    arrive in log order, so the latest broker states are the controller's."""
    after, before, env = change.after, change.before, change.env
    if before is None and after.partition_epoch > 0:
        return  # a snapshot re-stating an existing partition, not a decision being made
    for replica in after.isr:
        if before is not None and replica in before.isr:
            continue
        history = cs.view.brokers.get(replica)
        if history is None:
            if cs.view.started_mid_log:
                cs.unverified(UnverifiedReason.BROKER_REGISTRATION_NOT_SEEN)
            else:
                cs.unverified(UnverifiedReason.ISR_MEMBER_UNREGISTERED)
            continue
        broker = history.latest
        why = broker.ineligibility()
        if why:
            cs.emit(
                IsrIneligibleReplicaAdmitted,
                env,
                message=f"replica {replica} was added to the ISR of {cs.describe(change.key)} while {why} "
                f"(partition epoch {after.partition_epoch})",
                node=replica,
                identity=(after.partition_epoch,),
                evidence=[broker.source],
                partition_key=change.key,
            )
    if after.leader >= 0 and (before is None or after.leader != before.leader):
        history = cs.view.brokers.get(after.leader)
        if history is None:
            # In a view started mid-log, its registration came before the view did.
            if cs.view.started_mid_log:
                cs.unverified(UnverifiedReason.BROKER_REGISTRATION_NOT_SEEN)
            else:
                cs.unverified(UnverifiedReason.LEADER_UNREGISTERED)
            return
        broker = history.latest
        why = broker.ineligibility()
        if why:
            cs.emit(
                LeaderIneligibleElected,
                env,
                message=f"broker {after.leader} was elected leader of {cs.describe(change.key)} "
                f"(leader epoch {after.leader_epoch}) while {why}",
                node=after.leader,
                identity=(after.leader_epoch,),
                evidence=[broker.source],
                partition_key=change.key,
            )
        elif before is not None and after.leader not in before.isr and after.leader not in before.elr:
            _judge_unclean_election(cs, change)


def _judge_unclean_election(cs: ClusterState, change: PartitionChange) -> None:
    """A leader elected from outside the ISR and ELR it had: a violation
    where the log says the topic does not allow it (LeaderIneligibleElected)."""
    after, before, env = change.after, change.before, change.env
    assert before is not None
    topic = cs.view.topic_name(change.key[0])
    setting = cs.view.topic_config(topic, UNCLEAN_LEADER_ELECTION_ENABLE) if topic else None
    if setting is not None and parse_boolean(setting[0]):
        return  # the topic allows it (PartitionChangeBuilder.electAnyLeader, Election.UNCLEAN)
    if setting is None or not (before.isr or before.elr):
        cs.unverified(UnverifiedReason.UNCLEAN_ELECTION_UNDECIDED)
        return
    value, source = setting
    cs.emit(
        LeaderIneligibleElected,
        env,
        message=f"broker {after.leader} was elected leader of {cs.describe(change.key)} "
        f"(leader epoch {after.leader_epoch}) from outside its ISR {list(before.isr)} and ELR "
        f"{list(before.elr)}, an unclean election, although {UNCLEAN_LEADER_ELECTION_ENABLE} is "
        f"{value} for it: acknowledged records may be lost (only an operator's unclean "
        "ElectLeaders may do that)",
        node=after.leader,
        identity=(after.leader_epoch,),
        evidence=[before.source, source],
        partition_key=change.key,
    )
