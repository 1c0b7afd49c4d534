"""fencewatch through a SASL_SSL listener of Apache Kafka itself, as deployed:
TLS with a certificate signed by a CA the test makes, SCRAM-SHA-512 users
created when the cluster's storage is formatted (localkafka.secure).

The clean path: simulated events published through the listener by
``fencewatch simulate``, judged by ``fencewatch run`` reading them and
writing its alerts through it (replay's alerts of the same events, and no
alert that is not an injected fault); every ``fencewatch ship`` format
publishing through it, Kafka's own files among its inputs; ``fencewatch
probe`` asking the brokers through it.

The failures: wrong credentials, a CA the brokers' certificates were not
signed by, and a plaintext client on the listener each end ``run``,
``simulate``, ``probe`` and ``ship`` (request-log and metadata-log; every
format goes through the same check) in ONE line naming the cause and what to
do, exit code 1. The cluster (one controller, three brokers: the
listener is the brokers') is started once for this module's tests.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from spark_cluster import child_env, fencewatch_run, wait_until

from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import envelope_from_obj
from detectors.truth import confusion, load_truth, match_key
from localkafka.cluster import LocalKafkaCluster
from localkafka.fetch import fetch_kafka
from localkafka.secure import MECHANISM, SecureListener, make_certificates

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[1] / "data"
USER, PASSWORD = "fencewatch", "fencewatch-" + uuid.uuid4().hex[:12]
PASSWORD_ENV = "FENCEWATCH_KAFKA_SASL_PASSWORD"
# librdkafka says how long a refused connection took; every other word is pinned.
AFTER = re.compile(r"\(after \d+ms in state ")


@dataclass(frozen=True)
class SecureCluster:
    cluster: LocalKafkaCluster
    listener: SecureListener
    stranger_ca: Path  # a CA of its own: the brokers' certificates are not signed by it

    @property
    def bootstrap(self) -> str:
        return self.cluster.secure_bootstrap_servers

    def client_config(self, ca: Path | None = None, protocol: str = "SASL_SSL") -> list[str]:
        """``--kafka-config`` arguments as a user passes them; the password comes from the environment."""
        pairs = [
            f"security.protocol={protocol}",
            f"sasl.mechanism={MECHANISM}",
            f"sasl.username={USER}",
            f"ssl.ca.location={ca or self.listener.certificates.ca}",
        ]
        return [arg for pair in pairs for arg in ("--kafka-config", pair)]

    def wait_until_answering(self, timeout_seconds: float = 180) -> None:
        """Until every broker's listener answers a client with the users' credentials: a cold
        broker's first TLS handshakes can take longer than the commands' start-up check allows
        on a loaded machine (its JVM loads and compiles the TLS and SCRAM code then)."""
        settings: dict[str, str | int] = {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": MECHANISM,
            "sasl.username": USER,
            "sasl.password": PASSWORD,
            "ssl.ca.location": str(self.listener.certificates.ca),
            "log_level": 0,
        }
        # One client per broker: its first answer comes from the broker it bootstraps from.
        waiting = {
            address: AdminClient({**settings, "bootstrap.servers": address})
            for address in self.bootstrap.split(",")
        }
        deadline = time.monotonic() + timeout_seconds
        while waiting:
            for address, admin in list(waiting.items()):
                try:
                    admin.list_topics(timeout=10)
                    del waiting[address]
                except KafkaException:
                    pass
            assert time.monotonic() < deadline, f"{sorted(waiting)} did not answer within {timeout_seconds} s"

    def create_topics(self, *names: str, partitions: int = 1) -> None:
        """Created by an operator's admin client on the PLAINTEXT listener."""
        admin = AdminClient({"bootstrap.servers": self.cluster.bootstrap_servers})
        for future in admin.create_topics([NewTopic(n, partitions, 3) for n in names]).values():
            future.result(60)

    def read(self, topic: str) -> list[tuple[bytes, bytes]]:
        """Every record of ``topic`` as (key, value), read on the PLAINTEXT listener."""
        consumer = Consumer(
            {
                "bootstrap.servers": self.cluster.bootstrap_servers,
                "group.id": f"read-{uuid.uuid4().hex[:6]}",
                "enable.partition.eof": True,
            }
        )
        try:
            partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
            consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
            remaining, out = set(partitions), []
            while remaining:
                msg = consumer.poll(30)
                assert msg is not None, f"timed out reading {topic}"
                error = msg.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    remaining.discard(msg.partition())
                    continue
                out.append((msg.key() or b"", msg.value() or b""))
            return out
        finally:
            consumer.close()


