"""``__remote_log_metadata`` as kafka-console-consumer.sh's RemoteLogMetadataFormatter
prints it -> remote_log_metadata envelopes (SPEC 1.4),
detectors/parse_remote_log_metadata.py, and through ``fencewatch convert`` and
``fencewatch replay`` to the REMOTE_SEGMENT_* rules."""

from __future__ import annotations

import io
import re
import subprocess
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors.envelope import DeadLetter, DeadLetterClass, Envelope
from detectors.lines import LongLine
from detectors.parse_remote_log_metadata import RemoteLogMetadataStats, iter_remote_log_metadata
from detectors.remote import COPY_FINISHED, COPY_STARTED, parse_event
from fencewatch import cli
from tests.unit.test_end_to_end_native import fencewatch as run_fencewatch

DATA = Path(__file__).resolve().parents[1] / "data"
SAMPLE = DATA / "native" / "remote-log-metadata.txt"
LIFECYCLE = DATA / "native" / "remote-log-metadata-lifecycle.txt"
METADATA_DUMP = DATA / "e2e" / "metadata.dump"  # the same cluster: orders, brokers 1-3
CLUSTER = "prod-eu-1"
TOPIC_ID = "qG8hUlWTTJ2eRb_bFvWRXg"
SEGMENT_ID = "6LwWPILu4YczKIx9SsY22w"
SEGMENT_ID_TEXT = f"RemoteLogSegmentId{{topicIdPartition={TOPIC_ID}:orders-0, id={SEGMENT_ID}}}"
SEGMENT = (
    f"partition: 12, offset: 0, value: RemoteLogSegmentMetadata{{remoteLogSegmentId={SEGMENT_ID_TEXT}, "
    "startOffset=412, endOffset=900, brokerId=3, maxTimestampMs=1795169719302, "
    "eventTimestampMs=1795169720000, segmentLeaderEpochs={0=412, 1=530}, segmentSizeInBytes=1047552, "
    "customMetadata=Optional.empty, state=COPY_SEGMENT_STARTED, txnIdxEmpty=false}"
)
UPDATE = (
    f"partition: 12, offset: 1, value: RemoteLogSegmentMetadataUpdate{{remoteLogSegmentId={SEGMENT_ID_TEXT}, "
    "customMetadata=Optional[CustomMetadata{57 bytes}], state=COPY_SEGMENT_FINISHED, "
    "eventTimestampMs=1795169721000, brokerId=3}"
)
PARTITION_DELETE = (
    "partition: 7, offset: 0, value: RemotePartitionDeleteMetadata{topicPartition="
    "3zhK6Xx3rTABYmqrAfLrKg:payments-0, state=DELETE_PARTITION_MARKED, eventTimestampMs=1795169705000, "
    "brokerId=3000}"
)
TOPIC_ID_PARTITION = {"name": "orders", "id": TOPIC_ID, "partition": 0}


def parse(lines, *, stats=None, max_record_bytes=1 << 20):
    return list(
        iter_remote_log_metadata(
            lines, source="rlm.txt", cluster=CLUSTER, stats=stats, max_record_bytes=max_record_bytes
        )
    )


def one(line: str | bytes) -> Envelope | DeadLetter:
    (item,) = parse([line])
    return item


# ---- the three forms ---------------------------------------------------------------------------


SEGMENT_BODY = {
    "type": "RemoteLogSegmentMetadataRecord",
    "version": 0,
    "data": {
        "remoteLogSegmentId": {"topicIdPartition": TOPIC_ID_PARTITION, "id": SEGMENT_ID},
        "startOffset": 412,
        "endOffset": 900,
        "brokerId": 3,
        "maxTimestampMs": 1795169719302,
        "eventTimestampMs": 1795169720000,
        "segmentLeaderEpochs": [{"leaderEpoch": 0, "offset": 412}, {"leaderEpoch": 1, "offset": 530}],
        "segmentSizeInBytes": 1047552,
        "remoteLogSegmentState": COPY_STARTED,
        "txnIndexEmpty": False,
    },
}
UPDATE_BODY = {
    "type": "RemoteLogSegmentMetadataUpdateRecord",
    "version": 0,
    "data": {
        "remoteLogSegmentId": {"topicIdPartition": TOPIC_ID_PARTITION, "id": SEGMENT_ID},
        "brokerId": 3,
        "eventTimestampMs": 1795169721000,
        "remoteLogSegmentState": COPY_FINISHED,
    },
}
PARTITION_DELETE_BODY = {
    "type": "RemotePartitionDeleteMetadataRecord",
    "version": 0,
    "data": {
        "topicIdPartition": {"name": "payments", "id": "3zhK6Xx3rTABYmqrAfLrKg", "partition": 0},
        "brokerId": 3000,
        "eventTimestampMs": 1795169705000,
        "remotePartitionDeleteState": 0,
    },
}


