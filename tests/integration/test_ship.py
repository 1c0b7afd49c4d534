"""``fencewatch ship`` and ``fencewatch simulate --bootstrap-servers`` against the
embedded broker, plus the file follower (``producers.tail``) on its own.

Records are read back with ``assign()`` from offset 0. To know that nothing
more will arrive (no duplicate still in flight), :class:`TopicReader.drain`
writes a sentinel to every partition and reads until it has seen them all.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition

from detectors.envelope import dumps, parse_envelope
from detectors.parse_metadata_dump import iter_metadata_dump
from detectors.parse_remote_log_metadata import iter_remote_log_metadata
from detectors.parse_request_log import iter_request_log
from fencewatch.cli import build_parser, main
from fencewatch.simulate import config_from
from producers.simulator import Simulator
from producers.tail import FileFollower, StateFile, StopFollowing
from streaming.broker import EmbeddedBroker, free_port

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA = REPO_ROOT / "tests" / "data"
SENTINEL_KEY = b"__test_sentinel__"
WAIT_SECONDS = 30.0


# -- request log lines ------------------------------------------------------------


def entry(i: int) -> str:
    """One PRODUCE request-log entry whose correlationId is ``i``."""
    body = {
        "isForwarded": False,
        "requestHeader": {
            "requestApiKey": 0,
            "requestApiVersion": 13,
            "correlationId": i,
            "clientId": "p1",
            "requestApiKeyName": "PRODUCE",
        },
        "request": {
            "acks": -1,
            "timeoutMs": 30000,
            "topicData": [
                {"name": "orders", "partitionData": [{"index": i % 4, "recordsSizeInBytes": 100 + i}]}
            ],
        },
        "response": {
            "responses": [{"name": "orders", "partitionResponses": [{"index": i % 4, "errorCode": 0}]}],
            "throttleTimeMs": 0,
        },
        "totalTimeMs": 1.5,
    }
    second, milli = divmod(i, 1000)
    minute, second = divmod(second, 60)
    stamp = f"2026-11-20 10:{minute:02d}:{second:02d},{milli:03d}"
    return f"[{stamp}] DEBUG Completed request:{json.dumps(body)} (kafka.request.logger)\n"


def wrapped(line: str, width: int = 120) -> str:
    """``line`` hard-wrapped at ``width`` characters, as some log shippers do."""
    text = line.rstrip("\n")
    return "".join(text[i : i + width] + "\n" for i in range(0, len(text), width))


def other_line(i: int) -> str:
    return f"[2026-11-20 10:00:00,{i % 1000:03d}] INFO [BrokerServer id=1] heartbeat {i} (kafka.server)\n"


def entries(first: int, last: int) -> str:
    """Entries ``first..last-1``: every 7th wrapped, every 5th followed by another logger's line."""
    parts = []
    for i in range(first, last):
        parts.append(wrapped(entry(i)) if i % 7 == 3 else entry(i))
        if i % 5 == 0:
            parts.append(other_line(i))
    return "".join(parts)


def append(path: Path, text: str | bytes) -> None:
    data = text.encode() if isinstance(text, str) else text
    with open(path, "ab") as f:
        f.write(data)


def correlation_id(value: bytes) -> int:
    return int(orjson.loads(value)["body"]["requestHeader"]["correlationId"])


# -- reading topics back ----------------------------------------------------------------


