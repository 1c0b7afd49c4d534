"""Print the example alerts of docs/rules.md: each is a small violating history
run through detectors.engine.Detector with a fixed clock.

    .venv/bin/python docs/gen_rule_examples.py          # print them
    .venv/bin/python docs/gen_rule_examples.py --check  # exit 1 if rules.md differs
    .venv/bin/python docs/gen_rule_examples.py --write  # refresh rules.md's examples
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from detectors.engine import Detector
from detectors.envelope import envelope_from_obj
from detectors.errors import KafkaError as E
from detectors.render import alert_line
from producers import shapes as s

CLUSTER, TOPIC, TOPIC_ID, CONTROLLER = "prod-eu-1", "orders", "qG8hUlWTTJ2eRb_bFvWRXg", 3000
VOTERS, T0, NOW_MS = [3000, 3001, 3002], 1763720000000, 1763720060000


class History:
    """Envelopes in time order; positions are ``example.jsonl:<line>``."""

    def __init__(self, standard: bool = True):
        self.raw: list[dict[str, Any]] = []
        self.offset = self.correlation_id = 0
        if standard:  # brokers 1-3 (epochs 10-12); orders-0: replicas/ISR [1,2,3], leader 1, epoch 0
            self.meta(0, s.feature_level(21))
            for broker, epoch in {1: 10, 2: 11, 3: 12}.items():
                self.meta(0, s.register_broker(broker, epoch, fenced=False))
            self.meta(0, s.topic(TOPIC, TOPIC_ID))
            self.meta(0, s.partition(TOPIC_ID, 0, [1, 2, 3], [1, 2, 3], 1))

    def meta(self, t: int, body: dict[str, Any]) -> History:
        self.offset += 1
        self.raw.append(s.envelope(CLUSTER, "metadata", T0 + t, body, offset=self.offset))
        return self

    def change(self, t: int, **changed: Any) -> History:
        return self.meta(t, s.partition_change(TOPIC_ID, 0, **changed))

    def req(self, t: int, node: int, body: dict[str, Any]) -> History:
        self.correlation_id += 1
        body["requestHeader"]["correlationId"] = self.correlation_id
        self.raw.append(s.envelope(CLUSTER, "request", T0 + t, body, node=node))
        return self

    def quorum(self, t: int, node: int, leader: int, epoch: int, voted: int) -> History:
        self.raw.append(
            s.envelope(
                CLUSTER, "quorum_state", T0 + t, s.quorum_state(leader, epoch, voted, VOTERS), node=node
            )
        )
        return self

    def segment(self, t: int, seg: str, broker: int, cleaner: dict[int, int]) -> History:
        body = s.remote_segment(
            TOPIC_ID, 0, seg, broker_id=broker, start=0, end=max(cleaner.values()),
            leader_epochs={e: 0 for e in cleaner}, cleaner=cleaner, topic_name=TOPIC,
        )  # fmt: skip
        self.raw.append(s.envelope(CLUSTER, "remote_log_metadata", T0 + t, body))
        return self

    def seg_state(self, t: int, seg: str, broker: int, state: str) -> History:
        body = s.remote_update(TOPIC_ID, 0, seg, broker_id=broker, state=state)
        self.raw.append(s.envelope(CLUSTER, "remote_log_metadata", T0 + t, body))
        return self

    def run(self) -> list[dict[str, Any]]:
        detector = Detector(now_ms=lambda: NOW_MS)
        for line, raw in enumerate(self.raw, start=1):
            assert detector.ingest(envelope_from_obj(raw, f"example.jsonl:{line}", line)) == []
        detector.flush()
        return [a.to_dict() for a in detector.drain()]


def elected_2() -> History:
    return History().change(10_000, leader=2)  # orders-0: leader 2, leader epoch 1


def alter(t: int, *, broker_epoch: int = 10, **fields: Any) -> tuple[int, int, dict[str, Any]]:
    body = s.alter_partition(TOPIC, TOPIC_ID, 0, broker_id=1, broker_epoch=broker_epoch, **fields)
    return t, CONTROLLER, body


def zombie_upload() -> History:  # KIP-1272's table: Seg-2 from the new leader invalidates Seg-1
    h = elected_2().segment(9_000, "seg-1", 1, {0: 123}).segment(11_000, "seg-2", 2, {0: 100, 1: 155})
    return h.seg_state(11_300, "seg-2", 2, "COPY_SEGMENT_FINISHED").seg_state(
        11_400, "seg-1", 1, "COPY_SEGMENT_FINISHED"
    )


EXAMPLES: dict[str, Callable[[], History]] = {
    "PRODUCE_STALE_EPOCH_ACCEPTED": lambda: elected_2().req(13_000, 2, s.produce(TOPIC, 0, E.NONE, epoch=0)),
    "PRODUCE_ACCEPTED_BY_NON_LEADER": lambda: elected_2().req(13_000, 1, s.produce(TOPIC, 0, E.NONE)),
    "PRODUCE_EPOCH_ERROR_MISMATCH": lambda: History().req(
        13_000, 1, s.produce(TOPIC, 0, E.FENCED_LEADER_EPOCH, epoch=0)
    ),
    "FETCH_STALE_EPOCH_SERVED": lambda: elected_2().req(13_000, 2, s.fetch(TOPIC, 0, E.NONE, epoch=0)),
    "STOP_REPLICA_STALE_EPOCH_APPLIED": lambda: elected_2().req(
        13_000, 3, s.stop_replica(TOPIC, 0, 0, E.NONE, delete=True)
    ),
    "STOP_REPLICA_DELETE_SENTINEL_REJECTED": lambda: (
        History()
        .meta(5_000, s.remove_topic(TOPIC_ID))
        .req(5_100, 3, s.stop_replica(TOPIC, 0, -2, E.FENCED_LEADER_EPOCH, delete=True))
    ),
    "STOP_REPLICA_CURRENT_EPOCH_REJECTED": lambda: elected_2().req(
        13_000, 3, s.stop_replica(TOPIC, 0, 1, E.FENCED_LEADER_EPOCH)
    ),
    "STOP_REPLICA_STALE_CONTROLLER_ACCEPTED": lambda: (
        History()
        .req(5_000, 3, s.stop_replica(TOPIC, 0, 0, E.NONE, controller_epoch=2))
        .req(6_000, 3, s.stop_replica(TOPIC, 0, 0, E.NONE, controller_epoch=1))
    ),
    "ISR_INELIGIBLE_REPLICA_ADMITTED": lambda: (
        History()
        .change(5_000, isr=[1, 2])
        .meta(6_000, s.broker_change(3, 12, fenced=1))
        .change(7_000, isr=[1, 2, 3])
    ),
    "LEADER_INELIGIBLE_ELECTED": lambda: (
        History().meta(5_000, s.broker_change(2, 11, shutdown=True)).change(6_000, leader=2)
    ),
    "ALTER_PARTITION_STALE_EPOCH_ACCEPTED": lambda: elected_2().req(
        *alter(13_000, leader_epoch=0, partition_epoch=0, new_isr=[1, 2], error=E.NONE)
    ),
    "ALTER_PARTITION_STALE_BROKER_EPOCH_ACCEPTED": lambda: (
        History()
        .meta(5_000, s.register_broker(1, 30, fenced=False))
        .req(*alter(9_000, leader_epoch=0, partition_epoch=0, new_isr=[1, 2, 3], error=E.NONE))
    ),
    "ALTER_PARTITION_ERROR_VERSION_MISMATCH": lambda: (
        History()
        .meta(5_000, s.broker_change(3, 12, fenced=1))
        .change(5_100, isr=[1, 2])
        .req(
            *alter(
                6_000,
                leader_epoch=0,
                partition_epoch=1,
                new_isr=[1, 2, 3],
                error=E.INELIGIBLE_REPLICA,
                version=1,
            )
        )
    ),
    "QUORUM_TWO_LEADERS_IN_EPOCH": lambda: (
        History(False).quorum(1_000, 3000, 3000, 5, 3000).quorum(1_500, 3001, 3001, 5, 3001)
    ),
    "QUORUM_EPOCH_REGRESSION": lambda: (
        History(False).quorum(1_000, 3002, 3000, 5, 3000).quorum(2_000, 3002, 3000, 4, 3000)
    ),
    "QUORUM_DOUBLE_VOTE": lambda: (
        History(False)
        .req(1_000, 3002, s.vote(3000, 5, True, voter=3002))
        .req(1_200, 3002, s.vote(3001, 5, True, voter=3002))
    ),
    "QUORUM_ZOMBIE_LEADER": lambda: (
        History(False)
        .quorum(1_000, 3000, 3000, 5, 3000)
        .quorum(2_000, 3001, 3001, 6, 3001)
        .req(6_500, 3000, s.quorum_fetch(3000, 5, 1))  # broker 1 still fetches from the old leader
        .quorum(7_000, 3000, 3001, 6, 3001)
    ),
    "REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED": zombie_upload,
    "REMOTE_SEGMENT_ZOMBIE_DELETE": lambda: (
        History()
        .segment(2_000, "seg-1", 1, {0: 100})
        .seg_state(2_100, "seg-1", 1, "COPY_SEGMENT_FINISHED")
        .seg_state(3_000, "seg-1", 2, "DELETE_SEGMENT_STARTED")
        .seg_state(3_100, "seg-1", 2, "DELETE_SEGMENT_FINISHED")
    ),
    "REMOTE_SEGMENT_INVALID_TRANSITION": lambda: (
        History()
        .segment(2_000, "seg-1", 1, {0: 100})
        .seg_state(2_100, "seg-1", 1, "COPY_SEGMENT_FINISHED")
        .seg_state(2_200, "seg-1", 1, "COPY_SEGMENT_STARTED")
    ),
}


def blocks() -> dict[str, str]:
    out = {}
    for rule, build in EXAMPLES.items():
        alerts = build().run()
        assert alerts and {a["rule"] for a in alerts} == {rule}, (rule, alerts)
        # Each alert as every human-facing sink shows it (detectors.render.alert_line), then as JSON.
        out[rule] = "\n".join(
            f"```text\n{alert_line(a)}\n```\n\n```json\n{json.dumps(a, indent=2)}\n```" for a in alerts
        )
    return out


def rewrite(text: str, generated: dict[str, str]) -> str:
    """``text`` with each rule section's example blocks replaced by the generated ones."""
    for rule, block in generated.items():
        start = text.index(f"\n## {rule}")
        end = text.find("\n## ", start + 1)
        end = len(text) if end < 0 else end
        section = text[start:end]
        first = section.index("```text") if "```text" in section else section.index("```json")
        last = section.rindex("```") + 3
        text = text[:start] + section[:first] + block + section[last:] + text[end:]
    return text


if __name__ == "__main__":
    generated = blocks()
    if sys.argv[1:] == ["--write"]:
        path = Path(__file__).parent / "rules.md"
        path.write_text(rewrite(path.read_text(), generated))
        sys.exit(0)
    if sys.argv[1:] == ["--check"]:
        text = (Path(__file__).parent / "rules.md").read_text()
        stale = [rule for rule, block in generated.items() if block not in text]
        print("stale examples: " + ", ".join(stale) if stale else "docs/rules.md examples are current")
        sys.exit(1 if stale else 0)
    for rule, block in generated.items():
        print(f"### {rule}\n\n{block}\n")