@pytest.mark.parametrize(
    ("line", "body"),
    [(SEGMENT, SEGMENT_BODY), (UPDATE, UPDATE_BODY), (PARTITION_DELETE, PARTITION_DELETE_BODY)],
    ids=["segment", "update", "partition-delete"],
)
def test_each_form_becomes_its_record(line, body):
    env = one(line)

    assert isinstance(env, Envelope)
    partition, offset = (int(n) for n in re.match(r"partition: (\d+), offset: (\d+)", line).groups())  # type: ignore[union-attr]
    assert (env.cluster, env.node, env.kind, env.offset) == (CLUSTER, None, "remote_log_metadata", offset)
    assert env.ts_ms == body["data"]["eventTimestampMs"]
    assert env.position == "rlm.txt:1"
    assert env.body == {**body, "partition": partition}


def test_the_line_kafkas_own_formatter_test_expects_is_read():
    # storage/src/test/java/org/apache/kafka/server/log/remote/metadata/storage/
    # RemoteLogMetadataFormatterTest.java, with its random ids filled in.
    line = (
        "partition: 0, offset: 0, value: RemoteLogSegmentMetadata{remoteLogSegmentId="
        f"RemoteLogSegmentId{{topicIdPartition={TOPIC_ID}:foo-0, id={SEGMENT_ID}}}, "
        "startOffset=0, endOffset=100, brokerId=1, maxTimestampMs=-1, "
        "eventTimestampMs=123, segmentLeaderEpochs={0=0, 1=20, 2=80}, segmentSizeInBytes=1024, "
        "customMetadata=Optional[CustomMetadata{10 bytes}], state=COPY_SEGMENT_STARTED, txnIdxEmpty=true}\n"
    )

    env = one(line)

    assert isinstance(env, Envelope)
    data = env.body["data"]
    assert (env.ts_ms, data["maxTimestampMs"], data["txnIndexEmpty"]) == (123, -1, True)
    assert [e["offset"] for e in data["segmentLeaderEpochs"]] == [0, 20, 80]


def test_lines_of_releases_before_custom_metadata_and_txn_index_are_read():
    old_segment = SEGMENT.replace("customMetadata=Optional.empty, ", "").replace(", txnIdxEmpty=false", "")
    old_update = UPDATE.replace("customMetadata=Optional[CustomMetadata{57 bytes}], ", "")

    segment, update = parse([old_segment, old_update])

    assert isinstance(segment, Envelope) and isinstance(update, Envelope)
    assert "txnIndexEmpty" not in segment.body["data"]
    assert segment.body["data"]["segmentLeaderEpochs"][1] == {"leaderEpoch": 1, "offset": 530}
    assert update.body["data"]["remoteLogSegmentState"] == COPY_FINISHED


def test_topic_names_with_dashes_and_dots_keep_the_partition_after_the_last_dash():
    env = one(SEGMENT.replace(":orders-0,", ":eu.orders-v2-17,"))

    assert isinstance(env, Envelope)
    tip = env.body["data"]["remoteLogSegmentId"]["topicIdPartition"]
    assert (tip["name"], tip["partition"]) == ("eu.orders-v2", 17)


def test_bodies_are_what_the_remote_rules_read():
    segment, update = parse([SEGMENT, UPDATE])
    assert isinstance(segment, Envelope) and isinstance(update, Envelope)

    first, second = parse_event(segment.body), parse_event(update.body)

    assert (first.segment_id, first.key, first.broker_id, first.state) == (
        SEGMENT_ID,
        (TOPIC_ID, 0),
        3,
        COPY_STARTED,
    )
    # A real cluster's record has no cleaner-offset map (KIP-1272 is a proposal).
    assert first.cleaner == {}
    assert (second.segment_id, second.state, second.cleaner) == (SEGMENT_ID, COPY_FINISHED, None)


def test_same_offset_in_two_metadata_partitions_gives_two_distinct_records():
    # The topic has many partitions whose offsets repeat: the envelope names both.
    other = SEGMENT.replace("partition: 12, offset: 0", "partition: 31, offset: 0").replace(
        ":orders-0,", ":orders-1,"
    )

    first, second = parse([SEGMENT, other])

    assert isinstance(first, Envelope) and isinstance(second, Envelope)
    assert (first.offset, first.body["partition"]) == (0, 12)
    assert (second.offset, second.body["partition"]) == (0, 31)
    assert first.body != second.body


