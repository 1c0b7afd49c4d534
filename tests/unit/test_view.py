"""The authoritative view replayed from KRaft metadata records (SPEC 1.3):
partition epoch arithmetic, broker registration states, topic deletion and its
expiry, and duplicate metadata offsets. Getting the epochs wrong raises false
alarms, so the last epoch tests go through a rule."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest

from detectors.alerts import Evidence
from detectors.envelope import envelope_from_obj
from detectors.errors import KafkaError
from detectors.history import History
from detectors.view import (
    MV_3_6_IV0,
    BrokerState,
    ClusterView,
    PartitionState,
    _describe,
    history_of_plain,
    plain_history,
)
from producers import shapes as s

NONE = KafkaError.NONE


def partition_state(outcome: Any, index: int = 0) -> PartitionState:
    history = outcome.view.partition((outcome.view.resolve_topic("orders", None), index))
    assert history is not None
    return history.latest


def broker_state(outcome: Any, broker: int, ts_ms: int) -> BrokerState:
    state = outcome.view.broker_at(broker, ts_ms)
    assert state is not None
    return state


# ---- PARTITION_CHANGE_RECORD epoch arithmetic -----------------------------------------------


@pytest.mark.parametrize(
    ("feature_level", "changed", "leader", "leader_epoch"),
    [
        pytest.param(21, {"leader": 2}, 2, 1, id="new-leader-bumps"),
        pytest.param(21, {"leader": -1}, -1, 1, id="no-leader-bumps"),
        pytest.param(21, {"leader": 1}, 1, 1, id="same-leader-restated-bumps"),
        pytest.param(21, {"leader": -2}, 1, 0, id="leader-minus-2-is-no-change"),
        pytest.param(21, {}, 1, 0, id="nothing-else-changed"),
        pytest.param(21, {"isr": [1, 2]}, 1, 0, id="isr-shrink-at-3.9"),
        pytest.param(MV_3_6_IV0, {"isr": [1, 2]}, 1, 0, id="isr-shrink-at-3.6-IV0"),
        pytest.param(MV_3_6_IV0 - 1, {"isr": [1, 2]}, 1, 1, id="isr-shrink-before-3.6"),
        pytest.param(7, {"isr": [1, 2]}, 1, 1, id="isr-shrink-at-3.3"),
        pytest.param(MV_3_6_IV0 - 1, {"leader": 2, "isr": [2, 3]}, 2, 1, id="shrink-and-leader-bump-once"),
        pytest.param(21, {"replicas": [1, 2], "isr": [1, 2]}, 1, 1, id="replica-removed-bumps"),
        pytest.param(21, {"replicas": [1, 2, 3, 4]}, 1, 0, id="replica-added"),
    ],
)
def test_partition_change_epoch_arithmetic(make_history, feature_level, changed, leader, leader_epoch):
    history = make_history(feature_level=feature_level)
    history.change(5000, **changed)
    state = partition_state(history.run())
    assert (state.leader, state.leader_epoch, state.partition_epoch) == (leader, leader_epoch, 1)


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({}, id="as-shapes-writes-it"),
        pytest.param(
            {"eligibleLeaderReplicas": [3], "directories": ["AAAAAAAAAAAAAAAAAAAAAA"]}, id="more-fields"
        ),
    ],
)
def test_a_created_partitions_evidence_shows_its_record_as_describe_does(extra):
    # The PARTITION_RECORD's summary is written out field by field for speed;
    # alerts quote it, so it must stay the text _describe gives every other record.
    topic_id = "qG8hUlWTTJ2eRb_bFvWRXg"
    view = ClusterView(retention_ms=60_000)
    view.apply(envelope_from_obj(s.envelope("c", "metadata", 1000, s.topic("orders", topic_id), offset=1)))
    body = s.partition(topic_id, 7, [2, 1, 3], [2, 1], 2, leader_epoch=4)
    body["data"].update(extra)
    change = view.apply(envelope_from_obj(s.envelope("c", "metadata", 1000, body, offset=2)))
    assert change is not None
    assert change.after.source.summary == _describe("partition created", body["data"])
    assert change.after.source.summary.startswith(
        f"partition created {topic_id}-7 {{'leader': 2, 'leaderEpoch': 4"
    )


def test_a_partition_history_as_plain_values_comes_back_equal():
    view = Evidence("view", "metadata", 100, None, 7, "t/0@7", "partition created x-0 {}")
    clock = Evidence("clock", "request", 180, 2, None, "t/1@9", "clock bound", -30, 45)
    history = History(100, PartitionState(1, 0, 0, (1, 2, 3), (1, 2, 3), (), view))
    history.append(200, PartitionState(2, 1, 1, (2, 3), (1, 2, 3), (2,), clock))
    plain = plain_history(history)
    assert pickle.loads(pickle.dumps(plain)) == plain  # plain values only
    assert history_of_plain(pickle.loads(pickle.dumps(plain))).items() == history.items()


def test_a_plain_history_written_before_a_field_was_added_takes_its_default():
    # Evidence's clock bounds came last, with defaults: a history stored without them still loads.
    times, ((values, evidence),) = plain_history(
        History(
            100, PartitionState(1, 0, 0, (1,), (1,), (), Evidence("view", "metadata", 100, None, 7, "p", "s"))
        )
    )
    restored = history_of_plain((times, [(values, evidence[:7])]))
    assert restored.latest.source == Evidence("view", "metadata", 100, None, 7, "p", "s")


def test_partition_epoch_rises_by_one_on_every_change(cluster):
    cluster.change(2000, isr=[1, 2])  # no bump at 3.9
    cluster.change(3000, leader=2)
    cluster.change(4000, isr=[1, 2, 3])
    cluster.change(5000, leader=-1, isr=[3])
    cluster.change(6000, leader=3)
    state = partition_state(cluster.run())
    assert (state.leader, state.leader_epoch, state.partition_epoch) == (3, 3, 5)
    assert state.isr == (3,)
    assert state.replicas == (1, 2, 3)


def test_isr_expansion_does_not_bump_the_leader_epoch_before_3_6(make_history):
    history = make_history(feature_level=MV_3_6_IV0 - 1)
    history.change(2000, isr=[1, 2])
    history.change(3000, isr=[1, 2, 3])
    state = partition_state(history.run())
    assert (state.leader_epoch, state.partition_epoch) == (1, 2)


def test_feature_level_upgrade_stops_the_isr_shrink_bump(make_history):
    history = make_history(feature_level=MV_3_6_IV0 - 1)
    history.change(2000, isr=[1, 2])  # bump
    history.metadata(3000, s.feature_level(21))
    history.change(4000, isr=[1])  # no bump any more
    state = partition_state(history.run())
    assert (state.leader_epoch, state.partition_epoch) == (1, 2)


def test_partition_record_sets_its_epochs_as_written(cluster):
    cluster.metadata(2000, s.partition(cluster.topic_id, 1, [2, 3], [3], 3, 7, 9))
    state = partition_state(cluster.run(), 1)
    assert (state.leader, state.leader_epoch, state.partition_epoch, state.isr) == (3, 7, 9, (3,))


@pytest.mark.parametrize(("feature_level", "keys"), [(21, []), (MV_3_6_IV0 - 1, ["stale"])])
def test_isr_shrink_bump_decides_whether_the_old_epoch_is_stale(make_history, feature_level, keys):
    """A leader still producing with epoch 0 after an ISR shrink is fine at 3.9
    and stale before 3.6: the view must follow the cluster's metadata.version."""
    history = make_history(feature_level=feature_level)
    history.change(5000, isr=[1, 2])
    history.request(9000, 1, s.produce("orders", 0, NONE, epoch=0))
    expected = [("PRODUCE_STALE_EPOCH_ACCEPTED", 1, 9000, 0, "orders")] if keys else []
    assert history.keys() == expected


