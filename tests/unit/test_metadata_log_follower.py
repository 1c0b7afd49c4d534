"""Following a live ``__cluster_metadata-0`` directory (producers/metadata_log_follower.py),
without a broker: a scripted writer acts whenever the follower waits."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from metadata_log_files import Batch, LogFile, Record, batch_bytes, segment_name, snapshot_name

from detectors.envelope import DeadLetter, Envelope
from producers.metadata_log_follower import LogPosition, MetadataLogFollower

T0 = 1795169580000


def noop_batch(offset: int, count: int = 1, epoch: int = 1) -> Batch:
    noop = {"type": "NO_OP_RECORD", "version": 0, "data": {}}
    records = [Record(T0 + offset + i, noop) for i in range(count)]
    return Batch(offset, epoch, records)


def topic_batch(offset: int, name: str) -> Batch:
    data = {"name": name, "topicId": "qG8hUlWTTJ2eRb_bFvWRXg"}
    return Batch(offset, 1, [Record(T0 + offset, {"type": "TOPIC_RECORD", "version": 0, "data": data})])


def snapshot_file(end_offset: int, names: list[str]) -> LogFile:
    last_ts_ms = T0 + end_offset - 1
    header = Record(T0, {"version": 0, "lastContainedLogTimestamp": last_ts_ms}, control="SNAPSHOT_HEADER")
    data = {"topicId": "qG8hUlWTTJ2eRb_bFvWRXg"}
    records = [Record(T0, {"type": "TOPIC_RECORD", "version": 0, "data": {"name": n, **data}}) for n in names]
    footer = Record(T0, {"version": 0}, control="SNAPSHOT_FOOTER")
    batches = [Batch(0, 1, [header]), Batch(1, 1, records), Batch(1 + len(names), 1, [footer])]
    return LogFile(snapshot_name(end_offset, 1), batches, snapshot_end=end_offset)


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def follow(
    directory: Path, steps: list[Callable[[], None]], start: LogPosition | None = None, **kwargs
) -> tuple[list[Envelope | DeadLetter | LogPosition], MetadataLogFollower]:
    """Run a follower; each time it waits, the next step runs; after the last, it stops."""
    pending = list(steps)
    follower: MetadataLogFollower

    def sleep(_: float) -> None:
        if pending:
            pending.pop(0)()
        else:
            follower.stop()

    follower = MetadataLogFollower(str(directory), cluster="c1", node=1, start=start, sleep=sleep, **kwargs)
    return list(follower.items()), follower


def offsets(items: list) -> list[int | None]:
    return [i.offset for i in items if isinstance(i, Envelope)]


def test_a_growing_segment_is_published_as_it_grows_and_a_torn_tail_is_waited_for(tmp_path):
    segment = tmp_path / segment_name(0)
    segment.write_bytes(batch_bytes(noop_batch(0, 2)))
    third = batch_bytes(noop_batch(2))
    steps = [
        lambda: append(segment, third[:20]),  # a torn tail: waited for, no dead letter
        lambda: append(segment, third[20:]),
        lambda: append(segment, batch_bytes(noop_batch(3, 3))),
    ]
    items, follower = follow(tmp_path, steps)
    assert offsets(items) == [0, 1, 2, 3, 4, 5]
    assert not [i for i in items if isinstance(i, DeadLetter)]
    assert follower.follow.waits_on_tail >= 1
    assert follower.position == LogPosition(6, 0, segment.stat().st_size)


def test_a_roll_moves_to_the_new_segment_after_the_old_ones_end(tmp_path):
    first = tmp_path / segment_name(0)
    first.write_bytes(batch_bytes(noop_batch(0, 2)))
    second = tmp_path / segment_name(3)
    steps = [
        lambda: append(first, batch_bytes(noop_batch(2))),
        lambda: second.write_bytes(batch_bytes(noop_batch(3, 2))),
        lambda: append(second, batch_bytes(noop_batch(5))),
    ]
    items, follower = follow(tmp_path, steps)
    assert offsets(items) == [0, 1, 2, 3, 4, 5]
    assert follower.follow.segments == 2


def test_it_starts_at_the_newest_snapshot_and_the_segment_after_it(tmp_path):
    (tmp_path / snapshot_file(2, ["old"]).name).write_bytes(snapshot_file(2, ["old"]).to_bytes())
    newest = snapshot_file(4, ["orders", "payments"])
    (tmp_path / newest.name).write_bytes(newest.to_bytes())
    (tmp_path / segment_name(2)).write_bytes(batch_bytes(noop_batch(2, 4)))
    (tmp_path / (snapshot_name(9, 1) + ".part")).write_bytes(b"unfinished")  # never read
    items, follower = follow(tmp_path, [])
    envelopes = [i for i in items if isinstance(i, Envelope)]
    assert [(e.offset, e.body["data"].get("name")) for e in envelopes] == [
        (None, "orders"),
        (None, "payments"),
        (4, None),
        (5, None),
    ]
    assert all(e.ts_ms == T0 + 3 for e in envelopes[:2])  # lastContainedLogTimestamp
    assert follower.follow.snapshots == [str(tmp_path / newest.name)]


def test_deleted_segments_are_replaced_by_the_newest_snapshot_without_repeats(tmp_path):
    first = tmp_path / segment_name(0)
    first.write_bytes(batch_bytes(noop_batch(0, 2)))
    snap = snapshot_file(5, ["orders"])

    def retention() -> None:
        # Kafka: the old segments roll, a snapshot at 5 is taken, the segments below it are deleted.
        (tmp_path / segment_name(5)).write_bytes(batch_bytes(noop_batch(5, 2)))
        (tmp_path / snap.name).write_bytes(snap.to_bytes())
        first.unlink()

    items, follower = follow(tmp_path, [retention])
    assert offsets(items) == [0, 1, None, 5, 6]
    assert follower.follow.snapshots == [str(tmp_path / snap.name)]


def test_a_restart_resumes_at_its_position_and_publishes_nothing_twice(tmp_path):
    segment = tmp_path / segment_name(0)
    segment.write_bytes(batch_bytes(noop_batch(0, 3)) + batch_bytes(noop_batch(3, 2)))
    first, follower = follow(tmp_path, [], once=True)
    saved = follower.position
    assert offsets(first) == [0, 1, 2, 3, 4]
    append(segment, batch_bytes(noop_batch(5)))
    again, _ = follow(tmp_path, [], start=saved, once=True)
    assert offsets(again) == [5]
    # A position inside a batch (saved before its last records were confirmed)
    # re-reads the batch and publishes only what is past it.
    partial, follower = follow(tmp_path, [], start=LogPosition(2, 0, 0), once=True)
    assert offsets(partial) == [2, 3, 4, 5]
    assert follower.follow.already_published == 2


def test_a_restart_whose_segment_is_gone_takes_the_snapshot(tmp_path):
    snap = snapshot_file(10, ["orders"])
    (tmp_path / snap.name).write_bytes(snap.to_bytes())
    (tmp_path / segment_name(10)).write_bytes(batch_bytes(noop_batch(10, 2)))
    items, _ = follow(tmp_path, [], start=LogPosition(4, 0, 900), once=True)
    assert offsets(items) == [None, 10, 11]


def test_a_corrupt_batch_is_a_dead_letter_and_the_next_one_is_read(tmp_path):
    segment = tmp_path / segment_name(0)
    bad = bytearray(batch_bytes(topic_batch(1, "orders")))
    bad[-3] ^= 0x55
    segment.write_bytes(batch_bytes(noop_batch(0)) + bytes(bad) + batch_bytes(noop_batch(2)))
    items, _ = follow(tmp_path, [], once=True)
    letters = [i for i in items if isinstance(i, DeadLetter)]
    assert [(d.position, d.reason.split(":")[0]) for d in letters] == [
        (f"{segment}:{len(batch_bytes(noop_batch(0)))}", "record batch is corrupt")
    ]
    assert offsets(items) == [0, 2]


def test_a_damaged_batch_at_the_active_end_is_waited_on_then_a_dead_letter(tmp_path):
    segment = tmp_path / segment_name(0)
    bad = bytearray(batch_bytes(noop_batch(1)))
    bad[-1] ^= 0x01
    segment.write_bytes(batch_bytes(noop_batch(0)) + bytes(bad))
    now = [0.0]
    follower: MetadataLogFollower

    def sleep(seconds: float) -> None:
        now[0] += 0.6
        if now[0] > 3:
            follower.stop()

    follower = MetadataLogFollower(
        str(tmp_path), cluster="c1", node=1, sleep=sleep, clock=lambda: now[0], damaged_tail_seconds=1.0
    )
    seen = [(now[0], item) for item in follower.items() if not isinstance(item, LogPosition)]
    assert [(at, type(item).__name__) for at, item in seen] == [(0.0, "Envelope"), (1.2, "DeadLetter")]
    assert seen[1][1].reason.startswith("record batch is corrupt")  # type: ignore[union-attr]
    assert follower.position == LogPosition(2, 0, segment.stat().st_size)


def test_a_torn_tail_of_a_rolled_segment_is_a_dead_letter(tmp_path):
    first = tmp_path / segment_name(0)
    torn = batch_bytes(noop_batch(1))[:30]
    first.write_bytes(batch_bytes(noop_batch(0)) + torn)
    (tmp_path / segment_name(1)).write_bytes(batch_bytes(noop_batch(1)))
    items, _ = follow(tmp_path, [], once=True)
    letters = [i for i in items if isinstance(i, DeadLetter)]
    assert len(letters) == 1 and letters[0].reason.startswith("truncated record batch")
    assert offsets(items) == [0, 1]


def test_an_empty_directory_is_waited_on(tmp_path):
    steps = [lambda: (tmp_path / segment_name(0)).write_bytes(batch_bytes(noop_batch(0, 2)))]
    items, _ = follow(tmp_path, steps)
    assert offsets(items) == [0, 1]


def test_a_segment_is_read_in_windows_never_whole(tmp_path, monkeypatch):
    from producers import metadata_log_follower

    monkeypatch.setattr(metadata_log_follower, "READ_BYTES", 1)
    one = len(batch_bytes(noop_batch(0)))
    segment = tmp_path / segment_name(0)
    segment.write_bytes(b"".join(batch_bytes(noop_batch(i)) for i in range(10)))
    reads: list[int] = []
    real_pread = os.pread

    def pread(fd: int, length: int, offset: int) -> bytes:
        reads.append(length)
        return real_pread(fd, length, offset)

    monkeypatch.setattr(metadata_log_follower.os, "pread", pread)
    items, _ = follow(tmp_path, [], once=True, max_batch_bytes=int(one * 2.5))
    assert offsets(items) == list(range(10))
    assert max(reads) == int(one * 2.5) and len(reads) >= 5
    # A batch over the limit is a dead letter, skipped; the next one is read.
    big = tmp_path / "big"
    big.mkdir()
    (big / segment_name(0)).write_bytes(batch_bytes(noop_batch(0, 5)) + batch_bytes(noop_batch(5)))
    items, _ = follow(big, [], once=True, max_batch_bytes=one + 10)
    letters = [i for i in items if isinstance(i, DeadLetter)]
    assert [d.reason.split(" is ")[0] for d in letters] == [
        f"record batch of {len(batch_bytes(noop_batch(0, 5)))} bytes"
    ]
    assert offsets(items) == [5]


def test_a_stop_inside_a_snapshot_leaves_no_position_past_it(tmp_path):
    snap = snapshot_file(7, ["a", "b", "c"])
    snap.batches[1:2] = [Batch(1 + i, 1, [r]) for i, r in enumerate(snap.batches[1].records)]
    (tmp_path / snap.name).write_bytes(snap.to_bytes())
    (tmp_path / segment_name(7)).write_bytes(batch_bytes(noop_batch(7)))
    follower = MetadataLogFollower(str(tmp_path), cluster="c1", node=1)
    items = follower.items()
    first = next(items)
    follower.stop()
    rest = list(items)
    assert isinstance(first, Envelope) and first.body["data"]["name"] == "a"
    assert not [i for i in rest if isinstance(i, LogPosition | Envelope)]


def test_a_segment_that_ends_short_of_the_next_ones_base_offset_is_left_for_it(tmp_path):
    (tmp_path / segment_name(0)).write_bytes(batch_bytes(noop_batch(0, 2)))
    steps = [lambda: (tmp_path / segment_name(5)).write_bytes(batch_bytes(noop_batch(5, 2)))]
    items, follower = follow(tmp_path, steps)
    assert offsets(items) == [0, 1, 5, 6]
    assert follower.position.segment == 5
