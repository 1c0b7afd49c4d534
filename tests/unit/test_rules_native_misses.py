"""Outcomes fencewatch used to miss on Kafka's native events (issue 11, items 4
and 5), each with its violation and the look-alikes that stay legal:

- ZooKeeper mode: StopReplica names topics only by name, while LeaderAndIsr
  v5+ (controllers since 2.8) also carries the topic id the view keys them by;
- UpdateMetadata raises the controller epoch a broker holds StopReplica to;
- AlterPartition answered NONE although any member of the proposed ISR, kept
  or added, is ineligible;
- alert messages name a topic by its name wherever the view knows it;
- (issue 24) a zombie upload judged from what Kafka's segment records carry,
  ``segmentLeaderEpochs`` and ``endOffset``, as the formatter prints them.

Histories use the standard cluster of conftest.py unless they are ZooKeeper
mode (no metadata log: LeaderAndIsr is the epoch source).
"""

from __future__ import annotations

from typing import Any

import pytest

from detectors.buckets import buckets_of
from detectors.envelope import envelope_from_obj
from detectors.errors import KafkaError
from producers import shapes as s
from producers.native_forms import NativeRoute
from tests.unit.test_rules_isr_alter_partition import INELIGIBLE, alter_partition, make_ineligible

NONE = KafkaError.NONE
FENCED = KafkaError.FENCED_LEADER_EPOCH
BROKER = 3
OTHER_TOPIC_ID = "zZ8hUlWTTJ2eRb_bFvWRXg"


def completed(
    api_key: int, version: int, request: dict[str, Any], response: dict[str, Any]
) -> dict[str, Any]:
    """A request-log body as Kafka's request logger prints it (the fields the detector reads)."""
    return {
        "requestHeader": {
            "requestApiKey": api_key,
            "requestApiVersion": version,
            "correlationId": 1,
            "clientId": "controller-3000",
        },
        "request": request,
        "response": response,
    }


def leader_and_isr(
    topic_id: str | None, leader: int, leader_epoch: int, *, index: int = 0, controller_epoch: int = 5
) -> dict[str, Any]:
    """A LeaderAndIsr for ``orders``-``index`` answered NONE: v6 with ``topicId``, or
    v4 (before topic ids) when ``topic_id`` is None."""
    topic: dict[str, Any] = {"topicName": "orders"}
    if topic_id is not None:
        topic["topicId"] = topic_id
    state = {
        "partitionIndex": index,
        "controllerEpoch": controller_epoch,
        "leader": leader,
        "leaderEpoch": leader_epoch,
        "isr": [1, 2, 3],
        "partitionEpoch" if topic_id else "zkVersion": leader_epoch,
        "replicas": [1, 2, 3],
    }
    request = {
        "controllerId": 3000,
        "controllerEpoch": controller_epoch,
        "brokerEpoch": 12,
        "topicStates": [{**topic, "partitionStates": [state]}],
    }
    errors = [{"partitionIndex": index, "errorCode": 0}]
    if topic_id is None:
        response: dict[str, Any] = {
            "errorCode": 0,
            "partitionErrors": [{"topicName": "orders", **e} for e in errors],
        }
    else:
        response = {"errorCode": 0, "topics": [{"topicId": topic_id, "partitionErrors": errors}]}
    return completed(4, 6 if topic_id else 4, request, response)


def update_metadata(controller_epoch: int, *, version: int = 7, error: int = 0) -> dict[str, Any]:
    """An UpdateMetadata as Kafka's UpdateMetadataRequest.json shapes each version:
    ``controllerEpoch`` is top-level in all of them."""
    request: dict[str, Any] = {"controllerId": 3000, "controllerEpoch": controller_epoch}
    if version >= 8:
        request["isKRaftController"] = False
    if version >= 5:
        request |= {"brokerEpoch": 12, "topicStates": []}
    else:
        request["ungroupedPartitionStates"] = []
    request["liveBrokers"] = [{"id": 1, "endpoints": [], "rack": None}]
    return completed(6, version, request, {"errorCode": error})


def by_topic_id(body: dict[str, Any], topic_id: str, topics: str, responses: str) -> dict[str, Any]:
    """``body`` with its single topic named by id only, as Fetch and Produce v13+ do."""
    for side, key in (("request", topics), ("response", responses)):
        (topic,) = body[side][key]
        for name_key in ("topic", "name"):
            topic.pop(name_key, None)
        topic["topicId"] = topic_id
    body["requestHeader"]["requestApiVersion"] = 13
    return body


