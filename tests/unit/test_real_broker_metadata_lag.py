"""A broker that trails the metadata log past the grace window is not blamed
for what it had not applied, by its own heartbeats (ClusterState.metadata_applied).

Kafka 4.4.0 under ``fencewatch kafka-lab --nemesis --seed 2 --faults
pause-broker,shutdown-broker`` (2026-12-08): broker 1 was SIGSTOPped at
01:08:37 past ``replica.lag.time.max.ms`` and resumed at 01:09:01. The
controllers fenced it and moved its leaderships meanwhile; resumed, it served
fetches at the old leader epochs, and accepted an acks=-1 produce as leader,
for about half a second, before it had applied those records. Its first
heartbeat after the pause (controller 102's request log, 01:09:01.219)
reported ``currentMetadataOffset`` 585, 24 s behind the log. Judged by the
2 s grace window alone, that raised 19 certain false alerts on broker 1.
The data are Kafka's own files of that run: controller 101's metadata segment
and bootstrap snapshot, broker 1's request log from 01:08:33 to 01:09:02.6, and
the BrokerHeartbeat lines of controller 102's request log from 01:07:50 to
01:09:03 (tests/data/kafka-lab/README.md).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
from kafka_files import DATA, metadata_log_envelopes, request_log_envelopes

from detectors.envelope import envelope_from_obj
from detectors.requests import broker_heartbeat
from detectors.stats import UnverifiedReason
from fencewatch.replay import replay_config
from lab.verdict import Judged, judge

CLUSTER = "lab"
PAUSED = 1
# What the paused broker did in the half second after it resumed, at the epochs
# it still held: judged by the grace window alone, each a certain alert.
LAG_ALERTS = {("FETCH_STALE_EPOCH_SERVED", PAUSED): 18, ("PRODUCE_ACCEPTED_BY_NON_LEADER", PAUSED): 1}


def _request_log(tmp_path: Path, name: str, node: int) -> Path:
    out = tmp_path / f"{name}.jsonl"
    stats = request_log_envelopes(DATA / f"{name}.log.gz", out, source=name, cluster=CLUSTER, node=node)
    assert stats.dead_letters == 0 and stats.records > 100
    return out


def _metadata_log(tmp_path: Path) -> Path:
    out = tmp_path / "metadata.jsonl"
    metadata_log_envelopes(
        DATA / "lag-00000000000000000000-0000000000.checkpoint",
        DATA / "lag-00000000000000000000.log.gz",
        out,
        cluster=CLUSTER,
        node=101,
    )
    return out


def _judged(tmp_path: Path, heartbeats: bool) -> Judged:
    files = [_metadata_log(tmp_path), _request_log(tmp_path, "lag-broker-1-request", PAUSED)]
    if heartbeats:
        files.append(_request_log(tmp_path, "lag-controller-102-heartbeats", 102))
    return judge(files, replay_config())


def _reports(tmp_path: Path) -> list[tuple[int, int]]:
    """(ts_ms, currentMetadataOffset) of the paused broker's heartbeats, as the controller logged them."""
    path = _request_log(tmp_path, "lag-controller-102-heartbeats", 102)
    lines = path.read_text().splitlines()
    envelopes = [envelope_from_obj(orjson.loads(line), f"heartbeats:{i}", i) for i, line in enumerate(lines)]
    beats = [(env.ts_ms, broker_heartbeat(env.body)) for env in envelopes]
    return [(ts, beat.current_metadata_offset) for ts, beat in beats if beat.broker_id == PAUSED]


def test_without_heartbeats_the_grace_window_blames_the_resumed_broker_for_what_it_had_not_applied(
    tmp_path: Path,
) -> None:
    judged = _judged(tmp_path, heartbeats=False)
    assert judged.dead_letters == []
    by_rule = Counter((a["rule"], a["node"]) for a in judged.alerts if a["confidence"] == "certain")
    assert by_rule == LAG_ALERTS
    reports = _reports(tmp_path)
    for alert in judged.alerts:
        # The broker's last report before it acted...
        reported = max(offset for ts, offset in reports if ts <= alert["ts_ms"])
        # ...was short of the record that set the state it is blamed against,
        # written past the grace window before.
        view = alert["evidence"][0]
        assert view["kind"] == "metadata" and view["offset"] > reported, (alert["message"], reported)
        assert alert["ts_ms"] - view["ts_ms"] > replay_config().grace_ms


def test_its_heartbeats_show_it_had_not_applied_what_it_is_blamed_for(tmp_path: Path) -> None:
    judged = _judged(tmp_path, heartbeats=True)
    assert judged.dead_letters == []
    assert judged.alerts == [], [a["message"] for a in judged.alerts[:3]]
    counters = judged.detector.counters
    assert counters.unverified[UnverifiedReason.BROKER_METADATA_BEHIND.value] == sum(LAG_ALERTS.values())
    assert counters.events["request:BROKER_HEARTBEAT"] > 100