# ---- brokers ---------------------------------------------------------------------------------


def test_broker_registration_lifecycle(make_history):
    history = make_history(standard=False)
    steps = [
        (1000, s.register_broker(3, 12, fenced=True)),
        (1100, s.broker_change(3, 12, fenced=-1)),
        (1200, s.broker_change(3, 12, shutdown=True)),
        (1300, s.broker_change(3, 12, fenced=1)),
        (1400, s.unregister_broker(3, 12)),
        (1500, s.register_broker(3, 20, fenced=True, incarnation="second")),
        (1600, s.broker_change(3, 20, fenced=-1)),
    ]
    for ts_ms, body in steps:
        history.metadata(ts_ms, body)
    outcome = history.run()
    seen = []
    for ts_ms, _ in steps:
        b = broker_state(outcome, 3, ts_ms)
        seen.append((b.epoch, b.registered, b.fenced, b.shutting_down, b.ineligibility()))
    assert seen == [
        (12, True, True, False, "fenced"),
        (12, True, False, False, None),
        (12, True, False, True, "in controlled shutdown"),
        (12, True, True, True, "fenced"),
        (12, False, True, False, "unregistered"),
        (20, True, True, False, "fenced"),
        (20, True, False, False, None),
    ]
    assert broker_state(outcome, 3, 1600).incarnation == "second"
    assert outcome.view.broker_at(3, 999) is None


