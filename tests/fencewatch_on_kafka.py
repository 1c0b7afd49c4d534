"""fencewatch judging a real Kafka cluster's own files as a user would: each
request log through ``fencewatch convert request-log``, the controller's
``__cluster_metadata-0`` through ``convert metadata-log``, all of them through
``fencewatch replay`` (the CLI, in a process of its own). Shared by
tests/integration/test_kafka_bug.py and benchmarks/kafka_bug_repro.py."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from localkafka.fenced_follower import FencedFollowerRun


class KafkaRun(Protocol):
    """A scenario's run: where Kafka's own files are."""

    @property
    def metadata_files(self) -> list[Path]: ...

    @property
    def request_logs(self) -> dict[int, Path]: ...


FENCEWATCH = str(Path(sys.executable).parent / "fencewatch")


@dataclass
class Judged:
    """What ``fencewatch replay`` gave: its alerts and its summary (stderr)."""

    alerts: list[dict[str, Any]]
    summary: str
    dead_letters: int


def judge(run: KafkaRun, workdir: Path, cluster: str = "kafka") -> Judged:
    """Convert the run's files into ``workdir`` and replay them."""
    workdir.mkdir(parents=True, exist_ok=True)
    envelopes = [workdir / "metadata.jsonl"]
    _convert(["metadata-log", "--cluster", cluster, *map(str, run.metadata_files)], envelopes[0])
    for node, log in sorted(run.request_logs.items()):
        out = workdir / f"requests-{node}.jsonl"
        _convert(["request-log", "--cluster", cluster, "--node", str(node), str(log)], out)
        envelopes.append(out)
    dead = workdir / "dead-letters.jsonl"
    proc = subprocess.run(
        [FENCEWATCH, "replay", "--no-progress", "--dead-letter", str(dead), *map(str, envelopes)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"fencewatch replay exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    alerts = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    dead_letters = len(dead.read_text().splitlines()) if dead.exists() else 0
    return Judged(alerts, proc.stderr, dead_letters)


def _convert(args: list[str], out: Path) -> None:
    with open(out, "w") as sink:
        proc = subprocess.run(
            [FENCEWATCH, "convert", *args], stdout=sink, stderr=subprocess.PIPE, text=True, check=False
        )
    if proc.returncode != 0:
        raise RuntimeError(f"fencewatch convert {args[0]} exited {proc.returncode}: {proc.stderr.strip()}")


def alter_partition_lines(run: FencedFollowerRun) -> list[str]:
    """The controller's request-log entries of every AlterPartition it answered, as Kafka wrote them."""
    text = run.controller.request_log.read_text()
    return [line for line in text.splitlines() if '"requestApiKeyName":"ALTER_PARTITION"' in line]


def broker_state_and_isr_records(run: FencedFollowerRun) -> list[str]:
    """The lines of Kafka's own DumpLogSegments output that fence, unfence or
    re-register brokers and that change partitions."""
    wanted = (
        "FENCE_BROKER_RECORD",
        "UNFENCE_BROKER_RECORD",
        "BROKER_REGISTRATION_CHANGE_RECORD",
        "REGISTER_BROKER_RECORD",
        "PARTITION_CHANGE_RECORD",
    )
    return [line for line in run.metadata_dump.splitlines() if any(f'"type":"{w}"' in line for w in wanted)]