def stop(topic: str, index: int, leader_epoch: int, error: int) -> dict[str, Any]:
    """A StopReplica from the controller of the LeaderAndIsr above (controller epoch 5)."""
    return s.stop_replica(topic, index, leader_epoch, error, controller_epoch=5)


def zookeeper_history(make_history: Any) -> Any:
    """ZooKeeper mode: no metadata log; orders-0 is at leader epoch 0 from T=1000
    and at leader epoch 1 (leader 2) from T=10000, as broker 3 learns it."""
    history = make_history(standard=False)
    history.request(1000, BROKER, leader_and_isr(history.topic_id, 1, 0))
    history.request(10_000, BROKER, leader_and_isr(history.topic_id, 2, 1))
    return history


# ---- (a) ZooKeeper-mode StopReplica finds the partition LeaderAndIsr keyed by id ------------


@pytest.mark.violation("STOP_REPLICA_STALE_EPOCH_APPLIED")
def test_stale_stop_replica_is_judged_when_leader_and_isr_carries_topic_ids(make_history):
    history = zookeeper_history(make_history)
    history.request(13_000, BROKER, stop("orders", 0, 0, NONE))
    outcome = history.run()
    assert outcome.keys == [("STOP_REPLICA_STALE_EPOCH_APPLIED", BROKER, 13_000, 0, "orders")]
    assert outcome.alerts[0].topic_id == history.topic_id
    assert "unknown partition" not in outcome.counters.unverified


@pytest.mark.violation("STOP_REPLICA_CURRENT_EPOCH_REJECTED")
def test_current_stop_replica_rejected_is_judged_when_leader_and_isr_carries_topic_ids(make_history):
    history = zookeeper_history(make_history)
    history.request(13_000, BROKER, stop("orders", 0, 1, FENCED))
    assert history.keys() == [("STOP_REPLICA_CURRENT_EPOCH_REJECTED", BROKER, 13_000, 0, "orders")]


@pytest.mark.parametrize(
    ("ts_ms", "epoch", "error"),
    [
        pytest.param(13_000, 1, NONE, id="current-epoch-applied"),
        pytest.param(13_000, 0, FENCED, id="stale-epoch-fenced"),
        pytest.param(11_000, 0, NONE, id="stale-epoch-within-grace"),
        pytest.param(13_000, -2, NONE, id="deletion-sentinel-applied"),
    ],
)
def test_zookeeper_stop_replica_look_alikes_are_not_violations(make_history, ts_ms, epoch, error):
    history = zookeeper_history(make_history)
    history.request(ts_ms, BROKER, stop("orders", 0, epoch, error))
    outcome = history.run()
    assert outcome.keys == []
    assert "unknown partition" not in outcome.counters.unverified


@pytest.mark.violation("STOP_REPLICA_STALE_EPOCH_APPLIED")
def test_leader_and_isr_before_topic_ids_still_keys_the_partition_by_name(make_history):
    history = make_history(standard=False)
    history.request(1000, BROKER, leader_and_isr(None, 1, 0))
    history.request(10_000, BROKER, leader_and_isr(None, 2, 1))
    history.request(13_000, BROKER, stop("orders", 0, 0, NONE))
    outcome = history.run()
    assert outcome.keys == [("STOP_REPLICA_STALE_EPOCH_APPLIED", BROKER, 13_000, 0, "orders")]
    assert outcome.alerts[0].topic_id is None


def test_a_re_created_topic_name_resolves_to_the_topic_it_named_then(make_history):
    """ZooKeeper mode: ``orders`` is deleted and re-created with a new id. A
    StopReplica resolves the name as of its own time."""
    history = make_history(standard=False)
    history.request(1000, BROKER, leader_and_isr(history.topic_id, 1, 3))
    history.request(6000, 2, stop("orders", 0, 2, NONE))  # stale for the first topic
    history.request(20_000, BROKER, leader_and_isr(OTHER_TOPIC_ID, 1, 0))
    history.request(25_000, BROKER, stop("orders", 0, 0, NONE))  # current for the second
    outcome = history.run()
    assert outcome.keys == [("STOP_REPLICA_STALE_EPOCH_APPLIED", 2, 6000, 0, "orders")]
    assert outcome.alerts[0].topic_id == history.topic_id


