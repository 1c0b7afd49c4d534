"""Metrics: detector snapshots, the exposition format, lag estimates, the
listener's handling of query progress."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from detectors import rules
from detectors.engine import Detector
from detectors.envelope import (
    BadRecord,
    DeadLetter,
    DeadLetterClass,
    Envelope,
    envelope_from_obj,
    parse_envelope,
)
from detectors.parse_metadata_dump import iter_metadata_dump
from detectors.parse_request_log import iter_request_log
from detectors.stats import DEAD_LETTER_CLASSES
from producers import shapes as s
from producers.simulator import SimConfig, Simulator
from streaming.listener import JobListener, LagEstimator, offsets_total
from streaming.metrics import Metrics


def simulated_detector(events: int = 8_000) -> Detector:
    detector = Detector()
    sim = Simulator(SimConfig(seed=3, fault_rate=0.02, warmup_ms=1_000))
    for i, event in enumerate(sim.events(events)):
        detector.ingest(envelope_from_obj(event, f"mem:{i}", i))
    detector.flush()
    detector.drain()
    return detector


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parse the exposition text, as Prometheus would scrape it."""
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_snapshot_counts_match_the_detector():
    detector = simulated_detector()
    detector.dead_letter(parsed(b'{"cluster": "sim-1", "ts_ms": 1'))
    metrics = Metrics(CollectorRegistry())
    metrics.detector.update(detector.snapshot("sim-1"))
    scraped = samples(metrics)

    def total(name: str, **labels: str) -> float:
        return sum(
            v
            for (n, ls), v in scraped.items()
            if n == name and all(dict(ls).get(k) == x for k, x in labels.items())
        )

    counters = detector.counters
    assert total("fencewatch_events_total") == sum(counters.events.values())
    assert (
        total("fencewatch_events_total", kind="request", api="PRODUCE") == counters.events["request:PRODUCE"]
    )
    assert total("fencewatch_alerts_total") == sum(counters.alerts.values()) > 0
    assert total("fencewatch_dead_letters_total", reason="malformed_json") == 1
    assert total("fencewatch_unverified_events_total") == sum(counters.unverified.values())
    assert total("fencewatch_tracked_partitions", cluster="sim-1") > 0
    assert total("fencewatch_brokers", state="registered") >= total("fencewatch_brokers", state="fenced")


def test_every_rule_has_a_zero_firing_series_before_its_first_alert():
    """increase() cannot see a counter's first increment if the series is born at 1."""
    metrics = Metrics(CollectorRegistry())
    metrics.detector.update(Detector().snapshot("quiet"))
    scraped = samples(metrics)
    for rule in rules.RULES.values():
        key = (
            "fencewatch_alerts_total",
            (
                ("cluster", "quiet"),
                ("confidence", "certain"),
                ("rule", rule.id),
                ("severity", rule.severity),
                ("status", "firing"),
            ),
        )
        assert scraped[key] == 0, rule.id


def test_an_older_snapshot_never_replaces_a_newer_one():
    metrics = Metrics(CollectorRegistry())
    snapshot = Detector().snapshot("c")
    metrics.detector.update({**snapshot, "late": 5, "state_version": 7})
    metrics.detector.update({**snapshot, "late": 2, "state_version": 6})
    assert metrics.registry.get_sample_value("fencewatch_late_events_total", {"cluster": "c"}) == 5
    metrics.detector.update({**snapshot, "late": 6, "state_version": 8})
    assert metrics.registry.get_sample_value("fencewatch_late_events_total", {"cluster": "c"}) == 6


def clock_samples(metrics: Metrics) -> dict[tuple[str, ...], float]:
    """The clock offset series scraped: (name, cluster, node[, bound]) -> value."""
    return {
        (name, *(value for _, value in labels)): v
        for (name, labels), v in samples(metrics).items()
        if name.startswith("fencewatch_clock_offset_")
    }


