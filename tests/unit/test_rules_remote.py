"""KIP-1272 / KIP-405 rules for remote (tiered) log segments: zombie uploads
of compaction results, zombie deletions, and segment state transitions.

Histories start from the standard cluster: orders-0 led by broker 1 in leader
epoch 0; ``elect_broker_2`` moves it to broker 2 (epoch 1) at ``ELECTION_MS``.
The cleaner-offset map travels as ``cleanerOffsets`` (detectors/remote.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from detectors.remote import PartitionDeleteEvent, RemoteView
from producers import shapes as s

ELECTION_MS = 10_000
STARTED, FINISHED = "COPY_SEGMENT_STARTED", "COPY_SEGMENT_FINISHED"
DELETE_STARTED, DELETE_FINISHED = "DELETE_SEGMENT_STARTED", "DELETE_SEGMENT_FINISHED"


def elect_broker_2(history: Any) -> None:
    history.change(ELECTION_MS, leader=2)


def lineage(cleaner: dict[int, int]) -> dict[int, int]:
    """The ``segmentLeaderEpochs`` of a segment from offset 0 whose epochs ended
    where its cleaner-offset map says: each epoch starts after the previous one's end."""
    starts, start = {}, 0
    for epoch, end in sorted(cleaner.items()):
        starts[epoch] = start
        start = end + 1
    return starts


def upload(history: Any, ts_ms: int, segment: str, broker: int, cleaner: dict[int, int]) -> None:
    """``broker`` starts uploading ``segment`` with its cleaner-offset map."""
    history.remote(ts_ms, upload_body(history, segment, broker, cleaner))


def update(history: Any, ts_ms: int, segment: str, broker: int, state: str) -> None:
    history.remote(ts_ms, s.remote_update(history.topic_id, 0, segment, broker_id=broker, state=state))


def uploaded(history: Any, ts_ms: int, segment: str, broker: int, cleaner: dict[int, int]) -> None:
    """A finished upload: COPY_SEGMENT_STARTED at ts_ms, FINISHED 100 ms later."""
    upload(history, ts_ms, segment, broker, cleaner)
    update(history, ts_ms + 100, segment, broker, FINISHED)


# ---- REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED --------------------------------------------------


@pytest.mark.violation("REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED")
@pytest.mark.parametrize(
    "new_leader_finishes_ms", [pytest.param(11_300, id="new-first"), pytest.param(11_500, id="zombie-first")]
)
def test_zombie_compaction_upload_accepted_is_flagged_in_either_arrival_order(
    cluster, new_leader_finishes_ms
):
    """The proposal's table: Seg-2 {LE-0: 100, LE-1: 155} from the new leader
    invalidates Seg-1 {LE-0: 123} from the old one, whichever finishes first."""
    elect_broker_2(cluster)
    upload(cluster, 9000, "seg-1", 1, {0: 123})
    upload(cluster, 11_000, "seg-2", 2, {0: 100, 1: 155})
    finishes = sorted([(11_400, "seg-1", 1), (new_leader_finishes_ms, "seg-2", 2)])
    for ts_ms, segment, broker in finishes:
        update(cluster, ts_ms, segment, broker, FINISHED)
    outcome = cluster.run()
    assert outcome.keys == [("REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED", 1, 11_400, 0, "orders")]
    alert = outcome.alerts[0]
    assert alert.severity == "critical"
    assert [(e.role, e.ts_ms) for e in alert.evidence] == [
        ("view", new_leader_finishes_ms),
        ("violation", 11_400),
    ]


def test_a_tracked_segment_keeps_its_records_without_their_bodies(cluster):
    """A segment stays in the detector's state as long as its data stays in
    remote storage, so it keeps only what evidence reads of its records; the
    alert it later raises still names them."""
    uploaded(cluster, 2000, "seg-1", 1, {0: 100})
    update(cluster, 3000, "seg-1", 2, DELETE_STARTED)
    uploaded(cluster, 4000, "seg-2", 1, {0: 200})
    outcome = cluster.run()
    [part] = outcome.detector.cluster(cluster.cluster_name).remote.partitions.values()
    finished, deleting = part.segments["seg-2"], part.segments["seg-1"]
    assert finished.finished is not None and finished.finished.body == {}
    assert finished.finished.ts_ms == 4100
    assert deleting.delete_request is not None
    assert deleting.delete_request[0] == 2 and deleting.delete_request[1].body == {}
    update(cluster, 5000, "seg-1", 2, DELETE_FINISHED)
    [alert] = cluster.run().alerts
    assert [(e.role, e.ts_ms) for e in alert.evidence][-2:] == [("view", 3000), ("violation", 5000)]


