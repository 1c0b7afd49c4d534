"""A controller's quorum-state file -> ``quorum_state`` envelopes (SPEC 1.4),
detectors/parse_quorum_state.py.

The samples in tests/data/native follow Kafka's FileQuorumStateStore (see the
README there): data_version 0 with ``currentVoters``, data_version 1
(KIP-853) with ``votedDirectoryId`` and no voters.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson
import pytest

from detectors.engine import Detector
from detectors.envelope import DeadLetter, DeadLetterClass, Envelope
from detectors.parse_quorum_state import QuorumStateStats, parse_quorum_state
from producers import shapes as s

NATIVE = Path(__file__).resolve().parents[1] / "data" / "native"
V0 = (NATIVE / "quorum-state-v0.json").read_bytes()
V1 = (NATIVE / "quorum-state-v1.json").read_bytes()
TS = 1795168800000


def parse(data: bytes | io.BytesIO, *, node: int = 1, ts_ms: int = TS, **kw: Any) -> Envelope | DeadLetter:
    return parse_quorum_state(data, source="qs", cluster="prod-eu-1", node=node, ts_ms=ts_ms, **kw)


def v0(**fields: Any) -> bytes:
    """The v0 sample with ``fields`` replaced (``...`` removes one)."""
    return _edit(V0, fields)


def v1(**fields: Any) -> bytes:
    return _edit(V1, fields)


def _edit(sample: bytes, fields: dict[str, Any]) -> bytes:
    body = orjson.loads(sample)
    for key, value in fields.items():
        if value is ...:
            body.pop(key)
        else:
            body[key] = value
    return orjson.dumps(body)


# ---- both versions -----------------------------------------------------------------


def test_version_0_becomes_an_envelope_with_the_file_object_unchanged():
    stats = QuorumStateStats()
    item = parse(V0, stats=stats)

    assert isinstance(item, Envelope)
    assert (item.cluster, item.node, item.ts_ms, item.kind, item.offset) == (
        "prod-eu-1",
        1,
        TS,
        "quorum_state",
        None,
    )
    assert item.body == orjson.loads(V0)
    assert item.body["currentVoters"] == [{"voterId": 1}, {"voterId": 2}, {"voterId": 3}]
    assert item.position == "qs:1"
    assert stats == QuorumStateStats(files=1, records=1, dead_letters=0, records_by_version={0: 1})


def test_version_1_has_a_voted_directory_and_no_voters():
    stats = QuorumStateStats()
    item = parse(io.BytesIO(V1), node=2, stats=stats)

    assert isinstance(item, Envelope)
    assert item.node == 2
    assert item.body == orjson.loads(V1)
    assert "currentVoters" not in item.body and item.body["votedDirectoryId"] == "Wx8MLppNTn-MOmHS4LlPFw"
    assert stats.records_by_version == {1: 1}


def test_what_kafka_may_also_write_is_accepted():
    assert isinstance(parse(v0(currentVoters=None)), Envelope)  # nullable in version 0
    assert isinstance(parse(v0(currentVoters=[])), Envelope)
    assert isinstance(parse(V0 + b"\n"), Envelope)
    # No vote: the directory id is Kafka's ZERO_UUID.
    assert isinstance(parse(v1(votedId=-1, votedDirectoryId="AAAAAAAAAAAAAAAAAAAAAA")), Envelope)
    # A field this reader does not know is kept, not refused.
    item = parse(v1(futureField={"x": 1}))
    assert isinstance(item, Envelope) and item.body["futureField"] == {"x": 1}


# ---- bad input: a dead letter with a reason, never a crash -----------------------------


BAD = [
    (b"", DeadLetterClass.INVALID, "empty quorum-state file"),
    (b"  \n", DeadLetterClass.INVALID, "empty quorum-state file"),
    (b'{"leaderId":\xff}', DeadLetterClass.NOT_UTF8, "not UTF-8: invalid UTF-8 byte 0xff"),
    (b'{"leaderId":1,', DeadLetterClass.MALFORMED_JSON, "malformed quorum-state JSON"),
    (b"[1, 2]", DeadLetterClass.WRONG_TYPE, "must be a JSON object, got list"),
    (b'"quorum"', DeadLetterClass.WRONG_TYPE, "must be a JSON object, got str"),
    (v0(data_version=...), DeadLetterClass.MISSING_FIELD, "missing field quorum-state.data_version"),
    (v0(data_version=2), DeadLetterClass.OUT_OF_RANGE, "data_version 2 is not one fencewatch reads"),
    (v0(data_version="0"), DeadLetterClass.WRONG_TYPE, "data_version must be an integer"),
    (v0(leaderEpoch=...), DeadLetterClass.MISSING_FIELD, "missing field quorum-state.leaderEpoch"),
    (v0(leaderId=...), DeadLetterClass.MISSING_FIELD, "missing field quorum-state.leaderId"),
    (v1(votedId=...), DeadLetterClass.MISSING_FIELD, "missing field quorum-state.votedId"),
    (v0(clusterId=...), DeadLetterClass.MISSING_FIELD, "missing field quorum-state.clusterId"),
    (v0(appliedOffset=...), DeadLetterClass.MISSING_FIELD, "missing field quorum-state.appliedOffset"),
    (v0(currentVoters=...), DeadLetterClass.MISSING_FIELD, "missing field quorum-state.currentVoters"),
    (v1(votedDirectoryId=...), DeadLetterClass.MISSING_FIELD, "missing field quorum-state.votedDirectoryId"),
    (v1(votedDirectoryId="not-a-uuid"), DeadLetterClass.INVALID, "must be a Kafka Uuid"),
    (v1(votedDirectoryId=7), DeadLetterClass.WRONG_TYPE, "votedDirectoryId must be a string"),
    (v0(leaderEpoch=2**31), DeadLetterClass.OUT_OF_RANGE, "leaderEpoch must be an integer from 0"),
    (v0(leaderEpoch=-1), DeadLetterClass.OUT_OF_RANGE, "leaderEpoch must be an integer from 0"),
    (v0(leaderId=-2), DeadLetterClass.OUT_OF_RANGE, "leaderId must be an integer from -1"),
    (v0(votedId=2**40), DeadLetterClass.OUT_OF_RANGE, "votedId must be an integer from -1"),
    (v0(appliedOffset=2**63), DeadLetterClass.OUT_OF_RANGE, "appliedOffset must be an integer"),
    (v0(leaderId=True), DeadLetterClass.WRONG_TYPE, "leaderId must be an integer"),
    (v0(leaderEpoch=7.5), DeadLetterClass.WRONG_TYPE, "leaderEpoch must be an integer"),
    (v0(leaderEpoch="7"), DeadLetterClass.WRONG_TYPE, "leaderEpoch must be an integer"),
    (v0(currentVoters="1,2,3"), DeadLetterClass.WRONG_TYPE, "currentVoters must be a list"),
    (v0(currentVoters=[1, 2]), DeadLetterClass.WRONG_TYPE, "currentVoters[0] must be an object"),
    (v0(currentVoters=[{"voterId": "1"}]), DeadLetterClass.WRONG_TYPE, "currentVoters[0].voterId must be"),
    (
        v0(currentVoters=[{"id": 1}]),
        DeadLetterClass.MISSING_FIELD,
        "missing field quorum-state.currentVoters[0].voterId",
    ),
    (v1(currentVoters=[{"voterId": -3}]), DeadLetterClass.OUT_OF_RANGE, "currentVoters[0].voterId must be"),
]


@pytest.mark.parametrize(("data", "kind", "reason"), BAD, ids=[r for _, _, r in BAD])
def test_bad_input_is_a_dead_letter_with_its_reason(data: bytes, kind: DeadLetterClass, reason: str):
    stats = QuorumStateStats()
    item = parse(data, stats=stats)

    assert isinstance(item, DeadLetter), item
    assert item.kind is kind
    assert reason in item.reason
    assert item.position == "qs:1"
    assert item.raw == data.decode("utf-8", errors="replace").rstrip("\r\n")
    assert stats == QuorumStateStats(files=1, records=0, dead_letters=1)


def test_a_number_too_large_for_64_bits_is_out_of_range():
    # orjson reads it as a float; it is still a value out of range, not a wrong type.
    data = V0.replace(b'"leaderEpoch":7', b'"leaderEpoch":123456789012345678901234567890')
    item = parse(data)
    assert isinstance(item, DeadLetter) and item.kind is DeadLetterClass.OUT_OF_RANGE
    assert "leaderEpoch must be an integer from 0 to 2147483647" in item.reason


def test_a_file_over_the_size_limit_is_not_read_whole():
    stream = io.BytesIO(V0 + b" " * 10_000_000)
    stats = QuorumStateStats()
    item = parse(stream, max_record_bytes=1000, stats=stats)

    assert isinstance(item, DeadLetter) and item.kind is DeadLetterClass.TOO_LARGE
    assert "longer than the record size limit of 1000 bytes" in item.reason
    assert stream.tell() == 1001  # one byte past the limit, no more
    assert item.raw.startswith('{"clusterId"')
    assert stats == QuorumStateStats(files=1, records=0, dead_letters=1)


def test_a_time_the_envelope_cannot_carry_is_a_dead_letter():
    item = parse(V0, ts_ms=-5)  # e.g. a file modification time before 1970
    assert isinstance(item, DeadLetter) and item.kind is DeadLetterClass.OUT_OF_RANGE
    assert "ts_ms" in item.reason


# ---- through the detector -------------------------------------------------------------


def run(items: list[Envelope | DeadLetter]) -> Detector:
    detector = Detector(now_ms=lambda: 0)
    for item in items:
        assert isinstance(item, Envelope), item
        assert detector.ingest(item) == []
    detector.flush()
    return detector


def test_the_same_state_observed_again_is_not_a_new_fact():
    # A shipper that restarts publishes the file again, stamped anew.
    detector = run([parse(V0, ts_ms=TS), parse(V0, ts_ms=TS + 60_000), parse(V0, ts_ms=TS + 120_000)])
    assert detector.counters.events == {"quorum_state": 1}
    assert detector.counters.duplicates == 2
    assert detector.drain() == []


def test_a_state_that_comes_back_after_another_is_a_new_observation():
    voted = v0(leaderId=-1, leaderEpoch=8, votedId=2)
    detector = run([parse(V0, ts_ms=TS), parse(voted, ts_ms=TS + 10), parse(V0, ts_ms=TS + 20)])
    assert detector.counters.events == {"quorum_state": 3}
    assert detector.counters.duplicates == 0
    # Epoch 8, then epoch 7 again: the node went back, which the rules report.
    assert [a.rule for a in detector.drain()] == ["QUORUM_EPOCH_REGRESSION"]


def _leader_fetched_only_by_an_observer(state: bytes) -> list[str]:
    """Controller 1 persists ``state`` (leader of epoch 7), then serves only a
    broker's metadata fetches for ten fetch timeouts."""
    detector = Detector(now_ms=lambda: 0)
    detector.ingest(parse(state, node=1, ts_ms=TS))  # type: ignore[arg-type]
    for i in range(1, 11):
        body = s.quorum_fetch(1, 7, 100, correlation_id=i)
        env = Envelope("prod-eu-1", 1, TS + i * 2000, "request", None, body, f"r:{i}", i)
        assert detector.ingest(env) == []
    detector.flush()
    return [a.rule for a in detector.drain()]


def test_without_voters_the_fetch_timeout_is_not_judged():
    # Version 0 names the voters: a leader no voter fetches from is a zombie.
    assert "QUORUM_ZOMBIE_LEADER" in _leader_fetched_only_by_an_observer(V0)
    # Version 1 names none: which majority should have fetched cannot be told,
    # so nothing is raised (never a guess).
    leader_v1 = v1(leaderId=1, votedId=-1, votedDirectoryId="AAAAAAAAAAAAAAAAAAAAAA")
    assert _leader_fetched_only_by_an_observer(leader_v1) == []
