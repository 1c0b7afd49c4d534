"""The stateful operator with metadata records held for their offset order
over many micro-batches (a large cluster's snapshot: thousands of records of
one time, which wait until the log's time moves on): the real
DetectorProcessor in pyspark's TwsTester, each batch a task in a new worker
that loads the bucket from the state store."""

from __future__ import annotations

import base64
import pickle
import random
from typing import Any

import pytest
from pyspark.sql.streaming.tws_tester import TwsTester

from detectors.engine import Detector
from detectors.envelope import Envelope
from detectors.redelivery import OffsetOrder
from producers import shapes
from producers.simulator import SimConfig, Simulator
from streaming import snapshot_format
from tests.unit.test_pending_store import CLUSTER, envelopes, operator, replay, rows

BURST = 3000  # partition records of one time, read 1,000 a batch


def snapshot_burst() -> tuple[list[dict[str, Any]], int, int]:
    """A simulated cluster whose set-up is followed by ``BURST`` partitions of
    three new topics, all stamped with the last set-up record's time; then its
    traffic. Returns the events and where the burst starts and ends."""
    events = list(Simulator(SimConfig(seed=29, fault_rate=0.02, warmup_ms=1000)).events(3000))
    start = next(i for i, e in enumerate(events) if e["kind"] != "metadata")
    last = events[start - 1]
    rng = random.Random(29)
    offset = last["offset"]
    burst = []
    for t in range(BURST // 1000):
        topic_id = base64.urlsafe_b64encode(rng.randbytes(16)).decode().rstrip("=")
        offset += 1
        burst.append(
            shapes.envelope(
                CLUSTER, "metadata", last["ts_ms"], shapes.topic(f"bulk-{t}", topic_id), offset=offset
            )
        )
        for p in range(1000):
            replicas = rng.sample(range(1, 4), 3)
            offset += 1
            record = shapes.partition(topic_id, p, replicas, replicas, replicas[0])
            burst.append(shapes.envelope(CLUSTER, "metadata", last["ts_ms"], record, offset=offset))
    for e in events[start:]:
        if e["kind"] == "metadata" and e["offset"] is not None:
            e["offset"] += offset - last["offset"]
    return events[:start] + burst + events[start:], start, start + len(burst)


def held_chunks(tester: TwsTester) -> dict[int, bytes]:
    return {
        key[0]: bytes(value[0]) for key, value in (tester.peekMapState("held_chunks", CLUSTER) or {}).items()
    }


def test_held_records_are_written_once_kept_out_of_the_detector_and_applied_as_replay_applies_them():
    events, start, end = snapshot_burst()
    expected = replay(envelopes(events))
    tester = operator()
    out = [tester.testInPandas(CLUSTER, rows(events[:start], 0))]
    value = tester.peekValueState("detector", CLUSTER)[1]
    lean = len(value)
    # The set-up's own records wait too (the log may have begun earlier), but too
    # few to be worth the state calls of a chunk: they stay in the detector value.
    assert snapshot_format.decode(value).cluster(CLUSTER).held_count() > 0
    assert held_chunks(tester) == {}
    written: dict[int, bytes] = {}
    for first in range(start, end, 1001):  # a topic and its 1,000 partitions a batch
        tester = operator(tester)  # a new worker: the bucket is loaded from the state store
        out.append(tester.testInPandas(CLUSTER, rows(events[first : first + 1001], first)))
        chunks = held_chunks(tester)
        # Each batch's newly held records make one chunk, written once and never again.
        assert len(chunks) == len(written) + 1
        assert {n: data for n, data in chunks.items() if n in written} == written
        written = chunks
        # The detector value keeps 17 bytes a held record (its offset, time and whether
        # applied), not the records: pickled in it, they took about 150 bytes each.
        held = first + 1001 - start
        assert len(tester.peekValueState("detector", CLUSTER)[1]) < lean + 20 * held
    assert len(written) == BURST // 1000

    tester = operator(tester)
    out.append(tester.testInPandas(CLUSTER, rows(events[end:], end)))
    out.append(tester.setProcessingTime(10**13))
    assert held_chunks(tester) == {}  # every held record applied, every chunk removed
    alerts = sorted(a for frame in out for a in frame.query("record_type == 'alert'")["id"])
    assert alerts == sorted(a.alert_id for a in expected.drain())
    assert alerts, "no alert: the comparison would show nothing"
    final = snapshot_format.decode(tester.peekValueState("detector", CLUSTER)[1])
    assert final.counters == expected.counters


def as_format_4(detector: Detector, chunks: dict[int, bytes], monkeypatch: pytest.MonkeyPatch) -> bytes:
    """``detector``'s value as state format 4 pickled it: every offset-ordered
    log with its held records in its heap, as (offset, envelope) pairs.
    ``chunks``: the metadata log's chunks, from the state store."""

    def format_4_state(log: OffsetOrder) -> dict[str, Any]:
        unpickled: dict[int, list[Envelope]] = {}
        held = []
        for offset, place in log._held_offsets.items():
            if place is None:
                held.append((offset, log._fresh[offset]))
                continue
            number, index = place
            if number not in unpickled:
                unpickled[number] = pickle.loads(chunks.get(number) or log.chunk_data[number])
            held.append((offset, unpickled[number][index]))
        held.sort(key=lambda pair: pair[0])  # sorted by offset: a heap
        gaps = {"_gap_firsts": log._gap_firsts, "_gap_lasts": log._gap_lasts}
        return {"last": log.last, "_held": held, "_held_offsets": {o for o, _ in held}, **gaps}

    with monkeypatch.context() as patch:
        patch.setattr(OffsetOrder, "__getstate__", format_4_state)
        return b"FWS\x04" + pickle.dumps(detector, protocol=pickle.HIGHEST_PROTOCOL)


def test_a_bucket_of_state_format_4_has_its_held_records_chunked_and_applied(monkeypatch: pytest.MonkeyPatch):
    events, start, end = snapshot_burst()
    expected = replay(envelopes(events))
    middle = start + 1500
    tester = operator()
    out = [tester.testInPandas(CLUSTER, rows(events[:middle], 0))]
    version, value = tester.peekValueState("detector", CLUSTER)
    old = operator()
    format_4 = as_format_4(snapshot_format.decode(value), held_chunks(tester), monkeypatch)
    assert snapshot_format.decode(format_4).cluster(CLUSTER).held_count() > 1500
    old.updateValueState("detector", CLUSTER, (version, format_4))
    for name in ("partition_groups", "pending", "remote_partitions"):  # format 4's
        old.updateMapState(name, CLUSTER, tester.peekMapState(name, CLUSTER))

    out.append(old.testInPandas(CLUSTER, rows(events[middle:end], middle)))
    assert snapshot_format.format_of(old.peekValueState("detector", CLUSTER)[1]) == snapshot_format.FORMAT
    assert held_chunks(old), "the records held by format 4 and since are chunked at the save"
    following = operator(old)  # a new worker: the chunks are read from the state store
    out.append(following.testInPandas(CLUSTER, rows(events[end:], end)))
    out.append(following.setProcessingTime(10**13))
    assert held_chunks(following) == {}
    alerts = sorted(a for frame in out for a in frame.query("record_type == 'alert'")["id"])
    assert alerts == sorted(a.alert_id for a in expected.drain())
    assert (
        snapshot_format.decode(following.peekValueState("detector", CLUSTER)[1]).counters == expected.counters
    )
