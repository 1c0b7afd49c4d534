"""At-least-once input: recognising a record delivered again, and putting an
offset-ordered source back in its own order.

Shippers re-ship what they had not marked done, dumps arrive one segment at a
time and files are replayed in any order. A record delivered twice must change
nothing, and two different records must never be taken for one. Each record
therefore has an identity that a re-delivery keeps:

- a metadata record, and a remote-log-metadata record that carries one: its
  offset in its log (``__cluster_metadata``, ``__remote_log_metadata``);
- a request-log line: its node, its time and its whole body (correlation ids
  repeat across connections and clients, so no field alone will do): read
  from JSON (a replayed file's line, a Kafka record's value), a digest of its
  bytes as read (``Envelope.read_digest``), which a re-delivery keeps byte for
  byte (shippers convert the same native line to the same bytes); built in
  memory, a digest of what it says (:func:`content_identity`). A record
  re-delivered across an upgrade from a release before read digests (up to
  d3edd8a) is recognised only once the grace window of the identities that
  release remembered has closed: until then it may be judged twice, which
  raises no alert twice (alert ids) but counts its outcomes twice;
- a quorum-state observation: its node, time and content, and also, as the
  file has no time of its own and a shipper that restarts publishes the state
  it holds again with a new time, a repeat of the node's newest state;
- anything else without an offset: its time and its whole body.

Offset-ordered sources are applied in offset order (:class:`OffsetOrder`; a
log of several partitions, such as ``__remote_log_metadata``, in each
partition's own: :class:`PartitionedOffsetOrder`);
the others are checked against the identities seen in the detector's window
(:class:`RecentIds`, :class:`RememberedIds`).
"""

from __future__ import annotations

import heapq
import pickle
from array import array
from bisect import bisect_right
from collections import OrderedDict, deque
from collections.abc import Iterator, MutableMapping
from enum import Enum
from hashlib import blake2b
from typing import Any

import orjson

from detectors.envelope import Envelope


def content_identity(env: Envelope, *, with_time: bool = True) -> bytes:
    """A digest of what the record says (node, body and, unless the source has
    no time of its own, ``ts_ms``), never of where it was read from."""
    digest = blake2b(orjson.dumps(env.body, option=orjson.OPT_SORT_KEYS), digest_size=16)
    digest.update(f"|{env.kind}|{env.node}|{env.ts_ms if with_time else ''}".encode())
    return digest.digest()


class RecentIds:
    """Identities of the records whose grace window is still open.

    A record arriving after its window closed (``ts_ms + grace_ms`` behind the
    watermark) is refused by the detector anyway, so an identity can be
    forgotten once its window closes: memory follows the event rate times the
    window, not the history."""

    __slots__ = ("_far", "_ids", "_order")

    def __init__(self) -> None:
        self._ids: dict[bytes, int] = {}
        self._order: deque[tuple[int, bytes]] = deque()  # (forget after this watermark, id)
        # Identities kept the clock limit longer (``far``), in order apart: in the
        # one queue, each would hold back the forgetting of every later identity.
        self._far: deque[tuple[int, bytes]] = deque()

    def __setstate__(self, state: tuple[None, dict[str, object]]) -> None:
        for name, value in state[1].items():
            setattr(self, name, value)
        if "_far" not in state[1]:
            self._far = deque()  # saved before far identities existed

    def add(self, identity: bytes, until_ms: int, far: bool = False) -> bool:
        """Remember ``identity`` until the watermark passes ``until_ms``; ``far``:
        the clock limit past the grace window (a record whose clock is unmeasured).
        False if it is remembered already (a re-delivery)."""
        if identity in self._ids:
            return False
        self._ids[identity] = until_ms
        (self._far if far else self._order).append((until_ms, identity))
        return True

    def forget(self, watermark_ms: float) -> None:
        # Arrival order is ts order within lateness: an entry that expires later
        # than its successors only stays a little longer than it must.
        for order in (self._order, self._far):
            while order and order[0][0] < watermark_ms:
                _, identity = order.popleft()
                del self._ids[identity]

    def __len__(self) -> int:
        return len(self._ids)


class RememberedIds:
    """The last ``capacity`` identities of a rare kind of record (quorum
    states: a few per election), kept regardless of time: a record that needs
    no grace window is judged however late it comes, so its re-delivery must
    be recognised however late too."""

    __slots__ = ("_capacity", "_ids")

    def __init__(self, capacity: int = 10_000):
        self._capacity = capacity
        self._ids: OrderedDict[bytes, None] = OrderedDict()

    def add(self, identity: bytes) -> bool:
        """False if ``identity`` is remembered already."""
        if identity in self._ids:
            self._ids.move_to_end(identity)
            return False
        self._ids[identity] = None
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)
        return True