@pytest.mark.parametrize("order", [pytest.param(None, id="in-order"), pytest.param([1, 0, 2], id="late")])
def test_a_late_leader_and_isr_for_a_re_created_topics_old_id_does_not_re_point_its_name(make_history, order):
    """Brokers' logs interleave: broker 2's LeaderAndIsr for the deleted ``orders``
    may arrive after broker 3's for its re-creation. The name stays with the
    newer id, so broker 3's StopReplica at the re-created topic's epoch is current."""
    history = make_history(standard=False)
    history.request(19_000, 2, leader_and_isr(history.topic_id, 1, 3))
    history.request(20_000, BROKER, leader_and_isr(OTHER_TOPIC_ID, 1, 0))
    history.request(25_000, BROKER, stop("orders", 0, 0, NONE))
    outcome = history.run(order)
    assert outcome.keys == []
    assert outcome.view.resolve_topic("orders", None) == OTHER_TOPIC_ID


def test_the_metadata_log_stays_authoritative_where_it_is_shipped(cluster):
    """A LeaderAndIsr claiming a newer epoch moves neither the epochs nor the names
    of a view replayed from the metadata log."""
    cluster.request(5000, BROKER, leader_and_isr(OTHER_TOPIC_ID, 2, 7))
    cluster.request(13_000, BROKER, stop("orders", 0, 0, NONE))
    outcome = cluster.run()
    assert outcome.keys == []
    assert outcome.view.resolve_topic("orders", None) == cluster.topic_id


# ---- (b) UpdateMetadata raises the controller epoch a broker accepted -----------------------


@pytest.mark.violation("STOP_REPLICA_STALE_CONTROLLER_ACCEPTED")
@pytest.mark.parametrize("version", [0, 4, 5, 7, 8])
def test_stop_replica_from_a_controller_older_than_an_accepted_update_metadata_is_flagged(cluster, version):
    cluster.request(5000, BROKER, update_metadata(5, version=version))
    cluster.request(6000, BROKER, s.stop_replica("orders", 0, 0, NONE, controller_epoch=4))
    outcome = cluster.run()
    assert outcome.keys == [("STOP_REPLICA_STALE_CONTROLLER_ACCEPTED", BROKER, 6000, None, None)]
    view, violation = outcome.alerts[0].evidence
    assert (view.ts_ms, view.summary) == (5000, "broker 3 accepted controller epoch 5")
    assert "controller epoch 4 after accepting controller epoch 5" in violation.summary
    assert outcome.counters.events["request:UPDATE_METADATA"] == 1


@pytest.mark.parametrize(
    "error", [KafkaError.STALE_CONTROLLER_EPOCH, KafkaError.STALE_BROKER_EPOCH, KafkaError.NOT_CONTROLLER]
)
def test_a_rejected_update_metadata_raises_no_controller_epoch(cluster, error):
    cluster.request(5000, BROKER, update_metadata(5, error=error))
    cluster.request(6000, BROKER, s.stop_replica("orders", 0, 0, NONE, controller_epoch=4))
    assert cluster.keys() == []


def test_stop_replica_at_the_epoch_of_the_accepted_update_metadata_is_allowed(cluster):
    cluster.request(5000, BROKER, update_metadata(5))
    cluster.request(6000, BROKER, s.stop_replica("orders", 0, 0, NONE, controller_epoch=5))
    assert cluster.keys() == []


def test_update_metadata_accepted_by_another_broker_does_not_bind_this_one(cluster):
    cluster.request(5000, 2, update_metadata(5))
    cluster.request(6000, BROKER, s.stop_replica("orders", 0, 0, NONE, controller_epoch=4))
    assert cluster.keys() == []


def test_update_metadata_without_a_controller_epoch_is_a_dead_letter(cluster):
    body = update_metadata(5)
    del body["request"]["controllerEpoch"]
    cluster.request(5000, BROKER, body)
    outcome = cluster.run()
    [letter] = outcome.dead_letters
    assert "body.request.controllerEpoch" in letter.reason


def test_update_metadata_reaches_every_bucket():
    """Like StopReplica and LeaderAndIsr: the controller epoch is the broker's."""
    raw = s.envelope("c1", "request", 5000, update_metadata(5), node=BROKER)
    env = envelope_from_obj(raw, "t:0", 0)
    assert buckets_of(env, 7) == tuple(range(7))


# ---- (c) AlterPartition accepted with any ineligible member of the proposed ISR -------------

