"""Kafka's request log (``kafka-request.log``) to ``kind: request`` envelopes (SPEC 1.2).

A broker or controller with logger ``kafka.request.logger`` at DEBUG writes one
entry per completed request::

    [2026-11-20 10:15:02,345] DEBUG Completed request:{...json...} (kafka.request.logger)

The envelope ``body`` is the JSON object after ``Completed request:``, unchanged.
An entry may be wrapped over several physical lines; it ends once the text ends
with `` (kafka.request.logger)``, or, for a broken entry, when the next log entry
(a line starting with ``[timestamp]``) or the end of input arrives. Entries of
other loggers are skipped and counted, never dead-lettered: they are not ours.
So are blank lines, and text before the first log4j entry, counted apart as
unrecognised: a file that is all of it is no log (``detectors.file_kinds``).

An entry whose JSON grows past the record size limit, and any line longer than
the limit, becomes a ``too_large`` dead letter as soon as the limit is passed;
the rest of that entry is skipped up to its end or the next log entry, so an
entry that never ends costs no more memory than the limit.

Given the API keys to keep (``apis``; convert and ship pass
``detectors.rules.READ_APIS``), an entry of any other API (a Heartbeat, a
Metadata, an ApiVersions...) is left out and counted by API name instead,
unless its time bridges a silence of the others (``_Bridge``). An entry whose
header names no API is kept: the detector dead-letters it.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson

from detectors.clocks import GAP_MS
from detectors.envelope import BadRecord, DeadLetter, DeadLetterClass, Envelope, envelope_or_dead_letter
from detectors.lines import (
    DEFAULT_MAX_RECORD_BYTES,
    EXCERPT_BYTES,
    LongLine,
    bounded_lines,
    decode_line,
    too_large_reason,
    within_limit,
)
from detectors.requests import header

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
    request entry, which became one envelope or one dead letter, or a line
    over the size limit, which became a dead letter), ``other_logger_lines``
    (other loggers' entries and the lines that follow an entry without
    starting one, such as stack traces), ``blank_lines`` (outside request
    entries) and ``unrecognised_lines`` (text before the input's first log4j
    entry: not a log line at all), so
    ``lines == record_lines + other_logger_lines + blank_lines + unrecognised_lines``.
    ``continuation_lines`` counts the record lines after each entry's first
    (an entry wrapped over several lines, or the skipped rest of one too large),
    so ``record_lines == records + dead_letters + continuation_lines``.
    ``records_by_api`` counts the records by API name (Kafka's
    ``requestApiKeyName``, else ``API key N``, else ``no API`` for an entry
    whose header names none), so it sums to ``records``.
    """

    lines: int = 0
    records: int = 0
    dead_letters: int = 0
    record_lines: int = 0
    other_logger_lines: int = 0
    blank_lines: int = 0
    unrecognised_lines: int = 0
    unread_by_api: dict[str, int] = field(default_factory=dict)
    # A breakdown of ``records``, left out of equality as the other totals' parts are.
    records_by_api: dict[str, int] = field(default_factory=dict, compare=False)
    bridges: int = 0

    def count_record(self, env: Envelope) -> None:
        name = api_name(env)
        self.records += 1
        self.records_by_api[name] = self.records_by_api.get(name, 0) + 1

    @property
    def unread(self) -> int:
        return sum(self.unread_by_api.values())

    @property
    def continuation_lines(self) -> int:
        return self.record_lines - self.records - self.unread - self.dead_letters

    @property
    def skipped_lines(self) -> int:
        """Lines that belong to no request entry."""
        return self.other_logger_lines + self.blank_lines + self.unrecognised_lines

    @property
    def finished_lines(self) -> int:
        """Lines whose fate is settled: all but those of an entry still being read."""
        return self.record_lines + self.skipped_lines


@dataclass
class _Pending:
    """A request entry being collected, possibly over several physical lines.

    The entry's bytes are kept in one buffer, not as one object per line: an
    entry of many short lines must cost its size in memory, not many times it.
    """

    line_number: int
    stamp: str
    body: bytearray = field(default_factory=bytearray)  # the bytes after the marker, lines joined
    excerpt: str = ""  # the entry's start as decoded lines, for a dead letter
    lines: int = 0
    tail: str = ""

    def add(self, part: bytes, part_text: str, line: str) -> None:
        """One line: ``part`` its bytes that belong to the body, ``part_text``
        the same decoded, ``line`` the whole line decoded."""
        self.body += part
        self.lines += 1
        if len(self.excerpt) < EXCERPT_BYTES:
            kept = line[:EXCERPT_BYTES]
            joined = f"{self.excerpt}\n{kept}" if self.lines > 1 else kept
            self.excerpt = joined[:EXCERPT_BYTES]
        self.tail = (self.tail + part_text)[-_TAIL_CHARS:]

    def ends_with_logger(self) -> bool:
        return self.tail.rstrip().endswith(REQUEST_LOGGER_SUFFIX)

    def text(self) -> tuple[str, str | None]:
        """The entry's text after the marker, and what is wrong with its UTF-8 if anything.

        Decoded whole, because a hard wrap may split one multi-byte character
        over two lines."""
        try:
            return self.body.decode("utf-8"), None
        except UnicodeDecodeError as exc:
            where = f"byte {exc.start + 1} after '{COMPLETED_MARKER}'"
            return "", f"invalid UTF-8 byte 0x{self.body[exc.start]:02x} at {where}"


