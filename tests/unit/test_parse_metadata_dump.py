"""kafka-dump-log.sh --cluster-metadata-decoder output -> metadata envelopes (SPEC 1.3),
detectors/parse_metadata_dump.py."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from detectors.envelope import DeadLetter, Envelope
from detectors.parse_metadata_dump import MetadataDumpStats, iter_metadata_dump

DATA = Path(__file__).resolve().parents[1] / "data"
TS = 1795168800000
BATCH = (
    "baseOffset: {base} lastOffset: {last} count: {count} baseSequence: -1 lastSequence: -1 "
    "producerId: -1 producerEpoch: -1 partitionLeaderEpoch: 1 isTransactional: false "
    "isControl: {control} deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: {ts} "
    "size: 91 magic: 2 compresscodec: none crc: 1234 isvalid: true"
)
TOPIC = '{"type":"TOPIC_RECORD","version":0,"data":{"name":"orders","topicId":"qG8hUlWTTJ2eRb_bFvWRXg"}}'


def batch(base: int, count: int = 1, control: bool = False, ts: int = TS) -> str:
    last = base + count - 1
    return BATCH.format(base=base, last=last, count=count, control=str(control).lower(), ts=ts)


def record(offset: int, tail: str, ts: int = TS, ts_type: str = "CreateTime") -> str:
    return f"| offset: {offset} {ts_type}: {ts} keySize: -1 valueSize: 23 sequence: -1 headerKeys: []{tail}"


def parse(lines, *, node=None, stats=None):
    return list(iter_metadata_dump(lines, source="m.dump", cluster="prod-eu-1", node=node, stats=stats))


def fixture_lines() -> list[bytes]:
    return (DATA / "metadata.dump").read_bytes().splitlines(keepends=True)


def test_fixture_yields_metadata_records_and_counts_control_records():
    stats = MetadataDumpStats()
    items = parse(fixture_lines(), stats=stats)

    assert all(isinstance(item, Envelope) for item in items)
    assert [item.body["type"] for item in items] == [
        "KRAFT_VOTERS",  # the snapshot's voter set (KIP-853), a quorum fact too
        "LEADER_CHANGE",  # a quorum fact: tests/unit/test_leader_change.py
        "FEATURE_LEVEL_RECORD",
        "FEATURE_LEVEL_RECORD",
        "REGISTER_BROKER_RECORD",
        "REGISTER_BROKER_RECORD",
        "REGISTER_BROKER_RECORD",
        "BROKER_REGISTRATION_CHANGE_RECORD",
        "BROKER_REGISTRATION_CHANGE_RECORD",
        "BROKER_REGISTRATION_CHANGE_RECORD",
        "TOPIC_RECORD",
        "PARTITION_RECORD",
        "PARTITION_RECORD",
        "PARTITION_CHANGE_RECORD",
    ]
    assert [item.offset for item in items] == [None, *range(13)]  # the first from the snapshot
    assert [item.seq for item in items] == list(range(14))
    assert items[0].position == "m.dump:7" and items[1].position == "m.dump:13"
    assert items[-1].position == "m.dump:34"
    assert stats.control_records_by_type == {"SNAPSHOT_HEADER": 1, "KRAFT_VERSION": 1, "SNAPSHOT_FOOTER": 1}
    assert (stats.lines, stats.records, stats.dead_letters, stats.other_lines) == (34, 14, 0, 17)
    assert stats.lines == stats.records + stats.dead_letters + stats.control_records + stats.other_lines


def test_envelope_is_the_payload_unchanged_with_offset_and_create_time():
    lines = fixture_lines()
    register = parse(lines, node=3000)[4]
    line = lines[17].decode()
    payload = orjson.loads(line.split(" payload: ", 1)[1])

    assert register.to_dict() == {
        "cluster": "prod-eu-1",
        "node": 3000,
        "ts_ms": 1795168801500,
        "kind": "metadata",
        "offset": 3,
        "body": payload,
    }
    assert register.body["data"]["brokerId"] == 1 and register.body["data"]["fenced"] is True
    unfence = parse(lines)[7]
    assert unfence.body["data"] == {"brokerId": 1, "brokerEpoch": 3, "fenced": -1}
    assert unfence.node is None


def test_control_record_forms_are_counted_by_control_record_type():
    stats = MetadataDumpStats()
    lines = [
        batch(0, count=4, control=True),
        record(0, ' LeaderChange: {"version":0,"leaderId":1,"voters":[],"grantingVoters":[]}'),
        record(1, " endTxnMarker: COMMIT coordinatorEpoch: 0"),
        record(2, " controlType: SOMETHING_NEW(9)"),
        record(3, ""),  # a control batch record with no marker: still not metadata
    ]
    # A LeaderChange is a quorum fact, not skipped: tests/unit/test_leader_change.py
    assert [item.body["type"] for item in parse(lines, stats=stats)] == ["LEADER_CHANGE"]
    assert stats.control_records_by_type == {
        "COMMIT": 1,
        "SOMETHING_NEW": 1,
        "UNKNOWN": 1,
    }


def test_skip_record_metadata_forms_take_offset_and_time_from_the_batch():
    lines = [
        "Dumping /k/__cluster_metadata-0/00000000000000000000.log",
        "Starting offset: 0",
        batch(40, count=2, ts=TS + 5),
        "| payload: " + TOPIC,  # current tool
        " payload: " + TOPIC,  # older tool
    ]
    items = parse(lines)
    assert [(i.offset, i.ts_ms, i.position) for i in items] == [
        (40, TS + 5, "m.dump:4"),
        (41, TS + 5, "m.dump:5"),
    ]


def test_skip_record_metadata_without_a_batch_or_beyond_it_is_a_dead_letter():
    items = parse(["| payload: " + TOPIC, batch(7), "| payload: " + TOPIC, "| payload: " + TOPIC])
    assert isinstance(items[0], DeadLetter) and "no batch header" in items[0].reason
    assert isinstance(items[1], Envelope) and items[1].offset == 7
    assert isinstance(items[2], DeadLetter) and "more records than the batch" in items[2].reason


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        (" payload: Error at 5, skipping. Unknown metadata id 99", "could not decode the record"),
        (' payload: {"type":"TOPIC_RECORD","version":0,"data":{"name":"or', "malformed payload"),
        (' payload: {"version":0,"data":{}}', "'type' must be a record type name"),
        (' payload: {"type":"TOPIC_RECORD","version":"0","data":{}}', "'version' must be"),
        (' payload: {"type":"TOPIC_RECORD","version":0,"data":[1]}', "'data' must be a JSON"),
        (" payload: [1,2]", "payload must be a JSON object, got list"),
        ("", "record line has no payload"),
    ],
)
def test_unusable_payloads_are_dead_letters_with_a_reason(tail, reason):
    line = record(5, tail)
    items = parse([batch(5), line])
    assert len(items) == 1 and isinstance(items[0], DeadLetter)
    assert reason in items[0].reason
    assert items[0].position == "m.dump:2" and items[0].raw == line


def test_unknown_record_types_pass_through_for_forward_compatibility():
    payload = '{"type":"SOME_FUTURE_RECORD","version":0,"data":{"x":1}}'
    items = parse([batch(0), record(0, " payload: " + payload)])
    assert isinstance(items[0], Envelope) and items[0].body == orjson.loads(payload)


def test_missing_timestamp_and_out_of_range_numbers_are_dead_letters():
    items = parse(
        [
            batch(0, count=3),
            record(0, " payload: " + TOPIC, ts=-1, ts_type="NoTimestampType"),
            record(9223372036854775808, " payload: " + TOPIC),
            record(2, " payload: " + TOPIC, ts=99999999999999999),
        ]
    )
    assert all(isinstance(i, DeadLetter) for i in items)
    assert "no timestamp" in items[0].reason
    assert "offset" in items[1].reason
    assert "ts_ms" in items[2].reason


def test_log_append_time_is_accepted():
    items = parse([batch(0), record(0, " payload: " + TOPIC, ts_type="LogAppendTime")])
    assert isinstance(items[0], Envelope) and items[0].ts_ms == TS


def test_snapshot_records_carry_no_log_offset_and_the_snapshot_time():
    lines = [
        "Dumping /k/__cluster_metadata-0/00000000000000000120-0000000003.checkpoint",
        "Snapshot end offset: 120, epoch: 3",
        batch(0, control=True, ts=TS + 999),
        record(0, ' SnapshotHeader {"version":0,"lastContainedLogTimestamp":1795168850000}'),
        batch(1, ts=TS + 999),
        record(1, " payload: " + TOPIC, ts=TS + 999),
        "Dumping /k/__cluster_metadata-0/00000000000000000120.log",
        "Log starting offset: 120",
        batch(120),
        record(120, " payload: " + TOPIC),
    ]
    snap, log = parse(lines)
    assert (snap.offset, snap.ts_ms) == (None, 1795168850000)
    assert (log.offset, log.ts_ms) == (120, TS)


def test_non_utf8_record_line_is_a_dead_letter_but_a_bad_header_line_is_skipped():
    stats = MetadataDumpStats()
    bad_record = record(0, ' payload: {"type":"TOPIC_RECORD","version":0,"data":{"n":"\xff"}}')
    items = parse([b"Dumping /k/caf\xe9.log\n", batch(0).encode(), bad_record.encode("latin-1")], stats=stats)
    assert len(items) == 1 and isinstance(items[0], DeadLetter)
    assert "not UTF-8" in items[0].reason and items[0].position == "m.dump:3"
    assert (stats.other_lines, stats.dead_letters) == (2, 1)


def test_unrecognised_record_line_is_a_dead_letter():
    items = parse(["| offset: 5 CreateTi"])
    assert isinstance(items[0], DeadLetter) and "unrecognised record line" in items[0].reason


def test_bad_arguments_fail_at_call_time():
    with pytest.raises(ValueError, match="cluster"):
        iter_metadata_dump([], source="s", cluster="")
    with pytest.raises(ValueError, match="node"):
        iter_metadata_dump([], source="s", cluster="c", node=-3)


def test_a_line_over_the_limit_is_a_too_large_dead_letter_and_keeps_the_batch_count():
    lines = [
        batch(40, count=3),
        "| payload: " + TOPIC,
        '| payload: {"type":"PARTITION_RECORD","version":0,"data":{"replicas":[' + "1," * 500 + "1]}}",
        "| payload: " + TOPIC,
    ]
    stats = MetadataDumpStats()
    items = list(iter_metadata_dump(lines, source="m.dump", cluster="c", stats=stats, max_record_bytes=400))

    first, dead, third = items
    assert isinstance(dead, DeadLetter) and dead.kind == "too_large" and dead.position == "m.dump:3"
    assert "line 3 is 1074 bytes, over the record size limit of 400 bytes" in dead.reason
    assert "--max-record-bytes" in dead.reason
    # The dropped record still counts in its batch: the next one keeps its own offset.
    assert (first.offset, third.offset) == (40, 42)
    assert stats.lines == stats.records + stats.dead_letters + stats.control_records + stats.other_lines


def test_a_binary_stream_is_read_in_bounded_lines(tmp_path):
    dump = tmp_path / "d.dump"
    dump.write_bytes(b"\0" * 100_000 + b"\n" + record(3, " payload: " + TOPIC).encode() + b"\n")
    with open(dump, "rb") as f:
        items = list(iter_metadata_dump(f, source="m.dump", cluster="c", max_record_bytes=1000))
    assert [(type(i), i.position) for i in items] == [(DeadLetter, "m.dump:1"), (Envelope, "m.dump:2")]
    assert "line 1 is longer than the record size limit of 1000 bytes" in items[0].reason
    assert len(items[0].raw) <= 2000


def test_the_limit_must_be_positive():
    with pytest.raises(ValueError, match="max_record_bytes"):
        iter_metadata_dump([], source="s", cluster="c", max_record_bytes=0)
