"""Memory stays bounded on any input: ``fencewatch replay -`` and ``fencewatch
convert ... -`` fed by a pipe with no line end (text, so that it is read rather
than refused as binary as zeros from /dev/zero are) or a request-log entry that
never ends, at the default record size limit. Each
command runs as a subprocess and must end with the expected dead letter and
summary; its peak RSS is the kernel's high-water mark of its own memory
(``VmHWM``), read until it exits. Not wait4's ``ru_maxrss``: Linux carries the
forking process's high-water mark across exec into it, so under a pytest that
holds a SparkSession every child would report hundreds of MB."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import orjson

from detectors.lines import DEFAULT_MAX_RECORD_BYTES

REPO = Path(__file__).resolve().parents[2]
PEAK_RSS_LIMIT_KIB = 200 * 1024
FEED_BYTES = 96 * 1024 * 1024  # six times the default limit
DEADLINE_SECONDS = 180.0


@dataclass
class Finished:
    exit_code: int
    peak_rss_kib: int
    stdout: bytes
    stderr: str


def endless_line(start: bytes) -> Callable[[], Iterator[bytes]]:
    """A line that starts like a record of one kind and never ends."""

    def feed() -> Iterator[bytes]:
        yield start
        chunk = b"x" * (1 << 20)
        for _ in range(FEED_BYTES >> 20):
            yield chunk

    return feed


def endless_entry() -> Iterator[bytes]:
    """A request-log entry that is never closed: its JSON array goes on line after line."""
    yield b'[2026-11-20 10:15:02,345] DEBUG Completed request:{"requestHeader":{"requestApiKey":0},"pad":[\n'
    line = b'"' + b"x" * 200 + b'",\n'
    block = line * ((1 << 20) // len(line))
    for _ in range(FEED_BYTES // len(block)):
        yield block


def run_fed(argv: list[str], feed: Callable[[], Iterator[bytes]], tmp_path: Path) -> Finished:
    """Run ``python -m fencewatch argv`` with ``feed`` written to its stdin,
    reading its memory's high-water mark while it runs."""
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fencewatch", *argv],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            cwd=REPO,
        )
    assert proc.stdin is not None
    writer = threading.Thread(target=_write_all, args=(proc.stdin, feed), daemon=True)
    writer.start()
    deadline = time.monotonic() + DEADLINE_SECONDS
    peak_kib = 0
    while proc.poll() is None:
        # A high-water mark only rises: the last reading before exit is the peak
        # up to then, and these commands end right after their input does.
        peak_kib = max(peak_kib, _high_water_kib(proc.pid))
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"fencewatch {argv} still running after {DEADLINE_SECONDS} s")
        time.sleep(0.02)
    writer.join(timeout=10)
    assert peak_kib > 0, "no memory reading was taken"
    return Finished(proc.returncode, peak_kib, out_path.read_bytes(), err_path.read_text())


def _high_water_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass  # exited between poll() and the read
    return 0


def _write_all(stdin: IO[bytes], feed: Callable[[], Iterator[bytes]]) -> None:
    try:
        for chunk in feed():
            stdin.write(chunk)
        stdin.close()
    except BrokenPipeError:
        pass  # the command ended first; its exit code and stderr say why


def the_dead_letter(text: str) -> dict[str, str]:
    (letter,) = [orjson.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert len(letter["raw"]) <= 2000
    assert f"record size limit of {DEFAULT_MAX_RECORD_BYTES} bytes" in letter["reason"]
    assert "--max-record-bytes" in letter["reason"]
    return letter


def test_replay_of_a_pipe_with_no_line_end_keeps_its_memory(tmp_path):
    done = run_fed(["replay", "--no-progress", "-"], endless_line(b'{"cluster":"c","pad":"'), tmp_path)

    assert done.exit_code == 1, done.stderr  # no envelope at all
    assert done.stdout == b""
    assert the_dead_letter(done.stderr)["position"] == "<stdin>:1"
    assert "no envelope in <stdin>" in done.stderr
    assert done.peak_rss_kib < PEAK_RSS_LIMIT_KIB, f"peak RSS {done.peak_rss_kib} KiB"


def test_convert_of_a_pipe_with_no_line_end_keeps_its_memory(tmp_path):
    start = b'| offset: 0 CreateTime: 1795168800000 payload: {"pad":"'
    done = run_fed(["convert", "metadata-dump", "-"], endless_line(start), tmp_path)

    assert done.exit_code == 1, done.stderr  # no record at all
    assert done.stdout == b""
    assert the_dead_letter(done.stderr)["position"] == "stdin:1"
    assert "1 lines: 0 records, 1 dead letters" in done.stderr
    assert done.peak_rss_kib < PEAK_RSS_LIMIT_KIB, f"peak RSS {done.peak_rss_kib} KiB"


def test_convert_of_a_request_entry_that_never_ends_keeps_its_memory(tmp_path):
    done = run_fed(["convert", "request-log", "--node", "1", "-"], endless_entry, tmp_path)

    assert done.exit_code == 1, done.stderr  # no record at all
    assert done.stdout == b""
    letter = the_dead_letter(done.stderr)
    assert letter["position"] == "stdin:1" and "request entry of lines 1-" in letter["reason"]
    assert letter["raw"].startswith("[2026-11-20 10:15:02,345] DEBUG Completed request:")
    assert "0 records, 1 dead letters, " in done.stderr and "skipped: 0 other-logger lines" in done.stderr
    assert done.peak_rss_kib < PEAK_RSS_LIMIT_KIB, f"peak RSS {done.peak_rss_kib} KiB"