def is_request_entry(text: str) -> bool:
    """Whether a decoded line starts a request-logger entry (``Completed request:``)."""
    return _RECORD_START.match(text) is not None


def is_log_entry(text: str) -> bool:
    """Whether a decoded line starts a log4j entry of any logger (``[yyyy-MM-dd HH:mm:ss``)."""
    return _ENTRY_START.match(text) is not None


def _as_bytes(raw: bytes | str) -> bytes:
    """A line as given, as bytes without its terminator."""
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    return data.rstrip(b"\r\n")


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
    lines: Iterable[bytes | str | LongLine],
    *,
    source: str,
    cluster: str,
    node: int,
    tz: str = "UTC",
    stats: RequestLogStats | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    apis: Collection[int] | None = None,
) -> Iterator[Envelope | DeadLetter]:
    """Parse a request log into envelopes and dead letters, in input order.

    lines: physical lines, bytes (preferred: bad UTF-8 becomes a dead letter) or
        str, with or without their line terminators, or :class:`LongLine` for
        lines already cut short; or a binary stream, read in bounded lines.
    source: names the input in ``position`` (``f"{source}:{line}"``, the line
        where the entry starts, 1-based).
    cluster, node: the envelope's cluster and the id of the broker or
        controller that wrote the log.
    tz: IANA zone the broker logs its local time in; the log has no offset.
    stats: counters to update (pass one to read them after the generator ends,
        or to accumulate over several files).
    max_record_bytes: the largest line, and the largest entry JSON, that is
        read; anything larger is a ``too_large`` dead letter.
    apis: the API keys whose entries become envelopes; an entry of another
        API is counted in ``stats.unread_by_api`` instead. None keeps every entry.

    Raises ValueError at once (not at the first ``next()``) for a bad
    cluster, node, tz or limit.
    """
    _check_identity(cluster, node)
    if max_record_bytes < 1:
        raise ValueError(f"max_record_bytes must be at least 1, got {max_record_bytes}")
    clock = _LogClock(tz)
    counts = stats if stats is not None else RequestLogStats()
    return _parse(
        bounded_lines(lines, max_record_bytes), source, cluster, node, clock, counts, max_record_bytes, apis
    )


def _parse(
    lines: Iterable[bytes | str | LongLine],
    source: str,
    cluster: str,
    node: int,
    clock: _LogClock,
    counts: RequestLogStats,
    limit: int,
    apis: Collection[int] | None,
) -> Iterator[Envelope | DeadLetter]:
    seq = 0
    pending: _Pending | None = None
    # The rest of an entry that was too large: its lines are skipped up to the
    # entry's end. None when not skipping, else the tail of what was skipped.
    skipped_tail: str | None = None

    # Whether a log4j entry has started yet: lines before the first are no log's.
    seen_entry = False

    bridge = _Bridge(counts)

    def finish(entry: _Pending, ended_by: str) -> Iterator[Envelope | DeadLetter]:
        """The entry's envelope or dead letter (after the entry left out that
        bridges a silence before it, if one does); nothing for an entry left out."""
        nonlocal seq
        counts.record_lines += entry.lines
        item = _build(entry, ended_by, clock, source, cluster, node, seq)
        if not isinstance(item, Envelope):
            counts.dead_letters += 1
            yield item
            return
        seq += 1
        if apis is None:
            counts.count_record(item)
            yield item
            return
        yield from bridge.before(item.ts_ms)
        unread = _unread_api(item, apis)
        if unread is not None:
            bridge.leave_out(item, unread)
            return
        bridge.given(item.ts_ms)
        counts.count_record(item)
        yield item

    def too_large(entry: _Pending, last_line: int) -> DeadLetter:
        counts.record_lines += entry.lines
        counts.dead_letters += 1
        what = f"the request entry of lines {entry.line_number}-{last_line}"
        reason = f"{too_large_reason(what, limit)}; only its start is kept, the rest is skipped"
        position = f"{source}:{entry.line_number}"
        return DeadLetter(position, reason, entry.excerpt, kind=DeadLetterClass.TOO_LARGE)

    for number, raw in enumerate(lines, start=1):
        counts.lines += 1
        line, long = within_limit(raw, limit)
        # Bad UTF-8 is judged on the whole entry (see _Pending.text), not per line.
        text = decode_line(line)[0] if long is None else long.text()
        if number == 1:
            text = text.removeprefix("\ufeff")
        start = _RECORD_START.match(text)
        entry_starts = start is not None or _ENTRY_START.match(text) is not None
        seen_entry = seen_entry or entry_starts
        if pending is not None and entry_starts:
            yield from finish(pending, f"the next log entry starts at line {number}")
            pending = None
        if skipped_tail is not None and not entry_starts:
            counts.record_lines += 1
            # An over-long line's end is unknown: keep skipping until the next entry.
            skipped_tail = "" if long is not None else (skipped_tail + text)[-_TAIL_CHARS:]
            if skipped_tail.rstrip().endswith(REQUEST_LOGGER_SUFFIX):
                skipped_tail = None
            continue
        skipped_tail = None
        if long is not None:
            # Continuing an entry, it makes that entry too large; starting one,
            # it is that entry, and what follows is its rest; else it stands alone.
            if pending is not None:
                yield too_large(pending, number)
                pending = None
                counts.record_lines += 1
                skipped_tail = ""
                continue
            counts.record_lines += 1
            counts.dead_letters += 1
            yield long.dead_letter(f"{source}:{number}", f"line {number}")
            skipped_tail = "" if start is not None else None
            continue
        if pending is None:
            if start is None:
                if not text.strip():
                    counts.blank_lines += 1
                elif seen_entry:
                    counts.other_logger_lines += 1
                else:
                    counts.unrecognised_lines += 1
                continue
            pending = _Pending(number, start.group(1))
            part = _as_bytes(line)
            if number == 1:
                part = part.removeprefix(b"\xef\xbb\xbf")
            marker = _RECORD_START_BYTES.match(part)
            pending.add(part[marker.end() :] if marker else part, text[start.end() :], text)
        else:
            pending.add(_as_bytes(line), text, text)
        if len(pending.body) > limit:
            ended = pending.ends_with_logger()
            yield too_large(pending, number)
            pending = None
            skipped_tail = None if ended else ""
        elif pending.ends_with_logger():
            yield from finish(pending, "")
            pending = None
    if pending is not None:
        yield from finish(pending, "the input ended")