class Arrival(Enum):
    """What :meth:`OffsetOrder.offer` made of a record."""

    APPLY = "apply"  # next in offset order: apply it now (then whatever :meth:`OffsetOrder.ready` gives)
    HELD = "held"  # ahead of a gap: held until the gap fills or its time has passed
    DUPLICATE = "duplicate"  # this offset was applied or is held already
    OUT_OF_ORDER = "out_of_order"  # older than offsets applied already, and never applied itself


class HeldChunk:
    """Records an :class:`OffsetOrder` held when it was pickled, pickled together
    once (one pickle shares their repeated names; the bytes are kept in
    ``OffsetOrder.chunk_data``), and what the heap needs of each: its offset,
    its time, and whether it was applied since."""

    __slots__ = ("left", "offsets", "records", "taken", "times")

    def __init__(self, offsets: list[int], records: list[Envelope]):
        self.offsets = array("q", offsets)
        self.times = array("q", [env.ts_ms for env in records])
        self.taken = bytearray(len(records))
        self.left = len(records)
        # Unpickled when the first of a loaded chunk's records is applied.
        self.records: list[Envelope] | None = records

    def __getstate__(self) -> tuple[array[int], array[int], bytearray]:
        return self.offsets, self.times, self.taken

    def __setstate__(self, state: tuple[array[int], array[int], bytearray]) -> None:
        self.offsets, self.times, self.taken = state
        self.left = self.taken.count(0)
        self.records = None

    def waiting(self) -> list[int]:
        """The indexes of the records not applied yet."""
        return [index for index, taken in enumerate(self.taken) if not taken]


