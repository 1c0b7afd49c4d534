"""Timelines for the incident report (incidents.page), gathered
either from a running Detector's views or from an alert alone.

``from_detector`` is called as an alert leaves the detector (replay drains
after every event). Then the detector's view still holds every state of the
alert's grace window ``[ts_ms - grace_ms, ts_ms + grace_ms]``: judgments wait
until the watermark passes ``ts_ms + grace_ms``, and the view keeps history
``retention_ms`` (two graces plus the lateness) behind its newest change
(DetectorConfig). So the chart shows exactly what the rule judged against:
leader, leader epoch, ISR and replicas from the PartitionStates that
detectors.view replayed with Kafka's epoch arithmetic, and each broker's
fenced / controlled-shutdown / unregistered state from its registration
records, with no parsing of our own.

``from_evidence`` needs nothing but the alert (the alerts topic of a running
job, ``--engine spark``): its evidence events on their nodes' lanes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from detectors.cluster import ClusterState
from detectors.engine import Detector
from detectors.history import History
from detectors.render import iso_utc, where
from detectors.view import BrokerState, PartitionState, own_topic_key
from incidents.page import EpochStep, Mark, Span, Timeline

METADATA_LANE = "metadata log"
REMOTE_LANE = "remote log metadata"
# Context shown around the judged window, as a share of the window's width.
MARGIN_SHARE = 0.15
FROM_VIEW = "states from the detector's view"
FROM_EVIDENCE = "from the alert's evidence only (no view states: the events were not replayed here)"


def from_detector(detector: Detector, alert: Mapping[str, Any]) -> Timeline:
    """The alert's timeline from ``detector``'s state of its cluster, which must
    be the detector that just raised it."""
    cs = detector.clusters.get(str(alert["cluster"]))
    grace = detector.config.grace_ms
    if cs is None:
        return from_evidence(alert, grace)
    rule = str(alert["rule"])
    lo, hi = _window(alert, grace)
    if rule.startswith("QUORUM_"):
        return _quorum(cs, alert, lo, hi, grace)
    if rule == "STOP_REPLICA_STALE_CONTROLLER_ACCEPTED" and alert.get("node") is not None:
        return _controller_epochs(cs, alert, lo, hi, grace)
    key = _partition_key(alert)
    history = cs.view.partition(key) if key else None
    if key is None or history is None:
        return from_evidence(alert, grace)
    return _partition(cs, alert, key, history, lo, hi, grace)


def from_evidence(alert: Mapping[str, Any], grace_ms: int) -> Timeline:
    """The alert's evidence events on their lanes; no states."""
    lo, hi = _window(alert, grace_ms)
    marks = _evidence_marks(alert)
    return _timeline(
        alert,
        lo,
        hi,
        grace_ms,
        FROM_EVIDENCE,
        marks=tuple(marks),
        lanes=_lanes_of(marks, ()),
    )


def _timeline(alert: Mapping[str, Any], lo: int, hi: int, grace: int, source: str, **parts: Any) -> Timeline:
    """A timeline of ``alert`` over [lo, hi] with what every kind of chart shares."""
    return Timeline(
        subject=_subject(alert),
        lo_ms=lo,
        hi_ms=hi,
        grace_ms=grace,
        violation_ms=_in_metadata_clock(alert, alert.get("node"), int(alert["ts_ms"])),
        source=source,
        **parts,
    )


# ---- clocks ---------------------------------------------------------------------------


def _clock_offsets(alert: Mapping[str, Any]) -> dict[int, tuple[int, int]]:
    """Per node, the offset interval (ms) of its clock against the metadata log's
    that the verdict allowed for: the alert's evidence of role "clock"."""
    return {
        int(e["node"]): (int(e["offset_low_ms"]), int(e["offset_high_ms"]))
        for e in alert.get("evidence", ())
        if e.get("role") == "clock" and e.get("node") is not None and e.get("offset_low_ms") is not None
    }


def _in_metadata_clock(alert: Mapping[str, Any], node: object, ts_ms: int) -> int:
    """``ts_ms`` stamped by ``node``'s clock, drawn in the metadata log's clock:
    moved by the middle of the node's measured offset interval (unmoved where the
    alert measured none; the metadata log's own records are in its clock)."""
    interval = _clock_offsets(alert).get(node) if isinstance(node, int) else None
    return ts_ms if interval is None else ts_ms - (interval[0] + interval[1]) // 2


# ---- what a chart covers ------------------------------------------------------------


def _window(alert: Mapping[str, Any], grace_ms: int) -> tuple[int, int]:
    """The grace window around the violation, widened to every evidence event,
    plus a margin either side."""
    ts = _in_metadata_clock(alert, alert.get("node"), int(alert["ts_ms"]))
    times = [_in_metadata_clock(alert, e.get("node"), int(e["ts_ms"])) for e in alert.get("evidence", ())]
    lo = min([ts - grace_ms, *times])
    hi = max([ts + grace_ms, *times])
    margin = max(int((hi - lo) * MARGIN_SHARE), 50)
    return lo - margin, hi + margin


