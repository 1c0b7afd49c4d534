"""streaming.routing against its reference, detectors.buckets.buckets_of.

route() runs in the tests' shared local Spark session (tests/conftest.py; no
Python worker) over static DataFrames with the Kafka source's columns, both
ways (``SIDES``): routed in Spark SQL, and routed at the source (the columns
the Kafka source adds with route_record):

- every envelope of a simulated history with injected faults, and hand-made
  requests naming many partitions, go to exactly buckets_of's buckets, with
  one home row (the lowest) and keys that decode to (cluster, bucket);
- generated bodies with wrong types at every level routing reads agree with
  buckets_of too;
- bad input (not JSON, wrong shapes, odd indexes, missing or conflicting
  cluster) gives exactly one home row and a sane key, also with
  spark.sql.json.enablePartialResults off;
- with one bucket the key is the cluster itself, one row per record.

The records where the SQL and buckets_of knowingly differ are strict xfails;
routed at the source, they agree.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
import pytest

from detectors.buckets import buckets_of
from detectors.envelope import Envelope, parse_envelope
from detectors.requests import METADATA_TOPIC, METADATA_TOPIC_ID
from producers import shapes as s
from producers.simulator import SimConfig, Simulator
from streaming.routing import (
    OUTPUT_COLUMNS,
    SEPARATOR,
    SOURCE_ROUTE_COLUMNS,
    decode_key,
    encode_key,
    route,
    route_record,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KAFKA_SCHEMA = "key string, value binary, topic string, partition int, offset long"
TOPIC = "fencewatch-events"
CLUSTER = "c1"
COUNTS = (1, 7, 64)
PARTIAL_RESULTS = "spark.sql.json.enablePartialResults"
# How route() gets each record's buckets: Spark SQL, or the source's route_record.
SIDES = ("sql", "source")

# (key, value) of one Kafka record.
Record = tuple[str | None, bytes | None]


@dataclass
class Routed:
    """route()'s rows of one record."""

    keys: list[str]
    homes: list[bool]
    values: list[bytes | None]

    def buckets(self, cluster: str, count: int) -> list[int]:
        """Its buckets, after checking that every key names ``cluster``."""
        decoded = [decode_key(key, count) for key in self.keys]
        assert {c for c, _ in decoded} == {cluster}, self.keys
        return [b for _, b in decoded]

    def check(self, cluster: str, count: int) -> tuple[int, ...]:
        """The invariants of any record's rows; returns its buckets, ascending."""
        buckets = self.buckets(cluster, count)
        assert len(buckets) == len(set(buckets)), f"a bucket twice: {buckets}"
        assert all(0 <= b < count for b in buckets), buckets
        assert self.homes.count(True) == 1, f"{self.homes.count(True)} home rows: {self.keys}"
        assert buckets[self.homes.index(True)] == min(buckets)
        if count == 1:
            assert self.keys == [cluster]
        else:
            assert all(
                key == encode_key(cluster, b, count) for key, b in zip(self.keys, buckets, strict=True)
            )
        return tuple(sorted(buckets))


@contextmanager
def partial_results(spark: SparkSession, enabled: bool) -> Iterator[None]:
    """With spark.sql.json.enablePartialResults set to ``enabled`` (default: true)."""
    before = spark.conf.get(PARTIAL_RESULTS) or "true"
    spark.conf.set(PARTIAL_RESULTS, str(enabled).lower())
    try:
        yield
    finally:
        spark.conf.set(PARTIAL_RESULTS, before)


def run(spark: SparkSession, records: list[Record], count: int, side: str = "sql") -> list[Routed]:
    """route() over ``records`` (offset i is records[i]), routed on ``side``;
    the rows of each, in order."""
    if side == "sql":
        frame = spark.createDataFrame(
            [(key, value, TOPIC, i % 3, i) for i, (key, value) in enumerate(records)], KAFKA_SCHEMA
        )
    else:
        frame = spark.createDataFrame(
            [
                (key, value, TOPIC, i % 3, i, *route_record(key, value, count))
                for i, (key, value) in enumerate(records)
            ],
            f"{KAFKA_SCHEMA}, {SOURCE_ROUTE_COLUMNS}",
        )
    out = route(frame, count)
    assert tuple(out.columns) == OUTPUT_COLUMNS
    assert not out.schema["key"].nullable and not out.schema["home"].nullable
    rows: dict[int, Routed] = defaultdict(lambda: Routed([], [], []))
    for row in out.collect():
        assert row.topic == TOPIC and row.partition == row.offset % 3
        routed = rows[row.offset]
        routed.keys.append(row.key)
        routed.homes.append(row.home)
        routed.values.append(None if row.value is None else bytes(row.value))
    assert sorted(rows) == list(range(len(records))), "a record made no row"
    for i, (_, value) in enumerate(records):
        assert set(rows[i].values) == {value}
    return [rows[i] for i in range(len(records))]


