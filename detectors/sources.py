"""Envelope JSONL files read in file order, with every unusable line turned
into a dead letter (``detectors.merge`` merges them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from detectors.envelope import DeadLetter, Envelope, parse_envelope
from detectors.lines import DEFAULT_MAX_RECORD_BYTES, LongLine, read_lines


def read_envelopes(
    stream: BinaryIO,
    source: str,
    on_bytes: Callable[[int], None] | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Iterator[Envelope | DeadLetter]:
    """Every line of one JSONL stream, in file order. Blank lines are skipped; a
    line over ``max_record_bytes`` is a dead letter, and is never held whole."""
    for line_no, raw in enumerate(read_lines(stream, max_record_bytes, on_bytes), start=1):
        if isinstance(raw, LongLine):
            yield raw.dead_letter(f"{source}:{line_no}", f"line {line_no}")
            continue
        line = raw.strip()
        if not line:
            continue
        yield parse_envelope(line, f"{source}:{line_no}", line_no)


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
