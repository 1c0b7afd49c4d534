"""``kafka-dump-log.sh --cluster-metadata-decoder`` output to ``kind: metadata``
envelopes (SPEC 1.3).

The tool (Kafka's ``DumpLogSegments``) prints, per file::

    Dumping /var/lib/kafka/__cluster_metadata-0/00000000000000000000.log
    Log starting offset: 0
    baseOffset: 0 lastOffset: 1 count: 2 ... isControl: false ... CreateTime: 1763720000000 ...
    | offset: 0 CreateTime: 1763720000000 keySize: -1 ... headerKeys: [] payload: {"type":...}
    | offset: 1 CreateTime: 1763720000000 keySize: -1 ... headerKeys: [] payload: {"type":...}

(a control batch prints ``LeaderChange: {...}`` and the like instead of ``payload:``).

Each record line with a ``payload:`` becomes an envelope whose ``body`` is the
payload object (``{"type", "version", "data"}``), with ``offset`` and ``ts_ms``
from the record line; the secrets the tool prints in clear (configuration
values fencewatch does not read, SCRAM credentials) are replaced by
``(redacted)`` (:mod:`detectors.metadata_configs`). A record of a version the
tool knows and fencewatch's native reader does not (a Kafka newer than the
schemas in ``producers/metadata_schemas``) keeps every field the tool printed;
the native reader gives the fields of the newest version it knows
(``producers.metadata_records``), so only the fields the rules read, which
every version has, are the same on both paths then.

A LeaderChange control record of a log segment is a quorum fact (KIP-595: the
leader records the start of its epoch) and becomes an envelope too, with
``body`` ``{"type": "LEADER_CHANGE", "partitionLeaderEpoch": E, "data": {...}}``:
``E`` from the batch header line (the epoch lives in the batch, not in the
record) and ``data`` the LeaderChangeMessage as printed. Kafka's
``DumpLogSegments`` prints it in one of two forms:

* up to Kafka 4.0 (``core/src/main/scala/kafka/tools/DumpLogSegments.scala``),
  only its type, ``controlType: LEADER_CHANGE(2)`` (the default case of its
  control-record match): ``data`` is ``{}``, and the leader is unknown;
* from Kafka 4.1 (KAFKA-19069, apache/kafka PR 19729; now in ``tools/src/main/
  java/org/apache/kafka/tools/DumpLogSegments.java``, ``printControlRecord``),
  ``LeaderChange: `` and the JSON of ``LeaderChangeMessageJsonConverter.write``
  of the record ``ControlRecordUtils.deserializeLeaderChangeMessage`` read:
  ``{"version":0,"leaderId":1,"voters":[{"voterId":1}],"grantingVoters":[...]}``
  (``clients/src/main/resources/common/message/LeaderChangeMessage.json``).

A KRaftVoters control record printed with its message (Kafka 4.1's
`` KRaftVoters {...}``, ``VotersRecordJsonConverter``) becomes an envelope the
same way, ``"type": "KRAFT_VOTERS"``, in a segment or a snapshot: the voter set
(KIP-853). The other control records (``SnapshotHeader``, ``SnapshotFooter``,
``KRaftVersion``, ``endTxnMarker:``, other ``controlType:``)
are Raft bookkeeping, not metadata: they are counted by Kafka's
``ControlRecordType`` name and skipped. Header, batch and blank lines are
counted as other lines.

A line longer than the record size limit is a ``too_large`` dead letter, read
in bounded pieces and never held whole.

Two variants are understood:

* ``--skip-record-metadata`` prints ``| payload: ...`` (older tools: `` payload:
  ...``) without offset or timestamp. The offset is then the batch's
  ``baseOffset`` plus the record's index in the batch (metadata batches are
  never compacted, so offsets inside a batch are consecutive) and the
  timestamp is the batch's. Control records print as blank lines then (the
  tool prints a control record only with the record metadata), so their
  LeaderChanges are lost to this form.
* Snapshots (``.checkpoint`` files, ``Snapshot end offset: N, epoch: E``) number
  their records from 0, which is not a log offset: their envelopes carry
  ``offset: null``, and ``ts_ms`` is the ``SnapshotHeader``'s
  ``lastContainedLogTimestamp`` when it is known (the snapshot's state is as
  of that time, not of the snapshot's writing), else the record's CreateTime.
  A LeaderChange there, without a log offset, could be neither ordered nor
  judged: it is counted and skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from detectors.envelope import BadRecord, DeadLetter, DeadLetterClass, Envelope, envelope_or_dead_letter
from detectors.fields import json_object
from detectors.lines import DEFAULT_MAX_RECORD_BYTES, LongLine, bounded_lines, decode_line, within_limit
from detectors.metadata_configs import redacted
from detectors.quorum import KRAFT_VOTERS, LEADER_CHANGE

_RECORD = re.compile(r"\|\s*offset: (-?\d+) (\w+): (-?\d+)(.*)")
_PAYLOAD_ONLY = re.compile(r"\|?\s*payload: ")
_PAYLOAD = re.compile(r" payload: ")
_BATCH = re.compile(r"baseOffset: (-?\d+) lastOffset: (-?\d+) ")
_LEGACY_BATCH = re.compile(r"offset: (-?\d+) position: ")
_PAIR = re.compile(r"(\w+): (\S+)")
# Lines DumpLogSegments prints around the records: a file, a log or snapshot
# start, a batch (legacy batches: _LEGACY_BATCH).
_HEADERS = (
    "Dumping ",
    "Snapshot end offset:",
    "KRaft bootstrap snapshot",
    "Log starting offset:",
    "Starting offset:",
    "baseOffset: ",
)
_TS_TYPES = ("CreateTime", "LogAppendTime")
# How DumpLogSegments prints each control record, mapped to ControlRecordType names.
_CONTROL = re.compile(
    r" (?:endTxnMarker: (?P<txn>\w+)|controlType: (?P<other>\w+)\("
    r"|(?P<named>LeaderChange:|SnapshotHeader|SnapshotFooter|KRaftVersion|KRaftVoters)(?= |$))"
)
_CONTROL_NAMES = {
    "LeaderChange:": LEADER_CHANGE,
    "SnapshotHeader": "SNAPSHOT_HEADER",
    "SnapshotFooter": "SNAPSHOT_FOOTER",
    "KRaftVersion": "KRAFT_VERSION",
    "KRaftVoters": "KRAFT_VOTERS",
}
UNKNOWN_CONTROL = "UNKNOWN"


@dataclass
class MetadataDumpStats:
    """Counters over one or more dumps.

    Every line is exactly one of: a metadata record or a line over the size
    limit (``records`` or ``dead_letters``), a control record (``control_records_by_type``, keyed by
    Kafka's ControlRecordType name), or another line (headers, batch lines,
    blanks), so ``lines == records + dead_letters + control_records + other_lines``.
    Of the other lines, ``blank_lines`` are blank and ``unrecognised_lines``
    are none of the tool's headers (:func:`is_dump_line`): text that is not
    kafka-dump-log.sh output, or a line of it fencewatch does not know.
    """

    lines: int = 0
    records: int = 0
    dead_letters: int = 0
    control_records_by_type: dict[str, int] = field(default_factory=dict)
    other_lines: int = 0
    blank_lines: int = 0
    unrecognised_lines: int = 0

    @property
    def header_lines(self) -> int:
        """The tool's header and batch lines."""
        return self.other_lines - self.blank_lines - self.unrecognised_lines

    @property
    def control_records(self) -> int:
        return sum(self.control_records_by_type.values())


