"""The detector's state inside Spark's state store.

Per cluster (the grouping key), two state variables:

- ``partitions``: a MapState from ``(topic key, partition)`` to that
  partition's pickled view history. Only the partitions a micro-batch touches
  are read and written, so batch time follows the batch, not the number of
  partitions tracked.
- ``detector``: a ValueState with everything else (brokers, topics, quorum,
  remote segments, pending judgments), pickled, and a version number.

A Python worker keeps the unpickled detector between batches and reuses it
while the stored version matches; after a restart or a retried batch the
versions differ and the detector is reloaded from the store.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, MutableMapping
from typing import Any

from pyspark.sql.streaming.stateful_processor import MapState
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from detectors.history import History
from detectors.view import PartitionKey, PartitionState

PARTITION_KEY_SCHEMA = StructType(
    [StructField("topic", StringType()), StructField("partition", IntegerType())]
)
PARTITION_VALUE_SCHEMA = StructType([StructField("history", BinaryType())])
DETECTOR_SCHEMA = StructType([StructField("version", LongType()), StructField("snapshot", BinaryType())])

_MISSING = object()


class PartitionStore(MutableMapping[PartitionKey, History[PartitionState]]):
    """A dict-like view of the ``partitions`` MapState that reads lazily and
    writes back what was touched when :meth:`flush` is called."""

    # Histories kept in memory between batches; beyond this the cache is dropped
    # after a flush, so a worker's memory does not grow with the partition count.
    MAX_CACHED = 200_000

    def __init__(self) -> None:
        self._backend: MapState | None = None
        self._cache: dict[PartitionKey, History[PartitionState] | None] = {}
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
        value = self._backend.getValue(key) if self._backend.containsKey(key) else None
        history = pickle.loads(value[0]) if value is not None else None
        self._cache[key] = history
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
        self._cache[key] = value
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
        """Write back every partition touched since the last flush. Returns how many."""
        assert self._backend is not None
        for key in self._touched:
            history = self._cache.get(key)
            if history is None:
                self._backend.removeKey(key)
            else:
                self._backend.updateValue(key, (pickle.dumps(history, protocol=pickle.HIGHEST_PROTOCOL),))
        written = len(self._touched)
        self._touched.clear()
        if len(self._cache) > self.MAX_CACHED:
            self._cache.clear()
        return written
