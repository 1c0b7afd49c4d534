"""The simulator's native forms (``SimConfig.native_forms``,
producers/native_forms.py): quorum states and remote log metadata rendered as
the quorum-state file and the RemoteLogMetadataFormatter line Kafka writes, and
read back with fencewatch's own parsers, so that the properties of
``test_simulated_histories.py`` also hold on the path real clusters' records
take (``fencewatch ship quorum-state`` / ``ship remote-log-metadata``):

- the renderings are Kafka's forms byte for byte (the samples in tests/data/native);
- a history without faults raises nothing; every injected fault is caught by
  its rule and nothing else is raised (REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED
  from the segments' ``segmentLeaderEpochs`` and ``endOffset``: no native form
  carries cleaner offsets);
- the same history gives the same alerts and counts on the envelope path and
  on the native path, although the native remote records have no offset;
- the files kept with ``native_dir`` read back to the envelopes the history
  holds.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from detectors.envelope import Envelope, envelope_from_obj
from detectors.parse_quorum_state import parse_quorum_state
from detectors.parse_remote_log_metadata import iter_remote_log_metadata
from detectors.truth import match_key
from producers.native_forms import (
    REMOTE_LOG_METADATA_FILE,
    kafka_uuid,
    quorum_state_file,
    record_string,
)
from producers.simulator import SimConfig, Simulator
from tests.unit.test_simulated_histories import (
    FAULT_RULES,
    WARMUP_MS,
    Run,
    assert_detected_exactly,
    assert_rule_alone_detected_exactly,
    assert_same_alerts,
    delayed_arrival,
    detect,
    envelopes,
    examples,
    seeds,
)

NATIVE = Path(__file__).resolve().parents[1] / "data" / "native"
NATIVE_RULES = [r for r in FAULT_RULES if r.startswith(("QUORUM_", "REMOTE_"))]
ZOMBIE_UPLOAD = "REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED"


def simulate(
    seed: int,
    fault_rate: float,
    faults: tuple[str, ...] = (),
    *,
    native: bool = True,
    warmup_ms: int = WARMUP_MS,
    native_dir: str | None = None,
) -> Simulator:
    config = SimConfig(
        seed=seed, fault_rate=fault_rate, faults=faults, warmup_ms=warmup_ms, native_forms=native
    )
    return Simulator(config, native_dir=native_dir)


def assert_native(history: list[Envelope]) -> None:
    """The quorum and remote records are the parsers' (remote: its
    ``__remote_log_metadata`` partition and offset, no node)."""
    remote = [e for e in history if e.kind == "remote_log_metadata"]
    quorum = [e for e in history if e.kind == "quorum_state"]
    assert remote and quorum
    assert all(type(e.offset) is int and type(e.body["partition"]) is int and e.node is None for e in remote)
    assert all(e.body["data_version"] == 0 for e in quorum)


# ---- the renderings are Kafka's forms ---------------------------------------------------------------


def test_a_quorum_state_renders_as_the_file_kafka_writes():
    sample = (NATIVE / "quorum-state-v0.json").read_bytes()
    env = parse_quorum_state(sample, source="sample", cluster="c", node=1, ts_ms=0)
    assert isinstance(env, Envelope)
    assert quorum_state_file(env.body) == sample


def test_remote_log_metadata_renders_as_the_formatter_prints_it():
    """Every sample line the formatter printed with empty custom metadata comes
    back byte for byte (the parser keeps only custom metadata's length)."""
    compared = 0
    for name in ("remote-log-metadata.txt", "remote-log-metadata-lifecycle.txt"):
        lines = (NATIVE / name).read_text().splitlines()
        for line, env in zip(lines, iter_remote_log_metadata(lines, source=name, cluster="c"), strict=False):
            assert isinstance(env, Envelope)
            if "CustomMetadata{" in line:
                continue
            prefix = re.match(r"partition: \d+, offset: \d+, value: ", line)
            assert prefix is not None
            assert prefix.group(0) + record_string(env.body, env.ts_ms) == line
            compared += 1
    assert compared >= 15


def test_a_readable_segment_id_becomes_one_kafka_uuid():
    assert kafka_uuid("6LwWPILu4YczKIx9SsY22w") == "6LwWPILu4YczKIx9SsY22w"
    uuid = kafka_uuid("seg-00000001")
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", uuid)
    assert uuid == kafka_uuid("seg-00000001") != kafka_uuid("seg-00000002")


def test_zombie_uploads_are_injected_in_native_forms_and_carry_no_cleaner_offsets():
    sim = simulate(1, 0.02, faults=(ZOMBIE_UPLOAD,))
    assert ZOMBIE_UPLOAD in simulate(1, 0.01).enabled
    history = envelopes(sim, 20_000)
    segments = [e.body["data"] for e in history if e.body.get("type") == "RemoteLogSegmentMetadataRecord"]
    assert segments and all("cleanerOffsets" not in d and d["segmentLeaderEpochs"] for d in segments)
    assert sim.injected.get(ZOMBIE_UPLOAD, 0) > 0
    with pytest.raises(ValueError, match="needs native_forms"):
        simulate(1, 0.01, native=False, native_dir="/nonexistent")


# ---- the property tests, on the native path ---------------------------------------------------------


@examples(2)
@given(seed=seeds, events=st.integers(20_000, 30_000))
def test_a_native_history_without_faults_raises_nothing(seed, events):
    sim = simulate(seed, fault_rate=0.0, warmup_ms=SimConfig().warmup_ms)
    history = envelopes(sim, events)
    assert_native(history)
    run = detect(history)
    assert sim.truth == []
    assert run.dead_letters == []
    assert [(a.rule, a.node, a.ts_ms, a.message) for a in run.alerts] == []
    assert run.counters.late == 0


@examples(3)
@given(seed=seeds, events=st.integers(20_000, 30_000), fault_rate=st.floats(0.005, 0.02))
def test_every_fault_injected_in_native_forms_is_detected_and_nothing_else(seed, events, fault_rate):
    sim = simulate(seed, fault_rate)
    history = envelopes(sim, events)
    assert_native(history)
    assert_detected_exactly(sim, detect(history))


@pytest.mark.parametrize("rule", NATIVE_RULES)
@examples(1)
@given(seed=seeds)
def test_each_quorum_and_remote_rule_alone_is_detected_exactly_in_native_forms(rule, seed):
    events = 24_000 if rule.startswith("QUORUM_") else 16_000
    sim = simulate(seed, 0.01, faults=(rule,))
    assert_rule_alone_detected_exactly(rule, sim, detect(envelopes(sim, events)))


def same_alerts(envelope_path: Run, native_path: Run) -> None:
    """Alerts match on what identifies a violation (``detectors.truth``); their
    ids differ only where they name a remote segment, whose readable simulator
    id prints as a Kafka Uuid."""
    assert sorted(map(repr, (match_key(a.to_dict()) for a in native_path.alerts))) == sorted(
        map(repr, (match_key(a.to_dict()) for a in envelope_path.alerts))
    )
    not_remote = [
        sorted(a.alert_id for a in run.alerts if not a.rule.startswith("REMOTE_"))
        for run in (envelope_path, native_path)
    ]
    assert not_remote[0] == not_remote[1]
    assert native_path.counters.events == envelope_path.counters.events
    assert native_path.counters.unverified == envelope_path.counters.unverified
    assert native_path.counters.duplicates == envelope_path.counters.duplicates


@examples(3)
@given(seed=seeds, events=st.integers(16_000, 24_000), fault_rate=st.sampled_from([0.0, 0.01, 0.02]))
def test_the_native_path_raises_what_the_envelope_path_raises_on_the_same_history(seed, events, fault_rate):
    plain, native = (simulate(seed, fault_rate, native=n) for n in (False, True))
    envelope_path = detect(envelopes(plain, events))
    native_path = detect(envelopes(native, events))
    assert native.truth == plain.truth
    assert native_path.dead_letters == envelope_path.dead_letters == []
    same_alerts(envelope_path, native_path)


@examples(1)
@given(seed=seeds, events=st.integers(20_000, 28_000), shuffle_seed=seeds)
def test_per_source_delays_within_lateness_change_no_native_alert(seed, events, shuffle_seed):
    history = envelopes(simulate(seed, 0.01), events)
    arrival, delays = delayed_arrival(history, random.Random(shuffle_seed))
    assert arrival != history, f"the delays {delays} reordered nothing"
    assert_same_alerts(detect(history), detect(arrival))


def test_the_kept_native_files_read_back_to_the_history(tmp_path):
    sim = simulate(7, 0.01, native_dir=str(tmp_path))
    history = [envelope_from_obj(raw, f"sim:{i}", i) for i, raw in enumerate(sim.events(20_000))]
    remote = [e.to_dict() for e in history if e.kind == "remote_log_metadata"]
    with open(tmp_path / REMOTE_LOG_METADATA_FILE, "rb") as f:
        kept = [e.to_dict() for e in iter_remote_log_metadata(f, source="kept", cluster=sim.config.cluster)]
    assert kept == remote
    states = [e for e in history if e.kind == "quorum_state"]
    controllers = sorted({e.node for e in states if e.node is not None})
    assert controllers == [3000, 3001, 3002]
    for node in controllers:
        own = [e.body for e in states if e.node == node]
        files = sorted(
            (tmp_path / f"controller-{node}").glob("quorum-state.*"), key=lambda p: int(p.suffix[1:])
        )
        assert [quorum_state_file(body) for body in own] == [p.read_bytes() for p in files]
        assert (tmp_path / f"controller-{node}" / "quorum-state").read_bytes() == files[-1].read_bytes()