def test_sample_every_line_accounted():
    stats = RemoteLogMetadataStats()
    items = parse(SAMPLE.read_bytes().splitlines(keepends=True), stats=stats)

    assert all(isinstance(i, Envelope) for i in items)
    assert stats.records_by_type == {
        "RemoteLogSegmentMetadataRecord": 3,
        "RemoteLogSegmentMetadataUpdateRecord": 8,
        "RemotePartitionDeleteMetadataRecord": 1,
    }
    assert (stats.lines, stats.records, stats.dead_letters, stats.other_lines) == (13, 12, 0, 1)


def test_a_binary_stream_is_read_in_bounded_lines():
    stream = io.BytesIO(f"{SEGMENT}\n\n{'x' * 5000}\n{UPDATE}\n".encode())
    stats = RemoteLogMetadataStats()

    items = parse(stream, stats=stats, max_record_bytes=len(SEGMENT) + 10)

    assert [type(i) for i in items] == [Envelope, DeadLetter, Envelope]
    assert items[1].kind is DeadLetterClass.TOO_LARGE and items[1].position == "rlm.txt:3"
    assert stats.lines == stats.records + stats.dead_letters + stats.other_lines == 4


# ---- bad input: a dead letter with a reason, never a crash -------------------------------------


@pytest.mark.parametrize(
    ("line", "kind", "reason"),
    [
        ("garbage", DeadLetterClass.INVALID, "not a RemoteLogMetadataFormatter line"),
        (SEGMENT[:150], DeadLetterClass.INVALID, "not a record's toString"),
        (SEGMENT[:-1] + ", }", DeadLetterClass.INVALID, "is not name=value"),
        (
            "partition: 0, offset: 5, value: RemoteLogSegmentMetadataSnapshot{segmentId=x}",
            DeadLetterClass.INVALID,
            "unknown record form 'RemoteLogSegmentMetadataSnapshot'",
        ),
        (
            SEGMENT.replace("endOffset=900, ", ""),
            DeadLetterClass.MISSING_FIELD,
            "RemoteLogSegmentMetadata.endOffset",
        ),
        (
            UPDATE.replace(", brokerId=3", ""),
            DeadLetterClass.MISSING_FIELD,
            "RemoteLogSegmentMetadataUpdate.brokerId",
        ),
        (
            PARTITION_DELETE.replace("state=DELETE_PARTITION_MARKED, ", ""),
            DeadLetterClass.MISSING_FIELD,
            "RemotePartitionDeleteMetadata.state",
        ),
        (
            SEGMENT.replace("endOffset=900", "endOffset=99999999999999999999"),
            DeadLetterClass.OUT_OF_RANGE,
            "out of range",
        ),
        (
            SEGMENT.replace("endOffset=900", "endOffset=" + "9" * 5000),
            DeadLetterClass.OUT_OF_RANGE,
            "out of range",
        ),
        (UPDATE.replace("brokerId=3", "brokerId=2147483648"), DeadLetterClass.OUT_OF_RANGE, "brokerId"),
        (SEGMENT.replace("{0=412, 1=530}", "{0=412, -1=530}"), DeadLetterClass.OUT_OF_RANGE, "epoch"),
        (SEGMENT.replace("startOffset=412", "startOffset=-1"), DeadLetterClass.OUT_OF_RANGE, "startOffset"),
        (SEGMENT.replace("endOffset=900", "endOffset=100"), DeadLetterClass.INVALID, "before startOffset"),
        (SEGMENT.replace("{0=412, 1=530}", "{}"), DeadLetterClass.INVALID, "non-empty map"),
        (
            SEGMENT.replace("{0=412, 1=530}", "{0=412,1=530}"),
            DeadLetterClass.WRONG_TYPE,
            "must be an integer",
        ),
        (SEGMENT.replace("brokerId=3", "brokerId=three"), DeadLetterClass.WRONG_TYPE, "must be an integer"),
        (
            UPDATE.replace("COPY_SEGMENT_FINISHED", "COPY_SEGMENT_DONE"),
            DeadLetterClass.WRONG_TYPE,
            "must be one of",
        ),
        (
            PARTITION_DELETE.replace("DELETE_PARTITION_MARKED", "COPY_SEGMENT_STARTED"),
            DeadLetterClass.WRONG_TYPE,
            "DELETE_PARTITION_MARKED",
        ),
        (UPDATE.replace(f"id={SEGMENT_ID}", "id=short"), DeadLetterClass.INVALID, "RemoteLogSegmentId{"),
        (
            SEGMENT.replace(f"{TOPIC_ID}:orders-0", "orders-0"),
            DeadLetterClass.INVALID,
            "<topicId>:<topic>-<partition>",
        ),
        (
            UPDATE.replace("Optional[CustomMetadata{57 bytes}]", "Optional[57]"),
            DeadLetterClass.INVALID,
            "customMetadata",
        ),
        (
            SEGMENT.replace("txnIdxEmpty=false", "txnIdxEmpty=maybe"),
            DeadLetterClass.WRONG_TYPE,
            "true or false",
        ),
        (
            SEGMENT.replace("segmentLeaderEpochs={0=412, 1=530}", "segmentLeaderEpochs={0=412"),
            DeadLetterClass.INVALID,
            "unbalanced",
        ),
        (UPDATE.replace("brokerId=3}", "brokerId=3, brokerId=4}"), DeadLetterClass.INVALID, "appears twice"),
        (
            UPDATE.replace("offset: 1,", "offset: 99999999999999999999,"),
            DeadLetterClass.OUT_OF_RANGE,
            "offset",
        ),
        (
            UPDATE.replace("eventTimestampMs=1795169721000", "eventTimestampMs=253402300800000"),
            DeadLetterClass.NO_TIMESTAMP,
            "eventTimestampMs",
        ),
        (
            UPDATE.replace("eventTimestampMs=1795169721000", "eventTimestampMs=-1"),
            DeadLetterClass.NO_TIMESTAMP,
            "-1",
        ),
    ],
)
def test_bad_lines_are_dead_letters_with_a_reason(line, kind, reason):
    stats = RemoteLogMetadataStats()
    (item,) = parse([line], stats=stats)

    assert isinstance(item, DeadLetter)
    assert item.kind is kind, item.reason
    assert reason in item.reason
    assert item.position == "rlm.txt:1" and item.raw == line[: len(item.raw)]
    assert (stats.lines, stats.dead_letters, stats.records) == (1, 1, 0)


