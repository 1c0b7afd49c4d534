"""``__cluster_metadata-0`` files read natively (producers/metadata_log.py,
producers/metadata_records.py) and ``fencewatch convert metadata-log``.

The files are written as Kafka writes them (tests/metadata_log_files.py), and
the same content is rendered as the text ``kafka-dump-log.sh
--cluster-metadata-decoder`` prints; both readers must give the same
envelopes. A real segment and a real bootstrap snapshot written by Kafka 3.7.0
(tests/data/native/README.md) pin the decoder to bytes no fencewatch code wrote.
"""

from __future__ import annotations

import ast
import gzip
import struct
from pathlib import Path
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatch
from metadata_log_files import (
    Batch,
    LogFile,
    Record,
    batch_bytes,
    dump_text,
    metadata_value,
    raw_metadata_value,
    segment_name,
    snapshot_name,
)

from detectors.engine import Detector
from detectors.envelope import DeadLetter, Envelope
from detectors.parse_metadata_dump import MetadataDumpStats, iter_metadata_dump
from fencewatch import cli
from producers.metadata_log import MetadataLogStats, iter_metadata_log_file
from producers.metadata_records import RECORD_SCHEMAS, RECORD_TYPE_NAMES, decode_metadata_value

DATA = Path(__file__).resolve().parents[1] / "data" / "native"
T0 = 1795169580000
TOPIC_ID = "qG8hUlWTTJ2eRb_bFvWRXg"
OTHER_TOPIC_ID = "Wq3nB7yTQdKpZ0c5vH1mXA"
INCARNATION = "5TICkSDlQOGOHY-sn-TtDw"
DIRS = ["uHY7hO6-42Q7O4k0zLMmtg", "b1Cq8XoPTWyl9sRk2Ud0vA", "Hn5tJ0mVS-eaQ7xL3kPz4w"]
END_POINTS = [{"name": "PLAINTEXT", "host": "kafka-1", "port": 9092, "securityProtocol": 0}]
FEATURES = [{"name": "metadata.version", "minSupportedVersion": 7, "maxSupportedVersion": 25}]
VOTERS = [{"voterId": 1}, {"voterId": 2}, {"voterId": 3}]


def body(kind: str, version: int, data: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "version": version, "data": data}


