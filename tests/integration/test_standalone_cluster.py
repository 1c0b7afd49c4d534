"""``fencewatch run --master spark://...`` on a real standalone cluster (a master
and a worker from the pyspark wheel): the detector runs in the worker's
executor and raises the same alerts as ``fencewatch replay``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from spark_cluster import StandaloneCluster, fencewatch_run, keep_running, wait_until
from test_job import RUN_DEFAULTS, publish, read_topic, replay_alerts

from detectors.truth import match_key
from producers.simulator import SimConfig, Simulator
from streaming.broker import EmbeddedBroker
from streaming.bucket_layout import DEFAULT_BUCKETS

# Extended: test_job checks the same parity in local mode, on a tier CI can afford.
pytestmark = [pytest.mark.integration, pytest.mark.extended]

JVM_OPTIONS = "-XX:TieredStopAtLevel=1"  # one of --jvm-options' uses (docs/operations.md)


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A master and one 2-core worker on free ports; both sessions killed afterwards."""
    with StandaloneCluster(tmp_path_factory.mktemp("spark-standalone")) as cluster:
        yield cluster


@pytest.mark.timeout(600)
def test_job_on_standalone_cluster_alerts_equal_replay(
    standalone_cluster: StandaloneCluster, broker: EmbeddedBroker, make_topic, tmp_path: Path
) -> None:
    events = list(Simulator(SimConfig(seed=13, fault_rate=0.01, warmup_ms=3000)).events(10_000))
    expected = replay_alerts(events, RUN_DEFAULTS, DEFAULT_BUCKETS)
    assert expected
    source, alerts_topic, dead_topic = make_topic(3), make_topic(1), make_topic(1)
    publish(broker, source, [(e["cluster"].encode(), orjson.dumps(e)) for e in events])
    job = fencewatch_run(
        [
            *("--bootstrap-servers", broker.bootstrap_servers, "--topic", source),
            *("--checkpoint", str(tmp_path / "ck"), "--master", standalone_cluster.url),
            *("--alerts-topic", alerts_topic, "--dead-letter-topic", dead_topic, "--quiet"),
            *("--trigger-seconds", "0.5", "--max-events-per-trigger", "5000", "--idle-flush-ms", "2000"),
            f"--jvm-options={JVM_OPTIONS}",
        ],
        tmp_path / "run.log",
    )
    master, worker = standalone_cluster.master, standalone_cluster.worker
    assert master is not None and worker is not None
    started = time.monotonic()
    try:
        job.start()
        try:
            wait_until(
                lambda: len(read_topic(broker, alerts_topic)) >= len(expected),
                "every expected alert",
                400,
                alive=[job, master, worker],
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nexecutors:\n{standalone_cluster.executor_logs()[-6000:]}") from exc
        print(f"\nevery alert delivered {time.monotonic() - started:.1f}s after the start")
        # A few more micro-batches (idle flush included) so a late extra or duplicate alert would show.
        keep_running(job, 5)
        code = job.stop()
        assert code in (0, 130), f"the job stopped with {code}:\n{job.log_tail()}"
    finally:
        job.kill()

    # The work ran on the cluster, not in a local driver.
    assert "Registering app fencewatch" in master.log_text(), master.log_tail()
    assert "Asked to launch executor" in worker.log_text(), worker.log_tail()
    # Its executors run with the job's Java options (ExecutorRunner logs each launch).
    launches = [line for line in worker.log_text().splitlines() if "Launch command:" in line]
    assert launches and all(f'"{JVM_OPTIONS}"' in line for line in launches), launches

    delivered = read_topic(broker, alerts_topic)
    ids = [headers["fencewatch-id"] for headers, _ in delivered]
    assert len(ids) == len(set(ids)), "an alert was delivered twice"
    assert set(ids) == set(expected)
    streamed = [orjson.loads(value) for _, value in delivered]
    assert sorted(match_key(a) for a in streamed) == sorted(match_key(a) for a in expected.values())
    assert read_topic(broker, dead_topic) == []
