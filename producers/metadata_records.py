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

Every metadata record type Kafka 4.4 has is vendored, so a log Kafka up to
4.4 wrote has no record this module cannot read. A type Kafka added later is
:class:`Unreadable`: counted and named by the reader, never an error.

A record of a version newer than the newest its schema has here (written by a
Kafka after 4.4) is read by that newest version's fields when its bytes fit
them exactly (:class:`ReadAsOlder`), and is :class:`Unreadable` otherwise.
When that is right, and when not: Kafka's message generator lets a new version
change anything, and Kafka itself never reads a version it does not know (the
generated ``read`` throws ``UnsupportedVersionException``; ``metadata.version``
keeps a controller from writing a version every node cannot read). Reading
version N by version M's fields is right exactly when N kept M's untagged
fields, in order and type, and only added tagged fields (to the record or to
one of its structs), since a reader skips a tag it does not know by its size
(Kafka's generated readers keep such fields aside, ``_unknownTaggedFields``).
RegisterBrokerRecord v3 and v4 (LogDirs, CordonedLogDirs) and
BrokerRegistrationChangeRecord v1-v3 grew that way. It is wrong when N
changed the untagged layout, which Kafka has done too: RegisterBrokerRecord v1
and v2 added untagged ``InControlledShutdown`` and ``IsMigratingZkBroker``,
PartitionRecord v1 untagged ``Directories``. Such bytes almost never fit (an
added or dropped field changes the length; a string read where an integer
was breaks its length prefix) and are then counted, not guessed at; only a
change that keeps every length and offset (one int32 field replaced by
another) cannot be told from the bytes and would be misread. The reader counts
every record read this way by what it was read as, so the summary says so.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from kafka.protocol.schemas import BaseField, load_json

from producers.message_json import Reader, struct_decoder, uvarint

SCHEMA_PACKAGE = "producers.metadata_schemas"
FRAME_VERSION = 1  # AbstractApiMessageSerde.DEFAULT_FRAME_VERSION

# Every metadata record type Kafka 4.4 has (MetadataRecordType), by api key:
# its name as MetadataRecordType prints it and its schema file here.
METADATA_RECORDS = {
    0: ("REGISTER_BROKER_RECORD", "RegisterBrokerRecord"),
    1: ("UNREGISTER_BROKER_RECORD", "UnregisterBrokerRecord"),
    2: ("TOPIC_RECORD", "TopicRecord"),
    3: ("PARTITION_RECORD", "PartitionRecord"),
    4: ("CONFIG_RECORD", "ConfigRecord"),
    5: ("PARTITION_CHANGE_RECORD", "PartitionChangeRecord"),
    7: ("FENCE_BROKER_RECORD", "FenceBrokerRecord"),
    8: ("UNFENCE_BROKER_RECORD", "UnfenceBrokerRecord"),
    9: ("REMOVE_TOPIC_RECORD", "RemoveTopicRecord"),
    10: ("DELEGATION_TOKEN_RECORD", "DelegationTokenRecord"),
    11: ("USER_SCRAM_CREDENTIAL_RECORD", "UserScramCredentialRecord"),
    12: ("FEATURE_LEVEL_RECORD", "FeatureLevelRecord"),
    14: ("CLIENT_QUOTA_RECORD", "ClientQuotaRecord"),
    15: ("PRODUCER_IDS_RECORD", "ProducerIdsRecord"),
    17: ("BROKER_REGISTRATION_CHANGE_RECORD", "BrokerRegistrationChangeRecord"),
    18: ("ACCESS_CONTROL_ENTRY_RECORD", "AccessControlEntryRecord"),
    19: ("REMOVE_ACCESS_CONTROL_ENTRY_RECORD", "RemoveAccessControlEntryRecord"),
    20: ("NO_OP_RECORD", "NoOpRecord"),
    21: ("ZK_MIGRATION_STATE_RECORD", "ZkMigrationRecord"),
    22: ("REMOVE_USER_SCRAM_CREDENTIAL_RECORD", "RemoveUserScramCredentialRecord"),
    23: ("BEGIN_TRANSACTION_RECORD", "BeginTransactionRecord"),
    24: ("END_TRANSACTION_RECORD", "EndTransactionRecord"),
    25: ("ABORT_TRANSACTION_RECORD", "AbortTransactionRecord"),
    26: ("REMOVE_DELEGATION_TOKEN_RECORD", "RemoveDelegationTokenRecord"),
    27: ("REGISTER_CONTROLLER_RECORD", "RegisterControllerRecord"),
    28: ("CLEAR_ELR_RECORD", "ClearElrRecord"),
    29: ("UNREGISTER_CONTROLLER_RECORD", "UnregisterControllerRecord"),
}
RECORD_TYPE_NAMES = {key: name for key, (name, _) in METADATA_RECORDS.items()}

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
class ReadAsOlder:
    """A record of a version newer than its schema here, read by the fields of
    ``read_as``, the newest version the schema has (see the module's
    docstring for when that is right): ``body`` is ``{"type", "version",
    "data"}`` with the record's own version and ``read_as``'s fields."""

    body: dict[str, Any]
    read_as: int

    @property
    def name(self) -> str:
        """How it is counted: ``REGISTER_BROKER_RECORD v5 read as v4``."""
        return f"{self.body['type']} v{self.body['version']} read as v{self.read_as}"


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
    if low != 0:  # decode_metadata_value takes a version without a decoder for a newer one
        raise ValueError(f"{name}: only schemas from version 0 are read here")
    message = schema["name"]  # ZkMigrationRecord.json holds ZkMigrationStateRecord
    fields = schema["fields"]
    decoders = {version: struct_decoder(fields, version, message) for version in range(low, high + 1)}
    return Schema(message, high, decoders)


RECORD_SCHEMAS = {key: _schema(file) for key, (_, file) in METADATA_RECORDS.items()}
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


def decode_metadata_value(value: bytes) -> dict[str, Any] | ReadAsOlder | Unreadable:
    """A metadata record's body as ``DumpLogSegments`` prints it
    (``{"type", "version", "data"}``); :class:`ReadAsOlder` for a version newer
    than its schema here that fits the newest one, :class:`Unreadable` for a
    type without a schema here or a newer version that does not fit;
    :class:`RecordError` for bytes that are no metadata record."""
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
    name = RECORD_TYPE_NAMES[api_key]
    reader = record_schema.decoders.get(version)
    if reader is not None:
        return {"type": name, "version": version, "data": _decode(record_schema, reader, value, pos, version)}
    newest = record_schema.max_version  # every schema here starts at version 0: this one is newer
    try:
        data = _decode(record_schema, record_schema.decoders[newest], value, pos, newest)
    except RecordError:
        return Unreadable(f"{name} v{version}")
    return ReadAsOlder({"type": name, "version": version, "data": data}, newest)


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
