"""CONFIG_RECORD in the view, and unclean leader elections (KIP-966 ELR,
KAFKA-12670) judged by what the log sets for the topic.

Histories start from the standard cluster (conftest.py): orders-0 with ISR
[1, 2, 3], leader 1, leader epoch 0; brokers 1, 2, 3 registered and unfenced.
In each, the ISR shrinks to [1], broker 1 is fenced (the controller leaves
the partition leaderless with ISR [1], KIP-841), and then a change record
elects broker 2, which was in neither the ISR nor the ELR: the record
``PartitionChangeBuilder.tryElection`` writes for an unclean election
(leader 2, ISR [2], leaderRecoveryState RECOVERING).
"""

from __future__ import annotations

from typing import Any

import pytest

from detectors.metadata_configs import MIN_INSYNC_REPLICAS, UNCLEAN_LEADER_ELECTION_ENABLE
from detectors.stats import UnverifiedReason
from producers import shapes as s

TOPIC_TYPE, BROKER_TYPE = 2, 4  # ConfigResource.Type
UNDECIDED = UnverifiedReason.UNCLEAN_ELECTION_UNDECIDED


def config(resource_type: int, resource: str, name: str, value: str | None) -> dict[str, Any]:
    """A CONFIG_RECORD as DumpLogSegments prints it."""
    data = {"resourceType": resource_type, "resourceName": resource, "name": name, "value": value}
    return {"type": "CONFIG_RECORD", "version": 0, "data": data}


def unclean(resource_type: int, resource: str, value: str | None) -> dict[str, Any]:
    return config(resource_type, resource, UNCLEAN_LEADER_ELECTION_ENABLE, value)


def change(history: Any, ts_ms: int, **data: Any) -> None:
    """A PARTITION_CHANGE_RECORD v2 of orders-0 with the fields given as Kafka names them."""
    body = {"partitionId": 0, "topicId": history.topic_id, **data}
    history.metadata(ts_ms, {"type": "PARTITION_CHANGE_RECORD", "version": 2, "data": body})


def leaderless(history: Any) -> None:
    history.change(5000, isr=[1])
    history.metadata(6000, s.broker_change(1, history.broker_epochs[1], fenced=1))
    history.change(6000, leader=-1)


def elect_broker_2_uncleanly(history: Any) -> None:
    change(history, 9000, leader=2, isr=[2], leaderRecoveryState=1)


# ---- the violation ----------------------------------------------------------------------


@pytest.mark.violation("LEADER_INELIGIBLE_ELECTED")
@pytest.mark.parametrize(
    "settings",
    [
        [unclean(TOPIC_TYPE, "orders", "false")],
        [unclean(BROKER_TYPE, "", "false")],
        # The topic's own setting comes first (KafkaConfigSchema.resolveEffectiveTopicConfig).
        [unclean(BROKER_TYPE, "", "true"), unclean(TOPIC_TYPE, "orders", "false")],
        # Deleting the topic's setting leaves the cluster default.
        [
            unclean(BROKER_TYPE, "", "FALSE"),
            unclean(TOPIC_TYPE, "orders", "true"),
            unclean(TOPIC_TYPE, "orders", None),
        ],
    ],
    ids=["topic-false", "cluster-false", "topic-over-cluster", "topic-setting-deleted"],
)
def test_an_unclean_election_the_topic_does_not_allow_is_flagged(cluster, settings):
    for body in settings:
        cluster.metadata(2000, body)
    leaderless(cluster)
    elect_broker_2_uncleanly(cluster)
    outcome = cluster.run()
    assert outcome.keys == [("LEADER_INELIGIBLE_ELECTED", 2, 9000, 0, "orders")]
    alert = outcome.alerts[0]
    assert alert.severity == "critical"
    assert "from outside its ISR [1] and ELR [], an unclean election, although" in alert.message
    assert f"{UNCLEAN_LEADER_ELECTION_ENABLE} is" in alert.message
    # The state it was elected from, the setting that forbade it, the record.
    assert [(e.role, e.ts_ms) for e in alert.evidence] == [
        ("view", 6000),
        ("view", 2000),
        ("violation", 9000),
    ]
    assert "config unclean.leader.election.enable=" in alert.evidence[1].summary


# ---- the look-alikes that are no violation ------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        [unclean(TOPIC_TYPE, "orders", "true")],
        [unclean(BROKER_TYPE, "", "true")],
        [unclean(BROKER_TYPE, "", "false"), unclean(TOPIC_TYPE, "orders", "True")],
        # Every node's own setting and the cluster default agree.
        [unclean(BROKER_TYPE, "", "true"), unclean(BROKER_TYPE, "3000", "true")],
    ],
    ids=["topic-true", "cluster-true", "topic-over-cluster", "nodes-agree"],
)
def test_an_unclean_election_the_topic_allows_is_no_violation(cluster, settings):
    for body in settings:
        cluster.metadata(2000, body)
    leaderless(cluster)
    elect_broker_2_uncleanly(cluster)
    outcome = cluster.run()
    assert outcome.keys == []
    assert outcome.counters.unverified.get(UNDECIDED, 0) == 0


