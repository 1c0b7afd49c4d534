"""KIP-359 / KIP-320 rules: leader epochs in Produce, Fetch, ListOffsets and
OffsetForLeaderEpoch, and writes accepted by a broker that is not the leader.

Every history starts from the standard cluster (conftest.py): partition
orders-0 led by broker 1 in leader epoch 0. ``elect_broker_2`` moves the
leadership to broker 2 (leader epoch 1) at ``ELECTION_MS``; with the default
grace of 2000 ms, events before ``PAST_GRACE_MS`` may still act on epoch 0.
"""

from __future__ import annotations

from typing import Any

import pytest

from detectors.config import DetectorConfig
from detectors.errors import KafkaError
from producers import shapes as s

NONE = KafkaError.NONE
FENCED = KafkaError.FENCED_LEADER_EPOCH
UNKNOWN = KafkaError.UNKNOWN_LEADER_EPOCH
ELECTION_MS = 10_000
WITHIN_GRACE_MS = 11_000
PAST_GRACE_MS = 13_000


def elect_broker_2(history: Any) -> None:
    history.change(ELECTION_MS, leader=2)  # leader epoch 0 -> 1


def offset_for_leader_epoch(topic: str, index: int, error: int, *, epoch: int) -> dict[str, Any]:
    """An OFFSET_FOR_LEADER_EPOCH (key 23, v4) request-log body; shapes has none."""
    return {
        "isForwarded": False,
        "requestHeader": {
            "requestApiKey": 23,
            "requestApiVersion": 4,
            "correlationId": 1,
            "clientId": "consumer-1",
            "requestApiKeyName": "OFFSET_FOR_LEADER_EPOCH",
        },
        "request": {
            "replicaId": -1,
            "topics": [
                {
                    "topic": topic,
                    "partitions": [{"partition": index, "currentLeaderEpoch": epoch, "leaderEpoch": epoch}],
                }
            ],
        },
        "response": {
            "throttleTimeMs": 0,
            "topics": [
                {
                    "topic": topic,
                    "partitions": [
                        {"errorCode": error, "partition": index, "leaderEpoch": epoch, "endOffset": 100}
                    ],
                }
            ],
        },
        "connection": "127.0.0.1:9092-127.0.0.1:53422-0",
        "totalTimeMs": 0.5,
    }


READS = {
    "fetch": lambda topic, error, epoch: s.fetch(topic, 0, error, epoch=epoch),
    "list_offsets": lambda topic, error, epoch: s.list_offsets(topic, 0, error, epoch=epoch),
    "offset_for_leader_epoch": lambda topic, error, epoch: offset_for_leader_epoch(
        topic, 0, error, epoch=epoch
    ),
}


# ---- PRODUCE_STALE_EPOCH_ACCEPTED -----------------------------------------------------------


@pytest.mark.violation("PRODUCE_STALE_EPOCH_ACCEPTED")
def test_leader_accepting_a_produce_with_a_stale_epoch_past_grace_is_flagged(cluster):
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, 2, s.produce("orders", 0, NONE, epoch=0))
    outcome = cluster.run()
    assert outcome.keys == [("PRODUCE_STALE_EPOCH_ACCEPTED", 2, PAST_GRACE_MS, 0, "orders")]
    assert outcome.alerts[0].severity == "warning"


def test_leader_answering_fenced_leader_epoch_to_a_stale_produce_is_fencing_working(cluster):
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, 2, s.produce("orders", 0, FENCED, epoch=0))
    assert cluster.keys() == []


def test_new_leader_accepting_the_old_epoch_within_grace_is_not_a_violation(cluster):
    """The new leader may not have applied the bump when the request came in."""
    elect_broker_2(cluster)
    cluster.request(WITHIN_GRACE_MS, 2, s.produce("orders", 0, NONE, epoch=0))
    assert cluster.keys() == []


