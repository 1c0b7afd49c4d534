"""Kafka's request log (``kafka-request.log``) to ``kind: request`` envelopes (SPEC 1.2).

A broker or controller with logger ``kafka.request.logger`` at DEBUG writes one
entry per completed request::

    [2026-11-20 10:15:02,345] DEBUG Completed request:{...json...} (kafka.request.logger)

The envelope ``body`` is the JSON object after ``Completed request:``, unchanged.
An entry may be wrapped over several physical lines; it ends once the text ends
with `` (kafka.request.logger)``, or, for a broken entry, when the next log entry
(a line starting with ``[timestamp]``) or the end of input arrives. Entries of
other loggers are skipped and counted, never dead-lettered: they are not ours.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson

from detectors.envelope import DeadLetter, DeadLetterClass, Envelope, envelope_or_dead_letter
from detectors.lines import decode_line

REQUEST_LOGGER_SUFFIX = "(kafka.request.logger)"
COMPLETED_MARKER = "Completed request:"

# Loose on purpose: a request entry with a malformed timestamp must still be
# recognised as one, so it becomes a dead letter instead of a skipped line.
_RECORD_START = re.compile(r"\[([^\]]*)\] (\S+) Completed request:")
_RECORD_START_BYTES = re.compile(rb"\[([^\]]*)\] (\S+) Completed request:")
# Any log4j entry (any logger) starts like this; it ends a broken request entry.
_ENTRY_START = re.compile(r"\[\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}")
# log4j's default %d: yyyy-MM-dd HH:mm:ss,SSS (milliseconds).
_STAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2}),(\d{3})")
_TAIL_CHARS = 64


@dataclass
class RequestLogStats:
    """Counters over one or more request logs.

    Every physical line lands in exactly one of ``record_lines`` (part of a
    request entry, which became one envelope or one dead letter) and
    ``other_logger_lines`` (other loggers' entries, their continuation lines
    such as stack traces, and blank lines), so
    ``lines == record_lines + other_logger_lines``.
    """

    lines: int = 0
    records: int = 0
    dead_letters: int = 0
    record_lines: int = 0
    other_logger_lines: int = 0


@dataclass
class _Pending:
    """A request entry being collected, possibly over several physical lines."""

    line_number: int
    stamp: str
    parts: list[str] = field(default_factory=list)  # text after the marker, then whole lines
    raw_lines: list[str] = field(default_factory=list)  # decoded lines, for the dead letter
    inputs: list[bytes | str] = field(default_factory=list)  # the lines as given
    utf8_error: str | None = None
    tail: str = ""

    def add(self, part: str, line: str, given: bytes | str, utf8_error: str | None) -> None:
        self.parts.append(part)
        self.raw_lines.append(line)
        self.inputs.append(given)
        self.tail = (self.tail + part)[-_TAIL_CHARS:]
        if utf8_error and not self.utf8_error:
            self.utf8_error = utf8_error

    def ends_with_logger(self) -> bool:
        return self.tail.rstrip().endswith(REQUEST_LOGGER_SUFFIX)

    def text(self) -> tuple[str, str | None]:
        """The entry's text after the marker, and what is wrong with its UTF-8 if anything."""
        if self.utf8_error is None:
            return "".join(self.parts), None
        # A hard wrap may split one multi-byte character over two lines: only the
        # joined bytes say whether the entry is really not UTF-8.
        chunks = []
        for index, given in enumerate(self.inputs):
            data = (given.encode() if isinstance(given, str) else given).rstrip(b"\r\n")
            if index == 0:
                data = data.removeprefix(b"\xef\xbb\xbf")
                start = _RECORD_START_BYTES.match(data)
                data = data[start.end() :] if start else data
            chunks.append(data)
        joined = b"".join(chunks)
        try:
            return joined.decode("utf-8"), None
        except UnicodeDecodeError as exc:
            where = f"byte {exc.start + 1} after '{COMPLETED_MARKER}'"
            return "", f"invalid UTF-8 byte 0x{joined[exc.start]:02x} at {where}"


class _LogClock:
    """Turns log4j timestamps written in zone ``tz`` into epoch milliseconds."""

    def __init__(self, tz: str):
        try:
            self._zone = ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError, OSError) as exc:  # "Europe" is a directory
            raise ValueError(f"unknown time zone {tz!r} (use an IANA name like 'UTC')") from exc
        self._utc = tz.upper() in ("UTC", "ETC/UTC")
        # Entries arrive in time order, so the same second repeats: cache it.
        self._second = ""
        self._second_ms = 0

    def to_ms(self, stamp: str) -> int:
        """Epoch milliseconds of ``stamp``; raise ValueError naming the problem."""
        match = _STAMP.fullmatch(stamp)
        if match is None:
            raise ValueError(f"bad timestamp {stamp!r}: expected YYYY-MM-DD HH:MM:SS,mmm")
        second = stamp[:19]
        if second != self._second:
            year, month, day, hour, minute, sec = (int(g) for g in match.groups()[:6])
            try:
                local = datetime(year, month, day, hour, minute, sec)
            except ValueError as exc:
                raise ValueError(f"bad timestamp {stamp!r}: {exc}") from None
            if self._utc:
                epoch_s = calendar.timegm(local.timetuple())
            else:
                epoch_s = int(local.replace(tzinfo=self._zone).timestamp())
            self._second, self._second_ms = second, epoch_s * 1000
        return self._second_ms + int(match.group(7))


