"""KIP-841 / KIP-903 rules: ineligible replicas must not join the ISR or be
elected, and the controller's AlterPartition answers must fence stale leaders,
stale broker epochs and speak the request's version.

Histories start from the standard cluster (conftest.py): orders-0 with ISR
[1, 2, 3], leader 1, leader epoch 0, partition epoch 0; brokers 1, 2, 3 at
broker epochs 10, 11, 12. AlterPartition lines are logged by the controller.
"""

from __future__ import annotations

from typing import Any

import pytest

from detectors.config import DetectorConfig
from detectors.errors import KafkaError
from producers import shapes as s

NONE = KafkaError.NONE

# Ways a broker becomes ineligible for the ISR / leadership (KIP-841).
INELIGIBLE = {
    "fenced": lambda broker, epoch: s.broker_change(broker, epoch, fenced=1),
    "controlled-shutdown": lambda broker, epoch: s.broker_change(broker, epoch, shutdown=True),
    "unregistered": lambda broker, epoch: s.unregister_broker(broker, epoch),
}


def make_ineligible(history: Any, ts_ms: int, broker: int, how: str) -> None:
    history.metadata(ts_ms, INELIGIBLE[how](broker, history.broker_epochs[broker]))


def alter_partition(history: Any, ts_ms: int, *, controller: int | None = None, **fields: Any) -> None:
    """An AlterPartition from leader 1 for orders-0, logged by ``controller``
    (default: the history's)."""
    request: dict[str, Any] = {"broker_id": 1, "broker_epoch": 10, **fields}
    body = s.alter_partition(history.topic, history.topic_id, 0, **request)
    history.request(ts_ms, history.controller if controller is None else controller, body)


# ---- ISR_INELIGIBLE_REPLICA_ADMITTED --------------------------------------------------------


@pytest.mark.violation("ISR_INELIGIBLE_REPLICA_ADMITTED")
@pytest.mark.parametrize("how", sorted(INELIGIBLE))
def test_ineligible_replica_added_to_the_isr_is_flagged(cluster, how):
    cluster.change(5000, isr=[1, 2])
    make_ineligible(cluster, 6000, 3, how)
    cluster.change(7000, isr=[1, 2, 3])
    outcome = cluster.run()
    assert outcome.keys == [("ISR_INELIGIBLE_REPLICA_ADMITTED", 3, 7000, 0, "orders")]
    assert outcome.alerts[0].severity == "critical"
    evidence = outcome.alerts[0].evidence
    assert [(e.role, e.ts_ms) for e in evidence] == [("view", 6000), ("violation", 7000)]


@pytest.mark.violation("ISR_INELIGIBLE_REPLICA_ADMITTED")
def test_new_partition_created_with_a_fenced_replica_in_its_isr_is_flagged(cluster):
    make_ineligible(cluster, 5000, 3, "fenced")
    cluster.metadata(6000, s.partition(cluster.topic_id, 1, [1, 2, 3], [1, 2, 3], 1))
    assert cluster.keys() == [("ISR_INELIGIBLE_REPLICA_ADMITTED", 3, 6000, 1, "orders")]


@pytest.mark.violation("ISR_INELIGIBLE_REPLICA_ADMITTED")
def test_alter_partition_admitting_a_stale_broker_epoch_is_flagged_once(cluster):
    """KIP-903: broker 3 restarted (epoch 12 -> 20); the leader's AlterPartition still
    names epoch 12 and the controller accepts it. The change record the controller
    writes looks legal on its own (broker 3 is registered and unfenced); both name
    the same fact, so one alert."""
    cluster.change(3000, isr=[1, 2])  # partition epoch 1
    cluster.metadata(5000, s.register_broker(3, 20, fenced=False))
    cluster.change(9000, isr=[1, 2, 3])  # partition epoch 2
    alter_partition(
        cluster,
        9000,
        leader_epoch=0,
        partition_epoch=1,
        new_isr=[1, 2, 3],
        isr_epochs={1: 10, 2: 11, 3: 12},
        error=NONE,
        result_partition_epoch=2,
    )
    assert cluster.keys() == [("ISR_INELIGIBLE_REPLICA_ADMITTED", 3, 9000, 0, "orders")]


def test_fenced_last_isr_member_staying_in_the_isr_is_not_a_violation(cluster):
    """The controller keeps the last ISR member so the partition can recover."""
    cluster.change(3000, leader=3, isr=[3])
    make_ineligible(cluster, 5000, 3, "fenced")
    cluster.change(5100, leader=-1)  # no leader; ISR stays [3]
    assert cluster.keys() == []