def test_a_partitions_segments_are_kept_together_and_leave_with_the_last(cluster):
    """A partition's segments are one entry (the streaming job stores them per
    partition); once its last segment is deleted, and no epoch end was
    established by them, nothing of the partition is kept."""
    uploaded(cluster, 2000, "seg-1", 1, {0: 100})
    update(cluster, 2500, "seg-1", 1, DELETE_STARTED)
    remote = cluster.run().detector.cluster(cluster.cluster_name).remote
    assert list(remote.partitions) == [(cluster.topic_id, 0)]
    update(cluster, 3000, "seg-1", 1, DELETE_FINISHED)
    outcome = cluster.run()
    assert outcome.keys == []
    assert dict(outcome.detector.cluster(cluster.cluster_name).remote.partitions) == {}


def test_a_segment_is_known_by_its_partition_and_id(cluster):
    """Kafka's RemoteLogSegmentId is the pair (topicIdPartition, id): an update
    naming the same id under another partition is about a segment not seen,
    not a move of the tracked one."""
    uploaded(cluster, 2000, "seg-1", 1, {0: 100})
    cluster.remote(3000, s.remote_update(cluster.topic_id, 1, "seg-1", broker_id=1, state=DELETE_FINISHED))
    outcome = cluster.run()
    assert outcome.keys == []
    assert outcome.counters.unverified == {"update for a remote segment not seen": 1}
    [part] = outcome.detector.cluster(cluster.cluster_name).remote.partitions.values()
    assert part.segments["seg-1"].state == 1  # still COPY_SEGMENT_FINISHED


def test_zombie_upload_alert_id_does_not_depend_on_arrival_order(make_history):
    ids = []
    for new_leader_finishes_ms in (11_300, 11_500):
        history = make_history()
        elect_broker_2(history)
        upload(history, 9000, "seg-1", 1, {0: 123})
        upload(history, 11_000, "seg-2", 2, {0: 100, 1: 155})
        for ts_ms, segment, broker in sorted([(11_400, "seg-1", 1), (new_leader_finishes_ms, "seg-2", 2)]):
            update(history, ts_ms, segment, broker, FINISHED)
        ids.append([a.alert_id for a in history.run().alerts])
    assert len(ids[0]) == 1
    assert ids[0] == ids[1]


def test_cleaner_progressing_within_the_newest_epoch_is_not_a_violation(cluster):
    """The same epoch's claim growing while that epoch is current, then a clean handover."""
    uploaded(cluster, 2000, "seg-1", 1, {0: 100})
    uploaded(cluster, 4000, "seg-2", 1, {0: 123})
    elect_broker_2(cluster)
    uploaded(cluster, 12_000, "seg-3", 2, {0: 123, 1: 155})
    assert cluster.keys() == []


def test_zombie_upload_that_never_finishes_is_not_a_violation(cluster):
    """Validation rejected it: it never reached COPY_SEGMENT_FINISHED."""
    elect_broker_2(cluster)
    upload(cluster, 9000, "seg-1", 1, {0: 123})
    uploaded(cluster, 11_000, "seg-2", 2, {0: 100, 1: 155})
    assert cluster.keys() == []


def test_cleaning_up_a_zombie_upload_is_not_a_second_violation(cluster):
    elect_broker_2(cluster)
    uploaded(cluster, 11_000, "seg-2", 2, {0: 100, 1: 155})
    uploaded(cluster, 11_300, "seg-1", 1, {0: 123})
    update(cluster, 14_000, "seg-1", 1, DELETE_STARTED)  # broker 1 is no longer leader
    update(cluster, 14_100, "seg-1", 1, DELETE_FINISHED)
    assert cluster.keys() == [("REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED", 1, 11_400, 0, "orders")]


# ---- REMOTE_SEGMENT_ZOMBIE_DELETE -----------------------------------------------------------