def _partition_key(alert: Mapping[str, Any]) -> tuple[str, int] | None:
    if alert.get("partition") is None or (alert.get("topic") is None and alert.get("topic_id") is None):
        return None
    return own_topic_key(alert.get("topic"), alert.get("topic_id")), int(alert["partition"])


def _subject(alert: Mapping[str, Any]) -> str:
    cluster = alert.get("cluster")
    if str(alert["rule"]).startswith("QUORUM_"):
        return f"metadata quorum of cluster {cluster}"
    if alert.get("partition") is not None:
        what = "remote segments of partition" if str(alert["rule"]).startswith("REMOTE_") else "partition"
        return f"{what} {where(alert)} of cluster {cluster}"
    return f"node {alert.get('node')} of cluster {cluster}"


def _node_lane(node: object) -> str:
    return f"node {node}"


def _evidence_lane(evidence: Mapping[str, Any]) -> str:
    if evidence.get("node") is not None:
        return _node_lane(evidence["node"])
    return REMOTE_LANE if evidence.get("kind") == "remote_log_metadata" else METADATA_LANE


def _evidence_marks(alert: Mapping[str, Any]) -> list[Mark]:
    """The alert's evidence events, each where it happened in the metadata log's
    clock; a node's clock correction is said on its marks, not drawn apart."""
    offsets = _clock_offsets(alert)
    marks = []
    for e in alert.get("evidence", ()):
        if e.get("role") == "clock":
            continue
        text = f"{e.get('role')}: {e.get('summary')} ({e.get('kind')} at {e.get('position')})"
        node, ts = e.get("node"), int(e["ts_ms"])
        placed = _in_metadata_clock(alert, node, ts)
        if isinstance(node, int) and node in offsets:
            low, high = offsets[node]
            text += (
                f"; stamped {iso_utc(ts)} by node {node}'s clock, moved {placed - ts:+d} ms into the "
                f"metadata log's clock (its offset measured {low}..{high} ms)"
            )
        marks.append(
            Mark(_evidence_lane(e), placed, "violation" if e.get("role") == "violation" else "view", text)
        )
    return marks


def _lanes_of(marks: Sequence[Mark], spans: Sequence[Span], first: Sequence[str] = ()) -> tuple[str, ...]:
    """``first`` in order, then node lanes by id, then the logs."""
    seen = dict.fromkeys(first)
    others = {m.lane for m in marks} | {s.lane for s in spans}
    nodes = sorted((lane for lane in others if lane not in seen and lane.startswith("node ")), key=_node_id)
    logs = sorted(lane for lane in others if lane not in seen and not lane.startswith("node "))
    return (*seen, *nodes, *logs)


def _node_id(lane: str) -> int:
    return int(lane.removeprefix("node "))


# ---- partitions: leader, epochs, ISR, fencing ----------------------------------------


def _partition(
    cs: ClusterState,
    alert: Mapping[str, Any],
    key: tuple[str, int],
    history: History[PartitionState],
    lo: int,
    hi: int,
    grace: int,
) -> Timeline:
    states = history.window(lo, hi)
    starts = _starts([s.source.ts_ms for s in states], lo)
    ends = [*starts[1:], hi]
    epochs: list[EpochStep] = []
    spans: list[Span] = []
    marks = _evidence_marks(alert)
    brokers: set[int] = set()
    for state, start, end in zip(states, starts, ends, strict=True):
        text = (
            f"leader {state.leader}, leader epoch {state.leader_epoch}, partition epoch "
            f"{state.partition_epoch}, ISR {list(state.isr)}, replicas {list(state.replicas)}"
        )
        epochs.append(EpochStep(start, state.leader_epoch, text))
        if state.source.ts_ms >= lo:
            marks.append(Mark(METADATA_LANE, state.source.ts_ms, "record", _record_text(state.source)))
        members = {*state.replicas, *state.isr} | ({state.leader} if state.leader >= 0 else set())
        brokers |= members
        for broker in members:
            spans.append(
                Span(_node_lane(broker), _role(broker, state), start, end, f"broker {broker}: {text}")
            )
    if isinstance(alert.get("node"), int) and alert["node"] in cs.view.brokers:
        brokers.add(alert["node"])
    for broker in sorted(brokers):
        spans += _fencing_spans(cs, broker, lo, hi, marks)
    node_lanes = [_node_lane(b) for b in sorted(brokers)]
    return _timeline(
        alert,
        lo,
        hi,
        grace,
        FROM_VIEW,
        epoch_name="leader epoch",
        epochs=tuple(epochs),
        spans=tuple(spans),
        marks=tuple(marks) + _segment_marks(cs, alert, key, lo, hi),
        lanes=_lanes_of(marks, spans, node_lanes),
    )


def _starts(times: Sequence[int], lo: int) -> list[int]:
    """When each state took effect on the chart: not before ``lo``, and never
    before its predecessor (detectors.history keeps the log's order)."""
    out: list[int] = []
    for t in times:
        out.append(max(t, lo, out[-1] if out else lo))
    return out


def _role(broker: int, state: PartitionState) -> str:
    if broker == state.leader:
        return "leader"
    return "in ISR" if broker in state.isr else "replica, out of ISR"


