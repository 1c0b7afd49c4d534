"""producers/record_batch.py reads a batch's records as kafka-python does.

Every batch is built by kafka-python's ``DefaultRecordBatchBuilder``, then
read both by kafka-python's ``DefaultRecordBatch`` iteration and by
``RecordBatch.records``: the records must be the same, and a batch whose
records are broken must fail both ways with the same message.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c
from metadata_log_files import Batch, Record, batch_bytes, segment_name

from detectors.envelope import DeadLetter, Envelope
from producers.metadata_log import iter_metadata_log_file
from producers.record_batch import RecordBatch

T0 = 1_795_169_580_000
CODECS = [
    DefaultRecordBatch.CODEC_NONE,
    DefaultRecordBatch.CODEC_GZIP,
    DefaultRecordBatch.CODEC_SNAPPY,
    DefaultRecordBatch.CODEC_LZ4,
    DefaultRecordBatch.CODEC_ZSTD,
]
# (offset delta, timestamp, key, value, headers): null keys and values, empty
# ones, headers with null values, negative offset and timestamp deltas, and
# lengths and deltas whose varints take one, two, three and more bytes.
FIRST_RECORD = DefaultRecordBatch.HEADER_STRUCT.size  # where an uncompressed batch's records start
RECORDS: list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = [
    (0, T0, None, b"\x01\x03\x00\x00", []),
    (1, T0 - 1, b"k", None, []),
    (2, T0 + 63_000, None, None, [("h", b"v")]),
    (-3, T0 - 10**12, b"", b"", [("a", None), ("\u00e9t\u00e9", b""), ("b" * 70, b"x" * 200)]),
    (64, T0 + 1, b"k" * 64, b"v" * 20_000, []),
    (8_191, T0 + 2**40, None, b"\x00" * 100, [("only", None)]),
    (70_000, T0, b"\xff" * 3, b"w", []),
]


def built(codec: int, records: list[Any] = RECORDS, *, log_append_time: bool = False) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for delta, ts_ms, key, value, headers in records:
        builder.append(delta, timestamp=ts_ms, key=key, value=value, headers=headers)
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, 5_000)  # the base offset, as the leader sets it
    if log_append_time:
        at = DefaultRecordBatch.ATTRIBUTES_OFFSET
        attributes = struct.unpack_from(">h", data, at)[0]
        struct.pack_into(">h", data, at, attributes | DefaultRecordBatch.TIMESTAMP_TYPE_MASK)
        struct.pack_into(">q", data, at + 2 + 4 + 8, T0 + 77)  # MaxTimestamp: every record's time
    crc = calc_crc32c(memoryview(data)[DefaultRecordBatch.ATTRIBUTES_OFFSET :])
    struct.pack_into(">I", data, DefaultRecordBatch.CRC_OFFSET, crc)
    return bytes(data)


def kafka_python_records(data: bytes) -> list[tuple[Any, ...]]:
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in DefaultRecordBatch(data)]


def our_records(data: bytes) -> list[tuple[Any, ...]]:
    batch = RecordBatch(data)
    assert batch.validate_crc()
    return [(offset, ts, key, value, list(headers)) for offset, ts, key, value, headers in batch.records()]


@pytest.mark.parametrize("codec", CODECS)
def test_the_records_are_kafka_pythons_in_every_codec(codec):
    data = built(codec)
    expected = kafka_python_records(data)
    assert [r[0] for r in expected] == [5_000 + r[0] for r in RECORDS]
    assert our_records(data) == expected


def test_log_append_time_is_every_records_time():
    data = built(DefaultRecordBatch.CODEC_NONE, log_append_time=True)
    records = our_records(data)
    assert records == kafka_python_records(data)
    assert {r[1] for r in records} == {T0 + 77}


@pytest.mark.parametrize(
    "damage",
    [
        "a record length one too long",
        "a record cut short by the batch end",
        "a byte after the last record",
        "a negative header count",
        "a varint that never ends",
    ],
)
def test_broken_records_fail_as_in_kafka_python(damage):
    data = bytearray(built(DefaultRecordBatch.CODEC_NONE, RECORDS[:2]))  # the last without headers
    first = FIRST_RECORD
    if damage == "a record length one too long":
        data[first] += 2  # zigzag: +1
    elif damage == "a record cut short by the batch end":
        data = data[:-3]
    elif damage == "a byte after the last record":
        data += b"\x00"
    elif damage == "a negative header count":
        data[-1] = 0x01  # the last record's header count: -1
    else:
        data[first] = 0xFF
        data[first + 1 : first + 12] = b"\xff" * 11
    struct.pack_into(">i", data, 8, len(data) - 12)
    with pytest.raises(CorruptRecordError) as theirs:
        kafka_python_records(bytes(data))
    with pytest.raises(CorruptRecordError) as ours:
        list(RecordBatch(bytes(data)).records())
    # Python words an IndexError after the buffer's type: kafka-python reads a bytearray, we read bytes.
    assert str(ours.value) == str(theirs.value).replace("bytearray index", "index")


def test_a_batch_whose_records_are_broken_is_a_dead_letter_with_its_file_and_byte(tmp_path):
    noop = Record(T0, {"type": "NO_OP_RECORD", "version": 0, "data": {}})
    good = batch_bytes(Batch(0, 1, [noop]))
    broken = bytearray(batch_bytes(Batch(1, 1, [noop, noop])))
    broken[FIRST_RECORD] += 2  # the first record's length: one too long
    crc = calc_crc32c(memoryview(broken)[DefaultRecordBatch.ATTRIBUTES_OFFSET :])
    struct.pack_into(">I", broken, DefaultRecordBatch.CRC_OFFSET, crc)  # the CRC holds
    path = tmp_path / segment_name(0)
    path.write_bytes(good + bytes(broken) + batch_bytes(Batch(3, 1, [noop])))
    items = list(iter_metadata_log_file(str(path), cluster="c1"))
    assert [type(i) for i in items] == [Envelope, DeadLetter, Envelope]
    letter = items[1]
    assert isinstance(letter, DeadLetter)
    assert letter.position == f"{path}:{len(good)}"
    assert letter.reason.startswith("record batch cannot be read: CorruptRecordError(")
