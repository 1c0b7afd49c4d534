"""Failures a user can cause end ``fencewatch run`` and ``fencewatch simulate``
in ONE line on stderr that names the cause and the next step, exit code 1,
without librdkafka's repeated connection errors or Spark's output: a dead
broker, TLS or SASL settings the listener does not speak, an invalid client
setting, a missing topic, a busy metrics port, Java options the JVM refuses,
and a broker that dies under a running job. A publisher says once that no broker answers."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from spark_cluster import child_env, fencewatch_run, wait_until

from fencewatch.spark_console import LOG_NAME
from producers.kafka_publisher import DeliveryError, KafkaPublisher
from streaming.broker import EmbeddedBroker, free_port

pytestmark = pytest.mark.integration

# librdkafka says how long a refused connect took ("after 0ms", "after 1ms" on a
# loaded machine); the tests pin every other word of the line.
CONNECT_TIME = re.compile(r"\(after \d+ms in state ")


def any_connect_time(line: str) -> str:
    """``line`` with librdkafka's connect time written as ``Nms``."""
    return CONNECT_TIME.sub("(after Nms in state ", line)


TRANSPORT_TODO = (
    "-- check --bootstrap-servers and that the brokers are up; with TLS or SASL, that "
    "security.protocol (--kafka-config) matches the broker's listener"
)


def fencewatch(argv: list[str], cwd: Path, timeout_s: float = 120) -> tuple[int, list[str]]:
    """Run ``python -m fencewatch ARGV``; its exit code and its non-empty stderr lines."""
    done = subprocess.run(
        [sys.executable, "-m", "fencewatch", *argv],
        cwd=cwd,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    return done.returncode, [line for line in done.stderr.splitlines() if line.strip()]


def run_argv(bootstrap: str, topic: str, checkpoint: Path, *extra: str) -> list[str]:
    return [
        *("run", "--bootstrap-servers", bootstrap, "--topic", topic, "--checkpoint", str(checkpoint)),
        *("--master", "local[1]", "--metrics-port", "-1", *extra),
    ]


@pytest.mark.timeout(120)
def test_run_against_a_dead_port_says_so_in_one_line(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    code, lines = fencewatch(run_argv(dead, "t", tmp_path / "ck"), tmp_path)
    assert code == 1
    assert [any_connect_time(line) for line in lines] == [
        f"fencewatch run: cannot reach Kafka at {dead}: Connect to ipv4#{dead} failed: Connection refused "
        f"(after Nms in state CONNECT) {TRANSPORT_TODO}"
    ]
    assert not (tmp_path / "ck" / LOG_NAME).exists(), "Spark must not start"


@pytest.mark.timeout(120)
def test_run_speaking_tls_to_a_plaintext_listener_says_so_in_one_line(
    broker: EmbeddedBroker, make_topic, tmp_path: Path
) -> None:
    topic = make_topic(1)
    argv = run_argv(
        broker.bootstrap_servers, topic, tmp_path / "ck", "--kafka-config", "security.protocol=SSL"
    )
    code, lines = fencewatch(argv, tmp_path)
    assert code == 1
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"fencewatch run: TLS with Kafka at {broker.bootstrap_servers} failed: Connection setup timed out "
        "in state SSL_HANDSHAKE"
    )
    assert lines[0].endswith(
        "-- check that security.protocol (--kafka-config) matches the broker's listener (SSL or PLAINTEXT) "
        "and that ssl.ca.location names its CA"
    )


@pytest.mark.timeout(120)
def test_run_with_sasl_the_broker_refuses_says_so_in_one_line(
    broker: EmbeddedBroker, make_topic, tmp_path: Path
) -> None:
    topic = make_topic(1)
    sasl = ["security.protocol=SASL_PLAINTEXT", "sasl.mechanism=PLAIN", "sasl.username=u", "sasl.password=p"]
    argv = run_argv(broker.bootstrap_servers, topic, tmp_path / "ck")
    for pair in sasl:
        argv += ["--kafka-config", pair]
    code, lines = fencewatch(argv, tmp_path)
    assert code == 1
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"fencewatch run: Kafka at {broker.bootstrap_servers} refused the client: SASL PLAIN mechanism "
        "handshake failed"
    )
    assert lines[0].endswith(
        "-- check sasl.mechanism and sasl.username (--kafka-config) and the password (sasl.password, or "
        "env FENCEWATCH_KAFKA_SASL_PASSWORD)"
    )
    assert "=p" not in lines[0] and " p " not in lines[0], "the password must not be printed"


@pytest.mark.timeout(120)
def test_run_with_an_invalid_client_setting_says_so_in_one_line(
    broker: EmbeddedBroker, make_topic, tmp_path: Path
) -> None:
    argv = run_argv(broker.bootstrap_servers, make_topic(1), tmp_path / "ck")
    argv += ["--kafka-config", "security.protocol=SASL_PLAINTEXT", "--kafka-config", "sasl.mechanism=FOO"]
    code, lines = fencewatch(argv, tmp_path)
    assert code == 1
    assert lines == [
        "fencewatch run: invalid Kafka client setting: Failed to create admin client: Unsupported SASL "
        "mechanism: FOO -- fix --kafka-config (librdkafka's setting names: "
        "https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md)"
    ]


