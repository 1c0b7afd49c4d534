"""``fencewatch ship metadata-log`` against the embedded broker: a
``__cluster_metadata-0`` directory written as Kafka writes it
(tests/metadata_log_files.py) while the shipper, a child process, follows it.

Each record is a NoOp or TopicRecord whose offset says which it is, so what
reaches the topic can be checked record by record: every log offset once, in
order, nothing lost across a roll, a retention that deletes segments under a
stopped shipper (the snapshot then stands for them), a clean restart and a
SIGKILL; a corrupt batch a dead letter on the dead-letter topic.
"""

from __future__ import annotations

import gzip
import json
import signal
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import yaml
from metadata_log_files import Batch, LogFile, Record, batch_bytes, segment_name, snapshot_name
from test_ship import DATA, REPO_ROOT, Shipper, TopicReader, reader, ship_args, wait_until  # noqa: F401  (reader: a fixture)

from producers.metadata_log import iter_metadata_log_file
from streaming.broker import EmbeddedBroker

pytestmark = pytest.mark.integration

T0 = 1795169580000
TOPIC_ID = "qG8hUlWTTJ2eRb_bFvWRXg"


def batch(first: int, count: int = 1) -> bytes:
    """Records ``first``.. as NoOps, except every tenth offset, a TopicRecord named after it."""
    records = []
    for offset in range(first, first + count):
        if offset % 10 == 0:
            data = {"name": f"t{offset}", "topicId": TOPIC_ID}
            records.append(Record(T0 + offset, {"type": "TOPIC_RECORD", "version": 0, "data": data}))
        else:
            records.append(Record(T0 + offset, {"type": "NO_OP_RECORD", "version": 0, "data": {}}))
    return batch_bytes(Batch(first, 1, records))


def snapshot(end_offset: int) -> LogFile:
    last_ts_ms = T0 + end_offset - 1
    header = Record(T0, {"version": 0, "lastContainedLogTimestamp": last_ts_ms}, control="SNAPSHOT_HEADER")
    data = {"name": f"snapshot-{end_offset}", "topicId": TOPIC_ID}
    record = Record(T0, {"type": "TOPIC_RECORD", "version": 0, "data": data})
    footer = Record(T0, {"version": 0}, control="SNAPSHOT_FOOTER")
    batches = [Batch(0, 1, [header]), Batch(1, 1, [record]), Batch(2, 1, [footer])]
    return LogFile(snapshot_name(end_offset, 1), batches, snapshot_end=end_offset)


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def shipped(values: list[bytes]) -> list[tuple[int | None, str]]:
    """(offset, record type or snapshot topic name) of each envelope shipped."""
    out = []
    for value in values:
        env = orjson.loads(value)
        data = env["body"]["data"]
        out.append((env["offset"], data["name"] if env["offset"] is None else env["body"]["type"]))
    return out


def test_ship_follows_grows_rolls_survives_retention_restarts_and_kill(
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    reader: Callable[[str, int], TopicReader],  # noqa: F811
    tmp_path: Path,
) -> None:
    topic, dead_topic = make_topic(3), make_topic(1)
    log = tmp_path / "__cluster_metadata-0"
    log.mkdir()
    first = snapshot(3)
    (log / first.name).write_bytes(first.to_bytes())
    (log / segment_name(3)).write_bytes(batch(3, 2) + batch(5, 5))
    state = tmp_path / "state.json"
    argv = ["ship", "metadata-log", *ship_args(broker, topic, "c-live", "--dead-letter-topic", dead_topic)]
    argv += ["--poll-interval", "0.05", "--state-file", str(state), str(log)]
    shipper = Shipper(argv, tmp_path)
    out, dead = reader(topic, 3), reader(dead_topic, 1)
    try:
        shipper.start()
        out.wait_for(1 + 7, why="(snapshot and first segment)")

        # The active segment grows, a batch written in two parts is shipped once whole.
        active = log / segment_name(3)
        append(active, batch(10, 3))
        half = batch(13, 2)
        append(active, half[:25])
        out.wait_for(1 + 10, why="(growth)")
        append(active, half[25:])
        out.wait_for(1 + 12, why="(torn tail completed)")

        # A corrupt batch is a dead letter; the batch after it is read.
        bad = bytearray(batch(15))
        bad[-2] ^= 0x40
        append(active, bytes(bad) + batch(16, 4))
        out.wait_for(1 + 16, why="(after a corrupt batch)")
        dead.wait_for(1, why="(the corrupt batch)")

        # Kafka rolls to a new segment.
        (log / segment_name(20)).write_bytes(batch(20, 5))
        out.wait_for(1 + 21, why="(roll)")

        # Stopped; the log goes on, rolls, and retention deletes the segments
        # below a new snapshot, including offsets never shipped (25-29).
        assert shipper.stop() == 0
        append(log / segment_name(20), batch(25, 5))
        newer = snapshot(30)
        (log / newer.name).write_bytes(newer.to_bytes())
        (log / segment_name(30)).write_bytes(batch(30, 3))
        for old in (segment_name(3), segment_name(20), first.name):
            (log / old).unlink()
        shipper.start()
        out.wait_for(1 + 21 + 1 + 3, why="(restart after retention)")

        # Once the state file confirms everything, even SIGKILL repeats nothing.
        def confirmed() -> bool:
            return state.exists() and json.loads(state.read_text())["next_offset"] == 33

        wait_until(confirmed, "the state file to confirm offset 32")
        assert shipper.stop(signal.SIGKILL) < 0
        append(log / segment_name(30), batch(33, 2))
        shipper.start()
        out.wait_for(1 + 21 + 1 + 5, why="(restart after SIGKILL)")
        assert shipper.stop() == 0
    finally:
        shipper.kill_if_running()

    records = out.drain()
    assert {r[2] for r in records} == {b"c-live"} and len({r[0] for r in records}) == 1
    got = shipped([r[3] for r in sorted(records, key=lambda r: r[1])])
    expected: list[tuple[int | None, str]] = [(None, "snapshot-3")]
    for offset in [*range(3, 15), *range(16, 25), None, *range(30, 35)]:
        if offset is None:
            expected.append((None, "snapshot-30"))
        else:
            expected.append((offset, "TOPIC_RECORD" if offset % 10 == 0 else "NO_OP_RECORD"))
    assert got == expected, f"stderr:\n{shipper.stderr()}"
    letters = [json.loads(r[3]) for r in dead.drain()]
    assert len(letters) == 1
    assert "record batch is corrupt" in json.dumps(letters[0])
    err = shipper.stderr()
    assert "the segments holding offset 25 are gone: taking the state from the newest snapshot" in err


