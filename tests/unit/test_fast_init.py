"""detectors.fast_init: the per-record dataclasses built through their slots'
descriptors keep what the dataclass gave them."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from detectors.alerts import Evidence
from detectors.envelope import Envelope
from detectors.fast_init import fast_init
from detectors.requests import Header, PartitionOutcome


@pytest.mark.parametrize("cls", [Envelope, Header, PartitionOutcome, Evidence])
def test_each_field_is_stored_through_its_slot(cls):
    stores = cls.__init__.__globals__
    for f in dataclasses.fields(cls):
        assert stores.get(f"_set_{f.name}") == cls.__dict__[f.name].__set__


def test_defaults_keywords_equality_hash_and_immutability_are_kept():
    env = Envelope("c", 1, 5, "request", None, {"a": 1})
    assert (env.position, env.seq, env.read_digest) == ("", 0, None)
    assert env == Envelope(cluster="c", node=1, ts_ms=5, kind="request", offset=None, body={"a": 1})
    # The read digest is not part of what an envelope says.
    assert env == Envelope("c", 1, 5, "request", None, {"a": 1}, "", 0, b"digest")
    outcome = PartitionOutcome("t", None, 1, 2, 0)
    assert hash(outcome) == hash(PartitionOutcome("t", None, 1, 2, 0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        outcome.epoch = 3  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(env)) == env
    with pytest.raises(TypeError, match="missing"):
        Header(1, 2, 3)  # type: ignore[call-arg]


def test_only_a_frozen_slots_dataclass_is_taken():
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    with pytest.raises(AssertionError, match="not a frozen slots dataclass"):
        fast_init(NoSlots)