def _record_text(source: Any) -> str:
    return f"{source.summary} (offset {source.offset}, {source.position})"


def _fencing_spans(cs: ClusterState, broker: int, lo: int, hi: int, marks: list[Mark]) -> list[Span]:
    """Where ``broker`` could not be in an ISR or lead (KIP-841), from its
    registration states; their records join ``marks``."""
    states: list[BrokerState] = cs.view.broker_window(broker, lo, hi)
    starts = _starts([s.source.ts_ms for s in states], lo)
    spans = []
    for state, start, end in zip(states, starts, [*starts[1:], hi], strict=True):
        if state.source.ts_ms >= lo:
            marks.append(Mark(_node_lane(broker), state.source.ts_ms, "record", _record_text(state.source)))
        why = state.ineligibility()
        if why is not None:
            spans.append(
                Span(_node_lane(broker), why, start, end, f"broker {broker} {why} (epoch {state.epoch})")
            )
    return spans


def _segment_marks(
    cs: ClusterState, alert: Mapping[str, Any], key: tuple[str, int], lo: int, hi: int
) -> tuple[Mark, ...]:
    """For tiered-storage alerts: the partition's segments that finished their
    upload within the window, on the remote log lane."""
    if not str(alert["rule"]).startswith("REMOTE_"):
        return ()
    out = []
    part = cs.remote.partitions.get(key)
    for segment in part.segments.values() if part is not None else ():
        env = segment.finished
        if env is not None and lo <= env.ts_ms <= hi:
            text = (
                f"segment {segment.segment_id} upload by broker {segment.broker_id} finished ({env.position})"
            )
            out.append(Mark(REMOTE_LANE, env.ts_ms, "record", text))
    return tuple(out)


# ---- the metadata quorum and controller epochs ----------------------------------------


def _quorum(cs: ClusterState, alert: Mapping[str, Any], lo: int, hi: int, grace: int) -> Timeline:
    """Who acted as leader of which epoch (KIP-595 claims) and the votes granted
    within the window; the epoch line is the newest epoch any node led."""
    claims = sorted(
        (c for by_node in cs.quorum.claims.values() for c in by_node.values() if c.ts_ms <= hi),
        key=lambda c: (c.ts_ms, c.epoch, c.node),
    )
    before = [c for c in claims if c.ts_ms < lo]
    shown = ([max(before, key=lambda c: c.epoch)] if before else []) + [c for c in claims if c.ts_ms >= lo]
    epochs: list[EpochStep] = []
    newest = None
    for c in shown:
        if newest is None or c.epoch > newest:
            newest = c.epoch
            epochs.append(EpochStep(max(c.ts_ms, lo), c.epoch, f"node {c.node} leads epoch {c.epoch}"))
    spans = []
    for c in shown:
        # A claim stands until a newer epoch is led by anyone: a node still acting then is a zombie.
        end = min([d.ts_ms for d in shown if d.epoch > c.epoch and d.ts_ms >= c.ts_ms] or [hi])
        spans.append(
            Span(
                _node_lane(c.node),
                "quorum leader",
                max(c.ts_ms, lo),
                max(end, lo),
                f"node {c.node} leader of epoch {c.epoch}",
            )
        )
    marks = _evidence_marks(alert)
    for (voter, epoch), by_candidate in cs.quorum.votes.items():
        for vote in by_candidate.values():
            if lo <= vote.ts_ms <= hi:
                where = vote.evidence.position
                text = f"node {voter} granted its vote to {vote.node} in epoch {epoch} ({where})"
                marks.append(Mark(_node_lane(voter), vote.ts_ms, "record", text))
    return _timeline(
        alert,
        lo,
        hi,
        grace,
        FROM_VIEW,
        epoch_name="quorum epoch",
        epochs=tuple(epochs),
        spans=tuple(spans),
        marks=tuple(marks),
        lanes=_lanes_of(marks, spans, [_node_lane(v) for v in cs.quorum.voters]),
    )


def _controller_epochs(cs: ClusterState, alert: Mapping[str, Any], lo: int, hi: int, grace: int) -> Timeline:
    """The controller epochs the broker accepted (KIP-570's STALE_CONTROLLER_EPOCH check)."""
    node = int(alert["node"])
    history = cs.controller_epochs.get(node)
    accepted = history.window(lo, hi) if history else []
    starts = _starts([evidence.ts_ms for _, evidence in accepted], lo)
    marks = _evidence_marks(alert)
    epochs = []
    for (epoch, evidence), start in zip(accepted, starts, strict=True):
        epochs.append(EpochStep(start, epoch, f"broker {node} accepted controller epoch {epoch}"))
        if evidence.ts_ms >= lo:
            marks.append(Mark(_node_lane(node), evidence.ts_ms, "record", _record_text(evidence)))
    return _timeline(
        alert,
        lo,
        hi,
        grace,
        FROM_VIEW,
        epoch_name=f"controller epoch at node {node}",
        epochs=tuple(epochs),
        marks=tuple(marks),
        lanes=_lanes_of(marks, (), [_node_lane(node)]),
    )