def expected(value: bytes | None, count: int) -> tuple[int, ...] | None:
    """buckets_of for a record the detector parses into an envelope; None otherwise."""
    env = parse_envelope(value) if value is not None else None
    return buckets_of(env, count) if isinstance(env, Envelope) else None


def envelope(body: Any, kind: str = "request", cluster: str = CLUSTER) -> bytes:
    node = 1 if kind in ("request", "quorum_state") else None
    # The standard library's json: orjson writes no integer beyond 64 bits.
    return json.dumps(s.envelope(cluster, kind, 1_000, body, node=node)).encode()


def request(api_key: Any, request: Any) -> dict[str, Any]:
    return {"requestHeader": {"requestApiKey": api_key, "requestApiVersion": 0}, "request": request}


# ---- whole histories -------------------------------------------------------------------------------


def hand_made() -> list[bytes]:
    """Shapes the simulator does not write: requests naming many partitions,
    every partition-scoped API, LeaderAndIsr, UpdateMetadata, both quorum fetch forms."""
    fetch = request(
        1,
        {
            "topics": [
                {"topic": "a", "partitions": [{"partition": p} for p in (0, 7, 13, 64, 65, 200)]},
                {"topicId": "x", "partitions": [{"partition": 3}]},
                {"topic": "b"},  # no partitions: adds none
            ]
        },
    )
    produce = request(0, {"topicData": [{"name": "a", "partitionData": [{"index": 5}, {"index": 71}]}]})
    by_index = [
        request(api, {"topics": [{"name": "a", "partitions": [{"partitionIndex": p} for p in (2, 9, 66)]}]})
        for api in (2, 56)
    ]
    for_leader_epoch = request(23, {"topics": [{"topic": "a", "partitions": [{"partition": 12}]}]})
    leader_and_isr = request(4, {"controllerEpoch": 1, "topicStates": []})
    update_metadata = request(6, {"controllerEpoch": 1, "topicStates": [], "liveBrokers": []})
    quorum_by_name = request(1, {"topics": [{"topic": METADATA_TOPIC, "partitions": [{"partition": 5}]}]})
    quorum_by_id = s.quorum_fetch(1, 5, 2)
    two_topics_one_is_log = request(
        1,
        {
            "topics": [
                {"topic": METADATA_TOPIC, "partitions": [{"partition": 5}]},
                {"topic": "a", "partitions": [{"partition": 6}]},
            ]
        },
    )
    bodies = [
        fetch,
        produce,
        *by_index,
        for_leader_epoch,
        leader_and_isr,
        update_metadata,
        quorum_by_name,
        quorum_by_id,
    ]
    return [envelope(body) for body in [*bodies, two_topics_one_is_log]]


@pytest.fixture(scope="module")
def history() -> list[Record]:
    """A simulated history with injected faults, then the hand-made requests;
    every seventh record keyless (the cluster then comes from the envelope)."""
    sim = Simulator(SimConfig(seed=3, fault_rate=0.05, warmup_ms=300, partitions_per_topic=70))
    events = list(sim.events(3000))
    assert sim.injected, "no fault injected"
    values = [orjson.dumps(e) for e in events] + hand_made()
    return [(None if i % 7 == 0 else orjson.loads(v)["cluster"], v) for i, v in enumerate(values)]


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("count", COUNTS)
def test_history_goes_where_buckets_of_says(
    spark: SparkSession, history: list[Record], count: int, side: str
) -> None:
    routed = run(spark, history, count, side)
    seen: set[tuple[int, ...]] = set()
    for (key, value), rows in zip(history, routed, strict=True):
        want = expected(value, count)
        assert want is not None, value
        got = rows.check(key if key is not None else orjson.loads(value or b"")["cluster"], count)
        assert got == want, value
        seen.add(got)
    if count > 1:  # the history exercised fan-out, single buckets and several buckets per record
        assert tuple(range(count)) in seen
        assert any(len(b) == 1 and b != (0,) for b in seen)
        assert any(1 < len(b) < count for b in seen)


