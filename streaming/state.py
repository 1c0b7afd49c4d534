"""The detector's state inside Spark's state store.

Per bucket of a cluster (the grouping key), five state variables:

- ``partition_groups``: a MapState from ``(topic key, group)`` to the view
  histories, each pickled as plain values (detectors.view.plain_history), of
  up to :data:`GROUP_SIZE` of the bucket's partitions of that topic
  (``group`` is the partition index divided by ``GROUP_SIZE`` times the
  bucket count). Only the groups a micro-batch touches are read and
  written, so batch time follows the batch, not the number of partitions
  tracked; grouping makes a metadata snapshot of many partitions cost a state
  read and a write per group instead of per partition (docs/performance.md).
- ``pending``: a MapState of the judgments waiting for their grace window,
  written per micro-batch as it changes them (streaming.pending_store).
- ``remote_partitions``: a MapState from ``(topic id, partition)`` to that
  partition's tracked remote segments (detectors.remote.PartitionSegments),
  pickled; read when a remote-log-metadata record names the partition
  (:class:`RemoteStore`). A cluster with tiered storage tracks every segment
  still in remote storage, so this too must not be pickled with every batch.
- ``held_chunks``: a MapState from a chunk number to the pickled records of
  the metadata log the bucket held for their offset order when a micro-batch
  ended (detectors.redelivery.OffsetOrder): a bucket holds nearly every
  metadata record for a while, and a snapshot's burst of them can stay held
  over many batches. Written once, read when the first of them is applied
  after the worker changed (:class:`HeldChunkStore`).
- ``detector``: a ValueState with everything else (brokers, topics, quorum),
  pickled, and a version number.

All are written in a versioned format (streaming.snapshot_format). State
formats 0 to 2 kept one entry per partition in the ``partitions`` MapState;
the operator moves them into groups the first time it loads such a bucket
(:meth:`PartitionStore.adopt`). Formats 0 to 3 kept remote segments in the
detector value; they move to ``remote_partitions`` the same way.

A Python worker keeps the unpickled detector between batches and reuses it
while the stored version matches; after a restart or a retried batch the
versions differ and the detector is reloaded from the store.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import Any, TypeVar

from pyspark.sql.streaming.stateful_processor import MapState
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from detectors.history import History
from detectors.remote import PartitionSegments
from detectors.view import PartitionKey, PartitionState, PlainHistory, history_of_plain, plain_history
from streaming import snapshot_format

GROUP_KEY_SCHEMA = StructType([StructField("topic", StringType()), StructField("group", IntegerType())])
GROUP_VALUE_SCHEMA = StructType([StructField("histories", BinaryType())])
# State formats 0 to 2: one entry per partition (read only to move them into groups).
PARTITION_KEY_SCHEMA = StructType(
    [StructField("topic", StringType()), StructField("partition", IntegerType())]
)
PARTITION_VALUE_SCHEMA = StructType([StructField("history", BinaryType())])
REMOTE_KEY_SCHEMA = StructType(
    [StructField("topic_id", StringType()), StructField("partition", IntegerType())]
)
REMOTE_VALUE_SCHEMA = StructType([StructField("segments", BinaryType())])
HELD_KEY_SCHEMA = StructType([StructField("chunk", LongType())])
HELD_VALUE_SCHEMA = StructType([StructField("records", BinaryType())])
DETECTOR_SCHEMA = StructType([StructField("version", LongType()), StructField("snapshot", BinaryType())])

# A bucket's partitions per state entry. A group is read whole when any of its
# partitions is, and written whole when any changes (metadata changes are rare
# next to produce and fetch outcomes): 64 histories of a few hundred bytes each.
GROUP_SIZE = 64

_MISSING = object()
_NO_INDEX = 2**31  # past every partition index (an int32)

GroupKey = tuple[str, int]
Fingerprint = tuple[int, int, PartitionState] | None


def _fingerprint(history: History[PartitionState] | None) -> Fingerprint:
    """What changes whenever a history is appended to or pruned (it is never
    edited otherwise), so unchanged histories need not be written back. It
    holds the latest state itself, compared by identity: an object kept alive
    cannot be mistaken for a new one."""
    if history is None:
        return None
    return (len(history), history.first_ts_ms, history.latest)


def _same(a: Fingerprint, b: Fingerprint) -> bool:
    if a is None or b is None:
        return a is b
    return a[0] == b[0] and a[1] == b[1] and a[2] is b[2]


K = TypeVar("K")
V = TypeVar("V")


class _ReadOnDemand(MutableMapping[K, V]):
    """The mapping protocol over a MapState read on demand, what the rules
    call: a subclass gives ``_load`` (the value, or None when there is none)
    and ``_put`` (a value, or None to remove it; written at its flush).
    Listing or counting would read the whole state store, so both refuse."""

    _holds = "entries"  # what the store holds, for those refusals
    _backend: MapState | None = None  # the task's state client (attach)

    def attach(self, backend: MapState) -> None:
        """Use ``backend``: each task has its own state client."""
        self._backend = backend

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled with the detector snapshot as an empty shell: what it holds lives in MapState.
        return (type(self), ())

    def _load(self, key: K) -> V | None:
        raise NotImplementedError

    def _put(self, key: K, value: V | None) -> None:
        raise NotImplementedError

    def __getitem__(self, key: K) -> V:
        value = self._load(key)
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: K, default: Any = None) -> Any:  # type: ignore[override]
        value = self._load(key)
        return default if value is None else value

    def __contains__(self, key: object) -> bool:
        return self._load(key) is not None  # type: ignore[arg-type]

    def __setitem__(self, key: K, value: V) -> None:
        self._put(key, value)

    def __delitem__(self, key: K) -> None:
        if self._load(key) is None:
            raise KeyError(key)
        self._put(key, None)

    def __iter__(self) -> Iterator[K]:
        raise TypeError(f"listing the {self._holds} would read the whole state store")

    def __len__(self) -> int:
        raise TypeError(f"the number of {self._holds} is not kept in memory")


class PartitionStore(_ReadOnDemand[PartitionKey, History[PartitionState]]):
    """A dict-like view of the ``partition_groups`` MapState that reads lazily
    and, when :meth:`flush` is called, writes back the groups that changed.

    A group is kept as its members' pickled bytes; a history is unpickled only
    when a rule reads it, and only for the batch: between batches the store
    holds bytes, which the garbage collector does not scan (with a million
    partitions' histories as objects, its full collections cost more than the
    rules did; docs/performance.md). Rules read far more partitions than
    metadata changes: writing back only changed histories saves a pickle and a
    state-server round trip per read."""

    _holds = "tracked partitions"
    # Pickled histories held between batches; beyond this they are dropped after
    # a flush, so a worker's memory does not grow with the partition count.
    MAX_CACHED = 1_000_000

    def __init__(self) -> None:
        self._span = GROUP_SIZE
        self._groups: dict[GroupKey, dict[int, bytes]] = {}  # what the store holds, per loaded group
        self._in_store: set[GroupKey] = set()  # loaded groups the state store has an entry for
        # The histories read or set since the last flush (None: none or removed).
        self._cache: dict[PartitionKey, History[PartitionState] | None] = {}
        # What the state store holds for each key read, as a fingerprint (None: nothing).
        self._stored: dict[PartitionKey, Fingerprint] = {}
        # Per topic key, the index from which the store holds no history, as the
        # view told it since the last flush (none_stored_from).
        self._none_from: dict[str, int] = {}

    def attach(self, backend: MapState, buckets: int = 1) -> None:
        """Use ``backend`` (each task has its own state client) for a bucket of
        a cluster split into ``buckets``."""
        self._backend = backend
        self._span = GROUP_SIZE * buckets

    def _group(self, key: PartitionKey) -> GroupKey:
        return (key[0], key[1] // self._span)

    def none_stored_from(self, topic: str, index: int) -> None:
        """The view's word that no partition of ``topic`` from ``index`` on has a
        history: none was seen before (ClusterView._partition_record). Until the
        next flush, a group wholly past the lowest such index is not read. The
        histories the flush writes are seen by then, so the word ends there."""
        if index < self._none_from.get(topic, index + 1):
            self._none_from[topic] = index

    def _members(self, group: GroupKey) -> dict[int, bytes]:
        members = self._groups.get(group)
        if members is None and group[1] * self._span >= self._none_from.get(group[0], _NO_INDEX):
            members = self._groups[group] = {}  # a new topic's partitions: nothing to read
        if members is None:
            assert self._backend is not None, "PartitionStore used before attach()"
            # One state-server round trip: getValue answers None for a key it does not hold.
            value = self._backend.getValue(group)
            members = snapshot_format.decode(value[0]) if value is not None else {}
            self._groups[group] = members
            if value is not None:
                self._in_store.add(group)
        return members

    def _load(self, key: PartitionKey) -> History[PartitionState] | None:
        cached = self._cache.get(key, _MISSING)
        if cached is not _MISSING:
            return cached  # type: ignore[return-value]
        data = self._members(self._group(key)).get(key[1])
        history = _history(pickle.loads(data)) if data is not None else None
        self._cache[key] = history
        self._stored[key] = _fingerprint(history)
        return history

    def _put(self, key: PartitionKey, value: History[PartitionState] | None) -> None:
        self._cache[key] = value  # a key never loaded is written at flush: nothing to compare with

    def adopt(self, entries: Iterable[tuple[PartitionKey, tuple[bytes]]]) -> int:
        """Take in the per-partition entries of state formats 0 to 2 (the
        ``partitions`` MapState's items); the next flush writes them in groups.
        Returns how many."""
        count = 0
        for (topic, partition), (data,) in entries:
            self[(topic, partition)] = snapshot_format.decode(data)
            count += 1
        return count

    def flush(self) -> int:
        """Write back every group with a partition changed since the last
        flush (a history read and changed in place, set, or removed). Returns
        how many partitions changed."""
        assert self._backend is not None
        changed: set[GroupKey] = set()
        written = 0
        for key, history in self._cache.items():
            if key in self._stored and _same(_fingerprint(history), self._stored[key]):
                continue
            group = self._group(key)
            members = self._members(group)
            if history is None:
                members.pop(key[1], None)
            else:
                members[key[1]] = pickle.dumps(plain_history(history), protocol=pickle.HIGHEST_PROTOCOL)
            changed.add(group)
            written += 1
        for group in changed:
            members = self._groups[group]
            if members:
                self._backend.updateValue(group, (snapshot_format.encode(members),))
                self._in_store.add(group)
            elif group in self._in_store:
                self._backend.removeKey(group)
                self._in_store.discard(group)
        self._cache.clear()
        self._stored.clear()
        self._none_from.clear()
        if sum(len(m) for m in self._groups.values()) > self.MAX_CACHED:
            self._groups.clear()
            self._in_store.clear()
        return written


def _history(stored: History[PartitionState] | PlainHistory) -> History[PartitionState]:
    # State formats 3 to 5 pickled each history as objects; format 6 as plain values.
    return stored if isinstance(stored, History) else history_of_plain(stored)


RemoteKey = tuple[str, int]


class RemoteStore(_ReadOnDemand[RemoteKey, PartitionSegments]):
    """A dict-like view of the ``remote_partitions`` MapState: a partition's
    segments are read the first time a batch names the partition, and every
    partition read is written back at :meth:`flush` if its bytes changed
    (a record about a segment nearly always changes it, so there is no
    cheaper test than the pickle itself). Remote-log-metadata records are
    rare next to produce and fetch outcomes: a batch reads a few partitions."""

    _holds = "partitions' remote segments"
    # Pickled partitions held between batches, to spare the state call of a re-read;
    # beyond this they are dropped after a flush.
    MAX_CACHED = 100_000

    def __init__(self) -> None:
        self._stored: dict[RemoteKey, bytes | None] = {}  # what the state store holds (None: nothing)
        self._live: dict[RemoteKey, PartitionSegments | None] = {}  # read or set since the last flush

    def _load(self, key: RemoteKey) -> PartitionSegments | None:
        if key in self._live:
            return self._live[key]
        if key not in self._stored:
            assert self._backend is not None, "RemoteStore used before attach()"
            value = self._backend.getValue(key)
            self._stored[key] = value[0] if value is not None else None
        data = self._stored[key]
        part = snapshot_format.decode(data) if data is not None else None
        self._live[key] = part
        return part

    def _put(self, key: RemoteKey, value: PartitionSegments | None) -> None:
        self._live[key] = value

    def adopt(self, partitions: Mapping[RemoteKey, PartitionSegments]) -> int:
        """Take in the remote segments a detector value of state formats 0 to 3
        carried; the next flush writes them. Returns how many partitions."""
        self._live.update(partitions)
        return len(partitions)

    def flush(self) -> int:
        """Write back every partition read or set since the last flush whose
        bytes changed, and remove those deleted. Returns how many were written
        or removed."""
        assert self._backend is not None
        written = 0
        for key, part in self._live.items():
            data = snapshot_format.encode(part) if part is not None else None
            if key in self._stored and data == self._stored[key]:
                continue
            if data is not None:
                self._backend.updateValue(key, (data,))
            elif self._stored.get(key) is not None:
                self._backend.removeKey(key)
            self._stored[key] = data
            written += 1
        self._live.clear()
        if len(self._stored) > self.MAX_CACHED:
            self._stored.clear()
        return written


class HeldChunkStore(_ReadOnDemand[int, bytes]):
    """A dict-like view of the ``held_chunks`` MapState: the metadata log's held
    records, pickled a chunk at a time (``OffsetOrder.chunk_data``). A chunk is
    written at the :meth:`flush` after it was made and removed at the one after
    its last record was applied; it is read only if its records are applied in
    a worker that did not make it."""

    _holds = "held records"

    def __init__(self) -> None:
        self._live: dict[int, bytes | None] = {}  # made or removed since the last flush (None: removed)

    def _load(self, key: int) -> bytes | None:
        if key in self._live:
            return self._live[key]
        assert self._backend is not None, "HeldChunkStore used before attach()"
        value = self._backend.getValue((key,))
        return bytes(value[0]) if value is not None else None

    def _put(self, key: int, value: bytes | None) -> None:
        if value is None and self._live.get(key) is not None:
            del self._live[key]  # made since the last flush: never written
        else:
            self._live[key] = value

    def __delitem__(self, key: int) -> None:
        # Only the chunks the log made are removed: no state read to check.
        self._put(key, None)

    def flush(self) -> None:
        """Write the chunks made and remove those finished since the last flush."""
        assert self._backend is not None
        for key, data in self._live.items():
            if data is not None:
                self._backend.updateValue((key,), (data,))
            else:
                self._backend.removeKey((key,))
        self._live.clear()