class TopicReader:
    """Reads every partition of a topic from offset 0 with ``assign()``."""

    def __init__(self, broker: EmbeddedBroker, topic: str, partitions: int) -> None:
        self.topic, self.partitions = topic, partitions
        self.bootstrap = broker.bootstrap_servers
        self.records: list[tuple[int, int, bytes | None, bytes]] = []  # partition, offset, key, value
        self._sentinels_seen: set[tuple[int, bytes]] = set()
        self._consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"test-ship-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
            }
        )
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])

    def close(self) -> None:
        self._consumer.close()

    def _poll(self, timeout_seconds: float) -> None:
        for msg in self._consumer.consume(10_000, timeout_seconds):
            assert msg.error() is None, msg.error()
            if msg.key() == SENTINEL_KEY:
                self._sentinels_seen.add((msg.partition(), msg.value()))
            else:
                self.records.append((msg.partition(), msg.offset(), msg.key(), msg.value()))

    def wait_for(self, count: int, timeout_seconds: float = WAIT_SECONDS, why: str = "") -> None:
        """Poll until at least ``count`` records were read, or fail after the timeout."""
        deadline = time.monotonic() + timeout_seconds
        while len(self.records) < count:
            assert time.monotonic() < deadline, (
                f"only {len(self.records)} of {count} records in {self.topic} after {timeout_seconds}s {why}"
            )
            self._poll(0.2)

    def drain(self, timeout_seconds: float = WAIT_SECONDS) -> list[tuple[int, int, bytes | None, bytes]]:
        """Everything in the topic: write a sentinel per partition, read until all are seen."""
        token = uuid.uuid4().hex.encode()
        producer = Producer({"bootstrap.servers": self.bootstrap})
        for p in range(self.partitions):
            producer.produce(self.topic, key=SENTINEL_KEY, value=token, partition=p)
        assert producer.flush(10) == 0
        wanted = {(p, token) for p in range(self.partitions)}
        deadline = time.monotonic() + timeout_seconds
        while not wanted <= self._sentinels_seen:
            assert time.monotonic() < deadline, f"sentinels not read back from {self.topic}"
            self._poll(0.2)
        return list(self.records)


@pytest.fixture
def reader(broker: EmbeddedBroker) -> Iterator[Callable[[str, int], TopicReader]]:
    made: list[TopicReader] = []

    def make(topic: str, partitions: int) -> TopicReader:
        made.append(TopicReader(broker, topic, partitions))
        return made[-1]

    yield make
    for r in made:
        r.close()


def assert_one_ordered_partition(
    records: list[tuple[int, int, bytes | None, bytes]], key: bytes
) -> list[bytes]:
    """All records keyed ``key``, in one partition, offsets increasing; return the values."""
    assert records, "no records"
    assert {r[2] for r in records} == {key}
    assert len({r[0] for r in records}) == 1, "one cluster's records must share a partition"
    offsets = [r[1] for r in records]
    assert offsets == sorted(offsets)
    return [r[3] for r in records]


def ship_args(broker: EmbeddedBroker, topic: str, cluster: str, *extra: str) -> list[str]:
    return [
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--topic",
        topic,
        "--cluster",
        cluster,
        "--status-interval",
        "0",
        *extra,
    ]


# -- ship request-log --once ----------------------------------------------------------


