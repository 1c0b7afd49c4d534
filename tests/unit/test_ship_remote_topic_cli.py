"""``fencewatch ship remote-log-metadata``'s two sources on the command line:
formatter output files, or the watched cluster's topic (``--from-topic``).
Each wrong combination is one line and exit 2 before anything is read; a
state file that is not this shipper's is one line and exit 1. The topic
path itself runs against Apache Kafka in
tests/integration/test_remote_log_metadata_topic.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

KAFKA = ("--bootstrap-servers", "127.0.0.1:9", "--topic", "events", "--cluster", "c")


def ship(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencewatch", "ship", "remote-log-metadata", *KAFKA, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give formatter output FILEs, or --from-topic"),
        (("--from-topic",), "--from-topic needs --source-bootstrap-servers"),
        (
            ("--from-topic", "--source-bootstrap-servers", "127.0.0.1:9", "x.txt"),
            "--from-topic reads the topic",
        ),
        (("--once", "x.txt"), "--once only apply with --from-topic"),
        (("--state-file", "s", "x.txt"), "--state-file only apply with --from-topic"),
        (
            ("--from-topic", "--source-bootstrap-servers", "127.0.0.1:9", "--source-kafka-config", "nokey"),
            "--source-kafka-config expects KEY=VALUE",
        ),
    ],
)
def test_a_wrong_combination_of_sources_is_one_line_and_exit_2(args, message, tmp_path: Path):
    done = ship(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_a_state_file_of_another_shipper_is_refused_before_reading(tmp_path: Path):
    state = tmp_path / "state"
    state.write_text(
        '{"format": "metadata-log", "directory": "/x", "next_offset": 0, "segment": null, "byte": 0}\n'
    )
    done = ship(
        *("--from-topic", "--source-bootstrap-servers", "127.0.0.1:9", "--state-file", str(state), "--once"),
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert "is not a __remote_log_metadata position" in done.stderr
    assert "move it away to start over" in done.stderr
