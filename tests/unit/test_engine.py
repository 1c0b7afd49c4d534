"""The Detector as a whole: unverified events, dead letters, deterministic alert
ids and evidence, arrival-order independence within ``lateness_ms``, and the
rule catalog's test coverage."""

from __future__ import annotations

import ast
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import detectors.rules  # noqa: F401  (registers every rule)
from detectors.engine import TOO_LATE, Detector
from detectors.errors import KafkaError
from detectors.rules.base import RULES
from producers import shapes as s

NONE = KafkaError.NONE
QUORUM = [1001, 1002, 1003]


# ---- events the view cannot verify ---------------------------------------------------------


def _unknown_topic_produce(h: Any) -> None:
    h.request(5000, 2, s.produce("payments", 0, NONE))


def _unknown_topic_fetch(h: Any) -> None:
    h.change(5000, leader=2)
    h.request(9000, 2, s.fetch("payments", 0, NONE, epoch=0))


def _unknown_partition_stop_replica(h: Any) -> None:
    h.request(5000, 3, s.stop_replica("orders", 7, 0, NONE))


def _partition_created_after_the_event(h: Any) -> None:
    h.request(5000, 2, s.produce("orders", 1, NONE))
    h.metadata(10_000, s.partition(h.topic_id, 1, [1, 2, 3], [1, 2, 3], 1))


def _alter_partition_from_unknown_broker(h: Any) -> None:
    body = s.alter_partition(
        h.topic,
        h.topic_id,
        0,
        broker_id=9,
        broker_epoch=90,
        leader_epoch=0,
        partition_epoch=0,
        new_isr=[1, 2, 3],
        error=NONE,
    )
    h.request(5000, h.controller, body)


def _isr_member_never_registered(h: Any) -> None:
    h.change(5000, replicas=[1, 2, 3, 9], isr=[1, 2, 3, 9])


def _leader_never_registered(h: Any) -> None:
    h.change(5000, replicas=[1, 2, 3, 9], leader=9)


def _partition_change_before_its_record(h: Any) -> None:
    h.metadata(5000, s.topic("payments", "cGF5bWVudHMtdG9waWMtMDE"))
    h.metadata(5000, s.partition_change("cGF5bWVudHMtdG9waWMtMDE", 0, leader=2))


def _remote_update_for_unseen_segment(h: Any) -> None:
    h.remote(5000, s.remote_update(h.topic_id, 0, "seg-x", broker_id=2, state="DELETE_SEGMENT_FINISHED"))


def _remote_delete_on_unknown_partition(h: Any) -> None:
    tid = "dW5rbm93bi10b3BpYy1pZDE"
    body = s.remote_segment(
        tid, 0, "seg-1", broker_id=1, start=0, end=100, leader_epochs={0: 0}, cleaner={0: 100}
    )
    h.remote(5000, body)
    h.remote(5100, s.remote_update(tid, 0, "seg-1", broker_id=1, state="COPY_SEGMENT_FINISHED"))
    h.remote(6000, s.remote_update(tid, 0, "seg-1", broker_id=2, state="DELETE_SEGMENT_STARTED"))
    h.remote(6100, s.remote_update(tid, 0, "seg-1", broker_id=2, state="DELETE_SEGMENT_FINISHED"))


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (_unknown_topic_produce, "unknown partition"),
        (_unknown_topic_fetch, "unknown partition"),
        (_unknown_partition_stop_replica, "unknown partition"),
        (_partition_created_after_the_event, "partition created after the event"),
        (_alter_partition_from_unknown_broker, "unknown broker"),
        (_isr_member_never_registered, "ISR member never registered in the view"),
        (_leader_never_registered, "leader never registered in the view"),
        (_partition_change_before_its_record, "partition change before its partition record"),
        (_remote_update_for_unseen_segment, "update for a remote segment not seen"),
        (_remote_delete_on_unknown_partition, "unknown partition"),
    ],
    ids=lambda v: v.__name__.strip("_") if callable(v) else None,
)
def test_events_the_view_cannot_verify_are_counted_never_alerted(cluster, build, reason):
    build(cluster)
    outcome = cluster.run()
    assert outcome.keys == []
    assert outcome.dead_letters == []
    assert outcome.counters.unverified == {reason: 1}


# ---- dead letters --------------------------------------------------------------------------


