"""The detector's state inside Spark's state store.

Per bucket of a cluster (the grouping key), three state variables:

- ``partitions``: a MapState from ``(topic key, partition)`` to that
  partition's pickled view history. Only the partitions a micro-batch touches
  are read and written, so batch time follows the batch, not the number of
  partitions tracked.
- ``pending``: a MapState of the judgments waiting for their grace window,
  written per micro-batch as it changes them (streaming.pending_store).
- ``detector``: a ValueState with everything else (brokers, topics, quorum,
  remote segments), pickled, and a version number.

All are written in a versioned format (streaming.snapshot_format).

A Python worker keeps the unpickled detector between batches and reuses it
while the stored version matches; after a restart or a retried batch the
versions differ and the detector is reloaded from the store.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

from pyspark.sql.streaming.stateful_processor import MapState
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from detectors.history import History
from detectors.view import PartitionKey, PartitionState
from streaming import snapshot_format

PARTITION_KEY_SCHEMA = StructType(
    [StructField("topic", StringType()), StructField("partition", IntegerType())]
)
PARTITION_VALUE_SCHEMA = StructType([StructField("history", BinaryType())])
DETECTOR_SCHEMA = StructType([StructField("version", LongType()), StructField("snapshot", BinaryType())])

_MISSING = object()


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


class PartitionStore(MutableMapping[PartitionKey, History[PartitionState]]):
    """A dict-like view of the ``partitions`` MapState that reads lazily and,
    when :meth:`flush` is called, writes back what changed.

    Rules read far more partitions than metadata changes: writing back only
    changed histories saves a pickle and a state-server round trip per read."""

    # Histories kept in memory between batches; beyond this the cache is dropped
    # after a flush, so a worker's memory does not grow with the partition count.
    MAX_CACHED = 200_000

    def __init__(self) -> None:
        self._backend: MapState | None = None
        self._cache: dict[PartitionKey, History[PartitionState] | None] = {}
        # What the state store holds for each cached key, as a fingerprint (None: nothing).
        self._stored: dict[PartitionKey, Fingerprint] = {}
        self._touched: set[PartitionKey] = set()

    def attach(self, backend: MapState) -> None:
        self._backend = backend

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled with the detector snapshot as an empty shell: the partitions live in MapState.
        return (PartitionStore, ())

    def _load(self, key: PartitionKey) -> History[PartitionState] | None:
        cached = self._cache.get(key, _MISSING)
        if cached is not _MISSING:
            return cached  # type: ignore[return-value]
        assert self._backend is not None, "PartitionStore used before attach()"
        # One state-server round trip: getValue answers None for a key it does not hold.
        value = self._backend.getValue(key)
        history = snapshot_format.decode(value[0]) if value is not None else None
        self._cache[key] = history
        self._stored[key] = _fingerprint(history)
        return history

    def __getitem__(self, key: PartitionKey) -> History[PartitionState]:
        history = self._load(key)
        if history is None:
            raise KeyError(key)
        self._touched.add(key)  # the caller may mutate it
        return history

    def get(self, key: PartitionKey, default: Any = None) -> Any:  # type: ignore[override]
        history = self._load(key)
        if history is None:
            return default
        self._touched.add(key)
        return history

    def __contains__(self, key: object) -> bool:
        return self._load(key) is not None  # type: ignore[arg-type]

    def __setitem__(self, key: PartitionKey, value: History[PartitionState]) -> None:
        self._cache[key] = value  # a key never loaded is written at flush: nothing to compare with
        self._touched.add(key)

    def __delitem__(self, key: PartitionKey) -> None:
        if self._load(key) is None:
            raise KeyError(key)
        self._cache[key] = None
        self._touched.add(key)

    def __iter__(self) -> Iterator[PartitionKey]:
        raise TypeError("iterating every tracked partition would read the whole state store")

    def __len__(self) -> int:
        raise TypeError("the number of tracked partitions is not kept in memory")

    def flush(self) -> int:
        """Write back every partition changed since the last flush. Returns how many."""
        assert self._backend is not None
        written = 0
        for key in self._touched:
            history = self._cache.get(key)
            fingerprint = _fingerprint(history)
            if key in self._stored and _same(fingerprint, self._stored[key]):
                continue
            if history is None:
                self._backend.removeKey(key)
            else:
                self._backend.updateValue(key, (snapshot_format.encode(history),))
            self._stored[key] = fingerprint
            written += 1
        self._touched.clear()
        if len(self._cache) > self.MAX_CACHED:
            self._cache.clear()
            self._stored.clear()
        return written