_BROKER = {"brokerId": 1, "incarnationId": INCARNATION, "brokerEpoch": 10, "endPoints": END_POINTS}
_PARTITION = {
    "partitionId": 0,
    "topicId": TOPIC_ID,
    "replicas": [1, 2, 3],
    "isr": [1, 2, 3],
    "removingReplicas": [],
    "addingReplicas": [],
    "leader": 1,
    "leaderEpoch": 0,
    "partitionEpoch": 0,
}
# Every metadata record type Kafka 4.4 has, at every version, as
# DumpLogSegments prints it: every untagged field of the version, tagged
# fields only when not their default (JsonConverterGenerator).
EVERY_VERSION = [
    body("FEATURE_LEVEL_RECORD", 0, {"name": "metadata.version", "featureLevel": 25}),
    body("REGISTER_BROKER_RECORD", 0, {**_BROKER, "features": FEATURES, "rack": None, "fenced": True}),
    body(
        "REGISTER_BROKER_RECORD",
        1,
        {**_BROKER, "features": FEATURES, "rack": "eu-1a", "fenced": True, "inControlledShutdown": False},
    ),
    body(
        "REGISTER_BROKER_RECORD",
        2,
        {
            **_BROKER,
            "isMigratingZkBroker": False,
            "features": FEATURES,
            "rack": None,
            "fenced": False,
            "inControlledShutdown": True,
        },
    ),
    body(
        "REGISTER_BROKER_RECORD",
        3,
        {
            **_BROKER,
            "isMigratingZkBroker": False,
            "features": FEATURES,
            "rack": None,
            "fenced": True,
            "inControlledShutdown": False,
            "logDirs": DIRS[:1],
        },
    ),
    body(
        "REGISTER_BROKER_RECORD",
        4,
        {
            **_BROKER,
            "isMigratingZkBroker": False,
            "features": FEATURES,
            "rack": None,
            "fenced": True,
            "inControlledShutdown": False,
            "logDirs": DIRS[:2],
            "cordonedLogDirs": DIRS[1:2],
        },
    ),
    body("TOPIC_RECORD", 0, {"name": "orders", "topicId": TOPIC_ID}),
    body("PARTITION_RECORD", 0, _PARTITION),
    body("PARTITION_RECORD", 0, {**_PARTITION, "partitionId": 1, "leaderRecoveryState": 1}),
    body("PARTITION_RECORD", 1, {**_PARTITION, "partitionId": 2, "directories": DIRS}),
    body(
        "PARTITION_RECORD",
        2,
        {
            **_PARTITION,
            "partitionId": 3,
            "directories": DIRS,
            "eligibleLeaderReplicas": [2],
            "lastKnownElr": [],
        },
    ),
    body("PARTITION_CHANGE_RECORD", 0, {"partitionId": 0, "topicId": TOPIC_ID, "isr": [1, 2], "leader": 2}),
    body("PARTITION_CHANGE_RECORD", 0, {"partitionId": 1, "topicId": TOPIC_ID, "leader": -1}),
    body(
        "PARTITION_CHANGE_RECORD",
        0,
        {"partitionId": 1, "topicId": TOPIC_ID, "leader": 3, "leaderRecoveryState": 0},
    ),
    body(
        "PARTITION_CHANGE_RECORD",
        1,
        {
            "partitionId": 2,
            "topicId": TOPIC_ID,
            "replicas": [1, 2, 3, 4],
            "removingReplicas": [3],
            "addingReplicas": [4],
            "directories": [*DIRS, "AAAAAAAAAAAAAAAAAAAAAA"],
        },
    ),
    body(
        "PARTITION_CHANGE_RECORD",
        2,
        {
            "partitionId": 3,
            "topicId": TOPIC_ID,
            "isr": [1],
            "eligibleLeaderReplicas": [2],
            "lastKnownElr": [3],
        },
    ),
    body("BROKER_REGISTRATION_CHANGE_RECORD", 0, {"brokerId": 1, "brokerEpoch": 10, "fenced": -1}),
    body(
        "BROKER_REGISTRATION_CHANGE_RECORD", 1, {"brokerId": 2, "brokerEpoch": 11, "inControlledShutdown": 1}
    ),
    body(
        "BROKER_REGISTRATION_CHANGE_RECORD",
        2,
        {"brokerId": 3, "brokerEpoch": 12, "fenced": 1, "logDirs": DIRS[2:]},
    ),
    body("BROKER_REGISTRATION_CHANGE_RECORD", 3, {"brokerId": 3, "brokerEpoch": 12, "cordonedLogDirs": []}),
    body("FENCE_BROKER_RECORD", 0, {"id": 2, "epoch": 11}),
    body("UNFENCE_BROKER_RECORD", 0, {"id": 2, "epoch": 11}),
    body("UNREGISTER_BROKER_RECORD", 0, {"brokerId": 3, "brokerEpoch": 12}),
    body("REMOVE_TOPIC_RECORD", 0, {"topicId": OTHER_TOPIC_ID}),
    body("NO_OP_RECORD", 0, {}),
    body(
        "CONFIG_RECORD",
        0,
        {"resourceType": 2, "resourceName": "orders", "name": "min.insync.replicas", "value": "2"},
    ),
    body(
        "CONFIG_RECORD",
        0,
        {"resourceType": 4, "resourceName": "", "name": "unclean.leader.election.enable", "value": None},
    ),
    body(
        "DELEGATION_TOKEN_RECORD",
        0,
        {
            "owner": "User:alice",
            "requester": "User:alice",
            "renewers": ["User:bob"],
            "issueTimestamp": T0,
            "maxTimestamp": T0 + 604_800_000,
            "expirationTimestamp": T0 + 86_400_000,
            "tokenId": "token-1",
        },
    ),
    body(
        "USER_SCRAM_CREDENTIAL_RECORD",
        0,
        {
            "name": "alice",
            "mechanism": 1,
            "salt": "c2FsdA==",
            "storedKey": "AAECAw==",
            "serverKey": "/w==",
            "iterations": 4096,
        },
    ),
    body(
        "CLIENT_QUOTA_RECORD",
        0,
        {
            "entity": [
                {"entityType": "user", "entityName": "alice"},
                {"entityType": "client-id", "entityName": None},
            ],
            "key": "producer_byte_rate",
            "value": 1048576.5,
            "remove": False,
        },
    ),
    body("PRODUCER_IDS_RECORD", 0, {"brokerId": 1, "brokerEpoch": 10, "nextProducerId": 2000}),
    body(
        "ACCESS_CONTROL_ENTRY_RECORD",
        0,
        {
            "id": DIRS[0],
            "resourceType": 2,
            "resourceName": "orders",
            "patternType": 3,
            "principal": "User:alice",
            "host": "*",
            "operation": 3,
            "permissionType": 3,
        },
    ),
    body("REMOVE_ACCESS_CONTROL_ENTRY_RECORD", 0, {"id": DIRS[0]}),
    body("ZK_MIGRATION_STATE_RECORD", 0, {"zkMigrationState": 0}),
    body("REMOVE_USER_SCRAM_CREDENTIAL_RECORD", 0, {"name": "alice", "mechanism": 1}),
    body("BEGIN_TRANSACTION_RECORD", 0, {"name": "Bootstrap records"}),
    body("END_TRANSACTION_RECORD", 0, {}),
    body("ABORT_TRANSACTION_RECORD", 0, {"reason": "controller failover"}),
    body("REMOVE_DELEGATION_TOKEN_RECORD", 0, {"tokenId": "token-1"}),
    body(
        "REGISTER_CONTROLLER_RECORD",
        0,
        {
            "controllerId": 3000,
            "incarnationId": INCARNATION,
            "zkMigrationReady": False,
            "endPoints": [{"name": "CONTROLLER", "host": "kafka-1", "port": 9093, "securityProtocol": 0}],
            "features": [{"name": "kraft.version", "minSupportedVersion": 0, "maxSupportedVersion": 1}],
        },
    ),
    body("CLEAR_ELR_RECORD", 0, {"topicName": "orders"}),
    body("UNREGISTER_CONTROLLER_RECORD", 0, {"controllerId": 3000}),
]


