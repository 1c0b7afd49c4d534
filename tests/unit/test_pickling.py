"""The detector's state pickles through each dataclass's own constructor
(detectors.pickling) and restores to a detector that goes on exactly as the
original does."""

from __future__ import annotations

import dataclasses
import pickle

from detectors import alerts, envelope, quorum, remote, requests, view
from detectors.engine import Detector
from detectors.envelope import envelope_from_obj
from detectors.pickling import fast_pickle
from producers.simulator import SimConfig, Simulator


def test_a_detector_restored_mid_history_raises_what_the_original_raises():
    events = [
        envelope_from_obj(e, "sim", i)
        for i, e in enumerate(Simulator(SimConfig(seed=5, fault_rate=0.01)).events(24_000))
    ]
    original = Detector(now_ms=int)
    for env in events[:12_000]:
        original.ingest(env)
    blob = pickle.dumps(original, protocol=pickle.HIGHEST_PROTOCOL)
    restored = pickle.loads(blob)
    assert original.pending_count() > 100  # judgments waiting, with their envelopes and facts
    for detector in (original, restored):
        for env in events[12_000:]:
            detector.ingest(env)
        detector.flush()
    raised = [a.to_dict() for a in original.drain()]
    assert raised
    assert [{**a.to_dict(), "detected_ms": 0} for a in restored.drain()] == [
        {**a, "detected_ms": 0} for a in raised
    ]


def slots_dataclasses() -> list[type]:
    classes = []
    for module in (alerts, envelope, quorum, remote, requests, view):
        for obj in vars(module).values():
            own = isinstance(obj, type) and obj.__module__ == module.__name__
            if own and "__slots__" in vars(obj) and dataclasses.is_dataclass(obj):
                classes.append(obj)
    return classes


def test_no_state_object_restores_through_the_generic_dataclass_path(monkeypatch):
    detector = Detector(now_ms=int)
    for i, raw in enumerate(Simulator(SimConfig(seed=6, fault_rate=0.01)).events(12_000)):
        detector.ingest(envelope_from_obj(raw, "sim", i))
    blob = pickle.dumps(detector, protocol=pickle.HIGHEST_PROTOCOL)

    def refuse(self, state):
        raise AssertionError(f"{type(self).__name__} restored through __setstate__, not fast_pickle")

    classes = slots_dataclasses()
    assert len(classes) >= 20
    for cls in classes:
        monkeypatch.setattr(cls, "__setstate__", refuse, raising=False)
    restored = pickle.loads(blob)
    assert restored.pending_count() == detector.pending_count()


@fast_pickle
@dataclasses.dataclass(frozen=True, slots=True)
class Later:
    first: int
    added: tuple[int, ...] = ()


def test_state_pickled_before_a_field_was_added_restores_with_its_default():
    """Both forms older releases wrote: a frozen dataclass's field list
    (dataclasses' ``__getstate__``) and a plain slots class's ``(None, slots)``."""
    key = ("t", 0)
    old_view = remote.RemoteView.__new__(remote.RemoteView)
    old_view.__setstate__((None, {"segments": {}, "partitions": {key: remote.PartitionSegments()}}))
    assert old_view.partitions == {key: remote.PartitionSegments()} and old_view.deleting == {}
    later = Later.__new__(Later)
    later.__setstate__([7])  # written when ``Later`` had only its first field
    assert (later.first, later.added) == (7, ())
    claim = quorum.QuorumView.__new__(quorum.QuorumView)
    claim.__setstate__((None, {}))
    assert claim.log_epoch is None and claim.voters == ()