@dataclass
class _Batch:
    """The batch header most recently printed: what record lines belong to."""

    base_offset: int
    last_offset: int
    is_control: bool
    ts_ms: int | None
    leader_epoch: int | None  # partitionLeaderEpoch; None if not printed (before magic 2)
    seen: int = 0  # record lines of this batch so far


@dataclass
class _Section:
    """One ``Dumping FILE`` section: a log segment or a snapshot."""

    snapshot: bool = False
    snapshot_ts_ms: int | None = None  # SnapshotHeader.lastContainedLogTimestamp
    batch: _Batch | None = None


@dataclass
class _Line:
    """A record line, taken apart. ``offset``/``ts_ms`` are None if not printed."""

    offset: int | None
    ts_type: str
    ts_ms: int | None
    payload: str | None
    control: str | None  # ControlRecordType name, None if no control marker
    control_json: str | None = None  # what follows a named control marker; None after ``controlType:``


def _is_record_line(text: str) -> bool:
    return text.startswith("|") or _PAYLOAD_ONLY.match(text) is not None


def _is_header(text: str) -> bool:
    return text.startswith(_HEADERS) or _LEGACY_BATCH.match(text) is not None


def is_dump_line(text: str) -> bool:
    """Whether a decoded line is one kafka-dump-log.sh prints: a record line
    (``| offset: ...``, ``payload: ...``) or a header (file, log start, batch)."""
    return _RECORD.match(text) is not None or _PAYLOAD_ONLY.match(text) is not None or _is_header(text)


