"""A data-plane request decoded once at the streaming job's source
(detectors.request_facts, routing.route_record with ``decode``) is judged
exactly as the per-record path judges its raw value.

The property runs simulated histories (every fault kind, clock faults, with
clocks measured or not) through both paths the way the job's operator does:
each record routed to its buckets, its home bucket first, re-delivered
records and records a reader rejects mixed in. Both must give the same
alerts, dead letters and counters.
"""

from __future__ import annotations

import marshal
import random

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

import detectors.rules  # noqa: F401  (registers every rule)
from detectors.buckets import Bucket
from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import DeadLetter, Envelope, parse_envelope
from detectors.request_facts import pack_record, unpack
from producers.sim_clocks import parse_clock
from producers.simulator import SimConfig, Simulator
from streaming.routing import route_record
from tests.unit.test_simulated_histories import WARMUP_MS, examples, seeds

CLUSTER = "sim-1"


def records(seed: int, events: int, fault_rate: float, clock: str | None) -> list[bytes]:
    """A simulated history as Kafka values, with re-deliveries and spoiled
    bodies mixed in (seeded)."""
    config = SimConfig(
        seed=seed,
        fault_rate=fault_rate,
        warmup_ms=WARMUP_MS,
        clocks=() if clock is None else (parse_clock(clock),),
    )
    values = [orjson.dumps(raw) for raw in Simulator(config).events(events)]
    rng = random.Random(seed)
    out: list[bytes] = []
    for value in values:
        roll = rng.random()
        if roll < 0.01 and b'"partitionIndex":' in value:
            # A body the partition reader rejects: a dead letter either way.
            value = value.replace(b'"partitionIndex":', b'"partitionIndex":"x","was":', 1)
        out.append(value)
        if roll > 0.98 and out:
            out.append(rng.choice(out[-50:]))  # shipped again
    return out


def run(values: list[bytes], count: int, config: DetectorConfig, decode: bool) -> tuple[list, list, dict]:
    """Every record through the operator's steps (streaming/processor.py) for
    ``count`` buckets; the alerts, dead letters and counters of all buckets."""
    detectors = [Detector(config, bucket=Bucket(i, count), now_ms=lambda: 0) for i in range(count)]
    letters: list[DeadLetter] = []
    for offset, value in enumerate(values):
        _, buckets, request = route_record(CLUSTER, value, count, decode)
        position = f"events/0@{offset}"
        for bucket in buckets:
            home = bucket == buckets[0]
            data = None
            if request is not None:
                item, data = unpack(request, position, offset)
            else:
                item = parse_envelope(value, position, offset)
            if isinstance(item, DeadLetter):
                if home:
                    letters.append(item)
                continue
            letters.extend(detectors[bucket].ingest(item, home, data))
    alerts = []
    for detector in detectors:
        letters.extend(detector.flush())
        alerts.extend(a.to_dict() for a in detector.drain())
    counters = [detector.snapshot(CLUSTER) for detector in detectors]
    return sorted(alerts, key=lambda a: str(a["alert_id"])), letters, counters


@examples(3)
@given(
    seed=seeds,
    events=st.integers(8_000, 14_000),
    fault_rate=st.sampled_from([0.005, 0.02]),
    clock=st.sampled_from([None, "3=+3s", "2=-2s", "3000=+3s"]),
    layout=st.sampled_from([(1, True), (1, False), (8, False)]),
)
def test_requests_decoded_at_the_source_are_judged_as_their_raw_values(
    seed, events, fault_rate, clock, layout
):
    count, measure = layout
    config = DetectorConfig(measure_clocks=measure)
    values = records(seed, events, fault_rate, clock)
    decoded = sum(route_record(CLUSTER, v, count, True)[2] is not None for v in values)
    assert decoded > len(values) // 2, "most records of a history are data-plane requests"
    per_record = run(values, count, config, decode=False)
    at_source = run(values, count, config, decode=True)
    assert per_record[0], "no alert to compare: the history is too short for the fault rate"
    assert at_source[0] == per_record[0]
    assert at_source[1] == per_record[1]
    assert at_source[2] == per_record[2]


# ---- which records are decoded at the source -------------------------------------------------------


