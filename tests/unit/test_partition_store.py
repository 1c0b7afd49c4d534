"""PartitionStore keeps a bucket's partition histories GROUP_SIZE to a state
entry and writes back exactly the groups whose histories changed. The backend
here is a dict with the MapState calls the store makes; the integration tests
run the store on Spark's real MapState."""

from __future__ import annotations

import pickle

from detectors.alerts import Evidence
from detectors.envelope import envelope_from_obj
from detectors.history import History
from detectors.view import ClusterView, PartitionState, Topic, history_of_plain
from producers import shapes
from streaming import snapshot_format
from streaming.state import GROUP_SIZE, PartitionStore
from tests.unit.recording_map_state import RecordingMapState

SOURCE = Evidence("view", "metadata", 0, None, 1, "mem:1", "partition record")
BUCKETS = 8
SPAN = GROUP_SIZE * BUCKETS  # partition indexes per group


def state(leader_epoch: int) -> PartitionState:
    return PartitionState(1, leader_epoch, leader_epoch, (1, 2), (1, 2), (), SOURCE)


def store_with(backend: RecordingMapState) -> PartitionStore:
    store = PartitionStore()
    store.attach(backend, BUCKETS)
    return store


def group(*members: tuple[int, History[PartitionState]]) -> tuple[bytes]:
    """A group as state formats 3 to 5 wrote it: each history pickled as its objects."""
    return (snapshot_format.encode({p: pickle.dumps(h) for p, h in members}),)


def stored(backend: RecordingMapState, topic: str, number: int) -> dict[int, History[PartitionState]]:
    """A group's histories: those written since as plain values, the others as they were."""
    members = {
        p: pickle.loads(b) for p, b in snapshot_format.decode(backend.values[(topic, number)][0]).items()
    }
    return {p: h if isinstance(h, History) else history_of_plain(h) for p, h in members.items()}


def test_a_group_is_read_once_and_reads_write_nothing_back():
    backend = RecordingMapState()
    backend.values[("t", 0)] = group((0, History(100, state(1))), (8, History(100, state(3))))
    store = store_with(backend)
    assert store.get(("t", 0)).latest.leader_epoch == 1
    assert store.get(("t", 8)).latest.leader_epoch == 3
    assert store.get(("t", 16)) is None
    assert ("t", SPAN) not in store  # the next group: not stored
    assert backend.reads == [("t", 0), ("t", 1)]
    assert store.flush() == 0
    assert backend.writes == []


def test_changed_new_and_removed_partitions_rewrite_their_groups_once():
    backend = RecordingMapState()
    backend.values[("t", 0)] = group((0, History(100, state(1))), (8, History(100, state(1))))
    backend.values[("t", 1)] = group((SPAN, History(100, state(1))))
    store = store_with(backend)
    store.get(("t", 0)).append(200, state(2))
    store[("t", 16)] = History(300, state(7))  # new, in a stored group
    store[("u", 0)] = History(300, state(4))  # new, in a new group
    del store[("t", SPAN)]  # its group's last member
    assert store.flush() == 4
    assert sorted(backend.writes) == [("remove", ("t", 1)), ("update", ("t", 0)), ("update", ("u", 0))]
    assert {p: h.latest.leader_epoch for p, h in stored(backend, "t", 0).items()} == {0: 2, 8: 1, 16: 7}
    assert {p: h.latest.leader_epoch for p, h in stored(backend, "u", 0).items()} == {0: 4}
    backend.writes.clear()
    store.get(("t", 0)).prune(250)
    assert store.flush() == 1 and backend.writes == [("update", ("t", 0))]
    assert len(stored(backend, "t", 0)[0]) == 1
    backend.writes.clear()
    store.get(("t", 0))
    store.get(("u", 0))
    assert store.flush() == 0 and backend.writes == []


def test_a_partition_added_and_removed_in_one_batch_writes_nothing():
    backend = RecordingMapState()
    store = store_with(backend)
    store[("t", 3)] = History(100, state(1))
    del store[("t", 3)]
    store.flush()
    assert backend.writes == [] and backend.values == {}


def test_groups_follow_the_bucket_count():
    """A bucket of 8 holds every 8th partition: 64 of them span 512 indexes."""
    backend = RecordingMapState()
    store = store_with(backend)
    for index in range(3, 3 * SPAN, BUCKETS):  # bucket 3's partitions of three groups
        store[("t", index)] = History(100, state(1))
    store.flush()
    assert sorted(backend.values) == [("t", 0), ("t", 1), ("t", 2)]
    assert all(len(stored(backend, "t", n)) == GROUP_SIZE for n in range(3))


def test_a_snapshot_of_many_partitions_costs_a_read_and_a_write_per_group():
    backend = RecordingMapState()
    store = store_with(backend)
    for topic in ("a", "b"):
        for index in range(0, 4 * SPAN, BUCKETS):
            assert store.get((topic, index)) is None  # what a PARTITION_RECORD's handler asks first
            store[(topic, index)] = History(100, state(1))
    assert store.flush() == 2 * 4 * GROUP_SIZE
    assert len(backend.reads) == 8 and len(backend.writes) == 8


