"""A task of the streaming operator holds many buckets of one cluster, and
every one of them receives a copy of each cluster-wide record
(detectors.buckets): the operator parses a copy once per task and hands the
same envelope to each bucket (streaming/processor.py, ``_COPIES``). Run in
pyspark's in-memory TwsTester, one tester being one task."""

from __future__ import annotations

import uuid

import orjson
import pandas as pd
import pytest
from pyspark.sql.streaming.tws_tester import TwsTester

import streaming.processor
from detectors.buckets import buckets_of
from detectors.config import DetectorConfig
from detectors.envelope import Envelope, parse_envelope
from detectors.split import Split
from producers.simulator import SimConfig, Simulator
from streaming.routing import encode_key
from streaming.schema import ALERT

CLUSTER = "sim-1"
BUCKETS = 8


def routed(values: list[bytes]) -> dict[int, list[tuple[int, bytes, bool]]]:
    """Each bucket's rows (offset, value, home), as routing hands them over."""
    rows: dict[int, list[tuple[int, bytes, bool]]] = {b: [] for b in range(BUCKETS)}
    for offset, value in enumerate(values):
        env = parse_envelope(value)
        assert isinstance(env, Envelope)
        buckets = buckets_of(env, BUCKETS)
        for bucket in buckets:
            rows[bucket].append((offset, value, bucket == buckets[0]))
    return rows


def frame(rows: list[tuple[int, bytes, bool]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "topic": "events",
            "partition": 0,
            "offset": [r[0] for r in rows],
            "value": [r[1] for r in rows],
            "home": [r[2] for r in rows],
        }
    )


def task() -> TwsTester:
    processor = streaming.processor.DetectorProcessor(
        DetectorConfig(), scope=uuid.uuid4().hex, idle_flush_ms=10_000, buckets=BUCKETS
    )
    return TwsTester(processor, timeMode="ProcessingTime")


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The positions the operator parses, in order."""
    seen: list[str] = []

    def counted(value: bytes, position: str, seq: int) -> object:
        seen.append(position)
        return parse_envelope(value, position, seq)

    monkeypatch.setattr(streaming.processor, "parse_envelope", counted)
    return seen


def test_a_task_parses_each_copied_record_once_and_judges_as_replay(parses: list[str]):
    config = SimConfig(seed=21, fault_rate=0.02, warmup_ms=1000, events_per_second=500)
    values = [orjson.dumps(e) for e in Simulator(config).events(3000)]
    rows = routed(values)
    tester = task()
    alert_ids: list[str] = []
    for bucket in range(BUCKETS):
        out = tester.testInPandas(encode_key(CLUSTER, bucket, BUCKETS), frame(rows[bucket]))
        alert_ids.extend(out.loc[out["record_type"] == ALERT, "id"])
    out = tester.setProcessingTime(10**13)  # the idle flush: what still waits is judged
    alert_ids.extend(out.loc[out["record_type"] == ALERT, "id"])
    split = Split(BUCKETS, DetectorConfig())
    for offset, value in enumerate(values):
        env = parse_envelope(value, f"events/0@{offset}", offset)
        assert isinstance(env, Envelope)
        split.ingest(env)
    expected = sorted(a.alert_id for a in split.finish())
    assert expected, "no alert to compare: the history is too short for the fault rate"
    assert sorted(alert_ids) == expected
    copies = sum(len(r) for r in rows.values()) - len(values)
    assert copies > 300, "the history's cluster-wide records must be copied to every bucket"
    # The buckets ran in order here, so each record's home row came first: a
    # copied record is parsed twice (its home row, then its first copy, kept),
    # every other record once.
    fanned = len({offset for r in rows.values() for offset, _, home in r if not home})
    assert len(parses) == len(values) + fanned


def test_a_new_task_keeps_none_of_the_last_ones_copies(parses: list[str]):
    """What a task keeps is its own: the next task (a new tester, as each task
    calls ``init``) parses the same position again, so memory holds one task's
    copies at most."""
    config = SimConfig(seed=5, events_per_second=500)
    events = list(Simulator(config).events(200))
    broker = next(
        e for e in events if e["kind"] == "metadata" and e["body"]["type"] == "REGISTER_BROKER_RECORD"
    )
    value = orjson.dumps(broker)
    first = task()
    first.testInPandas(encode_key(CLUSTER, 1, BUCKETS), frame([(7, value, False)]))
    first.testInPandas(encode_key(CLUSTER, 2, BUCKETS), frame([(7, value, False)]))
    assert parses == ["events/0@7"]
    task().testInPandas(encode_key(CLUSTER, 3, BUCKETS), frame([(7, value, False)]))
    assert parses == ["events/0@7", "events/0@7"]
