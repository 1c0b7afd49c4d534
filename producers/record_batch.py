"""The records of a record batch v2, read over the batch's bytes.

kafka-python's ``DefaultRecordBatch`` still does the batch: its header, its
CRC-32C check and its decompression. Its records are read here, because
kafka-python's ``_read_msg`` builds a ``DefaultRecord`` with a headers list
for each and reads every field through a generic varint call, which took
about 10 of the 24 microseconds a metadata record cost (issue 24 asks for
50,000 records per second). The format is Kafka's ``DefaultRecord.readFrom``:

    length: varint, attributes: int8, timestampDelta: varlong, offsetDelta: varint,
    keyLength: varint, key, valueLength: varint, value,
    headers count: varint, then each header: keyLength: varint, key (UTF-8), valueLength: varint, value

Varints are zigzag-encoded (``ByteUtils.readVarint``/``readVarlong``); a
negative key, value or header-value length is null. A record whose fields do
not fill its length, and a batch whose records do not fill it, are corrupt,
with kafka-python's messages (``CorruptRecordError``).
"""

from __future__ import annotations

from collections.abc import Iterator

from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.util import decode_varint

# offset, timestamp (ms), key, value, headers (key, value)
RecordTuple = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]
_NO_HEADERS: tuple[tuple[str, bytes | None], ...] = ()
_SMALL = [(b >> 1) ^ -(b & 1) for b in range(0x80)]  # the value of each one-byte varint


def _long_varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint or varlong of more than one byte at ``pos``, and where it
    ends: two bytes (a length up to 8 KiB, an offset delta up to 8,191) read at
    once, longer ones by kafka-python's ``decode_varint``."""
    second = data[pos + 1]
    if second < 0x80:
        value = (data[pos] & 0x7F) | second << 7
        return (value >> 1) ^ -(value & 1), pos + 2
    return decode_varint(data, pos)


def _headers(data: bytes, pos: int, count: int) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    """A record's ``count`` headers at ``pos``, and where they end."""
    if count < 0:
        raise CorruptRecordError(f"Found invalid number of record headers {count}")
    headers = []
    for _ in range(count):
        key_length, pos = decode_varint(data, pos)
        if key_length < 0:
            raise CorruptRecordError(f"Invalid negative header key size {key_length}")
        key = data[pos : pos + key_length].decode("utf-8")
        pos += key_length
        value_length, pos = decode_varint(data, pos)
        value = None
        if value_length >= 0:
            value = data[pos : pos + value_length]
            pos += value_length
        headers.append((key, value))
    return tuple(headers), pos


def read_records(
    data: bytes, pos: int, count: int, base_offset: int, base_timestamp: int, log_append_time: int | None
) -> Iterator[RecordTuple]:
    """The ``count`` records in ``data[pos:]``, which they must fill.
    ``log_append_time``: the batch's max timestamp when its timestamp type is
    LogAppendTime, which is then every record's time."""
    end = len(data)
    varint, small = _long_varint, _SMALL
    for _ in range(count):
        try:
            # Each varint: one byte read in place (most are), else _long_varint.
            length, pos = (small[b], pos + 1) if (b := data[pos]) < 0x80 else varint(data, pos)
            start = pos
            pos += 1  # attributes: unused since magic 2
            timestamp_delta, pos = (small[b], pos + 1) if (b := data[pos]) < 0x80 else varint(data, pos)
            offset_delta, pos = (small[b], pos + 1) if (b := data[pos]) < 0x80 else varint(data, pos)
            key_length, pos = (small[b], pos + 1) if (b := data[pos]) < 0x80 else varint(data, pos)
            key = None
            if key_length >= 0:
                key = data[pos : pos + key_length]
                pos += key_length
            value_length, pos = (small[b], pos + 1) if (b := data[pos]) < 0x80 else varint(data, pos)
            value = None
            if value_length >= 0:
                value = data[pos : pos + value_length]
                pos += value_length
            header_count, pos = (small[b], pos + 1) if (b := data[pos]) < 0x80 else varint(data, pos)
            headers = _NO_HEADERS
            if header_count:
                headers, pos = _headers(data, pos, header_count)
        except (ValueError, IndexError) as err:  # a varint or UTF-8 key cut short or broken
            raise CorruptRecordError(f"Found invalid record structure: {err!r}") from None
        if pos - start != length:
            raise CorruptRecordError(
                f"Invalid record size: expected to read {length} bytes in record payload, "
                f"but instead read {pos - start}"
            )
        timestamp = base_timestamp + timestamp_delta if log_append_time is None else log_append_time
        yield base_offset + offset_delta, timestamp, key, value, headers
    if pos != end:
        raise CorruptRecordError(f"{end - pos} unconsumed bytes after all records consumed")


class RecordBatch(DefaultRecordBatch):
    """kafka-python's batch v2, whose records :meth:`records` reads (see the module doc)."""

    __slots__ = ()

    def records(self) -> Iterator[RecordTuple]:
        """The batch's records, decompressed by kafka-python first. Check the
        CRC (``validate_crc``) before: kafka-python checks it on the compressed bytes."""
        self._maybe_uncompress()
        log_append_time = self.max_timestamp if self.timestamp_type == self.LOG_APPEND_TIME else None
        return read_records(
            bytes(self._buffer),  # slices of bytes are the values, with no second copy
            self._pos,
            self.records_count,
            self.base_offset,
            self.first_timestamp,
            log_append_time,
        )