def leader_change(ts_ms: int, leader: int, granting: list[int]) -> Record:
    data = {
        "version": 0,
        "leaderId": leader,
        "voters": VOTERS,
        "grantingVoters": [{"voterId": v} for v in granting],
    }
    return Record(ts_ms, data, control="LEADER_CHANGE")


def snapshot(end_offset: int, last_ts_ms: int, records: list[Record]) -> LogFile:
    """A snapshot as RecordsSnapshotWriter writes it: header (with KRaftVersion and
    KRaftVoters, KIP-853), the records numbered from 0, footer."""
    voters = {
        "version": 0,
        "voters": [
            {
                "voterId": 1,
                "voterDirectoryId": DIRS[0],
                "endpoints": [{"name": "CONTROLLER", "host": "kafka-1", "port": 9093}],
                "kRaftVersionFeature": {"minSupportedVersion": 0, "maxSupportedVersion": 1},
            }
        ],
    }
    header = [
        Record(T0, {"version": 0, "lastContainedLogTimestamp": last_ts_ms}, control="SNAPSHOT_HEADER"),
        Record(T0, {"version": 0, "kRaftVersion": 1}, control="KRAFT_VERSION"),
        Record(T0, voters, control="KRAFT_VOTERS"),
    ]
    batches = [Batch(0, 1, header), Batch(3, 1, records)]
    batches.append(Batch(3 + len(records), 1, [Record(T0, {"version": 0}, control="SNAPSHOT_FOOTER")]))
    return LogFile(snapshot_name(end_offset, 1), batches, snapshot_end=end_offset, snapshot_epoch=1)


def history() -> list[LogFile]:
    """A snapshot ending at offset 5, then a segment from offset 5 with two
    leader changes and every record type at every version, in batches of three."""
    snap = snapshot(5, T0 - 1000, [Record(T0 - 5000, b) for b in EVERY_VERSION[:5]])
    batches = [Batch(5, 1, [leader_change(T0, 1, [1, 2])])]
    offset = 6
    for start in range(0, len(EVERY_VERSION), 3):
        chunk = EVERY_VERSION[start : start + 3]
        batches.append(Batch(offset, 1, [Record(T0 + 10 * (offset + i), b) for i, b in enumerate(chunk)]))
        offset += len(chunk)
    batches.append(Batch(offset, 2, [leader_change(T0 + 10_000, 2, [2, 3])]))
    batches.append(Batch(offset + 1, 2, [Record(T0 + 10_500, body("NO_OP_RECORD", 0, {}))]))
    return [snap, LogFile(segment_name(5), batches)]


def write(directory: Path, *logs: LogFile) -> list[Path]:
    paths = []
    for log in logs:
        path = directory / log.name
        path.write_bytes(log.to_bytes())
        paths.append(path)
    return paths


def read(path: Path, stats: MetadataLogStats | None = None) -> list[Envelope | DeadLetter]:
    return list(iter_metadata_log_file(str(path), cluster="c1", node=3000, stats=stats))