def test_a_directory_that_is_not_one_is_refused_in_one_line(broker: EmbeddedBroker, tmp_path: Path) -> None:
    argv = ["ship", "metadata-log", *ship_args(broker, "t", "c"), str(tmp_path / "nope")]
    shipper = Shipper(argv, tmp_path)
    shipper.start()
    assert shipper.proc is not None
    assert shipper.proc.wait(timeout=30) == 1
    assert shipper.stderr() == (
        f"fencewatch ship metadata-log: cannot follow {tmp_path / 'nope'}: no such directory -- name a "
        "broker's or controller's __cluster_metadata-0 directory\n"
    )


def test_the_compose_sidecar_command_ships_a_directory(
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    reader: Callable[[str, int], TopicReader],  # noqa: F811
    tmp_path: Path,
) -> None:
    """docker-compose.yml's ship-metadata-log command, with the broker, the
    directory and the state file of this test in place of the compose ones."""
    services = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())["services"]
    command = services["ship-metadata-log"]["command"]
    topic, dead_topic = make_topic(3), make_topic(1)
    log = tmp_path / "__cluster_metadata-0"
    log.mkdir()
    (log / segment_name(0)).write_bytes(batch(0, 3) + batch(3, 2))
    swap = {
        "kafka:9092": broker.bootstrap_servers,
        "fencewatch-events": topic,
        "fencewatch-dead-letters": dead_topic,
        "/var/lib/fencewatch/ship/metadata-log.offset": str(tmp_path / "state"),
        "/var/lib/kafka/data/__cluster_metadata-0": str(log),
    }
    argv = [swap.get(word, word) for word in command[1:]]
    assert set(swap.values()) <= set(argv)
    shipper = Shipper([*argv[:-1], "--once", argv[-1]], tmp_path)
    shipper.start()
    assert shipper.proc is not None
    assert shipper.proc.wait(timeout=60) == 0, shipper.stderr()
    out = reader(topic, 3)
    values = [r[3] for r in sorted(out.drain(), key=lambda r: r[1])]
    assert shipped(values) == [(0, "TOPIC_RECORD"), *[(o, "NO_OP_RECORD") for o in range(1, 5)]]
    assert {orjson.loads(v)["node"] for v in values} == {1}
    assert json.loads((tmp_path / "state").read_text())["next_offset"] == 5


def test_shipping_a_segment_kafka_wrote_publishes_what_convert_gives(
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    reader: Callable[[str, int], TopicReader],  # noqa: F811
    tmp_path: Path,
) -> None:
    log = tmp_path / "__cluster_metadata-0"
    log.mkdir()
    segment = log / segment_name(0)
    segment.write_bytes(
        gzip.decompress((DATA / "native" / "kraft-3.7.0-cluster-metadata-0.log.gz").read_bytes())
    )
    topic = make_topic(3)
    argv = ["ship", "metadata-log", *ship_args(broker, topic, "lab"), "--once", str(log)]
    shipper = Shipper(argv, tmp_path)
    shipper.start()
    assert shipper.proc is not None
    assert shipper.proc.wait(timeout=120) == 0, shipper.stderr()
    values = [r[3] for r in sorted(reader(topic, 3).drain(), key=lambda r: r[1])]
    expected = [e.to_dict() for e in iter_metadata_log_file(str(segment), cluster="lab")]
    assert [orjson.loads(v) for v in values] == expected
    # Every record of Kafka 3.7.0's segment: with Kafka 4.4's schemas vendored, the
    # CONFIG, transaction, ZK-migration, controller-registration and producer-id
    # records (8) are read too.
    assert len(expected) == 4929