def test_a_leader_from_the_elr_is_a_clean_election(cluster):
    """KIP-966: with the ISR empty, a member of the ELR is a valid new leader
    (PartitionChangeBuilder.isValidNewLeader), whatever the unclean setting."""
    cluster.metadata(2000, unclean(TOPIC_TYPE, "orders", "false"))
    change(cluster, 5000, isr=[1], eligibleLeaderReplicas=[2])
    cluster.metadata(6000, s.broker_change(1, 10, fenced=1))
    change(cluster, 6000, leader=-1, isr=[], eligibleLeaderReplicas=[1, 2])
    change(cluster, 9000, leader=2, isr=[2], eligibleLeaderReplicas=[1])
    outcome = cluster.run()
    assert outcome.keys == []
    assert outcome.counters.unverified.get(UNDECIDED, 0) == 0


def test_a_clean_election_from_the_isr_is_no_violation(cluster):
    cluster.metadata(2000, unclean(TOPIC_TYPE, "orders", "false"))
    cluster.metadata(5000, s.broker_change(1, 10, fenced=1))
    cluster.change(5000, leader=2, isr=[2, 3])
    outcome = cluster.run()
    assert outcome.keys == []
    assert outcome.counters.unverified.get(UNDECIDED, 0) == 0


# ---- what the log cannot decide ----------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        [],  # set nowhere: the controllers' server.properties decide
        # A node's own setting differs from the default the others have: only
        # the active controller's counts, and the view does not follow which it is.
        [unclean(BROKER_TYPE, "", "false"), unclean(BROKER_TYPE, "3000", "true")],
        # Another topic's setting says nothing of this one.
        [unclean(TOPIC_TYPE, "payments", "false")],
    ],
    ids=["set-nowhere", "nodes-differ", "other-topic"],
)
def test_an_unclean_election_the_log_does_not_decide_is_counted_unverified(cluster, settings):
    for body in settings:
        cluster.metadata(2000, body)
    leaderless(cluster)
    elect_broker_2_uncleanly(cluster)
    outcome = cluster.run()
    assert outcome.keys == []
    assert outcome.counters.unverified[UNDECIDED] == 1


def test_an_election_with_isr_and_elr_both_empty_is_counted_unverified(cluster):
    """KIP-966's last-known-leader recovery (PartitionChangeBuilder.canElectLastKnownLeader)
    elects outside an empty ISR and ELR whatever the setting, from a field the view
    does not keep."""
    cluster.metadata(2000, unclean(TOPIC_TYPE, "orders", "false"))
    cluster.change(5000, isr=[1])
    cluster.metadata(6000, s.broker_change(1, 10, fenced=1))
    change(cluster, 6000, leader=-1, isr=[], eligibleLeaderReplicas=[], lastKnownElr=[2])
    change(cluster, 9000, leader=2, isr=[2], leaderRecoveryState=1)
    outcome = cluster.run()
    assert outcome.keys == []
    assert outcome.counters.unverified[UNDECIDED] == 1


# ---- the view keeps what the rules read --------------------------------------------------


def test_the_view_keeps_min_insync_replicas_and_unclean_election_per_topic_and_cluster(cluster):
    cluster.metadata(2000, config(BROKER_TYPE, "", MIN_INSYNC_REPLICAS, "1"))
    cluster.metadata(2000, config(TOPIC_TYPE, "orders", MIN_INSYNC_REPLICAS, "2"))
    cluster.metadata(2000, unclean(TOPIC_TYPE, "orders", "true"))
    cluster.metadata(2000, config(TOPIC_TYPE, "orders", "retention.ms", "1000"))  # not read
    cluster.metadata(2000, config(8, "root", MIN_INSYNC_REPLICAS, "3"))  # BROKER_LOGGER: not a config
    view = cluster.run().view

    def value(topic: str, name: str) -> str | None:
        setting = view.topic_config(topic, name)
        return setting[0] if setting else None

    assert value("orders", MIN_INSYNC_REPLICAS) == "2"
    assert value("orders", UNCLEAN_LEADER_ELECTION_ENABLE) == "true"
    assert value("payments", MIN_INSYNC_REPLICAS) == "1"  # the cluster default
    assert value("payments", UNCLEAN_LEADER_ELECTION_ENABLE) is None  # set nowhere
    assert set(view.configs) == {(BROKER_TYPE, ""), (TOPIC_TYPE, "orders")}
    assert set(view.configs[(TOPIC_TYPE, "orders")]) == {MIN_INSYNC_REPLICAS, UNCLEAN_LEADER_ELECTION_ENABLE}


def test_a_removed_topics_configs_go_with_it(cluster):
    """ConfigurationControlManager.deleteTopicConfigs: a topic created again under
    the same name starts from the cluster default."""
    cluster.metadata(2000, unclean(BROKER_TYPE, "", "false"))
    cluster.metadata(2000, unclean(TOPIC_TYPE, "orders", "true"))
    cluster.metadata(
        3000, {"type": "REMOVE_TOPIC_RECORD", "version": 0, "data": {"topicId": cluster.topic_id}}
    )
    view = cluster.run().view
    setting = view.topic_config("orders", UNCLEAN_LEADER_ELECTION_ENABLE)
    assert setting is not None and setting[0] == "false"