def test_new_leader_accepting_shortly_before_the_election_record_time_is_not_a_violation(cluster):
    """The broker's clock and the controller's may differ by up to grace_ms."""
    cluster.request(ELECTION_MS - 500, 2, s.produce("orders", 0, NONE, epoch=1))
    elect_broker_2(cluster)
    assert cluster.keys() == []


def test_produce_without_current_leader_epoch_is_not_judged_on_epochs(cluster):
    """Stock Kafka clients never send KIP-359's field."""
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, 2, s.produce("orders", 0, NONE, epoch=None))
    cluster.request(PAST_GRACE_MS, 2, s.produce("orders", 0, NONE, epoch=-1))
    assert cluster.keys() == []


def test_produce_with_the_current_epoch_is_not_a_violation(cluster):
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, 2, s.produce("orders", 0, NONE, epoch=1))
    assert cluster.keys() == []


# ---- PRODUCE_ACCEPTED_BY_NON_LEADER ---------------------------------------------------------


@pytest.mark.violation("PRODUCE_ACCEPTED_BY_NON_LEADER")
@pytest.mark.parametrize(("acks", "severity"), [(-1, "critical"), (1, "warning"), (0, "warning")])
def test_old_leader_accepting_a_produce_past_grace_is_flagged(cluster, acks, severity):
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, 1, s.produce("orders", 0, NONE, acks=acks))
    outcome = cluster.run()
    assert outcome.keys == [("PRODUCE_ACCEPTED_BY_NON_LEADER", 1, PAST_GRACE_MS, 0, "orders")]
    assert outcome.alerts[0].severity == severity


@pytest.mark.violation("PRODUCE_ACCEPTED_BY_NON_LEADER")
def test_non_leader_acceptance_wins_over_the_stale_epoch_rule(cluster):
    """A zombie leader with its old epoch is one violation, the non-leader one."""
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, 1, s.produce("orders", 0, NONE, epoch=0))
    assert cluster.keys() == [("PRODUCE_ACCEPTED_BY_NON_LEADER", 1, PAST_GRACE_MS, 0, "orders")]


@pytest.mark.violation("PRODUCE_ACCEPTED_BY_NON_LEADER")
def test_a_follower_that_was_never_leader_accepting_a_produce_is_flagged(cluster):
    cluster.request(5000, 3, s.produce("orders", 0, NONE))
    assert cluster.keys() == [("PRODUCE_ACCEPTED_BY_NON_LEADER", 3, 5000, 0, "orders")]


def test_old_leader_accepting_within_grace_after_the_election_is_not_a_violation(cluster):
    """Brokers apply metadata late: broker 1 may not know yet that it was deposed."""
    elect_broker_2(cluster)
    cluster.request(WITHIN_GRACE_MS, 1, s.produce("orders", 0, NONE, epoch=0))
    cluster.request(ELECTION_MS + cluster.config.grace_ms - 1, 1, s.produce("orders", 0, NONE))
    assert cluster.keys() == []


def test_old_leader_answering_not_leader_or_follower_is_fencing_working(cluster):
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, 1, s.produce("orders", 0, KafkaError.NOT_LEADER_OR_FOLLOWER))
    assert cluster.keys() == []


def test_grace_window_is_configurable(make_history):
    """The same late acceptance is a violation once grace_ms is shorter than its delay."""
    history = make_history(DetectorConfig(grace_ms=500))
    elect_broker_2(history)
    history.request(WITHIN_GRACE_MS, 1, s.produce("orders", 0, NONE))
    assert history.keys() == [("PRODUCE_ACCEPTED_BY_NON_LEADER", 1, WITHIN_GRACE_MS, 0, "orders")]


# ---- PRODUCE_EPOCH_ERROR_MISMATCH -----------------------------------------------------------


