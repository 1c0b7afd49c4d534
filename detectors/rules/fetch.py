"""KIP-320: the leader epoch in Fetch, ListOffsets and OffsetForLeaderEpoch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from detectors.applied_metadata import EpochAbove
from detectors.envelope import Envelope
from detectors.errors import KafkaError
from detectors.requests import API_NAMES, Header, PartitionOutcome
from detectors.rules.base import Rule, register
from detectors.stats import UnverifiedReason

if TYPE_CHECKING:
    from detectors.cluster import ClusterState


@register
class FetchStaleEpochServed(Rule):
    """KIP-320. A Fetch, ListOffsets or OffsetForLeaderEpoch partition whose
    ``currentLeaderEpoch`` (>= 0) is older than every leader epoch of the grace
    window was answered NONE: the reader may see a log that has since been
    truncated. Not a violation: -1 (no epoch sent); an epoch that was current
    within the grace window; one the broker's heartbeats do not show it had
    applied the newer epoch's record by then, where heartbeats are read
    (ClusterState.metadata_applied; counted unverified); FENCED_LEADER_EPOCH
    answers; metadata-quorum fetches (judged by the QUORUM_* rules)."""

    id = "FETCH_STALE_EPOCH_SERVED"
    severity = "warning"
    proposals = ("KIP-320",)


def judged(outcomes: list[PartitionOutcome]) -> list[PartitionOutcome]:
    """The outcomes :func:`judge` acts on: those served at a stated epoch, and
    those without a response entry (counted as unverified). A rejected read, or
    one that sent no epoch, raises nothing whatever the view holds, so it need
    not wait for its grace window."""
    return [o for o in outcomes if o.error is None or (o.error == KafkaError.NONE and o.epoch >= 0)]


def judge(cs: ClusterState, env: Envelope, header: Header, outcomes: list[PartitionOutcome]) -> None:
    window = cs.window_of(env)
    for outcome in outcomes:
        if outcome.error is None:
            cs.unverified(UnverifiedReason.NO_RESPONSE_ENTRY)
            continue
        if outcome.error != KafkaError.NONE or outcome.epoch < 0:
            continue
        found = cs.partition_window(outcome.topic, outcome.topic_id, outcome.partition, env, window=window)
        if found is None:
            continue
        key, states = found
        oldest = min(s.leader_epoch for s in states)
        if outcome.epoch < oldest:
            applied = cs.metadata_applied(env, env.node, key, states[0], EpochAbove(outcome.epoch))
            if applied is None:
                continue  # it may not have applied the newer epoch yet (counted unverified)
            cs.emit(
                FetchStaleEpochServed,
                env,
                message=f"broker {env.node} served {API_NAMES[header.api_key]} on "
                f"{cs.describe(key)} for stale currentLeaderEpoch "
                f"{outcome.epoch} (leader epoch {oldest})",
                node=env.node,
                identity=(header.request_ref, env.ts_ms),
                evidence=[states[0].source, *applied],
                partition_key=key,
            )
