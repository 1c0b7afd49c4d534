"""``__cluster_metadata-0`` segment and snapshot files to ``kind: metadata`` envelopes.

A segment (``00000000000000012345.log``) and a snapshot
(``00000000000000012345-0000000003.checkpoint``) are both a sequence of record
batches in format v2 (``DefaultRecordBatch``): baseOffset int64, length int32,
then the batch, whose CRC-32C covers everything from its attributes on. The
batches are framed here the way Kafka's ``FileLogInputStream.nextBatch`` does
(so a file's byte position is known for every batch) and read with
kafka-python's ``kafka.record.DefaultRecordBatch`` (header, CRC,
decompression; a metadata batch's records are read by
:mod:`producers.record_batch`); each record's value is decoded by
:mod:`producers.metadata_records`.

The envelopes are those ``detectors.parse_metadata_dump`` makes of
``kafka-dump-log.sh --cluster-metadata-decoder`` output for the same files
(``DumpLogSegments``): ``body`` ``{"type", "version", "data"}``, ``offset`` and
``ts_ms`` from the record (its CreateTime); a LeaderChange control record of a
segment becomes ``{"type": "LEADER_CHANGE", "partitionLeaderEpoch": E, "data":
{...}}`` with ``E`` from its batch, as Kafka 4.1's tool prints it, and so does
a KRaftVoters control record (KIP-853, ``VotersRecord``: ``voters`` with each
``voterId``, ``voterDirectoryId``, ``endpoints`` and ``kRaftVersionFeature``),
``"type": "KRAFT_VOTERS"``, of a segment or a snapshot (whose voter set is the
one a view started from it needs). A snapshot's
records (``Snapshots``/``FileRawSnapshotReader``: SnapshotHeader, the records
numbered from 0, SnapshotFooter) carry ``offset: null`` and the header's
``lastContainedLogTimestamp`` as ``ts_ms`` when it is positive. Only
``position`` differs: ``FILE:BYTE`` of the record's batch. Secrets are
redacted as on that path (:func:`detectors.metadata_configs.redacted`).

Kafka writes the metadata log uncompressed (``KafkaRaftClient`` and
``RecordsSnapshotWriter`` use ``Compression.NONE``); a compressed batch is
still read, as ``DefaultRecordBatch`` decompresses it.

What is not an envelope is counted in :class:`MetadataLogStats`: control
records by ``ControlRecordType`` name, records of a type or version without a
schema here by name. A batch that cannot be read (a CRC mismatch, a broken
record inside it, a file that ends inside it) is a dead letter naming the file
and byte; reading goes on with the next batch when the damaged one's length is
credible, and stops at the first one whose length is not.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from kafka.errors import CorruptRecordError, UnsupportedCodecError
from kafka.record.util import calc_crc32c

from detectors.envelope import (
    INT64_MAX,
    MAX_TS_MS,
    DeadLetter,
    DeadLetterClass,
    Envelope,
    envelope_or_dead_letter,
)
from detectors.lines import DEFAULT_MAX_RECORD_BYTES
from detectors.metadata_configs import redacted
from detectors.quorum import KRAFT_VOTERS, LEADER_CHANGE
from producers.metadata_records import (
    CONTROL_TYPE_NAMES,
    ReadAsOlder,
    RecordError,
    Unreadable,
    control_type,
    decode_control_value,
    decode_metadata_value,
)
from producers.record_batch import RecordBatch

LOG_OVERHEAD = 12  # Records.LOG_OVERHEAD: baseOffset int64 + length int32
HEADER_SIZE_UP_TO_MAGIC = 17  # Records.HEADER_SIZE_UP_TO_MAGIC
# DefaultRecordBatch.RECORD_BATCH_OVERHEAD less LOG_OVERHEAD: the smallest length a v2 batch can have.
MIN_BATCH_LENGTH = 61 - LOG_OVERHEAD
MAGIC = 2
# Where lastOffsetDelta sits: after baseOffset, length, partitionLeaderEpoch, magic, crc, attributes.
LAST_OFFSET_DELTA_AT = 8 + 4 + 4 + 1 + 4 + 2
_LENGTH = struct.Struct(">qi")
UNKNOWN_CONTROL = "UNKNOWN"


@dataclass
class MetadataLogStats:
    """Counters over one or more files. Every record of a batch that was read
    is exactly one of: an envelope (``records``), a dead letter, a control
    record (``control_records_by_type``, LeaderChange of a segment excepted: it
    is an envelope) or a record without a schema here (``unread_by_type``). A
    batch that cannot be read is one dead letter. Of the envelopes,
    ``read_as_older_by_type`` counts the records of a version newer than its
    schema here, read by the fields of the newest one
    (:class:`producers.metadata_records.ReadAsOlder`)."""

    files: int = 0
    batches: int = 0
    records: int = 0
    dead_letters: int = 0
    records_by_type: dict[str, int] = field(default_factory=dict)
    control_records_by_type: dict[str, int] = field(default_factory=dict)
    unread_by_type: dict[str, int] = field(default_factory=dict)
    read_as_older_by_type: dict[str, int] = field(default_factory=dict)

    @property
    def control_records(self) -> int:
        return sum(self.control_records_by_type.values())

    @property
    def unread(self) -> int:
        return sum(self.unread_by_type.values())

    @property
    def read_as_older(self) -> int:
        return sum(self.read_as_older_by_type.values())


def _count(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


def is_snapshot(path: str) -> bool:
    """Whether ``path`` names a snapshot (``.checkpoint``) rather than a segment."""
    return path.endswith(".checkpoint")


@dataclass(frozen=True, slots=True)
class Frame:
    """One whole batch: where it starts in its file and its bytes (length prefix included)."""

    position: int
    data: bytes

    @property
    def end(self) -> int:
        return self.position + len(self.data)

    @property
    def last_offset(self) -> int:
        """baseOffset + lastOffsetDelta, from the batch header (DefaultRecordBatch)."""
        base = struct.unpack_from(">q", self.data, 0)[0]
        delta = struct.unpack_from(">i", self.data, LAST_OFFSET_DELTA_AT)[0]
        return int(base + delta)


@dataclass(frozen=True, slots=True)
class Incomplete:
    """A batch of which only ``have`` bytes are in the file so far (``need``
    in all, None when even its length prefix is incomplete)."""

    position: int
    have: int
    need: int | None


@dataclass(frozen=True, slots=True)
class Oversized:
    """A batch longer than the reader's limit: skipped unread."""

    position: int
    need: int