@pytest.fixture(scope="session")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    root = tmp_path_factory.mktemp("secure-kafka")
    listener = SecureListener.make(root / "tls", {USER: PASSWORD})
    stranger = make_certificates(root / "stranger-tls", common_name="a stranger's CA").ca
    cluster = LocalKafkaCluster(
        fetch_kafka(),
        root / "nodes",
        controllers=1,
        heap="320m",
        tiered_storage=False,
        secure_listener=listener,
    )
    try:
        cluster.start()
        secure = SecureCluster(cluster, listener, stranger)
        secure.wait_until_answering()
        yield secure
    finally:
        cluster.stop()


def replayed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The alerts ``fencewatch replay`` raises on ``events``, clocks measured as ``run`` measures them."""
    detector = Detector(DetectorConfig(measure_clocks=True))
    for i, event in enumerate(events):
        detector.ingest(envelope_from_obj(event, f"mem:{i}", i))
    detector.flush()
    return [alert.to_dict() for alert in detector.drain()]


def fencewatch(argv: list[str], cwd: Path, password: str = PASSWORD) -> tuple[int, str, list[str]]:
    """``python -m fencewatch ARGV`` with the SASL password in the environment:
    its exit code, stdout and non-empty stderr lines."""
    done = subprocess.run(
        [sys.executable, "-m", "fencewatch", *argv],
        cwd=cwd,
        env=child_env(**{PASSWORD_ENV: password}),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return done.returncode, done.stdout, [line for line in done.stderr.splitlines() if line.strip()]


def commands(secure: SecureCluster, topic: str, work: Path) -> dict[str, list[str]]:
    """Every command that connects, by its name in messages, its inputs Kafka's
    own files where it reads files (the request log of broker 1, the
    controller's metadata log directory and quorum-state)."""
    controller = secure.cluster.controllers[0]
    work.mkdir(parents=True, exist_ok=True)

    def ship(fmt: str, *args: str) -> list[str]:
        return ["ship", fmt, "--bootstrap-servers", secure.bootstrap, "--topic", topic, *args]

    return {
        "fencewatch run": [
            *("run", "--bootstrap-servers", secure.bootstrap, "--topic", topic),
            *("--checkpoint", str(work / "checkpoint"), "--master", "local[1]", "--metrics-port", "-1"),
        ],
        "fencewatch ship request-log": ship(
            "request-log",
            *("--cluster", "secure-requests", "--node", "1", "--once", "--from-beginning"),
            # Every entry: broker 1 may lead no partition yet, and serve no request a rule reads.
            "--all-apis",
            *("--state-file", str(work / "request-log.offset"), str(secure.cluster.brokers[0].request_log)),
        ),
        "fencewatch ship quorum-state": ship(
            "quorum-state",
            *("--cluster", "secure-quorum", "--node", str(controller.node_id), "--once"),
            str(controller.metadata_dir),
        ),
        "fencewatch ship metadata-log": ship(
            "metadata-log",
            *("--cluster", "secure-metadata", "--node", str(controller.node_id), "--once"),
            *("--state-file", str(work / "metadata-log.offset"), str(controller.metadata_dir)),
        ),
        "fencewatch ship metadata-dump": ship(
            "metadata-dump", "--cluster", "secure-dump", str(DATA / "metadata.dump")
        ),
        "fencewatch ship remote-log-metadata": ship(
            "remote-log-metadata",
            *("--cluster", "secure-remote", str(DATA / "native" / "remote-log-metadata.txt")),
        ),
        "fencewatch simulate": [
            *("simulate", "--events", "10", "--bootstrap-servers", secure.bootstrap, "--topic", topic),
            *("--truth", str(work / "truth.jsonl")),
        ],
        "fencewatch probe": [
            *("probe", "--bootstrap-servers", secure.bootstrap, "--once", "--timeout-seconds", "3"),
            *("--topics", re.escape(topic), "--cluster", "secure"),
        ],
    }


# Every ship format opens its publisher through the same start-up check
# (fencewatch.shipping.open_publisher); the clean path runs each of them, the
# refusals the two that follow a node's files.
CLEAN_PATH_ONLY = (
    "fencewatch ship quorum-state",
    "fencewatch ship metadata-dump",
    "fencewatch ship remote-log-metadata",
)


def refusable(argvs: dict[str, list[str]]) -> dict[str, list[str]]:
    """The commands a refusal is checked on: all but CLEAN_PATH_ONLY."""
    return {name: argv for name, argv in argvs.items() if name not in CLEAN_PATH_ONLY}


def run_all(
    argvs: dict[str, list[str]], extra: list[str], cwd: Path, password: str = PASSWORD
) -> dict[str, tuple[int, str, list[str]]]:
    """Each command with ``extra`` arguments, side by side (they wait on the network, not the CPU)."""

    def one(argv: list[str]) -> tuple[int, str, list[str]]:
        return fencewatch([*argv, *extra], cwd, password)

    with ThreadPoolExecutor(len(argvs)) as pool:
        return dict(zip(argvs, pool.map(one, argvs.values()), strict=True))


@pytest.mark.timeout(900)
def test_events_shipped_judged_and_probed_through_sasl_ssl(secure_cluster: SecureCluster, tmp_path: Path):
    secure = secure_cluster
    events, alerts, dead, shipped = (
        f"{name}-{uuid.uuid4().hex[:6]}" for name in ("events", "alerts", "dead", "shipped")
    )
    secure.create_topics(events, alerts, dead, shipped)
    truth_file = tmp_path / "truth.jsonl"
    simulate = ["simulate", "--seed", "7", "--events", "3000", "--fault-rate", "0.02"]
    simulate += [
        "--events-per-second",
        "200",
        "--bootstrap-servers",
        secure.bootstrap,
        "--topic",
        events,
        "--truth",
        str(truth_file),
    ]
    code, _, lines = fencewatch([*simulate, *secure.client_config()], tmp_path)
    assert code == 0, lines
    truth = load_truth(str(truth_file))
    assert truth, "the simulated history has faults to find"

    job = fencewatch_run(
        [
            *("--bootstrap-servers", secure.bootstrap, "--topic", events),
            *("--checkpoint", str(tmp_path / "ck"), "--alerts-topic", alerts, "--dead-letter-topic", dead),
            *("--master", "local[1]", "--quiet", "--metrics-port", "-1"),
            *("--idle-flush-ms", "2000", "--trigger-seconds", "0.5"),
            # One bucket, so that the job's alerts are one detector's, as replay's below.
            *("--buckets", "1", *secure.client_config()),
        ],
        tmp_path / "run.log",
        child_env(**{PASSWORD_ENV: PASSWORD}),
    )
    try:
        job.start()
        # Meanwhile every shipper publishes through the listener too, and the probe asks through it.
        argvs = commands(secure, shipped, tmp_path / "ship")
        ships = {name: argv for name, argv in argvs.items() if " ship " in name}
        for name, (code, _, lines) in run_all(ships, secure.client_config(), tmp_path).items():
            assert code == 0, f"{name}: {lines}"
        keys = {key for key, _ in secure.read(shipped)}
        assert {f"secure-{k}".encode() for k in ("requests", "quorum", "metadata", "dump", "remote")} <= keys
        probe = commands(secure, events, tmp_path / "probe")["fencewatch probe"]
        code, out, lines = fencewatch([*probe, *secure.client_config()], tmp_path)
        assert code == 0, lines
        assert out == "", "the probe raised alerts against Kafka itself"
        assert "deviations: none" in lines

        # What the job must raise: replay of the events it reads, by one detector as its one bucket.
        expected = replayed([orjson.loads(value) for _, value in secure.read(events)])
        wait_until(lambda: len(secure.read(alerts)) >= len(expected), "the job's alerts", 600, alive=[job])
    finally:
        stopped = job.stop()
    assert stopped in (0, 130), job.log_tail()
    raised = [orjson.loads(value) for _, value in secure.read(alerts)]
    assert sorted(map(match_key, raised)) == sorted(map(match_key, expected))
    table = confusion(raised, truth)
    assert all(row["fp"] == 0 for row in table.values()), table
    # A short history leaves some clocks unmeasured: a few faults are raised as possible, not certain.
    assert sum(row["tp"] for row in table.values()) >= len(truth) // 2, table
    assert secure.read(dead) == [], "no dead letter from the simulator's events"
    assert PASSWORD not in job.log_text()


def one_line(results: dict[str, tuple[int, str, list[str]]]) -> dict[str, str]:
    """Each command's single stderr line (librdkafka's timings as N), having
    checked it exited with 1 after saying exactly one line."""
    out = {}
    for name, (code, _, lines) in results.items():
        assert code == 1 and len(lines) == 1, f"{name}: exit {code}, {lines}"
        assert PASSWORD not in lines[0] and "wrong-password" not in lines[0], "a password was printed"
        out[name] = AFTER.sub("(after Nms in state ", lines[0])
    return out


@pytest.mark.timeout(600)
def test_wrong_credentials_end_every_command_in_one_line(secure_cluster: SecureCluster, tmp_path: Path):
    secure = secure_cluster
    topic = f"refused-{uuid.uuid4().hex[:6]}"
    secure.create_topics(topic)
    argvs = refusable(commands(secure, topic, tmp_path))
    said = one_line(run_all(argvs, secure.client_config(), tmp_path, password="wrong-password"))
    for prog, line in said.items():
        assert line == (
            f"{prog}: Kafka at {secure.bootstrap} refused the client: SASL authentication error: "
            "Authentication failed during authentication due to invalid credentials with SASL mechanism "
            f"{MECHANISM} (after Nms in state AUTH_REQ) -- check sasl.mechanism and sasl.username "
            f"(--kafka-config) and the password (sasl.password, or env {PASSWORD_ENV})"
        )


@pytest.mark.timeout(600)
def test_a_ca_the_brokers_are_not_signed_by_ends_every_command_in_one_line(
    secure_cluster: SecureCluster, tmp_path: Path
):
    secure = secure_cluster
    topic = f"untrusted-{uuid.uuid4().hex[:6]}"
    secure.create_topics(topic)
    argvs = refusable(commands(secure, topic, tmp_path))
    said = one_line(run_all(argvs, secure.client_config(ca=secure.stranger_ca), tmp_path))
    for prog, line in said.items():
        # The middle is OpenSSL's reason in librdkafka's words.
        assert line.startswith(
            f"{prog}: Kafka at {secure.bootstrap} presented a certificate the client does not trust: "
            "SSL handshake failed: "
        ), line
        assert "certificate verify failed" in line
        assert line.endswith(
            "(after Nms in state SSL_HANDSHAKE) -- set ssl.ca.location (--kafka-config) to the CA that "
            "signed the brokers' certificates"
        ), line


@pytest.mark.timeout(600)
def test_a_plaintext_client_on_the_listener_ends_every_command_in_one_line(
    secure_cluster: SecureCluster, tmp_path: Path
):
    secure = secure_cluster
    topic = f"plaintext-{uuid.uuid4().hex[:6]}"
    secure.create_topics(topic)
    argvs = refusable(commands(secure, topic, tmp_path))
    first = secure.bootstrap.split(",")[0]
    expected = (
        "{prog}: Kafka at {bootstrap} speaks TLS ({first} completed a TLS handshake), but the client "
        "connects in plaintext (security.protocol={protocol}) -- set security.protocol=SASL_SSL or SSL, "
        "as the listener expects, and ssl.ca.location to the CA that signed the brokers' certificates "
        "(--kafka-config)"
    )
    # No TLS or SASL setting at all, in every command.
    said = one_line(run_all(argvs, [], tmp_path))
    for prog, line in said.items():
        assert line == expected.format(
            prog=prog, bootstrap=secure.bootstrap, first=first, protocol="PLAINTEXT"
        )
    # SASL without TLS, in run's settings (the same check serves every command).
    run_only = {"fencewatch run": argvs["fencewatch run"]}
    said = one_line(run_all(run_only, secure.client_config(protocol="SASL_PLAINTEXT"), tmp_path))
    assert said == {
        "fencewatch run": expected.format(
            prog="fencewatch run", bootstrap=secure.bootstrap, first=first, protocol="SASL_PLAINTEXT"
        )
    }
