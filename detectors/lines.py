"""Reading native log lines: decoding that reports bad bytes instead of failing,
and reading that holds at most one record's worth of bytes, however long a line
the input has (``cat /dev/zero`` has none at all)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from detectors.envelope import DeadLetter, DeadLetterClass

DEFAULT_MAX_RECORD_BYTES = 16 * 1024 * 1024
MAX_RECORD_BYTES_ENV = "FENCEWATCH_MAX_RECORD_BYTES"
RAISE_LIMIT_HINT = f"raise it with --max-record-bytes or {MAX_RECORD_BYTES_ENV}"
# What a dead letter keeps of a record too large to read: enough to recognise it.
EXCERPT_BYTES = 2000
# The rest of an over-long line is read and dropped in pieces of this size.
_SKIP_CHUNK_BYTES = 1 << 16


def decode_line(raw: bytes | str) -> tuple[str, str | None]:
    """The line without its terminator, and a description of bad UTF-8 if any."""
    if isinstance(raw, str):
        return raw.rstrip("\r\n"), None
    try:
        return raw.decode("utf-8").rstrip("\r\n"), None
    except UnicodeDecodeError as exc:
        problem = f"invalid UTF-8 byte 0x{raw[exc.start]:02x} at column {exc.start + 1}"
        return raw.decode("utf-8", errors="replace").rstrip("\r\n"), problem


def too_large_reason(what: str, limit: int, size: int | None = None) -> str:
    """Why a record was not read: its size when known, the limit, and how to raise it."""
    how_big = f"is {size} bytes, over" if size is not None else "is longer than"
    return f"{what} {how_big} the record size limit of {limit} bytes ({RAISE_LIMIT_HINT})"


@dataclass(frozen=True, slots=True)
class LongLine:
    """A line longer than the limit, of which only the start was kept.

    head: the line's first bytes, at most ``EXCERPT_BYTES`` (fewer when the
        limit is smaller: only what was read before the limit was passed).
    limit: the limit it broke, in bytes.
    size: the line's length in bytes without its terminator, when its end was
        seen before it was handed out (None: it was handed out at once).
    """

    head: bytes
    limit: int
    size: int | None = None

    def text(self) -> str:
        """The kept start, decoded for people (bad bytes replaced)."""
        return self.head.decode("utf-8", errors="replace")

    def dead_letter(self, position: str, what: str) -> DeadLetter:
        reason = f"{too_large_reason(what, self.limit, self.size)}; only its start is kept"
        return DeadLetter(position, reason, self.text(), kind=DeadLetterClass.TOO_LARGE)


def content_length(raw: bytes | str) -> int:
    """A line's length without its ``\\n`` or ``\\r\\n``."""
    last_two = raw[-2:] if isinstance(raw, bytes) else raw[-2:].encode("utf-8", "surrogatepass")
    if last_two == b"\r\n":
        return len(raw) - 2
    return len(raw) - 1 if last_two.endswith(b"\n") else len(raw)


class BinaryLines(Protocol):
    """A binary stream read line by line, a line at most ``size`` bytes at a time."""

    def readline(self, size: int, /) -> bytes: ...


def over_limit(raw: bytes | str, limit: int) -> LongLine | None:
    """``raw`` as a :class:`LongLine` if it is longer than ``limit``, else None."""
    size = content_length(raw)
    if size <= limit:
        return None
    head = raw[: min(size, EXCERPT_BYTES)]
    if isinstance(head, str):
        head = head.encode("utf-8", "surrogatepass")[:EXCERPT_BYTES]
    return LongLine(head, limit, size)


def within_limit(raw: bytes | str | LongLine, limit: int) -> tuple[bytes | str, LongLine | None]:
    """``(raw, None)`` for a line within ``limit``, ``("", long line)`` for one that
    is not. Lines already in memory (a list, a test) get the same verdict as
    lines read through :func:`read_lines`."""
    long = raw if isinstance(raw, LongLine) else over_limit(raw, limit)
    if long is not None or isinstance(raw, LongLine):
        return "", long
    return raw, None


def read_lines(
    stream: BinaryLines, limit: int, on_bytes: Callable[[int], None] | None = None
) -> Iterator[bytes | LongLine]:
    """The lines of a binary stream, with their terminators; a line longer than
    ``limit`` bytes is handed out as a :class:`LongLine` as soon as the limit is
    passed, and the rest of it is then read and dropped.

    Never holds more than about ``limit`` bytes, so an endless line (``/dev/zero``)
    costs constant memory. on_bytes: called with every count of bytes read.
    """
    if limit < 1:
        raise ValueError(f"the line limit must be at least 1 byte, got {limit}")
    readline = stream.readline
    while True:
        # Two bytes over the limit hold a line of exactly ``limit`` bytes and its
        # terminator, so a complete line is told from a longer one.
        line = readline(limit + 2)
        if not line:
            return
        if on_bytes is not None:
            on_bytes(len(line))
        size = len(line)
        if size <= limit and line.endswith(b"\n"):
            yield line  # the everyday line: whole and within the limit with its terminator
            continue
        complete = line.endswith(b"\n") or size < limit + 2
        long = over_limit(line, limit) if complete else LongLine(line[:EXCERPT_BYTES], limit)
        if long is None:
            yield line
            continue
        del line  # not kept while the consumer works, nor while the rest is skipped
        yield long
        while not complete:
            rest = readline(_SKIP_CHUNK_BYTES)
            if on_bytes is not None:
                on_bytes(len(rest))
            complete = not rest or rest.endswith(b"\n")


class Peekable(Protocol):
    """A buffered binary stream (a file opened ``rb``, ``sys.stdin.buffer``)."""

    def read1(self, size: int, /) -> bytes: ...

    def fileno(self) -> int: ...


class _Replayed(io.RawIOBase):
    """A stream's first bytes, already read, then the rest of the stream."""

    def __init__(self, head: bytes, rest: Peekable):
        self._head = memoryview(head)
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._rest.read1(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def fileno(self) -> int:
        return self._rest.fileno()  # for os.fstat: the modification time of a quorum-state file

    def close(self) -> None:
        # The rest is the caller's to close (it may be stdin).
        self._head = memoryview(b"")
        super().close()


def peek_lines(stream: Peekable, max_lines: int, max_bytes: int) -> tuple[list[bytes], io.BufferedReader]:
    """The first lines of ``stream`` (at most ``max_lines``, from at most
    ``max_bytes``; the last may be cut off), and a stream that reads
    ``stream`` from its start again, a pipe included.

    The returned stream does not close ``stream``."""
    head = b""
    while len(head) < max_bytes and head.count(b"\n") < max_lines:
        chunk = stream.read1(max_bytes - len(head))
        if not chunk:
            break
        head += chunk
    lines = head.splitlines(keepends=True)[:max_lines]
    return lines, io.BufferedReader(_Replayed(head, stream), buffer_size=_SKIP_CHUNK_BYTES)


def bounded_lines(lines: Iterable[bytes | str | LongLine], limit: int) -> Iterable[bytes | str | LongLine]:
    """``lines`` read through :func:`read_lines` if it is a binary stream (a file
    iterated directly would hold a whole line, however long), else as given."""
    if isinstance(lines, io.BufferedIOBase | io.RawIOBase):
        return read_lines(lines, limit)
    return lines