def test_history_needs_no_partial_results(spark: SparkSession, history: list[Record]) -> None:
    """Well-formed records have no wrong type for from_json to null: they go to
    the same buckets with spark.sql.json.enablePartialResults off."""
    with partial_results(spark, False):
        routed = run(spark, history, 7)
    for (key, value), rows in zip(history, routed, strict=True):
        cluster = key if key is not None else orjson.loads(value or b"")["cluster"]
        assert rows.check(cluster, 7) == expected(value, 7), value


# ---- generated bodies ------------------------------------------------------------------------------

# Leaves that from_json reads as an integer, or as null like buckets_of ignores them.
INTEGERS = (0, 3, 6, 7, 63, 64, 65, -1, -7, 2**31, 2**40, 2**63 - 1, -(2**63))
INDEXES = (*INTEGERS, "3", 3.0, 3.5, 2**70, True, False, None)
# Any value where an object or a list belongs, other than a list holding a
# non-object (a known difference, below).
ODD: tuple[Any, ...] = ("x", 5, 2.5, True, None, [], {}, [None])
# Fetch the most: its quorum form is the subtlest.
API_KEYS = (0, 1, 1, 1, 1, 2, 4, 5, 6, 23, 56, 3, 52, 200, 2**40, -1, "1", "5", "6", None)


