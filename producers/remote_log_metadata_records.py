"""``__remote_log_metadata`` records decoded from their bytes with Kafka's own
schemas, into the envelopes ``fencewatch convert remote-log-metadata`` makes
of the formatter's text (:mod:`detectors.parse_remote_log_metadata`).

A value is what ``RemoteLogMetadataSerde.serialize`` writes
(storage/src/main/java/org/apache/kafka/server/log/remote/metadata/storage/
serialization/RemoteLogMetadataSerde.java): ``BytesApiMessageSerde`` over an
``AbstractApiMessageSerde``, so three unsigned varints, the frame version (1),
the record's api key and its version, then the record in Kafka's message
serialization, flexible from version 0. The api keys are those of the record
schemas in storage/src/main/resources/message/, vendored in
:mod:`producers.metadata_schemas` and loaded with kafka-python's ``load_json``:
0 RemoteLogSegmentMetadataRecord, 1 RemoteLogSegmentMetadataUpdateRecord,
2 RemotePartitionDeleteMetadataRecord, 3 RemoteLogSegmentMetadataSnapshotRecord
(which only a broker's local snapshot files hold: on the topic it is a dead
letter). The key is not read: the serde writes none (``TopicBasedRemoteLogMetadataManager``
produces values only) and the formatter ignores it.

The body is the formatter path's, field for field: the formatter prints only
the length of ``CustomMetadata``, so it is left out here too, and
``TxnIndexEmpty`` (a tagged field whose default, false, is not written) is
always set, as the formatter always prints ``txnIdxEmpty``
(``RemoteLogSegmentMetadata.toString``). ``tests/unit/test_remote_log_metadata_records.py``
pins both paths to the same envelopes on records a Kafka 4.4.0 cluster wrote.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from kafka.protocol.schemas import BaseField, load_json

from detectors.envelope import DeadLetter, DeadLetterClass, Envelope
from detectors.parse_remote_log_metadata import RemoteLogMetadataStats, record_envelope
from producers.message_json import Reader, struct_decoder, uvarint
from producers.metadata_records import FRAME_VERSION, SCHEMA_PACKAGE

TOPIC = "__remote_log_metadata"
SNAPSHOT_RECORD = "RemoteLogSegmentMetadataSnapshotRecord"
# RemoteLogMetadataSerde's api keys (the schemas' "apiKey").
RECORD_FILES = {
    0: "RemoteLogSegmentMetadataRecord",
    1: "RemoteLogSegmentMetadataUpdateRecord",
    2: "RemotePartitionDeleteMetadataRecord",
    3: SNAPSHOT_RECORD,
}
_DECODE_ERRORS = (ValueError, IndexError, UnicodeDecodeError, struct.error)


class RemoteRecordError(ValueError):
    """A value that is no remote log metadata record fencewatch can use; the message says why."""


@dataclass(frozen=True)
class TopicRecord:
    """One record of ``__remote_log_metadata`` as a consumer receives it."""

    partition: int
    offset: int
    value: bytes | None


def _decoders() -> dict[int, tuple[str, dict[int, Reader]]]:
    """Per api key: the record's name and a decoder per version its schema has."""
    out = {}
    for api_key, file in RECORD_FILES.items():
        schema = load_json(file, SCHEMA_PACKAGE)
        if schema["apiKey"] != api_key:
            raise ValueError(f"{file}.json has api key {schema['apiKey']}, expected {api_key}")
        low, high = BaseField.parse_versions(schema["validVersions"])
        decoders = {v: struct_decoder(schema["fields"], v, schema["name"]) for v in range(low, high + 1)}
        out[api_key] = (schema["name"], decoders)
    return out


_RECORDS = _decoders()


def decode_value(value: bytes) -> dict[str, Any]:
    """The record's ``{"type", "version", "data"}`` as Kafka's JSON converter
    writes it; :class:`RemoteRecordError` for bytes that are no such record."""
    try:
        frame, pos = uvarint(value, 0)
        api_key, pos = uvarint(value, pos)
        version, pos = uvarint(value, pos)
    except _DECODE_ERRORS:
        raise RemoteRecordError("value ends inside its frame header") from None
    if frame != FRAME_VERSION:
        raise RemoteRecordError(
            f"unknown frame version {frame} (RemoteLogMetadataSerde writes {FRAME_VERSION})"
        )
    known = _RECORDS.get(api_key)
    if known is None:
        raise RemoteRecordError(f"unknown record api key {api_key} (Kafka 4.4 has 0-3)")
    name, decoders = known
    decode = decoders.get(version)
    if decode is None:
        raise RemoteRecordError(f"{name} v{version} is newer than the schema here (v{max(decoders)})")
    try:
        data, end = decode(value, pos)
    except _DECODE_ERRORS as exc:
        raise RemoteRecordError(f"{name} v{version} does not decode: {exc!r}") from None
    if end != len(value):
        raise RemoteRecordError(f"{name} v{version} does not fill its value ({end} of {len(value)} bytes)")
    return {"type": name, "version": version, "data": data}


def record_body(value: bytes, partition: int) -> dict[str, Any]:
    """The envelope body of a record of ``partition``: the formatter path's."""
    body = decode_value(value)
    name, data = body["type"], body["data"]
    if name == SNAPSHOT_RECORD:
        raise RemoteRecordError(
            f"{SNAPSHOT_RECORD} belongs in a broker's local remote log metadata snapshot, not on {TOPIC}"
        )
    data.pop("customMetadata", None)
    if name == "RemoteLogSegmentMetadataRecord":
        data["txnIndexEmpty"] = data.pop("txnIndexEmpty", False)
    return {**body, "partition": partition}


def iter_topic_records(
    records: Iterable[TopicRecord],
    *,
    cluster: str,
    stats: RemoteLogMetadataStats,
    source: str = TOPIC,
) -> Iterator[Envelope | DeadLetter]:
    """Envelopes (or dead letters) of the topic's records, in the order given;
    each is counted in ``stats`` as the formatter path counts a line."""
    seq = 0
    for record in records:
        stats.lines += 1
        position = f"{source}/{record.partition}@{record.offset}"
        raw = base64.b64encode(record.value or b"").decode("ascii")
        item: Envelope | DeadLetter
        if record.value is None:
            item = DeadLetter(position, "a record without a value", "", kind=DeadLetterClass.MISSING_FIELD)
        else:
            try:
                body = record_body(record.value, record.partition)
            except RemoteRecordError as exc:
                item = DeadLetter(position, str(exc), raw, kind=DeadLetterClass.INVALID)
            else:
                item = record_envelope(
                    body, record.offset, cluster=cluster, position=position, seq=seq, raw=raw
                )
        if isinstance(item, Envelope):
            stats.records_by_type[item.body["type"]] = stats.records_by_type.get(item.body["type"], 0) + 1
            seq += 1
        else:
            stats.dead_letters += 1
        yield item
