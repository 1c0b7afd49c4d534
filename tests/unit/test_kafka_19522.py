"""KAFKA-19522 caught on Kafka's own records: Apache Kafka 4.0.0's controller,
with eligible leader replicas on, elected the last known leader of a
leaderless partition (broker 2) in the very batch that re-registered it, while
it was still fenced (tests/data/kafka-bugs/README.md says how the files were
made). The record both elects it and sets the ISR to it alone (an unclean
election), so LEADER_INELIGIBLE_ELECTED and ISR_INELIGIBLE_REPLICA_ADMITTED
(docs/rules.md) fire, from the metadata segment and from Kafka's own dump of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fencewatch import cli

DATA = Path(__file__).resolve().parents[1] / "data" / "kafka-bugs" / "KAFKA-19522"
SEGMENT = DATA / "00000000000000000000.log"
DUMP = DATA / "00000000000000000000.dump"
ELECTED = 2
# Kafka's own offsets (the dump): 97 broker 2 fenced (its session timed out),
# 244 the PARTITION_CHANGE_RECORD electing it, 245 its REGISTER_BROKER_RECORD
# (fenced: true), 262 its unfencing.
FENCED_AT, ELECTED_AT = 97, 244


def _replay(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str, source: Path
) -> list[dict[str, Any]]:
    envelopes = tmp_path / f"{fmt}.jsonl"
    assert cli.main(["convert", fmt, "--cluster", "k", str(source)]) == 0
    converted = capsys.readouterr()
    assert ", 0 dead letters" in converted.err, converted.err
    envelopes.write_text(converted.out)
    assert cli.main(["replay", "--no-progress", str(envelopes)]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_kafka_4_0_0s_metadata_log_raises_the_election_of_a_fenced_last_known_leader(capsys, tmp_path):
    alerts = _replay(capsys, tmp_path, "metadata-log", SEGMENT)
    assert sorted(a["rule"] for a in alerts) == [
        "ISR_INELIGIBLE_REPLICA_ADMITTED",
        "LEADER_INELIGIBLE_ELECTED",
    ]
    for alert in alerts:
        assert (alert["topic"], alert["partition"], alert["node"]) == ("last-known-leader", 0, ELECTED)
        view, violation = alert["evidence"]
        assert (view["offset"], view["summary"]) == (FENCED_AT, f"broker {ELECTED} fenced")
        assert violation["offset"] == ELECTED_AT
        assert "while fenced" in alert["message"]


def test_kafka_4_0_0s_own_dump_of_it_raises_the_same_alerts(capsys, tmp_path):
    native = _replay(capsys, tmp_path, "metadata-log", SEGMENT)
    dumped = _replay(capsys, tmp_path, "metadata-dump", DUMP)
    assert len(dumped) == 2
    assert {a["alert_id"] for a in dumped} == {a["alert_id"] for a in native}