def from_dump(text: str, stats: MetadataDumpStats | None = None) -> list[Envelope | DeadLetter]:
    return list(iter_metadata_dump(text.splitlines(), source="dump", cluster="c1", node=3000, stats=stats))


def dicts(items: list[Envelope | DeadLetter]) -> list[dict[str, Any]]:
    assert all(isinstance(i, Envelope) for i in items), [i for i in items if isinstance(i, DeadLetter)]
    return [i.to_dict() for i in items]


# -- the same envelopes as the dump ------------------------------------------------


def test_files_give_the_envelopes_the_dump_of_the_same_files_gives(tmp_path):
    logs = history()
    paths = write(tmp_path, *logs)
    native_stats, dump_stats = MetadataLogStats(), MetadataDumpStats()
    native = [item for path in paths for item in read(path, native_stats)]
    text = "".join(dump_text(str(path), log) for path, log in zip(paths, logs, strict=True))
    dumped = from_dump(text, dump_stats)
    assert dicts(native) == dicts(dumped)
    # The snapshot's KRaftVoters and records, segment records, 2 LeaderChange, 1 NoOp.
    assert len(native) == 1 + 5 + len(EVERY_VERSION) + 3
    assert native[0].body["type"] == "KRAFT_VOTERS"  # type: ignore[union-attr]
    assert native_stats.records == dump_stats.records
    assert (
        native_stats.control_records_by_type
        == dump_stats.control_records_by_type
        == {"SNAPSHOT_HEADER": 1, "KRAFT_VERSION": 1, "SNAPSHOT_FOOTER": 1}
    )
    # Only the position differs: FILE:BYTE of the batch.
    segment = paths[1]
    assert [e.position for e in native[6:9]] == [
        f"{segment}:0",
        *[f"{segment}:{len(batch_bytes(logs[1].batches[0]))}"] * 2,
    ]


