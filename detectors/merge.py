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
assumption that one source's records are out of ``ts_ms`` order by at most
``lateness_ms``. How far a file has been read is its newest time less the
furthest any of its records has come behind the newest before it: every node
stamps by its own clock, and a file in which one node runs 3 s ahead holds
the other nodes' records of those 3 s still unread (measured: a skewed history
cut into overlapping files lost 660 metadata and remote-log records as out of
order and raised 3,204 false alarms while a file counted as read to its newest
record). So memory holds about ``lateness_ms`` plus the clocks' spread of
records per file (at most the clock limit), not the files. A single file is read as it is: it keeps
every source's order already.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from detectors.envelope import DeadLetter, Envelope
from detectors.redelivery import content_identity

Item = Envelope | DeadLetter
# (cluster, kind, node; -1 for the metadata log, a __remote_log_metadata partition's
# number for that partition's records); dead letters: ("", "~", -1)
SourceKey = tuple[str, str, int]


def source_of(item: Item) -> SourceKey:
    if isinstance(item, DeadLetter):
        return ("", "~", -1)  # reported where it stood in its file
    if item.kind == "metadata":
        return (item.cluster, item.kind, -1)  # one log per cluster, whoever wrote each record
    if item.kind == "remote_log_metadata":
        # Each partition of __remote_log_metadata is a log of its own (detectors.redelivery).
        partition = item.body.get("partition")
        return (item.cluster, item.kind, partition if type(partition) is int else -1)
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
    its effective time (never before its predecessor's in this file)."""

    source: _Source
    items: deque[tuple[int, Item]] = field(default_factory=deque)
    last_ts_ms: int = -1


HeadKey = tuple[int, str, int, int, _Content]


def _head_key(queue: _Queue) -> HeadKey:
    ts_ms, item = queue.items[0]
    offset = item.offset if isinstance(item, Envelope) and item.offset is not None else -1
    _, kind, node = queue.source.key
    return (ts_ms, kind, node, offset, _Content(item))


def _offset(queue: _Queue) -> int | None:
    item = queue.items[0][1]
    return item.offset if isinstance(item, Envelope) else None


class _Source:
    """One source's queues, one per file that holds it. Its next record is the
    lowest offset of an offset-ordered log: a record's effective time depends
    on where its file starts (a record after a broker 3 s ahead is held to that
    broker's time in one piece and not in the next), so two pieces' times of
    one log need not agree with its order. Any other source's is the earliest."""

    __slots__ = ("key", "queues", "version")

    def __init__(self, key: SourceKey):
        self.key = key
        self.queues: list[_Queue] = []
        self.version = 0  # heap entries of an older version are stale

    def head(self) -> _Queue | None:
        heads = [q for q in self.queues if q.items]
        if len(heads) <= 1:
            return heads[0] if heads else None
        offsets = [_offset(q) for q in heads]
        known = [offset for offset in offsets if offset is not None]
        if len(known) == len(heads):
            return heads[offsets.index(min(known))]
        return min(heads, key=_head_key)


class _File:
    """A file read on demand into per-source queues."""

    CHUNK = 256  # records read at a time: the horizon is recomputed per chunk, not per record

    def __init__(self, items: Iterable[Item], sources: dict[SourceKey, _Source], behind_limit_ms: int):
        self._items = iter(items)
        self._sources = sources
        self._behind_limit_ms = behind_limit_ms
        self.queues: dict[SourceKey, _Queue] = {}
        self.newest_ts_ms = -1  # of the records read so far
        self.behind_ms = 0  # the furthest a record came behind the newest before it
        self.done = False

    def progress_ms(self) -> int:
        """The time this file has been read to: its records not read yet come no
        earlier (within lateness), unless a clock falls further behind than any
        has so far. A quiet or stopped source does not hold it back."""
        return self.newest_ts_ms - self.behind_ms

    def read(self) -> set[_Source]:
        """Read up to a chunk of records into their queues; returns the sources
        with a queue that was empty before (their next record may have changed)."""
        started: set[_Source] = set()
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
                elif self.newest_ts_ms - ts_ms > self.behind_ms:
                    self.behind_ms = min(self.newest_ts_ms - ts_ms, self._behind_limit_ms)
            else:
                ts_ms = self.newest_ts_ms
            key = source_of(item)
            queue = queues.get(key)
            if queue is None:
                source = self._sources.get(key)
                if source is None:
                    source = self._sources[key] = _Source(key)
                queue = queues[key] = _Queue(source)
                source.queues.append(queue)
            if ts_ms > queue.last_ts_ms:
                queue.last_ts_ms = ts_ms
            if not queue.items:
                started.add(queue.source)
            queue.items.append((queue.last_ts_ms, item))
        return started


def merge_sources(
    streams: Sequence[Iterable[Item]], disorder_ms: int, behind_limit_ms: int
) -> Iterator[Item]:
    """Merge per-file streams (see the module docstring). ``disorder_ms``: how
    far out of ``ts_ms`` order one source may be (the detector's lateness);
    ``behind_limit_ms``: the furthest one clock is waited for behind another
    (the detector's clock limit): a stray record far behind the rest of its
    file (shipped again an hour later) does not make the merge hold an hour of
    every other file."""
    if len(streams) == 1:
        # One file already keeps every source's order. Holding records to
        # interleave its sources by time would only cost: the detector's grace
        # and lateness make the interleaving of sources irrelevant.
        yield from streams[0]
        return
    sources: dict[SourceKey, _Source] = {}
    files = [_File(s, sources, behind_limit_ms) for s in streams]
    # (the source's next record's key, push count, the source's version, source, its queue)
    heads: list[tuple[HeadKey, int, int, _Source, _Queue]] = []
    pushes = 0  # breaks the last tie (identical records) without comparing sources

    def offer(source: _Source) -> None:
        nonlocal pushes
        source.version += 1
        queue = source.head()
        if queue is not None:
            pushes += 1
            heapq.heappush(heads, (_head_key(queue), pushes, source.version, source, queue))

    def pop() -> Item | None:
        _, _, version, source, queue = heapq.heappop(heads)
        if version != source.version:
            return None  # the source's next record changed since
        item = queue.items.popleft()[1]
        offer(source)
        return item

    while True:
        unread = [f for f in files if not f.done]
        if not unread:
            break
        # The earliest time a record not yet read could have, in any file.
        slowest_ms, slowest = min((f.progress_ms(), i) for i, f in enumerate(unread))
        earliest_unread = slowest_ms - disorder_ms
        while heads and heads[0][0][0] <= earliest_unread:
            item = pop()
            if item is not None:
                yield item
        for source in unread[slowest].read():
            offer(source)
    while heads:
        item = pop()
        if item is not None:
            yield item