def test_measured_clock_offsets_are_exported_in_seconds_and_assumed_ones_not_at_all():
    metrics = Metrics(CollectorRegistry())
    offsets = {
        "1": {"low_ms": -250, "high_ms": 1250, "measured": True, "evidence": 4},
        # No evidence yet: 0..0 is an assumption, not a measurement.
        "2": {"low_ms": 0, "high_ms": 0, "measured": False, "evidence": 0},
        "10": {"low_ms": 2900, "high_ms": 3100, "measured": True, "evidence": 12},
    }
    metrics.detector.update({**Detector().snapshot("prod"), "clock_offsets": offsets})
    assert clock_samples(metrics) == {
        # Labels in sorted order: bound, cluster, node.
        ("fencewatch_clock_offset_seconds", "low", "prod", "1"): -0.25,
        ("fencewatch_clock_offset_seconds", "high", "prod", "1"): 1.25,
        ("fencewatch_clock_offset_seconds", "low", "prod", "10"): 2.9,
        ("fencewatch_clock_offset_seconds", "high", "prod", "10"): 3.1,
        ("fencewatch_clock_offset_evidence", "prod", "1"): 4,
        ("fencewatch_clock_offset_evidence", "prod", "10"): 12,
    }


def test_a_clock_bound_the_evidence_does_not_give_and_a_contradictory_interval_are_not_exported():
    metrics = Metrics(CollectorRegistry())
    offsets = {
        # Only a lower bound (a controller's causation, no request it handled).
        "1": {"low_ms": 3000, "high_ms": None, "measured": True, "evidence": 1},
        # Low above high: the evidence disagrees, the offset is unknown.
        "2": {"low_ms": 500, "high_ms": -500, "measured": True, "evidence": 2},
    }
    metrics.detector.update({**Detector().snapshot("prod"), "clock_offsets": offsets})
    assert clock_samples(metrics) == {
        ("fencewatch_clock_offset_seconds", "low", "prod", "1"): 3.0,
        ("fencewatch_clock_offset_evidence", "prod", "1"): 1,
    }


def test_a_snapshot_without_clock_offsets_exports_none_and_everything_else():
    """Snapshots of older checkpoints and releases have no clock_offsets key."""
    metrics = Metrics(CollectorRegistry())
    snapshot = {k: v for k, v in Detector().snapshot("old").items() if k != "clock_offsets"}
    metrics.detector.update({**snapshot, "late": 3})
    assert clock_samples(metrics) == {}
    assert metrics.registry.get_sample_value("fencewatch_late_events_total", {"cluster": "old"}) == 3


def test_a_node_gone_from_the_newest_snapshot_loses_its_clock_series():
    metrics = Metrics(CollectorRegistry())
    snapshot = Detector().snapshot("prod")
    both = {
        "1": {"low_ms": 10, "high_ms": 20, "measured": True, "evidence": 1},
        "2": {"low_ms": -20, "high_ms": -10, "measured": True, "evidence": 1},
    }
    metrics.detector.update({**snapshot, "clock_offsets": both, "state_version": 1})
    assert {key[-1] for key in clock_samples(metrics)} == {"1", "2"}
    metrics.detector.update({**snapshot, "clock_offsets": {"1": both["1"]}, "state_version": 2})
    assert {key[-1] for key in clock_samples(metrics)} == {"1"}
    metrics.detector.update({**snapshot, "state_version": 3})  # a release without clock offsets
    assert clock_samples(metrics) == {}


# Real bad inputs, each through the path that meets it in production, and the
# class the dead letter must carry. Together they produce every class.
TS = 1_763_720_000_000
TOPIC_ID = "qG8hUlWTTJ2eRb_bFvWRXg"
GOOD = s.envelope("c1", "request", TS, s.produce("orders", 0, 0), node=1)


def enveloped(**changes: Any) -> bytes:
    """The good envelope's JSON line with top-level fields replaced, or removed if None."""
    obj = {**GOOD, **changes}
    return orjson.dumps({k: v for k, v in obj.items() if v is not None})


def produce_with(path: str, value: Any) -> dict[str, Any]:
    """A PRODUCE body with the field at ``path`` (dotted, list indexes as digits) set, or removed if None."""
    body = copy.deepcopy(GOOD["body"])
    *parents, last = path.split(".")
    target = body
    for step in parents:
        target = target[int(step)] if step.isdigit() else target[step]
    if value is None:
        del target[last]
    else:
        target[last] = value
    return body


