"""``fencewatch run`` killed with SIGKILL mid-stream and restarted on the same
checkpoint: the alerts topic ends up with exactly the alerts of an
uninterrupted run (``fencewatch replay`` of the same events), each once."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
from spark_cluster import fencewatch_run, keep_running, wait_until
from test_job import RUN_DEFAULTS, publish, read_topic, replay_alerts

from detectors.truth import match_key
from producers.simulator import SimConfig, Simulator
from streaming.broker import EmbeddedBroker
from streaming.bucket_layout import DEFAULT_BUCKETS

pytestmark = pytest.mark.integration

EVENTS = 12_000
# After the last alert, how long the restarted job keeps running so that a late
# duplicate or extra alert would reach the topic before it is read.
SETTLE_S = 6.0


def job_argv(broker: EmbeddedBroker, source: str, alerts: str, dead: str, checkpoint: Path) -> list[str]:
    return [
        *("--bootstrap-servers", broker.bootstrap_servers, "--topic", source),
        *("--checkpoint", str(checkpoint), "--alerts-topic", alerts, "--dead-letter-topic", dead),
        *("--master", "local[2]", "--quiet", "--trigger-seconds", "0.5"),
        *("--max-events-per-trigger", "3000", "--idle-flush-ms", "2000"),
    ]


def alert_ids(broker: EmbeddedBroker, topic: str) -> list[str]:
    """``fencewatch-id`` of every record in ``topic``, duplicates kept."""
    return [headers["fencewatch-id"] for headers, _ in read_topic(broker, topic)]


def committed_batches(checkpoint: Path) -> list[int]:
    commits = checkpoint / "commits"
    return sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit()) if commits.exists() else []


def rewind(checkpoint: Path, batch: int) -> None:
    """Leave ``checkpoint`` as a crash after ``batch``'s sink delivered, before its commit-log
    entry, would: no commit for ``batch`` or later, no offsets planned after it."""
    for kind, first in (("commits", batch), ("offsets", batch + 1)):
        for path in (checkpoint / kind).iterdir():
            number = path.name.removeprefix(".").removesuffix(".crc")
            if number.isdigit() and int(number) >= first:
                path.unlink()


@pytest.mark.timeout(600)
def test_sigkill_and_restart_deliver_each_alert_exactly_once(
    broker: EmbeddedBroker, make_topic, tmp_path: Path
) -> None:
    events = list(Simulator(SimConfig(seed=11, fault_rate=0.01, warmup_ms=3000)).events(EVENTS))
    expected = replay_alerts(events, RUN_DEFAULTS, DEFAULT_BUCKETS)
    assert len(expected) >= 20, "the simulation should raise alerts spread over several micro-batches"
    source, alerts_topic, dead_topic = make_topic(3), make_topic(1), make_topic(1)
    publish(broker, source, [(e["cluster"].encode(), orjson.dumps(e)) for e in events])
    checkpoint = tmp_path / "ck"
    argv = job_argv(broker, source, alerts_topic, dead_topic, checkpoint)
    first, second = fencewatch_run(argv, tmp_path / "run-1.log"), fencewatch_run(argv, tmp_path / "run-2.log")
    try:
        started = time.monotonic()
        first.start()
        # Kill as soon as the first alerts are in the topic: 3000 events per trigger make
        # 4 micro-batches with data, and the faults start after the simulation's 3 s warm-up,
        # so most alerts are still to come.
        wait_until(lambda: len(alert_ids(broker, alerts_topic)) > 0, "the first alert", 300, alive=[first])
        first.kill()
        killed_at, killed_wall = time.monotonic() - started, time.time()
        before = read_topic(broker, alerts_topic)
        ids_before = {h["fencewatch-id"] for h, _ in before}
        last = max(int(h["fencewatch-batch"]) for h, _ in before)
        commits = committed_batches(checkpoint)
        print(
            f"\nkilled {killed_at:.1f}s after the start with {len(ids_before)}/{len(expected)} alerts "
            f"delivered, the last by batch {last}; committed batches: {commits}"
        )
        assert len(ids_before) < len(expected), (
            "every alert was out before the kill: the crash came too late to test a restart"
        )
        if last in commits:
            # The kill missed the short window between the sink's delivery and Spark's
            # commit-log entry: put the checkpoint where a kill in that window leaves it,
            # so the restart re-runs a batch whose alerts are already in the topic.
            rewind(checkpoint, last)
            print(f"rewound the checkpoint to before batch {last}'s commit")

        second.start()
        # The buckets share their clocks through the event topic (detectors.clock_exchange),
        # so the alerts to expect are known once the topic is: wait for every violation
        # the split caught without sharing, and compare exactly below.
        caught = {match_key(a) for a in expected.values()}
        wait_until(
            lambda: {match_key(orjson.loads(v)) for _, v in read_topic(broker, alerts_topic)} >= caught,
            "every expected alert after the restart",
            300,
            alive=[second],
        )
        print(f"every alert delivered {time.monotonic() - started:.1f}s after the first start")
        rerun = checkpoint / "commits" / str(last)
        assert rerun.stat().st_mtime > killed_wall, f"the restart did not re-run batch {last}"
        keep_running(second, SETTLE_S)
        code = second.stop()
        print(f"the restarted job exited with {code} after SIGINT")
        assert code in (0, 130), f"the restarted job stopped with {code}:\n{second.log_tail()}"
    finally:
        first.kill()
        second.kill()

    # What the same split raises on the topic as the job left it, read in its order:
    # the clock evidence records both runs published (a re-run batch's twice) included.
    expected = replay_alerts(
        [orjson.loads(v) for _, v in read_topic(broker, source)], RUN_DEFAULTS, DEFAULT_BUCKETS
    )
    ids = alert_ids(broker, alerts_topic)
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    assert not duplicates, f"alerts delivered twice: {duplicates}"
    assert set(ids) == set(expected), (
        f"missing {sorted(set(expected) - set(ids))}, extra {sorted(set(ids) - set(expected))}"
    )
    streamed = [orjson.loads(v) for _, v in read_topic(broker, alerts_topic)]
    assert sorted(match_key(a) for a in streamed) == sorted(match_key(a) for a in expected.values())
    assert read_topic(broker, dead_topic) == []
