"""``__remote_log_metadata`` read from its records' bytes
(producers.remote_log_metadata_records) against the formatter path
(detectors.parse_remote_log_metadata), on what a Kafka 4.4.0 cluster wrote:
``tests/data/native/kafka-4.4.0-cluster/remote-log-metadata.jsonl`` holds the
topic's records as the broker stored them and ``remote-log-metadata.txt`` the
same topic through Kafka's ``RemoteLogMetadataFormatter`` (both written by
tests/data/make_kafka_samples.py). Bytes that are no record are dead letters.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from detectors.envelope import DeadLetter, Envelope
from detectors.parse_remote_log_metadata import RemoteLogMetadataStats, iter_remote_log_metadata
from producers.remote_log_metadata_records import (
    TopicRecord,
    decode_value,
    iter_topic_records,
    record_body,
)

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "native" / "kafka-4.4.0-cluster"


def topic_records() -> list[TopicRecord]:
    records = []
    for line in (SAMPLES / "remote-log-metadata.jsonl").read_text().splitlines():
        obj = json.loads(line)
        records.append(TopicRecord(obj["partition"], obj["offset"], base64.b64decode(obj["value"])))
    return records


def test_every_record_gives_the_envelope_the_formatter_path_gives():
    stats = RemoteLogMetadataStats()
    from_bytes = list(iter_topic_records(topic_records(), cluster="real", stats=stats))
    text_stats = RemoteLogMetadataStats()
    lines = (SAMPLES / "remote-log-metadata.txt").read_bytes().splitlines()
    from_text = list(iter_remote_log_metadata(lines, source="formatter", cluster="real", stats=text_stats))
    assert stats.dead_letters == text_stats.dead_letters == 0
    assert all(isinstance(item, Envelope) for item in from_bytes + from_text)
    by_place = {(e.body["partition"], e.offset): e.to_dict() for e in from_text if isinstance(e, Envelope)}
    assert {
        (e.body["partition"], e.offset): e.to_dict() for e in from_bytes if isinstance(e, Envelope)
    } == by_place
    assert stats.records_by_type == text_stats.records_by_type
    # The run uploaded segments, deleted them by retention and deleted the topic.
    states = {(e["body"]["type"], e["body"]["data"].get("remoteLogSegmentState")) for e in by_place.values()}
    assert ("RemoteLogSegmentMetadataRecord", 0) in states  # COPY_SEGMENT_STARTED
    assert ("RemoteLogSegmentMetadataUpdateRecord", 1) in states  # COPY_SEGMENT_FINISHED
    assert ("RemoteLogSegmentMetadataUpdateRecord", 3) in states  # DELETE_SEGMENT_FINISHED


def test_positions_name_the_topic_partition_and_offset():
    first = topic_records()[0]
    item = next(iter_topic_records([first], cluster="real", stats=RemoteLogMetadataStats()))
    assert isinstance(item, Envelope)
    assert item.position == f"__remote_log_metadata/{first.partition}@{first.offset}"
    assert item.offset == first.offset and item.body["partition"] == first.partition


def test_the_custom_metadata_is_left_out_as_the_formatter_prints_only_its_length():
    segment = next(r for r in topic_records() if r.value and r.value[1] == 0)  # api key 0
    assert "customMetadata" in decode_value(segment.value)["data"]  # null, but read
    body = record_body(segment.value, segment.partition)
    assert "customMetadata" not in body["data"]
    assert isinstance(body["data"]["txnIndexEmpty"], bool)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"", "ends inside its frame header"),
        (b"\x02\x00\x00", "unknown frame version 2"),
        (b"\x01\x09\x00", "unknown record api key 9"),
        (b"\x01\x01\x05", "RemoteLogSegmentMetadataUpdateRecord v5 is newer"),
        (b"\x01\x00\x00\x05ab", "RemoteLogSegmentMetadataRecord v0 does not decode"),
    ],
)
def test_bytes_that_are_no_record_are_dead_letters_saying_why(value: bytes, reason: str):
    stats = RemoteLogMetadataStats()
    (item,) = iter_topic_records([TopicRecord(3, 7, value)], cluster="real", stats=stats)
    assert isinstance(item, DeadLetter)
    assert reason in item.reason and item.position == "__remote_log_metadata/3@7"
    assert stats.dead_letters == 1 and stats.records == 0


def test_garbage_after_a_record_and_a_snapshot_record_are_dead_letters():
    good = topic_records()[0].value
    assert good is not None
    stats = RemoteLogMetadataStats()
    # RemoteLogSegmentMetadataSnapshotRecord v0: segment id, offsets, broker, times,
    # no leader epochs, size, null custom metadata, state, no tagged fields.
    snapshot = b"\x01\x03\x00" + bytes(16 + 8 + 8 + 4 + 8 + 8) + b"\x01" + bytes(4) + b"\x00\x00\x00"
    items = list(
        iter_topic_records(
            [TopicRecord(0, 1, good + b"\x00"), TopicRecord(0, 2, snapshot), TopicRecord(0, 3, None)],
            cluster="real",
            stats=stats,
        )
    )
    assert [type(i) for i in items] == [DeadLetter, DeadLetter, DeadLetter]
    assert isinstance(items[0], DeadLetter) and "does not fill its value" in items[0].reason
    assert isinstance(items[1], DeadLetter) and "belongs in a broker's local" in items[1].reason
    assert isinstance(items[2], DeadLetter) and "without a value" in items[2].reason
    assert stats.lines == 3 and stats.dead_letters == 3
