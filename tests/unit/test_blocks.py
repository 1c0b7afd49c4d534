"""The block path (detectors.blocks) against the per-record path.

The per-record path is the reference: the block path must give the same
alerts, dead letters, counters, clock measures and pending judgments on any
input. Hypothesis picks simulated histories with every fault kind and broken
clocks, cuts them into overlapping pieces (re-delivery), repeats lines and
damages a few, and both paths judge the merge of the pieces; ``fencewatch
replay`` is run both ways on such files too.
"""

from __future__ import annotations

import contextlib
import io
import random
from itertools import pairwise
from typing import Any

import orjson
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from detectors import blocks
from detectors.blocks import decode_data_plane, ingest_block
from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import BadRecord, DeadLetter, Envelope, parse_envelope
from detectors.fields import INT16, get_int, get_obj
from detectors.merge import merge_sources
from detectors.requests import PRODUCE, header, is_quorum_fetch, partition_outcomes
from detectors.sources import EnvelopeLineStats, read_envelopes
from fencewatch.cli import main as cli_main
from producers.sim_clocks import parse_clock
from producers.simulator import SimConfig, Simulator

CLOCK_FAULTS = ("3=+3s", "2=-1500ms", "1=+8s@4s", "4=+5ms/s", "3001=+2s")
Item = Envelope | DeadLetter


def simulated_lines(seed: int, events: int, clocks: tuple[str, ...]) -> list[bytes]:
    sim = Simulator(
        SimConfig(seed=seed, fault_rate=0.01, warmup_ms=3_000, clocks=tuple(parse_clock(c) for c in clocks))
    )
    return [orjson.dumps(raw) for raw in sim.events(events)]


