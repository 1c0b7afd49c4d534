"""Which buckets of its cluster each Kafka record goes to, decided before the
shuffle: :func:`route` makes one row per (record, bucket).

Two ways to the same answer (tests/unit/test_routing.py holds both to
:func:`detectors.buckets.buckets_of`):

- *Routed at the source.* Our Kafka source already holds each record in a
  Python worker as it reads it; there :func:`route_record` decodes it with
  orjson and names its cluster and buckets (the ``route_cluster`` and
  ``route_buckets`` columns). Spark's ``from_json`` took half the JVM's task
  time for the same work (a JFR profile, docs/performance.md, "Routed at the
  source"), and a keyed record with one bucket needs no decoding at all.
- *Routed in Spark SQL*, for sources without those columns (the file
  backfill, Spark's Kafka connector): :func:`buckets_of` written as Spark SQL
  over the raw Kafka columns, described below.

The output ``key`` is the stateful operator's grouping key: the cluster when a
cluster is one bucket (so checkpoints written before buckets still restore),
else ``cluster + "\\x1f" + bucket``. :func:`encode_key` and :func:`decode_key`
are that key in plain Python; importing this module starts no JVM.

How ``from_json`` reads the envelope (Spark 4.3, PERMISSIVE mode, the default):

- Input that is not one JSON object (malformed text, an array, a scalar, an
  empty or null value) gives an all-null envelope: no envelope cluster, and
  bucket 0 alone. Text after a whole object is ignored; bytes that are not
  UTF-8 read as U+FFFD; of a key given twice the last counts (as in orjson,
  while get_json_object took the first).
- A value of the wrong type nulls only part of the envelope, never the top-level
  fields: ``cluster`` is kept whatever is wrong inside ``body``. With
  ``spark.sql.json.enablePartialResults`` true (the default) the nulled part is
  the innermost field that does not fit (an index ``"3"``, ``3.0``, ``true`` or
  beyond a long: that index alone), except that an array with an element of the
  wrong type (``[{...}, 5]``) is nulled whole. With it false, the whole ``body``
  is nulled instead, and the record goes to bucket 0 alone.
- Any string field takes any JSON value, as its JSON text (``"kind": 5`` reads
  ``"5"``), so a string compared with a name never matches a value of another type.

However much is nulled, every record gets at least one bucket (bucket 0 when
none is found) and exactly one home row. Where the SQL and buckets_of differ,
the record is one the detector turns into a dead letter anyway, which only its
home bucket reports: an index in [2**63, 2**64) (a Python int, but beyond a
long), a topic or partition list holding a non-object, and a ``requestApiKey`` of
``5.0`` or ``true`` (which buckets_of takes for StopReplica and Fetch).
:func:`route_record` decodes as the detector does, so it has none of these
differences; of a keyless record whose envelope ``cluster`` is not a string,
it takes orjson's text of the value where the SQL takes Jackson's (they can
differ in how a number is written; the record is a dead letter either way).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

import orjson
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, LongType, StringType, StructField, StructType

from detectors.buckets import FANNED_OUT_APIS, PARTITION_PATHS, PARTITION_RECORDS, document_buckets
from detectors.requests import FETCH, METADATA_TOPIC, METADATA_TOPIC_ID

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# Between the cluster and the bucket in a grouping key: a control character no
# real cluster name contains. Decoding splits at the last one, so a cluster that
# does contain it still decodes when the key has a bucket.
SEPARATOR = "\x1f"

OUTPUT_COLUMNS = ("key", "home", "value", "topic", "partition", "offset")
# What a source that routes its own records adds to the event columns
# (streaming/kafka_source.py): route_record's answer.
SOURCE_ROUTE_COLUMNS = "route_cluster string, route_buckets array<int>"


def encode_key(cluster: str, bucket: int, buckets: int) -> str:
    """The grouping key of ``bucket`` of ``cluster`` split into ``buckets``."""
    return cluster if buckets == 1 else f"{cluster}{SEPARATOR}{bucket}"


def decode_key(key: str, buckets: int | None = None) -> tuple[str, int]:
    """(cluster, bucket) of a grouping key; a key without a bucket is bucket 0.
    Pass ``buckets`` when known: with 1, the key is the cluster whatever it
    contains (a cluster named ``"a\\x1f3"`` is not bucket 3 of ``"a"``)."""
    if buckets == 1:
        return key, 0
    cluster, separator, bucket = key.rpartition(SEPARATOR)
    if separator and bucket.isascii() and bucket.isdigit():
        return cluster, int(bucket)
    return key, 0


def route_record(key: str | None, value: bytes | None, buckets: int) -> tuple[str, list[int]]:
    """(cluster, buckets ascending) of one Kafka record, as :func:`route` finds
    them: the record key names the cluster, a keyless record the envelope's
    (``""`` if neither; the processor dead-letters it)."""
    if key is not None and buckets == 1:
        return key, [0]
    try:
        document = orjson.loads(value) if value is not None else None
    except orjson.JSONDecodeError:
        document = None  # not JSON: its home, bucket 0, dead-letters it
    cluster = key if key is not None else _envelope_cluster(document)
    return cluster, list(document_buckets(document, buckets))


def _envelope_cluster(document: Any) -> str:
    """The envelope's ``cluster`` as the SQL's string field reads it: a string
    as is, nothing as ``""``, any other value as its JSON text."""
    named = document.get("cluster") if isinstance(document, dict) else None
    if named is None or isinstance(named, str):
        return named or ""
    return orjson.dumps(named).decode()


def route(events: DataFrame, buckets: int) -> DataFrame:
    """One row per (record, bucket it goes to) of Kafka-source ``events``:
    ``key`` (the grouping key, never null), ``home`` (true in exactly one row
    per record: its lowest bucket), and the record's ``value``, ``topic``,
    ``partition`` and ``offset``. ``events`` that carry ``SOURCE_ROUTE_COLUMNS``
    (computed for the same ``buckets``) are routed by them."""
    if buckets < 1:
        raise ValueError(f"buckets must be at least 1, got {buckets}")
    if "route_buckets" in events.columns:
        return _spread(events.withColumnRenamed("route_cluster", "cluster"), F.col("route_buckets"), buckets)
    # Parsed once, in a projection of its own: Spark does not merge it into the
    # next one, which names it many times (CollapseProject keeps expensive
    # expressions from being duplicated).
    parsed = events.select(
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        F.from_json(F.col("value").cast("string"), _envelope_schema(buckets)).alias("envelope"),
    )
    envelope = F.col("envelope")
    # The record key names the cluster; a keyless record is the envelope's.
    cluster = F.coalesce(F.col("key"), envelope["cluster"])
    return _spread(parsed.withColumn("cluster", cluster), _buckets(envelope, buckets), buckets)


def _spread(records: DataFrame, record_buckets: Column, buckets: int) -> DataFrame:
    """route's rows of ``records``, whose buckets (ascending, distinct) are
    ``record_buckets``."""
    # "" for a record no cluster names (the processor dead-letters it); the
    # coalesce also makes ``key`` non-nullable, as the stateful operator's key is.
    cluster = F.coalesce(F.col("cluster"), F.lit(""))
    if buckets == 1:
        return records.select(cluster.alias("key"), F.lit(True).alias("home"), *OUTPUT_COLUMNS[2:])
    routed = records.select(cluster.alias("cluster"), record_buckets.alias("buckets"), *OUTPUT_COLUMNS[2:])
    # The outer explode makes one row, (null, null), of a record no index placed
    # (its buckets are empty): that record goes to bucket 0, its home, whose
    # parse dead-letters it. (A plain explode would also make Spark infer a
    # "size(buckets) > 0" filter, which copies the whole expression below it.)
    exploded = routed.select(
        "cluster", F.posexplode_outer("buckets").alias("position", "bucket"), *OUTPUT_COLUMNS[2:]
    )
    bucket = F.coalesce(F.col("bucket"), F.lit(0))
    return exploded.select(
        F.concat(F.col("cluster"), F.lit(SEPARATOR), bucket.cast("string")).alias("key"),
        # The buckets are ascending and distinct: position 0 is the lowest, the home.
        (F.coalesce(F.col("position"), F.lit(0)) == 0).alias("home"),
        *OUTPUT_COLUMNS[2:],
    )


# ---- the envelope's schema: only what routing reads ---------------------------------------------


def _struct(**fields: DataType) -> StructType:
    return StructType([StructField(name, kind, nullable=True) for name, kind in fields.items()])


def _envelope_schema(buckets: int) -> StructType:
    if buckets == 1:  # one bucket: only the cluster is needed
        return _struct(cluster=StringType())
    # Indexes are longs, so that a large one is still an integer and its bucket
    # is Python's ``%`` (pmod); a string, float or boolean index reads null.
    # request.<topics>[].<partitions>[].<index> for every API of PARTITION_PATHS,
    # several index names sharing one partition struct.
    index_names: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for topics_key, parts_key, index_key in PARTITION_PATHS.values():
        index_names[topics_key][parts_key].add(index_key)
    request_fields: dict[str, DataType] = {}
    for topics_key, parts in index_names.items():
        topic_fields: dict[str, DataType] = {
            parts_key: ArrayType(_struct(**dict.fromkeys(sorted(names), LongType())))
            for parts_key, names in parts.items()
        }
        if topics_key == "topics":  # how a quorum fetch names the metadata log
            topic_fields.update(topic=StringType(), topicId=StringType())
        request_fields[topics_key] = ArrayType(_struct(**topic_fields))
    body = _struct(
        type=StringType(),  # metadata: the record type
        data=_struct(
            partitionId=LongType(),  # metadata: PARTITION_RECORD, PARTITION_CHANGE_RECORD
            remoteLogSegmentId=_struct(topicIdPartition=_struct(partition=LongType())),  # tiered storage
            topicIdPartition=_struct(partition=LongType()),  # tiered storage: a partition's deletion
        ),
        requestHeader=_struct(requestApiKey=LongType()),
        request=_struct(**request_fields),
    )
    return _struct(cluster=StringType(), kind=StringType(), body=body)


# ---- the buckets of one record, ascending and distinct --------------------------------------------


def _buckets(envelope: Column, buckets: int) -> Column:
    kind, body = envelope["kind"], envelope["body"]
    return (
        # A body that is not an object (or that from_json nulled): no envelope
        # the detector accepts, so only its home bucket needs to see it.
        F.when(body.isNull(), _nowhere())
        .when(kind == "metadata", _metadata(body, buckets))
        .when(kind == "remote_log_metadata", _remote(body, buckets))
        .when(kind == "request", _request(body, buckets))
        .when(kind == "clock_evidence", _everywhere(buckets))  # detectors.clock_exchange
        .otherwise(_nowhere())  # quorum state, unknown kinds, no envelope at all
    )


def _metadata(body: Column, buckets: int) -> Column:
    # A partition's record goes to that partition's bucket; every other record
    # (brokers, topics, features) is cluster-wide, and every bucket applies it.
    # ``data`` is null unless it is an object: buckets_of's isinstance(data, dict).
    data = body["data"]
    is_partition_record = body["type"].isin(*PARTITION_RECORDS) & data.isNotNull()
    return F.when(is_partition_record, _of(F.array(data["partitionId"]), buckets)).otherwise(
        _everywhere(buckets)
    )


def _remote(body: Column, buckets: int) -> Column:
    data = body["data"]
    segment, deleted = data["remoteLogSegmentId"]["topicIdPartition"], data["topicIdPartition"]
    return _of(F.array(segment["partition"], deleted["partition"]), buckets)


def _request(body: Column, buckets: int) -> Column:
    api_key = body["requestHeader"]["requestApiKey"]
    # StopReplica, LeaderAndIsr and UpdateMetadata carry a controller epoch every bucket must know.
    routed = F.when(api_key.isin(*FANNED_OUT_APIS), _everywhere(buckets))
    # Quorum traffic is about the metadata log, no data partition.
    routed = routed.when((api_key == FETCH) & _is_quorum_fetch(body["request"]), _nowhere())
    for api, (topics_key, parts_key, index_key) in PARTITION_PATHS.items():
        topics = body["request"][topics_key]
        routed = routed.when(api_key == api, _of(_indexes(topics, parts_key, index_key), buckets))
    return routed.otherwise(_nowhere())  # requests no rule reads


def _is_quorum_fetch(request: Column) -> Column:
    """detectors.requests.is_quorum_fetch: exactly one topic, the metadata log."""
    topics = request["topics"]
    # get() is null past the end, where topics[0] would fail under ANSI mode.
    first = F.get(topics, 0)
    names_log = (first["topic"] == METADATA_TOPIC) | (first["topicId"] == METADATA_TOPIC_ID)
    return (F.size(topics) == 1) & F.coalesce(names_log, F.lit(False))


def _indexes(topics: Column, parts_key: str, index_key: str) -> Column:
    """Every ``<topics>[].<parts_key>[].<index_key>``, nulls included. A topic that
    is null or has no partition list adds none (flatten would be null whole)."""
    none = F.array().cast("array<bigint>")
    per_topic = F.transform(
        topics, lambda topic: F.coalesce(F.transform(topic[parts_key], lambda part: part[index_key]), none)
    )
    return F.flatten(per_topic)


def _of(indexes: Column, buckets: int) -> Column:
    """The buckets of the integer indexes (from_json made every other index null),
    ascending; empty if there is none (route's outer explode sends it to bucket 0)."""
    integers = F.filter(indexes, lambda index: index.isNotNull())
    placed = F.transform(integers, lambda index: F.pmod(index, F.lit(buckets)).cast("int"))
    return F.array_sort(F.array_distinct(placed))


def _everywhere(buckets: int) -> Column:
    return F.sequence(F.lit(0), F.lit(buckets - 1))


def _nowhere() -> Column:
    """Bucket 0 alone: where a record about no partition goes."""
    return F.array(F.lit(0))