def test_non_utf8_and_over_long_lines_are_dead_letters():
    items = parse([SEGMENT.encode()[:40] + b"\xff\n", LongLine(b"partition: 1", limit=10)])

    assert [i.kind for i in items] == [DeadLetterClass.NOT_UTF8, DeadLetterClass.TOO_LARGE]  # type: ignore[union-attr]


def test_blank_lines_and_the_consumer_summary_are_other_lines():
    stats = RemoteLogMetadataStats()
    items = parse(["\n", "   \n", "Processed a total of 2 messages\n", UPDATE], stats=stats)

    assert len(items) == 1
    assert (stats.lines, stats.records, stats.dead_letters, stats.other_lines) == (4, 1, 0, 3)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([SEGMENT, UPDATE, PARTITION_DELETE]), st.integers(0, 400), st.binary(max_size=8))
def test_any_damage_to_a_line_is_a_record_or_a_dead_letter(line, cut, noise):
    # Cut a real line anywhere and splice in arbitrary bytes: never an exception, every line counted.
    raw = line.encode()
    damaged = raw[:cut] + noise + raw[cut + len(noise) :]
    stats = RemoteLogMetadataStats()

    items = parse([damaged], stats=stats)

    assert all(isinstance(i, Envelope | DeadLetter) for i in items)
    assert stats.lines == stats.records + stats.dead_letters + stats.other_lines == 1


@pytest.mark.parametrize(("cluster", "limit"), [("", 10), (CLUSTER, 0)])
def test_a_bad_cluster_or_limit_is_refused_at_once(cluster, limit):
    with pytest.raises(ValueError):
        iter_remote_log_metadata([], source="x", cluster=cluster, max_record_bytes=limit)


# ---- fencewatch convert ------------------------------------------------------------------------


@pytest.fixture
def main(monkeypatch):
    """``cli.main`` with only ``convert`` registered (as in test_convert_cli.py)."""
    monkeypatch.setattr(cli, "COMMANDS", {"convert": cli.COMMANDS["convert"]})
    return cli.main


