"""The file follower (producers/tail.py) with lines over its limit: each is
handed out as a LongLine once it ends, positions stay exact, and memory stays
near the limit however long the line is."""

from __future__ import annotations

import contextlib
import tracemalloc
from pathlib import Path

from detectors.lines import EXCERPT_BYTES, LongLine
from producers.tail import FileFollower, Segment, StopFollowing


def read_all(follower: FileFollower) -> tuple[list[bytes | LongLine], Segment]:
    segment = next(follower.segments())
    got: list[bytes | LongLine] = []
    with contextlib.suppress(StopFollowing):  # the end of the data, or stop()
        got.extend(segment.lines())
    return got, segment


def test_an_over_long_line_becomes_a_long_line_with_its_size_and_the_positions_stay_exact(tmp_path: Path):
    log = tmp_path / "r.log"
    log.write_bytes(b"one\n" + b"x" * 10_000 + b"\r\n" + b"two\n")
    follower = FileFollower(str(log), from_beginning=True, once=True, max_line_bytes=100)

    got, segment = read_all(follower)

    assert got[0] == b"one\n" and got[2] == b"two\n"
    long = got[1]
    assert isinstance(long, LongLine)
    assert (long.size, long.limit, long.head) == (10_000, 100, b"x" * EXCERPT_BYTES)
    assert segment.position_after(2).offset == 4 + 10_002
    assert segment.position_after(3).offset == log.stat().st_size
    segment.close()


def test_a_line_growing_while_followed_is_dropped_as_it_comes_and_handed_out_when_it_ends(tmp_path: Path):
    log = tmp_path / "r.log"
    log.write_bytes(b"start\n")
    pieces = [b"z" * 70_000] * 5 + [b"\nafter\n"]

    def grow(seconds: float) -> None:
        """The follower's sleep: the next piece is written while it waits; once
        everything is written and read, the next wait stops it."""
        if not pieces:
            follower.stop()
            return
        with open(log, "ab") as f:
            f.write(pieces.pop(0))

    follower = FileFollower(
        str(log), from_beginning=True, poll_interval_seconds=0.01, sleep=grow, max_line_bytes=1000
    )
    got, segment = read_all(follower)

    assert got[0] == b"start\n"
    assert isinstance(got[1], LongLine) and got[1].size == 350_000
    assert got[2] == b"after\n"
    segment.close()


def test_a_huge_line_costs_memory_near_the_limit_not_its_size(tmp_path: Path):
    log = tmp_path / "r.log"
    with open(log, "wb") as f:
        for _ in range(64):
            f.write(b"\0" * (1 << 20))
        f.write(b"\nend\n")
    follower = FileFollower(str(log), from_beginning=True, once=True, max_line_bytes=1 << 20)

    tracemalloc.start()
    try:
        got, segment = read_all(follower)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    segment.close()

    assert isinstance(got[0], LongLine) and got[0].size == 64 << 20
    assert got[1] == b"end\n"
    assert peak_bytes < 4 << 20, f"peak {peak_bytes} bytes for a 64 MiB line with a 1 MiB limit"