def test_once_ships_every_record_exactly_once_in_order_with_dead_letters(
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    reader: Callable[[str, int], TopicReader],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic, dead_topic = make_topic(3), make_topic(1)
    log = tmp_path / "kafka-request.log"
    bad_json = '[2026-11-20 10:20:00,000] DEBUG Completed request:{"requestHeader": (kafka.request.logger)\n'
    bad_stamp = entry(999).replace("[2026-11-20", "[2026-13-45", 1)
    # Entry 30 is being written: two wrapped lines complete, the third not yet.
    in_progress = wrapped(entry(30))
    cut = len("".join(in_progress.splitlines(keepends=True)[:2])) + 40
    append(log, other_line(0) + entries(0, 12) + bad_json + entries(12, 21) + bad_stamp + entries(21, 30))
    append(log, in_progress[:cut])
    argv = ["ship", "request-log", *ship_args(broker, topic, "c-once", "--node", "1")]
    argv += ["--dead-letter-topic", dead_topic, "--once"]

    assert main([*argv, "--from-beginning", str(log)]) == 0

    out = reader(topic, 3)
    values = assert_one_ordered_partition(out.drain(), b"c-once")
    assert [correlation_id(v) for v in values] == list(range(30))
    # Byte for byte what the parser makes of the complete entries (convert's output).
    with open(log, "rb") as f:
        head = f.read()[: -len(in_progress[:cut])].splitlines(keepends=True)
    expected = [
        dumps(item.to_dict()).encode()
        for item in iter_request_log(head, source="x", cluster="c-once", node=1)
        if not hasattr(item, "reason")
    ]
    assert values == expected
    for value in values:
        env = parse_envelope(value)
        assert not hasattr(env, "reason"), env
        assert (env.cluster, env.node, env.kind) == ("c-once", 1, "request")

    dead = reader(dead_topic, 1).drain()
    assert [r[2] for r in dead] == [b"c-once", b"c-once"]
    letters = [orjson.loads(r[3]) for r in dead]
    lines = log.read_text().splitlines()
    assert "truncated request JSON" in letters[0]["reason"]
    assert "bad timestamp" in letters[1]["reason"]
    for letter, bad in zip(letters, (bad_json, bad_stamp), strict=True):
        path, _, line = letter["position"].rpartition(":")
        assert path == str(log) and lines[int(line) - 1] == bad.rstrip("\n")
        assert letter["raw"] == bad.rstrip("\n")
        assert letter["source"] == {"format": "request-log", "cluster": "c-once", "node": 1, "file": str(log)}

    # A second run finds nothing new; finishing entry 30 and adding more ships just those.
    assert main([*argv, str(log)]) == 0
    append(log, in_progress[cut:] + entries(31, 40))
    assert main([*argv, str(log)]) == 0
    values = assert_one_ordered_partition(out.drain(), b"c-once")
    assert [correlation_id(v) for v in values] == list(range(40))
    assert len(reader(dead_topic, 1).drain()) == 2
    state = StateFile(f"{log}.fencewatch-offset").load()
    assert state is not None and state.offset == log.stat().st_size
    assert state.line == len(log.read_text().splitlines())
    err = capsys.readouterr().err
    assert "30 records shipped, 2 dead letters (32 delivered, 0 in flight, 0 failed)" in err
    assert "\n0 records shipped" not in err  # (every summary has the prefix)
    assert ": 0 records shipped" in err and ": 10 records shipped" in err


def unread_entry(i: int, api_key: int, name: str) -> str:
    """Entry ``i`` as a request of an API no rule reads (``api_key``, ``name``)."""
    return (
        entry(i)
        .replace('"requestApiKey": 0,', f'"requestApiKey": {api_key},')
        .replace('"PRODUCE"', f'"{name}"')
    )


def test_only_the_apis_a_rule_reads_are_shipped_unless_all_apis(
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    reader: Callable[[str, int], TopicReader],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = tmp_path / "kafka-request.log"
    parts = []
    for i in range(12):
        parts.append(entry(i))
        if i % 3 == 0:
            parts.append(unread_entry(i, 12, "HEARTBEAT"))
        if i % 4 == 0:
            parts.append(unread_entry(i, 3, "METADATA"))
    parts.append(unread_entry(12, 18, "API_VERSIONS"))
    append(log, "".join(parts) + entry(13))  # the last entry is shipped once the log moves past it
    append(log, other_line(14))

    read_topic, all_topic = make_topic(1), make_topic(1)
    argv = ["ship", "request-log", "--once", "--from-beginning"]
    assert main([*argv, *ship_args(broker, read_topic, "c-read", "--node", "1"), str(log)]) == 0
    values = assert_one_ordered_partition(reader(read_topic, 1).drain(), b"c-read")
    assert [correlation_id(v) for v in values] == [*range(12), 13]
    assert {orjson.loads(v)["body"]["requestHeader"]["requestApiKeyName"] for v in values} == {"PRODUCE"}
    err = capsys.readouterr().err
    assert "fencewatch ship: 13 records shipped, 0 dead letters (13 delivered" in err
    assert err.rstrip().endswith(
        "; left out, no rule reads their API: 8 entries (HEARTBEAT=4, METADATA=3, API_VERSIONS=1)"
    ), err

    state = str(tmp_path / "all-apis.state")
    extra = ["--node", "1", "--all-apis", "--state-file", state]
    assert main([*argv, *ship_args(broker, all_topic, "c-all", *extra), str(log)]) == 0
    values = assert_one_ordered_partition(reader(all_topic, 1).drain(), b"c-all")
    names = [orjson.loads(v)["body"]["requestHeader"]["requestApiKeyName"] for v in values]
    assert len(names) == 21 and names.count("HEARTBEAT") == 4 and names.count("API_VERSIONS") == 1
    err = capsys.readouterr().err
    assert "21 records shipped" in err and "left out" not in err


def test_dead_letters_without_a_topic_go_to_stderr(
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    reader: Callable[[str, int], TopicReader],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = make_topic(1)
    log = tmp_path / "r.log"
    append(log, entry(0) + "[2026-11-20 10:20:00,000] DEBUG Completed request:[1] (kafka.request.logger)\n")
    argv = ["ship", "request-log", *ship_args(broker, topic, "c-err", "--node", "2")]
    assert main([*argv, "--once", "--from-beginning", str(log)]) == 0
    err_lines = capsys.readouterr().err.splitlines()
    letters = [json.loads(line) for line in err_lines if line.startswith("{")]
    assert len(letters) == 1
    assert letters[0]["position"] == f"{log}:2"
    assert letters[0]["reason"] == "request body must be a JSON object, got list"
    assert len(reader(topic, 1).drain()) == 1


# -- ship request-log, following -------------------------------------------------------


class Shipper:
    """``fencewatch ship ...`` in a child process (so it can be signalled)."""

    def __init__(self, argv: list[str], log_dir: Path) -> None:
        self.argv, self.log_dir, self.runs = argv, log_dir, 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.runs += 1
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        with open(self.log_dir / f"shipper-{self.runs}.stderr", "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fencewatch", *self.argv],
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
            )

    def stderr(self) -> str:
        return "".join((self.log_dir / f"shipper-{n}.stderr").read_text() for n in range(1, self.runs + 1))

    def wait_for_stderr(self, text: str) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        while text not in self.stderr():
            assert time.monotonic() < deadline, f"{text!r} not on stderr:\n{self.stderr()}"
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        assert self.proc.poll() is None, f"shipper died early:\n{self.stderr()}"
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=WAIT_SECONDS)
        self.proc = None
        return code

    def kill_if_running(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=WAIT_SECONDS)


def wait_until(condition: Callable[[], bool], what: str, timeout_seconds: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_follow_survives_rotation_copytruncate_and_restarts(
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    reader: Callable[[str, int], TopicReader],
    tmp_path: Path,
) -> None:
    topic = make_topic(3)
    log = tmp_path / "kafka-request.log"
    state_path = tmp_path / "state"
    state_path.mkdir()
    argv = ["ship", "request-log", *ship_args(broker, topic, "c-follow", "--node", "3")]
    argv += ["--poll-interval", "0.05", "--state-file", str(state_path), str(log)]
    shipper = Shipper(argv, tmp_path)
    out = reader(topic, 3)
    try:
        append(log, entries(0, 50))
        shipper.argv = [*argv[:-1], "--from-beginning", argv[-1]]
        shipper.start()
        shipper.argv = argv
        out.wait_for(50, why="(first batch)")

        # A line written in two parts is shipped once its newline arrives.
        append(log, entries(50, 99))
        half = entry(99)
        append(log, half[:70])
        out.wait_for(99, why="(before the partial line)")
        append(log, half[70:])
        out.wait_for(100, why="(partial line completed)")

        # Rename rotation; the old file still gets a last write before the new one appears.
        os.rename(log, tmp_path / "kafka-request.log.1")
        append(tmp_path / "kafka-request.log.1", entries(100, 110))
        append(log, entries(110, 150))
        out.wait_for(150, why="(rename rotation)")

        # copytruncate: copy away, truncate in place, and the writer carries on from 0.
        shutil.copy(log, tmp_path / "kafka-request.log.2")
        with open(log, "r+b") as f:
            f.truncate(0)
            f.write(entries(150, 200).encode())
        out.wait_for(200, why="(copytruncate)")

        # Clean stop; the file grows and is rotated while nobody watches; restart.
        assert shipper.stop() == 0
        append(log, entries(200, 220))
        os.rename(log, tmp_path / "kafka-request.log.3")
        append(log, entries(220, 240))
        shipper.start()
        out.wait_for(240, why="(restart after rotation while stopped)")

        # Once the state file confirms the whole file, even SIGKILL repeats nothing.
        state = StateFile(str(state_path / "kafka-request.log.fencewatch-offset"))

        def all_confirmed() -> bool:
            pos = state.load()
            st = log.stat()
            return pos is not None and (pos.ino, pos.offset) == (st.st_ino, st.st_size)

        wait_until(all_confirmed, "the state file to confirm the whole log")
        assert shipper.stop(signal.SIGKILL) == -signal.SIGKILL
        append(log, entries(240, 260))
        shipper.start()
        out.wait_for(260, why="(restart after SIGKILL)")
        assert shipper.stop() == 0
    finally:
        shipper.kill_if_running()

    values = assert_one_ordered_partition(out.drain(), b"c-follow")
    ids = [correlation_id(v) for v in values]
    assert ids == list(range(260)), f"lost {sorted(set(range(260)) - set(ids))}, stderr:\n{shipper.stderr()}"
    err = shipper.stderr()
    assert "was truncated" in err
    assert "was rotated while stopped; finishing" in err


# -- delivery failures, secrets ---------------------------------------------------------


# -- docker-compose.yml's request-log sidecar --------------------------------------------

# Logs request bodies (arguments) through log4j2 the way Kafka's RequestChannel does:
# DEBUG "Completed request:{json}" on kafka.request.logger; plus lines that must stay out.
LOG_REQUESTS_JAVA = """
import org.apache.logging.log4j.LogManager;
import org.apache.logging.log4j.Logger;

public class LogRequests {
    public static void main(String[] bodies) {
        Logger requests = LogManager.getLogger("kafka.request.logger");
        LogManager.getLogger("kafka.server.KafkaApis").info("a broker line, not a request");
        for (String body : bodies) {
            requests.debug("Completed request:" + body);
        }
        requests.trace("below the request logger's level");
        LogManager.shutdown();
    }
}
"""


def compose_services() -> dict[str, Any]:
    return yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text(encoding="utf-8"))["services"]


def write_request_log_with_composes_log4j2(directory: Path, bodies: list[str], work: Path) -> Path:
    """Kafka's side of the compose stack without Kafka: the log4j2 configuration the
    kafka service mounts, with ``directory`` in place of its request-log volume, loaded
    by the log4j2 in the pyspark wheel (Kafka 4.x logs through log4j2 too)."""
    import pyspark

    kafka = compose_services()["kafka"]
    source = next(v.split(":")[0] for v in kafka["volumes"] if v.startswith("./dashboards/kafka/"))
    config = yaml.safe_load((REPO_ROOT / source).read_text(encoding="utf-8"))
    properties = config["Configuration"]["Properties"]["Property"]
    (log_dir,) = [p for p in properties if p["name"] == "requestLogDir"]
    assert f"kafka-request-log:{log_dir['value']}" in kafka["volumes"]
    log_dir["value"] = str(directory)
    (work / "log4j2.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    (work / "LogRequests.java").write_text(LOG_REQUESTS_JAVA, encoding="utf-8")
    jars = Path(pyspark.__file__).parent / "jars"
    names = ("log4j-api-", "log4j-core-", "jackson-core-", "jackson-databind-", "jackson-annotations-")
    names += ("jackson-dataformat-yaml-", "snakeyaml-2")
    classpath = [str(j) for j in sorted(jars.glob("*.jar")) if j.name.startswith(names)]
    java = shutil.which("java")
    assert java, "java is not installed (NOTES.md: Java 17 is on the machine)"
    config_option = f"-Dlog4j2.configurationFile=file:{work / 'log4j2.yaml'}"
    subprocess.run(
        [java, "-cp", os.pathsep.join(classpath), config_option, str(work / "LogRequests.java"), *bodies],
        check=True,
        timeout=120,
        capture_output=True,
    )
    return directory / "kafka-request.log"


def test_the_compose_request_log_sidecar_ships_what_kafkas_log4j2_config_writes(
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    reader: Callable[[str, int], TopicReader],
    tmp_path: Path,
) -> None:
    """docker-compose.yml's ship-request-log command, with the broker, the topics, the
    request log and the state file of this test in place of the compose ones, ships
    every request line the kafka service's log4j2 configuration writes, as node 1."""
    volume = tmp_path / "kafka-request-log"
    volume.mkdir()
    bodies = [entry(i).split("Completed request:", 1)[1].rsplit(" (kafka.", 1)[0] for i in range(5)]
    log = write_request_log_with_composes_log4j2(volume, bodies, tmp_path)
    lines = log.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 5 and all(" DEBUG Completed request:{" in line for line in lines), lines

    services = compose_services()
    command = services["ship-request-log"]["command"]
    topic, dead_topic = make_topic(3), make_topic(1)
    swap = {
        "kafka:9092": broker.bootstrap_servers,
        "fencewatch-events": topic,
        "fencewatch-dead-letters": dead_topic,
        "/var/lib/fencewatch/ship/request-log.offset": str(tmp_path / "state"),
        "/var/log/kafka/kafka-request.log": str(log),
    }
    argv = [swap.get(word, word) for word in command[1:]]
    assert set(swap.values()) <= set(argv)
    shipper = Shipper([*argv[:-1], "--once", argv[-1]], tmp_path)
    shipper.start()
    assert shipper.proc is not None
    assert shipper.proc.wait(timeout=60) == 0, shipper.stderr()
    values = assert_one_ordered_partition(reader(topic, 3).drain(), b"compose-kafka")
    assert [correlation_id(v) for v in values] == list(range(5))
    assert {(e["cluster"], e["node"], e["kind"]) for e in map(orjson.loads, values)} == {
        ("compose-kafka", 1, "request")
    }
    assert reader(dead_topic, 1).drain() == []
    state = StateFile(str(tmp_path / "state")).load()
    assert state is not None and state.offset == log.stat().st_size


def test_undeliverable_records_fail_the_run_and_keep_the_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "r.log"
    append(log, other_line(1) + entries(0, 3))
    monkeypatch.setenv("FENCEWATCH_KAFKA_SASL_PASSWORD", "hunter2-secret")
    argv = ["ship", "request-log", "--bootstrap-servers", f"127.0.0.1:{free_port()}", "--topic", "t"]
    argv += ["--cluster", "c", "--node", "1", "--once", "--from-beginning", "--status-interval", "0"]
    argv += [
        "--kafka-config",
        "message.timeout.ms=1000",
        "--kafka-config",
        "security.protocol=SASL_PLAINTEXT",
    ]
    argv += ["--kafka-config", "sasl.mechanism=PLAIN", "--kafka-config", "sasl.username=u"]

    assert main([*argv, str(log)]) == 1

    err = capsys.readouterr().err
    assert "delivery to topic 't' failed" in err and "timed out" in err
    assert "3 record(s) failed" in err
    assert "hunter2-secret" not in err
    # Only the other logger's first line is behind the saved position: a rerun ships all 3.
    state = StateFile(f"{log}.fencewatch-offset").load()
    assert state is None or state.offset <= len(other_line(1))


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["ship", "request-log", "--bootstrap-servers", "127.0.0.1:1", "--cluster", "c", "--node", "1"]
    assert main([*base, "--topic", "t", "--kafka-config", "novalue", str(tmp_path / "x")]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main([*base, "--topic", "t", "--once", str(tmp_path / "missing.log")]) == 1
    assert "cannot open" in capsys.readouterr().err
    (tmp_path / "a.log").write_text("")
    (tmp_path / "a.log.fencewatch-offset").write_text("{not json")
    assert main([*base, "--topic", "t", "--once", str(tmp_path / "a.log")]) == 1
    assert "is not JSON" in capsys.readouterr().err


# -- ship metadata-dump ---------------------------------------------------------------------


def test_ship_metadata_dump(
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    reader: Callable[[str, int], TopicReader],
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = make_topic(3)
    dump = DATA / "metadata.dump"
    argv = ["ship", "metadata-dump", *ship_args(broker, topic, "c-meta", "--node", "3000"), str(dump)]

    assert main(argv) == 0

    values = assert_one_ordered_partition(reader(topic, 3).drain(), b"c-meta")
    with open(dump, "rb") as f:
        expected = [
            dumps(item.to_dict()).encode()
            for item in iter_metadata_dump(f, source="x", cluster="c-meta", node=3000)
            if not hasattr(item, "reason")
        ]
    # The snapshot's KRaftVoters (no offset), 12 metadata records and one LeaderChange.
    assert values == expected and len(values) == 14
    offsets = [orjson.loads(v)["offset"] for v in values]
    assert offsets[0] is None and offsets[1:] == sorted(offsets[1:])
    assert "14 records shipped, 0 dead letters (14 delivered)" in capsys.readouterr().err


# -- ship remote-log-metadata ----------------------------------------------------------------


def test_ship_remote_log_metadata_follows_a_pipe(
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    reader: Callable[[str, int], TopicReader],
) -> None:
    """``kafka-console-consumer.sh ... | fencewatch ship remote-log-metadata -``: records are
    published while the consumer still runs, and the run ends cleanly when it does."""
    topic = make_topic(3)
    lines = (DATA / "native" / "remote-log-metadata.txt").read_bytes().splitlines(keepends=True)
    expected = [
        dumps(item.to_dict()).encode()
        for item in iter_remote_log_metadata(lines, source="x", cluster="c-rlmm")
        if not hasattr(item, "reason")
    ]
    first = [line for line in lines[:4] if line.strip()]
    argv = ["ship", "remote-log-metadata", *ship_args(broker, topic, "c-rlmm"), "-"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencewatch", *argv],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    assert proc.stdin is not None
    proc.stdin.write(b"".join(lines[:4]))
    proc.stdin.flush()
    topic_reader = reader(topic, 3)
    got: list[Any] = []  # drain() answers everything read from the topic so far
    deadline = time.monotonic() + 60
    while len(got) < len(first) and time.monotonic() < deadline:
        got = topic_reader.drain()
    assert len(got) == len(first), "the lines written so far were not shipped while the pipe stayed open"
    assert proc.poll() is None
    _, err = proc.communicate(b"".join(lines[4:]), timeout=60)  # the rest, then end of input
    assert proc.returncode == 0, err.decode()
    assert assert_one_ordered_partition(topic_reader.drain(), b"c-rlmm") == expected
    assert f"{len(expected)} records shipped" in err.decode()


# -- simulate --bootstrap-servers -------------------------------------------------------------


def test_simulate_publishes_every_event_in_order_and_writes_the_truth(
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    reader: Callable[[str, int], TopicReader],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = make_topic(3)
    truth = tmp_path / "truth.jsonl"
    # 100 simulated events/s: the 10 s warm-up is over after ~1000 events, then faults.
    sim_args = ["--seed", "7", "--events", "3000", "--events-per-second", "100", "--fault-rate", "0.05"]
    argv = ["simulate", *sim_args, "--bootstrap-servers", broker.bootstrap_servers, "--topic", topic]
    argv += ["--rate", "5000", "--truth", str(truth)]

    assert main(argv) == 0

    sim = Simulator(config_from(build_parser().parse_args(["simulate", *sim_args])))
    expected = [orjson.dumps(env, option=orjson.OPT_SORT_KEYS) for env in sim.events(3000)]
    values = assert_one_ordered_partition(reader(topic, 3).drain(), b"sim-1")
    assert values == expected
    assert sim.truth, "the run should have injected faults"
    assert truth.read_bytes() == b"".join(orjson.dumps(r) + b"\n" for r in sim.truth)
    err = capsys.readouterr().err
    assert f"published {len(expected)} events ({len(expected)} delivered, 0 failed)" in err


def test_simulate_output_and_topic_are_exclusive(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["simulate", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t", "-o", str(tmp_path / "x")]
    assert main(argv) == 2
    assert "--output" in capsys.readouterr().err
    assert main(["simulate", "--bootstrap-servers", "127.0.0.1:1", "--events", "5"]) == 2


# -- the follower alone (no broker; scripted file changes on each sleep) --------------------


class Script:
    """A fake clock and a sleep that performs the next file change on each call,
    and stops the follower once the script is done."""

    def __init__(self, steps: list[Callable[[], None]]) -> None:
        self.steps = deque(steps)
        self.now = 0.0
        self.follower: FileFollower | None = None

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.steps:
            self.steps.popleft()()
        elif self.follower is not None:
            self.follower.stop()


def follow(follower: FileFollower) -> Iterator[tuple[str, bytes]]:
    """(file name, line) for every line handed out until the follower stops."""
    try:
        for segment in follower.segments():
            for line in segment.lines():
                yield os.path.basename(segment.path), line
    except StopFollowing:
        return


def test_follower_partial_lines_rotation_and_truncation(tmp_path: Path) -> None:
    log = tmp_path / "f.log"
    append(log, b"one\ntw")

    def rotate() -> None:
        os.rename(log, tmp_path / "f.log.1")
        append(tmp_path / "f.log.1", b"four\n")
        append(log, b"five\nsix")  # the new file

    def truncate() -> None:
        with open(log, "r+b") as f:
            f.truncate(0)
            f.write(b"SEVEN-and-longer-than-before\n")

    steps: list[Callable[[], None]] = [
        lambda: append(log, b"o\nthree"),  # completes "two", leaves "three" partial
        lambda: append(log, b"\n"),
        rotate,
        lambda: None,  # the rotated file must stay quiet for two polls
        lambda: None,
        lambda: append(log, b"\n"),
        truncate,
        lambda: append(log, b"eight"),  # partial: never handed out before the stop
    ]
    script = Script(steps)
    follower = FileFollower(
        str(log), from_beginning=True, poll_interval_seconds=1.0, clock=script.clock, sleep=script.sleep
    )
    script.follower = follower
    got = list(follow(follower))
    assert got == [
        ("f.log", b"one\n"),
        ("f.log", b"two\n"),
        ("f.log", b"three\n"),
        ("f.log", b"four\n"),
        ("f.log", b"five\n"),
        ("f.log", b"six\n"),
        ("f.log", b"SEVEN-and-longer-than-before\n"),
    ]


def test_follower_starts_at_the_end_and_resumes_in_a_rotated_file(tmp_path: Path) -> None:
    log = tmp_path / "f.log"
    append(log, b"old-1\nold-2\npart")
    script = Script([lambda: append(log, b"ial\nnew\n")])
    follower = FileFollower(str(log), poll_interval_seconds=1.0, clock=script.clock, sleep=script.sleep)
    script.follower = follower
    segments = follower.segments()
    segment = next(segments)
    lines = segment.lines()
    assert next(lines) == b"partial\n"  # started after the last complete line
    assert next(lines) == b"new\n"
    position = segment.position_after(2)
    assert (position.offset, position.line) == (log.stat().st_size, 4)
    segment.close()

    # While stopped: one more line, then rotation. The resume finishes the old file first.
    append(log, b"after\n")
    os.rename(log, tmp_path / "f.log.1")
    append(log, b"fresh\n")
    resumed = FileFollower(str(log), start=position, once=True, sleep=lambda s: None)
    assert list(follow(resumed)) == [("f.log.1", b"after\n"), ("f.log", b"fresh\n")]


def test_state_file_round_trip_and_errors(tmp_path: Path) -> None:
    log = tmp_path / "f.log"
    append(log, b"a\nb\n")
    follower = FileFollower(str(log), from_beginning=True, once=True, sleep=lambda s: None)
    segment = next(follower.segments())
    lines = segment.lines()
    assert [next(lines), next(lines)] == [b"a\n", b"b\n"]
    state = StateFile(str(tmp_path / "state.json"))
    state.save(segment.position_after(2))
    loaded = state.load()
    assert loaded is not None and loaded == segment.position_after(2)
    segment.close()
    (tmp_path / "bad.json").write_text(json.dumps({"version": 1, "offset": -1}))
    with pytest.raises(ValueError, match="must be a string"):
        StateFile(str(tmp_path / "bad.json")).load()
    data: dict[str, Any] = {**loaded.to_dict(), "offset": -1}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="'offset' must be a non-negative integer"):
        StateFile(str(tmp_path / "bad.json")).load()
