"""A bucket's pending judgments in Spark's state store, apart from its detector.

Judgments wait for their grace window (detectors.engine); a busy bucket holds
thousands. Kept inside the detector's ValueState they were pickled and written
again after every micro-batch, most of them unchanged whenever they wait
longer than a batch lasts (docs/performance.md).
Here each micro-batch writes only what it changed, in the ``pending`` MapState:

- ``(chunk, 0)``: the judgments the batch scheduled and left waiting, one
  value for all of them; ``chunk`` is the state version the batch wrote.
- ``(chunk, v)``: the arrival numbers of that chunk's judgments decided by the
  batch that wrote state version ``v`` (``v`` > ``chunk``).

A chunk all of whose judgments are decided is removed with its records. A
partly decided one is not rewritten: its judgments are decided in (due_ms,
ts_ms, arrival) order, not chunk by chunk, so one chunk may be nibbled at over
several batches, and rewriting its rest each time would cost as much as the
chunk per batch; a record of the arrivals decided costs a few bytes each, once.
So a batch writes one value for what it scheduled, one small record per chunk
it decided judgments of, and removes the chunks it finished: work in
proportion to the batch, not to what is pending. Restoring (a new Python
worker, a restarted job, a retried batch) reads them all with one iterator call.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from pyspark.sql.streaming.stateful_processor import MapState
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from detectors.engine import PendingChanges, PendingJudgment
from streaming import snapshot_format

PENDING_KEY_SCHEMA = StructType([StructField("chunk", LongType()), StructField("record", LongType())])
PENDING_VALUE_SCHEMA = StructType([StructField("data", BinaryType())])

# The record of a chunk that holds its judgments; decided arrivals are recorded
# under the state version that decided them, which is at least 1.
JUDGMENTS = 0


@dataclass(slots=True)
class _Chunk:
    number: int
    last_arrival: int
    waiting: int  # judgments of the chunk not decided yet
    records: list[int] = field(default_factory=list)  # its records of decided arrivals


class PendingStore:
    """The ``pending`` MapState of one bucket, and an index of its chunks.

    Chunks are written in arrival order (a batch schedules judgments with
    arrival numbers above every earlier batch's), so the chunk of an arrival
    is found by bisecting the chunks' last arrivals."""

    def __init__(self) -> None:
        self._backend: MapState | None = None
        self._chunks: list[_Chunk] = []

    def attach(self, backend: MapState) -> None:
        """Use ``backend`` from now on: each task has its own MapState client,
        whose connection ends with the task, so a store cached between batches
        is attached again to every batch's."""
        self._backend = backend

    def load(self) -> list[PendingJudgment]:
        """Every judgment still waiting, from one iteration over the state."""
        assert self._backend is not None, "PendingStore used before attach()"
        stored: dict[int, list[PendingJudgment]] = {}
        decided: dict[int, set[int]] = {}
        records: dict[int, list[int]] = {}
        for (chunk, record), (data,) in self._backend.iterator():
            if record == JUDGMENTS:
                stored[chunk] = snapshot_format.decode(data)
            else:
                decided.setdefault(chunk, set()).update(snapshot_format.decode(data))
                records.setdefault(chunk, []).append(record)
        orphans = sorted(set(records) - set(stored))
        assert not orphans, f"decided-arrival records of chunks that are not stored: {orphans}"
        waiting: list[PendingJudgment] = []
        self._chunks = []
        for number in sorted(stored):
            judgments = stored[number]
            done = decided.get(number, set())
            rest = [j for j in judgments if j[2] not in done]
            self._chunks.append(
                _Chunk(number, max(j[2] for j in judgments), len(rest), sorted(records.get(number, [])))
            )
            waiting.extend(rest)
        return waiting

    def save(self, version: int, changes: PendingChanges) -> None:
        """Write ``changes`` (Detector.pending_changes) as the batch that writes
        state version ``version``."""
        assert self._backend is not None, "PendingStore used before attach()"
        by_chunk: dict[int, list[int]] = {}
        for arrival in changes.decided:
            i = bisect_left(self._chunks, arrival, key=_last_arrival)
            assert i < len(self._chunks), f"decided judgment {arrival} is in no stored chunk"
            by_chunk.setdefault(i, []).append(arrival)
        finished = False
        for i, arrivals in by_chunk.items():
            chunk = self._chunks[i]
            chunk.waiting -= len(arrivals)
            if chunk.waiting:
                self._backend.updateValue((chunk.number, version), (snapshot_format.encode(arrivals),))
                chunk.records.append(version)
                continue
            for record in (JUDGMENTS, *chunk.records):
                self._backend.removeKey((chunk.number, record))
            finished = True
        if finished:
            self._chunks = [c for c in self._chunks if c.waiting]
        if changes.scheduled:
            self._backend.updateValue((version, JUDGMENTS), (snapshot_format.encode(changes.scheduled),))
            arrivals = [j[2] for j in changes.scheduled]
            assert not self._chunks or min(arrivals) > self._chunks[-1].last_arrival, (
                "judgments scheduled out of order"
            )
            self._chunks.append(_Chunk(version, max(arrivals), len(arrivals)))


def _last_arrival(chunk: _Chunk) -> int:
    return chunk.last_arrival
