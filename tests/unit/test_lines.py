"""Bounded line reading (detectors/lines.py) and envelope JSONL read through it
(detectors/sources.py ``read_envelopes``): a line over the record size limit
is a ``too_large`` dead letter, and only its start is ever kept."""

from __future__ import annotations

import io
import os
import threading

import orjson
import pytest

from detectors.envelope import DeadLetter, DeadLetterClass, Envelope
from detectors.lines import (
    DEFAULT_MAX_RECORD_BYTES,
    EXCERPT_BYTES,
    LongLine,
    over_limit,
    read_lines,
    within_limit,
)
from detectors.sources import read_envelopes

ENVELOPE = orjson.dumps({"cluster": "c", "node": 1, "ts_ms": 5, "kind": "request", "body": {}}) + b"\n"


def lines_of(data: bytes, limit: int) -> list[bytes | LongLine]:
    return list(read_lines(io.BytesIO(data), limit))


def test_lines_within_the_limit_come_out_unchanged():
    data = b"abcd\n" + b"wxyz\r\n" + b"\n" + b"last"
    assert lines_of(data, 4) == [b"abcd\n", b"wxyz\r\n", b"\n", b"last"]


def test_a_line_over_the_limit_keeps_only_its_start_and_what_follows_is_intact():
    long = b"x" * 10_000
    got = lines_of(b"before\n" + long + b"\nafter\n", 100)
    assert got[0] == b"before\n" and got[2] == b"after\n"
    cut = got[1]
    assert isinstance(cut, LongLine)
    assert cut.head == long[: len(cut.head)] and 100 < len(cut.head) <= EXCERPT_BYTES
    assert cut.limit == 100
    assert cut.size is None  # handed out as soon as the limit was passed, before its end


def test_one_byte_over_is_over_and_a_line_ending_just_past_the_read_has_its_size():
    assert lines_of(b"12345\n", 5) == [b"12345\n"]
    (cut,) = lines_of(b"123456\n", 5)
    assert isinstance(cut, LongLine) and cut.size == 6 and cut.head == b"123456"
    (unterminated,) = lines_of(b"123456", 5)
    assert isinstance(unterminated, LongLine) and unterminated.size == 6


def test_an_endless_line_from_a_pipe_is_handed_out_before_it_ends():
    """The LongLine arrives while the writer is still writing: nothing waits for
    the end of a line that may never come."""
    read_fd, write_fd = os.pipe()
    handed_out = threading.Event()

    def write() -> None:
        with open(write_fd, "wb") as w:
            while not handed_out.is_set():
                w.write(b"\0" * 65536)
                w.flush()
            w.write(b"\nnext line\n")

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    with open(read_fd, "rb") as r:
        lines = read_lines(r, 1000)
        first = next(lines)
        handed_out.set()
        rest = list(lines)
    writer.join(timeout=30)
    assert isinstance(first, LongLine) and first.size is None
    assert set(first.head) == {0} and 1000 < len(first.head) <= EXCERPT_BYTES
    assert rest == [b"next line\n"]


def test_bytes_read_are_all_reported_including_the_skipped_ones():
    data = b"short\n" + b"y" * 300_000 + b"\n" + b"tail\n"
    counted: list[int] = []
    list(read_lines(io.BytesIO(data), 50, counted.append))
    assert sum(counted) == len(data)


def test_lines_in_memory_get_the_same_verdict():
    assert over_limit(b"12345\r\n", 5) is None
    cut = over_limit("\u00e9" * 7, 5)
    assert isinstance(cut, LongLine) and cut.size == 7 and cut.head == ("\u00e9" * 7).encode()
    assert within_limit(b"ok\n", 5) == (b"ok\n", None)
    line, long = within_limit(b"too long\n", 5)
    assert line == "" and isinstance(long, LongLine) and long.size == 8


def test_the_limit_must_be_positive():
    with pytest.raises(ValueError, match="at least 1 byte"):
        next(read_lines(io.BytesIO(b"x\n"), 0))


def test_read_envelopes_turns_an_over_long_line_into_a_dead_letter_and_goes_on():
    huge = b'{"cluster":"c","pad":"' + b"p" * 5000 + b'"}\n'
    counted: list[int] = []
    items = list(read_envelopes(io.BytesIO(ENVELOPE + huge + ENVELOPE), "in.jsonl", counted.append, 1000))

    assert [type(i) for i in items] == [Envelope, DeadLetter, Envelope]
    letter = items[1]
    assert isinstance(letter, DeadLetter)
    assert letter.kind == DeadLetterClass.TOO_LARGE and letter.position == "in.jsonl:2"
    assert "line 2 is longer than the record size limit of 1000 bytes" in letter.reason
    assert "--max-record-bytes" in letter.reason and "FENCEWATCH_MAX_RECORD_BYTES" in letter.reason
    assert huge.decode().startswith(letter.raw) and 1000 < len(letter.raw) <= EXCERPT_BYTES
    assert [i.position for i in items if isinstance(i, Envelope)] == ["in.jsonl:1", "in.jsonl:3"]
    assert sum(counted) == len(ENVELOPE) * 2 + len(huge)


def test_read_envelopes_default_limit_reads_big_records():
    big = orjson.dumps(
        {"cluster": "c", "node": 1, "ts_ms": 5, "kind": "request", "body": {"pad": "p" * 1_000_000}}
    )
    assert len(big) < DEFAULT_MAX_RECORD_BYTES
    (item,) = read_envelopes(io.BytesIO(big + b"\n"), "in.jsonl")
    assert isinstance(item, Envelope) and len(item.body["pad"]) == 1_000_000
