"""``__remote_log_metadata`` as ``kafka-console-consumer.sh`` prints it, to
``kind: remote_log_metadata`` envelopes (SPEC 1.4)::

    kafka-console-consumer.sh --bootstrap-server HOST:9092 --topic __remote_log_metadata \\
      --from-beginning --formatter \\
      'org.apache.kafka.server.log.remote.metadata.storage.serialization.RemoteLogMetadataSerde$RemoteLogMetadataFormatter'

The formatter (``RemoteLogMetadataSerde.RemoteLogMetadataFormatter.writeTo``,
storage/src/main/java/org/apache/kafka/server/log/remote/metadata/storage/
serialization/RemoteLogMetadataSerde.java) prints one line per record::

    partition: 3, offset: 17, value: <the record's toString()>

and the value is one of three forms (storage/api/src/main/java/org/apache/
kafka/server/log/remote/storage/), each becoming the body Kafka's JSON schema
for its record (storage/src/main/resources/message/*Record.json) describes,
``{"type", "version": 0, "data"}`` with lowerCamelCase field names:

* ``RemoteLogSegmentMetadata{remoteLogSegmentId=..., startOffset=0, endOffset=99,
  brokerId=1, maxTimestampMs=..., eventTimestampMs=..., segmentLeaderEpochs={0=0, 3=50},
  segmentSizeInBytes=..., customMetadata=Optional.empty, state=COPY_SEGMENT_STARTED,
  txnIdxEmpty=true}`` (RemoteLogSegmentMetadata.toString) -> RemoteLogSegmentMetadataRecord;
* ``RemoteLogSegmentMetadataUpdate{remoteLogSegmentId=..., customMetadata=...,
  state=COPY_SEGMENT_FINISHED, eventTimestampMs=..., brokerId=1}``
  (RemoteLogSegmentMetadataUpdate.toString) -> RemoteLogSegmentMetadataUpdateRecord;
* ``RemotePartitionDeleteMetadata{topicPartition=..., state=DELETE_PARTITION_MARKED,
  eventTimestampMs=..., brokerId=3000}`` (RemotePartitionDeleteMetadata.toString)
  -> RemotePartitionDeleteMetadataRecord.

Inside them ``remoteLogSegmentId`` prints as ``RemoteLogSegmentId{topicIdPartition=T, id=U}``
(RemoteLogSegmentId.toString), a topic partition as ``<topicId>:<topic>-<partition>``
(TopicIdPartition.toString), a topic or segment id as 22 base64url characters
(Uuid.toString), ``segmentLeaderEpochs`` as a Java map (``{epoch=startOffset, ...}``,
AbstractMap.toString of a TreeMap), ``customMetadata`` as ``Optional.empty`` or
``Optional[CustomMetadata{N bytes}]`` and states by their enum names.
``customMetadata`` and ``txnIdxEmpty`` came in later releases and are absent
from older ones' lines. Only the length of custom metadata is printed, so the body
carries no ``customMetadata``; a state becomes its id, as in the record schema.

Two choices matter to the detector:

* ``ts_ms`` is the record's ``eventTimestampMs``.
* ``offset`` is the record's offset in its ``__remote_log_metadata``
  partition, and ``body["partition"]`` that partition (the formatter's
  ``partition:``). The topic has many partitions (50 by default) whose offsets
  repeat and interleave, so the detector keeps one offset order per partition
  (``detectors.redelivery.PartitionedOffsetOrder``): offset 17 of partition 3
  and offset 17 of partition 8 are two records, a record is never refused as
  out of order against another partition's, and within a partition a
  re-delivered offset is a duplicate. A segment's records share one partition
  (the topic is partitioned by topic partition), so each segment's records
  apply in the order Kafka wrote them.

Blank lines and the consumer's ``Processed a total of N messages`` are counted
as other lines; every other line is a record or a dead letter naming what is
wrong. A line over the record size limit is a ``too_large`` dead letter, read in
bounded pieces and never held whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from detectors.envelope import (
    MAX_TS_MS,
    BadRecord,
    DeadLetter,
    DeadLetterClass,
    Envelope,
    envelope_or_dead_letter,
)
from detectors.fields import INT32, INT64
from detectors.lines import DEFAULT_MAX_RECORD_BYTES, LongLine, bounded_lines, decode_line, within_limit
from detectors.remote import STATE_NAMES

_LINE = re.compile(r"partition: (\S+), offset: (\S+), value: (.*)")
_PROCESSED = re.compile(r"Processed a total of \d+ messages?")
_VALUE = re.compile(r"(\w+)\{(.*)\}")
# Uuid.toString: 16 bytes as unpadded base64url. Topic names are [a-zA-Z0-9._-]{1,249};
# the partition follows the last '-'.
_UUID = "[A-Za-z0-9_-]{22}"
_TOPIC_ID_PARTITION = re.compile(rf"({_UUID}):([A-Za-z0-9._-]{{1,249}})-(\d+)")
_SEGMENT_ID = re.compile(rf"RemoteLogSegmentId\{{topicIdPartition=(.*), id=({_UUID})\}}")
_INT = re.compile(r"-?\d+")
_INT_DIGITS = 20  # more is out of int64 range; int() of thousands of digits is refused or slow
_CUSTOM_METADATA = re.compile(r"Optional\.empty|Optional\[CustomMetadata\{\d+ bytes\}\]")
# RemotePartitionDeleteState, ids 0-2 in this order.
PARTITION_DELETE_STATES = ("DELETE_PARTITION_MARKED", "DELETE_PARTITION_STARTED", "DELETE_PARTITION_FINISHED")
_NON_NEGATIVE_INT32 = (0, INT32[1])
_NON_NEGATIVE_INT64 = (0, INT64[1])


@dataclass
class RemoteLogMetadataStats:
    """Counters over one or more console-consumer outputs.

    Every line is exactly one of: a record (``records_by_type``, keyed by its
    body's record type, e.g. ``RemoteLogSegmentMetadataRecord``), a dead letter
    (a line that is not a record it can use, or over the size limit), or
    another line (blank, or the consumer's ``Processed a total of N
    messages``), so ``lines == records + dead_letters + other_lines``.
    """

    lines: int = 0
    records_by_type: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    other_lines: int = 0

    @property
    def records(self) -> int:
        return sum(self.records_by_type.values())


def is_formatter_line(text: str) -> bool:
    """Whether a decoded line has the formatter's shape (``partition: P, offset: O, value: ...``)."""
    return _LINE.fullmatch(text) is not None


def iter_remote_log_metadata(
    stream: Iterable[bytes | str | LongLine],
    *,
    source: str,
    cluster: str,
    stats: RemoteLogMetadataStats | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Iterator[Envelope | DeadLetter]:
    """Parse formatter output into envelopes and dead letters, in input order.

    stream: physical lines (bytes preferred: bad UTF-8 becomes a dead letter),
        with or without terminators, or :class:`LongLine` for lines already cut
        short; or a binary stream, read in bounded lines.
    source: names the input in ``position`` (``f"{source}:{line}"``, 1-based).
    cluster: the envelopes' cluster. There is no node: records are written by
        many brokers and each names its own ``brokerId``.
    stats: counters to update (to read after the generator ends, or to
        accumulate over several files).
    max_record_bytes: the longest line that is read; a longer one is a
        ``too_large`` dead letter, of which only the start is kept.

    Raises ValueError at once for a bad cluster or limit.
    """
    if not isinstance(cluster, str) or not cluster:
        raise ValueError("cluster must be a non-empty string")
    if max_record_bytes < 1:
        raise ValueError(f"max_record_bytes must be at least 1, got {max_record_bytes}")
    counts = stats if stats is not None else RemoteLogMetadataStats()
    return _parse(bounded_lines(stream, max_record_bytes), source, cluster, counts, max_record_bytes)


def _parse(
    lines: Iterable[bytes | str | LongLine],
    source: str,
    cluster: str,
    counts: RemoteLogMetadataStats,
    limit: int,
) -> Iterator[Envelope | DeadLetter]:
    seq = 0
    for number, raw in enumerate(lines, start=1):
        counts.lines += 1
        position = f"{source}:{number}"
        line, long = within_limit(raw, limit)
        if long is not None:
            counts.dead_letters += 1
            yield long.dead_letter(position, f"line {number}")
            continue
        text, utf8_error = decode_line(line)
        if utf8_error is None and (not text.strip() or _PROCESSED.fullmatch(text)):
            counts.other_lines += 1
            continue
        if utf8_error is not None:
            item: Envelope | DeadLetter = DeadLetter(
                position, f"not UTF-8: {utf8_error}", text, kind=DeadLetterClass.NOT_UTF8
            )
        else:
            item = _record(text, position, cluster, seq)
        if isinstance(item, Envelope):
            name = item.body["type"]
            counts.records_by_type[name] = counts.records_by_type.get(name, 0) + 1
            seq += 1
        else:
            counts.dead_letters += 1
        yield item


def _record(text: str, position: str, cluster: str, seq: int) -> Envelope | DeadLetter:
    try:
        body, offset = _body(text)
    except BadRecord as exc:
        return exc.dead_letter(position, text)
    return record_envelope(body, offset, cluster=cluster, position=position, seq=seq, raw=text)


def record_envelope(
    body: dict[str, Any], offset: int, *, cluster: str, position: str, seq: int, raw: str
) -> Envelope | DeadLetter:
    """The envelope of one ``__remote_log_metadata`` record whose ``body`` is
    read already (from the formatter's line here, from the record's bytes in
    ``producers.remote_log_metadata_records``): both paths make it here, so
    that the same record gives the same envelope either way."""
    ts_ms = body["data"]["eventTimestampMs"]
    if not 0 <= ts_ms <= MAX_TS_MS:
        reason = f"eventTimestampMs {ts_ms} is not a time fencewatch can use (0 to {MAX_TS_MS})"
        return DeadLetter(position, reason, raw, kind=DeadLetterClass.NO_TIMESTAMP)
    obj = {
        "cluster": cluster,
        "node": None,
        "ts_ms": ts_ms,
        "kind": "remote_log_metadata",
        "offset": offset,
        "body": body,
    }
    return envelope_or_dead_letter(obj, position, seq, raw)


def _body(text: str) -> tuple[dict[str, Any], int]:
    """The record body a formatter line describes (with its ``partition``) and
    its offset; raise :class:`BadRecord` saying why not."""
    line = _LINE.fullmatch(text)
    if line is None:
        raise BadRecord(
            "not a RemoteLogMetadataFormatter line ('partition: P, offset: O, value: ...')",
            DeadLetterClass.INVALID,
        )
    partition = _int(line.group(1), "partition", _NON_NEGATIVE_INT32)
    offset = _int(line.group(2), "offset", _NON_NEGATIVE_INT64)
    value = _VALUE.fullmatch(line.group(3))
    if value is None:
        raise BadRecord("value is not a record's toString ('Name{...}')", DeadLetterClass.INVALID)
    form, inner = value.groups()
    parse = _FORMS.get(form)
    if parse is None:
        raise BadRecord(
            f"unknown record form {form!r} (expected one of {', '.join(_FORMS)})", DeadLetterClass.INVALID
        )
    return {**parse(_fields(inner, form)), "partition": partition}, offset


def _segment(f: dict[str, str]) -> dict[str, Any]:
    where = "RemoteLogSegmentMetadata"
    start = _field_int(f, "startOffset", where, _NON_NEGATIVE_INT64)
    end = _field_int(f, "endOffset", where, _NON_NEGATIVE_INT64)
    if end < start:
        # Kafka's constructor refuses this, so such a line was not printed by Kafka intact.
        raise BadRecord(f"{where}.endOffset {end} is before startOffset {start}", DeadLetterClass.INVALID)
    data: dict[str, Any] = {
        "remoteLogSegmentId": _segment_id(_get(f, "remoteLogSegmentId", where), where),
        "startOffset": start,
        "endOffset": end,
        "brokerId": _field_int(f, "brokerId", where, INT32),
        "maxTimestampMs": _field_int(f, "maxTimestampMs", where, INT64),
        "eventTimestampMs": _field_int(f, "eventTimestampMs", where, INT64),
        "segmentLeaderEpochs": _leader_epochs(_get(f, "segmentLeaderEpochs", where), where),
        "segmentSizeInBytes": _field_int(f, "segmentSizeInBytes", where, INT32),
        "remoteLogSegmentState": _state(f, where, STATE_NAMES),
    }
    _check_custom_metadata(f, where)
    txn = f.get("txnIdxEmpty")
    if txn is not None:
        if txn not in ("true", "false"):
            raise BadRecord(
                f"{where}.txnIdxEmpty must be true or false, got {txn!r}", DeadLetterClass.WRONG_TYPE
            )
        data["txnIndexEmpty"] = txn == "true"  # the record schema's name for it
    return {"type": "RemoteLogSegmentMetadataRecord", "version": 0, "data": data}


def _update(f: dict[str, str]) -> dict[str, Any]:
    where = "RemoteLogSegmentMetadataUpdate"
    _check_custom_metadata(f, where)
    data = {
        "remoteLogSegmentId": _segment_id(_get(f, "remoteLogSegmentId", where), where),
        "brokerId": _field_int(f, "brokerId", where, INT32),
        "eventTimestampMs": _field_int(f, "eventTimestampMs", where, INT64),
        "remoteLogSegmentState": _state(f, where, STATE_NAMES),
    }
    return {"type": "RemoteLogSegmentMetadataUpdateRecord", "version": 0, "data": data}


def _partition_delete(f: dict[str, str]) -> dict[str, Any]:
    where = "RemotePartitionDeleteMetadata"
    data = {
        # toString says topicPartition; the value and the record field are a TopicIdPartition.
        "topicIdPartition": _topic_id_partition(_get(f, "topicPartition", where), f"{where}.topicPartition"),
        "brokerId": _field_int(f, "brokerId", where, INT32),
        "eventTimestampMs": _field_int(f, "eventTimestampMs", where, INT64),
        "remotePartitionDeleteState": _state(f, where, PARTITION_DELETE_STATES),
    }
    return {"type": "RemotePartitionDeleteMetadataRecord", "version": 0, "data": data}


_FORMS = {
    "RemoteLogSegmentMetadata": _segment,
    "RemoteLogSegmentMetadataUpdate": _update,
    "RemotePartitionDeleteMetadata": _partition_delete,
}


def _fields(inner: str, where: str) -> dict[str, str]:
    """``a=1, b=X{c=2, d=3}, e={4=5}`` -> ``{"a": "1", "b": "X{c=2, d=3}", "e": "{4=5}"}``:
    split at the commas outside braces and brackets (topic names and ids hold neither)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth < 0:
                raise BadRecord(f"{where}: unbalanced '{ch}'", DeadLetterClass.INVALID)
        elif ch == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    if depth:
        raise BadRecord(f"{where}: unbalanced braces", DeadLetterClass.INVALID)
    parts.append(inner[start:])
    out: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.strip().partition("=")
        if not sep or not key.isidentifier():
            raise BadRecord(f"{where}: {part.strip()[:80]!r} is not name=value", DeadLetterClass.INVALID)
        if key in out:
            raise BadRecord(f"{where}: {key} appears twice", DeadLetterClass.INVALID)
        out[key] = value
    return out


def _get(f: dict[str, str], key: str, where: str) -> str:
    value = f.get(key)
    if value is None:
        raise BadRecord(f"missing field {where}.{key}", DeadLetterClass.MISSING_FIELD)
    return value


def _field_int(f: dict[str, str], key: str, where: str, bounds: tuple[int, int]) -> int:
    return _int(_get(f, key, where), f"{where}.{key}", bounds)


def _int(text: str, path: str, bounds: tuple[int, int]) -> int:
    if not _INT.fullmatch(text):
        raise BadRecord(f"{path} must be an integer, got {text[:40]!r}", DeadLetterClass.WRONG_TYPE)
    value = int(text) if len(text) <= _INT_DIGITS else None
    if value is None or not bounds[0] <= value <= bounds[1]:
        shown = text if value is not None else f"a {len(text)}-digit number"
        raise BadRecord(
            f"{path} = {shown} is out of range ({bounds[0]} to {bounds[1]})", DeadLetterClass.OUT_OF_RANGE
        )
    return value


def _state(f: dict[str, str], where: str, names: tuple[str, ...]) -> int:
    text = _get(f, "state", where)
    if text not in names:
        raise BadRecord(
            f"{where}.state must be one of {', '.join(names)}, got {text[:60]!r}", DeadLetterClass.WRONG_TYPE
        )
    return names.index(text)  # the enum's id is its position


def _topic_id_partition(text: str, path: str) -> dict[str, Any]:
    match = _TOPIC_ID_PARTITION.fullmatch(text)
    if match is None:
        raise BadRecord(
            f"{path} must be <topicId>:<topic>-<partition>, got {text[:80]!r}", DeadLetterClass.INVALID
        )
    topic_id, name, partition = match.groups()
    return {
        "name": name,
        "id": topic_id,
        "partition": _int(partition, f"{path} partition", _NON_NEGATIVE_INT32),
    }


def _segment_id(text: str, where: str) -> dict[str, Any]:
    path = f"{where}.remoteLogSegmentId"
    match = _SEGMENT_ID.fullmatch(text)
    if match is None:
        raise BadRecord(
            f"{path} must be RemoteLogSegmentId{{topicIdPartition=..., id=<uuid>}}, got {text[:80]!r}",
            DeadLetterClass.INVALID,
        )
    tip, segment_id = match.groups()
    return {"topicIdPartition": _topic_id_partition(tip, f"{path}.topicIdPartition"), "id": segment_id}


def _leader_epochs(text: str, where: str) -> list[dict[str, int]]:
    path = f"{where}.segmentLeaderEpochs"
    if not (text.startswith("{") and text.endswith("}")) or text == "{}":
        # Kafka's constructor refuses an empty map.
        raise BadRecord(
            f"{path} must be a non-empty map {{epoch=offset, ...}}, got {text[:80]!r}",
            DeadLetterClass.INVALID,
        )
    entries = []
    for pair in text[1:-1].split(", "):
        epoch, sep, offset = pair.partition("=")
        if not sep:
            raise BadRecord(f"{path}: {pair[:40]!r} is not epoch=offset", DeadLetterClass.INVALID)
        entries.append(
            {
                "leaderEpoch": _int(epoch, f"{path} epoch", _NON_NEGATIVE_INT32),
                "offset": _int(offset, f"{path} offset", _NON_NEGATIVE_INT64),
            }
        )
    return entries


def _check_custom_metadata(f: dict[str, str], where: str) -> None:
    value = f.get("customMetadata")
    if value is not None and not _CUSTOM_METADATA.fullmatch(value):
        raise BadRecord(
            f"{where}.customMetadata must be Optional.empty or Optional[CustomMetadata{{N bytes}}], "
            f"got {value[:80]!r}",
            DeadLetterClass.INVALID,
        )
