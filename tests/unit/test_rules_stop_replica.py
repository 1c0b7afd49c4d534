"""KIP-570 rules: the leader epoch (and its -2 deletion sentinel) in
StopReplicaRequest v3+, and controller-epoch fencing of StopReplica.

The standard cluster's orders-0 moves to leader epoch 1 at ``ELECTION_MS``
(``elect_broker_2``); the broker receiving StopReplica is broker 3.
"""

from __future__ import annotations

from typing import Any

import pytest

from detectors.errors import KafkaError
from producers import shapes as s

NONE = KafkaError.NONE
FENCED = KafkaError.FENCED_LEADER_EPOCH
ELECTION_MS = 10_000
WITHIN_GRACE_MS = 11_000
PAST_GRACE_MS = 13_000
BROKER = 3


def elect_broker_2(history: Any) -> None:
    history.change(ELECTION_MS, leader=2)  # leader epoch 0 -> 1


# ---- STOP_REPLICA_STALE_EPOCH_APPLIED -------------------------------------------------------


@pytest.mark.violation("STOP_REPLICA_STALE_EPOCH_APPLIED")
@pytest.mark.parametrize("delete", [False, True])
def test_stale_stop_replica_applied_past_grace_is_flagged(cluster, delete):
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, BROKER, s.stop_replica("orders", 0, 0, NONE, delete=delete))
    outcome = cluster.run()
    assert outcome.keys == [("STOP_REPLICA_STALE_EPOCH_APPLIED", BROKER, PAST_GRACE_MS, 0, "orders")]
    assert outcome.alerts[0].severity == "critical"
    assert ("deleted the partition" in outcome.alerts[0].message) is delete


def test_stop_replica_with_the_current_epoch_is_allowed(cluster):
    """KIP-570: an epoch equal to the broker's is accepted."""
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, BROKER, s.stop_replica("orders", 0, 1, NONE))
    assert cluster.keys() == []


def test_stale_stop_replica_answered_fenced_is_fencing_working(cluster):
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, BROKER, s.stop_replica("orders", 0, 0, FENCED))
    assert cluster.keys() == []


def test_old_epoch_within_grace_after_the_bump_is_not_a_violation(cluster):
    elect_broker_2(cluster)
    cluster.request(WITHIN_GRACE_MS, BROKER, s.stop_replica("orders", 0, 0, NONE))
    assert cluster.keys() == []


def test_stop_replica_without_an_epoch_is_not_judged(cluster):
    """-1: a controller still on a pre-v3 version sends no epoch."""
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, BROKER, s.stop_replica("orders", 0, -1, NONE))
    assert cluster.keys() == []


# ---- STOP_REPLICA_DELETE_SENTINEL_REJECTED --------------------------------------------------


@pytest.mark.violation("STOP_REPLICA_DELETE_SENTINEL_REJECTED")
def test_deletion_sentinel_answered_fenced_leader_epoch_is_flagged(cluster):
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, BROKER, s.stop_replica("orders", 0, -2, FENCED, delete=True))
    outcome = cluster.run()
    assert outcome.keys == [("STOP_REPLICA_DELETE_SENTINEL_REJECTED", BROKER, PAST_GRACE_MS, 0, "orders")]
    assert outcome.alerts[0].topic_id == cluster.topic_id


@pytest.mark.violation("STOP_REPLICA_DELETE_SENTINEL_REJECTED")
def test_deletion_sentinel_rejected_after_the_topic_was_removed_is_flagged(cluster):
    """The controller removes the topic, then sends StopReplica(-2)."""
    cluster.metadata(5000, s.remove_topic(cluster.topic_id))
    cluster.request(5100, BROKER, s.stop_replica("orders", 0, -2, FENCED, delete=True))
    assert cluster.keys() == [("STOP_REPLICA_DELETE_SENTINEL_REJECTED", BROKER, 5100, 0, "orders")]


@pytest.mark.parametrize("error", [NONE, KafkaError.KAFKA_STORAGE_ERROR])
def test_deletion_sentinel_applied_or_failing_for_another_reason_is_not_a_violation(cluster, error):
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, BROKER, s.stop_replica("orders", 0, -2, error, delete=True))
    assert cluster.keys() == []


# ---- STOP_REPLICA_CURRENT_EPOCH_REJECTED ----------------------------------------------------


