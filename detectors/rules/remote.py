"""KIP-1272 (proposal) and KIP-405: fencing of remote (tiered) log segments."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from detectors.alerts import ClockCondition, Evidence
from detectors.applied_metadata import LedByOther
from detectors.envelope import Envelope, Unverified, without_body
from detectors.remote import (
    COPY_FINISHED,
    COPY_STARTED,
    DELETE_FINISHED,
    DELETE_STARTED,
    STATE_NAMES,
    PartitionDeleteEvent,
    PartitionSegments,
    Segment,
    parse_event,
)
from detectors.rules.base import Deferred, Rule, register
from detectors.stats import UnverifiedReason

if TYPE_CHECKING:
    from detectors.cluster import ClusterState

# state -> the states it may move to; a repeat of the same state is always allowed.
ALLOWED = {
    None: {COPY_STARTED},
    COPY_STARTED: {COPY_FINISHED, DELETE_STARTED},
    COPY_FINISHED: {DELETE_STARTED},
    DELETE_STARTED: {DELETE_FINISHED},
    DELETE_FINISHED: set(),
}


@register
class RemoteSegmentZombieUploadAccepted(Rule):
    """KIP-1272. A segment that claims leader epoch E reached offset O reached
    COPY_SEGMENT_FINISHED although an accepted segment established that E ended
    before O — regardless of which arrived first. The zombie's data would be
    served. A claim comes from what Kafka's records carry (RemoteLogSegmentMetadata):
    E's range in the segment's ``segmentLeaderEpochs`` (to the next epoch's start
    - 1, or ``endOffset`` for the last), which RemoteLogManager takes from the
    leader's epoch cache; an accepted segment that starts a later epoch at S ends
    every earlier epoch at S - 1. Where the proposal's cleaner-offset map is
    present, its claims are judged too: its ended epochs' offsets are ends.
    Not a violation: a segment whose epoch ends right before a later epoch's
    start; the same epoch's claim growing while it is still the newest (the
    leader or its cleaner progressing); a zombie upload that never finishes
    (rejected by validation)."""

    id = "REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED"
    severity = "critical"
    proposals = ("KIP-1272",)


@register
class RemoteSegmentZombieDelete(Rule):
    """KIP-1272. DELETE_SEGMENT_FINISHED without DELETE_SEGMENT_STARTED first, or
    a deletion requested by a broker that was not the partition's leader at any
    moment of the grace window, of a segment still valid in the leader-epoch
    lineage (accepted with COPY_SEGMENT_FINISHED and not invalidated as a zombie
    upload). The current leader still reads it. Not a violation: the leader
    deleting segments (retention); anyone cleaning up an upload that never
    finished or a zombie upload; a deletion that stays at DELETE_SEGMENT_STARTED
    (rejected); a former leader whose heartbeats, where read, do not show it
    had applied the record that took its leadership (ClusterState.metadata_applied)."""

    id = "REMOTE_SEGMENT_ZOMBIE_DELETE"
    severity = "critical"
    proposals = ("KIP-1272",)


@register
class RemoteSegmentInvalidTransition(Rule):
    """KIP-405 tiered storage. A segment state moved outside
    null -> COPY_SEGMENT_STARTED -> COPY_SEGMENT_FINISHED -> DELETE_SEGMENT_STARTED
    -> DELETE_SEGMENT_FINISHED. Not a violation: COPY_SEGMENT_STARTED ->
    DELETE_SEGMENT_STARTED (a failed upload cleaned up) and repeats of a state."""

    id = "REMOTE_SEGMENT_INVALID_TRANSITION"
    severity = "warning"
    proposals = ("KIP-405",)


def ingest(cs: ClusterState, env: Envelope) -> list[Deferred]:
    event = parse_event(env.body)
    if isinstance(event, PartitionDeleteEvent):
        # Kafka's RemoteLogMetadataManager.putRemotePartitionDeleteMetadata: once the controller
        # marks a partition deleted, all its remote segments are eligible for deletion, by
        # whichever remote partition remover acts on the mark (not the leader: there is none).
        cs.remote.mark_deleting(event, env.ts_ms)
        return []
    log_partition = env.body.get("partition")
    behind = cs.remote.behind(
        log_partition if type(log_partition) is int else None, event.broker_id, env.ts_ms
    )
    part = cs.remote.partitions.get(event.key) or PartitionSegments()
    segment = part.segments.get(event.segment_id)
    if segment is None:
        if event.cleaner is None:
            raise Unverified(UnverifiedReason.REMOTE_SEGMENT_NOT_SEEN)
        segment = Segment(
            event.segment_id, event.key, event.broker_id, event.cleaner, epochs=event.epochs or {}
        )
        part.segments[event.segment_id] = segment
        cs.remote.partitions[event.key] = part
    old, new = segment.state, event.state
    judgments: list[Deferred] = []
    if new == DELETE_FINISHED and old not in (DELETE_STARTED, DELETE_FINISHED):
        cs.emit(
            RemoteSegmentZombieDelete,
            env,
            message=f"segment {segment.segment_id} of {cs.describe(segment.key)} "
            "reached DELETE_SEGMENT_FINISHED without DELETE_SEGMENT_STARTED",
            node=event.broker_id,
            identity=(segment.segment_id,),
            partition_key=segment.key,
        )
    elif new != old and new not in ALLOWED[old]:
        cs.emit(
            RemoteSegmentInvalidTransition,
            env,
            message=f"segment {segment.segment_id} of {cs.describe(segment.key)} "
            f"moved from {STATE_NAMES[old] if old is not None else 'nothing'} "
            f"to {STATE_NAMES[new]}",
            node=event.broker_id,
            identity=(segment.segment_id, old, new),
            partition_key=segment.key,
        )
    segment.state = new
    if new == DELETE_STARTED and old != DELETE_STARTED:
        segment.delete_request = (event.broker_id, without_body(env))
        # Further behind than one source's records may arrive out of order: a step back.
        segment.requested_behind_ms = behind if behind > cs.config.lateness_ms else 0
    elif new == COPY_FINISHED and old != COPY_FINISHED:
        segment.finished = without_body(env)
        _judge_upload(cs, part, segment)
    elif new == DELETE_FINISHED and old != DELETE_FINISHED:
        if old == DELETE_STARTED and segment.delete_request:
            judgments.append((_judge_delete, (segment,)))
        # A deleted segment is gone from remote storage: stop tracking it.
        del part.segments[segment.segment_id]
        part.finished.discard(segment.segment_id)
        if not part.segments and not part.established_end and not part.epoch_starts:
            del cs.remote.partitions[event.key]
    return judgments


def _judge_upload(cs: ClusterState, part: PartitionSegments, segment: Segment) -> None:
    """Check the new segment against the ends already established, then let its
    own map establish ends and re-check the segments accepted before it."""
    assert segment.finished is not None
    _check_claims(cs, part, segment)
    lowered = False
    if not segment.zombie:
        for epoch, (start, _) in segment.epochs.items():
            if epoch == 0:
                continue  # the first epoch's start ends no epoch: nothing to keep
            known = part.epoch_starts.get(epoch)
            if known is None or start < known[0]:
                lowered = True
                summary = f"segment {segment.segment_id} started epoch {epoch} at {start}"
                part.epoch_starts[epoch] = (start, Evidence.of("view", segment.finished, summary))
    newest = max(segment.cleaner, default=None)
    for epoch, offset in segment.cleaner.items():
        if newest is not None and epoch < newest:
            known = part.established_end.get(epoch)
            if known is None or offset < known[0]:
                lowered = True
                part.established_end[epoch] = (
                    offset,
                    Evidence.of(
                        "view",
                        segment.finished,
                        f"segment {segment.segment_id} ended epoch {epoch} at {offset}",
                    ),
                )
    part.finished.add(segment.segment_id)
    if not lowered:
        return  # no end moved: the segments accepted earlier were already checked against these
    for other_id in sorted(part.finished):
        other = part.segments.get(other_id)
        if other is not None and other is not segment:
            _check_claims(cs, part, other)


def _check_claims(cs: ClusterState, part: PartitionSegments, segment: Segment) -> None:
    if segment.zombie or segment.finished is None:
        return
    for epoch, offset in sorted(segment.cleaner.items()):
        known = part.established_end.get(epoch)
        if known is not None and offset > known[0]:
            _zombie(cs, segment, epoch, offset, known[0], known[1])
            return
    for epoch, (_, last) in sorted(segment.epochs.items()):
        later = [(start, ev) for e, (start, ev) in part.epoch_starts.items() if e > epoch]
        if later:
            start, evidence = min(later, key=lambda found: found[0])
            if last >= start:
                _zombie(cs, segment, epoch, last, start - 1, evidence)
                return


def _zombie(
    cs: ClusterState, segment: Segment, epoch: int, offset: int, end: int, evidence: Evidence
) -> None:
    assert segment.finished is not None
    segment.zombie = True
    cs.emit(
        RemoteSegmentZombieUploadAccepted,
        segment.finished,
        message=f"segment {segment.segment_id} of {cs.describe(segment.key)} from broker "
        f"{segment.broker_id} claims epoch {epoch} reached offset {offset}, but a later epoch "
        f"established it ended at {end}",
        node=segment.broker_id,
        identity=(segment.segment_id,),
        evidence=[evidence],
        partition_key=segment.key,
    )


def _judge_delete(cs: ClusterState, env: Envelope, segment: Segment) -> None:
    assert segment.delete_request is not None
    broker, request = segment.delete_request
    if segment.zombie or segment.finished is None:
        return  # removing a rejected or invalid upload is cleanup, whoever does it
    marked_ms = cs.remote.deleted_since(segment.key)
    if marked_ms is not None and marked_ms <= request.ts_ms + cs.config.grace_ms:
        # The partition was deleted: its segments are cleaned up, whoever does it. The mark and
        # the request come from different clocks, so a mark up to grace_ms later still counts.
        return
    found = cs.partition_window(None, segment.key[0], segment.key[1], request, node=broker)
    if found is None:
        return
    key, states = found
    leaders = {s.leader for s in states}
    if broker not in leaders:
        # It lost the leadership throughout the window: had it applied the record that took it?
        applied = cs.metadata_applied(request, broker, key, states[0], LedByOther(broker))
        if applied is None:
            return
        cs.emit(
            RemoteSegmentZombieDelete,
            env,
            message=f"broker {broker}, not the leader ({sorted(leaders)}), deleted segment "
            f"{segment.segment_id} of {cs.describe(key)} that is still valid",
            node=broker,
            identity=(segment.segment_id,),
            evidence=[
                states[-1].source,
                Evidence.of("view", request, f"broker {broker} requested deletion"),
                *applied,
            ],
            partition_key=key,
            condition=_after_step_back(cs, segment, broker, request),
        )


def _after_step_back(
    cs: ClusterState, segment: Segment, broker: int, request: Envelope
) -> ClockCondition | None:
    """Where the deletion request was stamped behind its broker's earlier
    records (RemoteView.behind), its broker's clock stepped back before it
    made the request: it was made that much later than its stamp says, or
    more, so the verdict, judged at the moments the clock as measured before
    allows, holds only if it was not (SPEC 1.5). None: no step back.

    Its broker's request lines would show the step, but the first ones after
    a step back of seconds are refused as too late (Detector._first_delivery)
    and never reach the clock evidence: the deletions of broker 3 stepped back
    8 s were judged by its clock of before the step, placed 8 s early where it
    did not lead yet, and raised 6 certain false alarms
    (benchmarks/clock_campaign.py --step-grid, seed 3, 30,000 events)."""
    behind = segment.requested_behind_ms
    if not behind:
        return None
    interval = cs.node_interval(broker, request.ts_ms)
    low, high = (math.floor(interval.low_ms), math.ceil(interval.high_ms)) if interval.measured else (0, 0)
    text = (
        f"holds unless node {broker}'s clock stepped back before it requested the deletion: the "
        f"request is stamped {behind / 1000:.1f} s before node {broker}'s newest earlier record of "
        "this log partition, so it may have been made that much later than judged"
    )
    # Made after a step back of ``behind`` or more, its offset was at most that far below the
    # evidence's; how much further, nothing bounds.
    return ClockCondition(broker, (low - behind, high), ((low, high),), text)
