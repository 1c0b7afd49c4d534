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
from bisect import bisect_right
from collections import OrderedDict, deque
from collections.abc import Iterator
from enum import Enum
from hashlib import blake2b

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
    """

    MAX_GAPS = 10_000

    def __init__(self) -> None:
        self.last: int | None = None
        self._held: list[tuple[int, Envelope]] = []  # heap by offset
        self._held_offsets: set[int] = set()
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
        heapq.heappush(self._held, (offset, env))
        self._held_offsets.add(offset)
        return Arrival.HELD

    def ready(self, watermark_ms: float | None) -> Iterator[Envelope]:
        """Held records to apply now, in offset order: those that follow the
        last applied offset, and those whose time the watermark has passed
        (None: end of input, everything)."""
        held = self._held
        while held:
            offset, env = held[0]
            contiguous = self.last is not None and offset == self.last + 1
            if not contiguous and watermark_ms is not None and env.ts_ms > watermark_ms:
                return
            heapq.heappop(held)
            self._held_offsets.discard(offset)
            if not contiguous:
                # Before the first record applied, the gap is everything earlier:
                # a log (a dump) may begin at any offset.
                self._pass_over(-1 if self.last is None else self.last + 1, offset - 1)
            self.last = offset
            yield env

    def held_count(self) -> int:
        return len(self._held)

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