def test_convert_metadata_log_and_metadata_dump_print_the_same_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMANDS", {"convert": cli.COMMANDS["convert"]})
    logs = history()
    paths = write(tmp_path, *logs)
    dump = tmp_path / "dump.txt"
    dump.write_text("".join(dump_text(str(p), log) for p, log in zip(paths, logs, strict=True)))
    assert cli.main(["convert", "metadata-log", "--cluster", "c1", *map(str, paths)]) == 0
    native_out, native_err = capsys.readouterr()
    assert cli.main(["convert", "metadata-dump", "--cluster", "c1", str(dump)]) == 0
    dump_out, _ = capsys.readouterr()
    assert native_out == dump_out
    records = 1 + 5 + len(EVERY_VERSION) + 3
    assert native_out.count("\n") == records
    batches = 6 + -(-len(EVERY_VERSION) // 3)  # the snapshot's 3, then 3 a segment's records
    assert native_err.startswith(
        f"fencewatch convert metadata-log: 2 file(s), {batches} batches: {records} records ("
    )
    assert ", 0 dead letters; skipped: 3 control records (KRAFT_VERSION=1, SNAPSHOT_FOOTER=1, " in (
        native_err
    )


# -- every record type at every version -------------------------------------------


@pytest.mark.parametrize("printed", EVERY_VERSION, ids=lambda b: f"{b['type']}-v{b['version']}")
def test_each_record_type_and_version_decodes_to_what_the_tool_prints(printed):
    assert decode_metadata_value(metadata_value(printed)) == printed


def test_every_vendored_schema_is_tested_at_every_version_it_has():
    tested = {(b["type"], b["version"]) for b in EVERY_VERSION}
    for key, schema in RECORD_SCHEMAS.items():
        for version in range(schema.max_version + 1):
            assert (RECORD_TYPE_NAMES[key], version) in tested


def test_record_type_names_are_the_schemas_names_in_kafkas_snake_case():
    # MetadataRecordType's constants are MessageGenerator.toSnakeCase of the schema name.
    for key, schema in RECORD_SCHEMAS.items():
        snake = "".join("_" + c if c.isupper() and i else c for i, c in enumerate(schema.name)).upper()
        assert RECORD_TYPE_NAMES[key] == snake


def test_hand_written_bytes_decode_as_kafka_defines_them():
    # BrokerRegistrationChangeRecord v2 (api key 17), from the schema by hand:
    # frame 1, key 17, version 2; brokerId int32 7; brokerEpoch int64 9; then the
    # tagged fields: 2 of them, tag 0 (fenced) size 1 value -1, tag 2 (logDirs,
    # declared "tag": "2" in Kafka's file) size 17: compact array of 1 uuid.
    uuid_bytes = bytes(range(16))
    value = (
        bytes([1, 17, 2])
        + struct.pack(">iq", 7, 9)
        + bytes([2, 0, 1, 0xFF, 2, 17, 2])
        + uuid_bytes
        + b""  # no trailing bytes
    )
    assert decode_metadata_value(value) == body(
        "BROKER_REGISTRATION_CHANGE_RECORD",
        2,
        {"brokerId": 7, "brokerEpoch": 9, "fenced": -1, "logDirs": ["AAECAwQFBgcICQoLDA0ODw"]},
    )


# -- what cannot be decoded --------------------------------------------------------


def test_unknown_types_and_versions_are_counted_by_name_and_reading_goes_on(tmp_path):
    records = [
        # An api key after Kafka 4.4's last (29), and a version past the newest
        # schema whose bytes do not fit that schema's fields.
        Record(T0, body("?", 0, {}), value=raw_metadata_value(30, 0, b"\x00")),
        Record(T0, body("REGISTER_BROKER_RECORD", 5, {}), value=raw_metadata_value(0, 5, b"\x00")),
        Record(T0, body("?", 0, {}), value=raw_metadata_value(99, 0, b"")),
        Record(T0 + 1, body("TOPIC_RECORD", 0, {"name": "orders", "topicId": TOPIC_ID})),
    ]
    (path,) = write(tmp_path, LogFile(segment_name(0), [Batch(0, 1, records)]))
    stats = MetadataLogStats()
    items = read(path, stats)
    assert dicts(items)[0]["body"]["type"] == "TOPIC_RECORD"
    assert len(items) == 1
    assert stats.unread_by_type == {"api key 30": 1, "REGISTER_BROKER_RECORD v5": 1, "api key 99": 1}
    assert stats.read_as_older_by_type == {}
    assert stats.dead_letters == 0


def test_a_record_that_does_not_fit_its_schema_is_a_dead_letter(tmp_path):
    good = metadata_value(body("TOPIC_RECORD", 0, {"name": "orders", "topicId": TOPIC_ID}))
    records = [
        Record(T0, {}, value=good + b"\x00"),  # a byte too many
        Record(T0, {}, value=good[:-4]),  # cut short
        Record(T0, {}, value=b"\x00\x02\x00" + good[3:]),  # frame version 0
        Record(T0, {}, value=good),
    ]
    (path,) = write(tmp_path, LogFile(segment_name(0), [Batch(0, 1, records)]))
    items = read(path)
    letters = [i for i in items if isinstance(i, DeadLetter)]
    assert [d.reason.split(": ", 1)[1] for d in letters] == [
        "1 byte(s) of garbage after TopicRecord v0",
        letters[1].reason.split(": ", 1)[1],
        "unknown frame version 0 (only frame version 1 is supported)",
    ]
    assert "TopicRecord v0" in letters[1].reason
    assert [d.position for d in letters] == [f"{path}:0"] * 3
    assert isinstance(items[-1], Envelope) and items[-1].offset == 3


def test_crc_mismatch_is_a_dead_letter_and_the_next_batch_is_read(tmp_path):
    log = history()[1]
    data = bytearray(log.to_bytes())
    second = len(batch_bytes(log.batches[0]))
    data[second + 70] ^= 0xFF  # inside the second batch's first record
    path = tmp_path / log.name
    path.write_bytes(bytes(data))
    stats = MetadataLogStats()
    items = read(path, stats)
    letters = [i for i in items if isinstance(i, DeadLetter)]
    assert len(letters) == 1
    assert letters[0].position == f"{path}:{second}"
    assert letters[0].reason.startswith("record batch is corrupt: stored crc ")
    assert stats.dead_letters == 1
    envelopes = [i for i in items if isinstance(i, Envelope)]
    assert [e.offset for e in envelopes] == [
        5,
        *range(9, 6 + len(EVERY_VERSION)),
        6 + len(EVERY_VERSION),
        7 + len(EVERY_VERSION),
    ]


def test_a_torn_tail_is_a_dead_letter_after_every_whole_batch(tmp_path):
    log = history()[1]
    data = log.to_bytes()
    whole = len(data) - len(batch_bytes(log.batches[-1]))
    for cut, wanted in (
        (whole + 30, f"a batch of {len(batch_bytes(log.batches[-1]))} bytes"),
        (whole + 9, "its length prefix"),
    ):
        path = tmp_path / log.name
        path.write_bytes(data[:cut])
        items = read(path)
        assert isinstance(items[-1], DeadLetter)
        assert items[-1].position == f"{path}:{whole}"
        assert items[-1].reason == f"truncated record batch: the file ends {cut - whole} bytes into {wanted}"
        assert all(isinstance(i, Envelope) for i in items[:-1])
        assert items[-2].offset == 6 + len(EVERY_VERSION)  # the LeaderChange before the torn NoOp batch


def test_a_control_batch_with_a_keyless_record_is_a_dead_letter(tmp_path):
    # ControlRecordType needs a 4-byte key; kafka-python's ControlRecord cannot be made without one.
    batch = Batch(0, 1, [Record(T0, body("NO_OP_RECORD", 0, {})), leader_change(T0, 1, [1])])
    (path,) = write(tmp_path, LogFile(segment_name(0), [batch]))
    (letter,) = read(path)
    assert isinstance(letter, DeadLetter)
    assert letter.position == f"{path}:0"
    assert letter.reason.startswith("record batch cannot be read: ")


def test_a_prefix_no_batch_can_have_stops_the_file_with_a_dead_letter(tmp_path):
    log = LogFile(segment_name(0), [Batch(0, 1, [Record(T0, body("NO_OP_RECORD", 0, {}))])])
    first = log.to_bytes()
    path = tmp_path / log.name
    path.write_bytes(first + b"\0" * 16 + b"\x07" + first)  # magic 7
    items = read(path)
    assert isinstance(items[0], Envelope)
    assert isinstance(items[1], DeadLetter)
    assert items[1].position == f"{path}:{len(first)}"
    assert (
        items[1].reason
        == "not a record batch: magic byte 7, not 2 (record batch v2); the rest of the file is not read"
    )
    assert len(items) == 2


# -- snapshots and control records ---------------------------------------------------


def test_a_snapshot_has_no_offsets_and_the_time_of_its_last_contained_record(tmp_path):
    snap = snapshot(40, T0 - 1000, [Record(T0 - 5000, b) for b in EVERY_VERSION[:3]])
    snap.batches.insert(1, Batch(3, 1, [leader_change(T0 - 6000, 1, [1])]))  # counted, not an envelope
    (path,) = write(tmp_path, snap)
    stats = MetadataLogStats()
    envelopes = read(path, stats)
    assert [(e.offset, e.ts_ms, e.body["type"]) for e in envelopes] == [  # type: ignore[union-attr]
        (None, T0 - 1000, "KRAFT_VOTERS"),  # the voter set the snapshot holds (KIP-853)
        (None, T0 - 1000, "FEATURE_LEVEL_RECORD"),
        (None, T0 - 1000, "REGISTER_BROKER_RECORD"),
        (None, T0 - 1000, "REGISTER_BROKER_RECORD"),
    ]
    assert stats.control_records_by_type == {
        "SNAPSHOT_HEADER": 1,
        "KRAFT_VERSION": 1,
        "LEADER_CHANGE": 1,
        "SNAPSHOT_FOOTER": 1,
    }


def test_a_snapshot_without_a_last_contained_time_keeps_each_records_time(tmp_path):
    (path,) = write(tmp_path, snapshot(0, 0, [Record(T0 - 5000, EVERY_VERSION[0])]))
    assert [e.ts_ms for e in read(path)] == [T0, T0 - 5000]  # type: ignore[union-attr]


def test_leader_change_carries_its_batch_epoch_leader_and_voters(tmp_path):
    log = LogFile(segment_name(100), [Batch(100, 7, [leader_change(T0, 3, [3, 1])])])
    (path,) = write(tmp_path, log)
    (envelope,) = read(path)
    assert envelope.to_dict() == {  # type: ignore[union-attr]
        "cluster": "c1",
        "node": 3000,
        "ts_ms": T0,
        "kind": "metadata",
        "offset": 100,
        "body": {
            "type": "LEADER_CHANGE",
            "partitionLeaderEpoch": 7,
            "data": {
                "version": 0,
                "leaderId": 3,
                "voters": VOTERS,
                "grantingVoters": [{"voterId": 3}, {"voterId": 1}],
            },
        },
    }


TWO_VOTERS = {
    "version": 0,
    "voters": [
        {
            "voterId": voter,
            "voterDirectoryId": DIRS[voter - 1],
            "endpoints": [{"name": "CONTROLLER", "host": f"kafka-{voter}", "port": 9093}],
            "kRaftVersionFeature": {"minSupportedVersion": 0, "maxSupportedVersion": 1},
        }
        for voter in (1, 2)
    ],
}


def test_kraft_voters_is_an_envelope_as_the_dump_prints_it_and_sets_the_quorums_voters(tmp_path):
    # The leader writes a voter-set change as a control batch of one KRaftVoters
    # record (KafkaRaftClient via BatchAccumulator.appendVotersRecord: key
    # ControlRecordType KRAFT_VOTERS (6), value VotersRecord v0).
    log = LogFile(
        segment_name(40),
        [
            Batch(40, 4, [leader_change(T0, 1, [1, 2])]),
            Batch(41, 4, [Record(T0 + 100, TWO_VOTERS, control="KRAFT_VOTERS")]),
        ],
    )
    (path,) = write(tmp_path, log)
    stats, dump_stats = MetadataLogStats(), MetadataDumpStats()
    native = read(path, stats)
    assert dicts(native) == dicts(from_dump(dump_text(str(path), log), dump_stats))
    assert native[1].to_dict() == {  # type: ignore[union-attr]
        "cluster": "c1",
        "node": 3000,
        "ts_ms": T0 + 100,
        "kind": "metadata",
        "offset": 41,
        "body": {"type": "KRAFT_VOTERS", "partitionLeaderEpoch": 4, "data": TWO_VOTERS},
    }
    assert stats.control_records_by_type == dump_stats.control_records_by_type == {}
    # The LeaderChange names voters 1, 2 and 3; the KRaftVoters after it, only 1 and 2.
    detector = Detector(now_ms=lambda: 0)
    for env in native:
        assert detector.ingest(env) == []  # type: ignore[arg-type]
    assert detector.flush() == []
    assert detector.cluster("c1").quorum.voters == (1, 2)


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_read_like_plain_ones(tmp_path, codec):
    # Kafka writes the metadata log uncompressed (KafkaRaftClient, RecordsSnapshotWriter:
    # Compression.NONE); a compressed batch, should one appear, reads the same, in
    # every codec Kafka has (CompressionType: gzip 1, snappy 2, lz4 3, zstd 4; kafka-python
    # needs python-snappy and zstandard, which pyproject.toml declares).
    records = [Record(T0 + i, b) for i, b in enumerate(EVERY_VERSION)]
    plain = read(write(tmp_path, LogFile(segment_name(0), [Batch(0, 1, records)]))[0])
    path = tmp_path / "compressed" / segment_name(0)
    path.parent.mkdir()
    path.write_bytes(batch_bytes(Batch(0, 1, records, compression=codec)))
    assert DefaultRecordBatch(path.read_bytes()).compression_type == codec
    assert dicts(read(path)) == dicts(plain)


# -- files Kafka wrote -------------------------------------------------------------------


@pytest.fixture
def real_segment(tmp_path: Path) -> Path:
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(gzip.decompress((DATA / "kraft-3.7.0-cluster-metadata-0.log.gz").read_bytes()))
    return path


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint (record fields), read without kafka-python."""
    shift = value = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), pos


def independent_census(data: bytes) -> tuple[dict[int, int], list[str]]:
    """Records per api key, and topic names, read with nothing but the
    record-batch layout (DefaultRecordBatch) and TopicRecord v0's first field."""
    counts: dict[int, int] = {}
    topics: list[str] = []
    pos = 0
    while pos < len(data):
        length = struct.unpack_from(">i", data, pos + 8)[0]
        attributes = struct.unpack_from(">h", data, pos + 21)[0]
        count = struct.unpack_from(">i", data, pos + 57)[0]
        at = pos + 61
        for _ in range(count):
            size, at = _varint(data, at)
            end = at + size
            at += 1  # attributes
            _, at = _varint(data, at)  # timestamp delta
            _, at = _varint(data, at)  # offset delta
            key_len, at = _varint(data, at)
            at += max(key_len, 0)
            value_len, at = _varint(data, at)
            value = data[at : at + value_len]
            if not attributes & 0x20:
                counts[value[1]] = counts.get(value[1], 0) + 1
                if value[1] == 2:
                    name_len = value[3] - 1  # compact string: length + 1
                    topics.append(value[4 : 4 + name_len].decode())
            at = end
        pos += 12 + length
    return counts, topics


def test_a_segment_kafka_wrote_decodes_whole(real_segment):
    stats = MetadataLogStats()
    items = read(real_segment, stats)
    assert stats.dead_letters == 0
    counts, topics = independent_census(real_segment.read_bytes())
    by_type = {RECORD_TYPE_NAMES[key]: n for key, n in counts.items()}
    decoded = {**stats.records_by_type, **stats.unread_by_type}
    decoded.pop("LEADER_CHANGE")
    assert decoded == by_type
    envelopes = [i for i in items if isinstance(i, Envelope)]
    assert [e.body["data"]["name"] for e in envelopes if e.body["type"] == "TOPIC_RECORD"] == topics
    assert len(topics) == 5 and "__consumer_offsets" in topics
    # What the rest of that broker's directory says (tests/data/native/README.md):
    # quorum-state leader 1 in epoch 1, meta.properties directory.id, Kafka 3.7's metadata.version.
    first = envelopes[0].body
    assert first == {
        "type": "LEADER_CHANGE",
        "partitionLeaderEpoch": 1,
        "data": {"version": 0, "leaderId": 1, "voters": [{"voterId": 1}], "grantingVoters": [{"voterId": 1}]},
    }
    registrations = [e.body["data"] for e in envelopes if e.body["type"] == "REGISTER_BROKER_RECORD"]
    assert {r["brokerId"] for r in registrations} == {1}
    assert all(r["logDirs"] == ["XHhkr4tkSsD900pOQ8pPfg"] for r in registrations)
    levels = [e.body["data"] for e in envelopes if e.body["type"] == "FEATURE_LEVEL_RECORD"]
    assert levels == [{"name": "metadata.version", "featureLevel": 19}]  # 3.7-IV4
    offsets = [e.offset for e in envelopes]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)


