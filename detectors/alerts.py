"""Alerts as in SPEC section 3: one JSON object per alert, the same in every sink."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from detectors.envelope import Envelope
from detectors.fast_init import fast_init
from detectors.pickling import fast_pickle

SEVERITIES = ("critical", "warning", "info")
# A violation fires; a timer rule's alert also resolves when the violation ends
# (the same series, another alert id). A resolution is not a violation.
FIRING, RESOLVED = "firing", "resolved"
STATUSES = (FIRING, RESOLVED)
# A certain violation holds for every clock offset the evidence allows; a
# possible one for some but not all (SPEC 1.5): raised at POSSIBLE_SEVERITY,
# which pages no one by default, with the condition under which it holds.
CERTAIN, POSSIBLE = "certain", "possible"
CONFIDENCES = (CERTAIN, POSSIBLE)
POSSIBLE_SEVERITY = "info"


@fast_pickle
@fast_init
@dataclass(frozen=True, slots=True)
class Evidence:
    """One event of the chain that led to an alert.

    ``role`` says what it proved ("view": established the authoritative state;
    "violation": the outcome judged). ``offset`` is the source log's own offset
    (metadata offset) when there is one; ``position`` is where fencewatch read it
    (``file:line`` in replay, ``topic/partition@offset`` in the streaming job).
    """

    role: str
    kind: str
    ts_ms: int
    node: int | None
    offset: int | None
    position: str
    summary: str
    # The clock offset interval a verdict allowed for (role "clock" only; detectors.clocks).
    offset_low_ms: int | None = None
    offset_high_ms: int | None = None

    @classmethod
    def of(cls, role: str, env: Envelope, summary: str) -> Evidence:
        return cls(role, env.kind, env.ts_ms, env.node, env.offset, env.position, summary)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "role": self.role,
            "kind": self.kind,
            "ts_ms": self.ts_ms,
            "node": self.node,
            "offset": self.offset,
            "position": self.position,
            "summary": self.summary,
        }
        if self.role == "clock":
            out["offset_low_ms"] = self.offset_low_ms
            out["offset_high_ms"] = self.offset_high_ms
        return out


@fast_pickle
@dataclass(frozen=True, slots=True)
class ClockCondition:
    """When a possible violation holds: for the offsets (node's clock minus the
    metadata log's) in ``holds_ms``, a list of ``(low, high)`` ranges within
    ``allowed_ms``, the interval the clock evidence allows. ``text`` says it in
    words ("holds if node 3's clock is at most 3.2 s ahead of the metadata log's")."""

    node: int | None
    allowed_ms: tuple[int, int]
    holds_ms: tuple[tuple[int, int], ...]
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "allowed_ms": list(self.allowed_ms),
            "holds_ms": [list(r) for r in self.holds_ms],
            "text": self.text,
        }


@fast_pickle
@dataclass(frozen=True, slots=True)
class Alert:
    alert_id: str
    rule: str
    severity: str
    status: str
    cluster: str
    topic: str | None
    topic_id: str | None
    partition: int | None
    node: int | None
    ts_ms: int
    detected_ms: int
    message: str
    evidence: tuple[Evidence, ...] = field(default=())
    links: tuple[str, ...] = field(default=())
    confidence: str = CERTAIN
    condition: ClockCondition | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "alert_id": self.alert_id,
            "rule": self.rule,
            "severity": self.severity,
            "status": self.status,
            "cluster": self.cluster,
            "topic": self.topic,
            "topic_id": self.topic_id,
            "partition": self.partition,
            "node": self.node,
            "ts_ms": self.ts_ms,
            "detected_ms": self.detected_ms,
            "message": self.message,
            "evidence": [e.to_dict() for e in self.evidence],
            "links": list(self.links),
            "confidence": self.confidence,
            "clock_condition": None if self.condition is None else self.condition.to_dict(),
        }


def make_alert_id(*parts: object) -> str:
    """A stable id from what identifies the violation (never from wall-clock
    time or read positions), so a restarted job re-raises the same id and sinks
    can de-duplicate."""
    text = "\x1f".join("" if p is None else str(p) for p in parts)
    return hashlib.sha256(text.encode()).hexdigest()[:20]