# How broker 3 (registered at broker epoch 12) stops being eligible, and the reason an alert gives.
STALE_EPOCH = "stale-broker-epoch"
REASONS = {
    "fenced": "fenced",
    "controlled-shutdown": "in controlled shutdown",
    "unregistered": "unregistered",
    STALE_EPOCH: "stale broker epoch 12, registered 20",
}


def make_member_ineligible(history: Any, how: str) -> None:
    """Broker 3 becomes ineligible at 5000 ms; ``STALE_EPOCH``: it restarts at
    broker epoch 20 (KIP-903), so a proposal naming it at 12 is stale."""
    if how == STALE_EPOCH:
        history.metadata(5000, s.register_broker(3, 20, fenced=False))
    else:
        make_ineligible(history, 5000, 3, how)


def propose(history: Any, ts_ms: int = 9000, **fields: Any) -> None:
    """Leader 1's AlterPartition at leader and partition epoch 0 proposing ISR
    [1, 3], answered NONE with partition epoch 1, unless ``fields`` say otherwise."""
    proposal = {
        "leader_epoch": 0,
        "partition_epoch": 0,
        "new_isr": [1, 3],
        "error": NONE,
        "result_partition_epoch": 1,
    }
    alter_partition(history, ts_ms, **(proposal | fields))


@pytest.mark.violation("ISR_INELIGIBLE_REPLICA_ADMITTED")
@pytest.mark.parametrize(
    ("how", "version"),
    [(how, version) for how in sorted(INELIGIBLE) for version in (1, 3)] + [(STALE_EPOCH, 3)],
)
def test_alter_partition_keeping_an_ineligible_member_accepted_is_flagged(cluster, how, version):
    """Broker 3 stays in the ISR the leader proposes (it drops 2): the change
    record adds nobody, yet the controller should have refused the request."""
    make_member_ineligible(cluster, how)
    cluster.change(9000, isr=[1, 3])  # partition epoch 1
    propose(cluster, isr_epochs={1: 10, 3: 12}, version=version)
    outcome = cluster.run()
    assert outcome.keys == [("ISR_INELIGIBLE_REPLICA_ADMITTED", 3, 9000, 0, "orders")]
    alert = outcome.alerts[0]
    assert alert.severity == "critical"
    assert alert.message == (
        f"controller {cluster.controller} accepted an AlterPartition for orders-0 although its new "
        f"ISR holds replica 3 ({REASONS[how]})"
    )
    assert [(e.role, e.ts_ms) for e in alert.evidence] == [("view", 5000), ("violation", 9000)]


@pytest.mark.violation("ISR_INELIGIBLE_REPLICA_ADMITTED")
def test_a_fenced_replica_added_by_an_accepted_alter_partition_is_one_alert(cluster):
    """The change record the controller writes for the answer adds broker 3 and
    is judged on the metadata log; the answer names the same replica and
    partition epoch: one violation, one alert (the first raised)."""
    cluster.change(3000, isr=[1, 2])  # partition epoch 1
    make_ineligible(cluster, 5000, 3, "fenced")
    cluster.change(9000, isr=[1, 2, 3])  # partition epoch 2
    propose(cluster, 9100, partition_epoch=1, new_isr=[1, 2, 3], result_partition_epoch=2)
    outcome = cluster.run()
    assert outcome.keys == [("ISR_INELIGIBLE_REPLICA_ADMITTED", 3, 9000, 0, "orders")]
    assert outcome.alerts[0].evidence[-1].kind == "metadata"


@pytest.mark.parametrize(
    ("version", "error"),
    [
        (1, KafkaError.OPERATION_NOT_ATTEMPTED),
        (2, KafkaError.INELIGIBLE_REPLICA),
        (3, KafkaError.INELIGIBLE_REPLICA),
    ],
)
def test_alter_partition_with_an_ineligible_member_rejected_is_fencing_working(cluster, version, error):
    make_ineligible(cluster, 5000, 3, "fenced")
    propose(cluster, error=error, result_partition_epoch=-1, version=version)
    assert cluster.keys() == []


@pytest.mark.parametrize(
    ("fenced_ms", "unfenced_ms"),
    [
        pytest.param(8500, None, id="fenced-within-grace-before"),
        pytest.param(3000, 9500, id="unfenced-within-grace-after"),
    ],
)
def test_member_eligible_at_some_moment_of_the_grace_window_is_not_a_violation(
    cluster, fenced_ms, unfenced_ms
):
    """The controller checked its registrations before it logged the completed
    request, and clocks differ: any eligible moment of the window clears it."""
    make_ineligible(cluster, fenced_ms, 3, "fenced")
    if unfenced_ms is not None:
        cluster.metadata(unfenced_ms, s.broker_change(3, 12, fenced=-1))
    propose(cluster)
    assert cluster.keys() == []


