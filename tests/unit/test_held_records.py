"""Records an offset-ordered log holds, across the pickles the streaming job
makes of a bucket's detector after every micro-batch: pickled once, applied
as if never pickled, and loaded from the state form of earlier releases."""

from __future__ import annotations

import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors.envelope import Envelope, envelope_from_obj
from detectors.redelivery import Arrival, OffsetOrder
from producers import shapes as s


def _metadata(offset: int, ts_ms: int) -> Envelope:
    return envelope_from_obj(s.envelope("c", "metadata", ts_ms, s.feature_level(21), offset=offset))


def _round_trip(log: OffsetOrder) -> OffsetOrder:
    loaded = pickle.loads(pickle.dumps(log, pickle.HIGHEST_PROTOCOL))
    assert isinstance(loaded, OffsetOrder)
    return loaded


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), chunk_min=st.sampled_from([1, 4, OffsetOrder.CHUNK_MIN]))
def test_a_log_pickled_between_any_steps_applies_what_one_never_pickled_applies(seed, chunk_min):
    rng = random.Random(seed)
    plain, pickled = OffsetOrder(), OffsetOrder()
    pickled.CHUNK_MIN = chunk_min  # type: ignore[misc]  # chunks of every size, and none
    for step in range(200):
        roll = rng.random()
        if roll < 0.6:
            # Offsets ahead with gaps, re-deliveries and late ones; time follows the offset.
            offset = rng.randrange(0, 120)
            env = _metadata(offset, 1000 + 10 * offset)
            assert pickled.offer(env) is plain.offer(env), (step, offset)
        elif roll < 0.8:
            watermark = None if rng.random() < 0.05 else 1000 + 10 * rng.randrange(0, 120)
            assert list(pickled.ready(watermark)) == list(plain.ready(watermark)), step
        else:
            pickled = _round_trip(pickled)
        assert pickled.held_count() == plain.held_count()
        assert pickled.last == plain.last
    assert list(pickled.ready(None)) == list(plain.ready(None))


def test_a_held_record_is_pickled_once_however_many_pickles_hold_it(monkeypatch):
    pickled: list[int | None] = []
    reduce = Envelope.__reduce__

    def counted(env):
        pickled.append(env.offset)
        return reduce(env)

    monkeypatch.setattr(Envelope, "__reduce__", counted)
    log = OffsetOrder()
    many = range(5, 5 + 2 * OffsetOrder.CHUNK_MIN, 2)
    for offset in many:
        assert log.offer(_metadata(offset, 1000)) is Arrival.HELD
    first = pickle.dumps(log, pickle.HIGHEST_PROTOCOL)
    assert sorted(pickled) == list(many)
    assert pickle.dumps(log, pickle.HIGHEST_PROTOCOL) == first
    loaded = pickle.loads(first)
    pickled.clear()
    pickle.dumps(loaded, pickle.HIGHEST_PROTOCOL)
    assert pickled == []  # loaded, they are still the bytes they were saved as
    log.offer(_metadata(1000, 1000))
    pickle.dumps(log, pickle.HIGHEST_PROTOCOL)
    pickle.dumps(log, pickle.HIGHEST_PROTOCOL)
    # Too few to be worth a chunk: the newly held one is pickled with the log, each time.
    assert pickled == [1000, 1000]
    assert [e.offset for e in pickle.loads(pickle.dumps(log)).ready(None)] == [*many, 1000]


def test_applied_records_leave_the_pickle_and_a_chunk_partly_applied_keeps_the_rest():
    log = OffsetOrder()
    log.offer(_metadata(1, 1000))
    assert [e.offset for e in log.ready(1000)] == [1]
    for offset, ts_ms in ((3, 1003), (4, 1004), (6, 1006)):
        log.offer(_metadata(offset, ts_ms))
    empty = len(pickle.dumps(OffsetOrder(), pickle.HIGHEST_PROTOCOL))
    loaded = _round_trip(log)
    assert [e.offset for e in loaded.ready(1004)] == [3, 4]
    again = _round_trip(loaded)
    assert again.held_count() == 1
    assert again.offer(_metadata(6, 1006)) is Arrival.DUPLICATE
    assert again.offer(_metadata(4, 1004)) is Arrival.DUPLICATE
    assert again.offer(_metadata(5, 1005)) is Arrival.APPLY
    assert [(e.offset, e.ts_ms) for e in again.ready(0)] == [(6, 1006)]
    assert again.held_count() == 0
    # Nothing held: the pickle is as small as an empty log's, give or take the numbers in it.
    assert len(pickle.dumps(again, pickle.HIGHEST_PROTOCOL)) < empty + 64


def test_a_log_saved_with_its_held_records_in_the_heap_loads_and_applies_them():
    """State format 4 and before: (offset, envelope) pairs in the heap."""
    log = OffsetOrder.__new__(OffsetOrder)
    held = [(3, _metadata(3, 1003)), (5, _metadata(5, 1005))]
    log.__setstate__({"last": 1, "_held": held, "_held_offsets": {3, 5}, "_gap_firsts": [], "_gap_lasts": []})
    assert log.offer(_metadata(5, 1005)) is Arrival.DUPLICATE
    assert log.offer(_metadata(2, 1002)) is Arrival.APPLY
    assert [e.offset for e in log.ready(1003)] == [3]
    loaded = _round_trip(log)  # and saved again in the new form
    assert [e.offset for e in loaded.ready(1005)] == [5]


@pytest.mark.parametrize("held", [1, 1000])
def test_a_pickle_of_held_records_is_about_as_large_as_the_records_pickled_together(held):
    log = OffsetOrder()
    records = [_metadata(offset, 1000) for offset in range(10, 10 + 2 * held, 2)]
    for env in records:
        log.offer(env)
    together = len(pickle.dumps(records, pickle.HIGHEST_PROTOCOL))
    # Their offsets and times twice more (8 bytes each), and the log's own fields.
    assert len(pickle.dumps(log, pickle.HIGHEST_PROTOCOL)) < together + 17 * held + 400
