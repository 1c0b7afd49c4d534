"""A cluster split into buckets (detectors.buckets) raises exactly the alerts,
dead letters and counts of one detector over the whole cluster.

Here the split runs in one process: each envelope goes to the detectors of the
buckets ``buckets_of`` names, the first as its home, as the streaming job's
routing does before its shuffle (tests/unit/test_routing.py holds the Spark SQL
routing to ``buckets_of``). Histories come from the simulator, with its faults,
and arrive in order, delayed per source within lateness, or re-delivered.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from detectors import engine
from detectors.alerts import Alert
from detectors.buckets import Bucket
from detectors.cluster import Counters
from detectors.engine import Detector
from detectors.envelope import Envelope, envelope_from_obj
from detectors.split import Split
from producers import shapes as s
from tests.unit.test_simulated_histories import (
    CONFIG,
    WARMUP_MS,
    delayed_arrival,
    detect,
    envelopes,
    examples,
    seeds,
    simulate,
)

COUNTS = (1, 7, 64)


def split_run(arrival: Iterable[Envelope], count: int) -> tuple[list[Alert], Split]:
    split = Split(count, CONFIG)
    for env in arrival:
        split.ingest(env)
    return split.finish(), split


def comparable(alerts: Sequence[Alert]) -> list[dict[str, object]]:
    return sorted((a.to_dict() for a in alerts), key=lambda a: str(a["alert_id"]))


def same_counts(whole: Counters, split: dict[str, object]) -> None:
    assert split["events"] == whole.events
    assert split["unverified"] == whole.unverified
    assert split["dead_letters"] == whole.dead_letters
    assert split["duplicates"] == whole.duplicates
    assert sorted(map(tuple, split["alerts"])) == sorted((*k, n) for k, n in whole.alerts.items())


@pytest.mark.parametrize("count", COUNTS)
@examples(2)
@given(seed=seeds, events=st.integers(16_000, 24_000), fault_rate=st.sampled_from([0.005, 0.01, 0.02]))
def test_buckets_raise_the_alerts_of_the_whole_cluster(count, seed, events, fault_rate):
    sim = simulate(seed, fault_rate, warmup_ms=WARMUP_MS)
    history = envelopes(sim, events)
    whole = detect(history)
    assert whole.alerts, "no alert to compare: the history is too short for the fault rate"
    alerts, split = split_run(history, count)
    assert comparable(alerts) == comparable(whole.alerts)
    assert split.dead_letters == whole.dead_letters
    same_counts(whole.counters, split.snapshot(history[0].cluster))
    if count > 1:
        # The split really spread the work: the simulator's topics have 3 to 6 partitions.
        assert sum(1 for n in split.own_records if n) >= min(count, 6)


@pytest.mark.parametrize("count", (7, 64))
@examples(1)
@given(seed=seeds, events=st.integers(16_000, 20_000), shuffle_seed=seeds)
def test_buckets_under_per_source_delays_within_lateness(count, seed, events, shuffle_seed):
    sim = simulate(seed, 0.01, warmup_ms=WARMUP_MS)
    history = envelopes(sim, events)
    arrival, _ = delayed_arrival(history, random.Random(shuffle_seed))
    whole = detect(arrival)
    alerts, split = split_run(arrival, count)
    assert comparable(alerts) == comparable(whole.alerts)
    assert split.dead_letters == whole.dead_letters == []


@pytest.mark.parametrize("count", (7, 64))
@examples(1)
@given(seed=seeds, events=st.integers(12_000, 16_000), shuffle_seed=seeds)
def test_buckets_under_redelivery_count_each_duplicate_once(count, seed, events, shuffle_seed):
    sim = simulate(seed, 0.01, warmup_ms=WARMUP_MS)
    history = envelopes(sim, events)
    rng = random.Random(shuffle_seed)
    start = rng.randrange(len(history) // 2)
    # A shipper re-ships a slice right after shipping it: every record of it twice.
    arrival = [*history[: start + 500], *history[start : start + 500], *history[start + 500 :]]
    whole = detect(arrival)
    alerts, split = split_run(arrival, count)
    assert whole.counters.duplicates >= 500
    assert comparable(alerts) == comparable(whole.alerts)
    same_counts(whole.counters, split.snapshot(history[0].cluster))


def test_bad_records_are_dead_lettered_once_whatever_their_buckets():
    topic_id = "qG8hUlWTTJ2eRb_bFvWRXg"
    bad_produce = s.envelope("c1", "request", 2000, {"requestHeader": {"requestApiKey": 0}}, node=1)
    bad_stop = s.envelope(
        "c1",
        "request",
        2000,
        {"requestHeader": {"requestApiKey": 5, "requestApiVersion": 3, "correlationId": 1}},
        node=2,
    )
    bad_metadata = s.envelope("c1", "metadata", 2000, {"type": "TOPIC_RECORD", "data": {}}, offset=3)
    good = [
        s.envelope("c1", "metadata", 1000, s.topic("orders", topic_id), offset=1),
        s.envelope("c1", "metadata", 1000, s.partition(topic_id, 5, [1, 2], [1, 2], 1), offset=2),
    ]
    raws = [*good, bad_produce, bad_stop, bad_metadata]
    history = [envelope_from_obj(raw, f"t:{i}", i) for i, raw in enumerate(raws)]
    whole = detect(history)
    assert len(whole.dead_letters) == 3
    for count in COUNTS:
        _, split = split_run(history, count)
        assert split.dead_letters == whole.dead_letters
        same_counts(whole.counters, split.snapshot("c1"))


def test_controller_epochs_fence_stop_replica_alike_in_every_split():
    """UpdateMetadata, like StopReplica and LeaderAndIsr, reaches every bucket:
    the controller epoch broker 3 accepted from it fences a later StopReplica
    from an older controller, judged once in the StopReplica's home, while
    each bucket judges the leader epochs of its own partitions."""
    topic_id = "qG8hUlWTTJ2eRb_bFvWRXg"
    indexes = range(9)
    raws = [s.envelope("c1", "metadata", 1000, s.topic("orders", topic_id), offset=1)]
    for broker, epoch in {1: 10, 2: 11, 3: 12}.items():
        raws.append(s.envelope("c1", "metadata", 1000, s.register_broker(broker, epoch, fenced=False)))
    for i in indexes:
        raws.append(s.envelope("c1", "metadata", 1000, s.partition(topic_id, i, [1, 2, 3], [1, 2, 3], 1)))
        raws.append(s.envelope("c1", "metadata", 3000, s.partition_change(topic_id, i, leader=2)))
    update_metadata = {
        "requestHeader": {"requestApiKey": 6, "requestApiVersion": 7, "correlationId": 1, "clientId": "c"},
        "request": {"controllerId": 3000, "controllerEpoch": 5, "brokerEpoch": 12, "topicStates": []},
        "response": {"errorCode": 0},
    }
    raws.append(s.envelope("c1", "request", 5000, update_metadata, node=3))
    stop = s.stop_replica("orders", 0, 0, 0, controller_epoch=4)
    stop["request"]["topicStates"][0]["partitionStates"] = [
        {"partitionIndex": i, "leaderEpoch": 0, "deletePartition": False} for i in indexes
    ]
    stop["response"]["partitionErrors"] = [
        {"topicName": "orders", "partitionIndex": i, "errorCode": 0} for i in indexes
    ]
    raws.append(s.envelope("c1", "request", 6000, stop, node=3))
    for offset, raw in enumerate(raws, start=1):
        if raw["kind"] == "metadata":
            raw["offset"] = offset
    history = [envelope_from_obj(raw, f"t:{i}", i) for i, raw in enumerate(raws)]
    whole = detect(history)
    assert sorted(a.rule for a in whole.alerts) == [
        "STOP_REPLICA_STALE_CONTROLLER_ACCEPTED",
        *["STOP_REPLICA_STALE_EPOCH_APPLIED"] * len(indexes),
    ]
    for count in COUNTS:
        alerts, split = split_run(history, count)
        assert comparable(alerts) == comparable(whole.alerts)
        same_counts(whole.counters, split.snapshot("c1"))


def test_a_stop_replica_copy_queues_a_judgment_only_where_there_is_one_to_make():
    """Every bucket receives a StopReplica for its controller epoch, but only
    its home (which judges the epoch) and the buckets of its partitions have
    anything of it to judge: the other copies queue nothing (with 64 buckets
    and one partition, 62 of the 64 would otherwise wait out the grace window
    and be stored with each bucket's pending judgments)."""
    stop = envelope_from_obj(s.envelope("c1", "request", 6000, s.stop_replica("orders", 5, 0, 0), node=3))
    pending = {}
    for index in (0, 5, 6):
        detector = Detector(CONFIG, bucket=Bucket(index, 64), now_ms=lambda: 0)
        detector.ingest(stop, home=index == 0)
        pending[index] = detector.pending_count()
    assert pending == {0: 1, 5: 1, 6: 0}


def _controller_request(api_key: int) -> dict[str, object]:
    """A StopReplica, UpdateMetadata or LeaderAndIsr line broker 3 accepted."""
    if api_key == 5:
        return s.stop_replica("orders", 5, 0, 0, controller_epoch=5)
    header = {"requestApiKey": api_key, "requestApiVersion": 7, "correlationId": 1, "clientId": "c"}
    request: dict[str, object] = {"controllerId": 3000, "controllerEpoch": 5, "brokerEpoch": 12}
    request["topicStates"] = [
        {
            "topicName": "orders",
            "topicId": "qG8hUlWTTJ2eRb_bFvWRXg",
            "partitionStates": [
                {"partitionIndex": 5, "controllerEpoch": 5, "leader": 1, "leaderEpoch": 0, "isr": [1, 3]}
                | {"partitionEpoch": 0, "replicas": [1, 3]}
            ],
        }
    ]
    return {"requestHeader": header, "request": request, "response": {"errorCode": 0}}


@pytest.mark.parametrize(
    ("api_key", "decoder"), [(5, "stop_replica"), (6, "update_metadata"), (4, "leader_and_isr")]
)
def test_a_request_reaching_every_bucket_is_decoded_once(monkeypatch, api_key, decoder):
    """The buckets of one process share the envelope of a fanned-out record
    (streaming.processor, detectors.split): its body is decoded by the first
    bucket and read by the other 63, which judge as before."""
    decoded: list[int] = []
    decode = getattr(engine, decoder)

    def counted(*args: object) -> object:
        decoded.append(id(args[-1]))
        return decode(*args)

    monkeypatch.setattr(engine, decoder, counted)
    raw = _controller_request(api_key)
    record = envelope_from_obj(s.envelope("c1", "request", 6000, raw, node=3))
    pending = []
    for index in range(64):
        detector = Detector(CONFIG, bucket=Bucket(index, 64), now_ms=lambda: 0)
        detector.ingest(record, home=index == 0)
        pending.append(detector.pending_count())
        assert detector.cluster("c1").controller_epochs[3].latest[0] == 5
    assert decoded == [id(record.body)]
    if api_key == 5:  # judged at home (the controller epoch) and where its partition is
        assert [i for i, n in enumerate(pending) if n] == [0, 5]
    # The same content in another record is decoded for that record.
    again = envelope_from_obj(s.envelope("c1", "request", 6001, _controller_request(api_key), node=3))
    Detector(CONFIG, bucket=Bucket(5, 64), now_ms=lambda: 0).ingest(again, home=False)
    assert decoded == [id(record.body), id(again.body)]
