"""PartitionStore writes back exactly the partition histories that changed.
The backend here is a dict with the three MapState calls the store makes; the integration tests
run the store on Spark's real MapState."""

from __future__ import annotations

import pickle

from detectors.alerts import Evidence
from detectors.history import History
from detectors.view import PartitionState
from streaming import snapshot_format
from streaming.state import PartitionStore
from tests.unit.recording_map_state import RecordingMapState

SOURCE = Evidence("view", "metadata", 0, None, 1, "mem:1", "partition record")


def state(leader_epoch: int) -> PartitionState:
    return PartitionState(1, leader_epoch, leader_epoch, (1, 2), (1, 2), (), SOURCE)


def store_with(backend: RecordingMapState) -> PartitionStore:
    store = PartitionStore()
    store.attach(backend)
    return store


def test_reads_write_nothing_back():
    backend = RecordingMapState()
    # A bare pickle: what releases up to c80c2e7 wrote (state format 0).
    backend.values[("t", 0)] = (pickle.dumps(History(100, state(1))),)
    store = store_with(backend)
    assert store.get(("t", 0)).latest.leader_epoch == 1
    assert store.get(("t", 1)) is None
    assert ("t", 2) not in store
    assert store.flush() == 0
    assert backend.writes == []


def test_appends_prunes_new_and_removed_partitions_are_written_once():
    backend = RecordingMapState()
    backend.values[("t", 0)] = (snapshot_format.encode(History(100, state(1))),)
    backend.values[("t", 1)] = (snapshot_format.encode(History(100, state(1))),)
    store = store_with(backend)
    store.get(("t", 0)).append(200, state(2))
    store[("t", 5)] = History(300, state(7))
    del store[("t", 1)]
    assert store.flush() == 3
    assert sorted(backend.writes) == [("remove", ("t", 1)), ("update", ("t", 0)), ("update", ("t", 5))]
    assert snapshot_format.decode(backend.values[("t", 0)][0]).latest.leader_epoch == 2
    backend.writes.clear()
    store.get(("t", 0)).prune(250)
    assert store.flush() == 1 and backend.writes == [("update", ("t", 0))]
    assert len(snapshot_format.decode(backend.values[("t", 0)][0])) == 1
    backend.writes.clear()
    store.get(("t", 0))
    store.get(("t", 5))
    assert store.flush() == 0 and backend.writes == []
