"""KRaft metadata record values, decoded from Kafka's own record schemas.

A metadata log record's value is what Kafka's ``MetadataRecordSerde`` (an
``AbstractApiMessageSerde``) writes: three unsigned varints, the frame version
(1), the record type (its api key) and the record's version, then the record
in Kafka's message serialization at that version (flexible from version 0:
compact strings and arrays, tagged fields). The record types are Kafka's JSON
message schemas (``metadata/src/main/resources/common/metadata/*.json``),
vendored in :mod:`producers.metadata_schemas` and loaded with kafka-python's
``load_json``; :mod:`producers.message_json` compiles each type's decoder at
every version the schema has, once, at import (why not kafka-python's own
decoders: see that module).

Control records (KIP-595 LeaderChange, KIP-630 SnapshotHeader/Footer, KIP-853
KRaftVersion/KRaftVoters) carry no frame: Kafka's ``ControlRecordUtils`` reads
each value as its message at version 0 (``*_CURRENT_VERSION``), the key being
``ControlRecordType``'s int16 version and int16 type.

Only the record types fencewatch's rules read are vendored. Any other type,
and any version newer than its schema, is :class:`Unreadable`: counted and
named by the reader, never an error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from kafka.protocol.schemas import BaseField, load_json

from producers.message_json import Reader, struct_decoder, uvarint

SCHEMA_PACKAGE = "producers.metadata_schemas"
FRAME_VERSION = 1  # AbstractApiMessageSerde.DEFAULT_FRAME_VERSION

# Every metadata record type Kafka 3.3-4.1 writes, by api key, named as
# MetadataRecordType prints them; the vendored ones (VENDORED_RECORDS) are decoded.
RECORD_TYPE_NAMES = {
    0: "REGISTER_BROKER_RECORD",
    1: "UNREGISTER_BROKER_RECORD",
    2: "TOPIC_RECORD",
    3: "PARTITION_RECORD",
    4: "CONFIG_RECORD",
    5: "PARTITION_CHANGE_RECORD",
    7: "FENCE_BROKER_RECORD",
    8: "UNFENCE_BROKER_RECORD",
    9: "REMOVE_TOPIC_RECORD",
    10: "DELEGATION_TOKEN_RECORD",
    11: "USER_SCRAM_CREDENTIAL_RECORD",
    12: "FEATURE_LEVEL_RECORD",
    14: "CLIENT_QUOTA_RECORD",
    15: "PRODUCER_IDS_RECORD",
    17: "BROKER_REGISTRATION_CHANGE_RECORD",
    18: "ACCESS_CONTROL_ENTRY_RECORD",
    19: "REMOVE_ACCESS_CONTROL_ENTRY_RECORD",
    20: "NO_OP_RECORD",
    21: "ZK_MIGRATION_STATE_RECORD",
    22: "REMOVE_USER_SCRAM_CREDENTIAL_RECORD",
    23: "BEGIN_TRANSACTION_RECORD",
    24: "END_TRANSACTION_RECORD",
    25: "ABORT_TRANSACTION_RECORD",
    26: "REMOVE_DELEGATION_TOKEN_RECORD",
    27: "REGISTER_CONTROLLER_RECORD",
    28: "CLEAR_ELR_RECORD",
}
VENDORED_RECORDS = {
    0: "RegisterBrokerRecord",
    1: "UnregisterBrokerRecord",
    2: "TopicRecord",
    3: "PartitionRecord",
    5: "PartitionChangeRecord",
    7: "FenceBrokerRecord",
    8: "UnfenceBrokerRecord",
    9: "RemoveTopicRecord",
    12: "FeatureLevelRecord",
    17: "BrokerRegistrationChangeRecord",
    20: "NoOpRecord",
}

# ControlRecordType ids and names (clients/.../common/record/ControlRecordType.java).
CONTROL_TYPE_NAMES = {
    0: "ABORT",
    1: "COMMIT",
    2: "LEADER_CHANGE",
    3: "SNAPSHOT_HEADER",
    4: "SNAPSHOT_FOOTER",
    5: "KRAFT_VERSION",
    6: "KRAFT_VOTERS",
}
CONTROL_SCHEMA_NAMES = {
    2: "LeaderChangeMessage",
    3: "SnapshotHeaderRecord",
    4: "SnapshotFooterRecord",
    5: "KRaftVersionRecord",
    6: "VotersRecord",
}
CONTROL_VALUE_VERSION = 0  # ControlRecordUtils.*_CURRENT_VERSION


class RecordError(ValueError):
    """A record value that cannot be decoded: its bytes break its own type's format."""


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A record fencewatch has no schema for: ``name`` says which, for counting."""

    name: str


@dataclass(frozen=True, slots=True)
class Schema:
    """A vendored message schema: its name and a decoder for each version it has."""

    name: str
    max_version: int
    decoders: dict[int, Reader]


def _schema(name: str) -> Schema:
    """The vendored schema ``name``, loaded by kafka-python's ``load_json``
    (common structs resolved), with its decoders compiled."""
    schema = load_json(name, SCHEMA_PACKAGE)
    low, high = BaseField.parse_versions(schema["validVersions"])
    flexible = BaseField.parse_versions(schema["flexibleVersions"])
    if flexible is None or flexible[0] > low:
        raise ValueError(f"{name}: only flexible versions are read here")
    decoders = {version: struct_decoder(schema["fields"], version, name) for version in range(low, high + 1)}
    return Schema(name, high, decoders)


RECORD_SCHEMAS = {key: _schema(name) for key, name in VENDORED_RECORDS.items()}
CONTROL_SCHEMAS = {key: _schema(name) for key, name in CONTROL_SCHEMA_NAMES.items()}


# Every decodable type and version by the three bytes its frame is as Kafka
# writes every frame today (frame version, api key, version: each unsigned
# varint below 0x80, so one byte): one look-up a record on the hot path.
_DECODERS_BY_HEADER = {
    bytes((FRAME_VERSION, key, version)): (RECORD_TYPE_NAMES[key], version, schema, decode)
    for key, schema in RECORD_SCHEMAS.items()
    for version, decode in schema.decoders.items()
}

# What the decoders raise on bytes that break the format.
_DECODE_ERRORS = (ValueError, IndexError, UnicodeDecodeError, struct.error)


def _decode(schema: Schema, decode: Reader, data: bytes, pos: int, version: int) -> dict[str, Any]:
    """The message of ``schema`` at ``version`` in ``data[pos:]``, which it must
    fill exactly (``AbstractApiMessageSerde.read`` rejects trailing bytes too),
    as Kafka's JSON converter writes it."""
    try:
        message, end = decode(data, pos)
    except _DECODE_ERRORS as exc:
        raise RecordError(f"{schema.name} v{version} does not decode: {exc!r}") from None
    if end > len(data):
        raise RecordError(f"{schema.name} v{version} is cut short: {end - len(data)} byte(s) missing")
    if end < len(data):
        raise RecordError(f"{len(data) - end} byte(s) of garbage after {schema.name} v{version}")
    return message


