"""Write ``__cluster_metadata-0`` files as Kafka writes them, and the text
``kafka-dump-log.sh --cluster-metadata-decoder`` prints for them.

A record is given as Kafka's tool prints it (``{"type", "version", "data"}``
with ``data`` in the JSON converter's lowerCamelCase form), so the expected
text of the dump is the input itself, never fencewatch's decoder output. The
bytes come from kafka-python: the record's message encoder (a ``kafka.protocol``
``ApiData`` class built from the vendored schema, at the record's version;
fencewatch decodes with readers of its own, so the two sides share only the
schema files) behind ``MetadataRecordSerde``'s frame
(unsigned varints: frame version 1, api key, version), and
``DefaultRecordBatchBuilder`` for the batch, whose base offset, partition
leader epoch and control flag are then set as the leader sets them (Kafka's
``MemoryRecords.withLeaderChangeMessage``, ``BatchAccumulator``), with the
CRC-32C recomputed over the attributes onward (``DefaultRecordBatch``).
"""

from __future__ import annotations

import base64
import json
import struct
import types
import uuid
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.api_data import ApiData
from kafka.protocol.schemas import BaseField, load_json
from kafka.protocol.schemas.fields.codecs import UnsignedVarInt32
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c

from producers.metadata_records import (
    CONTROL_SCHEMA_NAMES,
    CONTROL_TYPE_NAMES,
    METADATA_RECORDS,
    RECORD_TYPE_NAMES,
    SCHEMA_PACKAGE,
)

_API_KEYS = {name: key for key, name in RECORD_TYPE_NAMES.items()}
_CONTROL_IDS = {name: key for key, name in CONTROL_TYPE_NAMES.items()}
CONTROL_ATTRIBUTE = 0x20  # DefaultRecordBatch CONTROL_FLAG_MASK
# How DumpLogSegments prints each control record (tools/.../DumpLogSegments.java printControlRecord, 4.1).
_CONTROL_PRINTED = {
    "LEADER_CHANGE": " LeaderChange: ",
    "SNAPSHOT_HEADER": " SnapshotHeader ",
    "SNAPSHOT_FOOTER": " SnapshotFooter ",
    "KRAFT_VERSION": " KRaftVersion ",
    "KRAFT_VOTERS": " KRaftVoters ",
}


def _kafka_uuid(text: str) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=="))


def _python_value(spec: dict[str, Any], value: Any) -> Any:
    """A JSON value of field ``spec`` as kafka-python's encoder takes it."""
    kind = spec["type"]
    if value is None:
        return None
    if "fields" in spec:
        if kind.startswith("[]"):
            return [_python_fields(spec["fields"], item) for item in value]
        return _python_fields(spec["fields"], value)
    if kind.startswith("[]"):
        return [_python_value({"type": kind[2:]}, item) for item in value]
    if kind == "uuid":
        return _kafka_uuid(value)
    if kind == "bytes":
        return base64.b64decode(value)
    return value


def _python_fields(fields: list[dict[str, Any]], data: dict[str, Any]) -> dict[str, Any]:
    by_json_name = {spec["name"][0].lower() + spec["name"][1:]: spec for spec in fields}
    unknown = set(data) - set(by_json_name)
    assert not unknown, f"fields not in the schema: {unknown}"
    return {
        BaseField.underscore_name(by_json_name[name]["name"]): _python_value(by_json_name[name], value)
        for name, value in data.items()
    }


