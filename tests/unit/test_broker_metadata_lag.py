"""A broker is blamed for acting on a superseded state only once its own
BrokerHeartbeat showed it had applied the record that superseded it
(ClusterState.metadata_applied, detectors.applied_metadata).

Kafka's broker sends ``currentMetadataOffset``, its MetadataLoader's last
applied offset, in every heartbeat (BrokerLifecycleManager.sendBrokerHeartbeat);
the active controller logs the heartbeat. Standard cluster (conftest.py):
orders-0 led by broker 1 in leader epoch 0, records at offsets 1-6;
``elect_broker_2`` writes offset 7, leader 2 in epoch 1, at ``ELECTION_MS``.
Past the grace window the default rules raise; with heartbeats read, only a
heartbeat reporting offset 7 or more, from before the request, makes it certain.
"""

from __future__ import annotations

import pickle
from dataclasses import replace
from typing import Any

import pytest

from detectors.alerts import Evidence
from detectors.applied_metadata import AppliedMetadata, EpochAbove, LedByOther, superseding_offset
from detectors.buckets import buckets_of
from detectors.engine import Detector
from detectors.envelope import envelope_from_obj
from detectors.errors import KafkaError
from detectors.history import History
from detectors.stats import UnverifiedReason
from detectors.view import PartitionState
from producers import shapes as s

NONE = KafkaError.NONE
NOT_CONTROLLER = 41
CONTROLLER = 3000
ELECTION_MS = 10_000
ELECTION_OFFSET = 7
PAST_GRACE_MS = 13_000
BEHIND = UnverifiedReason.BROKER_METADATA_BEHIND.value


def elect_broker_2(history: Any) -> None:
    env = history.change(ELECTION_MS, leader=2)  # leader epoch 0 -> 1
    assert env.offset == ELECTION_OFFSET


def heartbeat(history: Any, ts_ms: int, broker: int, offset: int, error: int = 0) -> None:
    epoch = history.broker_epochs[broker]
    history.request(ts_ms, CONTROLLER, s.broker_heartbeat(broker, epoch, offset, error=error))


def stale_fetch(history: Any, node: int = 2) -> None:
    """``node`` serves a fetch of orders-0 at leader epoch 0, past the grace window."""
    history.request(PAST_GRACE_MS, node, s.fetch("orders", 0, NONE, epoch=0))


@pytest.mark.violation("FETCH_STALE_EPOCH_SERVED")
def test_a_broker_whose_heartbeat_reported_the_election_and_then_serves_the_old_epoch_is_flagged(cluster):
    elect_broker_2(cluster)
    heartbeat(cluster, 12_000, 2, ELECTION_OFFSET)
    stale_fetch(cluster)
    outcome = cluster.run()
    assert outcome.keys == [("FETCH_STALE_EPOCH_SERVED", 2, PAST_GRACE_MS, 0, "orders")]
    # The heartbeat that shows the broker knew is part of the evidence.
    proof = [e for e in outcome.alerts[0].evidence if e.kind == "request" and e.node == CONTROLLER]
    assert len(proof) == 1 and "up to offset 7" in proof[0].summary
    assert BEHIND not in outcome.counters.unverified


def test_a_broker_whose_heartbeat_says_it_is_behind_is_not_blamed_for_the_old_epoch(cluster):
    """Kafka 4.4.0 brokers trail the log by up to 14 s after a pause or a clean
    shutdown: its heartbeat shows it had not applied the election yet."""
    elect_broker_2(cluster)
    heartbeat(cluster, 12_000, 2, ELECTION_OFFSET - 1)
    stale_fetch(cluster)
    outcome = cluster.run()
    assert outcome.keys == []
    assert outcome.counters.unverified[BEHIND] == 1


def test_a_heartbeat_after_the_request_proves_nothing_of_the_moment_before(cluster):
    elect_broker_2(cluster)
    heartbeat(cluster, 12_000, 2, ELECTION_OFFSET - 1)
    stale_fetch(cluster)
    heartbeat(cluster, PAST_GRACE_MS + 500, 2, ELECTION_OFFSET)
    assert cluster.run().keys == []