def _check_identity(cluster: str, node: int | None) -> None:
    if not isinstance(cluster, str) or not cluster:
        raise ValueError("cluster must be a non-empty string")
    if node is not None and (isinstance(node, bool) or not isinstance(node, int) or node < 0):
        raise ValueError(f"node must be None or a non-negative node id, got {node!r}")


def iter_metadata_dump(
    lines: Iterable[bytes | str | LongLine],
    *,
    source: str,
    cluster: str,
    node: int | None = None,
    stats: MetadataDumpStats | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Iterator[Envelope | DeadLetter]:
    """Parse dump output into envelopes and dead letters, in input order.

    lines: physical lines (bytes preferred: bad UTF-8 in a record line becomes
        a dead letter), with or without terminators, or :class:`LongLine` for
        lines already cut short; or a binary stream, read in bounded lines.
    source: names the input in ``position`` (``f"{source}:{line}"``, 1-based).
    cluster, node: the envelope's cluster and, optionally, the controller whose
        log was dumped.
    stats: counters to update (to read after the generator ends, or to
        accumulate over several files).
    max_record_bytes: the longest line that is read; a longer one is a
        ``too_large`` dead letter, of which only the start is kept.

    Raises ValueError at once for a bad cluster, node or limit.
    """
    _check_identity(cluster, node)
    if max_record_bytes < 1:
        raise ValueError(f"max_record_bytes must be at least 1, got {max_record_bytes}")
    counts = stats if stats is not None else MetadataDumpStats()
    return _parse(bounded_lines(lines, max_record_bytes), source, cluster, node, counts, max_record_bytes)


def _parse(
    lines: Iterable[bytes | str | LongLine],
    source: str,
    cluster: str,
    node: int | None,
    counts: MetadataDumpStats,
    limit: int,
) -> Iterator[Envelope | DeadLetter]:
    section = _Section()
    seq = 0
    for number, raw in enumerate(lines, start=1):
        counts.lines += 1
        line, long = within_limit(raw, limit)
        text, utf8_error = decode_line(line) if long is None else (long.text(), None)
        position = f"{source}:{number}"
        is_record = _is_record_line(text)
        if long is not None:
            # Only its start is known, which cannot prove it is no record: it is
            # reported, never skipped as a header line might be.
            if is_record and section.batch is not None:
                section.batch.seen += 1
            counts.dead_letters += 1
            yield long.dead_letter(position, f"line {number}")
            continue
        if not is_record:
            counts.other_lines += 1
            if not text.strip():
                counts.blank_lines += 1
            elif utf8_error is not None or not _is_header(text):
                counts.unrecognised_lines += 1
            if utf8_error is None:
                section = _other_line(text, section)
            continue
        batch = section.batch
        index = batch.seen if batch is not None else 0
        if batch is not None:
            batch.seen += 1
        if utf8_error is not None:
            counts.dead_letters += 1
            yield DeadLetter(position, f"not UTF-8: {utf8_error}", text, kind=DeadLetterClass.NOT_UTF8)
            continue
        item = _record(text, position, section, index, cluster, node, seq, counts)
        if isinstance(item, Envelope):
            counts.records += 1
            seq += 1
            yield item
        elif isinstance(item, DeadLetter):
            counts.dead_letters += 1
            yield item


def _other_line(text: str, section: _Section) -> _Section:
    """Track file and batch context from a non-record line; return the section."""
    if text.startswith("Dumping "):
        return _Section(snapshot=text.rstrip().endswith(".checkpoint"))
    if text.startswith(("Snapshot end offset:", "KRaft bootstrap snapshot")):
        section.snapshot = True
    elif text.startswith(("Log starting offset:", "Starting offset:")):
        section.snapshot = False
    elif text.startswith("baseOffset: ") or _LEGACY_BATCH.match(text):
        section.batch = _parse_batch(text)
    return section


def _parse_batch(text: str) -> _Batch | None:
    """A batch header line, or None if it is too damaged to place records by."""
    pairs = dict(_PAIR.findall(text))
    try:
        match = _BATCH.match(text)
        if match:
            base, last = int(match.group(1)), int(match.group(2))
        else:
            base = last = int(pairs["offset"])
        ts_key = next((key for key in _TS_TYPES if key in pairs), None)
        ts_ms = int(pairs[ts_key]) if ts_key else None
        epoch = pairs.get("partitionLeaderEpoch")
        leader_epoch = int(epoch) if epoch is not None else None
    except (KeyError, ValueError):
        return None
    return _Batch(base, last, pairs.get("isControl") == "true", ts_ms, leader_epoch)


def _split(text: str) -> _Line | None:
    """Take a record line apart; None if it has neither metadata nor payload."""
    match = _RECORD.match(text)
    if match is None:
        only = _PAYLOAD_ONLY.match(text)
        if only is None:
            return None
        return _Line(None, "", None, text[only.end() :], None)
    offset, ts_type, ts, rest = match.groups()
    payload_at = _PAYLOAD.search(rest)
    if payload_at is not None:
        return _Line(int(offset), ts_type, int(ts), rest[payload_at.end() :], None)
    control = _CONTROL.search(rest)
    if control is None:
        return _Line(int(offset), ts_type, int(ts), None, None)
    name = control.group("txn") or control.group("other")
    if name is not None:
        return _Line(int(offset), ts_type, int(ts), None, name)
    name = _CONTROL_NAMES[control.group("named")]
    return _Line(int(offset), ts_type, int(ts), None, name, rest[control.end() :].strip())


def _record(
    text: str,
    position: str,
    section: _Section,
    index: int,
    cluster: str,
    node: int | None,
    seq: int,
    counts: MetadataDumpStats,
) -> Envelope | DeadLetter | None:
    """One record line: an envelope, a dead letter, or None for a control record."""
    line = _split(text)
    batch = section.batch
    if line is None:
        reason = "unrecognised record line: no 'offset:' and no 'payload:'"
        return DeadLetter(position, reason, text, kind=DeadLetterClass.INVALID)
    in_control_batch = batch is not None and batch.is_control
    is_control = line.control is not None or (line.payload is None and in_control_batch)
    published = (line.control == LEADER_CHANGE and not section.snapshot) or (
        line.control == KRAFT_VOTERS and line.control_json is not None
    )
    if is_control and not published:
        kind = line.control or UNKNOWN_CONTROL
        counts.control_records_by_type[kind] = counts.control_records_by_type.get(kind, 0) + 1
        if kind == "SNAPSHOT_HEADER":
            section.snapshot_ts_ms = _last_contained_ts(line.control_json or "")
        return None
    if not is_control and line.payload is None:
        reason = "record line has no payload (dump with --cluster-metadata-decoder)"
        return DeadLetter(position, reason, text, kind=DeadLetterClass.INVALID)
    offset, ts_ms = line.offset, line.ts_ms
    if offset is None:  # printed with --skip-record-metadata: place it by its batch
        if batch is None:
            reason = "record without offset or timestamp and no batch header before it"
            return DeadLetter(position, reason, text, kind=DeadLetterClass.NO_TIMESTAMP)
        offset, ts_ms = batch.base_offset + index, batch.ts_ms
        if offset > batch.last_offset:
            reason = f"more records than the batch header announces (last {batch.last_offset})"
            return DeadLetter(position, reason, text, kind=DeadLetterClass.INVALID)
    elif line.ts_type not in _TS_TYPES:
        reason = f"record has no timestamp ({line.ts_type}: {ts_ms})"
        return DeadLetter(position, reason, text, kind=DeadLetterClass.NO_TIMESTAMP)
    if ts_ms is None or ts_ms < 0:
        reason = f"record has no usable timestamp ({ts_ms})"
        return DeadLetter(position, reason, text, kind=DeadLetterClass.NO_TIMESTAMP)
    try:
        body = (
            _control(line.control or LEADER_CHANGE, line.control_json, batch)
            if is_control
            else _payload(line.payload or "")
        )
    except BadRecord as exc:
        return exc.dead_letter(position, text)
    if section.snapshot:
        offset = None
        if section.snapshot_ts_ms is not None and section.snapshot_ts_ms > 0:
            ts_ms = section.snapshot_ts_ms
    obj = {
        "cluster": cluster,
        "node": node,
        "ts_ms": ts_ms,
        "kind": "metadata",
        "offset": offset,
        "body": body,
    }
    return envelope_or_dead_letter(obj, position, seq, text)


def _control(kind: str, printed: str | None, batch: _Batch | None) -> dict[str, Any]:
    """The body of a LeaderChange or KRaftVoters control record: its batch's
    epoch and the message as printed (``{}`` when the tool printed only the
    control type: ``printed`` None); raise :class:`BadRecord` saying why it
    cannot be used."""
    name = "LeaderChange" if kind == LEADER_CHANGE else "KRaftVoters"
    if batch is None or batch.leader_epoch is None:
        raise BadRecord(
            f"{name} without its batch header line (partitionLeaderEpoch): its epoch is unknown",
            DeadLetterClass.INVALID,
        )
    data = json_object(printed, name) if printed is not None else {}
    return {"type": kind, "partitionLeaderEpoch": batch.leader_epoch, "data": data}


def _payload(text: str) -> dict[str, Any]:
    """The payload object; raise :class:`BadRecord` saying why it cannot be used."""
    if text.startswith("Error at"):
        # DumpLogSegments prints this when its own decoder failed on the record.
        raise BadRecord(
            f"kafka-dump-log.sh could not decode the record: {text.strip()}", DeadLetterClass.INVALID
        )
    body = json_object(text, "payload")
    kind, version, data = body.get("type"), body.get("version"), body.get("data")
    if not isinstance(kind, str) or not kind:
        raise BadRecord(
            f"payload 'type' must be a record type name, got {kind!r}", DeadLetterClass.WRONG_TYPE
        )
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise BadRecord(
            f"payload 'version' must be a non-negative integer, got {version!r}",
            DeadLetterClass.of_bad_number(version),
        )
    if not isinstance(data, dict):
        raise BadRecord(
            f"payload 'data' must be a JSON object, got {type(data).__name__}", DeadLetterClass.WRONG_TYPE
        )
    return redacted(body)


def _last_contained_ts(text: str) -> int | None:
    """``lastContainedLogTimestamp`` from a printed SnapshotHeader, if readable."""
    try:
        header = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    value = header.get("lastContainedLogTimestamp") if isinstance(header, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