def _int_tags(fields: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``fields`` with every ``tag`` an int: Kafka's generator reads ``"tag": "0"``
    (RegisterBrokerRecord's and BrokerRegistrationChangeRecord's LogDirs) as tag
    0, kafka-python would look the string up and miss the field."""
    out = []
    for spec in fields:
        spec = {**spec}
        if "tag" in spec:
            spec["tag"] = int(spec["tag"])
        if "fields" in spec:
            spec["fields"] = _int_tags(spec["fields"])
        out.append(spec)
    return out


def _as_data(metacls: type, schema: dict[str, Any]) -> dict[str, Any]:
    # kafka-python's ApiData accepts schemas of type "data"; metadata records
    # are "metadata" in Kafka's files, and otherwise read the same way.
    return {**schema, "type": "data", "fields": _int_tags(schema["fields"])}


def _message_class(name: str) -> Any:
    """kafka-python's message class of the vendored schema ``name``; None for a
    schema without fields (NoOpRecord), which kafka-python cannot build."""
    if not load_json(name, SCHEMA_PACKAGE).get("fields"):
        return None
    return types.new_class(
        name,
        (ApiData,),
        {"load_json": SCHEMA_PACKAGE},
        lambda ns: ns.update(json_patch=classmethod(_as_data)),
    )


_RECORD_CLASSES = {key: _message_class(file) for key, (_, file) in METADATA_RECORDS.items()}
_CONTROL_CLASSES = {key: _message_class(name) for key, name in CONTROL_SCHEMA_NAMES.items()}


def _message_bytes(cls: Any, version: int, data: dict[str, Any]) -> bytes:
    if cls is None:
        assert not data
        return UnsignedVarInt32.encode(0)  # an empty tagged-field section
    values = _python_fields(cls.json["fields"], data)
    # Untagged fields go positionally: a field named Version (the control
    # messages have one) would clash with the constructor's version keyword.
    present = [f for f in cls.fields.values() if f.for_version_q(version)]
    untagged = [values.pop(f.name, f.default) for f in present if not f.tagged_field_q(version)]
    message = cls(*untagged, version=version, **values)
    return bytes(message.encode(header=False))


def metadata_value(body: dict[str, Any]) -> bytes:
    """The record value ``MetadataRecordSerde`` writes for ``body`` as DumpLogSegments prints it."""
    key, version = _API_KEYS[body["type"]], body["version"]
    frame = b"".join(UnsignedVarInt32.encode(n) for n in (1, key, version))
    return frame + _message_bytes(_RECORD_CLASSES[key], version, body["data"])


def raw_metadata_value(api_key: int, version: int, payload: bytes) -> bytes:
    """A framed record value with any type, version and payload (for types without a schema here)."""
    return b"".join(UnsignedVarInt32.encode(n) for n in (1, api_key, version)) + payload


def control_key(type_name: str) -> bytes:
    """ControlRecordType's key: int16 version 0, int16 type."""
    return struct.pack(">hh", 0, _CONTROL_IDS[type_name])


def control_value(type_name: str, data: dict[str, Any]) -> bytes:
    """A control record's value: its message at version 0 (ControlRecordUtils)."""
    return _message_bytes(_CONTROL_CLASSES[_CONTROL_IDS[type_name]], 0, data)


@dataclass
class Record:
    """One record as the dump prints it: a metadata body, or a control record
    (``control`` its ControlRecordType name, ``body`` its message JSON)."""

    ts_ms: int
    body: dict[str, Any]
    control: str | None = None
    value: bytes | None = None  # overrides the encoding of ``body`` (a type without a schema)

    def key_bytes(self) -> bytes | None:
        return control_key(self.control) if self.control else None

    def value_bytes(self) -> bytes:
        if self.value is not None:
            return self.value
        if self.control:
            return control_value(self.control, self.body)
        return metadata_value(self.body)


@dataclass
class Batch:
    base_offset: int
    leader_epoch: int
    records: list[Record]
    compression: int = 0  # DefaultRecordBatch CODEC_*

    @property
    def control(self) -> bool:
        return any(r.control for r in self.records)


def batch_bytes(batch: Batch) -> bytes:
    """One record batch v2 as the active controller writes it."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=batch.compression,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for delta, record in enumerate(batch.records):
        builder.append(
            delta, timestamp=record.ts_ms, key=record.key_bytes(), value=record.value_bytes(), headers=[]
        )
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, batch.base_offset)
    struct.pack_into(">i", data, DefaultRecordBatch.AFTER_LEN_OFFSET, batch.leader_epoch)
    if batch.control:
        attributes_at = DefaultRecordBatch.ATTRIBUTES_OFFSET
        attributes = struct.unpack_from(">h", data, attributes_at)[0]
        struct.pack_into(">h", data, attributes_at, attributes | CONTROL_ATTRIBUTE)
    crc = calc_crc32c(memoryview(data)[DefaultRecordBatch.ATTRIBUTES_OFFSET :])
    struct.pack_into(">I", data, DefaultRecordBatch.CRC_OFFSET, crc)
    return bytes(data)


@dataclass
class LogFile:
    """A segment (``snapshot_end`` None) or a snapshot, as batches."""

    name: str
    batches: list[Batch] = field(default_factory=list)
    snapshot_end: int | None = None
    snapshot_epoch: int = 0

    def to_bytes(self) -> bytes:
        return b"".join(batch_bytes(b) for b in self.batches)


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}.log"


def snapshot_name(end_offset: int, epoch: int) -> str:
    return f"{end_offset:020d}-{epoch:010d}.checkpoint"


def _json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def dump_text(path: str, log: LogFile) -> str:
    """What ``kafka-dump-log.sh --cluster-metadata-decoder --files PATH`` (Kafka 4.1) prints."""
    lines = [f"Dumping {path}"]
    if log.snapshot_end is None:
        first = log.batches[0].base_offset if log.batches else 0
        lines.append(f"Log starting offset: {first}")
    else:
        lines.append(f"Snapshot end offset: {log.snapshot_end}, epoch: {log.snapshot_epoch}")
    position = 0
    for batch in log.batches:
        data = batch_bytes(batch)
        crc = struct.unpack_from(">I", data, DefaultRecordBatch.CRC_OFFSET)[0]
        last = batch.base_offset + len(batch.records) - 1
        codec = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}[batch.compression]
        lines.append(
            f"baseOffset: {batch.base_offset} lastOffset: {last} count: {len(batch.records)} "
            "baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1 "
            f"partitionLeaderEpoch: {batch.leader_epoch} isTransactional: false "
            f"isControl: {'true' if batch.control else 'false'} deleteHorizonMs: OptionalLong.empty "
            f"position: {position} CreateTime: {max(r.ts_ms for r in batch.records)} size: {len(data)} "
            f"magic: 2 compresscodec: {codec} crc: {crc} isvalid: true"
        )
        for index, record in enumerate(batch.records):
            key = record.key_bytes()
            head = (
                f"| offset: {batch.base_offset + index} CreateTime: {record.ts_ms} "
                f"keySize: {-1 if key is None else len(key)} valueSize: {len(record.value_bytes())} "
                "sequence: -1 headerKeys: []"
            )
            if record.control:
                lines.append(head + _CONTROL_PRINTED[record.control] + _json(record.body))
            else:
                lines.append(f"{head} payload: {_json(record.body)}")
        position += len(data)
    return "\n".join(lines) + "\n"