def damaged(lines: list[bytes], rng: random.Random) -> list[bytes]:
    """``lines`` with some lines repeated a little later or much later
    (re-delivery, some too late to judge), and a few made unusable: bad JSON,
    and Produce and Fetch bodies the one-pass decoder must leave to the
    per-record readers (a wrong type, a missing field, a quorum fetch shape)."""
    out = list(lines)
    for _ in range(len(lines) // 200):
        i = rng.randrange(len(out))
        out.insert(min(len(out), i + rng.choice((1, 5, 50, 3000))), out[i])
    for _ in range(5):
        out.insert(rng.randrange(len(out)), b'{"cluster": "sim-1", "ts_ms": ')
    requests = [
        i for i, line in enumerate(out) if b'"requestApiKey":0,' in line or b'"requestApiKey":1,' in line
    ]
    for i in rng.sample(requests, min(len(requests), 12)):
        env = orjson.loads(out[i])
        body = env["body"]
        choice = rng.randrange(4)
        if choice == 0:
            body["requestHeader"]["correlationId"] = "7"
        elif choice == 1:
            body["request"].pop("acks", None)
            body["request"]["topics"] = None
        elif choice == 2:
            body["response"] = {"errorCode": True}
        else:
            body["requestHeader"]["clientId"] = 5
        out[i] = orjson.dumps(env)
    return out


def pieces(lines: list[bytes], rng: random.Random, count: int) -> list[list[bytes]]:
    """``count`` consecutive pieces of ``lines``, each running on a little into the next."""
    cuts = sorted(rng.sample(range(1, len(lines)), count - 1)) if count > 1 else []
    bounds = [0, *cuts, len(lines)]
    return [lines[lo : min(len(lines), hi + rng.randrange(0, 40))] for lo, hi in pairwise(bounds)]


def items(piece: list[bytes], name: str) -> list[Item]:
    return [parse_envelope(line, f"{name}:{n}", n) for n, line in enumerate(piece, start=1)]


def per_record(streams: list[list[Item]], config: DetectorConfig) -> tuple[Detector, list[Any], list[Any]]:
    detector = Detector(config, now_ms=lambda: 0)
    alerts: list[Any] = []
    letters: list[Any] = []
    for item in merge_sources(streams, config.lateness_ms):
        if isinstance(item, DeadLetter):
            detector.dead_letter(item)
            letters.append((item, False))
            continue
        letters.extend((letter, True) for letter in detector.ingest(item))
        alerts.extend(detector.drain())
    letters.extend((letter, True) for letter in detector.flush())
    alerts.extend(detector.drain())
    return detector, alerts, letters


def by_blocks(
    streams: list[list[Item]], config: DetectorConfig, rng: random.Random
) -> tuple[Detector, list[Any], list[Any]]:
    detector = Detector(config, now_ms=lambda: 0)
    alerts: list[Any] = []
    letters: list[Any] = []
    merged = list(merge_sources(streams, config.lateness_ms))
    start = 0
    while start < len(merged):
        size = rng.choice((1, 7, 300, 4096))
        outcome = ingest_block(detector, merged[start : start + size])
        start += size
        alerts.extend(outcome.alerts)
        letters.extend(outcome.letters)
    letters.extend((letter, True) for letter in detector.flush())
    alerts.extend(detector.drain())
    return detector, alerts, letters


def state(detector: Detector) -> dict[str, Any]:
    """What a run leaves besides its alerts and dead letters."""
    return {
        "counters": detector.counters,
        "clusters": {
            name: (
                detector.snapshot(name),
                cs.clocks.measured_nodes(cs.metadata_clock.shift_ms),
                cs.watermark,
                len(cs.recent_ids),
            )
            for name, cs in detector.clusters.items()
        },
        "pending": detector.pending_count(),
    }


@settings(max_examples=6, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(
    seed=st.integers(0, 2**32 - 1),
    events=st.integers(6_000, 12_000),
    clocks=st.lists(st.sampled_from(CLOCK_FAULTS), max_size=2, unique=True),
    files=st.integers(1, 4),
    measure_clocks=st.booleans(),
)
def test_blocks_judge_as_record_by_record(seed, events, clocks, files, measure_clocks):
    rng = random.Random(seed)
    lines = damaged(simulated_lines(seed, events, tuple(clocks)), rng)
    streams = [items(piece, f"f{n}") for n, piece in enumerate(pieces(lines, rng, files))]
    config = DetectorConfig(measure_clocks=measure_clocks)
    reference, ref_alerts, ref_letters = per_record(streams, config)
    blocked, alerts, letters = by_blocks(streams, config, rng)
    assert [a.to_dict() for a in alerts] == [a.to_dict() for a in ref_alerts]
    assert letters == ref_letters
    assert state(blocked) == state(reference)
    assert reference.counters.duplicates > 0 and reference.counters.dead_letters


def replay(*args: str) -> tuple[int, list[dict[str, Any]], str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(["replay", "--no-progress", *args])
    alerts = [orjson.loads(line) for line in out.getvalue().splitlines()]
    for alert in alerts:
        alert.pop("detected_ms")
    return code, alerts, err.getvalue()


def test_replay_gives_the_same_alerts_and_summary_both_ways(tmp_path):
    rng = random.Random(25)
    lines = damaged(simulated_lines(25, 15_000, ("3=+3s",)), rng)
    names = []
    for n, piece in enumerate(pieces(lines, rng, 3)):
        path = tmp_path / f"piece{n}.jsonl"
        path.write_bytes(b"\n".join(piece) + b"\n")
        names.append(str(path))
    names.reverse()  # named in any order
    blocks = replay(*names, "--dead-letter", str(tmp_path / "dead-blocks.jsonl"))
    records = replay(*names, "--dead-letter", str(tmp_path / "dead-records.jsonl"), "--per-record")
    assert blocks[1], "the history raised nothing: it judges nothing"
    assert blocks[0] == records[0]
    assert blocks[1] == records[1]
    assert blocks[2].replace("dead-blocks", "dead-records") == records[2]
    assert (tmp_path / "dead-blocks.jsonl").read_bytes() == (tmp_path / "dead-records.jsonl").read_bytes()


# ---- the one-pass decoder reads what the per-record readers read -----------------------------


def produce(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "requestHeader": {"requestApiKey": 0, "requestApiVersion": 9, "correlationId": 4, "clientId": "p"},
        "request": {
            "acks": -1,
            "topicData": [{"name": "t", "partitionData": [{"index": 0, "currentLeaderEpoch": 3}]}],
        },
        "response": {"responses": [{"name": "t", "partitionResponses": [{"index": 0, "errorCode": 0}]}]},
    }
    body.update(overrides)
    return body


def fetch(topic: dict[str, Any]) -> dict[str, Any]:
    return {
        "requestHeader": {"requestApiKey": 1, "requestApiVersion": 13, "correlationId": 9, "clientId": None},
        "request": {"topics": [topic]},
        "response": {"responses": [{**topic, "partitions": [{"partitionIndex": 2, "errorCode": 74}]}]},
    }


def per_record_facts(body: dict[str, Any]) -> tuple[Any, ...]:
    h = header(body)
    request = get_obj(body, "request", "body")
    acks = get_int(request, "acks", "body.request", bounds=INT16) if h.api_key == PRODUCE else None
    return h, acks, partition_outcomes(h.api_key, body)


@pytest.mark.parametrize(
    "body",
    [
        produce(),
        produce(response=None),
        fetch({"topicId": "abc", "partitions": [{"partition": 2, "currentLeaderEpoch": 5}]}),
        fetch({"topic": "t", "partitions": [{"partition": 2}]}),
    ],
)
def test_decoded_once_as_the_per_record_readers_read(body):
    decoded = decode_data_plane(body)
    assert decoded is not None
    assert (decoded.header, decoded.acks, decoded.outcomes) == per_record_facts(body)


@pytest.mark.parametrize(
    "body",
    [
        produce(requestHeader={"requestApiKey": True, "requestApiVersion": 9, "correlationId": 4}),
        produce(requestHeader={"requestApiKey": 0, "requestApiVersion": 9, "correlationId": 2**31}),
        produce(
            requestHeader={"requestApiKey": 0, "requestApiVersion": 9, "correlationId": 1, "clientId": 1}
        ),
        produce(request={"acks": 1.0, "topicData": []}),
        produce(request={"acks": -1, "topicData": [{"partitionData": []}]}),
        produce(response={"errorCode": False}),
        fetch({"topic": "__cluster_metadata", "partitions": [{"partition": 0}]}),
        {"requestHeader": {"requestApiKey": 5, "requestApiVersion": 3, "correlationId": 1}},
    ],
)
def test_bodies_left_to_the_per_record_readers(body):
    """A body the per-record readers would dead-letter, a quorum fetch (the
    quorum rules read it whole) and other APIs get no facts."""
    assert decode_data_plane(body) is None


def mutated(value: Any, rng: random.Random) -> Any:
    """``value`` with one leaf or list changed to another JSON type, or a key dropped."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(sorted(value))
        if rng.random() < 0.15:
            return {k: v for k, v in value.items() if k != key}
        return {**value, key: mutated(value[key], rng)}
    if isinstance(value, list) and value and rng.random() < 0.8:
        i = rng.randrange(len(value))
        return [*value[:i], mutated(value[i], rng), *value[i + 1 :]]
    return rng.choice([None, True, 1.0, "x", -1, 2**31, 2**15, -(2**15) - 1, [], {}, [1], {"a": 1}])


def test_every_simulated_request_body_and_its_mutants_decode_as_the_per_record_readers_read():
    """Where the one-pass decoder gives facts they are the per-record readers'
    facts; where it gives none, the per-record readers either refuse the body
    or need their checked reader (which then explains it), or it is not a
    data-plane request at all. Simulated bodies themselves all decode."""
    rng = random.Random(7)
    bodies = [
        orjson.loads(line)["body"] for line in simulated_lines(7, 6_000, ()) if b'"kind":"request"' in line
    ]
    data_plane = [b for b in bodies if b["requestHeader"]["requestApiKey"] in (0, 1, 2, 23)]
    assert len(data_plane) > 3_000
    decoded = 0
    for body in data_plane:
        facts = decode_data_plane(body)
        if facts is None:
            assert body["requestHeader"]["requestApiKey"] == 1 and is_quorum_fetch(body)
            continue
        decoded += 1
        assert (facts.header, facts.acks, facts.outcomes) == per_record_facts(body)
    assert decoded > 3_000
    refused = agreed = 0
    for body in rng.sample(data_plane, 1_500):
        key = rng.choice(sorted(body))  # an envelope's body is always an object
        mutant = {**body, key: mutated(body[key], rng)}
        facts = decode_data_plane(mutant)
        try:
            expected = per_record_facts(mutant)
        except (BadRecord, KeyError, AttributeError, TypeError):
            assert facts is None
            refused += 1
            continue
        if facts is not None:
            assert (facts.header, facts.acks, facts.outcomes) == expected
            agreed += 1
    assert refused > 100 and agreed > 100


def test_a_body_left_to_the_per_record_readers_is_dead_lettered_by_them():
    body = produce(request={"acks": "all", "topicData": []})
    with pytest.raises(BadRecord):
        per_record_facts(body)
    env = Envelope("c", 1, 1_000, "request", None, body, "f:1", 1)
    outcome = ingest_block(Detector(DetectorConfig(), now_ms=lambda: 0), [env])
    [(letter, judged)] = outcome.letters
    assert judged and "acks" in letter.reason


def test_a_fetch_without_facts_still_counts_its_api():
    body = fetch({"topic": "__cluster_metadata", "partitions": [{"partition": 0}]})
    detector = Detector(DetectorConfig(), now_ms=lambda: 0)
    ingest_block(detector, [Envelope("c", 3001, 1_000, "request", None, body, "f:1", 1)])
    assert detector.counters.events == {"request:FETCH": 1}


# ---- lines read a block at a time are the lines read one at a time ---------------------------


def random_input(rng: random.Random, limit: int) -> bytes:
    envelope = b'{"cluster":"c","node":1,"ts_ms":5,"kind":"request","offset":null,"body":{}}'
    pieces = []
    for _ in range(rng.randrange(0, 30)):
        kind = rng.randrange(6)
        if kind == 0:
            line = envelope
        elif kind == 1:
            line = b" " * rng.randrange(0, 3)
        elif kind == 2:
            line = b"x" * max(0, limit + rng.randrange(-3, 4))
        elif kind == 3:
            line = b'{"cluster": 1}'
        elif kind == 4:
            line = b"y" * rng.randrange(0, 3 * limit + 10)
        else:
            line = envelope[: rng.randrange(len(envelope))]
        pieces.append(line + rng.choice((b"\n", b"\r\n", b"\r\n", b"\n")))
    data = b"".join(pieces)
    if rng.random() < 0.5:
        data += rng.choice((envelope, b"z" * (limit + rng.randrange(-2, 3)), b"\r", b"  "))
    return data


@pytest.mark.parametrize("read_bytes", [1, 3, 16, 100, 1 << 20])
def test_read_a_block_at_a_time_as_a_line_at_a_time(monkeypatch, read_bytes):
    monkeypatch.setattr(blocks, "READ_BYTES", read_bytes)
    rng = random.Random(read_bytes)
    for _ in range(300):
        limit = rng.choice((1, 2, 5, 40, 80, 200))
        data = random_input(rng, limit)
        got_stats, want_stats = EnvelopeLineStats(), EnvelopeLineStats()
        got_bytes: list[int] = []
        want_bytes: list[int] = []
        got = list(blocks.read_envelope_blocks(io.BytesIO(data), "in", got_bytes.append, limit, got_stats))
        want = list(read_envelopes(io.BytesIO(data), "in", want_bytes.append, limit, want_stats))
        assert got == want, data
        assert got_stats == want_stats
        assert sum(got_bytes) == sum(want_bytes) == len(data)
