"""``fencewatch run`` refuses, in one line, what would break exactly-once
delivery: a checkpoint another job is using, and a compacted alerts topic.
Nothing else reaches its console: Spark's output goes to its log file."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from spark_cluster import ChildProcess, fencewatch_run, wait_until

from fencewatch.spark_console import LOG_NAME
from streaming.broker import EmbeddedBroker
from streaming.checkpoint_lock import LOCK_FILE

pytestmark = pytest.mark.integration

STARTED = "Ctrl-C stops"  # fencewatch run's line once its query runs


def job_argv(broker: EmbeddedBroker, source: str, alerts: str, dead: str, checkpoint: Path) -> list[str]:
    return [
        *("--bootstrap-servers", broker.bootstrap_servers, "--topic", source),
        *("--checkpoint", str(checkpoint), "--alerts-topic", alerts, "--dead-letter-topic", dead),
        *("--master", "local[1]", "--quiet", "--trigger-seconds", "1"),
    ]


def lines(child: ChildProcess) -> list[str]:
    return [line for line in child.log_text().splitlines() if line.strip()]


def exit_code(child: ChildProcess, timeout_s: float) -> int:
    assert child.proc is not None
    wait_until(lambda: not child.alive(), "the refused job to exit", timeout_s)
    return child.proc.returncode


@pytest.mark.extended  # tests/unit/test_checkpoint_lock.py checks the lock with real processes
@pytest.mark.timeout(600)
def test_a_second_job_on_a_checkpoint_in_use_is_refused_until_the_first_dies(
    broker: EmbeddedBroker, make_topic, tmp_path: Path
) -> None:
    source, alerts, dead = make_topic(1), make_topic(1), make_topic(1)
    checkpoint = tmp_path / "ck"
    argv = job_argv(broker, source, alerts, dead, checkpoint)
    first = fencewatch_run(argv, tmp_path / "first.log")
    second = fencewatch_run(argv, tmp_path / "second.log")
    third = fencewatch_run(argv, tmp_path / "third.log")
    try:
        first.start()
        wait_until(lambda: STARTED in first.log_text(), "the first job's query", 300, alive=[first])

        second.start()
        assert exit_code(second, 120) == 1
        assert lines(second) == [
            f"fencewatch run: checkpoint {checkpoint} is in use by another fencewatch job "
            f"(pid {first.pid}) -- stop that job first, or give this one another --checkpoint"
        ]
        assert first.alive(), "the refused job must leave the running one alone"

        first_pid = first.pid
        first.kill()  # SIGKILL: no chance to clean up
        assert (checkpoint / LOCK_FILE).read_text() == f"{first_pid}\n"
        third.start()
        wait_until(lambda: STARTED in third.log_text(), "the third job's query", 300, alive=[third])
        assert (checkpoint / LOCK_FILE).read_text() == f"{third.pid}\n"
        assert third.stop() == 130, third.log_tail()
        # Quiet from start to Ctrl-C: Spark's output is in its log, and the stop prints no py4j traceback.
        assert [line.split()[:3] for line in lines(third)] == [
            ["fencewatch", "run:", "metrics"],
            ["fencewatch", "run:", "reading"],
        ]
    finally:
        for child in (first, second, third):
            child.kill()


@pytest.mark.timeout(300)
def test_a_compacted_alerts_topic_is_refused(broker: EmbeddedBroker, make_topic, tmp_path: Path) -> None:
    source, dead = make_topic(1), make_topic(1)
    alerts = f"{source}-alerts-compacted"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(alerts, 1, 1, config={"cleanup.policy": "compact"})])[alerts].result(30)
    job = fencewatch_run(job_argv(broker, source, alerts, dead, tmp_path / "ck"), tmp_path / "run.log")
    try:
        job.start()
        assert exit_code(job, 240) == 1, job.log_tail()
        # Spark started (the check needs its session) but said nothing: its output is in its log.
        assert (tmp_path / "ck" / LOG_NAME).stat().st_size > 0
        metrics, *refusal = lines(job)
        assert metrics.startswith("fencewatch run: metrics on http://0.0.0.0:")
        assert refusal == [
            f"fencewatch run: topic {alerts} has cleanup.policy=compact, but fencewatch keys alerts and "
            "dead letters by cluster, so compaction would keep only each cluster's newest one -- set "
            f"cleanup.policy=delete (kafka-configs.sh --alter --entity-type topics --entity-name {alerts} "
            "--add-config cleanup.policy=delete) or choose another topic"
        ]
    finally:
        job.kill()