def test_fenced_last_isr_member_kept_by_the_controller_then_back_is_not_a_violation(cluster):
    """The controller's own change record keeps fenced broker 3 as the last ISR
    member; once unfenced it leads again and its AlterPartition re-expanding the
    ISR is accepted rightly."""
    cluster.change(3000, leader=3, isr=[3])  # leader epoch 1, partition epoch 1
    make_ineligible(cluster, 5000, 3, "fenced")
    cluster.change(5100, leader=-1)  # leader epoch 2, partition epoch 2; ISR stays [3]
    cluster.metadata(8000, s.broker_change(3, 12, fenced=-1))
    cluster.change(8100, leader=3)  # leader epoch 3, partition epoch 3
    cluster.change(12_000, isr=[3, 1])  # partition epoch 4
    propose(
        cluster,
        12_000,
        broker_id=3,
        broker_epoch=12,
        leader_epoch=3,
        partition_epoch=3,
        new_isr=[3, 1],
        isr_epochs={3: 12, 1: 10},
        result_partition_epoch=4,
    )
    assert cluster.keys() == []


@pytest.mark.parametrize(
    ("registered_ms", "epoch"),
    [
        pytest.param(5000, -1, id="no-epoch-named"),
        pytest.param(8500, 12, id="re-registered-within-grace"),
    ],
)
def test_member_broker_epoch_not_judged_or_replaced_within_grace_is_not_a_violation(
    cluster, registered_ms, epoch
):
    cluster.metadata(registered_ms, s.register_broker(3, 20, fenced=False))
    propose(cluster, isr_epochs={1: 10, 3: epoch})
    assert cluster.keys() == []


def test_member_never_registered_is_unverified(cluster):
    propose(cluster, new_isr=[1, 7])
    outcome = cluster.run()
    assert outcome.keys == []
    assert outcome.counters.unverified["ISR member never registered in the view"] == 1


# ---- (d) messages name the topic the view knows ---------------------------------------------


@pytest.mark.violation("FETCH_STALE_EPOCH_SERVED")
def test_fetch_by_topic_id_names_the_topic_in_its_message(cluster):
    cluster.change(10_000, leader=2)
    body = by_topic_id(s.fetch("orders", 0, NONE, epoch=0), cluster.topic_id, "topics", "responses")
    cluster.request(13_000, 2, body)
    outcome = cluster.run()
    assert outcome.keys == [("FETCH_STALE_EPOCH_SERVED", 2, 13_000, 0, "orders")]
    alert = outcome.alerts[0]
    assert "served FETCH on orders-0 " in alert.message and cluster.topic_id not in alert.message
    assert alert.topic_id == cluster.topic_id


@pytest.mark.violation("PRODUCE_ACCEPTED_BY_NON_LEADER")
def test_produce_by_topic_id_names_the_topic_in_its_message(cluster):
    cluster.change(10_000, leader=2)
    body = by_topic_id(s.produce("orders", 0, NONE), cluster.topic_id, "topicData", "responses")
    cluster.request(13_000, 1, body)
    outcome = cluster.run()
    assert outcome.keys == [("PRODUCE_ACCEPTED_BY_NON_LEADER", 1, 13_000, 0, "orders")]
    assert " to orders-0 " in outcome.alerts[0].message
    assert cluster.topic_id not in outcome.alerts[0].message


@pytest.mark.violation("ALTER_PARTITION_ERROR_VERSION_MISMATCH")
def test_alter_partition_by_topic_id_names_the_topic_in_its_message(cluster):
    make_ineligible(cluster, 5000, 3, "fenced")
    propose(cluster, error=KafkaError.OPERATION_NOT_ATTEMPTED, result_partition_epoch=-1, version=2)
    outcome = cluster.run()
    assert outcome.keys == [("ALTER_PARTITION_ERROR_VERSION_MISMATCH", cluster.controller, 9000, 0, "orders")]
    assert outcome.alerts[0].message.endswith(" for orders-0")
    assert outcome.alerts[0].topic_id == cluster.topic_id


# ---- (e) zombie uploads in Kafka's own segment records --------------------------------------

STARTED, FINISHED = "COPY_SEGMENT_STARTED", "COPY_SEGMENT_FINISHED"


