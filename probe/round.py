"""One probe round: read Metadata, ask each partition's leader (and a follower) at
the current, a future and a past epoch, judge the answers, and confirm each
deviation after reading Metadata again. See detectors.probe_rules for what Kafka
answers and why."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from detectors.alerts import Alert
from detectors.engine import wall_clock_ms
from detectors.probe_rules import Asked, Kind, deviation_alert, epoch_to_send, judge
from detectors.rules.base import Rule
from probe.client import ProbeClient, Unanswered
from probe.wire import (
    APIS,
    LIST_OFFSETS,
    OFFSET_FOR_LEADER_EPOCH,
    ClusterView,
    Item,
    PartitionInfo,
    answer_name,
    answers,
    build_request,
    choose_version,
)

DEFAULT_MAX_PARTITIONS = 1000
LEADER_KINDS = (Kind.CURRENT, Kind.FUTURE, Kind.PAST)
# Follower reads: the APIs Kafka serves only from the leader to a consumer (not Fetch: KIP-392).
FOLLOWER_APIS = (LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH)
# Outcomes of a request (fencewatch_probe_requests_total's ``outcome``).
CONFORMING, DEVIATING, OTHER_ERROR, FAILED, UNSUPPORTED = (
    "conforming",
    "deviating",
    "other_error",
    "failed",
    "unsupported",
)


@dataclass(frozen=True, slots=True)
class Sent:
    """One request of a round and how it went: ``outcome`` is one of the outcomes above
    (``reason`` says why for failed and unsupported); ``confirmation`` for a re-ask."""

    node: int
    api: str
    kind: Kind
    outcome: str
    partitions: int
    version: int | None = None
    reason: str = ""
    confirmation: bool = False


@dataclass
class RoundReport:
    """What a round asked and found. ``asked`` holds every first answer; ``alerts`` the
    confirmed deviations; ``superseded`` first deviations an election explains;
    ``unconfirmed`` those the second answer did not repeat; ``confirmed`` the first
    answers behind ``alerts``."""

    cluster: str
    partitions_total: int
    partitions_probed: int
    asked: list[Asked] = field(default_factory=list)
    requests: list[Sent] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    superseded: list[Asked] = field(default_factory=list)
    unconfirmed: list[Asked] = field(default_factory=list)
    confirmed: list[Asked] = field(default_factory=list)
    elapsed_seconds: float = 0.0

    @property
    def complete(self) -> bool:
        """Every request was answered (or the broker does not take it)."""
        return all(s.outcome != FAILED for s in self.requests)

    def rule_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for alert in self.alerts:
            counts[alert.rule] = counts.get(alert.rule, 0) + 1
        return counts


@dataclass(frozen=True, slots=True)
class _Question:
    node: int
    api: str
    version: int
    kind: Kind
    info: PartitionInfo
    epoch_sent: int

    def item(self) -> Item:
        return Item(self.info.topic, self.info.topic_uuid, self.info.partition, self.epoch_sent)


class Prober:
    """Rounds of probes over ``client``'s cluster. ``topics``: a regular expression the
    whole topic name must match (None: every topic but internal ones); at most
    ``max_partitions`` partitions per round, taken round-robin so that successive
    rounds cover them all. ``cluster`` names the cluster in alerts (None: the cluster
    id Metadata reports). ``now_ms`` is the wall clock of answers' times."""

    def __init__(
        self,
        client: ProbeClient,
        *,
        cluster: str | None = None,
        topics: re.Pattern[str] | None = None,
        max_partitions: int = DEFAULT_MAX_PARTITIONS,
        now_ms: Callable[[], int] = wall_clock_ms,
    ):
        if max_partitions < 1:
            raise ValueError(f"max_partitions must be at least 1, got {max_partitions}")
        self.client = client
        self.cluster = cluster
        self.topics = topics
        self.max_partitions = max_partitions
        self._now_ms = now_ms
        self._cursor = 0

    def _selected(self, view: ClusterView) -> tuple[list[PartitionInfo], int]:
        """This round's partitions (the next ``max_partitions`` after the previous
        round's), and how many there are in all."""
        keys = sorted(
            key
            for key in view.partitions
            if (self.topics.fullmatch(key[0]) if self.topics else key[0] not in view.internal_topics)
        )
        if len(keys) <= self.max_partitions:
            return [view.partitions[k] for k in keys], len(keys)
        start = self._cursor % len(keys)
        self._cursor = start + self.max_partitions
        chosen = (keys + keys)[start : start + self.max_partitions]
        return [view.partitions[k] for k in chosen], len(keys)

    def round(self) -> RoundReport:
        """Probe once. Unanswered (unreachable cluster) and ClusterRefused propagate."""
        started = time.monotonic()
        view = self.client.metadata()
        selected, total = self._selected(view)
        report = RoundReport(self.cluster or view.cluster_id or "unknown", total, len(selected))
        questions: list[_Question] = []
        by_leader: dict[int, list[PartitionInfo]] = {}
        for info in selected:
            by_leader.setdefault(info.leader, []).append(info)
        for node, infos in sorted(by_leader.items()):
            questions += self._leader_questions(report, view, node, infos)
        followers: dict[int, list[PartitionInfo]] = {}
        for info in selected:
            follower = next((r for r in info.replicas if r != info.leader and r in view.brokers), None)
            if follower is not None:
                followers.setdefault(follower, []).append(info)
        for node, infos in sorted(followers.items()):
            versions = self._versions(report, node, FOLLOWER_APIS, Kind.FOLLOWER, len(infos))
            for api, version in versions.items():
                questions += [_Question(node, api, version, Kind.FOLLOWER, i, i.leader_epoch) for i in infos]
        first = self._ask_all(report, questions, confirmation=False)
        report.asked = [asked for _, asked in first]
        deviations = [(q, a, rule) for q, a in first if (rule := judge(a.kind, a.answer)[1]) is not None]
        if deviations:
            self._confirm(report, view, deviations)
        report.elapsed_seconds = time.monotonic() - started
        return report

    def _versions(
        self, report: RoundReport, node: int, apis: Sequence[str], kind: Kind, partitions: int
    ) -> dict[str, int]:
        """The version of each of ``apis`` to ask ``node`` with; the others are
        recorded as unsupported, or failed if the broker cannot be reached (once a
        round for a broker that is both a leader and a follower)."""
        noted = {(s.node, s.api) for s in report.requests if s.outcome in (FAILED, UNSUPPORTED)}

        def note(api: str, outcome: str, reason: str) -> None:
            if (node, api) not in noted:
                report.requests.append(Sent(node, api, kind, outcome, partitions, reason=reason))

        try:
            advertised = self.client.versions(node)
        except Unanswered as exc:
            for api in apis:
                note(api, FAILED, str(exc))
            return {}
        chosen: dict[str, int] = {}
        for api in apis:
            version = choose_version(api, advertised)
            if isinstance(version, str):
                note(api, UNSUPPORTED, version)
            else:
                chosen[api] = version
        return chosen

    def _leader_questions(
        self, report: RoundReport, view: ClusterView, node: int, infos: list[PartitionInfo]
    ) -> list[_Question]:
        questions: list[_Question] = []
        # A partition the topic does not have: index = its partition count.
        topic = infos[0]
        missing = PartitionInfo(
            topic.topic, topic.topic_uuid, view.partition_counts[topic.topic], node, -1, (node,)
        )
        for api, version in self._versions(report, node, APIS, Kind.CURRENT, len(infos)).items():
            for kind in LEADER_KINDS:
                questions += [
                    _Question(node, api, version, kind, i, epoch_to_send(kind, i.leader_epoch))
                    for i in infos
                    if kind is not Kind.PAST or i.leader_epoch > 0
                ]
            questions.append(_Question(node, api, version, Kind.UNKNOWN_PARTITION, missing, -1))
        return questions

    def _ask_all(
        self, report: RoundReport, questions: Iterable[_Question], *, confirmation: bool
    ) -> list[tuple[_Question, Asked]]:
        """Ask ``questions``, one request per broker, API and kind."""
        groups: dict[tuple[int, str, int, Kind], list[_Question]] = {}
        for q in questions:
            groups.setdefault((q.node, q.api, q.version, q.kind), []).append(q)
        # Brokers take turns, so that one broker's pace runs while the others answer.
        rank: dict[int, int] = {}
        order = []
        for key in groups:
            rank[key[0]] = rank.get(key[0], -1) + 1
            order.append((rank[key[0]], key))
        out: list[tuple[_Question, Asked]] = []
        for _, (node, api, version, kind) in sorted(order, key=lambda o: (o[0], o[1][0])):
            qs = groups[(node, api, version, kind)]
            names = {q.info.topic_uuid: q.info.topic for q in qs if q.info.topic_uuid is not None}
            try:
                response = self.client.ask(node, build_request(api, version, [q.item() for q in qs]))
            except Unanswered as exc:
                report.requests.append(
                    Sent(node, api, kind, FAILED, len(qs), version, str(exc), confirmation)
                )
                continue
            received_ms = self._now_ms()
            codes = answers(api, response, names)
            verdicts: set[str] = set()
            for q in qs:
                code = codes.get((q.info.topic, q.info.partition))
                if code is None:
                    verdicts.add(FAILED)
                    continue
                asked = Asked(
                    node, api, version, kind, q.info.topic, q.info.topic_id, q.info.partition,
                    q.info.leader, q.info.leader_epoch, q.epoch_sent, code, answer_name(code), received_ms,
                )  # fmt: skip
                verdicts.add(judge(kind, code)[0].value)
                out.append((q, asked))
            outcome = next((o for o in (FAILED, DEVIATING, OTHER_ERROR) if o in verdicts), CONFORMING)
            reason = "partitions missing from the answer" if outcome == FAILED else ""
            report.requests.append(Sent(node, api, kind, outcome, len(qs), version, reason, confirmation))
        return out

    def _confirm(
        self,
        report: RoundReport,
        view: ClusterView,
        deviations: list[tuple[_Question, Asked, type[Rule]]],
    ) -> None:
        """Read Metadata again; a deviation whose partition has another leader or epoch
        now is superseded (an election); the others are asked again, and an alert is
        raised where the same rule is broken again."""
        try:
            again_view = self.client.metadata(sorted({q.info.topic for q, _, _ in deviations}))
        except Unanswered:
            report.unconfirmed += [a for _, a, _ in deviations]
            return
        still: list[tuple[_Question, Asked, type[Rule]]] = []
        for q, asked, rule in deviations:
            if _moved(q, view, again_view):
                report.superseded.append(asked)
            else:
                still.append((q, asked, rule))
        second = {
            (q.node, q.api, q.kind, q.info.topic, q.info.partition): a
            for q, a in self._ask_all(report, [q for q, _, _ in still], confirmation=True)
        }
        detected_ms = self._now_ms()
        for q, asked, rule in still:
            again = second.get((q.node, q.api, q.kind, q.info.topic, q.info.partition))
            if again is not None and judge(again.kind, again.answer)[1] is rule:
                report.alerts.append(deviation_alert(report.cluster, rule, asked, again, detected_ms))
                report.confirmed.append(asked)
            else:
                report.unconfirmed.append(asked)


def _moved(q: _Question, before: ClusterView, after: ClusterView) -> bool:
    """Whether an election (or a new partition count) lies between the two Metadata reads."""
    topic = q.info.topic
    if q.kind is Kind.UNKNOWN_PARTITION:
        return after.partition_counts.get(topic) != before.partition_counts.get(topic)
    now = after.partitions.get((topic, q.info.partition))
    return now is None or (now.leader, now.leader_epoch, now.replicas) != (
        q.info.leader,
        q.info.leader_epoch,
        q.info.replicas,
    )