def generated(rng: random.Random) -> bytes:
    """One envelope whose body has wrong types where routing reads it."""

    def some(*options: Any) -> Any:
        return rng.choice(options)

    def maybe(obj: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
        if rng.random() < 0.85:
            obj[key] = value
        return obj

    def parts(index_key: str) -> Any:
        if rng.random() < 0.15:
            return some(*ODD)
        return [
            None if rng.random() < 0.05 else maybe({"currentLeaderEpoch": 1}, index_key, some(*INDEXES))
            for _ in range(rng.randint(0, 4))
        ]

    def topics(parts_key: str, index_key: str) -> Any:
        if rng.random() < 0.1:
            return some(*ODD)
        out = []
        for _ in range(rng.choice((0, 1, 1, 1, 2, 3))):
            topic: dict[str, Any] = {}
            maybe(topic, "topic", some("a", METADATA_TOPIC, METADATA_TOPIC, 5, None, [METADATA_TOPIC]))
            if rng.random() < 0.3:
                topic["topicId"] = some(METADATA_TOPIC_ID, "x", 1)
            out.append(None if rng.random() < 0.05 else maybe(topic, parts_key, parts(index_key)))
        return out

    kind = some("request", "request", "metadata", "remote_log_metadata", "quorum_state", "clock_evidence")
    body: dict[str, Any] = {}
    if kind == "metadata":
        maybe(body, "type", some("PARTITION_RECORD", "PARTITION_CHANGE_RECORD", "TOPIC_RECORD", 5, None))
        data = maybe({"topicId": "t"}, "partitionId", some(*INDEXES)) if rng.random() < 0.8 else some(*ODD)
        maybe(body, "data", data)
    elif kind == "remote_log_metadata":
        tip = maybe({"id": "t"}, "partition", some(*INDEXES)) if rng.random() < 0.8 else some(*ODD)
        segment = {"topicIdPartition": tip} if rng.random() < 0.9 else some(*ODD)
        data: dict[str, Any] = {}
        maybe(data, "remoteLogSegmentId", segment)  # a segment's record
        maybe(data, "topicIdPartition", some(tip, *ODD))  # a partition's deletion
        maybe(body, "data", data if rng.random() < 0.9 else some(*ODD))
    elif kind == "request":
        header = maybe({"requestApiVersion": 1}, "requestApiKey", some(*API_KEYS))
        maybe(body, "requestHeader", header if rng.random() < 0.95 else some(*ODD))
        req: dict[str, Any] = {}
        maybe(req, "topicData", topics("partitionData", "index"))
        maybe(req, "topics", topics("partitions", some("partition", "partitionIndex")))
        maybe(body, "request", req if rng.random() < 0.95 else some(*ODD))
    return envelope(body, kind)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("count", [7, 64])
def test_generated_bodies_agree_with_buckets_of(spark: SparkSession, count: int, side: str) -> None:
    rng = random.Random(20_251_125)
    values = [generated(rng) for _ in range(1500)]
    routed = run(spark, [(CLUSTER, v) for v in values], count, side)
    placed = 0
    for value, rows in zip(values, routed, strict=True):
        want = expected(value, count)
        assert want is not None
        assert rows.check(CLUSTER, count) == want, value
        placed += want != (0,)
    assert placed > 200, "too few generated records reached a bucket other than 0 alone"


# ---- bad input ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    name: str
    key: str | None
    value: bytes | None
    cluster: str  # what the key must name
    buckets: Any = None  # callable count -> expected buckets, where the test pins them
    source_cluster: str | None = None  # what it names routed at the source, if not ``cluster``


def zero(count: int) -> tuple[int, ...]:
    return (0,)


def fetch_of(*indexes: Any) -> bytes:
    return envelope(
        request(1, {"topics": [{"topic": "a", "partitions": [{"partition": i} for i in indexes]}]})
    )


BAD = [
    Bad("not JSON", "k", b"{not json", "k", zero),
    Bad("not JSON, no key", None, b"{not json", "", zero),
    Bad("truncated", None, envelope(s.topic("t", "x"), "metadata")[:-5], "", zero),
    Bad("trailing garbage", "k", envelope(s.topic("t", "x"), "metadata") + b" x", "k"),
    Bad("not UTF-8", "k", b'{"cluster": "\xff\xfe", "kind": "metadata", "body": {}}', "k"),
    # Spark decodes bad bytes as U+FFFD; orjson refuses the record, a dead letter.
    Bad(
        "not UTF-8, no key",
        None,
        b'{"cluster": "\xff\xfe", "kind": "quorum_state"}',
        "\ufffd\ufffd",
        zero,
        source_cluster="",
    ),
    Bad("empty value", "k", b"", "k", zero),
    Bad("null value", "k", None, "k", zero),
    Bad("JSON array", None, b'[{"cluster": "c1", "kind": "metadata", "body": {}}]', "", zero),
    Bad("JSON string", "k", b'"c1"', "k", zero),
    Bad("body missing", None, b'{"cluster": "c1", "kind": "metadata"}', CLUSTER, zero),
    Bad("body a string", None, b'{"cluster": "c1", "kind": "metadata", "body": "x"}', CLUSTER, zero),
    Bad("body a list", None, b'{"cluster": "c1", "kind": "request", "body": [1]}', CLUSTER, zero),
    Bad("kind a number", "k", b'{"cluster": "c1", "kind": 5, "body": {}}', "k", zero),
    Bad("huge index", CLUSTER, fetch_of(2**40), CLUSTER, lambda n: (2**40 % n,)),
    Bad("largest long", CLUSTER, fetch_of(2**63 - 1, -(2**63)), CLUSTER),
    Bad("index a string", CLUSTER, fetch_of("3"), CLUSTER, zero),
    Bad("index a float", CLUSTER, fetch_of(3.0, 4.5), CLUSTER, zero),
    Bad("index a boolean", CLUSTER, fetch_of(True), CLUSTER, zero),
    Bad("index beyond 64 bits", CLUSTER, fetch_of(2**70, 3), CLUSTER, lambda n: (3,)),
    Bad("negative index", CLUSTER, fetch_of(-3), CLUSTER, lambda n: (-3 % n,)),
    Bad("a string index beside ints", CLUSTER, fetch_of("x", 9, 2), CLUSTER),
    Bad("empty topics", CLUSTER, envelope(request(1, {"topics": []})), CLUSTER, zero),
    Bad("topics an object", CLUSTER, envelope(request(1, {"topics": {"topic": "a"}})), CLUSTER, zero),
    Bad("no index", CLUSTER, envelope(request(2, {"topics": [{"partitions": [{}]}]})), CLUSTER, zero),
    Bad(
        "partition record, data a string",
        CLUSTER,
        envelope({"type": "PARTITION_RECORD", "data": "x"}, "metadata"),
        CLUSTER,
        lambda n: tuple(range(n)),
    ),
    Bad(
        "partition record, partitionId a string",
        CLUSTER,
        envelope({"type": "PARTITION_RECORD", "data": {"partitionId": "9"}}, "metadata"),
        CLUSTER,
        zero,
    ),
    Bad("null key, cluster in envelope", None, fetch_of(9), CLUSTER, lambda n: (9 % n,)),
    Bad("key differs from envelope", "other", fetch_of(9), "other", lambda n: (9 % n,)),
    Bad("empty key", "", fetch_of(9), "", lambda n: (9 % n,)),
    Bad("cluster a number", None, b'{"cluster": 5, "kind": "quorum_state", "body": {}}', "5", zero),
    Bad("no cluster anywhere", None, b'{"kind": "metadata", "body": {"type": "TOPIC_RECORD"}}', ""),
    Bad(
        "cluster named like a key",
        None,
        envelope(s.topic("t", "x"), "metadata", f"c{SEPARATOR}3"),
        f"c{SEPARATOR}3",
    ),
    Bad(
        "duplicate cluster: the last, as the detector reads it",
        None,
        b'{"cluster": "a", "cluster": "b", "kind": "quorum_state", "body": {}}',
        "b",
    ),
]


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize(
    ("side", "partial"),
    # enablePartialResults is the SQL's; the source's decoding never reads it.
    [("sql", True), ("sql", False), ("source", True)],
    ids=["sql-partial", "sql-whole", "source"],
)
def test_bad_input_gets_one_home_row_and_a_sane_key(
    spark: SparkSession, count: int, side: str, partial: bool
) -> None:
    with partial_results(spark, partial):
        routed = run(spark, [(bad.key, bad.value) for bad in BAD], count, side)
    for bad, rows in zip(BAD, routed, strict=True):
        cluster = bad.source_cluster if side == "source" and bad.source_cluster is not None else bad.cluster
        got = rows.check(cluster, count)
        if not partial:
            continue  # without partial results a wrong type sends the record to bucket 0 alone
        if bad.buckets is not None:
            assert got == (bad.buckets(count) if count > 1 else (0,)), bad.name
        want = expected(bad.value, count)
        if want is not None:
            assert got == want, bad.name


# Where the SQL knowingly differs from buckets_of. Each is a record the
# detector dead-letters (an index it rejects, a non-object entry),
# so only its home bucket reports it, wherever that is.
DIFFERENT = [
    pytest.param(
        fetch_of(2**63 + 3),
        id="index in [2**63, 2**64): an int to orjson, beyond a long to Spark",
    ),
    pytest.param(
        envelope(request(1, {"topics": [{"topic": "a", "partitions": [{"partition": 3}, 5]}]})),
        id="a list with a non-object: buckets_of skips it, from_json nulls the list",
    ),
]


@pytest.mark.xfail(strict=True, reason="known difference, see DIFFERENT")
@pytest.mark.parametrize("value", DIFFERENT)
def test_known_differences(spark: SparkSession, value: bytes) -> None:
    [rows] = run(spark, [(CLUSTER, value)], 7)
    got = rows.check(CLUSTER, 7)  # one home row all the same
    assert got == expected(value, 7)


@pytest.mark.parametrize("value", DIFFERENT)
def test_routed_at_the_source_the_differences_agree(spark: SparkSession, value: bytes) -> None:
    [rows] = run(spark, [(CLUSTER, value)], 7, "source")
    assert rows.check(CLUSTER, 7) == expected(value, 7)


# ---- one bucket, and the key -------------------------------------------------------------------------


@pytest.mark.parametrize("side", SIDES)
def test_one_bucket_keys_by_cluster(spark: SparkSession, side: str) -> None:
    records: list[Record] = [
        ("k", fetch_of(9)),
        (None, fetch_of(9)),
        (None, b"nope"),
        (None, envelope(s.topic("t", "x"), "metadata", f"c{SEPARATOR}3")),
    ]
    routed = run(spark, records, 1, side)
    assert [(r.keys, r.homes) for r in routed] == [
        (["k"], [True]),
        ([CLUSTER], [True]),
        ([""], [True]),
        ([f"c{SEPARATOR}3"], [True]),
    ]


def test_route_refuses_no_buckets(spark: SparkSession) -> None:
    frame = spark.createDataFrame([], KAFKA_SCHEMA)
    with pytest.raises(ValueError, match="at least 1"):
        route(frame, 0)


@pytest.mark.parametrize("cluster", ["c1", "", f"a{SEPARATOR}b", f"a{SEPARATOR}7", "ünï"])
@pytest.mark.parametrize(("bucket", "count"), [(0, 1), (0, 7), (6, 7), (63, 64)])
def test_key_round_trip(cluster: str, bucket: int, count: int) -> None:
    key = encode_key(cluster, bucket, count)
    assert decode_key(key, count) == (cluster, bucket)
    if count > 1:
        assert decode_key(key) == (cluster, bucket)
    else:
        assert key == cluster


def test_decode_key_without_bucket() -> None:
    assert decode_key("c1") == ("c1", 0)
    assert decode_key("") == ("", 0)
    assert decode_key(f"c1{SEPARATOR}") == (f"c1{SEPARATOR}", 0)
    assert decode_key(f"c1{SEPARATOR}x") == (f"c1{SEPARATOR}x", 0)
    assert decode_key(f"c1{SEPARATOR}²") == (f"c1{SEPARATOR}²", 0)  # a digit, but not 0-9
    # Without the count, a one-bucket cluster named like a key reads as one.
    assert decode_key(f"c{SEPARATOR}3") == ("c", 3)
    assert decode_key(f"c{SEPARATOR}3", 1) == (f"c{SEPARATOR}3", 0)