def test_re_adding_a_broker_after_it_was_unfenced_is_not_a_violation(cluster):
    make_ineligible(cluster, 5000, 3, "fenced")
    cluster.change(5100, isr=[1, 2])
    cluster.metadata(8000, s.broker_change(3, 12, fenced=-1))
    cluster.change(9000, isr=[1, 2, 3])
    assert cluster.keys() == []


def test_re_registered_unfenced_broker_joining_the_isr_is_not_a_violation(cluster):
    cluster.change(3000, isr=[1, 2])
    cluster.metadata(5000, s.register_broker(3, 20, fenced=True))
    cluster.metadata(5500, s.broker_change(3, 20, fenced=-1))
    cluster.change(9000, isr=[1, 2, 3])
    alter_partition(
        cluster,
        9000,
        leader_epoch=0,
        partition_epoch=1,
        new_isr=[1, 2, 3],
        isr_epochs={1: 10, 2: 11, 3: 20},
        error=NONE,
        result_partition_epoch=2,
    )
    assert cluster.keys() == []


def test_snapshot_partition_record_re_stating_a_fenced_member_is_not_a_violation(make_history):
    """A snapshot's PARTITION_RECORD (partitionEpoch > 0) restates an old decision."""
    history = make_history(standard=False)
    history.metadata(1000, s.feature_level(21))
    history.metadata(1000, s.register_broker(1, 10, fenced=False))
    history.metadata(1000, s.register_broker(2, 11, fenced=False))
    history.metadata(1000, s.register_broker(3, 12, fenced=True))
    history.metadata(1000, s.topic(history.topic, history.topic_id))
    history.metadata(1000, s.partition(history.topic_id, 0, [1, 2, 3], [1, 2, 3], 1, 4, 7))
    assert history.keys() == []


# ---- LEADER_INELIGIBLE_ELECTED --------------------------------------------------------------


@pytest.mark.violation("LEADER_INELIGIBLE_ELECTED")
@pytest.mark.parametrize("how", sorted(INELIGIBLE))
def test_ineligible_broker_elected_leader_is_flagged(cluster, how):
    make_ineligible(cluster, 5000, 2, how)
    cluster.change(6000, leader=2)
    outcome = cluster.run()
    assert outcome.keys == [("LEADER_INELIGIBLE_ELECTED", 2, 6000, 0, "orders")]
    assert outcome.alerts[0].severity == "critical"


def test_no_leader_after_the_last_isr_member_was_fenced_is_not_a_violation(cluster):
    cluster.change(3000, leader=3, isr=[3])
    make_ineligible(cluster, 5000, 3, "fenced")
    cluster.change(5100, leader=-1)
    assert cluster.keys() == []


def test_record_keeping_the_current_leader_while_bumping_the_epoch_is_not_a_violation(cluster):
    make_ineligible(cluster, 5000, 1, "controlled-shutdown")
    cluster.change(5100, leader=1, isr=[1, 2])
    assert cluster.keys() == []


def test_electing_an_unfenced_broker_is_not_a_violation(cluster):
    make_ineligible(cluster, 5000, 2, "fenced")
    cluster.metadata(6000, s.broker_change(2, 11, fenced=-1))
    cluster.change(7000, leader=2)
    assert cluster.keys() == []


# ---- ALTER_PARTITION_STALE_EPOCH_ACCEPTED ---------------------------------------------------


@pytest.mark.violation("ALTER_PARTITION_STALE_EPOCH_ACCEPTED")
def test_alter_partition_from_a_deposed_leader_accepted_is_flagged(cluster):
    cluster.change(10_000, leader=2)  # leader epoch 1, partition epoch 1
    alter_partition(cluster, 13_000, leader_epoch=0, partition_epoch=0, new_isr=[1, 2], error=NONE)
    outcome = cluster.run()
    assert outcome.keys == [("ALTER_PARTITION_STALE_EPOCH_ACCEPTED", cluster.controller, 13_000, 0, "orders")]
    assert outcome.alerts[0].severity == "critical"


@pytest.mark.violation("ALTER_PARTITION_STALE_EPOCH_ACCEPTED")
def test_alter_partition_with_a_stale_partition_epoch_accepted_is_flagged(cluster):
    cluster.change(3000, isr=[1, 2])  # partition epoch 1, leader epoch stays 0
    alter_partition(cluster, 6000, leader_epoch=0, partition_epoch=0, new_isr=[1, 2, 3], error=NONE)
    assert cluster.keys() == [("ALTER_PARTITION_STALE_EPOCH_ACCEPTED", cluster.controller, 6000, 0, "orders")]