@dataclass(frozen=True, slots=True)
class Broken:
    """A length prefix or magic byte no batch can have: nothing after it can be placed."""

    position: int
    reason: str


Framed = Frame | Incomplete | Oversized | Broken


def frames(
    buffer: Any, start: int = 0, base: int = 0, max_batch_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> Iterator[Framed]:
    """The batches of ``buffer[start:]`` (bytes or mmap; ``base`` is the file
    position of ``buffer[0]``), as ``FileLogInputStream.nextBatch`` finds them:
    a batch is whole when its length prefix's bytes are all there. Ends after
    the last whole batch, with an :class:`Incomplete` for a tail that is not
    one, or at the first :class:`Broken` prefix. A batch over
    ``max_batch_bytes`` is :class:`Oversized` (Kafka's metadata batches stay
    under 8 MiB: ``KafkaRaftClient.MAX_BATCH_SIZE_BYTES``)."""
    end = len(buffer)
    pos = start
    while pos < end:
        have = end - pos
        if have < HEADER_SIZE_UP_TO_MAGIC:
            yield Incomplete(base + pos, have, None)
            return
        _, length = _LENGTH.unpack_from(buffer, pos)
        magic = buffer[pos + HEADER_SIZE_UP_TO_MAGIC - 1]
        if magic != MAGIC:
            yield Broken(base + pos, f"magic byte {magic}, not {MAGIC} (record batch v2)")
            return
        if length < MIN_BATCH_LENGTH:
            yield Broken(base + pos, f"batch length {length} is below the minimum {MIN_BATCH_LENGTH}")
            return
        need = LOG_OVERHEAD + length
        if need > max_batch_bytes:
            yield Oversized(base + pos, need)
            pos += need
            continue
        if have < need:
            yield Incomplete(base + pos, have, need)
            return
        yield Frame(base + pos, bytes(buffer[pos : pos + need]))
        pos += need


@dataclass(frozen=True, slots=True)
class CheckedBatch:
    """A whole batch opened by kafka-python and its CRC checked, once: why it
    fails (``DefaultRecordBatch.ensureValid``), or None."""

    frame: Frame
    batch: RecordBatch
    problem: str | None


def check(frame: Frame) -> CheckedBatch:
    """``frame``'s batch, its CRC checked."""
    batch = RecordBatch(frame.data)
    if batch.validate_crc():
        return CheckedBatch(frame, batch, None)
    computed = calc_crc32c(memoryview(frame.data)[RecordBatch.ATTRIBUTES_OFFSET :])
    problem = f"record batch is corrupt: stored crc {batch.crc}, computed crc {computed}"
    return CheckedBatch(frame, batch, problem)


class MetadataLogFile:
    """Turns the batches of one file into envelopes and dead letters.

    path: the file, named in every position (``FILE:BYTE``); a ``.checkpoint``
        name makes it a snapshot.
    """

    def __init__(self, path: str, *, cluster: str, node: int | None, stats: MetadataLogStats) -> None:
        self.path = path
        self.cluster = cluster
        self.node = node
        self.stats = stats
        self.snapshot = is_snapshot(path)
        self.snapshot_ts_ms: int | None = None  # SnapshotHeader.lastContainedLogTimestamp
        self._seq = 0
        # Whether the cluster and node make valid envelopes: then only a
        # record's time and offset are left to check (see _envelope).
        probe: dict[str, Any] = {
            "cluster": cluster,
            "node": node,
            "ts_ms": 0,
            "kind": "metadata",
            "offset": None,
            "body": {},
        }
        self._valid_source = isinstance(envelope_or_dead_letter(probe, path, 0, ""), Envelope)

    def batch(self, checked: CheckedBatch) -> Iterator[Envelope | DeadLetter]:
        """The envelopes and dead letters of one whole batch."""
        self.stats.batches += 1
        position = f"{self.path}:{checked.frame.position}"
        if checked.problem is not None:
            yield self._dead(position, checked.problem, checked.frame)
            return
        batch = checked.batch
        try:
            if batch.is_control_batch:
                # kafka-python's ControlRecord reads the key's type, and refuses a key too short for one.
                for record in batch:
                    item = self._record(batch, record, position)
                    if item is not None:
                        yield item
            else:
                yield from self._metadata_records(batch, position)
        except (CorruptRecordError, UnsupportedCodecError, TypeError, struct.error) as exc:
            # TypeError, struct.error: kafka-python's ControlRecord unpacks a
            # control record's key, which a damaged batch may lack or cut short.
            yield self._dead(position, f"record batch cannot be read: {exc!r}", checked.frame)

    def incomplete(self, tail: Incomplete) -> DeadLetter:
        """A dead letter for a file that ends inside a batch."""
        wanted = "its length prefix" if tail.need is None else f"a batch of {tail.need} bytes"
        reason = f"truncated record batch: the file ends {tail.have} bytes into {wanted}"
        return self._dead(f"{self.path}:{tail.position}", reason)

    def oversized(self, batch: Oversized) -> DeadLetter:
        """A dead letter for a batch over the size limit, skipped unread."""
        self.stats.dead_letters += 1
        reason = f"record batch of {batch.need} bytes is over the limit (--max-record-bytes): skipped"
        return DeadLetter(f"{self.path}:{batch.position}", reason, "", kind=DeadLetterClass.TOO_LARGE)

    def framed(self, item: Framed) -> Iterator[Envelope | DeadLetter]:
        """What one item of :func:`frames` gives, at the end of a file that is not being written."""
        if isinstance(item, Frame):
            yield from self.batch(check(item))
        elif isinstance(item, Incomplete):
            yield self.incomplete(item)
        elif isinstance(item, Oversized):
            yield self.oversized(item)
        else:
            yield self.broken(item)

    def broken(self, broken: Broken) -> DeadLetter:
        """A dead letter for a batch prefix that cannot be framed; the rest of the file is not read."""
        reason = f"not a record batch: {broken.reason}; the rest of the file is not read"
        return self._dead(f"{self.path}:{broken.position}", reason)

    def _dead(self, position: str, reason: str, frame: Frame | None = None) -> DeadLetter:
        self.stats.dead_letters += 1
        raw = frame.data[: LOG_OVERHEAD + HEADER_SIZE_UP_TO_MAGIC].hex() if frame is not None else ""
        return DeadLetter(position, reason, raw, kind=DeadLetterClass.INVALID)

    def _metadata_records(self, batch: RecordBatch, position: str) -> Iterator[Envelope | DeadLetter]:
        """The records of a batch that is not a control batch: the hot path."""
        unread = self.stats.unread_by_type
        for offset, ts_ms, _, value, _ in batch.records():
            try:
                decoded = decode_metadata_value(value or b"")
            except RecordError as exc:
                yield self._dead(position, f"record at offset {offset}: {exc}")
                continue
            if isinstance(decoded, Unreadable):
                _count(unread, decoded.name)
                continue
            if isinstance(decoded, ReadAsOlder):
                _count(self.stats.read_as_older_by_type, decoded.name)
                decoded = decoded.body
            yield self._envelope(redacted(decoded), ts_ms, offset, position)

    def _record(self, batch: RecordBatch, record: Any, position: str) -> Envelope | DeadLetter | None:
        """A record of a control batch: a LeaderChange of a segment is an envelope."""
        try:
            body = self._control(batch, record)
        except RecordError as exc:
            return self._dead(position, f"record at offset {record.offset}: {exc}")
        if body is None:
            return None
        return self._envelope(body, record.timestamp, record.offset, position)

    def _control(self, batch: RecordBatch, record: Any) -> dict[str, Any] | None:
        """The body of a LeaderChange of a segment or of a KRaftVoters; None
        (counted) for every other control record."""
        type_id = control_type(record.key)
        name = CONTROL_TYPE_NAMES.get(type_id, UNKNOWN_CONTROL)
        message = decode_control_value(type_id, record.value)
        if message is not None and (name == KRAFT_VOTERS or (name == LEADER_CHANGE and not self.snapshot)):
            return {"type": name, "partitionLeaderEpoch": batch.leader_epoch, "data": message}
        _count(self.stats.control_records_by_type, name)
        if name == "SNAPSHOT_HEADER" and message is not None:
            self.snapshot_ts_ms = message.get("lastContainedLogTimestamp")
        return None

    def _envelope(
        self, body: dict[str, Any], ts_ms: int, record_offset: int, position: str
    ) -> Envelope | DeadLetter:
        offset: int | None = record_offset
        if self.snapshot:
            offset = None
            if self.snapshot_ts_ms is not None and self.snapshot_ts_ms > 0:
                ts_ms = self.snapshot_ts_ms
        if ts_ms < 0:
            self.stats.dead_letters += 1
            reason = f"record at offset {record_offset} has no usable timestamp ({ts_ms})"
            return DeadLetter(position, reason, "", kind=DeadLetterClass.NO_TIMESTAMP)
        if self._valid_source and ts_ms <= MAX_TS_MS and (offset is None or -1 <= offset <= INT64_MAX):
            # What envelope_or_dead_letter would check of the rest holds by
            # construction: a decoded body is a dict, the kind is "metadata".
            env = Envelope(self.cluster, self.node, ts_ms, "metadata", offset, body, position, self._seq)
            self._seq += 1
            self.stats.records += 1
            _count(self.stats.records_by_type, body["type"])
            return env
        obj = {
            "cluster": self.cluster,
            "node": self.node,
            "ts_ms": ts_ms,
            "kind": "metadata",
            "offset": offset,
            "body": body,
        }
        item = envelope_or_dead_letter(obj, position, self._seq, "")
        if isinstance(item, Envelope):
            self._seq += 1
            self.stats.records += 1
            _count(self.stats.records_by_type, body["type"])
        else:
            self.stats.dead_letters += 1
        return item


def iter_metadata_log_file(
    path: str,
    *,
    cluster: str,
    node: int | None = None,
    stats: MetadataLogStats | None = None,
    max_batch_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Generator[Envelope | DeadLetter, None, None]:
    """Every envelope and dead letter of one segment or snapshot file, in file
    order; a file that ends inside a batch ends with a dead letter for it.
    Raises OSError for a file that cannot be opened."""
    counts = stats if stats is not None else MetadataLogStats()
    reader = MetadataLogFile(path, cluster=cluster, node=node, stats=counts)
    with open(path, "rb") as f:
        counts.files += 1
        if os.fstat(f.fileno()).st_size == 0:
            return  # an active segment just rolled to: nothing yet
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for item in frames(data, max_batch_bytes=max_batch_bytes):
                yield from reader.framed(item)