def parsed(raw: bytes) -> DeadLetter:
    letter = parse_envelope(raw, "mem:1")
    assert isinstance(letter, DeadLetter)
    return letter


def ingested(kind: str, body: dict[str, Any], **envelope: Any) -> DeadLetter:
    """The dead letter the detector returns for a well-formed envelope with a bad body,
    checked to be counted under the class it carries."""
    detector = Detector()
    env = parse_envelope(orjson.dumps(s.envelope("c1", kind, TS, body, **envelope)), "mem:1")
    assert isinstance(env, Envelope)
    # A metadata record's letter may come when the record is applied (detectors.redelivery).
    [letter] = detector.ingest(env) + detector.flush()
    assert detector.counters.dead_letters == {letter.kind.value: 1}
    return letter


def metadata_out_of_order() -> DeadLetter:
    """Offset 7 arriving after offset 8 started the log."""
    detector = Detector()
    letters = []
    for offset, ts_ms in ((8, TS), (9, TS + 5000), (7, TS + 5001)):  # 8 applied once the watermark passes it
        body = s.feature_level(21)
        env = parse_envelope(orjson.dumps(s.envelope("c1", "metadata", ts_ms, body, offset=offset)), "mem:1")
        assert isinstance(env, Envelope)
        letters.extend(detector.ingest(env))
    [letter] = letters
    assert detector.counters.dead_letters == {letter.kind.value: 1}
    return letter


def native(items: Iterable[Envelope | DeadLetter]) -> DeadLetter:
    (letter,) = items
    assert isinstance(letter, DeadLetter)
    return letter


def request_log(entry: bytes) -> DeadLetter:
    return native(iter_request_log([entry], source="t.log", cluster="c1", node=1))


def metadata_dump(*lines: str) -> DeadLetter:
    return native(iter_metadata_dump(list(lines), source="m.dump", cluster="c1"))


def alter_partition_isr(new_isr: list[Any]) -> dict[str, Any]:
    return s.alter_partition(
        "orders",
        TOPIC_ID,
        0,
        broker_id=1,
        broker_epoch=10,
        leader_epoch=0,
        partition_epoch=0,
        new_isr=new_isr,
        error=0,
        version=1,
    )


def remote_with_state(state: Any) -> dict[str, Any]:
    body = s.remote_segment(
        TOPIC_ID, 0, "seg-1", broker_id=1, start=0, end=9, leader_epochs={0: 0}, cleaner={}
    )
    body["data"]["remoteLogSegmentState"] = state
    return body


def log_entry(body: str, stamp: str = "2026-11-20 10:15:02,345") -> str:
    return f"[{stamp}] DEBUG Completed request:{body} (kafka.request.logger)"


DUMP_TOPIC = orjson.dumps(s.topic("orders", TOPIC_ID)).decode()
DUMP_VERSION_NEGATIVE = ' payload: {"type":"TOPIC_RECORD","version":-1,"data":{}}'


def dump_batch() -> str:
    return (
        f"baseOffset: 0 lastOffset: 0 count: 1 baseSequence: -1 lastSequence: -1 producerId: -1 "
        f"producerEpoch: -1 partitionLeaderEpoch: 1 isTransactional: false isControl: false "
        f"deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: {TS} size: 91 magic: 2 "
        f"compresscodec: none crc: 1234 isvalid: true"
    )


def dump_record(tail: str, ts_type: str = "CreateTime") -> str:
    ts = -1 if ts_type == "NoTimestampType" else TS
    return f"| offset: 0 {ts_type}: {ts} keySize: -1 valueSize: 23 sequence: -1 headerKeys: []{tail}"


