"""``fencewatch ship quorum-state`` against the embedded broker: a controller's
quorum-state file, replaced by rename the way Kafka's FileQuorumStateStore
does it (``quorum-state.tmp``, then an atomic move), published once per new
content, and the envelopes judged by the detector."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition
from test_ship import Shipper

from detectors.engine import Detector
from detectors.envelope import Envelope, parse_envelope
from fencewatch.cli import main
from streaming.broker import EmbeddedBroker

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
NATIVE = REPO_ROOT / "tests" / "data" / "native"
WAIT_SECONDS = 30.0


def state(leader: int, epoch: int, voted: int = -1) -> bytes:
    """A data_version 0 quorum-state, one line without a newline, as Kafka writes it."""
    return orjson.dumps(
        {
            "clusterId": "",
            "leaderId": leader,
            "leaderEpoch": epoch,
            "votedId": voted,
            "appliedOffset": 0,
            "currentVoters": [{"voterId": 1}, {"voterId": 2}, {"voterId": 3}],
            "data_version": 0,
        }
    )


def kafka_write(path: Path, data: bytes) -> None:
    """Replace ``path`` as FileQuorumStateStore does: a temp file, synced, renamed over it."""
    temp = path.with_name(path.name + ".tmp")
    with open(temp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


class Reader:
    """Reads a one-partition topic from offset 0."""

    def __init__(self, broker: EmbeddedBroker, topic: str) -> None:
        self.values: list[bytes] = []
        self.keys: list[bytes | None] = []
        self._consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap_servers,
                "group.id": f"test-ship-qs-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
            }
        )
        self._consumer.assign([TopicPartition(topic, 0, 0)])

    def wait_for(self, count: int, why: str = "") -> list[bytes]:
        deadline = time.monotonic() + WAIT_SECONDS
        while len(self.values) < count:
            assert time.monotonic() < deadline, f"only {len(self.values)} of {count} records {why}"
            for msg in self._consumer.consume(100, 0.2):
                assert msg.error() is None, msg.error()
                self.keys.append(msg.key())
                self.values.append(msg.value())
        return self.values

    def settle(self, seconds: float = 1.0) -> list[bytes]:
        """Everything that arrives within ``seconds`` more (to see nothing extra was sent)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for msg in self._consumer.consume(100, 0.1):
                self.keys.append(msg.key())
                self.values.append(msg.value())
        return self.values

    def close(self) -> None:
        self._consumer.close()


@pytest.fixture
def reader(broker: EmbeddedBroker) -> Iterator[Callable[[str], Reader]]:
    made: list[Reader] = []

    def make(topic: str) -> Reader:
        made.append(Reader(broker, topic))
        return made[-1]

    yield make
    for r in made:
        r.close()


def ship_argv(broker: EmbeddedBroker, topic: str, cluster: str, node: int, *extra: str) -> list[str]:
    return [
        "ship",
        "quorum-state",
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--topic",
        topic,
        "--cluster",
        cluster,
        "--node",
        str(node),
        "--status-interval",
        "0",
        *extra,
    ]


def test_once_publishes_the_current_state_of_the_directory(
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    reader: Callable[[str], Reader],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic, dead_topic = make_topic(1), make_topic(1)
    directory = tmp_path / "__cluster_metadata-0"
    directory.mkdir()
    kafka_write(directory / "quorum-state", (NATIVE / "quorum-state-v1.json").read_bytes())
    before_ms = time.time_ns() // 1_000_000

    assert main([*ship_argv(broker, topic, "c-qs", 2, "--once"), str(directory)]) == 0

    (value,) = reader(topic).wait_for(1)
    env = parse_envelope(value)
    assert isinstance(env, Envelope)
    assert (env.cluster, env.node, env.kind, env.offset) == ("c-qs", 2, "quorum_state", None)
    assert env.body == orjson.loads((NATIVE / "quorum-state-v1.json").read_bytes())
    assert before_ms <= env.ts_ms <= time.time_ns() // 1_000_000  # when it was seen
    assert "1 new state(s) seen: 1 shipped, 0 dead letters (1 delivered" in capsys.readouterr().err

    # A file Kafka would not write is a dead letter, on the dead-letter topic.
    kafka_write(directory / "quorum-state", b'{"leaderId":1,"data_version":3}')
    argv = ship_argv(broker, topic, "c-qs", 2, "--once", "--dead-letter-topic", dead_topic)
    assert main([*argv, str(directory)]) == 0
    (letter,) = reader(dead_topic).wait_for(1)
    record = orjson.loads(letter)
    assert record["reason"].startswith("data_version 3 is not one fencewatch reads")
    assert record["source"] == {
        "format": "quorum-state",
        "cluster": "c-qs",
        "node": 2,
        "file": str(directory / "quorum-state"),
    }

    assert main([*ship_argv(broker, topic, "c-qs", 2, "--once"), str(tmp_path / "nowhere")]) == 1
    assert "cannot open" in capsys.readouterr().err


def test_following_publishes_each_new_content_once_across_renames_and_restarts(
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    reader: Callable[[str], Reader],
    tmp_path: Path,
) -> None:
    topic = make_topic(1)
    path = tmp_path / "quorum-state"
    argv = ship_argv(broker, topic, "c-follow", 1, "--poll-interval", "0.05", str(path))
    shipper = Shipper(argv, tmp_path)
    out = reader(topic)
    voted, led, next_epoch = state(-1, 4, voted=1), state(1, 4), state(2, 5)
    try:
        # Started before the controller ever wrote the file: it waits for it.
        shipper.start()
        shipper.wait_for_stderr(f"waiting for {path}: it does not exist yet")
        kafka_write(path, voted)
        out.wait_for(1, "(the first state)")

        # Each rename is a new inode; each new content is published once.
        kafka_write(path, led)
        out.wait_for(2, "(after a rename)")
        kafka_write(path, led)  # rewritten unchanged: nothing new
        assert len(out.settle()) == 2

        # Removed (QuorumStateStore.clear) and written again: waited for, then published.
        path.unlink()
        shipper.wait_for_stderr(f"{path} was removed; waiting for it to come back")
        kafka_write(path, next_epoch)
        out.wait_for(3, "(after the file came back)")
        assert len(out.settle()) == 3

        # A restart publishes the current state again.
        assert shipper.stop() == 0
        shipper.start()
        out.wait_for(4, "(after the restart)")
        assert shipper.stop() == 0
    finally:
        shipper.kill_if_running()

    values = out.settle(0.5)
    assert out.keys == [b"c-follow"] * 4
    items = [parse_envelope(v) for v in values]
    assert all(isinstance(i, Envelope) for i in items)
    envs: list[Envelope] = items  # type: ignore[assignment]
    assert [e.body for e in envs] == [orjson.loads(b) for b in (voted, led, next_epoch, next_epoch)]
    assert [e.ts_ms for e in envs] == sorted(e.ts_ms for e in envs)
    assert "1 new state(s) seen: 1 shipped" in shipper.stderr()

    # The restart's repeat is recognised by its content: the same fact, no alert.
    detector = Detector(now_ms=lambda: 0)
    for env in envs:
        assert detector.ingest(env) == []
    detector.flush()
    assert detector.counters.events == {"quorum_state": 3}
    assert detector.counters.duplicates == 1
    assert detector.drain() == []
