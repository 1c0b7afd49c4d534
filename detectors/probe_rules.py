"""What ``fencewatch probe`` expects a broker to answer, and the PROBE_* rules an
answer breaks. Pure: no Kafka client, no I/O.

Apache Kafka's answer follows from ``Partition.getLocalLog`` (core/src/main/scala/
kafka/cluster/Partition.scala): ``checkCurrentLeaderEpoch`` runs first and answers
FENCED_LEADER_EPOCH when the broker's leader epoch is newer than the request's
``currentLeaderEpoch``, UNKNOWN_LEADER_EPOCH when it is older; only then does a
read that must be served by the leader get NOT_LEADER_OR_FOLLOWER from a broker
that is not. ``ReplicaManager.getPartitionOrError`` answers UNKNOWN_TOPIC_OR_PARTITION
for a partition the cluster does not have, before any of that. ListOffsets from a
consumer (``replicaId`` -1) and OffsetForLeaderEpoch always require the leader
(``fetchOnlyFromLeader``); a consumer's Fetch v11+ may be served by a follower
(KIP-392), so the follower probe never uses Fetch.

These rules are not registered with the detector's catalog
(``detectors.rules.RULES``): the streaming job never raises them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from detectors.alerts import FIRING, Alert, Evidence, make_alert_id
from detectors.errors import KafkaError, error_name
from detectors.rules.base import Rule

# Answers that show the epoch check passed and the log was read: Kafka checks the
# epoch before the offset, so OFFSET_OUT_OF_RANGE is a served read too.
SERVED = frozenset({KafkaError.NONE, KafkaError.OFFSET_OUT_OF_RANGE})
# Answers by which a broker turns a read away for its epoch, leadership or existence.
REJECTIONS = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
        KafkaError.NOT_LEADER_OR_FOLLOWER,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
    }
)


class Kind(enum.Enum):
    """What a probe asks: the partition's leader at its current, a newer or an older
    epoch; a follower at the current epoch; a partition the topic does not have."""

    CURRENT = "current"
    FUTURE = "future"
    PAST = "past"
    FOLLOWER = "follower"
    UNKNOWN_PARTITION = "unknown partition"


EXPECTED = {
    Kind.CURRENT: KafkaError.NONE,
    Kind.FUTURE: KafkaError.UNKNOWN_LEADER_EPOCH,
    Kind.PAST: KafkaError.FENCED_LEADER_EPOCH,
    Kind.FOLLOWER: KafkaError.NOT_LEADER_OR_FOLLOWER,
    Kind.UNKNOWN_PARTITION: KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
}


def epoch_to_send(kind: Kind, leader_epoch: int) -> int:
    """The ``currentLeaderEpoch`` a probe of ``kind`` carries for a partition whose
    leader epoch (in Metadata) is ``leader_epoch``; -1 (no epoch) for a partition that
    does not exist. The future epoch is the next one: the epoch an election would
    give, so an election between Metadata and the probe is told apart by confirming."""
    if kind is Kind.FUTURE:
        return leader_epoch + 1
    if kind is Kind.PAST:
        return leader_epoch - 1
    if kind is Kind.UNKNOWN_PARTITION:
        return -1
    return leader_epoch


class ProbeStaleEpochServed(Rule):
    """KIP-320. The leader served a Fetch, ListOffsets or OffsetForLeaderEpoch whose
    ``currentLeaderEpoch`` is older than the leader epoch Metadata reported, twice,
    with no election in between; Kafka answers FENCED_LEADER_EPOCH. A reader of a
    stale leader's log is not told to refresh its metadata. Not a deviation: the same
    answer where Metadata read again shows another leader or epoch (an election)."""

    id = "PROBE_STALE_EPOCH_SERVED"
    severity = "warning"
    proposals = ("KIP-320",)


class ProbeFutureEpochServed(Rule):
    """KIP-320. The leader served a read whose ``currentLeaderEpoch`` is newer than
    its own, twice, with no election in between; Kafka answers UNKNOWN_LEADER_EPOCH,
    so that a client ahead of a lagging broker retries instead of reading a log that
    may be truncated. Not a deviation: the broker caught up with an election between
    the Metadata read and the probe (the confirmation sees the new epoch)."""

    id = "PROBE_FUTURE_EPOCH_SERVED"
    severity = "warning"
    proposals = ("KIP-320",)


class ProbeNonLeaderServed(Rule):
    """KIP-320 (leader-only reads). A follower served a ListOffsets or
    OffsetForLeaderEpoch at the current epoch, twice, with no election in between;
    Kafka answers NOT_LEADER_OR_FOLLOWER, as only the leader knows the high watermark
    and the epoch lineage. Not a deviation: a consumer Fetch served by a follower
    (KIP-392, never probed); an election that made the broker the leader."""

    id = "PROBE_NON_LEADER_SERVED"
    severity = "warning"
    proposals = ("KIP-320",)


class ProbeUnknownPartitionServed(Rule):
    """KIP-320 (reads of a partition). A broker served a read of a partition the
    topic does not have (index = the topic's partition count), twice; Kafka answers
    UNKNOWN_TOPIC_OR_PARTITION. A client with a wrong partition count reads an
    empty log instead of refreshing its metadata. Not a deviation: partitions added
    to the topic between the two Metadata reads."""

    id = "PROBE_UNKNOWN_PARTITION_SERVED"
    severity = "warning"
    proposals = ("KIP-320",)


class ProbeFencingErrorMismatch(Rule):
    """KIP-320. A broker answered a probe with a fencing error other than Kafka's,
    twice with no election in between: FENCED_LEADER_EPOCH for a newer epoch,
    UNKNOWN_LEADER_EPOCH for an older one, any of them (or NOT_LEADER_OR_FOLLOWER)
    at the leader's own current epoch. A client acts on the error: the wrong one
    makes it wait when it should refresh, or the reverse. Not a deviation: errors
    that are no fencing answer (authorization, storage): counted, not alerted."""

    id = "PROBE_FENCING_ERROR_MISMATCH"
    severity = "warning"
    proposals = ("KIP-320",)


PROBE_RULES: dict[str, type[Rule]] = {
    r.id: r
    for r in (
        ProbeStaleEpochServed,
        ProbeFutureEpochServed,
        ProbeNonLeaderServed,
        ProbeUnknownPartitionServed,
        ProbeFencingErrorMismatch,
    )
}
_SERVED_RULES = {
    Kind.PAST: ProbeStaleEpochServed,
    Kind.FUTURE: ProbeFutureEpochServed,
    Kind.FOLLOWER: ProbeNonLeaderServed,
    Kind.UNKNOWN_PARTITION: ProbeUnknownPartitionServed,
}


class Verdict(enum.Enum):
    CONFORMING = "conforming"
    DEVIATING = "deviating"
    # An answer that is neither Kafka's nor a fencing answer (authorization, storage, ...).
    OTHER_ERROR = "other_error"


def judge(kind: Kind, code: int) -> tuple[Verdict, type[Rule] | None]:
    """The verdict on answer ``code`` to a probe of ``kind``, and the rule it breaks."""
    if kind is Kind.CURRENT and code in SERVED:
        return Verdict.CONFORMING, None
    if code == EXPECTED[kind]:
        return Verdict.CONFORMING, None
    if code in SERVED:
        return Verdict.DEVIATING, _SERVED_RULES[kind]
    if code in REJECTIONS:
        return Verdict.DEVIATING, ProbeFencingErrorMismatch
    return Verdict.OTHER_ERROR, None


@dataclass(frozen=True, slots=True)
class Asked:
    """One partition's question and answer: ``api`` (Kafka's name) at ``version`` to
    ``node``, carrying ``epoch_sent``, when Metadata said leader ``leader`` at epoch
    ``epoch_known``; ``answer`` is the error code and ``answer_name`` its name;
    ``ts_ms`` when the answer arrived (the prober's clock)."""

    node: int
    api: str
    version: int
    kind: Kind
    topic: str
    topic_id: str | None
    partition: int
    leader: int
    epoch_known: int
    epoch_sent: int
    answer: int
    answer_name: str
    ts_ms: int

    def known(self) -> str:
        """What Metadata said that the question rests on."""
        if self.kind is Kind.UNKNOWN_PARTITION:
            return f"{self.topic} has {self.partition} partitions"
        return f"{self.topic}-{self.partition} leader {self.leader}, leader epoch {self.epoch_known}"

    def summary(self) -> str:
        return (
            f"{self.api} v{self.version} to broker {self.node} for {self.topic}-{self.partition} with "
            f"currentLeaderEpoch {self.epoch_sent} ({self.kind.value} probe; Metadata: {self.known()}) "
            f"answered {self.answer_name} ({self.answer})"
        )


def deviation_alert(cluster: str, rule: type[Rule], first: Asked, again: Asked, detected_ms: int) -> Alert:
    """The alert for a deviation seen in ``first`` and confirmed by ``again`` (the same
    question after Metadata was read again and showed the same leader and epoch).

    The id holds what identifies the deviation, not when it was seen: a canary that
    meets the same deviation every round raises one alert until the epoch moves."""
    alert_id = make_alert_id(
        "probe",
        cluster,
        rule.id,
        first.node,
        first.api,
        first.version,
        first.kind.value,
        first.topic_id or first.topic,
        first.partition,
        first.epoch_known,
        first.epoch_sent,
        first.answer,
    )
    expected = EXPECTED[first.kind]
    message = (
        f"broker {first.node} answered {first.api} v{first.version} on {first.topic}-{first.partition} "
        f"with currentLeaderEpoch {first.epoch_sent} ({first.kind.value} probe; {first.known()}) "
        f"{first.answer_name}, twice; Apache Kafka answers {error_name(expected)}"
    )
    position = f"probe:broker-{first.node}"
    evidence = (
        Evidence(
            "view",
            "probe",
            first.ts_ms,
            first.leader,
            None,
            "probe:metadata",
            f"Metadata: {first.known()}",
        ),
        Evidence("violation", "probe", first.ts_ms, first.node, None, position, first.summary()),
        Evidence(
            "violation", "probe", again.ts_ms, again.node, None, position, "confirmed: " + again.summary()
        ),
    )
    return Alert(
        alert_id=alert_id,
        rule=rule.id,
        severity=rule.severity,
        status=FIRING,
        cluster=cluster,
        topic=first.topic,
        topic_id=first.topic_id,
        partition=first.partition,
        node=first.node,
        ts_ms=first.ts_ms,
        detected_ms=detected_ms,
        message=message,
        evidence=evidence,
        links=rule.links(),
    )
