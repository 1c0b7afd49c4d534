"""The newest Kafka's metadata log: files Kafka 4.4.0 wrote (tests/data/native/kafka-4.4.0,
described in tests/data/native/README.md) read natively and from the text Kafka
4.4.0's own ``kafka-dump-log.sh`` printed of them, and records of a version
newer than the vendored schemas (producers/metadata_records.py: when reading
them by the newest schema's fields is right)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.schemas.fields.codecs import UnsignedVarInt32
from metadata_log_files import Batch, LogFile, Record, metadata_value, segment_name

from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import DeadLetter, Envelope
from detectors.metadata_configs import MIN_INSYNC_REPLICAS, UNCLEAN_LEADER_ELECTION_ENABLE
from detectors.parse_metadata_dump import MetadataDumpStats, iter_metadata_dump
from fencewatch import cli
from producers.metadata_log import MetadataLogStats, iter_metadata_log_file
from producers.metadata_records import RECORD_SCHEMAS, ReadAsOlder, Unreadable, decode_metadata_value

DATA = Path(__file__).resolve().parents[1] / "data" / "native" / "kafka-4.4.0"
SEGMENT = DATA / "00000000000000000000.log"
SNAPSHOT = DATA / "00000000000000000000-0000000000.checkpoint"
# What broker 1's own files say (tests/data/native/README.md): its one log directory.
LOG_DIR = "EU1lW3fhTpmPBzSL0M0KtQ"
T0 = 1796679650000


def native(path: Path, stats: MetadataLogStats) -> list[Envelope | DeadLetter]:
    return list(iter_metadata_log_file(str(path), cluster="c1", stats=stats))


def dumped(text: str, stats: MetadataDumpStats) -> list[Envelope | DeadLetter]:
    return list(iter_metadata_dump(text.splitlines(), source="dump", cluster="c1", stats=stats))


def without_position(items: list[Envelope | DeadLetter]) -> list[dict[str, Any]]:
    assert all(isinstance(i, Envelope) for i in items), [i for i in items if isinstance(i, DeadLetter)]
    out = []
    for item in items:
        obj = item.to_dict()
        obj.pop("position", None)
        out.append(obj)
    return out


# ---- Kafka 4.4.0's own files --------------------------------------------------------------


def test_kafka_44s_segment_and_snapshot_read_natively_with_no_record_skipped():
    stats = MetadataLogStats()
    items = native(SNAPSHOT, stats) + native(SEGMENT, stats)
    assert stats.dead_letters == 0
    assert stats.unread_by_type == {}  # every record had a schema
    assert stats.read_as_older_by_type == {}  # at a version the schemas have
    assert stats.records_by_type == {
        "KRAFT_VOTERS": 2,
        "LEADER_CHANGE": 1,
        "FEATURE_LEVEL_RECORD": 12,
        "BEGIN_TRANSACTION_RECORD": 1,
        "END_TRANSACTION_RECORD": 1,
        "CONFIG_RECORD": 4,
        "REGISTER_CONTROLLER_RECORD": 1,
        "REGISTER_BROKER_RECORD": 1,
        "BROKER_REGISTRATION_CHANGE_RECORD": 4,
        "PRODUCER_IDS_RECORD": 1,
        "TOPIC_RECORD": 2,
        "PARTITION_RECORD": 53,
        "PARTITION_CHANGE_RECORD": 53,
        "NO_OP_RECORD": 221,
    }
    bodies = [i.body for i in items if isinstance(i, Envelope)]
    (registration,) = [b for b in bodies if b["type"] == "REGISTER_BROKER_RECORD"]
    assert registration["version"] == 4
    assert {k: registration["data"][k] for k in ("brokerId", "brokerEpoch", "fenced", "logDirs")} == {
        "brokerId": 1,
        "brokerEpoch": 14,
        "fenced": True,
        "logDirs": [LOG_DIR],
    }
    changes = [b for b in bodies if b["type"] == "BROKER_REGISTRATION_CHANGE_RECORD"]
    cordoned = {"brokerId": 1, "brokerEpoch": 14, "cordonedLogDirs": []}
    assert {"type": "BROKER_REGISTRATION_CHANGE_RECORD", "version": 3, "data": cordoned} in changes
    configs = [b["data"] for b in bodies if b["type"] == "CONFIG_RECORD"]
    assert configs[0] == {"resourceType": 4, "resourceName": "", "name": MIN_INSYNC_REPLICAS, "value": "1"}
    # __consumer_offsets' other settings: values fencewatch does not read stay out of envelopes.
    assert {(c["resourceName"], c["value"]) for c in configs[1:]} == {("__consumer_offsets", "(redacted)")}


@pytest.mark.parametrize("path", [SEGMENT, SNAPSHOT], ids=["segment", "snapshot"])
def test_native_and_text_paths_give_the_same_envelopes_for_kafka_44(path):
    """Each file read natively and from what Kafka 4.4.0's DumpLogSegments printed of it."""
    dump = path.parent / (path.name + ".dump")
    text = gzip.decompress(Path(f"{dump}.gz").read_bytes()).decode() if path == SEGMENT else dump.read_text()
    native_stats, dump_stats = MetadataLogStats(), MetadataDumpStats()
    from_files = native(path, native_stats)
    from_text = dumped(text, dump_stats)
    assert len(from_files) == native_stats.records > 0
    assert without_position(from_files) == without_position(from_text)
    assert native_stats.records == dump_stats.records and dump_stats.dead_letters == 0
    assert dump_stats.unrecognised_lines == 0