@pytest.mark.violation("REMOTE_SEGMENT_ZOMBIE_DELETE")
def test_delete_finished_without_delete_started_is_flagged(cluster):
    uploaded(cluster, 2000, "seg-1", 1, {0: 100})
    update(cluster, 3000, "seg-1", 1, DELETE_FINISHED)
    outcome = cluster.run()
    assert outcome.keys == [("REMOTE_SEGMENT_ZOMBIE_DELETE", 1, 3000, 0, "orders")]
    assert outcome.alerts[0].severity == "critical"


@pytest.mark.violation("REMOTE_SEGMENT_ZOMBIE_DELETE")
def test_non_leader_deleting_a_valid_segment_is_flagged(cluster):
    uploaded(cluster, 2000, "seg-1", 1, {0: 100})
    update(cluster, 3000, "seg-1", 2, DELETE_STARTED)
    update(cluster, 3100, "seg-1", 2, DELETE_FINISHED)
    outcome = cluster.run()
    assert outcome.keys == [("REMOTE_SEGMENT_ZOMBIE_DELETE", 2, 3100, 0, "orders")]
    assert [(e.role, e.ts_ms) for e in outcome.alerts[0].evidence][-2:] == [
        ("view", 3000),
        ("violation", 3100),
    ]


@pytest.mark.violation("REMOTE_SEGMENT_ZOMBIE_DELETE")
def test_deposed_leader_deleting_past_grace_is_flagged(cluster):
    uploaded(cluster, 2000, "seg-1", 1, {0: 100})
    elect_broker_2(cluster)
    update(cluster, 13_000, "seg-1", 1, DELETE_STARTED)
    update(cluster, 13_100, "seg-1", 1, DELETE_FINISHED)
    assert cluster.keys() == [("REMOTE_SEGMENT_ZOMBIE_DELETE", 1, 13_100, 0, "orders")]


def test_leader_deleting_segments_is_retention(cluster):
    uploaded(cluster, 2000, "seg-1", 1, {0: 100})
    update(cluster, 3000, "seg-1", 1, DELETE_STARTED)
    update(cluster, 3100, "seg-1", 1, DELETE_FINISHED)
    elect_broker_2(cluster)
    uploaded(cluster, 4000, "seg-2", 1, {0: 200})
    update(cluster, 13_000, "seg-2", 2, DELETE_STARTED)  # the new leader deletes the old one's segment
    update(cluster, 13_100, "seg-2", 2, DELETE_FINISHED)
    assert cluster.keys() == []


def test_any_broker_deleting_segments_of_a_deleted_partition_is_cleanup(cluster):
    # RemoteLogMetadataManager.putRemotePartitionDeleteMetadata: once the controller marks the
    # partition deleted, every remote segment of it is eligible for deletion.
    uploaded(cluster, 2000, "seg-1", 1, {0: 100})
    cluster.remote(2900, s.remote_partition_delete(cluster.topic_id, 0, broker_id=3000, state=0))
    update(cluster, 3000, "seg-1", 2, DELETE_STARTED)
    update(cluster, 3100, "seg-1", 2, DELETE_FINISHED)
    cluster.remote(3200, s.remote_partition_delete(cluster.topic_id, 0, broker_id=2, state=2))
    outcome = cluster.run()
    assert outcome.keys == [] and outcome.dead_letters == []


def test_a_partition_marked_deleted_within_grace_after_the_request_covers_it(cluster):
    # The mark's and the deleting broker's clocks differ: grace_ms (2000) covers the skew.
    uploaded(cluster, 2000, "seg-1", 1, {0: 100})
    update(cluster, 3000, "seg-1", 2, DELETE_STARTED)
    update(cluster, 3100, "seg-1", 2, DELETE_FINISHED)
    cluster.remote(4900, s.remote_partition_delete(cluster.topic_id, 0, broker_id=3000, state=0))
    assert cluster.keys() == []


