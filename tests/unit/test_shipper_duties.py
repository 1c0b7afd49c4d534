"""The status duties every shipper shares (producers/confirmed_positions.py
``StatusDuties``): a summary line every ``--status-interval``, none with 0,
and reading stopped once delivery has failed; shown on the quorum-state
shipper, which has only these duties."""

from __future__ import annotations

from pathlib import Path

import pytest

from producers.kafka_publisher import PublishStats
from producers.quorum_state_shipper import QuorumStateShipper


class Publisher:
    """What the shipper uses of a KafkaPublisher, with no Kafka."""

    def __init__(self) -> None:
        self.stats = PublishStats()
        self.flushed = False

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> None:
        self.flushed = True


def run(tmp_path: Path, interval: float, *, fail_after: int) -> tuple[list[str], int, Publisher]:
    """Run a shipper over a missing file, each poll one second apart, until
    delivery fails after ``fail_after`` polls; its status lines and polls."""
    publisher = Publisher()
    now = [0.0]
    polls = [0]

    def sleep(seconds: float) -> None:
        polls[0] += 1
        now[0] += 1.0
        if polls[0] == fail_after:
            publisher.stats.failed = 1

    lines: list[str] = []
    shipper = QuorumStateShipper(
        publisher,
        str(tmp_path / "quorum-state"),
        cluster="c",
        node=1,
        status_interval_seconds=interval,
        clock=lambda: now[0],
        sleep=sleep,
        status=lines.append,
    )
    shipper.run()
    return [line for line in lines if not line.startswith("waiting for")], polls[0], publisher


@pytest.mark.parametrize(("interval", "expected_lines"), [(3.0, 3), (0.0, 0)])
def test_a_summary_every_interval_and_a_stop_once_delivery_failed(tmp_path, interval, expected_lines):
    lines, polls, publisher = run(tmp_path, interval, fail_after=10)
    assert polls == 11  # stopped by the first look after the failure, then flushed
    assert publisher.flushed
    assert len(lines) == expected_lines  # at 3, 6 and 9 seconds
    assert all(line.startswith("quorum-state: 0 new state(s) seen") for line in lines)
