"""The detector state the job stores is versioned (streaming.snapshot_format)."""

from __future__ import annotations

import pickle

import pytest

from detectors.config import DetectorConfig
from detectors.engine import Detector
from streaming import snapshot_format
from streaming.snapshot_format import StateFormatError


def test_written_state_names_its_format_and_reads_back():
    detector = Detector(DetectorConfig(grace_ms=1234))
    data = snapshot_format.encode(detector)
    assert data[:4] == b"FWS" + bytes([snapshot_format.FORMAT])
    assert snapshot_format.decode(data).config.grace_ms == 1234


def test_state_written_before_formats_is_read_as_format_0():
    legacy = pickle.dumps(Detector(DetectorConfig(grace_ms=99)), protocol=pickle.HIGHEST_PROTOCOL)
    assert snapshot_format.decode(legacy).config.grace_ms == 99


def test_state_from_a_newer_release_is_refused_with_what_to_do():
    newer = b"FWS" + bytes([snapshot_format.FORMAT + 1]) + pickle.dumps({"anything": 1})
    refusal = rf"format {snapshot_format.FORMAT + 1}, written by a newer fencewatch.*new --checkpoint"
    with pytest.raises(StateFormatError, match=refusal):
        snapshot_format.decode(newer)