@pytest.mark.violation("PRODUCE_EPOCH_ERROR_MISMATCH")
@pytest.mark.parametrize(
    ("elect", "node", "error", "epoch"),
    [
        pytest.param(False, 1, FENCED, 0, id="fenced-for-the-current-epoch"),
        pytest.param(False, 1, FENCED, 1, id="fenced-for-a-newer-epoch"),
        pytest.param(True, 2, UNKNOWN, 0, id="unknown-for-an-older-epoch"),
        pytest.param(True, 2, UNKNOWN, 1, id="unknown-for-the-current-epoch"),
    ],
)
def test_epoch_error_contradicting_the_epochs_is_flagged(cluster, elect, node, error, epoch):
    if elect:
        elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, node, s.produce("orders", 0, error, epoch=epoch))
    assert cluster.keys() == [("PRODUCE_EPOCH_ERROR_MISMATCH", node, PAST_GRACE_MS, 0, "orders")]


@pytest.mark.parametrize(
    ("ts_ms", "error", "epoch"),
    [
        pytest.param(PAST_GRACE_MS, FENCED, 0, id="fenced-for-an-older-epoch"),
        pytest.param(PAST_GRACE_MS, UNKNOWN, 2, id="unknown-for-a-newer-epoch"),
        pytest.param(WITHIN_GRACE_MS, UNKNOWN, 1, id="unknown-while-the-bump-is-applied"),
        pytest.param(WITHIN_GRACE_MS, FENCED, 0, id="fenced-once-the-bump-is-applied"),
    ],
)
def test_epoch_errors_that_match_the_epochs_are_not_violations(cluster, ts_ms, error, epoch):
    elect_broker_2(cluster)
    cluster.request(ts_ms, 2, s.produce("orders", 0, error, epoch=epoch))
    assert cluster.keys() == []


def test_epoch_errors_without_a_request_epoch_are_not_judged(cluster):
    cluster.request(5000, 1, s.produce("orders", 0, FENCED))
    cluster.request(5000, 1, s.produce("orders", 0, UNKNOWN))
    assert cluster.keys() == []


# ---- FETCH_STALE_EPOCH_SERVED ---------------------------------------------------------------


@pytest.mark.violation("FETCH_STALE_EPOCH_SERVED")
@pytest.mark.parametrize("api", sorted(READS))
def test_read_with_a_stale_epoch_answered_none_past_grace_is_flagged(cluster, api):
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, 2, READS[api]("orders", NONE, 0))
    outcome = cluster.run()
    assert outcome.keys == [("FETCH_STALE_EPOCH_SERVED", 2, PAST_GRACE_MS, 0, "orders")]
    assert outcome.alerts[0].severity == "warning"


@pytest.mark.parametrize("api", sorted(READS))
def test_read_with_a_stale_epoch_within_grace_is_not_a_violation(cluster, api):
    elect_broker_2(cluster)
    cluster.request(WITHIN_GRACE_MS, 2, READS[api]("orders", NONE, 0))
    assert cluster.keys() == []


@pytest.mark.parametrize("api", sorted(READS))
def test_read_with_a_stale_epoch_answered_fenced_is_fencing_working(cluster, api):
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, 2, READS[api]("orders", FENCED, 0))
    assert cluster.keys() == []


@pytest.mark.parametrize("api", sorted(READS))
def test_read_without_an_epoch_or_with_the_current_one_is_not_a_violation(cluster, api):
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, 2, READS[api]("orders", NONE, -1))
    cluster.request(PAST_GRACE_MS, 2, READS[api]("orders", NONE, 1))
    assert cluster.keys() == []


def test_metadata_quorum_fetch_with_an_old_epoch_is_left_to_the_quorum_rules(cluster):
    """A FETCH of __cluster_metadata is a Raft fetch, not a partition read."""
    elect_broker_2(cluster)
    cluster.request(PAST_GRACE_MS, 3000, s.quorum_fetch(3000, 0, 1))
    outcome = cluster.run()
    assert outcome.keys == []
    assert outcome.counters.unverified == {}