def _check_identity(cluster: str, node: int) -> None:
    if not isinstance(cluster, str) or not cluster:
        raise ValueError("cluster must be a non-empty string")
    if isinstance(node, bool) or not isinstance(node, int) or node < 0:
        raise ValueError(f"node must be the non-negative id of the logging broker, got {node!r}")


def iter_request_log(
    lines: Iterable[bytes | str],
    *,
    source: str,
    cluster: str,
    node: int,
    tz: str = "UTC",
    stats: RequestLogStats | None = None,
) -> Iterator[Envelope | DeadLetter]:
    """Parse a request log into envelopes and dead letters, in input order.

    lines: physical lines, bytes (preferred: bad UTF-8 becomes a dead letter) or
        str, with or without their line terminators.
    source: names the input in ``position`` (``f"{source}:{line}"``, the line
        where the entry starts, 1-based).
    cluster, node: the envelope's cluster and the id of the broker or
        controller that wrote the log.
    tz: IANA zone the broker logs its local time in; the log has no offset.
    stats: counters to update (pass one to read them after the generator ends,
        or to accumulate over several files).

    Raises ValueError at once (not at the first ``next()``) for a bad
    cluster, node or tz.
    """
    _check_identity(cluster, node)
    clock = _LogClock(tz)
    counts = stats if stats is not None else RequestLogStats()
    return _parse(lines, source, cluster, node, clock, counts)


def _parse(
    lines: Iterable[bytes | str],
    source: str,
    cluster: str,
    node: int,
    clock: _LogClock,
    counts: RequestLogStats,
) -> Iterator[Envelope | DeadLetter]:
    seq = 0
    pending: _Pending | None = None

    def finish(entry: _Pending, ended_by: str) -> Envelope | DeadLetter:
        nonlocal seq
        counts.record_lines += len(entry.raw_lines)
        item = _build(entry, ended_by, clock, source, cluster, node, seq)
        if isinstance(item, Envelope):
            counts.records += 1
            seq += 1
        else:
            counts.dead_letters += 1
        return item

    for number, raw in enumerate(lines, start=1):
        counts.lines += 1
        text, utf8_error = decode_line(raw)
        if number == 1:
            text = text.removeprefix("\ufeff")
        start = _RECORD_START.match(text)
        if pending is not None and (start is not None or _ENTRY_START.match(text)):
            yield finish(pending, f"the next log entry starts at line {number}")
            pending = None
        if pending is not None:
            pending.add(text, text, raw, utf8_error)
            if pending.ends_with_logger():
                yield finish(pending, "")
                pending = None
            continue
        if start is None:
            counts.other_logger_lines += 1
            continue
        pending = _Pending(number, start.group(1))
        pending.add(text[start.end() :], text, raw, utf8_error)
        if pending.ends_with_logger():
            yield finish(pending, "")
            pending = None
    if pending is not None:
        yield finish(pending, "the input ended")


def _build(
    entry: _Pending,
    ended_by: str,
    clock: _LogClock,
    source: str,
    cluster: str,
    node: int,
    seq: int,
) -> Envelope | DeadLetter:
    """One finished entry as an envelope, or a dead letter saying why not.

    ended_by is empty when the entry ended with the logger suffix, else it says
    what cut the entry off (used in the reason for a truncated entry).
    """
    position = f"{source}:{entry.line_number}"
    raw = "\n".join(entry.raw_lines)
    text, utf8_problem = entry.text()
    if utf8_problem:
        return DeadLetter(position, f"not UTF-8: {utf8_problem}", raw, kind=DeadLetterClass.NOT_UTF8)
    try:
        ts_ms = clock.to_ms(entry.stamp)
    except ValueError as exc:
        return DeadLetter(position, str(exc), raw, kind=DeadLetterClass.NO_TIMESTAMP)
    text = text.rstrip()
    # Without the logger suffix the entry was cut off, unless the broker's
    # log4j pattern simply has no "(%c)": then the JSON itself is complete.
    json_text = text[: -len(REQUEST_LOGGER_SUFFIX)] if not ended_by else text
    try:
        body = orjson.loads(json_text)
    except orjson.JSONDecodeError as exc:
        message = str(exc)
        if message.startswith(("unexpected end of data", "Input is a zero-length")):
            cut = f"; {ended_by}" if ended_by else ""
            reason = f"truncated request JSON after '{COMPLETED_MARKER}' ({message}){cut}"
        else:
            reason = f"malformed request JSON after '{COMPLETED_MARKER}': {message}"
        return DeadLetter(position, reason, raw, kind=DeadLetterClass.MALFORMED_JSON)
    if not isinstance(body, dict):
        kind = type(body).__name__
        reason = f"request body must be a JSON object, got {kind}"
        return DeadLetter(position, reason, raw, kind=DeadLetterClass.WRONG_TYPE)
    obj = {
        "cluster": cluster,
        "node": node,
        "ts_ms": ts_ms,
        "kind": "request",
        "offset": None,
        "body": body,
    }
    return envelope_or_dead_letter(obj, position, seq, raw)