def decode_metadata_value(value: bytes) -> dict[str, Any] | Unreadable:
    """A metadata record's body as ``DumpLogSegments`` prints it
    (``{"type", "version", "data"}``), or :class:`Unreadable` for a type or
    version without a schema here; :class:`RecordError` for bytes that are no
    metadata record."""
    known = _DECODERS_BY_HEADER.get(value[:3])
    if known is not None:
        name, version, schema, decode = known
        return {"type": name, "version": version, "data": _decode(schema, decode, value, 3, version)}
    try:
        frame, pos = uvarint(value, 0)
        api_key, pos = uvarint(value, pos)
        version, pos = uvarint(value, pos)
    except _DECODE_ERRORS:
        raise RecordError("record value ends inside its frame header") from None
    if frame != FRAME_VERSION:
        raise RecordError(f"unknown frame version {frame} (only frame version {FRAME_VERSION} is supported)")
    record_schema = RECORD_SCHEMAS.get(api_key)
    if record_schema is None:
        return Unreadable(RECORD_TYPE_NAMES.get(api_key, f"api key {api_key}"))
    reader = record_schema.decoders.get(version)
    if reader is None:
        return Unreadable(f"{RECORD_TYPE_NAMES[api_key]} v{version}")
    return {
        "type": RECORD_TYPE_NAMES[api_key],
        "version": version,
        "data": _decode(record_schema, reader, value, pos, version),
    }


def control_type(key: bytes | None) -> int:
    """The ControlRecordType id of a control record's key (-1: UNKNOWN)."""
    if key is None or len(key) < 4:
        return -1
    return int.from_bytes(key[2:4], "big", signed=True)


def decode_control_value(type_id: int, value: bytes | None) -> dict[str, Any] | None:
    """A control record's message as Kafka's JSON converter writes it, or None
    for a type without a message schema here (transaction markers, unknown)."""
    schema = CONTROL_SCHEMAS.get(type_id)
    if schema is None:
        return None
    return _decode(schema, schema.decoders[CONTROL_VALUE_VERSION], value or b"", 0, CONTROL_VALUE_VERSION)
