"""KRaft metadata record values, decoded with kafka-python's message machinery.

A metadata log record's value is what Kafka's ``MetadataRecordSerde`` (an
``AbstractApiMessageSerde``) writes: three unsigned varints, the frame version
(1), the record type (its api key) and the record's version, then the record
in Kafka's message serialization at that version (flexible from version 0:
compact strings and arrays, tagged fields). The record types are Kafka's JSON
message schemas (``metadata/src/main/resources/common/metadata/*.json``),
vendored in :mod:`producers.metadata_schemas` and turned into classes by
kafka-python's ``kafka.protocol`` machinery, the same that builds its protocol
messages from the schemas it ships.

Control records (KIP-595 LeaderChange, KIP-630 SnapshotHeader/Footer, KIP-853
KRaftVersion/KRaftVoters) carry no frame: Kafka's ``ControlRecordUtils`` reads
each value as its message at version 0 (``*_CURRENT_VERSION``), the key being
``ControlRecordType``'s int16 version and int16 type.

Only the record types fencewatch's rules read are vendored. Any other type,
and any version newer than its schema, is :class:`Unreadable`: counted and
named by the reader, never an error.
"""

from __future__ import annotations

import io
import struct
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka.protocol.api_data import ApiData
from kafka.protocol.schemas import BaseField, load_json
from kafka.protocol.schemas.fields.codecs import TaggedFields, UnsignedVarInt32

from producers.message_json import message_json

SCHEMA_PACKAGE = "producers.metadata_schemas"
FRAME_VERSION = 1  # AbstractApiMessageSerde.DEFAULT_FRAME_VERSION

# Every metadata record type Kafka 3.3-4.1 writes, by api key, named as
# MetadataRecordType prints them; the vendored ones (_VENDORED) are decoded.
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
_VENDORED = {
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
_CONTROL_SCHEMAS = {
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


class _TagsOnly:
    """A message whose schema has no fields (NoOpRecord): kafka-python's
    StructField needs at least one, so only the message's tagged-field section
    is read, with kafka-python's TaggedFields codec."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.name = schema["name"]
        self.json = schema
        self.max_version = BaseField.parse_versions(schema["validVersions"])[1]
        self._tags = TaggedFields([])

    def decoder(self, version: int) -> Callable[[bytes, int], tuple[None, int]]:
        def decode(data: bytes, pos: int) -> tuple[None, int]:
            if data[pos:] == b"\x00":  # no tagged fields: nearly every NoOpRecord
                return None, pos + 1
            stream = io.BytesIO(data)
            stream.seek(pos)
            self._tags.decode(stream, version=version)
            return None, stream.tell()

        return decode


class _Message:
    """A vendored schema as a kafka-python message class (``cls``) and its decoders."""

    def __init__(self, cls: Any) -> None:
        self.cls = cls
        self.json = cls.json
        # Not cls.name: a field called Name (TopicRecord) shadows that class property.
        self.name = cls.json["name"]
        self.max_version = cls.max_version

    def decoder(self, version: int) -> Callable[[bytes, int], tuple[Any, int]]:
        # kafka-python's generated decoder (ApiMessage.decode uses it too): it
        # reads ``data`` from ``pos`` and returns the message and where it ended.
        # ApiData.decode would build the message by keyword, which a field
        # named Version (the control messages have one) cannot pass.
        return self.cls._struct.compiled_decode_from(version, compact=True, tagged=True, data_class=self.cls)


def _message(name: str) -> _TagsOnly | _Message:
    """The vendored schema ``name``, loaded by kafka-python's ``load_json``."""
    schema = load_json(name, SCHEMA_PACKAGE)
    if not schema.get("fields"):
        return _TagsOnly(schema)
    cls = types.new_class(
        name,
        (ApiData,),
        {"load_json": SCHEMA_PACKAGE},
        lambda ns: ns.update(json_patch=classmethod(_as_data)),
    )
    return _Message(cls)


RECORD_SCHEMAS = {key: _message(name) for key, name in _VENDORED.items()}
CONTROL_SCHEMAS = {key: _message(name) for key, name in _CONTROL_SCHEMAS.items()}


# What kafka-python's decoders raise on bytes that break the format.
_DECODE_ERRORS = (ValueError, IndexError, EOFError, UnicodeDecodeError, TypeError, struct.error)


_DECODERS: dict[tuple[str, int], Callable[[bytes, int], tuple[Any, int]]] = {}


def _decode(schema: _TagsOnly | _Message, data: bytes, pos: int, version: int) -> dict[str, Any]:
    """The message of ``schema`` at ``version`` in ``data[pos:]``, which it must
    fill exactly (``AbstractApiMessageSerde.read`` rejects trailing bytes too),
    as Kafka's JSON converter writes it."""
    decoder = _DECODERS.get((schema.name, version))
    if decoder is None:
        decoder = _DECODERS[(schema.name, version)] = schema.decoder(version)
    try:
        message, end = decoder(data, pos)
    except _DECODE_ERRORS as exc:
        raise RecordError(f"{schema.name} v{version} does not decode: {exc!r}") from None
    if end > len(data):
        raise RecordError(f"{schema.name} v{version} is cut short: {end - len(data)} byte(s) missing")
    if end < len(data):
        raise RecordError(f"{len(data) - end} byte(s) of garbage after {schema.name} v{version}")
    return message_json(schema.json["fields"], message, version)


def decode_metadata_value(value: bytes) -> dict[str, Any] | Unreadable:
    """A metadata record's body as ``DumpLogSegments`` prints it
    (``{"type", "version", "data"}``), or :class:`Unreadable` for a type or
    version without a schema here; :class:`RecordError` for bytes that are no
    metadata record."""
    if len(value) >= 3 and value[0] < 0x80 and value[1] < 0x80 and value[2] < 0x80:
        # One byte each, as every frame Kafka writes today: no stream needed.
        frame, api_key, version, pos = value[0], value[1], value[2], 3
    else:
        stream = io.BytesIO(value)
        try:
            frame, api_key, version = (UnsignedVarInt32.decode(stream) for _ in range(3))
        except _DECODE_ERRORS:
            raise RecordError("record value ends inside its frame header") from None
        pos = stream.tell()
    if frame != FRAME_VERSION:
        raise RecordError(f"unknown frame version {frame} (only frame version {FRAME_VERSION} is supported)")
    name = RECORD_TYPE_NAMES.get(api_key, f"api key {api_key}")
    schema = RECORD_SCHEMAS.get(api_key)
    if schema is None:
        return Unreadable(name)
    if version > schema.max_version:
        return Unreadable(f"{name} v{version}")
    return {"type": name, "version": version, "data": _decode(schema, value, pos, version)}


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
    return _decode(schema, value or b"", 0, CONTROL_VALUE_VERSION)