def test_alter_partition_whose_own_change_record_is_logged_first_is_not_a_violation(cluster):
    """The controller commits the change record, then logs the completed request:
    the request's epochs match the state its change replaced."""
    cluster.change(5000, isr=[1, 2])  # partition epoch 0 -> 1
    alter_partition(
        cluster,
        5000,
        leader_epoch=0,
        partition_epoch=0,
        new_isr=[1, 2],
        error=NONE,
        result_leader=1,
        result_leader_epoch=0,
        result_partition_epoch=1,
    )
    assert cluster.keys() == []


@pytest.mark.parametrize("error", [KafkaError.FENCED_LEADER_EPOCH, KafkaError.INVALID_UPDATE_VERSION])
def test_stale_alter_partition_rejected_is_fencing_working(cluster, error):
    cluster.change(10_000, leader=2)
    alter_partition(cluster, 13_000, leader_epoch=0, partition_epoch=0, new_isr=[1, 2], error=error)
    assert cluster.keys() == []


# ---- ALTER_PARTITION_STALE_BROKER_EPOCH_ACCEPTED --------------------------------------------


@pytest.mark.violation("ALTER_PARTITION_STALE_BROKER_EPOCH_ACCEPTED")
def test_alter_partition_from_a_previous_incarnation_accepted_is_flagged(cluster):
    cluster.metadata(5000, s.register_broker(1, 30, fenced=False))
    alter_partition(cluster, 9000, leader_epoch=0, partition_epoch=0, new_isr=[1, 2, 3], error=NONE)
    outcome = cluster.run()
    assert outcome.keys == [
        ("ALTER_PARTITION_STALE_BROKER_EPOCH_ACCEPTED", cluster.controller, 9000, None, None)
    ]
    assert outcome.alerts[0].severity == "critical"


def test_alter_partition_without_a_broker_epoch_is_not_judged(cluster):
    """-1: senders older than KIP-903 send no broker epoch."""
    cluster.metadata(5000, s.register_broker(1, 30, fenced=False))
    alter_partition(
        cluster, 9000, broker_epoch=-1, leader_epoch=0, partition_epoch=0, new_isr=[1, 2, 3], error=NONE
    )
    assert cluster.keys() == []


def test_broker_epoch_replaced_within_grace_is_not_a_violation(cluster):
    cluster.metadata(5000, s.register_broker(1, 30, fenced=False))
    alter_partition(cluster, 6000, leader_epoch=0, partition_epoch=0, new_isr=[1, 2, 3], error=NONE)
    assert cluster.keys() == []


def test_stale_broker_epoch_answered_stale_broker_epoch_is_fencing_working(cluster):
    cluster.metadata(5000, s.register_broker(1, 30, fenced=False))
    alter_partition(
        cluster,
        9000,
        leader_epoch=0,
        partition_epoch=0,
        new_isr=[1, 2, 3],
        error=KafkaError.STALE_BROKER_EPOCH,
        top_error=KafkaError.STALE_BROKER_EPOCH,
    )
    assert cluster.keys() == []


# ---- ALTER_PARTITION_ERROR_VERSION_MISMATCH -------------------------------------------------


@pytest.mark.violation("ALTER_PARTITION_ERROR_VERSION_MISMATCH")
@pytest.mark.parametrize(
    ("version", "error"),
    [
        (0, KafkaError.INELIGIBLE_REPLICA),
        (1, KafkaError.INELIGIBLE_REPLICA),
        (1, KafkaError.NEW_LEADER_ELECTED),
        (1, KafkaError.UNKNOWN_TOPIC_ID),
    ],
)
def test_v2_only_error_sent_to_an_old_request_is_flagged(cluster, version, error):
    make_ineligible(cluster, 5000, 3, "fenced")
    cluster.change(5100, isr=[1, 2])
    alter_partition(
        cluster, 6000, leader_epoch=0, partition_epoch=1, new_isr=[1, 2, 3], error=error, version=version
    )
    outcome = cluster.run()
    assert outcome.keys == [("ALTER_PARTITION_ERROR_VERSION_MISMATCH", cluster.controller, 6000, 0, "orders")]
    assert outcome.alerts[0].severity == "warning"