def test_the_bootstrap_snapshot_kafka_wrote_decodes(tmp_path):
    stats = MetadataLogStats()
    (envelope,) = read(DATA / "bootstrap.checkpoint", stats)
    assert envelope.offset is None  # type: ignore[union-attr]
    assert envelope.body == body("FEATURE_LEVEL_RECORD", 0, {"name": "metadata.version", "featureLevel": 19})  # type: ignore[union-attr]
    assert stats.control_records_by_type == {"SNAPSHOT_HEADER": 1, "SNAPSHOT_FOOTER": 1}


def test_the_segment_kafka_wrote_replays_without_an_alert(real_segment, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMANDS", {k: cli.COMMANDS[k] for k in ("convert", "replay")})
    assert cli.main(["convert", "metadata-log", "--cluster", "lab", str(real_segment)]) == 0
    events = tmp_path / "events.jsonl"
    events.write_text(capsys.readouterr().out)
    assert cli.main(["replay", "--no-progress", str(events)]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert "4929 envelopes processed" in err


# -- the command line -------------------------------------------------------------------


def test_a_text_file_is_refused_naming_what_reads_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMANDS", {"convert": cli.COMMANDS["convert"]})
    dump = tmp_path / "dump.txt"
    dump.write_text(dump_text("x.log", history()[1]))
    (good,) = write(tmp_path, history()[1])
    assert cli.main(["convert", "metadata-log", "--cluster", "c1", str(good), str(dump)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"fencewatch convert: {dump} is not a metadata log segment or snapshot (no record batch v2 at its "
        "start); it looks like kafka-dump-log.sh output: run "
        f"`fencewatch convert metadata-dump --cluster c1 {dump}`\n"
    )


def test_stdin_is_refused_as_a_usage_error(monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMANDS", {"convert": cli.COMMANDS["convert"]})
    assert cli.main(["convert", "metadata-log", "-"]) == 2
    assert capsys.readouterr().err == (
        "fencewatch convert: error: metadata-log reads files, not stdin: name each file\n"
    )


def test_the_detectors_stay_free_of_kafka_python_and_the_readers():
    # The binary reader lives in producers/; detectors/ stays pure (STYLE.md practice 1).
    root = Path(__file__).resolve().parents[2] / "detectors"
    for source in root.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert name.split(".")[0] not in ("kafka", "producers"), f"{source} imports {name}"


def test_a_batch_over_the_size_limit_is_a_too_large_dead_letter_and_skipped(tmp_path):
    big = Batch(0, 1, [Record(T0, b) for b in EVERY_VERSION])
    small = Batch(len(EVERY_VERSION), 1, [Record(T0, body("NO_OP_RECORD", 0, {}))])
    (path,) = write(tmp_path, LogFile(segment_name(0), [big, small]))
    limit = len(batch_bytes(big)) - 1
    items = list(iter_metadata_log_file(str(path), cluster="c1", max_batch_bytes=limit))
    assert isinstance(items[0], DeadLetter) and items[0].kind == "too_large"
    assert items[0].position == f"{path}:0"
    assert [i.offset for i in items[1:]] == [len(EVERY_VERSION)]  # type: ignore[union-attr]