def test_another_brokers_heartbeat_proves_nothing_of_this_one(cluster):
    elect_broker_2(cluster)
    heartbeat(cluster, 12_000, 3, ELECTION_OFFSET)
    stale_fetch(cluster)
    outcome = cluster.run()
    assert outcome.keys == []
    assert outcome.counters.unverified[BEHIND] == 1


def test_a_heartbeat_the_controller_refused_is_not_read(cluster):
    """Only the active controller's answer places the heartbeat on the log's clock."""
    elect_broker_2(cluster)
    heartbeat(cluster, 11_000, 2, ELECTION_OFFSET - 1)
    heartbeat(cluster, 12_000, 2, ELECTION_OFFSET, error=NOT_CONTROLLER)
    stale_fetch(cluster)
    outcome = cluster.run()
    assert outcome.keys == []
    assert outcome.counters.unverified[BEHIND] == 1


def test_without_any_heartbeat_the_grace_window_alone_decides_as_before(cluster):
    elect_broker_2(cluster)
    stale_fetch(cluster)
    assert cluster.keys() == [("FETCH_STALE_EPOCH_SERVED", 2, PAST_GRACE_MS, 0, "orders")]


@pytest.mark.violation("FETCH_STALE_EPOCH_SERVED")
def test_the_record_to_have_applied_is_the_one_that_superseded_the_epoch_not_the_windows_first(cluster):
    """An ISR change after the election (offset 8, still epoch 1) sets the state
    the window starts with; the broker needed only the election (offset 7)."""
    elect_broker_2(cluster)
    cluster.change(ELECTION_MS + 500, isr=[2, 3])
    heartbeat(cluster, 12_000, 2, ELECTION_OFFSET)
    stale_fetch(cluster)
    assert cluster.keys() == [("FETCH_STALE_EPOCH_SERVED", 2, PAST_GRACE_MS, 0, "orders")]


@pytest.mark.violation("PRODUCE_ACCEPTED_BY_NON_LEADER")
def test_a_former_leader_that_reported_the_election_and_accepts_a_produce_is_flagged(cluster):
    elect_broker_2(cluster)
    heartbeat(cluster, 12_000, 1, ELECTION_OFFSET)
    cluster.request(PAST_GRACE_MS, 1, s.produce("orders", 0, NONE, epoch=-1))
    assert cluster.keys() == [("PRODUCE_ACCEPTED_BY_NON_LEADER", 1, PAST_GRACE_MS, 0, "orders")]


def test_a_former_leader_behind_the_election_accepting_a_produce_is_not_blamed(cluster):
    elect_broker_2(cluster)
    heartbeat(cluster, 12_000, 1, ELECTION_OFFSET - 1)
    cluster.request(PAST_GRACE_MS, 1, s.produce("orders", 0, NONE, epoch=-1))
    outcome = cluster.run()
    assert outcome.keys == []
    assert outcome.counters.unverified[BEHIND] == 1


@pytest.mark.violation("PRODUCE_EPOCH_ERROR_MISMATCH")
def test_unknown_leader_epoch_from_a_broker_that_reported_the_epoch_is_flagged(cluster):
    elect_broker_2(cluster)
    heartbeat(cluster, 12_000, 2, ELECTION_OFFSET)
    cluster.request(PAST_GRACE_MS, 2, s.produce("orders", 0, KafkaError.UNKNOWN_LEADER_EPOCH, epoch=1))
    assert cluster.keys() == [("PRODUCE_EPOCH_ERROR_MISMATCH", 2, PAST_GRACE_MS, 0, "orders")]


def test_unknown_leader_epoch_from_a_broker_behind_the_epoch_is_what_it_should_answer(cluster):
    elect_broker_2(cluster)
    heartbeat(cluster, 12_000, 2, ELECTION_OFFSET - 1)
    cluster.request(PAST_GRACE_MS, 2, s.produce("orders", 0, KafkaError.UNKNOWN_LEADER_EPOCH, epoch=1))
    assert cluster.keys() == []