@pytest.mark.timeout(120)
def test_run_on_a_missing_topic_says_so_and_does_not_create_it(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    topic = f"missing-{tmp_path.name}"
    bootstrap = broker.bootstrap_servers
    code, lines = fencewatch(run_argv(bootstrap, topic, tmp_path / "ck"), tmp_path)
    assert code == 1
    assert lines == [
        f"fencewatch run: topic {topic} does not exist on {bootstrap} -- create it (kafka-topics.sh "
        f"--bootstrap-server {bootstrap} --create --topic {topic}) or check --topic"
    ]
    listed = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    assert topic not in listed, "checking for the topic must not create it"


@pytest.mark.timeout(120)
def test_run_with_its_metrics_port_taken_says_so_in_one_line(
    broker: EmbeddedBroker, make_topic, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = run_argv(broker.bootstrap_servers, make_topic(1), tmp_path / "ck")
        argv[argv.index("--metrics-port") + 1] = str(port)
        code, lines = fencewatch([*argv, "--metrics-bind", "127.0.0.1"], tmp_path)
    assert code == 1
    assert lines == [
        f"fencewatch run: cannot serve metrics on 127.0.0.1:{port}: Address already in use -- choose "
        "another --metrics-port (0: any free port), or -1 to turn metrics off"
    ]


@pytest.mark.timeout(120)
def test_run_with_java_options_the_jvm_refuses_says_so_in_one_line(
    broker: EmbeddedBroker, make_topic, tmp_path: Path
) -> None:
    argv = run_argv(broker.bootstrap_servers, make_topic(1), tmp_path / "ck", "--jvm-options=-Xss1x")
    code, lines = fencewatch(argv, tmp_path)
    assert code == 1
    log = tmp_path / "ck" / LOG_NAME
    assert lines == [
        "fencewatch run: Spark did not start (JAVA_GATEWAY_EXITED) -- check that Java 17 or 21 is "
        "installed (java -version), that JAVA_HOME points to it, and that the JVM takes the Java "
        f"options given (--jvm-options); details in {log}"
    ]
    assert "Invalid thread stack size: -Xss1x" in log.read_text(), "the JVM's own words are in the log"


@pytest.mark.timeout(120)
def test_simulate_to_a_dead_broker_fails_in_one_line_and_writes_no_truth(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    code, lines = fencewatch(
        ["simulate", "--bootstrap-servers", dead, "--topic", "t", "--events", "100"], tmp_path
    )
    assert code == 1
    assert [any_connect_time(line) for line in lines] == [
        f"fencewatch simulate: cannot reach Kafka at {dead}: Connect to ipv4#{dead} failed: Connection "
        f"refused (after Nms in state CONNECT) {TRANSPORT_TODO}"
    ]
    assert list(tmp_path.iterdir()) == [], "no truth file (nor anything else) may be left behind"


@pytest.mark.timeout(600)
def test_a_broker_lost_under_a_running_job_ends_it_in_one_line(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ck"
    with EmbeddedBroker() as own:
        own.create_topics({"events": 1})
        bootstrap = own.bootstrap_servers
        job = fencewatch_run(run_argv(bootstrap, "events", checkpoint, "--quiet")[1:], tmp_path / "run.log")
        try:
            job.start()
            wait_until(lambda: "Ctrl-C stops" in job.log_text(), "the job's query", 300, alive=[job])
            own.stop()
            assert job.proc is not None
            wait_until(lambda: not job.alive(), "the job to stop", 120)
            assert job.proc.returncode == 1
        finally:
            job.kill()
    spark_log = checkpoint / LOG_NAME
    lines = [line for line in job.log_text().splitlines() if line.strip()]
    # Spark's start-up went to its log file: every line is fencewatch's own.
    assert lines[0] == (
        f"fencewatch run: reading events on {bootstrap}, checkpoint {checkpoint}; "
        f"Spark's log: {spark_log}; Ctrl-C stops"
    )
    assert len(lines) == 2, lines
    assert lines[1].startswith(
        "fencewatch run: the streaming job stopped: cannot read the offsets of topic events from Kafka at "
        f"{bootstrap}: "
    )
    assert lines[1].endswith(
        "-- check that the brokers are up and reachable from the Spark driver, and the client settings "
        "(--kafka-config); started again with the same checkpoint, the job resumes where it stopped; "
        f"details in {spark_log}"
    )
    kept = spark_log.read_text(errors="replace")
    assert "streaming.kafka_source.KafkaSourceError" in kept and "at org.apache.spark" in kept


@pytest.mark.timeout(60)
def test_a_publisher_reports_a_dead_broker_once_and_names_it_when_flushing() -> None:
    dead = f"127.0.0.1:{free_port()}"
    said: list[str] = []
    publisher = KafkaPublisher(dead, "t", on_failure=said.append)
    for n in range(10):
        publisher.publish({"cluster": "c", "node": 1, "ts_ms": n, "kind": "request", "body": {}})
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # librdkafka retries the connection meanwhile, many times
        publisher.poll(0.2)
    refused = f"Connect to ipv4#{dead} failed: Connection refused (after Nms in state CONNECT)"
    assert [any_connect_time(line) for line in said] == [
        f"cannot reach Kafka at {dead}: {refused}; records wait in the client's queue while it retries"
    ]
    with pytest.raises(DeliveryError) as failed:
        publisher.flush(1)
    assert (
        any_connect_time(str(failed.value))
        == f"10 record(s) still undelivered after 1s (Kafka at {dead}: {refused})"
    )