def test_partitions_of_earlier_formats_are_adopted_into_groups():
    legacy = RecordingMapState()
    # A bare pickle (format 0, up to c80c2e7) and a format-1/2 value behind the header.
    legacy.values[("t", 0)] = (pickle.dumps(History(100, state(1))),)
    legacy.values[("t", 8)] = (b"FWS\x02" + pickle.dumps(History(100, state(2))),)
    legacy.values[("u", SPAN)] = (b"FWS\x01" + pickle.dumps(History(100, state(3))),)
    backend = RecordingMapState()
    store = store_with(backend)
    assert store.adopt(legacy.iterator()) == 3
    assert store.flush() == 3
    assert {p: h.latest.leader_epoch for p, h in stored(backend, "t", 0).items()} == {0: 1, 8: 2}
    assert {p: h.latest.leader_epoch for p, h in stored(backend, "u", 1).items()} == {SPAN: 3}


def test_the_cache_is_dropped_beyond_its_bound_and_groups_are_read_again():
    backend = RecordingMapState()
    store = store_with(backend)
    store.MAX_CACHED = 10
    for index in range(0, 12 * BUCKETS, BUCKETS):
        store[("t", index)] = History(100, state(1))
    store.flush()
    backend.reads.clear()
    assert store.get(("t", 0)).latest.leader_epoch == 1
    assert backend.reads == [("t", 0)]


def test_between_batches_only_pickled_histories_are_held():
    """Decoded histories are dropped at flush (the collector would scan them
    every full collection); the next batch decodes them again from the group's
    bytes, without another state read."""
    backend = RecordingMapState()
    backend.values[("t", 0)] = group((0, History(100, state(1))))
    store = store_with(backend)
    first = store.get(("t", 0))
    first.append(200, state(2))
    store.flush()
    again = store.get(("t", 0))
    assert again is not first and again.latest.leader_epoch == 2
    assert backend.reads == [("t", 0)]


def test_histories_written_as_objects_load_and_are_written_back_as_plain_values():
    clock = Evidence("clock", "request", 150, 3, None, "mem:9", "clock bound", -40, 25)
    old = History(100, state(1))
    old.append(200, PartitionState(2, 2, 2, (2,), (1, 2), (1,), clock))
    backend = RecordingMapState()
    backend.values[("t", 0)] = group((0, old))
    store = store_with(backend)
    history = store.get(("t", 0))
    assert history.items() == old.items()
    history.append(300, state(3))
    assert store.flush() == 1
    (plain,) = snapshot_format.decode(backend.values[("t", 0)][0]).values()
    assert not isinstance(pickle.loads(plain), History)  # plain values, no classes
    again = store_with(backend).get(("t", 0))
    assert again.items() == (
        [100, 200, 300],
        [state(1), PartitionState(2, 2, 2, (2,), (1, 2), (1,), clock), state(3)],
    )


def metadata(offset: int, body: dict) -> object:
    return envelope_from_obj(shapes.envelope("c", "metadata", 1000 + offset, body, offset=offset))


def test_a_new_topics_partitions_are_stored_without_reading_their_groups():
    """A snapshot's new topics: the view tells the store that nothing past the
    indexes it has seen is stored, so creating a million partitions reads no
    group; a partition stated again is read as before."""
    backend = RecordingMapState()
    store = store_with(backend)
    view = ClusterView(60_000, store)
    view.apply(metadata(1, shapes.topic("orders", "T")))
    offset = 2
    for index in range(3, 2 * SPAN, BUCKETS):  # bucket 3's partitions of two groups
        offset += 1
        view.apply(metadata(offset, shapes.partition("T", index, [1, 2], [1, 2], 1)))
    assert backend.reads == []
    assert store.flush() == 2 * GROUP_SIZE
    for index in range(2 * SPAN + 3, 3 * SPAN, BUCKETS):  # the next batch: a third group, wholly new
        offset += 1
        view.apply(metadata(offset, shapes.partition("T", index, [1, 2], [1, 2], 1)))
    assert backend.reads == []
    view.apply(metadata(offset + 1, shapes.partition("T", SPAN + 3, [1, 2], [1, 2], 2, 1, 1)))  # stated again
    assert backend.reads == []  # its group was written by this store, and is held as bytes
    assert store.flush() == GROUP_SIZE + 1
    assert [len(stored(backend, "T", n)) for n in range(3)] == [GROUP_SIZE] * 3
    assert len(stored(backend, "T", 1)[SPAN + 3]) == 2  # its history went on


def test_the_views_word_that_nothing_is_stored_ends_at_the_flush():
    backend = RecordingMapState()
    backend.values[("t", 1)] = group((SPAN, History(100, state(1))))
    store = store_with(backend)
    store.none_stored_from("t", 2 * SPAN)
    assert store.get(("t", 2 * SPAN)) is None and backend.reads == []
    assert store.get(("t", SPAN)).latest.leader_epoch == 1  # below the word: read
    assert backend.reads == [("t", 1)]
    store.flush()
    assert store.get(("t", 3 * SPAN)) is None
    assert backend.reads == [("t", 1), ("t", 3)]


def test_a_topic_from_an_older_view_has_its_groups_read():
    """A view pickled by state format 5 or before may hold a topic whose count
    a snapshot's statement of it reset while its histories stayed stored: its
    partitions are looked up as before, so a group is never written over."""
    backend = RecordingMapState()
    backend.values[("T", 0)] = group((3, History(100, state(1))), (11, History(100, state(1))))
    store = store_with(backend)
    view = ClusterView(60_000, store)
    view.topics["T"] = Topic("orders")  # as unpickled: count reset to 0, not counted
    view.apply(metadata(5, shapes.partition("T", 3, [1, 2], [1, 2], 1, 1, 1)))
    assert backend.reads == [("T", 0)]
    store.flush()
    assert {p: len(h) for p, h in stored(backend, "T", 0).items()} == {3: 2, 11: 1}