def test_every_bucket_receives_a_heartbeat_and_counts_it_once():
    env = envelope_from_obj(
        s.envelope("c1", "request", 1, s.broker_heartbeat(1, 10, 5), node=CONTROLLER), "test:0", 0
    )
    assert buckets_of(env, 4) == (0, 1, 2, 3)


def _evidence(offset: int) -> Evidence:
    return Evidence("view", "request", 0, CONTROLLER, None, f"hb:{offset}", f"offset {offset}")


def _offset(applied: AppliedMetadata, moment_ms: int) -> int:
    report = applied.applied_by(1, moment_ms)
    assert report is not None
    return report[0]


def test_reports_arriving_out_of_time_order_keep_the_highest_offset_reported_by_each_moment():
    applied = AppliedMetadata(retention_ms=60_000)
    applied.heard(1, 2_000, 20, _evidence(20))
    applied.heard(1, 1_000, 10, _evidence(10))  # from another controller's log, later read
    applied.heard(1, 1_500, 25, _evidence(25))  # supersedes the report at 2,000
    applied.heard(1, 3_000, 15, _evidence(15))  # says less than was reported before it
    assert applied.applied_by(1, 999) is None
    assert [_offset(applied, t) for t in (1_000, 1_499, 1_500, 2_500, 3_000)] == [10, 10, 25, 25, 25]
    assert applied.applied_by(2, 3_000) is None


def test_reports_older_than_the_retention_are_forgotten_but_the_one_in_force_stays():
    applied = AppliedMetadata(retention_ms=1_000)
    for t, offset in ((0, 1), (500, 2), (1_000, 3), (5_000, 4)):
        applied.heard(1, t, offset, _evidence(offset))
    assert _offset(applied, 4_000) == 3
    assert applied.applied_by(1, 600) is None  # forgotten: older than the retention


def test_what_heartbeats_reported_survives_a_snapshot_of_the_detector():
    """The streaming job pickles the detector's state between batches."""
    detector = Detector()
    raw = s.envelope("c1", "request", 12_000, s.broker_heartbeat(2, 11, ELECTION_OFFSET), node=CONTROLLER)
    detector.ingest(envelope_from_obj(raw, "test:0", 0))
    applied = pickle.loads(pickle.dumps(detector)).cluster("c1").applied
    assert applied is not None
    report = applied.applied_by(2, 12_000)
    assert report is not None and report[0] == ELECTION_OFFSET


def test_the_superseding_record_is_found_in_a_history_read_anew():
    """A state store may give a partition's history as a new copy at each read."""
    view = Evidence("view", "metadata", 0, None, 7, "log:7", "epoch 1")
    older = PartitionState(
        leader=1, leader_epoch=0, partition_epoch=0, isr=(1,), replicas=(1,), elr=(), source=view
    )
    states = [
        older,
        replace(older, leader=2, leader_epoch=1, partition_epoch=1, source=replace(view, offset=8)),
        replace(older, leader=2, leader_epoch=1, partition_epoch=2, source=replace(view, offset=9)),
    ]
    history = History.of([0, 10, 20], states)
    copy = History.of([0, 10, 20], [replace(s) for s in states])
    assert superseding_offset(copy, states[2], EpochAbove(0)) == 8
    assert superseding_offset(history, states[2], LedByOther(1)) == 8
    absent = replace(states[2], partition_epoch=3)
    assert superseding_offset(history, absent, EpochAbove(0)) is None


def test_the_heartbeat_in_the_evidence_says_the_broker_was_in_controlled_shutdown(cluster):
    elect_broker_2(cluster)
    body = s.broker_heartbeat(2, cluster.broker_epochs[2], ELECTION_OFFSET, want_shut_down=True)
    cluster.request(12_000, CONTROLLER, body)
    stale_fetch(cluster)
    (alert,) = cluster.run().alerts
    assert any("in controlled shutdown) had applied" in e.summary for e in alert.evidence)
