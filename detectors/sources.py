"""Envelope JSONL files read in file order, with every unusable line turned
into a dead letter (``detectors.merge`` merges them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from detectors.envelope import DeadLetter, Envelope, parse_envelope
from detectors.lines import DEFAULT_MAX_RECORD_BYTES, LongLine, read_lines


@dataclass
class EnvelopeLineStats:
    """Counters over envelope JSONL lines: every line is an envelope, a dead
    letter or blank, so ``lines == envelopes + dead_letters + blank_lines``."""

    lines: int = 0
    envelopes: int = 0
    dead_letters: int = 0
    blank_lines: int = 0

    def add(self, other: EnvelopeLineStats) -> None:
        self.lines += other.lines
        self.envelopes += other.envelopes
        self.dead_letters += other.dead_letters
        self.blank_lines += other.blank_lines


def read_envelopes(
    stream: BinaryIO,
    source: str,
    on_bytes: Callable[[int], None] | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    stats: EnvelopeLineStats | None = None,
) -> Iterator[Envelope | DeadLetter]:
    """Every line of one JSONL stream, in file order. Blank lines are skipped; a
    line over ``max_record_bytes`` is a dead letter, and is never held whole.
    stats: counters to update, to read after the generator ends."""
    counts = stats if stats is not None else EnvelopeLineStats()
    for line_no, raw in enumerate(read_lines(stream, max_record_bytes, on_bytes), start=1):
        counts.lines += 1
        if isinstance(raw, LongLine):
            counts.dead_letters += 1
            yield raw.dead_letter(f"{source}:{line_no}", f"line {line_no}")
            continue
        line = raw.strip()
        if not line:
            counts.blank_lines += 1
            continue
        item = parse_envelope(line, f"{source}:{line_no}", line_no)
        if isinstance(item, Envelope):
            counts.envelopes += 1
        else:
            counts.dead_letters += 1
        yield item


def open_inputs(paths: list[str]) -> list[tuple[str, BinaryIO]]:
    """Open every input (``-`` is stdin) in binary mode, so undecodable bytes
    become dead letters rather than crashes. Raises FileNotFoundError with the path."""
    import sys

    opened: list[tuple[str, BinaryIO]] = []
    for path in paths:
        if path == "-":
            opened.append(("<stdin>", sys.stdin.buffer))
        else:
            opened.append((path, Path(path).open("rb")))  # noqa: SIM115 - closed by the caller
    return opened