@pytest.mark.violation("STOP_REPLICA_CURRENT_EPOCH_REJECTED")
@pytest.mark.parametrize("epoch", [pytest.param(1, id="current"), pytest.param(2, id="newer")])
def test_current_or_newer_epoch_answered_fenced_is_flagged(cluster, epoch):
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, BROKER, s.stop_replica("orders", 0, epoch, FENCED))
    assert cluster.keys() == [("STOP_REPLICA_CURRENT_EPOCH_REJECTED", BROKER, PAST_GRACE_MS, 0, "orders")]


def test_fenced_for_an_epoch_superseded_within_grace_is_not_a_violation(cluster):
    """At WITHIN_GRACE_MS the broker may already hold epoch 1, so 0 is older."""
    elect_broker_2(cluster)
    cluster.request(WITHIN_GRACE_MS, BROKER, s.stop_replica("orders", 0, 0, FENCED))
    assert cluster.keys() == []


# ---- STOP_REPLICA_STALE_CONTROLLER_ACCEPTED -------------------------------------------------


@pytest.mark.violation("STOP_REPLICA_STALE_CONTROLLER_ACCEPTED")
def test_broker_accepting_an_older_controller_epoch_after_a_newer_one_is_flagged(cluster):
    cluster.request(5000, BROKER, s.stop_replica("orders", 0, 0, NONE, controller_epoch=2))
    cluster.request(6000, BROKER, s.stop_replica("orders", 0, 0, NONE, controller_epoch=1))
    outcome = cluster.run()
    assert outcome.keys == [("STOP_REPLICA_STALE_CONTROLLER_ACCEPTED", BROKER, 6000, None, None)]
    assert [e.ts_ms for e in outcome.alerts[0].evidence] == [5000, 6000]


@pytest.mark.violation("STOP_REPLICA_STALE_CONTROLLER_ACCEPTED")
def test_controller_epoch_learned_from_leader_and_isr_fences_stop_replica(cluster):
    """ZooKeeper mode: an accepted LeaderAndIsr also raises the broker's controller epoch."""
    leader_and_isr = {
        "requestHeader": {
            "requestApiKey": 4,
            "requestApiVersion": 6,
            "correlationId": 1,
            "clientId": "controller-3000",
        },
        "request": {
            "controllerId": 3000,
            "controllerEpoch": 5,
            "brokerEpoch": 12,
            "topicStates": [
                {
                    "topicName": "orders",
                    "topicId": cluster.topic_id,
                    "partitionStates": [
                        {
                            "partitionIndex": 0,
                            "controllerEpoch": 5,
                            "leader": 1,
                            "leaderEpoch": 0,
                            "isr": [1, 2, 3],
                            "partitionEpoch": 0,
                            "replicas": [1, 2, 3],
                        }
                    ],
                }
            ],
        },
        "response": {
            "errorCode": 0,
            "topics": [
                {"topicId": cluster.topic_id, "partitionErrors": [{"partitionIndex": 0, "errorCode": 0}]}
            ],
        },
    }
    cluster.request(5000, BROKER, leader_and_isr)
    cluster.request(6000, BROKER, s.stop_replica("orders", 0, 0, NONE, controller_epoch=4))
    assert cluster.keys() == [("STOP_REPLICA_STALE_CONTROLLER_ACCEPTED", BROKER, 6000, None, None)]


def test_old_controller_epoch_at_a_broker_that_has_not_heard_the_new_one_is_allowed(cluster):
    cluster.request(5000, 2, s.stop_replica("orders", 0, 0, NONE, controller_epoch=2))
    cluster.request(6000, BROKER, s.stop_replica("orders", 0, 0, NONE, controller_epoch=1))
    assert cluster.keys() == []


def test_older_controller_epoch_answered_stale_controller_epoch_is_fencing_working(cluster):
    cluster.request(5000, BROKER, s.stop_replica("orders", 0, 0, NONE, controller_epoch=2))
    stale = s.stop_replica(
        "orders", 0, 0, NONE, controller_epoch=1, top_error=KafkaError.STALE_CONTROLLER_EPOCH
    )
    cluster.request(6000, BROKER, stale)
    assert cluster.keys() == []


def test_same_controller_epoch_again_is_allowed(cluster):
    cluster.request(5000, BROKER, s.stop_replica("orders", 0, 0, NONE, controller_epoch=2))
    cluster.request(6000, BROKER, s.stop_replica("orders", 0, 0, NONE, controller_epoch=2))
    assert cluster.keys() == []