BAD_INPUTS: list[tuple[str, Callable[[], DeadLetter], str]] = [
    ("truncated JSON", lambda: parsed(enveloped()[:-9]), "malformed_json"),
    ("JSON array", lambda: parsed(b"[1, 2]"), "wrong_type"),
    ("no ts_ms", lambda: parsed(enveloped(ts_ms=None)), "missing_field"),
    ("request without node", lambda: parsed(enveloped(node=None)), "missing_field"),
    ("ts_ms a string", lambda: parsed(enveloped(ts_ms="yesterday")), "wrong_type"),
    ("ts_ms a float", lambda: parsed(enveloped(ts_ms=float(TS))), "wrong_type"),
    ("unknown kind", lambda: parsed(enveloped(kind="gossip")), "wrong_type"),
    ("negative ts_ms", lambda: parsed(enveloped(ts_ms=-1)), "out_of_range"),
    ("ts_ms past 9999", lambda: parsed(enveloped(ts_ms=10**17)), "out_of_range"),
    ("empty cluster", lambda: parsed(enveloped(cluster="")), "out_of_range"),
    ("no body.request", lambda: ingested("request", produce_with("request", None), node=1), "missing_field"),
    (
        "topic without name or id",
        lambda: ingested("request", produce_with("request.topicData.0.name", None), node=1),
        "missing_field",
    ),
    (
        "acks beyond int16",
        lambda: ingested("request", produce_with("request.acks", 2**15), node=1),
        "out_of_range",
    ),
    ("acks a string", lambda: ingested("request", produce_with("request.acks", "all"), node=1), "wrong_type"),
    (
        "metadata without type",
        lambda: ingested("metadata", {"version": 0, "data": {}}, offset=1),
        "missing_field",
    ),
    (
        "metadata data a list",
        lambda: ingested("metadata", {"type": "TOPIC_RECORD", "version": 0, "data": []}, offset=1),
        "wrong_type",
    ),
    ("ISR member a string", lambda: ingested("request", alter_partition_isr([1, "2"]), node=1), "wrong_type"),
    ("metadata offset older than the log applied", lambda: metadata_out_of_order(), "out_of_order"),
    (
        "ISR member beyond int32",
        lambda: ingested("request", alter_partition_isr([1, 2**40]), node=1),
        "out_of_range",
    ),
    (
        "not a remote segment record",
        lambda: ingested("remote_log_metadata", {"type": "Gossip", "data": {}}, node=1),
        "invalid",
    ),
    (
        "remote segment state 9",
        lambda: ingested("remote_log_metadata", remote_with_state(9), node=1),
        "out_of_range",
    ),
    (
        "unknown remote segment state",
        lambda: ingested("remote_log_metadata", remote_with_state("ARCHIVED"), node=1),
        "wrong_type",
    ),
    (
        "request log not UTF-8",
        lambda: request_log(log_entry('{"clientId":"p\xff"}').encode("latin-1")),
        "not_utf8",
    ),
    (
        "request log bad timestamp",
        lambda: request_log(log_entry("{}", stamp="2026-13-45 10:15:02,345").encode()),
        "no_timestamp",
    ),
    ("request log truncated JSON", lambda: request_log(log_entry('{"a":').encode()), "malformed_json"),
    ("request log body a list", lambda: request_log(log_entry("[1]").encode()), "wrong_type"),
    (
        "dump record without timestamp",
        lambda: metadata_dump(
            dump_batch(), dump_record(" payload: " + DUMP_TOPIC, ts_type="NoTimestampType")
        ),
        "no_timestamp",
    ),
    (
        "dump payload truncated",
        lambda: metadata_dump(dump_batch(), dump_record(' payload: {"type":')),
        "malformed_json",
    ),
    (
        "dump version negative",
        lambda: metadata_dump(dump_batch(), dump_record(DUMP_VERSION_NEGATIVE)),
        "out_of_range",
    ),
    ("dump line unrecognised", lambda: metadata_dump("| offset: 5 CreateTi"), "invalid"),
    (
        "request log entry over the size limit",
        lambda: native(
            iter_request_log(
                [log_entry("[" * 100).encode()], source="t.log", cluster="c1", node=1, max_record_bytes=64
            )
        ),
        "too_large",
    ),
]