class OffsetOrder:
    """One offset-ordered log (a cluster's metadata log, its remote-log-metadata
    topic) applied in offset order, whatever order its records arrive in.

    The next offset is applied at once. The first record, and a record past a
    gap, is held: Kafka logs
    have gaps of their own (control records such as LeaderChange take offsets,
    and dump tools skip them), so a held record waits only until the event-time
    watermark passes its ``ts_ms``; by then, within the detector's lateness
    contract, every earlier record has arrived. An offset at or below the last
    applied one is a re-delivery if it was applied, and out of order if it was
    passed over: the view cannot be rewound to take it.

    A bucket of the streaming job receives only its own partitions' records of
    the metadata log, so it holds nearly every record, and a burst of records
    of one time (a large cluster's snapshot, a backfill) stays held over many
    micro-batches, each of which pickles the detector. A held record never
    changes, so the records a pickle finds newly held are pickled together once
    (:class:`HeldChunk`) and kept so, in :attr:`chunk_data`, which for the
    metadata log the job keeps apart from the detector and writes once; a
    record is unpickled when it is applied (docs/performance.md, "Held
    records written once").
    """

    MAX_GAPS = 10_000
    # Fewer records newly held than this are pickled with the log as they are,
    # again at each pickle while they wait: a chunk costs the job two state-store
    # calls (270 us each, measured at 06212d9), as much as pickling some 90
    # records (6.3 us each), and a bucket's usual few held records are applied
    # within a batch or two.
    CHUNK_MIN = 256

    def __init__(self) -> None:
        self.last: int | None = None
        self._held: list[tuple[int, int]] = []  # heap of (offset, ts_ms) of the records held
        # Each held offset: where in a chunk its record is (None: not chunked yet, in _fresh).
        self._held_offsets: dict[int, tuple[int, int] | None] = {}
        self._fresh: dict[int, Envelope] = {}  # held since the last pickle, by offset
        self._chunks: dict[int, HeldChunk] = {}
        self._next_chunk = 0
        # Each chunk's records, pickled. The streaming job keeps them in a state
        # variable of their own (streaming.state.HeldChunkStore), written once.
        self.chunk_data: MutableMapping[int, bytes] = {}
        # Offset ranges passed over when a held record was applied (control
        # records, missing records), in offset order: one that arrives later is
        # out of order. Two lists so that a look-up is a bisection.
        self._gap_firsts: list[int] = []
        self._gap_lasts: list[int] = []

    def offer(self, env: Envelope) -> Arrival:
        offset = env.offset
        assert offset is not None
        last = self.last
        if last is not None and offset <= last:
            return Arrival.OUT_OF_ORDER if self._passed_over(offset) else Arrival.DUPLICATE
        if offset in self._held_offsets:
            return Arrival.DUPLICATE
        if last is not None and offset == last + 1:
            self.last = offset
            return Arrival.APPLY
        heapq.heappush(self._held, (offset, env.ts_ms))
        self._held_offsets[offset] = None
        self._fresh[offset] = env
        return Arrival.HELD

    def __getstate__(self) -> dict[str, Any]:
        if len(self._fresh) >= self.CHUNK_MIN:
            number = self._next_chunk
            self._next_chunk += 1
            offsets, records = list(self._fresh), list(self._fresh.values())
            self.chunk_data[number] = pickle.dumps(records, pickle.HIGHEST_PROTOCOL)
            self._chunks[number] = HeldChunk(offsets, records)
            for index, offset in enumerate(offsets):
                self._held_offsets[offset] = (number, index)
            self._fresh = {}
        # The heap and its offsets are the records of _fresh and the chunks: rebuilt on loading.
        return {k: v for k, v in self.__dict__.items() if k not in ("_held", "_held_offsets")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "_chunks" not in state:
            # Saved with its held records in the heap (state format 4 and before):
            # chunked at the next pickle.
            self._fresh = dict(state["_held"])
            self._held = [(offset, env.ts_ms) for offset, env in state["_held"]]
            self._held_offsets = dict.fromkeys(self._fresh)
            self._chunks, self._next_chunk, self.chunk_data = {}, 0, {}
            return
        self._held = [(offset, env.ts_ms) for offset, env in self._fresh.items()]
        self._held_offsets = dict.fromkeys(self._fresh)
        for number, chunk in self._chunks.items():
            for index in chunk.waiting():
                self._held.append((chunk.offsets[index], chunk.times[index]))
                self._held_offsets[chunk.offsets[index]] = (number, index)
        heapq.heapify(self._held)

    def ready(self, watermark_ms: float | None) -> Iterator[Envelope]:
        """Held records to apply now, in offset order: those that follow the
        last applied offset, and those whose time the watermark has passed
        (None: end of input, everything)."""
        held = self._held
        while held:
            offset, ts_ms = held[0]
            contiguous = self.last is not None and offset == self.last + 1
            if not contiguous and watermark_ms is not None and ts_ms > watermark_ms:
                return
            heapq.heappop(held)
            place = self._held_offsets.pop(offset)
            env = self._fresh.pop(offset) if place is None else self._take(place)
            if not contiguous:
                # Before the first record applied, the gap is everything earlier:
                # a log (a dump) may begin at any offset.
                self._pass_over(-1 if self.last is None else self.last + 1, offset - 1)
            self.last = offset
            yield env

    def held_count(self) -> int:
        return len(self._held)

    def _take(self, place: tuple[int, int]) -> Envelope:
        """The record at ``place``, marked applied in its chunk."""
        number, index = place
        chunk = self._chunks[number]
        if chunk.records is None:
            chunk.records = pickle.loads(self.chunk_data[number])
        chunk.taken[index] = 1
        chunk.left -= 1
        if not chunk.left:
            del self._chunks[number]
            del self.chunk_data[number]
        return chunk.records[index]

    def started(self) -> bool:
        """Whether any record of this log has arrived (applied or held)."""
        return self.last is not None or bool(self._held)

    def _pass_over(self, first: int, last: int) -> None:
        if first > last:
            return
        self._gap_firsts.append(first)
        self._gap_lasts.append(last)
        if len(self._gap_firsts) > self.MAX_GAPS:
            # The oldest go: an offset that old arriving now counts as a duplicate.
            del self._gap_firsts[: self.MAX_GAPS // 10]
            del self._gap_lasts[: self.MAX_GAPS // 10]

    def _passed_over(self, offset: int) -> bool:
        i = bisect_right(self._gap_firsts, offset) - 1
        return i >= 0 and offset <= self._gap_lasts[i]


class PartitionedOffsetOrder:
    """A log of several partitions (``__remote_log_metadata``; the partition in
    ``body["partition"]``, as detectors.parse_remote_log_metadata gives it),
    each applied in its own offset order: the partitions' offsets repeat and
    interleave, so a record is never a duplicate of, nor out of order against,
    another partition's. Records that name no partition share one order."""

    def __init__(self) -> None:
        self.partitions: dict[int | None, OffsetOrder] = {}

    @classmethod
    def of_one(cls, log: OffsetOrder) -> PartitionedOffsetOrder:
        """``log`` as the order of the records that name no partition (a state
        saved when the remote log had one order for all its records)."""
        partitioned = cls()
        partitioned.partitions[None] = log
        return partitioned

    def log_of(self, env: Envelope) -> OffsetOrder:
        """The order of ``env``'s partition."""
        partition = env.body.get("partition")
        key = partition if type(partition) is int else None
        log = self.partitions.get(key)
        if log is None:
            log = self.partitions[key] = OffsetOrder()
        return log

    def ready(self, watermark_ms: float | None) -> Iterator[Envelope]:
        """:meth:`OffsetOrder.ready` of each partition, partition after partition."""
        for log in list(self.partitions.values()):
            yield from log.ready(watermark_ms)

    def held_count(self) -> int:
        # map, not a generator: asked per event (Detector.ingest), and a generator's
        # frame costs more than the count of the usual one partition.
        return sum(map(OffsetOrder.held_count, self.partitions.values()))