class _Bridge:
    """Which entries left out for their API are given all the same, for their time.

    The detector reads the time of every request a node logged, whatever its
    API: a silence of over ``GAP_MS`` in a node's log cuts the evidence its
    clock is measured from (detectors.clocks). So that leaving entries out cuts
    nothing, the newest entry left out is held back, and given after all when
    the next entry comes more than ``GAP_MS`` after the newest entry given:
    then every silence between the entries given is one the whole log has too.
    Where the read APIs come often (a leader's replica fetches), none is.
    """

    def __init__(self, counts: RequestLogStats) -> None:
        self._counts = counts
        self._given_ms: int | None = None  # the newest ts_ms given
        self._held: tuple[Envelope, str] | None = None  # the newest entry left out since, and its API

    def before(self, ts_ms: int) -> Iterator[Envelope]:
        """The held entry, if an entry at ``ts_ms`` would come after a silence without it."""
        held, given_ms = self._held, self._given_ms
        if held is None or given_ms is None or ts_ms - given_ms <= GAP_MS:
            return
        env, api = held
        self._held = None
        counts = self._counts
        counts.unread_by_api[api] -= 1
        if not counts.unread_by_api[api]:
            del counts.unread_by_api[api]
        counts.count_record(env)
        counts.bridges += 1
        self.given(env.ts_ms)
        yield env

    def leave_out(self, env: Envelope, api: str) -> None:
        self._counts.unread_by_api[api] = self._counts.unread_by_api.get(api, 0) + 1
        # Before the first entry given, there is no evidence to cut.
        self._held = (env, api) if self._given_ms is not None else None

    def given(self, ts_ms: int) -> None:
        self._given_ms = ts_ms if self._given_ms is None else max(self._given_ms, ts_ms)
        self._held = None


def unread_account(unread_by_api: Mapping[str, int], bridges: int) -> str:
    """What became of the entries of APIs no rule reads, for a summary: ``left
    out, no rule reads their API: 5 entries (HEARTBEAT=3, METADATA=2)``, the most
    first, and how many were given for their time alone ("" if none was either)."""
    by_api = sorted(unread_by_api.items(), key=lambda item: (-item[1], item[0]))
    counts = ", ".join(f"{name}={n}" for name, n in by_api)
    parts = (
        [f"left out, no rule reads their API: {sum(unread_by_api.values())} entries ({counts})"]
        if by_api
        else []
    )
    if bridges:
        parts.append(f"given for their time alone: {bridges} (a silence over {GAP_MS} ms without them)")
    return "; ".join(parts)


def _unread_api(env: Envelope, apis: Collection[int]) -> str | None:
    """The API name of an entry whose API is not in ``apis`` (:func:`api_name`);
    None for an entry to keep."""
    try:
        api_key = header(env.body).api_key
    except BadRecord:
        return None
    if api_key in apis:
        return None
    return api_name(env)


def api_name(env: Envelope) -> str:
    """An entry's API as Kafka names it (``requestApiKeyName``), else ``API key
    N``, else ``no API`` (a header without a key: the detector dead-letters it)."""
    request_header = env.body.get("requestHeader")
    name = request_header.get("requestApiKeyName") if isinstance(request_header, dict) else None
    if isinstance(name, str) and name:
        return name
    try:
        return f"API key {header(env.body).api_key}"
    except BadRecord:
        return "no API"


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
    raw = entry.excerpt
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