@pytest.mark.violation("REMOTE_SEGMENT_ZOMBIE_DELETE")
def test_deletion_requested_before_the_partition_was_marked_deleted_is_still_judged(cluster):
    uploaded(cluster, 2000, "seg-1", 1, {0: 100})
    update(cluster, 3000, "seg-1", 2, DELETE_STARTED)
    update(cluster, 3100, "seg-1", 2, DELETE_FINISHED)
    cluster.remote(5100, s.remote_partition_delete(cluster.topic_id, 0, broker_id=3000, state=0))
    assert cluster.keys() == [("REMOTE_SEGMENT_ZOMBIE_DELETE", 2, 3100, 0, "orders")]


def test_a_finished_partition_deletion_is_forgotten_after_retention():
    view = RemoteView()
    view.mark_deleting(PartitionDeleteEvent(("t", 0), 3000, 0), 100)
    view.mark_deleting(PartitionDeleteEvent(("t", 0), 2, 2), 500)
    view.mark_deleting(PartitionDeleteEvent(("t", 1), 3000, 0), 200)
    view.forget_deleted(400)
    assert view.deleted_since(("t", 0)) == 100  # finished at 500: kept
    view.forget_deleted(501)
    assert view.deleted_since(("t", 0)) is None
    assert view.deleted_since(("t", 1)) == 200  # never finished: kept


def test_deposed_leader_deleting_within_grace_is_not_a_violation(cluster):
    uploaded(cluster, 2000, "seg-1", 1, {0: 100})
    elect_broker_2(cluster)
    update(cluster, 11_000, "seg-1", 1, DELETE_STARTED)
    update(cluster, 11_100, "seg-1", 1, DELETE_FINISHED)
    assert cluster.keys() == []


def test_zombie_deletion_left_at_delete_started_is_not_a_violation(cluster):
    """The metadata manager validated and rejected it: it never finished."""
    uploaded(cluster, 2000, "seg-1", 1, {0: 100})
    update(cluster, 3000, "seg-1", 2, DELETE_STARTED)
    assert cluster.keys() == []


def test_deposed_leader_cleaning_up_its_unfinished_upload_is_not_a_violation(cluster):
    """A segment that never reached COPY_SEGMENT_FINISHED was never readable, so it
    is not in the leader-epoch lineage; removing it harms no reader."""
    upload(cluster, 9000, "seg-1", 1, {0: 100})
    elect_broker_2(cluster)
    update(cluster, 13_000, "seg-1", 1, DELETE_STARTED)
    update(cluster, 13_100, "seg-1", 1, DELETE_FINISHED)
    assert cluster.keys() == []


# ---- REMOTE_SEGMENT_INVALID_TRANSITION ------------------------------------------------------


@pytest.mark.violation("REMOTE_SEGMENT_INVALID_TRANSITION")
@pytest.mark.parametrize(
    "states",
    [
        pytest.param([FINISHED], id="nothing-to-finished"),
        pytest.param([STARTED, FINISHED, STARTED], id="finished-to-started"),
        pytest.param([STARTED, DELETE_STARTED, FINISHED], id="delete-started-to-finished"),
        pytest.param([STARTED, DELETE_STARTED, STARTED], id="delete-started-to-started"),
    ],
)
def test_segment_state_moving_outside_its_lifecycle_is_flagged(cluster, states):
    first, *rest = states
    body = s.remote_segment(
        cluster.topic_id, 0, "seg-1", broker_id=1, start=0, end=100, leader_epochs={0: 0}, cleaner={0: 100}
    )
    body["data"]["remoteLogSegmentState"] = first
    cluster.remote(2000, body)
    for i, state in enumerate(rest, start=1):
        update(cluster, 2000 + 100 * i, "seg-1", 1, state)
    last_ms = 2000 + 100 * len(rest)
    outcome = cluster.run()
    assert outcome.keys == [("REMOTE_SEGMENT_INVALID_TRANSITION", 1, last_ms, 0, "orders")]
    assert outcome.alerts[0].severity == "warning"


def test_failed_upload_cleaned_up_is_an_allowed_transition(cluster):
    """COPY_SEGMENT_STARTED -> DELETE_SEGMENT_STARTED: the upload failed."""
    upload(cluster, 2000, "seg-1", 1, {0: 100})
    update(cluster, 2100, "seg-1", 1, DELETE_STARTED)
    update(cluster, 2200, "seg-1", 1, DELETE_FINISHED)
    assert cluster.keys() == []