@pytest.mark.parametrize("fenced", [-1, 0, 1])
@pytest.mark.parametrize("shutdown", [False, True])
def test_a_broker_change_keeps_every_field_it_does_not_set(make_history, fenced, shutdown):
    # ClusterView._update_broker builds the new state field by field (every bucket
    # applies each change); a field added to BrokerState later must carry over
    # as dataclasses.replace would carry it.
    history = make_history(standard=False)
    history.metadata(1000, s.register_broker(3, 12, fenced=False, incarnation="first"))
    history.metadata(1100, s.broker_change(3, 13, fenced=fenced, shutdown=shutdown))
    outcome = history.run()
    before, after = broker_state(outcome, 3, 1000), broker_state(outcome, 3, 1100)
    expected = dataclasses.replace(
        before,
        epoch=13,
        fenced=before.fenced if fenced == 0 else fenced == 1,
        shutting_down=shutdown,
        source=after.source,
    )
    assert after == expected
    assert [f.name for f in dataclasses.fields(BrokerState)] == [
        "epoch",
        "incarnation",
        "fenced",
        "shutting_down",
        "registered",
        "source",
    ], "a new BrokerState field: set it in ClusterView._update_broker too"


def test_legacy_fence_and_unfence_records(make_history):
    history = make_history(standard=False)
    history.metadata(1000, s.register_broker(2, 11, fenced=False))
    history.metadata(1100, {"type": "FENCE_BROKER_RECORD", "version": 0, "data": {"id": 2, "epoch": 11}})
    history.metadata(1200, {"type": "UNFENCE_BROKER_RECORD", "version": 0, "data": {"id": 2, "epoch": 11}})
    outcome = history.run()
    assert broker_state(outcome, 2, 1100).ineligibility() == "fenced"
    assert broker_state(outcome, 2, 1200).ineligibility() is None


def test_broker_change_before_its_registration_is_unverified(make_history):
    history = make_history(standard=False)
    history.metadata(1000, s.broker_change(4, 40, fenced=1))
    outcome = history.run()
    assert outcome.view.broker_at(4, 1000) is None
    assert outcome.counters.unverified == {"broker change before its registration": 1}
    assert outcome.dead_letters == []


# ---- topic deletion and expiry ---------------------------------------------------------------


def topic_known(outcome: Any, topic_id: str) -> bool:
    return topic_id in outcome.view.topics and outcome.view.partition((topic_id, 0)) is not None


def test_deleted_topic_state_is_kept_for_the_retention_window_then_dropped(cluster):
    config = cluster.config
    cluster.metadata(5000, s.remove_topic(cluster.topic_id))
    # The newest event time at which the watermark is exactly retention_ms past the deletion.
    kept_until_ms = 5000 + config.retention_ms + config.lateness_ms
    cluster.metadata(kept_until_ms, s.feature_level(21))
    assert topic_known(cluster.run(), cluster.topic_id)
    cluster.metadata(kept_until_ms + 20 * config.retention_ms, s.feature_level(21))
    outcome = cluster.run()
    assert not topic_known(outcome, cluster.topic_id)
    assert outcome.view.resolve_topic("orders", None) is None


def test_request_before_the_deletion_is_judged_by_name_during_the_window(cluster):
    cluster.request(4900, 2, s.produce("orders", 0, NONE))  # broker 2 never led orders-0
    cluster.metadata(5000, s.remove_topic(cluster.topic_id))
    assert cluster.keys() == [("PRODUCE_ACCEPTED_BY_NON_LEADER", 2, 4900, 0, "orders")]


