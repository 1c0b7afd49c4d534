"""Webhooks from ``fencewatch run`` survive a receiver outage and a job restart:
the receiver is down while the alerts are raised, the job is stopped and
started again on the same checkpoint, the receiver comes back, and every alert
arrives once, signed."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from spark_cluster import child_env, fencewatch_run, keep_running, wait_until
from test_job import RUN_DEFAULTS, publish, read_topic, replay_alerts

from producers.simulator import SimConfig, Simulator
from streaming.broker import EmbeddedBroker, free_port
from streaming.bucket_layout import DEFAULT_BUCKETS
from webhooks.receiver import WebhookReceiver

pytestmark = pytest.mark.integration

SECRET = "integration-test-secret"
SECRET_ENV = "FENCEWATCH_TEST_WEBHOOK_SECRET"


def webhooks_config(path: Path, port: int) -> Path:
    path.write_text(
        f"""
[[endpoint]]
name = "oncall"
url = "http://127.0.0.1:{port}/hook"
format = "json"
secret_env = "{SECRET_ENV}"
backoff_base_seconds = 0.2
backoff_cap_seconds = 1.0
rate_per_second = 200.0
burst = 50
"""
    )
    return path


@pytest.mark.timeout(600)
def test_alerts_raised_while_the_receiver_is_down_arrive_once_after_a_restart(
    broker: EmbeddedBroker, make_topic, tmp_path: Path
) -> None:
    events = list(Simulator(SimConfig(seed=17, fault_rate=0.01, warmup_ms=3000)).events(10_000))
    expected = replay_alerts(events, RUN_DEFAULTS, DEFAULT_BUCKETS)
    assert len(expected) >= 10
    source, alerts_topic, dead_topic = make_topic(3), make_topic(1), make_topic(1)
    publish(broker, source, [(e["cluster"].encode(), orjson.dumps(e)) for e in events])
    port = free_port()
    argv = [
        *("--bootstrap-servers", broker.bootstrap_servers, "--topic", source),
        *("--checkpoint", str(tmp_path / "ck"), "--alerts-topic", alerts_topic),
        *("--dead-letter-topic", dead_topic, "--quiet", "--trigger-seconds", "0.5"),
        *("--idle-flush-ms", "2000", "--webhooks", str(webhooks_config(tmp_path / "hooks.toml", port))),
    ]
    env = child_env(**{SECRET_ENV: SECRET})
    first = fencewatch_run(argv, tmp_path / "run-1.log", env)
    second = fencewatch_run(argv, tmp_path / "run-2.log", env)
    receiver: WebhookReceiver | None = None
    try:
        first.start()
        wait_until(
            lambda: len(read_topic(broker, alerts_topic)) >= len(expected),
            "every alert in the alerts topic",
            400,
            alive=[first],
        )
        keep_running(first, 3)  # retries against the dead endpoint
        first.stop()
        assert "oncall" in first.log_text() and SECRET not in first.log_text()

        second.start()
        keep_running(second, 5)
        receiver = WebhookReceiver(port, secret=SECRET.encode())
        wait_until(
            lambda: len(receiver.received) >= len(expected), "every alert at the receiver", 120, [second]
        )
        keep_running(second, 5)  # a duplicate delivery would arrive now
    finally:
        first.kill()
        second.stop()
        if receiver is not None:
            receiver.stop()

    delivered = [r["body"]["alert_id"] for r in receiver.received]
    assert sorted(delivered) == sorted(expected), "every alert, and only those"
    assert receiver.duplicates == 0, "an alert was posted twice"
    assert receiver.rejected == 0, "a delivery carried a bad signature"
    assert all(r["headers"]["X-Fencewatch-Alert-Id"] == r["body"]["alert_id"] for r in receiver.received)
    # The topic got each alert once as well, across the restart.
    ids = [h["fencewatch-id"] for h, _ in read_topic(broker, alerts_topic)]
    assert sorted(ids) == sorted(expected)
