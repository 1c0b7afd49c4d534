"""Replay's merge: input files in any cut and any order become one sequence
in which every source keeps its own order.

A source is one writer: a node's request log, a node's quorum-state file, a
cluster's metadata log, its remote log metadata. Within a file each source's
records keep the file's order; sources, and one source's pieces in several
files, merge by ``ts_ms``. A source whose clock steps back (the metadata log
after a controller failover) keeps its order: a record takes effect no earlier
than its predecessor in the same file, as in ``detectors.history``. Where
records tie, what they say decides (kind, node, offset, then content), never
which file was named first. The detector drops re-delivered records and puts
offset-ordered logs in offset order (``detectors.redelivery``), so any cut of
the input into files, in any order, with any part repeated, gives the alerts of
the clean input.

Files are read lazily. Before a record is emitted, every other file has been
read far enough that nothing earlier can still be in it, on the detector's own
assumption that a file is out of ``ts_ms`` order by at most ``lateness_ms``; so
memory holds about ``lateness_ms`` of records per file, not the files. A single
file is read as it is: it keeps every source's order already.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from detectors.envelope import DeadLetter, Envelope
from detectors.redelivery import content_identity

Item = Envelope | DeadLetter
SourceKey = tuple[str, str, int]  # (cluster, kind, node or -1); dead letters: ("", "~", -1)


def source_of(item: Item) -> SourceKey:
    if isinstance(item, DeadLetter):
        return ("", "~", -1)  # reported where it stood in its file
    if item.kind in ("metadata", "remote_log_metadata"):
        return (item.cluster, item.kind, -1)  # one log per cluster, whoever wrote each record
    return (item.cluster, item.kind, -1 if item.node is None else item.node)


class _Content:
    """Orders tied records by what they say; computed only for a full tie."""

    __slots__ = ("item",)

    def __init__(self, item: Item):
        self.item = item

    def digest(self) -> bytes:
        item = self.item
        return content_identity(item) if isinstance(item, Envelope) else item.position.encode()

    def __lt__(self, other: _Content) -> bool:
        return self.digest() < other.digest()


@dataclass
class _Queue:
    """One source's records read from one file and not yet emitted, each with
    its effective time (never before its predecessor's)."""

    source: SourceKey
    items: deque[tuple[int, Item]] = field(default_factory=deque)
    last_ts_ms: int = -1


class _File:
    """A file read on demand into per-source queues."""

    CHUNK = 256  # records read at a time: the horizon is recomputed per chunk, not per record

    def __init__(self, items: Iterable[Item]):
        self._items = iter(items)
        self.queues: dict[SourceKey, _Queue] = {}
        self.newest_ts_ms = -1  # of the records read so far
        self.done = False

    def read(self) -> list[_Queue]:
        """Read up to a chunk of records into their queues; returns the queues
        that were empty before (they have a new head)."""
        started: list[_Queue] = []
        queues = self.queues
        for _ in range(self.CHUNK):
            item = next(self._items, None)
            if item is None:
                self.done = True
                break
            if isinstance(item, Envelope):
                ts_ms = item.ts_ms
                if ts_ms > self.newest_ts_ms:
                    self.newest_ts_ms = ts_ms
            else:
                ts_ms = self.newest_ts_ms
            source = source_of(item)
            queue = queues.get(source)
            if queue is None:
                queue = queues[source] = _Queue(source)
            if ts_ms > queue.last_ts_ms:
                queue.last_ts_ms = ts_ms
            if not queue.items:
                started.append(queue)
            queue.items.append((queue.last_ts_ms, item))
        return started


def _head_key(queue: _Queue) -> tuple[int, str, int, int, _Content]:
    ts_ms, item = queue.items[0]
    offset = item.offset if isinstance(item, Envelope) and item.offset is not None else -1
    return (ts_ms, queue.source[1], queue.source[2], offset, _Content(item))


def merge_sources(streams: Sequence[Iterable[Item]], disorder_ms: int) -> Iterator[Item]:
    """Merge per-file streams (see the module docstring). ``disorder_ms``: how
    far out of ``ts_ms`` order one file may be (the detector's lateness)."""
    if len(streams) == 1:
        # One file already keeps every source's order. Holding records to
        # interleave its sources by time would only cost: the detector's grace
        # and lateness make the interleaving of sources irrelevant.
        yield from streams[0]
        return
    files = [_File(s) for s in streams]
    heads: list[tuple[tuple[int, str, int, int, _Content], int, _Queue]] = []
    pushes = 0  # breaks the last tie (identical records) without comparing queues

    def offer(queue: _Queue) -> None:
        nonlocal pushes
        pushes += 1
        heapq.heappush(heads, (_head_key(queue), pushes, queue))

    while True:
        unread = [f for f in files if not f.done]
        if not unread:
            break
        # The earliest time a record not yet read could have, in any file.
        earliest_unread = min(f.newest_ts_ms for f in unread) - disorder_ms
        while heads and heads[0][0][0] <= earliest_unread:
            _, _, queue = heapq.heappop(heads)
            yield queue.items.popleft()[1]
            if queue.items:
                offer(queue)
        for queue in min(unread, key=lambda f: f.newest_ts_ms).read():
            offer(queue)
    while heads:
        _, _, queue = heapq.heappop(heads)
        yield queue.items.popleft()[1]
        if queue.items:
            offer(queue)