def request(api_key: int, request_body: dict, **envelope: object) -> dict:
    return {
        "cluster": CLUSTER,
        "node": 1,
        "ts_ms": 1_000,
        "kind": "request",
        "body": {
            "requestHeader": {
                "requestApiKey": api_key,
                "requestApiVersion": 9,
                "correlationId": 7,
                "clientId": "c",
            },
            "request": request_body,
            "response": {},
            "totalTimeMs": 3,
        },
        **envelope,
    }


PRODUCE = request(0, {"acks": -1, "topicData": [{"name": "t", "partitionData": [{"index": 0}]}]})
FETCH = request(1, {"topics": [{"topic": "t", "partitions": [{"partition": 2, "currentLeaderEpoch": 4}]}]})


def packed(document: dict, cluster: str = CLUSTER) -> bytes | None:
    raw = orjson.dumps(document)
    return pack_record(orjson.loads(raw), raw, cluster)


@pytest.mark.parametrize("document", [PRODUCE, FETCH], ids=["produce", "fetch"])
def test_a_data_plane_request_is_decoded_to_what_the_per_record_path_reads(document):
    raw = orjson.dumps(document)
    env, data = unpack(pack_record(orjson.loads(raw), raw, CLUSTER), "events/0@5", 5)
    expected = parse_envelope(raw, "events/0@5", 5)
    assert isinstance(expected, Envelope)
    assert (env.cluster, env.node, env.ts_ms, env.kind, env.offset, env.position, env.seq) == (
        expected.cluster,
        expected.node,
        expected.ts_ms,
        expected.kind,
        expected.offset,
        expected.position,
        expected.seq,
    )
    assert env.read_digest == expected.read_digest  # a re-delivery is known by the same identity
    assert env.body == {"totalTimeMs": 3}
    assert data.header.api_key == document["body"]["requestHeader"]["requestApiKey"]
    assert [o.partition for o in data.outcomes] == ([0] if document is PRODUCE else [2])
    assert data.acks == (-1 if document is PRODUCE else None)


def spoiled(document: dict, *path: str, value: object) -> dict:
    copy = orjson.loads(orjson.dumps(document))
    node = copy
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return copy


QUORUM_FETCH = request(
    1, {"replicaId": 2, "topics": [{"topic": "__cluster_metadata", "partitions": [{"partition": 0}]}]}
)


@pytest.mark.parametrize(
    ("document", "cluster"),
    [
        (spoiled(PRODUCE, "kind", value="metadata"), CLUSTER),  # not a request
        (request(5, {"controllerEpoch": 1}), CLUSTER),  # a StopReplica: read whole
        (QUORUM_FETCH, CLUSTER),  # read whole by the quorum rules
        (spoiled(PRODUCE, "offset", value=12), CLUSTER),  # known by its content, not its bytes
        (spoiled(PRODUCE, "body", "request", "acks", value="all"), CLUSTER),  # a dead letter
        (spoiled(FETCH, "body", "requestHeader", "requestApiVersion", value=None), CLUSTER),
        (spoiled(PRODUCE, "ts_ms", value=-1), CLUSTER),  # no envelope
        (PRODUCE, "another"),  # the record key names another cluster: a dead letter
    ],
    ids=[
        "metadata",
        "stop-replica",
        "quorum-fetch",
        "offset",
        "bad-acks",
        "bad-header",
        "bad-envelope",
        "cluster",
    ],
)
def test_every_other_record_takes_the_per_record_path(document, cluster):
    assert packed(document, cluster) is None


def test_the_source_hands_a_decoded_request_on_without_its_value_routed_as_before():
    raw = orjson.dumps(FETCH)
    for count in (1, 8):
        cluster, buckets, decoded = route_record(None, raw, count, decode=True)
        assert (cluster, buckets) == route_record(None, raw, count)[:2]
        assert decoded is not None
    assert route_record(CLUSTER, raw, 1) == (CLUSTER, [0], None)  # not asked: not decoded


def test_a_packed_request_of_another_layout_is_refused():
    _, *rest = marshal.loads(packed(PRODUCE))
    with pytest.raises(ValueError, match="layout 2"):
        unpack(marshal.dumps((2, *rest)), "events/0@1", 1)