def native(history: Any, ts_ms: int, body: dict[str, Any]) -> None:
    """``body`` as ``kafka-console-consumer.sh`` with RemoteLogMetadataFormatter
    prints it, read back: no cleaner offsets survive. Kafka prints the topic's
    name in every record."""
    body["data"]["remoteLogSegmentId"]["topicIdPartition"]["name"] = "orders"
    raw = s.envelope(history.cluster_name, "remote_log_metadata", ts_ms, body)
    history.remote(ts_ms, NativeRoute(history.cluster_name).envelope(raw)["body"])


def native_upload(
    history: Any, ts_ms: int, segment: str, broker: int, epochs: dict[int, int], end: int
) -> None:
    """``broker`` copies ``segment`` (its epochs' start offsets, its end offset):
    COPY_SEGMENT_STARTED at ``ts_ms``, FINISHED 100 ms later."""
    start = min(epochs.values())
    body = s.remote_segment(
        history.topic_id, 0, segment, broker_id=broker, start=start, end=end, leader_epochs=epochs, cleaner={}
    )
    del body["data"]["cleanerOffsets"]
    native(history, ts_ms, body)
    update = s.remote_update(history.topic_id, 0, segment, broker_id=broker, state=FINISHED)
    native(history, ts_ms + 100, update)


@pytest.mark.violation("REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED")
@pytest.mark.parametrize("zombie_first", [False, True], ids=["new-leader-first", "zombie-first"])
def test_a_native_zombie_upload_is_caught_from_segment_leader_epochs(cluster, zombie_first):
    """Broker 2 leads epoch 1 from offset 101 (its segment: epoch 0 from 0,
    epoch 1 from 101, to 155); deposed broker 1 copies a segment whose epoch 0
    runs to 123. Whichever is accepted first, broker 1's is the zombie's."""
    cluster.change(10_000, leader=2)
    uploads = [(2, {0: 0, 1: 101}, 155), (1, {0: 0}, 123)]
    for n, (broker, epochs, end) in enumerate(reversed(uploads) if zombie_first else uploads):
        native_upload(cluster, 11_000 + 1000 * n, f"seg-{broker}", broker, epochs, end)
    outcome = cluster.run()
    zombie_ms = 11_100 if zombie_first else 12_100
    assert outcome.keys == [("REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED", 1, zombie_ms, 0, "orders")]
    assert "claims epoch 0 reached offset 123, but a later epoch established it ended at 100" in (
        outcome.alerts[0].message
    )


@pytest.mark.violation("REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED")
def test_a_native_zombie_upload_past_a_later_epochs_own_segment_is_caught(cluster):
    """The new leader's segment holds only its own epoch (2 from 300): the
    deposed leader's epoch-1 segment to 349 runs past it."""
    cluster.change(10_000, leader=2)
    native_upload(cluster, 11_000, "seg-new", 2, {2: 300}, 420)
    native_upload(cluster, 12_000, "seg-old", 1, {1: 200}, 349)
    assert cluster.keys() == [("REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED", 1, 12_100, 0, "orders")]


@pytest.mark.parametrize(
    "uploads",
    [
        pytest.param([(1, {0: 0}, 100), (2, {0: 0, 1: 101}, 155)], id="old-epoch-ends-right-before-the-new"),
        pytest.param([(2, {1: 101}, 155), (1, {0: 0}, 100)], id="old-segment-accepted-late-within-its-epoch"),
        pytest.param([(1, {0: 0}, 100), (1, {0: 101}, 200)], id="newest-epoch-growing"),
        pytest.param([(2, {0: 0, 1: 0}, 80), (2, {1: 81}, 155)], id="an-epoch-with-no-offsets"),
    ],
)
def test_native_uploads_along_one_lineage_are_not_zombies(cluster, uploads):
    cluster.change(10_000, leader=2)
    for n, (broker, epochs, end) in enumerate(uploads):
        native_upload(cluster, 11_000 + 1000 * n, f"seg-{n}", broker, epochs, end)
    assert cluster.keys() == []


def test_a_native_zombie_upload_that_never_finishes_is_not_a_violation(cluster):
    cluster.change(10_000, leader=2)
    native_upload(cluster, 11_000, "seg-new", 2, {0: 0, 1: 101}, 155)
    body = s.remote_segment(
        cluster.topic_id, 0, "seg-old", broker_id=1, start=0, end=123, leader_epochs={0: 0}, cleaner={}
    )
    native(cluster, 12_000, body)
    assert cluster.keys() == []