def test_convert_writes_envelopes_and_a_summary(main, capsys):
    code = main(["convert", "remote-log-metadata", "--cluster", CLUSTER, str(SAMPLE)])
    out, err = capsys.readouterr()

    assert code == 0
    rows = [orjson.loads(line) for line in out.splitlines()]
    assert len(rows) == 12
    assert {(r["cluster"], r["kind"], r["node"]) for r in rows} == {(CLUSTER, "remote_log_metadata", None)}
    printed = [
        line.split(", value: ")[0] for line in SAMPLE.read_text().splitlines() if line.startswith("partition")
    ]
    assert [f"partition: {r['body']['partition']}, offset: {r['offset']}" for r in rows] == printed
    assert "13 lines: 12 records (" in err
    assert "RemotePartitionDeleteMetadataRecord=1), 0 dead letters; skipped: 1 other lines" in err


def test_convert_refuses_node_for_remote_log_metadata(main, capsys):
    code = main(["convert", "remote-log-metadata", "--node", "1", str(SAMPLE)])
    _, err = capsys.readouterr()

    assert code == 2
    assert "--node does not apply to remote-log-metadata" in err


# ---- convert + replay: the rules on native input -----------------------------------------------


def fencewatch(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = run_fencewatch(*args, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done


def convert(fmt: str, source: Path, tmp_path: Path) -> Path:
    target = tmp_path / f"{source.stem}.jsonl"
    target.write_text(fencewatch("convert", fmt, "--cluster", CLUSTER, source, cwd=tmp_path).stdout)
    return target


def replay(*files: Path, cwd: Path) -> tuple[list[tuple], str]:
    done = fencewatch("replay", *files, cwd=cwd)
    alerts = [orjson.loads(line) for line in done.stdout.splitlines()]
    return [(a["rule"], a["node"], a["topic"], a["partition"], a["ts_ms"]) for a in alerts], done.stderr


def test_native_sample_raises_the_remote_segment_violations(tmp_path):
    remote = convert("remote-log-metadata", SAMPLE, tmp_path)

    alerts, err = replay(remote, cwd=tmp_path)

    assert alerts == [
        # orders-1's segment deleted by broker 3 with no DELETE_SEGMENT_STARTED first
        ("REMOTE_SEGMENT_ZOMBIE_DELETE", 3, None, 1, 1795169712000),
        # orders-0's segment finished copying after its deletion had started
        ("REMOTE_SEGMENT_INVALID_TRANSITION", 1, None, 0, 1795169745200),
    ]
    # The partition-delete record is read too (it lets any broker clean up the partition's segments).
    assert re.search(r"dead letters +0\n", err), err


def test_with_the_metadata_log_a_deletion_by_a_deposed_leader_is_caught(tmp_path):
    remote = convert("remote-log-metadata", SAMPLE, tmp_path)
    metadata = convert("metadata-dump", METADATA_DUMP, tmp_path)

    alerts, _ = replay(remote, metadata, cwd=tmp_path)

    # In the order of their times: judgments wait for the metadata log, so the
    # order they are raised in depends on how far it reaches.
    remote_alerts = sorted((a for a in alerts if a[0].startswith("REMOTE_")), key=lambda a: a[4])
    assert remote_alerts == [
        ("REMOTE_SEGMENT_ZOMBIE_DELETE", 3, "orders", 1, 1795169712000),
        # broker 1 lost orders-0's leadership at 10:14:58 and deleted a valid segment at 10:15:40.5
        ("REMOTE_SEGMENT_ZOMBIE_DELETE", 1, "orders", 0, 1795169740500),
        ("REMOTE_SEGMENT_INVALID_TRANSITION", 1, "orders", 0, 1795169745200),
    ]


def test_converted_records_delivered_twice_change_nothing(tmp_path):
    remote = convert("remote-log-metadata", SAMPLE, tmp_path)

    once, _ = replay(remote, cwd=tmp_path)
    twice, _ = replay(remote, remote, cwd=tmp_path)

    assert twice == once


def test_a_normal_copy_and_delete_lifecycle_raises_nothing(tmp_path):
    remote = convert("remote-log-metadata", LIFECYCLE, tmp_path)
    metadata = convert("metadata-dump", METADATA_DUMP, tmp_path)

    alone, err = replay(remote, cwd=tmp_path)
    with_metadata, _ = replay(remote, metadata, cwd=tmp_path)
    metadata_only, _ = replay(metadata, cwd=tmp_path)

    assert alone == []
    assert re.search(r"^\s*dead letters\s+0$", err, re.MULTILINE), err
    # The leader's retention deletes and a failed upload cleaned up add nothing to the dump's own alerts.
    assert with_metadata == metadata_only