@pytest.mark.violation("ALTER_PARTITION_ERROR_VERSION_MISMATCH")
def test_v2_only_error_for_a_topic_the_view_cannot_resolve_still_names_the_topic(cluster):
    """The verdict needs no view (a simulated history found this: the topic was
    re-created within the clock skew of the request)."""
    body = s.alter_partition(
        "payments",
        None,
        4,
        broker_id=1,
        broker_epoch=10,
        leader_epoch=0,
        partition_epoch=1,
        new_isr=[1, 2],
        error=KafkaError.INELIGIBLE_REPLICA,
        version=1,
    )
    cluster.request(6000, cluster.controller, body)
    outcome = cluster.run()
    assert outcome.keys == [
        ("ALTER_PARTITION_ERROR_VERSION_MISMATCH", cluster.controller, 6000, 4, "payments")
    ]


@pytest.mark.violation("ALTER_PARTITION_ERROR_VERSION_MISMATCH")
@pytest.mark.parametrize("version", [2, 3])
def test_operation_not_attempted_for_an_ineligible_replica_at_v2_plus_is_flagged(cluster, version):
    make_ineligible(cluster, 5000, 3, "fenced")
    cluster.change(5100, isr=[1, 2])
    alter_partition(
        cluster,
        6000,
        leader_epoch=0,
        partition_epoch=1,
        new_isr=[1, 2, 3],
        error=KafkaError.OPERATION_NOT_ATTEMPTED,
        version=version,
    )
    assert cluster.keys() == [
        ("ALTER_PARTITION_ERROR_VERSION_MISMATCH", cluster.controller, 6000, 0, "orders")
    ]


@pytest.mark.violation("ALTER_PARTITION_ERROR_VERSION_MISMATCH")
def test_the_controllers_answer_is_judged_at_its_own_time_in_the_metadata_log(make_history):
    """Controller 3001, whose clock runs 300 ms behind 3000's, takes the log
    over: its records are placed about 400 ms on to keep the log's time
    continuous (detectors.clocks.MetadataClock). It fences broker 3 at 5000 by
    its clock and 100 ms later answers OPERATION_NOT_ATTEMPTED for an ISR with
    broker 3: at its own time, broker 3 was fenced. Taken as the log's time,
    5100 would fall before the fence."""
    history = make_history(DetectorConfig(measure_clocks=True), standard=False)
    history.metadata(900, s.leader_change(1, 3000, [3000, 3001, 3002], [3000, 3001]))
    history.standard_cluster()
    for ts_ms in range(1100, 1600, 100):
        history.metadata(ts_ms, s.no_op())
    history.metadata(1240, s.leader_change(2, 3001, [3000, 3001, 3002], [3001, 3002]))
    for ts_ms in range(1300, 5000, 100):
        history.metadata(ts_ms, s.no_op())
    make_ineligible(history, 5000, 3, "fenced")
    alter_partition(
        history,
        5100,
        controller=3001,
        leader_epoch=0,
        partition_epoch=0,
        new_isr=[1, 2, 3],
        error=KafkaError.OPERATION_NOT_ATTEMPTED,
        version=3,
    )
    outcome = history.run()
    assert outcome.detector.cluster("c1").metadata_clock.shift_ms > 200
    assert outcome.keys == [("ALTER_PARTITION_ERROR_VERSION_MISMATCH", 3001, 5100, 0, "orders")]


@pytest.mark.parametrize("version", [0, 1])
def test_operation_not_attempted_to_an_old_request_for_an_ineligible_replica_is_correct(cluster, version):
    """KIP-841 asks exactly this of the controller for v0/v1."""
    make_ineligible(cluster, 5000, 3, "fenced")
    cluster.change(5100, isr=[1, 2])
    alter_partition(
        cluster,
        6000,
        leader_epoch=0,
        partition_epoch=1,
        new_isr=[1, 2, 3],
        error=KafkaError.OPERATION_NOT_ATTEMPTED,
        version=version,
    )
    assert cluster.keys() == []


@pytest.mark.parametrize("version", [2, 3])
def test_ineligible_replica_error_to_a_v2_plus_request_is_correct(cluster, version):
    make_ineligible(cluster, 5000, 3, "fenced")
    cluster.change(5100, isr=[1, 2])
    alter_partition(
        cluster,
        6000,
        leader_epoch=0,
        partition_epoch=1,
        new_isr=[1, 2, 3],
        error=KafkaError.INELIGIBLE_REPLICA,
        version=version,
    )
    assert cluster.keys() == []


def test_operation_not_attempted_at_v2_plus_with_every_replica_eligible_is_not_judged(cluster):
    cluster.change(5100, isr=[1, 2])
    alter_partition(
        cluster,
        6000,
        leader_epoch=0,
        partition_epoch=1,
        new_isr=[1, 2, 3],
        error=KafkaError.OPERATION_NOT_ATTEMPTED,
    )
    assert cluster.keys() == []
