"""Follow a live ``__cluster_metadata-0`` directory, record by record, once.

Where it starts: at a saved :class:`LogPosition`, else at the newest snapshot
(its records, then the log from its end offset), else at the first segment.
It then reads the segment holding the next offset as Kafka appends to it: a
batch is taken when all the bytes its length prefix announces are there and
its CRC holds (``FileLogInputStream``, ``DefaultRecordBatch.ensureValid``); a
tail that is not yet whole is waited for, not reported, while the segment is
the active one (Kafka appends a batch with one write, so the rest is coming).
When a newer segment appears (Kafka rolled), the old one is read to its end
and the newer one followed. When the segments holding the next offset are gone
(retention deleted them after a snapshot), the newest snapshot is read if it
ends past that offset, and the log followed from there. Records whose offset
was published already are skipped, so re-reading a stretch publishes nothing
twice.

What it yields, in log order: envelopes and dead letters of each batch, then a
:class:`LogPosition` saying that everything before it is done (the shipper
saves it once its records are delivered).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from detectors.envelope import DeadLetter, Envelope
from producers.metadata_log import (
    Frame,
    Incomplete,
    MetadataLogFile,
    MetadataLogStats,
    Oversized,
    check,
    frames,
    iter_metadata_log_file,
)
from producers.metadata_log_dir import SegmentFile, newest_snapshot, segment_holding, segments

READ_BYTES = 8 * 1024 * 1024  # read at most this much of a segment per look (more for one bigger batch)


@dataclass(frozen=True)
class LogPosition:
    """Where the follower is: every record below ``next_offset`` is done; the
    segment with base offset ``segment`` (None before the first) is read up to
    byte ``byte``."""

    next_offset: int
    segment: int | None = None
    byte: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"next_offset": self.next_offset, "segment": self.segment, "byte": self.byte}


Item = Envelope | DeadLetter | LogPosition  # what the follower yields


@dataclass
class FollowStats:
    """What the follower did beyond what :class:`MetadataLogStats` counts."""

    snapshots: list[str] = field(default_factory=list)  # read, in order
    segments: int = 0  # opened
    already_published: int = 0  # records skipped by offset
    waits_on_tail: int = 0  # looks that found an unfinished batch at the active segment's end


class _Open:
    """The segment being followed: its descriptor and read position."""

    def __init__(self, segment: SegmentFile, byte: int, reader: MetadataLogFile) -> None:
        self.segment = segment
        self.fd = os.open(segment.path, os.O_RDONLY)
        self.byte = byte
        self.reader = reader
        self.damaged_since: float | None = None  # when a CRC mismatch at the tail was first seen

    def close(self) -> None:
        os.close(self.fd)


class MetadataLogFollower:
    """Reads a ``__cluster_metadata-0`` directory as it grows (see the module doc).

    once: read what is there and stop (a tail still being written is left).
    damaged_tail_seconds: how long a whole-looking batch at the active
        segment's end whose CRC fails is waited on before it is a dead letter
        (a writer that appends in pieces may still be writing it).
    sleep: waits between looks (the shipper serves delivery reports meanwhile).
    on_idle: called whenever a look found nothing new.
    notice: one line for an operator (a snapshot taken, segments gone, a rollback).
    """

    def __init__(
        self,
        directory: str,
        *,
        cluster: str,
        node: int | None,
        start: LogPosition | None = None,
        stats: MetadataLogStats | None = None,
        once: bool = False,
        poll_interval_seconds: float = 0.1,
        damaged_tail_seconds: float = 1.0,
        max_batch_bytes: int = READ_BYTES,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = time.sleep,
        on_idle: Callable[[], None] = lambda: None,
        notice: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.directory = directory
        self.cluster = cluster
        self.node = node
        self.stats = stats if stats is not None else MetadataLogStats()
        self.follow = FollowStats()
        self.once = once
        self.poll_interval_seconds = poll_interval_seconds
        self.damaged_tail_seconds = damaged_tail_seconds
        self.max_batch_bytes = max_batch_bytes
        self._start = start
        self._clock = clock
        self._sleep = sleep
        self._on_idle = on_idle
        self._notice = notice
        self._stopped = threading.Event()
        self._next_offset = start.next_offset if start is not None else -1
        self._open: _Open | None = None

    def stop(self) -> None:
        self._stopped.set()

    @property
    def position(self) -> LogPosition:
        current = self._open
        if current is None:
            return LogPosition(self._next_offset)
        return LogPosition(self._next_offset, current.segment.base_offset, current.byte)

    def items(self) -> Iterator[Item]:
        """Everything the directory gives until stopped (or, ``once``, until its end)."""
        try:
            yield from self._begin()
            while not self._stopped.is_set():
                progressed = yield from self._look()
                if progressed:
                    continue
                if self.once:
                    return
                self._on_idle()
                self._sleep(self.poll_interval_seconds)
        finally:
            if self._open is not None:
                self._open.close()  # kept: its segment and byte are the final position

    # -- where to start ---------------------------------------------------------------

    def _begin(self) -> Iterator[Item]:
        start = self._start
        found = segments(self.directory)
        if start is not None and start.segment is not None:
            resumed = next((s for s in found if s.base_offset == start.segment), None)
            if resumed is not None and os.path.getsize(resumed.path) >= start.byte:
                self._enter(resumed, start.byte)
                return
        if start is None:
            snapshot = newest_snapshot(self.directory)
            if snapshot is not None:
                yield from self._snapshot(snapshot.path, snapshot.end_offset)
            elif found:
                self._next_offset = found[0].base_offset
        yield from self._reposition()

    def _snapshot(self, path: str, end_offset: int) -> Iterator[Item]:
        """Every record of a snapshot; the log then goes on at its end offset.
        A stop ends it early, with no position past it (a restart reads it again)."""
        self.follow.snapshots.append(path)
        self._notice(f"reading snapshot {path}: the log goes on at offset {end_offset}")
        items = iter_metadata_log_file(
            path, cluster=self.cluster, node=self.node, stats=self.stats, max_batch_bytes=self.max_batch_bytes
        )
        for item in items:
            if self._stopped.is_set():
                items.close()
                return
            yield item
        self._next_offset = end_offset
        yield LogPosition(end_offset)

    def _reposition(self) -> Iterator[Item]:
        """Open the segment holding the next offset, reading the newest snapshot
        first when the segments before it are gone. Leaves nothing open when
        the directory has no segment for it yet (it is waited for)."""
        found = segments(self.directory)
        holding = segment_holding(found, self._next_offset)
        if holding is None and found and self._next_offset < 0:
            holding = found[0]  # nothing read yet, and no snapshot: the log from its start
        elif holding is None and found:
            snapshot = newest_snapshot(self.directory)
            if snapshot is not None and snapshot.end_offset > self._next_offset:
                self._notice(
                    f"the segments holding offset {self._next_offset} are gone: "
                    f"taking the state from the newest snapshot"
                )
                yield from self._snapshot(snapshot.path, snapshot.end_offset)
                holding = segment_holding(found, self._next_offset)
            else:
                # No snapshot covers the gap: go on at the first record there is.
                self._notice(
                    f"offsets {self._next_offset}-{found[0].base_offset - 1} are gone and no snapshot "
                    "covers them: going on at the first segment"
                )
                self._next_offset = found[0].base_offset
                holding = found[0]
        if holding is not None:
            self._enter(holding, 0)

    def _enter(self, segment: SegmentFile, byte: int) -> None:
        if self._open is not None:
            self._open.close()
        reader = MetadataLogFile(segment.path, cluster=self.cluster, node=self.node, stats=self.stats)
        self._open = _Open(segment, byte, reader)
        self.stats.files += 1
        self.follow.segments += 1
        if self._next_offset < segment.base_offset:
            self._next_offset = segment.base_offset

    # -- one look ---------------------------------------------------------------------------

    def _look(self) -> Generator[Item, None, bool]:
        """Read what is new; return whether anything was (a batch, a roll)."""
        current = self._open
        if current is None:
            yield from self._reposition()
            return self._open is not None
        newer = [s for s in segments(self.directory) if s.base_offset > current.segment.base_offset]
        progressed = yield from self._read(current, active=not newer)
        if progressed:
            return True
        if newer:
            # Kafka rolls only after its last write to the old segment: it is complete.
            yield from self._reposition_after(current)
            return True
        return False

    def _reposition_after(self, current: _Open) -> Iterator[Item]:
        current.close()
        self._open = None
        yield from self._reposition()
        nxt = [s for s in segments(self.directory) if s.base_offset > current.segment.base_offset]
        if self._open is not None and self._open.segment == current.segment and nxt:
            # The next offset is still in the finished segment (it ends short of
            # it): go on with the one after it.
            self._open.close()
            self._open = None
            self._next_offset = max(self._next_offset, nxt[0].base_offset)
            self._enter(nxt[0], 0)
        yield self.position

    def _read(self, current: _Open, *, active: bool) -> Generator[Item, None, bool]:
        size = os.fstat(current.fd).st_size
        if size < current.byte:
            self._notice(
                f"{current.segment.path} shrank from {current.byte} to {size} bytes (the log was truncated): "
                "reading it again; offsets published already are not published again"
            )
            current.byte = 0
        if size == current.byte:
            return False
        # A window from a batch boundary as long as the longest batch read: the
        # first batch always fits, and a big segment is never held whole.
        window = min(size - current.byte, max(READ_BYTES, self.max_batch_bytes))
        data = os.pread(current.fd, window, current.byte)
        at_end = current.byte + len(data) == size
        progressed = False
        for item in frames(data, 0, current.byte, self.max_batch_bytes):
            if isinstance(item, Frame):
                done = yield from self._batch(current, item, last=item.end == size, active=active)
                if not done:
                    break
            elif isinstance(item, Incomplete) and not at_end:
                break  # the window ends inside a batch: the next look reads on from it
            elif isinstance(item, Oversized) and item.position + item.need <= size:
                yield current.reader.oversized(item)
                current.byte = item.position + item.need
            elif isinstance(item, Incomplete | Oversized):
                # The file ends inside this batch.
                if active:
                    self.follow.waits_on_tail += 1
                    break
                tail = (
                    item
                    if isinstance(item, Incomplete)
                    else Incomplete(item.position, size - item.position, item.need)
                )
                yield current.reader.incomplete(tail)
                current.byte = size
            else:
                yield current.reader.broken(item)
                current.byte = size  # nothing after it can be placed
            progressed = True
            yield self.position
        return progressed

    def _batch(
        self, current: _Open, frame: Frame, *, last: bool, active: bool
    ) -> Generator[Item, None, bool]:
        """Publish one whole batch; return False to wait for it (a CRC that fails
        at the active segment's end, within the grace time)."""
        checked = check(frame)
        if last and active and checked.problem is not None:
            now = self._clock()
            if current.damaged_since is None:
                current.damaged_since = now
            if now - current.damaged_since < self.damaged_tail_seconds:
                self.follow.waits_on_tail += 1
                return False
        current.damaged_since = None
        for item in current.reader.batch(checked):
            if isinstance(item, Envelope) and item.offset is not None and item.offset < self._next_offset:
                self.follow.already_published += 1
                continue
            yield item
        self._next_offset = max(self._next_offset, frame.last_offset + 1)
        current.byte = frame.end
        return True