def test_request_about_a_deleted_topic_after_expiry_is_unverified(cluster):
    cluster.metadata(5000, s.remove_topic(cluster.topic_id))
    cluster.request(60_000, 2, s.produce("orders", 0, NONE))
    outcome = cluster.run()
    assert outcome.keys == []
    assert outcome.counters.unverified == {"unknown partition": 1}


def test_a_topic_stated_again_keeps_its_partitions_histories(cluster):
    # A snapshot states every topic and partition again: a partition's history
    # goes on from what the log had, and a later change still finds it.
    cluster.change(2000, leader=2)
    cluster.metadata(3000, s.topic("orders", cluster.topic_id))
    cluster.metadata(
        3000, s.partition(cluster.topic_id, 0, [1, 2, 3], [1, 2, 3], 2, leader_epoch=1, partition_epoch=1)
    )
    cluster.change(4000, leader=3)
    outcome = cluster.run()
    history = outcome.view.partition((cluster.topic_id, 0))
    assert history is not None and len(history) == 4
    assert (history.latest.leader, history.latest.leader_epoch) == (3, 2)
    assert outcome.view.topics[cluster.topic_id].partition_count == 1


def test_recreated_topic_name_resolves_by_time(cluster):
    new_id = "bmV3LXRvcGljLWlkLTAwMQ"
    cluster.metadata(5000, s.remove_topic(cluster.topic_id))
    cluster.metadata(6000, s.topic("orders", new_id))
    cluster.metadata(6000, s.partition(new_id, 0, [2, 3], [2, 3], 2))
    view = cluster.run().view
    assert view.resolve_topic("orders", None, 4000) == cluster.topic_id
    assert view.resolve_topic("orders", None, 5500) is None
    assert view.resolve_topic("orders", None, 7000) == new_id
    assert view.resolve_topic(None, cluster.topic_id) == cluster.topic_id  # kept by id until expiry


def test_recreated_topic_is_judged_against_its_own_partitions(cluster):
    new_id = "bmV3LXRvcGljLWlkLTAwMQ"
    cluster.metadata(5000, s.remove_topic(cluster.topic_id))
    cluster.metadata(6000, s.topic("orders", new_id))
    cluster.metadata(6000, s.partition(new_id, 0, [2, 3], [2, 3], 2))
    cluster.request(7000, 2, s.produce("orders", 0, NONE))  # leader of the new orders-0
    cluster.request(7000, 1, s.produce("orders", 0, NONE))  # led the old one only
    assert cluster.keys() == [("PRODUCE_ACCEPTED_BY_NON_LEADER", 1, 7000, 0, "orders")]


# ---- metadata offsets -------------------------------------------------------------------------


def test_duplicate_metadata_offsets_are_skipped_and_counted(cluster):
    record = s.partition_change(cluster.topic_id, 0, leader=2)
    cluster.metadata(5000, record, offset=100)
    cluster.metadata(5000, record, offset=100)  # re-shipped
    cluster.metadata(5000, record, offset=100)  # and again
    outcome = cluster.run()
    state = partition_state(outcome)
    assert (state.leader, state.leader_epoch, state.partition_epoch) == (2, 1, 1)
    assert outcome.counters.duplicates == 2
    assert outcome.detector.cluster(cluster.cluster_name).metadata_log.last == 100


def test_metadata_arriving_out_of_offset_order_is_applied_in_offset_order(cluster):
    cluster.metadata(5000, s.partition_change(cluster.topic_id, 0, leader=2), offset=100)
    cluster.metadata(5001, s.partition_change(cluster.topic_id, 0, leader=3), offset=99)  # older
    outcome = cluster.run()
    state = partition_state(outcome)
    # 99 (leader 3) first, then 100 (leader 2): two changes, in the log's order.
    assert (state.leader, state.leader_epoch, state.partition_epoch) == (2, 2, 2)
    assert outcome.counters.duplicates == 0
    assert outcome.dead_letters == []
    assert outcome.detector.cluster(cluster.cluster_name).metadata_log.last == 100


def test_metadata_without_offsets_is_always_applied(cluster):
    record = s.partition_change(cluster.topic_id, 0, leader=2)
    cluster.add(s.envelope(cluster.cluster_name, "metadata", 5000, record))
    cluster.add(s.envelope(cluster.cluster_name, "metadata", 5001, record))
    outcome = cluster.run()
    assert partition_state(outcome).leader_epoch == 2
    assert outcome.counters.duplicates == 0