def test_kafka_44s_log_replays_knowing_broker_1s_registration(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMANDS", {k: cli.COMMANDS[k] for k in ("convert", "replay")})
    assert cli.main(["convert", "metadata-log", "--cluster", "c1", str(SNAPSHOT), str(SEGMENT)]) == 0
    out, err = capsys.readouterr()
    assert ", 0 records without a schema here" in err
    events = tmp_path / "events.jsonl"
    events.write_text(out)
    assert cli.main(["replay", "--no-progress", str(events)]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert "unverified" not in err  # no "broker registration not seen", no "never registered"
    assert "alerts: 0 violations" in err


def test_kafka_44s_log_gives_the_view_broker_1_and_the_cluster_default_min_insync_replicas():
    stats = MetadataLogStats()
    detector = Detector(DetectorConfig(), now_ms=lambda: T0)
    for item in native(SNAPSHOT, stats) + native(SEGMENT, stats):
        assert isinstance(item, Envelope)
        assert detector.ingest(item) == []
    detector.flush()
    view = detector.cluster("c1").view
    broker = view.brokers[1].latest
    # Registered at epoch 14, then shut down cleanly when the test stopped it.
    assert (broker.registered, broker.epoch, broker.shutting_down) == (True, 14, True)
    setting = view.topic_config("t1", MIN_INSYNC_REPLICAS)
    assert setting is not None and setting[0] == "1"  # the cluster default, resource type 4 named ""
    assert view.topic_config("t1", UNCLEAN_LEADER_ELECTION_ENABLE) is None  # set nowhere in the log


# ---- a version newer than the schemas -----------------------------------------------------

_REGISTRATION_V4 = {
    "brokerId": 7,
    "isMigratingZkBroker": False,
    "incarnationId": "5TICkSDlQOGOHY-sn-TtDw",
    "brokerEpoch": 21,
    "endPoints": [{"name": "PLAINTEXT", "host": "kafka-7", "port": 9092, "securityProtocol": 0}],
    "features": [{"name": "metadata.version", "minSupportedVersion": 7, "maxSupportedVersion": 33}],
    "rack": None,
    "fenced": False,
    "inControlledShutdown": False,
}
_DIR = bytes(range(16))  # LOG_DIR's kind: a Uuid; "AAECAwQFBgcICQoLDA0ODw" as Kafka prints it


def _uvarint(n: int) -> bytes:
    return bytes(UnsignedVarInt32.encode(n))


def register_broker_v5(*, extra_untagged: bytes = b"") -> bytes:
    """A RegisterBrokerRecord at version 5, one past the newest schema (4): v4's
    untagged fields (kafka-python's encoder, from the vendored schema), then
    ``extra_untagged``, then a tagged-field section with v4's LogDirs (tag 0)
    and a tag v4 does not have (7), in ascending tag order as Kafka writes them."""
    v4 = metadata_value({"type": "REGISTER_BROKER_RECORD", "version": 4, "data": _REGISTRATION_V4})
    assert v4[:3] == bytes([1, 0, 4]) and v4[-1] == 0  # frame; no tagged field set
    untagged = v4[3:-1]
    log_dirs = _uvarint(2) + _DIR  # compact array of one uuid
    unknown = b"\x00\x01\x02"
    tagged = _uvarint(2) + _uvarint(0) + _uvarint(len(log_dirs)) + log_dirs
    tagged += _uvarint(7) + _uvarint(len(unknown)) + unknown
    return bytes([1, 0, 5]) + untagged + extra_untagged + tagged


def test_a_newer_version_that_only_added_a_tagged_field_is_read_by_the_newest_schemas_fields():
    assert RECORD_SCHEMAS[0].max_version == 4
    decoded = decode_metadata_value(register_broker_v5())
    assert isinstance(decoded, ReadAsOlder)
    assert decoded.read_as == 4
    assert decoded.body == {
        "type": "REGISTER_BROKER_RECORD",
        "version": 5,  # its own version; the fields v4 has
        "data": {**_REGISTRATION_V4, "logDirs": ["AAECAwQFBgcICQoLDA0ODw"]},
    }
    assert decoded.name == "REGISTER_BROKER_RECORD v5 read as v4"


def test_a_newer_version_whose_untagged_fields_changed_is_counted_not_guessed():
    # An untagged int32 added after v4's last untagged field: the bytes no longer fit v4.
    decoded = decode_metadata_value(register_broker_v5(extra_untagged=struct.pack(">i", 3)))
    assert decoded == Unreadable("REGISTER_BROKER_RECORD v5")


def test_newer_versions_become_envelopes_and_are_counted_in_the_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMANDS", {"convert": cli.COMMANDS["convert"]})
    records = [
        Record(T0, {}, value=register_broker_v5()),
        Record(T0 + 1, {}, value=register_broker_v5(extra_untagged=struct.pack(">i", 3))),
        Record(
            T0 + 2,
            {
                "type": "BROKER_REGISTRATION_CHANGE_RECORD",
                "version": 0,
                "data": {"brokerId": 7, "brokerEpoch": 21, "fenced": 1},
            },
        ),
    ]
    path = tmp_path / segment_name(0)
    path.write_bytes(LogFile(segment_name(0), [Batch(0, 1, records)]).to_bytes())
    stats = MetadataLogStats()
    items = native(path, stats)
    assert [i.body["data"]["brokerId"] for i in items if isinstance(i, Envelope)] == [7, 7]
    assert stats.read_as_older_by_type == {"REGISTER_BROKER_RECORD v5 read as v4": 1}
    assert stats.unread_by_type == {"REGISTER_BROKER_RECORD v5": 1}
    assert cli.main(["convert", "metadata-log", "--cluster", "c1", str(path)]) == 0
    _, err = capsys.readouterr()
    assert (
        "2 records (BROKER_REGISTRATION_CHANGE_RECORD=1, REGISTER_BROKER_RECORD=1) (of a version newer "
        "than this release knows, read as the newest it knows: REGISTER_BROKER_RECORD v5 read as v4=1), "
        "0 dead letters; skipped: 0 control records, 1 records without a schema here "
        "(REGISTER_BROKER_RECORD v5=1)"
    ) in err
