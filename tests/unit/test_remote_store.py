"""RemoteStore keeps each partition's remote segments in one state entry, reads
it when a batch first names the partition, and writes back only what changed.
The backend here is a dict with the MapState calls the store makes; the
operator tests (test_pending_store.py) and the job's run it on Spark's."""

from __future__ import annotations

import pickle

import pytest

from detectors.remote import PartitionSegments, Segment
from streaming import snapshot_format
from streaming.state import RemoteStore
from tests.unit.recording_map_state import RecordingMapState

P0, P1 = ("topic-id", 0), ("topic-id", 1)


def segments(*ids: str) -> PartitionSegments:
    return PartitionSegments(segments={i: Segment(i, P0, 1, {0: 100}) for i in ids})


def stored(backend: RecordingMapState, key: tuple[str, int]) -> PartitionSegments:
    return snapshot_format.decode(backend.values[key][0])


def attached(backend: RecordingMapState) -> RemoteStore:
    store = RemoteStore()
    store.attach(backend)  # type: ignore[arg-type]
    return store


def test_a_partition_is_read_once_and_an_unchanged_one_is_not_written_back():
    backend = RecordingMapState()
    backend.values[P0] = (snapshot_format.encode(segments("a", "b")),)
    store = attached(backend)
    assert sorted(store[P0].segments) == ["a", "b"]
    assert store.get(P0) is store[P0]  # one object for the batch
    assert store.get(P1) is None and P1 not in store
    assert backend.reads == [P0, P1]
    assert store.flush() == 0
    assert backend.writes == []


def test_changed_new_and_deleted_partitions_are_written_and_removed():
    backend = RecordingMapState()
    backend.values[P0] = (snapshot_format.encode(segments("a")),)
    backend.values[P1] = (snapshot_format.encode(segments("z")),)
    store = attached(backend)
    store[P0].segments["a"].state = 1
    del store[P1]
    store[("other", 3)] = segments("n")
    assert store.flush() == 3
    assert sorted(backend.writes) == [("remove", P1), ("update", ("other", 3)), ("update", P0)]
    assert stored(backend, P0).segments["a"].state == 1
    assert P1 not in backend.values
    with pytest.raises(KeyError):
        del store[P1]


def test_between_batches_what_was_read_is_held_as_bytes_not_read_again():
    backend = RecordingMapState()
    backend.values[P0] = (snapshot_format.encode(segments("a")),)
    store = attached(backend)
    first = store[P0]
    first.segments["a"].state = 1
    store.flush()
    second = store[P0]  # the next batch: decoded again, no state call
    assert backend.reads == [P0]
    assert second is not first and second.segments["a"].state == 1


def test_it_pickles_as_an_empty_shell_and_refuses_to_be_listed():
    store = attached(RecordingMapState())
    store[P0] = segments("a")
    copy = pickle.loads(pickle.dumps(store))
    copy.attach(RecordingMapState())  # type: ignore[arg-type]
    assert copy.get(P0) is None  # what the store held did not travel with the detector
    with pytest.raises(TypeError):
        len(copy)
    with pytest.raises(TypeError):
        list(copy)


def test_adopted_partitions_of_an_earlier_format_are_written_at_the_next_flush():
    backend = RecordingMapState()
    store = attached(backend)
    assert store.adopt({P0: segments("a"), P1: segments("b", "c")}) == 2
    assert store.flush() == 2
    assert sorted(stored(backend, P1).segments) == ["b", "c"]
