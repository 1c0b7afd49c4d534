"""What kind of input a file is, from its first lines: so that a command given
the wrong kind of file says which kind it is instead of turning every line
into a dead letter or a skipped line.

Each line votes for the kind whose parser recognises it (the recognisers live
with the parsers: ``detectors.parse_*``); blank lines do not vote. Lines that
are not text (a NUL byte, or bytes that are not UTF-8) make a file binary when
they are most of its non-blank lines. Pure: it reads only the lines given.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from enum import Enum
from itertools import islice

import orjson

from detectors.envelope import KINDS
from detectors.lines import LongLine, decode_line
from detectors.parse_metadata_dump import is_dump_line
from detectors.parse_quorum_state import is_quorum_state_object
from detectors.parse_remote_log_metadata import is_formatter_line
from detectors.parse_request_log import is_log_entry, is_request_entry

# Enough for a request log whose first entries are a broker's start-up lines
# and a dump's headers; few enough to cost nothing before a large input.
SNIFF_LINES = 64
SNIFF_BYTES = 64 * 1024  # what a reader hands :func:`sniff` at most


class FileKind(Enum):
    """A kind of input; the value says what it is, for messages."""

    REQUEST_LOG = "a Kafka request log"
    METADATA_DUMP = "kafka-dump-log.sh output"
    QUORUM_STATE = "a controller's quorum-state file"
    REMOTE_LOG_METADATA = "RemoteLogMetadataFormatter output"
    ENVELOPES = "envelope JSONL"
    # log4j lines of other loggers only (server.log, or a request log before its first request).
    LOG4J = "a Kafka log4j log without request-logger entries"
    BINARY = "a binary file"
    UNKNOWN = "text of no kind fencewatch reads"
    EMPTY = "an empty file"


def _json_kind(text: str) -> FileKind | None:
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    if is_quorum_state_object(obj):
        return FileKind.QUORUM_STATE
    if obj.get("kind") in KINDS and "cluster" in obj and "body" in obj:
        return FileKind.ENVELOPES
    return None


def line_kind(text: str) -> FileKind | None:
    """The kind one decoded, non-blank line belongs to, or None if no parser
    recognises it (another logger's log4j entry included: see :func:`sniff`)."""
    if is_request_entry(text):
        return FileKind.REQUEST_LOG
    if is_formatter_line(text):
        return FileKind.REMOTE_LOG_METADATA
    if is_dump_line(text):
        return FileKind.METADATA_DUMP
    if text.startswith("{"):
        return _json_kind(text)
    return None


def sniff(lines: Iterable[bytes | str | LongLine]) -> FileKind:
    """The kind of the input whose first lines these are (only the first
    :data:`SNIFF_LINES` are read; a cut-off last line is fine): the kind most
    lines vote for; else BINARY, LOG4J, EMPTY or UNKNOWN."""
    votes: Counter[FileKind] = Counter()
    texts = not_text = 0
    log4j = False
    for number, raw in enumerate(islice(lines, SNIFF_LINES), start=1):
        data = raw.head if isinstance(raw, LongLine) else raw
        text, utf8_error = decode_line(data)
        if number == 1:
            text = text.removeprefix("\ufeff")
        if not text.strip():
            continue
        texts += 1
        if utf8_error is not None or "\0" in text:
            not_text += 1
            continue
        kind = line_kind(text)
        if kind is not None:
            votes[kind] += 1
        elif is_log_entry(text):
            log4j = True
    if not_text * 2 > texts:
        return FileKind.BINARY
    if votes:
        return votes.most_common(1)[0][0]
    if log4j:
        return FileKind.LOG4J
    return FileKind.UNKNOWN if texts else FileKind.EMPTY
