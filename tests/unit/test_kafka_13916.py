"""KAFKA-13916 caught on Kafka's own records: Apache Kafka 3.2.3's controller
fenced broker 1 and then admitted it back to three ISRs while it was still
fenced (tests/data/kafka-bugs/README.md says how the files were made). The
rule is ISR_INELIGIBLE_REPLICA_ADMITTED (docs/rules.md), raised from the
metadata log's PARTITION_CHANGE_RECORDs, from Kafka's own dump of them, and
from the controller's AlterPartition answers alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fencewatch import cli

DATA = Path(__file__).resolve().parents[1] / "data" / "kafka-bugs" / "KAFKA-13916"
SEGMENT = DATA / "00000000000000000000.log"
DUMP = DATA / "00000000000000000000.dump"
ALTER_PARTITIONS = DATA / "controller-101-request.log"
TOPIC_ID = "jEeqbyTCTMq75adsYccPrg"
FENCED = 1
# Kafka's own offsets (the dump): 15 FENCE_BROKER_RECORD of broker 1, 16-18 the
# PARTITION_CHANGE_RECORDs putting it back into partitions 1, 0 and 2, 19 its
# UNFENCE_BROKER_RECORD.
FENCE_OFFSET = 15
ADMITTED = {16: 1, 17: 0, 18: 2}


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert "dead letter" not in captured.err or ", 0 dead letters" in captured.err, captured.err
    return captured.out


def _convert(capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, argv: list[str]) -> Path:
    out = tmp_path / name
    out.write_text(_run(capsys, ["convert", *argv]))
    return out


def _replay(
    capsys: pytest.CaptureFixture[str], *files: Path, options: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    out = _run(capsys, ["replay", "--no-progress", *options, *map(str, files)])
    return [json.loads(line) for line in out.splitlines()]


def _assert_kafka_13916(alerts: list[dict[str, Any]]) -> None:
    assert len(alerts) == 3, alerts
    assert {a["rule"] for a in alerts} == {"ISR_INELIGIBLE_REPLICA_ADMITTED"}
    assert {a["node"] for a in alerts} == {FENCED}
    assert sorted(a["partition"] for a in alerts) == [0, 1, 2]
    assert {a["topic"] for a in alerts} == {"fenced-follower"}
    assert {a["topic_id"] for a in alerts} == {TOPIC_ID}


def test_the_metadata_log_of_kafka_3_2_3_raises_isr_ineligible_replica_admitted(capsys, tmp_path):
    metadata = _convert(capsys, tmp_path, "m.jsonl", ["metadata-log", "--cluster", "k", str(SEGMENT)])
    alerts = _replay(capsys, metadata)
    _assert_kafka_13916(alerts)
    for alert in alerts:
        view, violation = alert["evidence"]
        assert (view["offset"], view["summary"]) == (FENCE_OFFSET, f"broker {FENCED} fenced")
        assert ADMITTED[violation["offset"]] == alert["partition"]
        assert "while fenced" in alert["message"]


def test_kafka_3_2_3s_own_dump_of_it_raises_the_same_alerts(capsys, tmp_path):
    native = _convert(capsys, tmp_path, "m.jsonl", ["metadata-log", "--cluster", "k", str(SEGMENT)])
    dumped = _convert(capsys, tmp_path, "d.jsonl", ["metadata-dump", "--cluster", "k", str(DUMP)])
    from_native = _replay(capsys, native)
    from_dump = _replay(capsys, dumped)
    _assert_kafka_13916(from_dump)
    assert {a["alert_id"] for a in from_dump} == {a["alert_id"] for a in from_native}


def test_the_controllers_alter_partition_answers_alone_raise_it(capsys, tmp_path):
    """The metadata log cut after the fencing: the AlterPartition v1 lines Kafka
    3.2.3's controller logged (newIsr holding fenced broker 1, answered NONE)
    are the only evidence of the admission, and they raise the alert too. The
    answers came 0.27, 1.20 and 1.32 s after the fencing record: a member counts
    as ineligible only if it was so throughout the answer's grace window, so
    the default 2 s window (and three lines too few to measure the controller's
    clock by) does not hold the first of them. The controller's clock is the
    metadata log's own (one JVM writes both), hence no clock measured and a
    200 ms window."""
    metadata = _convert(capsys, tmp_path, "m.jsonl", ["metadata-log", "--cluster", "k", str(SEGMENT)])
    up_to_fence = tmp_path / "up-to-fence.jsonl"
    up_to_fence.write_text(
        "".join(line + "\n" for line in metadata.read_text().splitlines() if json.loads(line)["offset"] <= 15)
    )
    requests = _convert(
        capsys, tmp_path, "r.jsonl", ["request-log", "--cluster", "k", "--node", "101", str(ALTER_PARTITIONS)]
    )
    assert len(requests.read_text().splitlines()) == 3
    alerts = _replay(capsys, up_to_fence, requests, options=("--no-measure-clocks", "--grace-ms", "200"))
    _assert_kafka_13916(alerts)
    assert {a["confidence"] for a in alerts} == {"certain"}
    for alert in alerts:
        assert alert["evidence"][-1]["kind"] == "request"
        assert "accepted an AlterPartition" in alert["message"]


def test_the_same_violation_from_the_record_and_the_answer_is_one_alert(capsys, tmp_path):
    metadata = _convert(capsys, tmp_path, "m.jsonl", ["metadata-log", "--cluster", "k", str(SEGMENT)])
    requests = _convert(
        capsys, tmp_path, "r.jsonl", ["request-log", "--cluster", "k", "--node", "101", str(ALTER_PARTITIONS)]
    )
    both = _replay(capsys, metadata, requests)
    _assert_kafka_13916(both)
    assert {a["alert_id"] for a in both} == {a["alert_id"] for a in _replay(capsys, metadata)}
