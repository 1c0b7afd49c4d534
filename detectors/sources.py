"""Envelope JSONL files merged by ``ts_ms`` (stable: ties keep file order, then
line order), with every unusable line turned into a dead letter."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from detectors.envelope import DeadLetter, Envelope, parse_envelope


def read_envelopes(
    stream: BinaryIO, source: str, on_bytes: Callable[[int], None] | None = None
) -> Iterator[Envelope | DeadLetter]:
    """Every line of one JSONL stream, in file order. Blank lines are skipped."""
    for line_no, raw in enumerate(stream, start=1):
        if on_bytes is not None:
            on_bytes(len(raw))
        line = raw.strip()
        if not line:
            continue
        yield parse_envelope(line, f"{source}:{line_no}", line_no)


def _keyed(
    items: Iterable[Envelope | DeadLetter], file_index: int
) -> Iterator[tuple[int, int, int, Envelope | DeadLetter]]:
    last_ts = -1
    for n, item in enumerate(items):
        if isinstance(item, Envelope):
            last_ts = item.ts_ms
        # A dead letter has no trustworthy time: report it where it stood in its file.
        yield last_ts, file_index, n, item


def merge_by_time(streams: Sequence[Iterable[Envelope | DeadLetter]]) -> Iterator[Envelope | DeadLetter]:
    """Merge per-file streams by ``ts_ms``. Files that are themselves out of
    order merge as they are; the detector tolerates disorder up to its
    ``lateness_ms``."""
    if len(streams) == 1:
        yield from streams[0]  # nothing to merge: one file is read in its own order
        return
    keyed = [_keyed(s, i) for i, s in enumerate(streams)]
    for _, _, _, item in heapq.merge(*keyed, key=lambda t: (t[0], t[1], t[2])):
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