def test_repeated_states_are_allowed(cluster):
    upload(cluster, 2000, "seg-1", 1, {0: 100})
    upload(cluster, 2050, "seg-1", 1, {0: 100})
    update(cluster, 2100, "seg-1", 1, FINISHED)
    update(cluster, 2150, "seg-1", 1, FINISHED)
    update(cluster, 2200, "seg-1", 1, DELETE_STARTED)
    update(cluster, 2250, "seg-1", 1, DELETE_STARTED)
    update(cluster, 2300, "seg-1", 1, DELETE_FINISHED)
    assert cluster.keys() == []


# ---- a broker's clock stepping back (RemoteView.behind) -------------------------------------


def stepped_back_deletion(history: Any, delete_partition: int) -> None:
    """Broker 2 leads from ELECTION_MS, starts uploading a segment 500 ms later,
    then its clock steps back 5 s and it deletes broker 1's old segment as
    retention: its deletion is stamped 5.5 s before that upload, where broker 1
    led. Its two records go to ``__remote_log_metadata`` partition
    ``delete_partition``, the others to partition 0, each at its partition's
    next offset, as a shipper following the topic gives them."""
    records = [
        (2000, upload_body(history, "seg-1", 1, {0: 100}), 0),
        (2100, s.remote_update(history.topic_id, 0, "seg-1", broker_id=1, state=FINISHED), 0),
        (ELECTION_MS + 500, upload_body(history, "seg-2", 2, {0: 100, 1: 200}), 0),
    ]
    for state in (DELETE_STARTED, DELETE_FINISHED):
        body = s.remote_update(history.topic_id, 0, "seg-1", broker_id=2, state=state)
        records.append((5000, body, delete_partition))
    offsets: dict[int, int] = {}
    for i, (ts_ms, body, log_partition) in enumerate(records):
        if i == 2:
            elect_broker_2(history)
        offsets[log_partition] = offsets.get(log_partition, -1) + 1
        record = {**body, "partition": log_partition}
        history.add(
            s.envelope(
                history.cluster_name, "remote_log_metadata", ts_ms, record, offset=offsets[log_partition]
            )
        )


def upload_body(history: Any, segment: str, broker: int, cleaner: dict[int, int]) -> dict[str, Any]:
    """The record of ``broker`` starting to upload ``segment`` with its cleaner-offset map."""
    return s.remote_segment(
        history.topic_id,
        0,
        segment,
        broker_id=broker,
        start=0,
        end=max(cleaner.values()),
        leader_epochs=lineage(cleaner),
        cleaner=cleaner,
    )


def test_a_deletion_stamped_behind_its_brokers_earlier_record_is_at_most_possible(cluster):
    """Kafka writes one broker's records of a log partition in the order it made them
    (RemoteView.behind): a deletion stamped 5.5 s behind an earlier record was made
    after a step back of the broker's clock, maybe when it led. Judged by its stamp it
    was a certain REMOTE_SEGMENT_ZOMBIE_DELETE (benchmarks/clock_campaign.py
    --step-grid: broker 3 stepped back 8 s, 6 certain false alarms)."""
    stepped_back_deletion(cluster, delete_partition=0)
    outcome = cluster.run()
    assert outcome.dead_letters == []
    assert outcome.keys == [("REMOTE_SEGMENT_ZOMBIE_DELETE", 2, 5000, 0, "orders")]
    alert = outcome.alerts[0]
    assert (alert.confidence, alert.severity) == ("possible", "info")
    assert alert.condition is not None
    assert "unless node 2's clock stepped back" in alert.condition.text
    assert "5.5 s before node 2's newest earlier record" in alert.condition.text
    assert alert.condition.allowed_ms == (-5500, 0)


@pytest.mark.violation("REMOTE_SEGMENT_ZOMBIE_DELETE")
def test_a_deletion_behind_a_record_of_another_log_partition_stays_certain(cluster):
    """Records of different ``__remote_log_metadata`` partitions come in no order
    with each other: only the broker's own records of one partition show a step."""
    stepped_back_deletion(cluster, delete_partition=1)
    outcome = cluster.run()
    assert outcome.keys == [("REMOTE_SEGMENT_ZOMBIE_DELETE", 2, 5000, 0, "orders")]
    assert outcome.alerts[0].confidence == "certain"