def _set(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``body`` with the field at dotted ``path`` (list indexes as numbers) set,
    or removed when ``value`` is ``...``."""
    *parents, last = path.split(".")
    node: Any = body
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return body


DEAD = {
    "produce-missing-acks": (
        lambda h: ("request", _set(s.produce("orders", 0, NONE), "request.acks", ...)),
        "body.request.acks",
    ),
    "produce-version-not-int": (
        lambda h: ("request", _set(s.produce("orders", 0, NONE), "requestHeader.requestApiVersion", "9")),
        "body.requestHeader.requestApiVersion",
    ),
    "produce-missing-response-index": (
        lambda h: (
            "request",
            _set(s.produce("orders", 0, NONE), "response.responses.0.partitionResponses.0.index", ...),
        ),
        "partitionResponses[0].index",
    ),
    "fetch-epoch-not-int": (
        lambda h: (
            "request",
            _set(s.fetch("orders", 0, NONE), "request.topics.0.partitions.0.currentLeaderEpoch", "0"),
        ),
        "currentLeaderEpoch",
    ),
    "stop-replica-epoch-not-int": (
        lambda h: (
            "request",
            _set(
                s.stop_replica("orders", 0, 0, NONE),
                "request.topicStates.0.partitionStates.0.leaderEpoch",
                "0",
            ),
        ),
        "leaderEpoch",
    ),
    "alter-partition-missing-broker-id": (
        lambda h: (
            "request",
            _set(
                s.alter_partition(
                    h.topic,
                    h.topic_id,
                    0,
                    broker_id=1,
                    broker_epoch=10,
                    leader_epoch=0,
                    partition_epoch=0,
                    new_isr=[1, 2, 3],
                    error=NONE,
                ),
                "request.brokerId",
                ...,
            ),
        ),
        "body.request.brokerId",
    ),
    "partition-isr-not-a-list": (
        lambda h: ("metadata", _set(s.partition(h.topic_id, 1, [1], [1], 1), "data.isr", "1")),
        "data.isr",
    ),
    "partition-change-leader-not-int": (
        lambda h: ("metadata", s.partition_change(h.topic_id, 0, leader="2")),  # type: ignore[arg-type]
        "data.leader",
    ),
    "register-broker-missing-epoch": (
        lambda h: ("metadata", _set(s.register_broker(4, 40), "data.brokerEpoch", ...)),
        "data.brokerEpoch",
    ),
    "quorum-state-missing-epoch": (
        lambda h: ("quorum_state", _set(s.quorum_state(1001, 5, 1001, QUORUM), "leaderEpoch", ...)),
        "body.leaderEpoch",
    ),
    "remote-state-unknown": (
        lambda h: (
            "remote_log_metadata",
            s.remote_update(h.topic_id, 0, "seg-1", broker_id=1, state="COPY_SEGMENT_MAYBE"),
        ),
        "data.remoteLogSegmentState",
    ),
}


@pytest.mark.parametrize("case", sorted(DEAD))
def test_bad_body_becomes_a_dead_letter_naming_the_field(cluster, case):
    build, field = DEAD[case]
    kind, body = build(cluster)
    node = None if kind in ("metadata", "remote_log_metadata") else 2
    bad = cluster.add(s.envelope(cluster.cluster_name, kind, 5000, body, node=node, offset=None))
    cluster.request(13_000, 3, s.produce("orders", 0, NONE))  # the detector carries on
    outcome = cluster.run()
    assert len(outcome.dead_letters) == 1
    letter = outcome.dead_letters[0]
    assert field in letter.reason
    assert letter.position == bad.position
    assert outcome.counters.events["dead_letter"] == 1
    assert outcome.keys == [("PRODUCE_ACCEPTED_BY_NON_LEADER", 3, 13_000, 0, "orders")]


# ---- a history raising many rules, used for ids, evidence and arrival order -----------------


def many_rules(h: Any) -> None:
    """The standard cluster, broker 2 elected at 10 000 ms, then a violation of
    most rules, plus look-alikes that must stay silent whatever the arrival order."""
    h.request(9500, 2, s.produce("orders", 0, NONE))  # the new leader's clock runs ahead: fine
    h.change(10_000, leader=2)  # leader epoch 1, partition epoch 1
    h.request(10_500, 2, s.produce("orders", 0, NONE, epoch=1))  # fine
    h.request(11_000, 1, s.produce("orders", 0, NONE))  # within grace: fine
    h.request(13_000, 1, s.produce("orders", 0, NONE))  # not the leader
    h.request(13_500, 2, s.produce("orders", 0, NONE, epoch=0))  # stale epoch
    h.request(13_600, 3, s.fetch("orders", 0, NONE, epoch=0))  # stale read
    h.request(13_700, 3, s.stop_replica("orders", 0, 0, NONE))  # stale StopReplica
    h.metadata(14_000, s.broker_change(3, 12, fenced=1))
    h.change(14_100, isr=[1, 2])
    h.change(14_200, isr=[1, 2, 3])  # fenced broker admitted
    stale = s.alter_partition(
        h.topic,
        h.topic_id,
        0,
        broker_id=1,
        broker_epoch=10,
        leader_epoch=0,
        partition_epoch=0,
        new_isr=[1, 2],
        error=NONE,
    )
    h.request(14_300, h.controller, stale)
    # The metadata quorum: 1001 led epoch 5, 1002 leads 6; 1001 keeps serving, then steps down.
    h.quorum_state(10_500, 1001, s.quorum_state(1001, 5, 1001, QUORUM))
    h.quorum_state(11_500, 1002, s.quorum_state(1002, 6, 1002, QUORUM))
    h.quorum_state(11_800, 1003, s.quorum_state(1003, 6, 1003, QUORUM))  # a second leader of 6
    h.request(11_600, 1001, s.quorum_fetch(1001, 5, 1003))  # within grace: fine
    # A zombie: past the grace window after 1002's claim, stamped by another clock,
    # plus the grace window that clock may be off by (clocks unmeasured).
    h.request(15_600, 1001, s.quorum_fetch(1001, 5, 1003))
    h.quorum_state(16_500, 1001, s.quorum_state(1002, 6, 1002, QUORUM))  # resolved
    # Tiered storage: broker 1's compaction upload is a zombie once broker 2's lands.
    for ts_ms, segment, broker, cleaner in [
        (9000, "seg-1", 1, {0: 123}),
        (11_000, "seg-2", 2, {0: 100, 1: 155}),
    ]:
        body = s.remote_segment(
            h.topic_id, 0, segment, broker_id=broker, start=0, end=200, leader_epochs={0: 0}, cleaner=cleaner
        )
        h.remote(ts_ms, body)
    h.remote(11_300, s.remote_update(h.topic_id, 0, "seg-2", broker_id=2, state="COPY_SEGMENT_FINISHED"))
    h.remote(11_400, s.remote_update(h.topic_id, 0, "seg-1", broker_id=1, state="COPY_SEGMENT_FINISHED"))


MANY_RULES_KEYS = [
    ("ALTER_PARTITION_STALE_EPOCH_ACCEPTED", 3000, 14_300, 0, "orders"),
    ("FETCH_STALE_EPOCH_SERVED", 3, 13_600, 0, "orders"),
    ("ISR_INELIGIBLE_REPLICA_ADMITTED", 3, 14_200, 0, "orders"),
    ("PRODUCE_ACCEPTED_BY_NON_LEADER", 1, 13_000, 0, "orders"),
    ("PRODUCE_STALE_EPOCH_ACCEPTED", 2, 13_500, 0, "orders"),
    ("QUORUM_TWO_LEADERS_IN_EPOCH", 1003, 11_800, None, None),
    ("QUORUM_ZOMBIE_LEADER", 1001, 15_600, None, None),
    ("QUORUM_ZOMBIE_LEADER", 1001, 16_500, None, None),
    ("REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED", 1, 11_400, 0, "orders"),
    ("STOP_REPLICA_STALE_EPOCH_APPLIED", 3, 13_700, 0, "orders"),
]


def summary(alerts: list[Any]) -> list[tuple[Any, ...]]:
    """Alerts as comparable tuples, in a canonical order."""
    return sorted((a.rule, a.node, a.ts_ms, a.partition, a.topic, a.status, a.alert_id) for a in alerts)


def test_many_rules_history_raises_exactly_its_violations(cluster):
    many_rules(cluster)
    outcome = cluster.run(order=cluster.time_order())
    assert outcome.dead_letters == []
    assert sorted(outcome.keys, key=lambda k: (k[0], k[2])) == MANY_RULES_KEYS
    assert outcome.counters.late == 0
    assert outcome.counters.unverified == {}


# ---- alert ids and evidence ----------------------------------------------------------------


def test_alert_ids_are_deterministic_and_ignore_read_positions_and_wall_time(cluster):
    many_rules(cluster)
    order = cluster.time_order()
    first = cluster.run(order=order).alerts
    detector = Detector(cluster.config, now_ms=lambda: 7)  # another wall clock
    for i in order:
        assert detector.ingest(replace(cluster.envelopes[i], position=f"topic/0@{1000 + i}")) == []
    detector.flush()
    second = detector.drain()
    assert [a.alert_id for a in first] == [a.alert_id for a in second]
    assert {a.detected_ms for a in second} == {7}
    assert len({a.alert_id for a in first}) == len(first) == len(MANY_RULES_KEYS)


def test_alert_ids_differ_between_clusters(cluster):
    many_rules(cluster)
    order = cluster.time_order()
    ids = {a.alert_id for a in cluster.run(order=order).alerts}
    detector = Detector(cluster.config, now_ms=lambda: 0)
    for i in order:
        detector.ingest(replace(cluster.envelopes[i], cluster="other"))
    detector.flush()
    other = {a.alert_id for a in detector.drain()}
    assert len(other) == len(ids)
    assert not ids & other


def test_evidence_ends_with_the_violating_event(cluster):
    many_rules(cluster)
    outcome = cluster.run(order=cluster.time_order())
    by_position = {env.position: env for env in cluster.envelopes}
    for alert in outcome.alerts:
        *established, violating = alert.evidence
        assert violating.role == "violation", alert.rule
        assert violating.ts_ms == alert.ts_ms, alert.rule
        source = by_position[violating.position]
        assert (source.ts_ms, source.kind, source.node) == (violating.ts_ms, violating.kind, violating.node)
        for item in established:
            assert item.position in by_position, alert.rule
            assert by_position[item.position].offset == item.offset


def test_stale_produce_evidence_names_the_metadata_that_set_the_epoch(cluster):
    cluster.change(10_000, leader=2)
    election = cluster.envelopes[-1]
    violating = cluster.request(13_000, 2, s.produce("orders", 0, NONE, epoch=0))
    (alert,) = cluster.run().alerts
    assert [(e.role, e.kind, e.offset, e.position) for e in alert.evidence] == [
        ("view", "metadata", election.offset, election.position),
        ("violation", "request", None, violating.position),
    ]
    assert alert.to_dict()["evidence"][-1]["position"] == violating.position


def test_the_same_violation_re_shipped_is_alerted_once(cluster):
    cluster.change(10_000, leader=2)
    body = s.produce("orders", 0, NONE)
    cluster.request(13_000, 1, body, correlation_id=42)
    cluster.request(13_000, 1, body, correlation_id=42)  # the shipper sent the line twice
    cluster.request(13_100, 1, body, correlation_id=43)  # another request
    assert cluster.keys() == [
        ("PRODUCE_ACCEPTED_BY_NON_LEADER", 1, 13_000, 0, "orders"),
        ("PRODUCE_ACCEPTED_BY_NON_LEADER", 1, 13_100, 0, "orders"),
    ]


# ---- arrival order -----------------------------------------------------------------------------


def skewed_order(envelopes: list[Any], delays: dict[tuple[str, int | None], int]) -> list[int]:
    """Arrival order when each source (a kind and node) ships its events in
    order but ``delays[source]`` ms late."""
    return sorted(
        range(len(envelopes)),
        key=lambda i: (envelopes[i].ts_ms + delays[(envelopes[i].kind, envelopes[i].node)], i),
    )


def sources(envelopes: list[Any]) -> list[tuple[str, int | None]]:
    return sorted({(e.kind, e.node) for e in envelopes}, key=str)


@pytest.mark.parametrize("seed", range(8))
def test_out_of_order_arrival_within_lateness_gives_the_same_alerts(cluster, seed):
    many_rules(cluster)
    in_order = cluster.run(order=cluster.time_order())
    rng = random.Random(seed)
    lateness_ms = cluster.config.lateness_ms
    delays = {source: rng.randrange(lateness_ms) for source in sources(cluster.envelopes)}
    order = skewed_order(cluster.envelopes, delays)
    skewed = cluster.run(order=order)
    arrival_ts = [env.ts_ms for env in skewed.arrival]
    assert arrival_ts != sorted(arrival_ts), "the skew must reorder something"
    assert skewed.counters.late == 0
    assert skewed.dead_letters == []
    assert summary(skewed.alerts) == summary(in_order.alerts)
    assert len(in_order.alerts) == len(MANY_RULES_KEYS)


@pytest.mark.parametrize("late_kind", ["metadata", "request", "quorum_state", "remote_log_metadata"])
def test_one_source_lagging_by_almost_lateness_gives_the_same_alerts(cluster, late_kind):
    many_rules(cluster)
    expected = summary(cluster.run(order=cluster.time_order()).alerts)
    lag_ms = cluster.config.lateness_ms - 1
    delays = {source: lag_ms if source[0] == late_kind else 0 for source in sources(cluster.envelopes)}
    skewed = cluster.run(order=skewed_order(cluster.envelopes, delays))
    assert skewed.counters.late == 0
    assert summary(skewed.alerts) == expected


def test_a_request_arriving_within_its_grace_window_but_beyond_lateness_is_judged(cluster):
    cluster.change(10_000, leader=2)
    cluster.request(13_000, 1, s.produce("orders", 0, NONE))
    cluster.metadata(15_500, s.feature_level(21))  # watermark 14 500: 13 000 + grace not yet passed
    n = len(cluster.envelopes)
    outcome = cluster.run(order=[*range(n - 2), n - 1, n - 2])  # the produce arrives 2.5 s late
    assert outcome.counters.late == 1
    assert outcome.keys == [("PRODUCE_ACCEPTED_BY_NON_LEADER", 1, 13_000, 0, "orders")]


def test_a_request_arriving_after_its_grace_window_closed_is_refused_and_counted(cluster):
    # Its window's states may be pruned by now, and a re-delivery this old could
    # not be told from a new record: judging it could raise a false alarm.
    cluster.change(10_000, leader=2)
    cluster.request(13_000, 1, s.produce("orders", 0, NONE))
    cluster.metadata(20_000, s.feature_level(21))
    n = len(cluster.envelopes)
    outcome = cluster.run(order=[*range(n - 2), n - 1, n - 2])  # the produce arrives 7 s late
    assert outcome.counters.late == 1
    assert outcome.keys == []
    assert outcome.counters.unverified == {TOO_LATE: 1}


def test_judgments_wait_for_grace_and_lateness(cluster):
    cluster.change(10_000, leader=2)
    cluster.request(13_000, 1, s.produce("orders", 0, NONE))
    detector = Detector(cluster.config, now_ms=lambda: 0)
    for env in cluster.envelopes:
        detector.ingest(env)
    assert detector.drain() == []
    assert detector.pending_count() == 1
    tick = cluster.metadata(13_000 + cluster.config.judge_delay_ms, s.feature_level(21))
    detector.ingest(tick)
    assert [a.rule for a in detector.drain()] == ["PRODUCE_ACCEPTED_BY_NON_LEADER"]
    assert detector.pending_count() == 0


# ---- the rule catalog ----------------------------------------------------------------------


def _violation_tests() -> dict[str, list[str]]:
    """rule id -> the tests in this directory marked ``@pytest.mark.violation(rule id)``
    whose body names that rule (in the alert they expect)."""
    found: dict[str, list[str]] = {}
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef) or not fn.name.startswith("test_"):
                continue
            body = "\n".join(ast.unparse(stmt) for stmt in fn.body)
            for decorator in fn.decorator_list:
                if (
                    isinstance(decorator, ast.Call)
                    and ast.unparse(decorator.func) == "pytest.mark.violation"
                    and isinstance(decorator.args[0], ast.Constant)
                ):
                    rule_id = decorator.args[0].value
                    if rule_id in body:
                        found.setdefault(rule_id, []).append(f"{path.name}::{fn.name}")
    return found


VIOLATION_TESTS = _violation_tests()


@pytest.mark.parametrize("rule_id", sorted(RULES))
def test_every_rule_has_a_violation_test(rule_id):
    assert VIOLATION_TESTS.get(rule_id), f"no @pytest.mark.violation({rule_id!r}) test asserts it"


def test_violation_markers_name_registered_rules():
    assert set(VIOLATION_TESTS) <= set(RULES)


@pytest.mark.parametrize("rule_id", sorted(RULES))
def test_every_rule_documents_its_source_and_what_is_not_a_violation(rule_id):
    rule = RULES[rule_id]
    doc = " ".join((rule.__doc__ or "").split())
    assert any(p in doc for p in rule.proposals), doc
    assert "Not a violation" in doc
    assert rule.severity in ("critical", "warning", "info")
    assert rule.links()