@pytest.mark.parametrize(("make", "expected"), [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_a_dead_letter_carries_the_class_of_the_check_that_rejected_it(
    make: Callable[[], DeadLetter], expected: str
):
    letter = make()
    assert letter.kind == expected, letter.reason
    assert letter.reason


def test_every_dead_letter_class_comes_from_some_real_bad_input():
    # cluster_mismatch is raised by the streaming operator only (a record key
    # naming another cluster): tests/integration/test_job.py publishes one.
    produced = {expected for *_, expected in BAD_INPUTS} | {"cluster_mismatch"}
    assert sorted(produced) == sorted(DEAD_LETTER_CLASSES)


def test_the_class_survives_pickling():
    """Dead letters and BadRecords may travel pickled (detector snapshots, Spark workers)."""
    letter = parsed(enveloped(ts_ms=-1))
    assert pickle.loads(pickle.dumps(letter)) == letter
    error = pickle.loads(pickle.dumps(BadRecord("body.x must be a list", DeadLetterClass.WRONG_TYPE)))
    assert (error.reason, error.kind) == ("body.x must be a list", DeadLetterClass.WRONG_TYPE)


def test_offsets_total_reads_both_source_formats():
    assert offsets_total('{"0": 10, "1": 5}') == 15
    assert offsets_total('{"0": 10, "1": 5, "idle_ticks": 3}') == 15  # ticks are not records
    assert offsets_total('{"events": {"0": 10, "1": 5}}') == 15
    assert offsets_total(None) is None


def test_lag_in_seconds_is_how_long_ago_the_oldest_unread_record_arrived():
    lag = LagEstimator()
    assert lag.observe(100.0, latest_total=50, end_total=50) == (0, 0.0)
    assert lag.observe(101.0, latest_total=80, end_total=50) == (30, 0.0)  # record 50 appeared at 101
    assert lag.observe(105.0, latest_total=120, end_total=60) == (60, 4.0)
    assert lag.observe(106.0, latest_total=120, end_total=120) == (0, 0.0)


def test_lag_history_restarts_when_offsets_go_back():
    lag = LagEstimator()
    lag.observe(100.0, latest_total=500, end_total=400)
    assert lag.observe(200.0, latest_total=10, end_total=0) == (10, 0.0)


def progress(name: str, duration_ms: int, rows: int, end: dict, latest: dict) -> SimpleNamespace:
    source = SimpleNamespace(endOffset=json.dumps(end), latestOffset=json.dumps(latest))
    return SimpleNamespace(
        progress=SimpleNamespace(
            name=name,
            batchDuration=duration_ms,
            numInputRows=rows,
            inputRowsPerSecond=float("nan"),
            processedRowsPerSecond=250.0,
            sources=[source],
            observedMetrics={},
        )
    )


def test_listener_turns_progress_into_metrics_for_its_own_query_only():
    metrics = Metrics(CollectorRegistry())
    stopped = []
    listener = JobListener(
        metrics, "fencewatch", "events", on_terminated=lambda: stopped.append(1), clock=lambda: 50.0
    )
    listener.onQueryStarted(SimpleNamespace(name="fencewatch", id="q1"))
    listener.onQueryProgress(progress("fencewatch", 1500, 100, {"0": 100}, {"0": 130}))
    listener.onQueryProgress(progress("other", 9000, 7, {"0": 1}, {"0": 1}))
    get = metrics.registry.get_sample_value
    assert get("fencewatch_query_running") == 1
    assert get("fencewatch_batches_total") == 1
    assert get("fencewatch_batch_duration_seconds_sum") == 1.5
    assert get("fencewatch_source_events_total", {"topic": "events"}) == 100
    assert get("fencewatch_source_lag_events", {"topic": "events"}) == 30
    assert get("fencewatch_input_events_per_second") == 0  # Spark's NaN for an empty rate
    assert get("fencewatch_processed_events_per_second") == 250
    assert get("fencewatch_last_batch_timestamp_seconds") == 50
    listener.onQueryTerminated(SimpleNamespace(id="other-query", exception=None))
    assert get("fencewatch_query_running") == 1 and not stopped
    listener.onQueryTerminated(SimpleNamespace(id="q1", exception="boom"))
    assert get("fencewatch_query_running") == 0
    assert get("fencewatch_query_failures_total") == 1
    assert stopped == [1]
